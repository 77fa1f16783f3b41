// The trainer's reasoning without LibTorch: the straggler rule and its
// causes, the table, the metrics lines, the chart, the progress line, and the
// checks of the data and outputs before a job starts (with their locks).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "base/file_util.h"
#include "loader/pipeline/sampler.h"
#include "trainer/binding_json.h"
#include "trainer/diagnostics.h"
#include "trainer/outputs.h"
#include "trainer/preflight.h"
#include "trainer/proc_info.h"
#include "trainer/progress.h"
#include "trainer/rank_error.h"
#include "trainer/schedule.h"
#include "trainer/serve_args.h"
#include "trainer/settings.h"
#include "trainer/timing.h"

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
  // "step" means one thing in both kinds of line: the global step when it was written.
  e.steps = 30;
  j = nlohmann::json::parse(EpochJsonLine(e));
  EXPECT_EQ(j["step"], 30);
  EXPECT_FALSE(j.contains("steps"));
}

TEST(Chart, AStackedBarPerRankWithTheStragglerMarked) {
  const std::string svg = ChartSvg("Epoch 0 <test>", {T(0, 1, 2, 3), T(1, 40, 2, 0.1)}, 1);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("&lt;test&gt;"), std::string::npos);
  EXPECT_NE(svg.find("rank 1 data 40.0 ms"), std::string::npos);
  EXPECT_NE(svg.find("straggler"), std::string::npos);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
}

// Each part carries its number where it fits, the total is the table's step
// time (the optimiser's step and the rest are "other"), and the straggler's
// tag ends inside the canvas.
TEST(Chart, NumbersOnThePartsTheTablesTotalAndNothingClipped) {
  RankTiming a = T(0, 20, 200, 30), b = T(1, 1, 200, 80);
  a.step_ms.mean = 290;  // 40 ms beyond the three phases
  b.step_ms.mean = 290;
  const std::string svg = ChartSvg("Epoch 0", {a, b}, 1);
  EXPECT_NE(svg.find(">200</text>"), std::string::npos) << svg;  // compute, on its part
  EXPECT_NE(svg.find(">40.0</text>"), std::string::npos) << svg;  // rank 0's other
  EXPECT_NE(svg.find(">290 ms</text>"), std::string::npos) << svg;
  EXPECT_NE(svg.find("other (optimiser step, reports)"), std::string::npos);
  const double width = std::stod(svg.substr(svg.find("width=\"") + 7));
  const size_t tag = svg.find("ms  straggler</text>");
  ASSERT_NE(tag, std::string::npos);
  const size_t open = svg.rfind("<text x=\"", tag);
  const double x = std::stod(svg.substr(open + 9));
  const double chars = static_cast<double>(std::string("290 ms  straggler").size());
  EXPECT_LE(x + 7.5 * chars, width) << "the tag ends at " << x + 7.5 * chars << " of " << width;
}

