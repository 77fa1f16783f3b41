// The trainer's reasoning without LibTorch: the straggler rule and its
// causes, the table, the metrics lines, the chart and the progress line.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "trainer/diagnostics.h"
#include "trainer/progress.h"

namespace nl::trainer {
namespace {

RankTiming T(int rank, double data, double compute, double comm) {
  RankTiming t;
  t.rank = rank;
  t.data_ms = {data, data * 1.2};
  t.compute_ms = {compute, compute};
  t.comm_ms = {comm, comm};
  t.step_ms = {data + compute + comm, data + compute + comm};
  t.images_per_s = 100;
  t.steps = 10;
  return t;
}

RankBinding B(int rank, int loader_node, int planned, int gpu = -1) {
  RankBinding b;
  b.rank = rank;
  b.loader_node = loader_node;
  b.planned_node = planned;
  b.loader_cpus = loader_node == 0 ? "1-10" : "23-32";
  b.gpu = gpu;
  b.gpu_node = gpu >= 0 ? planned : -1;
  b.loader_threads = 4;
  return b;
}

TEST(Summarize, MeanAndNearestRankP95) {
  std::vector<double> v;
  for (int i = 1; i <= 100; ++i) v.push_back(i);
  const Summary s = Summarize(v);
  EXPECT_DOUBLE_EQ(s.mean, 50.5);
  EXPECT_DOUBLE_EQ(s.p95, 95);
  EXPECT_DOUBLE_EQ(Summarize({}).mean, 0);
  EXPECT_DOUBLE_EQ(Summarize({7}).p95, 7);
}

// The incident: rank 2's loader on node 0 while its GPU is on node 1; every
// other rank waits for it in the all-reduce.
TEST(Diagnose, TheIncidentIsABindingProblemAndTheOthersWaitInTheAllReduce) {
  std::vector<RankTiming> t = {T(0, 8, 100, 302), T(1, 8, 100, 302), T(2, 310, 100, 10),
                               T(3, 8, 100, 302)};
  std::vector<RankBinding> b = {B(0, 0, 0, 0), B(1, 0, 0, 1), B(2, 0, 1, 2), B(3, 1, 1, 3)};
  const Verdict v = Diagnose(t, b);
  EXPECT_EQ(v.straggler, 2);
  EXPECT_EQ(v.cause, "binding");
  EXPECT_NE(v.sentence.find("Rank 2 is the straggler"), std::string::npos) << v.sentence;
  EXPECT_NE(v.sentence.find("NUMA node 0"), std::string::npos) << v.sentence;
  EXPECT_NE(v.sentence.find("cuda:2) is on node 1"), std::string::npos) << v.sentence;
  EXPECT_NE(v.waiting.find("Ranks 0, 1 and 3 wait 292 ms a step in the all-reduce for rank 2"),
            std::string::npos)
      << v.waiting;
}

TEST(Diagnose, ThreadsThatRanOnAnotherNodeThanTheirBindingAreABindingProblem) {
  std::vector<RankTiming> t = {T(0, 1, 50, 40), T(1, 45, 50, 1)};
  t[1].ran_on_nodes = 0b11;
  std::vector<RankBinding> b = {B(0, 0, 0), B(1, 1, 1)};
  const Verdict v = Diagnose(t, b);
  EXPECT_EQ(v.straggler, 1);
  EXPECT_EQ(v.cause, "binding");
  EXPECT_NE(v.sentence.find("ran on node(s) 0,1"), std::string::npos) << v.sentence;
}

TEST(Diagnose, BoundRightButSlowIsCapacityAndSaysWhatToChange) {
  std::vector<RankTiming> t = {T(0, 2, 50, 30), T(1, 2, 50, 30), T(2, 32, 50, 1)};
  std::vector<RankBinding> b = {B(0, 0, 0), B(1, 0, 0), B(2, 0, 0)};
  Verdict v = Diagnose(t, b);
  EXPECT_EQ(v.straggler, 2);
  EXPECT_EQ(v.cause, "capacity");
  EXPECT_NE(v.sentence.find("--loader-threads"), std::string::npos) << v.sentence;
  EXPECT_EQ(v.sentence.find("moves between ranks"), std::string::npos);
  v = Diagnose(t, b, {0, 1});
  EXPECT_NE(v.sentence.find("moves between ranks"), std::string::npos) << v.sentence;
}

TEST(Diagnose, ASimulatedDelayIsNamedAsSuch) {
  std::vector<RankTiming> t = {T(0, 0.2, 20, 30), T(1, 0.3, 20, 30), T(2, 0.2, 20, 30),
                               T(3, 30, 20, 0.5)};
  std::vector<RankBinding> b = {B(0, 0, 0), B(1, 0, 0), B(2, 0, 0), B(3, 0, 0)};
  b[3].simulated_delay_ms = 30;
  const Verdict v = Diagnose(t, b);
  EXPECT_EQ(v.straggler, 3);
  EXPECT_EQ(v.cause, "simulated");
  EXPECT_NE(v.sentence.find("--simulate-slow-rank 3"), std::string::npos) << v.sentence;
}

TEST(Diagnose, NobodyWhenDataWaitsAreAlikeSmallOrAlone) {
  std::vector<RankBinding> b = {B(0, 0, 0), B(1, 0, 0), B(2, 0, 0)};
  // Alike.
  EXPECT_EQ(Diagnose({T(0, 20, 50, 5), T(1, 22, 50, 5), T(2, 25, 50, 5)}, b).straggler, -1);
  // Far above the others but under 10% of its step.
  EXPECT_EQ(Diagnose({T(0, 0.1, 500, 5), T(1, 0.1, 500, 5), T(2, 30, 500, 5)}, b).straggler, -1);
  // Under 1 ms: noise.
  EXPECT_EQ(Diagnose({T(0, 0.01, 2, 0.1), T(1, 0.01, 2, 0.1), T(2, 0.9, 2, 0.1)}, b).straggler, -1);
  // One rank: nobody to compare with.
  EXPECT_EQ(Diagnose({T(0, 90, 10, 0)}, {B(0, 0, 0)}).straggler, -1);
}

TEST(Diagnose, TheWorstOfSeveralIsNamed) {
  std::vector<RankTiming> t = {T(0, 1, 50, 40), T(1, 20, 50, 20), T(2, 40, 50, 1), T(3, 1, 50, 40)};
  std::vector<RankBinding> b = {B(0, 0, 0), B(1, 0, 0), B(2, 0, 0), B(3, 0, 0)};
  EXPECT_EQ(Diagnose(t, b).straggler, 2);
}

TEST(Table, OneLinePerRankWithItsBinding) {
  const std::string s = FormatTable({T(0, 1, 2, 3), T(1, 4, 5, 6)}, {B(0, 0, 0, 0), B(1, 1, 1, 1)});
  EXPECT_NE(s.find("data ms mean/p95"), std::string::npos);
  EXPECT_NE(s.find("23-32"), std::string::npos) << s;
  EXPECT_NE(s.find("cuda:1 (node 1)"), std::string::npos) << s;
  EXPECT_EQ(std::count(s.begin(), s.end(), '\n'), 3);
}

TEST(Metrics, ReportAndEpochLinesCarryTheDocumentedFields) {
  const std::string lines = ReportJsonLines(2, 40, {T(0, 1, 2, 3), T(1, 4, 5, 6)});
  const auto first = nlohmann::json::parse(lines.substr(0, lines.find('\n')));
  for (const char* k : {"epoch", "step", "rank", "data_ms", "compute_ms", "comm_ms", "step_ms", "loss"}) {
    EXPECT_TRUE(first.contains(k)) << k;
  }
  EXPECT_EQ(first["step"], 40);
  EpochRecord e;
  e.epoch = 1;
  e.test_top1 = 0.25;
  e.test_top5 = 0.5;
  e.straggler = -1;
  auto j = nlohmann::json::parse(EpochJsonLine(e));
  EXPECT_TRUE(j["straggler"].is_null());
  EXPECT_DOUBLE_EQ(j["test_top5"].get<double>(), 0.5);
  e.straggler = 3;
  EXPECT_EQ(nlohmann::json::parse(EpochJsonLine(e))["straggler"], 3);
}

TEST(Chart, AStackedBarPerRankWithTheStragglerMarked) {
  const std::string svg = ChartSvg("Epoch 0 <test>", {T(0, 1, 2, 3), T(1, 40, 2, 0.1)}, 1);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("&lt;test&gt;"), std::string::npos);
  EXPECT_NE(svg.find("rank 1 data 40.0 ms"), std::string::npos);
  EXPECT_NE(svg.find("straggler"), std::string::npos);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
}

TEST(Progress, TheIncidentsFormat) {
  EXPECT_EQ(ProgressLine("Train Epoch 11", 117, 176, 16.0, 2.2641),
            "Train Epoch 11:  66%|######6   | 117/176 [00:16<00:08, 7.31it/s, loss=2.2641]");
  EXPECT_EQ(ProgressLine("E", 10, 10, 2.0, 1.0), "E: 100%|##########| 10/10 [00:02<00:00, 5.00it/s, loss=1.0000]");
  EXPECT_EQ(ProgressLine("E", 0, 10, 0.0, 0.0), "E:   0%|          | 0/10 [00:00<??:??, 0.00it/s, loss=0.0000]");
}

}  // namespace
}  // namespace nl::trainer
