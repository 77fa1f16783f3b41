// The trainer's reasoning without LibTorch: the straggler rule and its
// causes, the table, the metrics lines, the chart, the progress line, and the
// checks of the data and outputs before a job starts (with their locks).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "trainer/diagnostics.h"
#include "trainer/preflight.h"
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

std::string TempDir() {
  char tmpl[] = "/tmp/nl_preflight_XXXXXX";
  const char* d = mkdtemp(tmpl);
  EXPECT_NE(d, nullptr);
  return d ? d : "/tmp";
}

TEST(Preflight, OutputsThatAreOneFileOrInsideTheDataAreRefused) {
  const std::string dir = TempDir();
  ASSERT_EQ(mkdir((dir + "/data").c_str(), 0700), 0);
  Options o;
  o.data = dir + "/data";
  o.out = dir + "/out";
  o.metrics_out = dir + "/m.jsonl";
  o.params_out = dir + "/p.bin";
  EXPECT_TRUE(CheckOutputs(o).ok()) << CheckOutputs(o).ToString();
  struct stat st {};
  ASSERT_EQ(stat(o.out.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u) << "--out is the user's only";

  o.metrics_out = dir + "/out/../out/checkpoint.pt";  // the checkpoint, spelled otherwise
  Status s = CheckOutputs(o);
  EXPECT_NE(s.ToString().find("is the same file as --out's checkpoint"), std::string::npos) << s.ToString();
  o.metrics_out = dir + "/m.jsonl";
  o.params_out = dir + "/./m.jsonl";
  s = CheckOutputs(o);
  EXPECT_NE(s.ToString().find("--params-out " + dir + "/./m.jsonl is the same file as --metrics-out"),
            std::string::npos)
      << s.ToString();
  ASSERT_EQ(mkfifo((dir + "/fifo").c_str(), 0600), 0);
  o.params_out = dir + "/fifo";  // (and /dev/full: a rename would replace the device with a file)
  s = CheckOutputs(o);
  EXPECT_NE(s.ToString().find("is not a regular file"), std::string::npos) << s.ToString();
  o.params_out = "";
  o.metrics_out = dir + "/fifo";
  s = CheckOutputs(o);
  EXPECT_NE(s.ToString().find("is not a regular file"), std::string::npos) << s.ToString();
  o.metrics_out = dir + "/m.jsonl";
  o.params_out = dir + "/data/manifest.json";
  s = CheckOutputs(o);
  EXPECT_NE(s.ToString().find("lies inside the shard set"), std::string::npos) << s.ToString();
  o.params_out = "";
  o.out = dir + "/data/ck";
  s = CheckOutputs(o);
  EXPECT_NE(s.ToString().find("lies inside the shard set"), std::string::npos) << s.ToString();
  std::system(("rm -rf " + dir).c_str());
}

TEST(Preflight, ASecondJobOnTheSameOutputsIsRefusedNamingTheFirst) {
  const std::string dir = TempDir();
  Options o;
  o.data = dir + "/no-data";
  o.out = dir + "/out";
  o.metrics_out = dir + "/m.jsonl";
  ASSERT_TRUE(CheckOutputs(o).ok());
  Result<OutputLock> held = LockOutputs(o);
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  // Record locks are per process: the second job is another process.
  auto second = [](const Options& x) {
    int p[2];
    if (pipe(p) != 0) return std::string("pipe");
    const pid_t pid = fork();
    if (pid == 0) {
      close(p[0]);
      Result<OutputLock> l = LockOutputs(x);
      const std::string m = l.ok() ? "locked" : l.status().ToString();
      (void)!write(p[1], m.data(), m.size());
      _exit(0);
    }
    close(p[1]);
    std::string m;
    char buf[512];
    ssize_t n;
    while ((n = read(p[0], buf, sizeof buf)) > 0) m.append(buf, static_cast<size_t>(n));
    close(p[0]);
    waitpid(pid, nullptr, 0);
    return m;
  };
  const std::string me = "(pid " + std::to_string(getpid());
  std::string m = second(o);
  EXPECT_NE(m.find("--out " + dir + "/out is in use by another trainer job " + me), std::string::npos) << m;
  Options only_metrics;
  only_metrics.metrics_out = dir + "/./m.jsonl";
  m = second(only_metrics);
  EXPECT_NE(m.find("--metrics-out " + dir + "/./m.jsonl is in use by another trainer job " + me),
            std::string::npos)
      << m;
  *held = OutputLock();  // released: the next job may start
  EXPECT_EQ(second(o), "locked");
  std::system(("rm -rf " + dir).c_str());
}

TEST(Preflight, TheDataMustHaveTheSplitsAndShapeAsked) {
  Manifest m;
  m.classes = {"a", "b"};
  SplitInfo train;
  train.num_samples = 10;
  train.shape = std::array<uint32_t, 3>{32, 32, 3};
  m.splits["train"] = train;
  m.splits["test"] = train;
  Options o;
  o.data = "D";
  EXPECT_TRUE(CheckData(o, m).ok());
  o.eval_split = "tset";
  EXPECT_EQ(CheckData(o, m).message(),
            "--eval-split tset: D has no such split (it has test, train; --eval-split none trains without "
            "evaluation)");
  o.eval_split = "none";
  EXPECT_TRUE(CheckData(o, m).ok());
  o.resize_on = "device";
  EXPECT_TRUE(CheckData(o, m).ok());
  m.splits["train"].shape = std::nullopt;
  EXPECT_NE(CheckData(o, m).message().find("--resize-on device needs"), std::string::npos);
  m.classes = {"a"};
  EXPECT_NE(CheckData(o, m).message().find("at least 2"), std::string::npos);
  m.splits.erase("train");
  EXPECT_EQ(CheckData(o, m).message(), "D has no train split");
}

}  // namespace
}  // namespace nl::trainer