// Off a terminal: a line every plain_every steps but the last, then Finish's
// one line (before, the 100% line came twice, with two losses, and
// --report-every 0 still printed every 50 steps).
TEST(Progress, OffATerminalEachLineOnceAndNoneForZero) {
  auto lines = [](int64_t every) {
    char* buf = nullptr;
    size_t len = 0;
    FILE* f = open_memstream(&buf, &len);
    Progress p("E", 100, false, every, f);
    for (int64_t n = 1; n <= 100; ++n) p.Update(n, 1.0);
    p.Finish(0.5);
    std::fclose(f);
    const std::string text(buf, len);
    std::free(buf);
    return text;
  };
  const std::string fifty = lines(50);
  EXPECT_EQ(std::count(fifty.begin(), fifty.end(), '\n'), 2) << fifty;
  EXPECT_NE(fifty.find(" 50/100 "), std::string::npos) << fifty;
  EXPECT_NE(fifty.find("100/100 [00:00<00:00"), std::string::npos) << fifty;
  EXPECT_NE(fifty.find("loss=0.5000]"), std::string::npos) << "the last line has the epoch's loss: " << fifty;
  const std::string zero = lines(0);
  EXPECT_EQ(std::count(zero.begin(), zero.end(), '\n'), 1) << zero;
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

// ---- the rank's rooms without LibTorch ----

template <typename Fn>
std::pair<std::string, proc::FailureKind> ErrorOf(Fn fn) {
  try {
    fn();
  } catch (const RankError& e) {
    return {e.what(), e.kind()};
  }
  return {"(no error)", proc::FailureKind::kNone};
}

TEST(TrainerRankError, EchoFamilies) {
  const RankError t = CollectiveTimeout("the final reduce", 120, "rank 1 silent for 5.2 s", "Operation timed out!");
  EXPECT_STREQ(t.what(),
               "waited 120 s (--timeout) in a collective (the final reduce) for a peer that did not come: rank 1 "
               "silent for 5.2 s [Operation timed out!]");
  EXPECT_EQ(t.kind(), proc::FailureKind::kEcho);
  const RankError p = PeerLost("the gradient all-reduce of step 3", "Connection closed by peer [127.0.0.1]:5", "");
  EXPECT_STREQ(p.what(),
               "lost a peer in a collective (the gradient all-reduce of step 3): Connection closed by peer "
               "[127.0.0.1]:5");
  EXPECT_EQ(p.kind(), proc::FailureKind::kEcho);
  EXPECT_STREQ(PeerLost("x", "closed", "no heartbeat from the rank it waits for: rank 1 silent for 5.1 s").what(),
               "lost a peer in a collective (x): closed; before that, no heartbeat from the rank it waits for: "
               "rank 1 silent for 5.1 s");
  const RankError r = RendezvousTimeout("127.0.0.1:29500", 3, "1 and 2", 2, 3);
  EXPECT_STREQ(r.what(),
               "waited 3 s at the rendezvous 127.0.0.1:29500 for ranks 1 and 2 of 3: are they started, with the "
               "same MASTER_ADDR, MASTER_PORT and WORLD_SIZE?");
  EXPECT_EQ(r.kind(), proc::FailureKind::kEcho);
  EXPECT_STREQ(RendezvousTimeout("h:1", 0.5, "1", 1, 2).what(),
               "waited 0.5 s at the rendezvous h:1 for rank 1 of 2: are they started, with the same MASTER_ADDR, "
               "MASTER_PORT and WORLD_SIZE?");
  const RankError u = StoreUnreachable("h:1", 600, "connect: refused");
  EXPECT_STREQ(u.what(),
               "cannot reach the rendezvous store at h:1 within 600 s (rank 0 hosts it: is it running, with this "
               "MASTER_ADDR and MASTER_PORT?): connect: refused");
  EXPECT_EQ(u.kind(), proc::FailureKind::kEcho);
  EXPECT_STREQ(StoreLost("h:1", "", "").what(), "lost the rendezvous store at h:1 (rank 0 hosts it: it is gone)");
  EXPECT_EQ(StoreLost("h:1", "", "").kind(), proc::FailureKind::kEcho);
  EXPECT_STREQ(StoreLost("h:1", " during the rendezvous", "Broken pipe").what(),
               "lost the rendezvous store at h:1 during the rendezvous (rank 0 hosts it: it has ended or stopped; "
               "its own error says why): Broken pipe");
}

TEST(TrainerRankError, OwnFailures) {
  EXPECT_EQ(RankError("the loss is nan at step 3").kind(), proc::FailureKind::kOwn);
  auto c = ErrorOf([] { Check(Status::InvalidArgument("bad"), "cannot train on /d"); });
  EXPECT_EQ(c.first, "cannot train on /d: Invalid argument: bad");
  EXPECT_EQ(c.second, proc::FailureKind::kOwn);
  auto t = ErrorOf([] { (void)Take(Result<int>(Status::IOError("gone")), "cannot read the shard set"); });
  EXPECT_EQ(t.first, "cannot read the shard set: " + Status::IOError("gone").ToString());
  EXPECT_EQ(t.second, proc::FailureKind::kOwn);
  EXPECT_EQ(Take(Result<int>(7), "unused"), 7);
}

TEST(TrainerOutputs, NamesWhatItWrites) {
  EXPECT_EQ(NameInMessage("cannot write /o/c.pt (as /o/c.pt.tmp-9): No space left on device", "the checkpoint"),
            "cannot write the checkpoint /o/c.pt (as /o/c.pt.tmp-9): No space left on device");
  EXPECT_EQ(NameInMessage("will not replace /o/c.pt: it is not a regular file", "the checkpoint"),
            "will not replace /o/c.pt: it is not a regular file");
  EXPECT_EQ(NameInMessage("cannot write x", ""), "cannot write x");
}

TEST(TrainerOutputs, WritesAtomicallyAndRefusesAFifo) {
  const std::string dir = ::testing::TempDir() + "/nl_outputs_" + std::to_string(getpid());
  ASSERT_TRUE(MakeDirs(dir).ok());
  WriteAtomically(dir + "/params.bin", "abc");
  EXPECT_EQ(*ReadFileToString(dir + "/params.bin"), "abc");
  EXPECT_FALSE(PathExists(TemporaryPath(dir + "/params.bin")));
  ASSERT_EQ(mkfifo((dir + "/fifo.svg").c_str(), 0600), 0);
  auto e = ErrorOf([&] { WriteAtomically(dir + "/fifo.svg", "x"); });
  EXPECT_EQ(e.first, "will not replace " + dir + "/fifo.svg: it is not a regular file (a device, FIFO, socket or directory)");
  EXPECT_EQ(ErrorOf([&] { WriteAtomically(dir + "/no/c.pt", "x", "the checkpoint"); }).first,
            "cannot create the checkpoint " + TemporaryPath(dir + "/no/c.pt") + ": No such file or directory");
  (void)RemoveAll(dir);
}

TEST(TrainerOutputs, RemovesOnlyItsOwnStaleTemporaries) {
  const std::string dir = ::testing::TempDir() + "/nl_stale_" + std::to_string(getpid());
  ASSERT_TRUE(MakeDirs(dir).ok());
  for (const char* name : {"checkpoint.pt.tmp-4242", "timing-epoch-3.svg.tmp-17", "checkpoint.pt", "notes.txt.tmp-5",
                           "timing-epoch-3.svg.tmp.17"}) {
    ASSERT_TRUE(WriteFile(dir + "/" + name, "x", 1).ok());
  }
  std::vector<std::string> removed = RemoveStaleOutputTemporaries(dir);
  std::sort(removed.begin(), removed.end());
  EXPECT_EQ(removed, (std::vector<std::string>{dir + "/checkpoint.pt.tmp-4242", dir + "/timing-epoch-3.svg.tmp-17"}));
  EXPECT_TRUE(PathExists(dir + "/checkpoint.pt"));
  EXPECT_TRUE(PathExists(dir + "/notes.txt.tmp-5"));
  EXPECT_TRUE(RemoveStaleOutputTemporaries("").empty());
  EXPECT_TRUE(IsRankOutput("timing-epoch-12.svg"));
  EXPECT_FALSE(IsRankOutput("timing-epoch-12.png"));
  EXPECT_FALSE(IsRankOutput("metrics.jsonl"));
  (void)RemoveAll(dir);
}

// The argv value after `flag` (the flag must be there once).
std::string ArgAfter(const std::vector<std::string>& a, const std::string& flag) {
  const auto it = std::find(a.begin(), a.end(), flag);
  EXPECT_NE(it, a.end()) << flag << " missing";
  EXPECT_EQ(std::count(a.begin(), a.end(), flag), 1) << flag;
  return it == a.end() || it + 1 == a.end() ? "" : *(it + 1);
}

bool Has(const std::vector<std::string>& a, const std::string& flag) {
  return std::find(a.begin(), a.end(), flag) != a.end();
}

TEST(TrainerServeArgs, PassesTheRanksOptions) {
  Options o;
  o.data = "/d";
  o.batch_size = 16;
  o.prefetch = 3;
  o.seed = 5;
  o.epochs = 4;
  o.plan.trainer_cores = 2;
  o.loader_threads = 6;
  o.plan.numa_node = "1,0";
  o.plan.allow_shared_cores = true;
  o.plan.no_bind = true;
  o.delay_ms = 150;
  o.order = OrderChoice::kBlocks;
  o.io_memory = 1 << 20;
  Placement p;
  p.job_id = "trainer-1-x";
  p.rank = 3;
  p.world = 4;
  p.local_rank = 1;
  p.local_world = 2;
  const std::vector<std::string> a = ServeArgs(o, p, "/bin/loader", TrainPipeline(o, p, 1, 7, 32), true);
  ASSERT_GE(a.size(), 2u);
  EXPECT_EQ(a[0], "/bin/loader");
  EXPECT_EQ(a[1], "serve");
  for (const auto& [flag, value] : std::vector<std::pair<std::string, std::string>>{
           {"--data", "/d"}, {"--split", "train"}, {"--batch-size", "16"}, {"--prefetch", "3"},
           {"--seed", "5"}, {"--job-id", "trainer-1-x"}, {"--rank", "3"}, {"--world-size", "4"},
           {"--local-rank", "1"}, {"--local-world-size", "2"}, {"--epochs", "3"}, {"--start-epoch", "1"},
           {"--start-batch", "7"}, {"--image-size", "32"}, {"--trainer-cores", "2"},
           {"--attach-timeout", "120"}, {"--pad-crop", "4"}, {"--threads", "6"}, {"--numa-node", "1,0"},
           {"--simulate-delay-ms", "150"}, {"--order", "blocks"}, {"--io-memory", "1048576"}}) {
    EXPECT_EQ(ArgAfter(a, flag), value) << flag;
  }
  EXPECT_TRUE(Has(a, "--augment"));
  EXPECT_TRUE(Has(a, "--allow-shared-cores"));
  EXPECT_TRUE(Has(a, "--no-bind"));
  EXPECT_FALSE(Has(a, "--random-resized-crop"));
  EXPECT_FALSE(Has(a, "--no-flip"));
  // The transform the trainer was given is the one its loader runs.
  o.transform.pad_crop = 0;
  o.transform.random_resized_crop = true;
  o.transform.flip = false;
  o.delay_ms = 0;
  const std::vector<std::string> rrc = ServeArgs(o, p, "/bin/loader", TrainPipeline(o, p, 0, 0, 224), false);
  EXPECT_TRUE(Has(rrc, "--random-resized-crop"));
  EXPECT_TRUE(Has(rrc, "--no-flip"));
  EXPECT_FALSE(Has(rrc, "--simulate-delay-ms"));
  o.transform.train = false;
  o.plan.gpus = "0,1";
  o.plan.ignore_gpus = true;
  const std::vector<std::string> eval = ServeArgs(o, p, "/bin/loader", TrainPipeline(o, p, 0, 0, 224), false);
  EXPECT_FALSE(Has(eval, "--augment"));
  EXPECT_EQ(ArgAfter(eval, "--gpus"), "0,1");
  EXPECT_TRUE(Has(eval, "--ignore-gpus"));
}

TEST(TrainerSchedule, BatchesAnEpochAreTheSamplersCount) {
  Options o;
  o.batch_size = 8;
  Placement p;
  p.world = 3;
  // 100 samples over 3 ranks: padded to 102, 34 a rank, 5 batches (the last partial).
  EXPECT_EQ(MakeSchedule(o, 100, 3).batches_per_epoch,
            BatchesPerEpoch(SamplerConfigFor(TrainPipeline(o, p, 0, 0, 224), 100)));
  EXPECT_EQ(MakeSchedule(o, 100, 3).batches_per_epoch, 5u);
}

TEST(TrainerServeArgs, RefusesALoaderThatIsNotExecutable) {
  Options o;
  o.loader_bin = "/nonexistent/loader";
  EXPECT_EQ(ErrorOf([&] { (void)LoaderBinary(o); }).first,
            "no loader executable at /nonexistent/loader (build the `loader` target, or give --loader-bin)");
}

TEST(TrainerSchedule, StepsWarmupAndLearningRate) {
  Options o;
  o.batch_size = 8;
  o.epochs = 3;
  o.lr = 0.1;
  const Schedule s = MakeSchedule(o, 100, 4);  // 25 samples a rank: 4 batches
  EXPECT_EQ(s.batches_per_epoch, 4u);
  EXPECT_EQ(s.schedule_steps, 12);
  EXPECT_EQ(s.total_steps, 12);
  EXPECT_EQ(s.warmup, 1);  // a tenth
  o.max_steps = 5;
  o.warmup_steps = 2;
  const Schedule m = MakeSchedule(o, 100, 4);
  EXPECT_EQ(m.schedule_steps, 12) << "--max-steps does not change the schedule";
  EXPECT_EQ(m.total_steps, 5);
  EXPECT_EQ(m.warmup, 2);
  EXPECT_DOUBLE_EQ(LearningRate(o, 0, 12, 2), 0.05);
  EXPECT_DOUBLE_EQ(LearningRate(o, 2, 12, 2), 0.1);
  EXPECT_NEAR(LearningRate(o, 7, 12, 2), 0.05, 1e-12);  // halfway down the cosine
  EXPECT_NEAR(LearningRate(o, 12, 12, 2), 0.0, 1e-12);
}

TEST(TrainerTiming, AWindowBecomesItsRow) {
  Window w;
  w.Add(1, 10, 2, 6, 20, 0.5, 8);
  w.Add(3, 10, 4, 8, 20, 1.5, 8);
  EXPECT_EQ(w.steps(), 2);
  const TimingRow row = RowOf(w, 0b10);
  const RankTiming t = TimingOf(3, row);
  EXPECT_EQ(t.rank, 3);
  EXPECT_DOUBLE_EQ(t.data_ms.mean, 2);
  EXPECT_DOUBLE_EQ(t.data_ms.p95, Summarize({1, 3}).p95);
  EXPECT_DOUBLE_EQ(t.compute_ms.mean, 10);
  EXPECT_DOUBLE_EQ(t.comm_ms.mean, 3);
  EXPECT_DOUBLE_EQ(t.allreduce_ms.mean, 7);
  EXPECT_DOUBLE_EQ(t.allreduce_ms.p95, 8);
  EXPECT_DOUBLE_EQ(t.step_ms.mean, 20);
  EXPECT_DOUBLE_EQ(t.images_per_s, 400);  // 16 images in 40 ms
  EXPECT_DOUBLE_EQ(t.loss, 1);
  EXPECT_EQ(t.steps, 2);
  EXPECT_EQ(t.ran_on_nodes, 0b10u);
  w.Clear();
  EXPECT_EQ(w.steps(), 0);
  const RankTiming empty = TimingOf(0, RowOf(w, 0));
  EXPECT_EQ(empty.images_per_s, 0);
  EXPECT_EQ(empty.loss, 0);
}

TEST(TrainerProcInfo, ReadsTheProcessorOfAStatLine) {
  std::string fields;
  for (int i = 3; i <= 38; ++i) fields += std::to_string(i) + " ";
  std::string comm;
  EXPECT_EQ(LastProcessor("123 (ldr-0 (x) y) " + fields + "17 0 0", &comm), 17);
  EXPECT_EQ(comm, "ldr-0 (x) y");
  EXPECT_EQ(LastProcessor("123 (short) S 1 2", &comm), -1);
  EXPECT_EQ(LastProcessor("garbage", &comm), -1);
  EXPECT_EQ(DirOf("/a/b/c"), "/a/b");
  EXPECT_EQ(DirOf("c"), ".");
  EXPECT_EQ(DirOf("/c"), "/");
}

TEST(TrainerBindingJson, RoundTrip) {
  RankBinding b = B(2, 1, 0, 3);
  b.host = "node-7";
  b.misbound = true;
  b.simulated_delay_ms = 40;
  const RankBinding got = BindingFromJson(BindingToJson(b));
  EXPECT_EQ(got.rank, 2);
  EXPECT_EQ(got.host, "node-7");
  EXPECT_EQ(got.loader_cpus, b.loader_cpus);
  EXPECT_EQ(got.loader_node, 1);
  EXPECT_EQ(got.planned_node, 0);
  EXPECT_EQ(got.gpu, 3);
  EXPECT_EQ(got.gpu_node, b.gpu_node);
  EXPECT_EQ(got.loader_threads, 4);
  EXPECT_TRUE(got.misbound);
  EXPECT_DOUBLE_EQ(got.simulated_delay_ms, 40);
}

// Rank 1's compute at 5x rank 0's (10.2 against 2.0 ms), its data on time:
// rank 0 spends its step in the all-reduce waiting for it.
TEST(Diagnose, AComputeStragglerIsNamedWithTheOthersWait) {
  std::vector<RankTiming> t = {T(0, 0.1, 2.0, 8.5), T(1, 0.1, 10.2, 0.3)};
  std::vector<RankBinding> b = {B(0, 0, 0), B(1, 0, 0)};
  Verdict v = Diagnose(t, b);
  EXPECT_EQ(v.straggler, 1);
  EXPECT_EQ(v.cause, "compute");
  EXPECT_NE(v.sentence.find("Rank 1 is the straggler: its compute (forward, backward, optimiser) takes 10.2 ms a "
                            "step against 2.00 ms on the other ranks (median): 8.20 ms more, 77% of its 10.6 ms step"),
            std::string::npos)
      << v.sentence;
  EXPECT_NE(v.waiting.find("Rank 0 waits 8.20 ms a step in the all-reduce for rank 1: its comm_time is the "
                           "straggler's compute"),
            std::string::npos)
      << v.waiting;
  b[1].simulated_delay_ms = 8;
  b[1].simulated_phase = "compute";
  v = Diagnose(t, b);
  EXPECT_EQ(v.cause, "simulated");
  EXPECT_NE(v.sentence.find("--slow-phase compute"), std::string::npos) << v.sentence;
  // A data straggler comes first; even compute is nobody.
  EXPECT_EQ(Diagnose({T(0, 0.1, 2.0, 8.5), T(1, 30, 10.2, 0.3)}, b).cause, "capacity");
  EXPECT_EQ(Diagnose({T(0, 0.1, 2.0, 0.3), T(1, 0.1, 2.5, 0.3), T(2, 0.1, 2.2, 0.3)}, b).straggler, -1);
  EXPECT_EQ(Diagnose({T(0, 0.1, 0.4, 0.3), T(1, 0.1, 0.9, 0.3)}, b).straggler, -1) << "under 1 ms more: noise";
}

// ---- the settings every rank must share ----

TEST(TrainerSettings, DifferencesNameEachSettingAndGroupTheRanks) {
  const Settings a = {{"--model", "resnet18"}, {"--seed", "1"}, {"--lr", "0.1"}};
  Settings b = a;
  b[1].second = "2";
  Settings c = b;
  c.push_back({"--extra", "x"});
  EXPECT_TRUE(SettingsDiffer({a, a, a}).empty());
  EXPECT_EQ(SettingsDiffer({a, b, c}),
            (std::vector<std::string>{"--seed (rank 0: 1; ranks 1 and 2: 2)",
                                      "--extra (ranks 0 and 1: (nothing); rank 2: x)"}));
}

TEST(TrainerSettings, EveryTrainingSettingIsCompared) {
  Manifest m;
  m.classes = {"a", "b"};
  Options o;
  const Settings base = SharedSettings(o, m, "none", "random");
  auto differs = [&](const Options& changed, const std::string& name) {
    const std::vector<std::string> d = SettingsDiffer({base, SharedSettings(changed, m, "none", "random")});
    return d.size() == 1 && d[0].rfind(name + " (", 0) == 0;
  };
  Options x = o;
  x.batch_size = 32;
  EXPECT_TRUE(differs(x, "--batch-size"));
  x = o;
  x.model = "smallcnn";
  EXPECT_TRUE(differs(x, "--model"));
  x = o;
  x.seed = 7;
  EXPECT_TRUE(differs(x, "--seed"));
  x = o;
  x.epochs = 3;
  EXPECT_TRUE(differs(x, "--epochs"));
  x = o;
  x.lr = 0.2;
  EXPECT_TRUE(differs(x, "--lr"));
  x = o;
  x.transform.image_size = 64;
  EXPECT_TRUE(differs(x, "--image-size"));
  x = o;
  x.transform.random_resized_crop = true;
  EXPECT_TRUE(differs(x, "the train transform"));
  x = o;
  x.order = OrderChoice::kBlocks;
  EXPECT_TRUE(differs(x, "--order"));
  Manifest other = m;
  other.classes.push_back("c");
  const std::vector<std::string> d = SettingsDiffer({base, SharedSettings(o, other, "none", "random")});
  ASSERT_EQ(d.size(), 1u);
  EXPECT_NE(d[0].find("--data (its manifest) (rank 0: crc32c:"), std::string::npos) << d[0];
  EXPECT_NE(d[0].find(", 2 classes"), std::string::npos) << d[0];
  EXPECT_EQ(SettingsDiffer({base, SharedSettings(o, m, "epoch 1, batch 0, step 9", "random")}).size(), 1u);
  // The same --order auto resolved differently (another node's memory), or
  // blocks sized from another --io-memory: named, though every flag agrees.
  const std::vector<std::string> seq =
      SettingsDiffer({base, SharedSettings(o, m, "none", "blocks of 6 samples, 600 a window")});
  ASSERT_EQ(seq.size(), 1u);
  EXPECT_EQ(seq[0], "the sample order (resolved) (rank 0: random; rank 1: blocks of 6 samples, 600 a window)");
}

}  // namespace
}  // namespace nl::trainer

namespace nl::trainer {
namespace {

TEST(Stalls, AFrozenProcessIsNamedWithItsLengthAndStep) {
  std::vector<RankTiming> t = {T(0, 1, 5, 2), T(1, 1, 5, 2)};
  EXPECT_TRUE(DescribeStalls(t).empty());
  t[1].frozen_ms = 12000;
  t[1].frozen_step = 37;
  const std::vector<std::string> s = DescribeStalls(t);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_NE(s[0].find("rank 1 stalled"), std::string::npos) << s[0];
  EXPECT_NE(s[0].find("at least 12.0 s at step 37"), std::string::npos) << s[0];
  EXPECT_NE(s[0].find("waited for it"), std::string::npos) << s[0];
}

TEST(Stalls, OneLongStepOfARanksOwnWorkIsNamedWithWhereItWent) {
  std::vector<RankTiming> t = {T(0, 1, 5, 2), T(1, 1, 5, 2), T(2, 1, 5, 2)};
  t[2].own_max_ms = 3500;
  t[2].own_max_step = 9;
  t[2].own_max_in_data = true;
  std::vector<std::string> s = DescribeStalls(t);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_NE(s[0].find("rank 2 stalled: step 9 took it 3.5 s in its data wait"), std::string::npos) << s[0];
  // A second-long step is no stall where every step takes about that long.
  t = {T(0, 1, 400, 2), T(1, 1, 400, 2)};
  t[0].own_max_ms = 1200;
  EXPECT_TRUE(DescribeStalls(t).empty());
  // ... nor a short spike.
  t = {T(0, 1, 5, 2), T(1, 1, 5, 2)};
  t[0].own_max_ms = 900;
  t[0].frozen_ms = 0;
  EXPECT_TRUE(DescribeStalls(t).empty());
}

TEST(Table, TheNodeColumnSaysWhereTheLoaderRanOnlyWhenItDiffers) {
  EXPECT_EQ(NodeText(0, 0b1), "0");
  EXPECT_EQ(NodeText(0, 0), "0");
  EXPECT_EQ(NodeText(0, 0b10), "0, ran 1");
  EXPECT_EQ(NodeText(1, 0b11), "1, ran 0,1");
  EXPECT_EQ(NodeText(-1, 0b1), "ran 0");
  EXPECT_EQ(NodeText(-1, 0), "-");
  std::vector<RankTiming> t = {T(0, 1, 2, 3)};
  t[0].ran_on_nodes = 0b1;
  const std::string s = FormatTable(t, {B(0, 0, 0)});
  EXPECT_EQ(s.find("(ran"), std::string::npos) << s;
}

TEST(TrainerTiming, AWindowKeepsItsLongestStepAndFreeze) {
  Window w;
  w.Add(1, 10, 2, 6, 20, 0.5, 8, 4);
  w.Add(300, 10, 2, 6, 20, 0.5, 8, 5);
  w.Add(1, 20, 2, 6, 20, 0.5, 8, 6);
  w.NoteFrozen(1500, 5);
  w.NoteFrozen(1200, 6);
  const RankTiming t = TimingOf(0, RowOf(w, 0));
  EXPECT_DOUBLE_EQ(t.own_max_ms, 310);
  EXPECT_EQ(t.own_max_step, 5);
  EXPECT_TRUE(t.own_max_in_data);
  EXPECT_DOUBLE_EQ(t.frozen_ms, 1500);
  EXPECT_EQ(t.frozen_step, 5);
  // A step given no number (a process's first, warming up) is never the longest.
  Window first;
  first.Add(2000, 10, 2, 6, 20, 0.5, 8, 0);
  first.Add(1, 10, 2, 6, 20, 0.5, 8, 2);
  const RankTiming f = TimingOf(0, RowOf(first, 0));
  EXPECT_DOUBLE_EQ(f.own_max_ms, 11);
  EXPECT_EQ(f.own_max_step, 2);
}

}  // namespace
}  // namespace nl::trainer
