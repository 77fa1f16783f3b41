// RunService in this process, with RingClient on the other end of a real
// socket and segment: how the service's own threads (the socket watcher and
// the slot freer, both nl::Thread) end, and what RunService then returns.
#include "loader/ring/service.h"

#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "base/thread.h"
#include "formats/image.h"
#include "loader/ring/client.h"
#include "tests/support/test_util.h"

namespace nl {
namespace {

// 16 PNG records of 8x11 pixels, labels i % 2.
std::string WriteData(const testing::ScratchDir& d) {
  std::vector<std::vector<uint8_t>> records;
  for (uint32_t i = 0; i < 16; ++i) {
    RecordHeader h;
    h.label = i % 2;
    h.encoding = Encoding::kPng;
    h.width = 8;
    h.height = 11;
    records.push_back(testing::CraftRecord(h, *EncodePng(testing::PatternImage(8, 11, i))));
  }
  (void)testing::WriteShardSetForTest(d / "data", records);
  return d / "data";
}

ServiceConfig Config(const std::string& data, const std::string& job) {
  ServiceConfig c;
  c.job_id = job + "-" + std::to_string(::getpid());
  c.attach_timeout_s = 60;
  c.pipeline.data_dir = data;
  c.pipeline.batch_size = 4;
  c.pipeline.threads = 1;
  c.pipeline.prefetch = 2;
  c.pipeline.seed = 3;
  c.pipeline.epochs = 0;  // until stopped
  c.pipeline.transform.image_size = 8;
  c.log = [](const std::string&) {};
  return c;
}

std::string Who(const ServiceConfig& c) {
  return "loader serve for job " + c.job_id + ", rank 0 (pid " + std::to_string(::getpid()) + ")";
}

// RunService on its own thread; its Status once joined.
struct ServiceRun {
  ServiceReport report;
  Status served;
  Thread thread;
  Status Join() {
    const Status st = thread.Join();
    return st.ok() ? served : st;
  }
};

void Start(const ServiceConfig& cfg, ServiceRun* run, std::function<void()> on_start = {}) {
  auto t = Thread::Start(
      "nl-test-serve",
      [&cfg, run] {
        run->served = RunService(cfg, &run->report);
        return Status::Ok();
      },
      std::move(on_start));
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  run->thread = std::move(*t);
}

TEST(ServiceThreads, AConsumerThatDetachesEndsTheServiceOk) {
  testing::ScratchDir d;
  const ServiceConfig cfg = Config(WriteData(d), "svc-detach");
  ServiceRun run;
  Start(cfg, &run);
  {
    auto c = RingClient::Attach(cfg.job_id, 0, 60.0);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    for (int i = 0; i < 3; ++i) {
      Result<RingBatch> b = (*c)->Next(60.0);
      ASSERT_TRUE(b.ok()) << b.status().ToString();
      EXPECT_EQ(b->size, 4u);
      ASSERT_TRUE((*c)->Release(*b).ok());
    }
  }  // detaches
  const Status st = run.Join();
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_TRUE(run.report.detached);
  EXPECT_EQ(run.report.consumer_pid, ::getpid());
  EXPECT_GE(run.report.batches, 3u);
}

TEST(ServiceThreads, AStopSignalBeforeAnyConsumerIsReportedByName) {
  testing::ScratchDir d;
  ServiceConfig cfg = Config(WriteData(d), "svc-stop");
  const std::atomic<int> stop{SIGTERM};
  cfg.stop_signal = &stop;
  ServiceRun run;
  Start(cfg, &run);
  const Status st = run.Join();
  EXPECT_EQ(st.code(), StatusCode::kAborted);
  EXPECT_EQ(st.message(), Who(cfg) + " was stopped by SIGTERM before a consumer attached");
}

// The watcher refuses a second consumer and logs it; a log sink that throws
// there is a failure of the watcher thread: the service stops, tells its
// consumer why, and returns it (it is not lost with the thread). The watcher
// runs named, on the cores of the thread that started the service.
TEST(ServiceThreads, AFailureInTheSocketWatcherStopsTheServiceAndComesBack) {
  testing::ScratchDir d;
  ServiceConfig cfg = Config(WriteData(d), "svc-watcher");
  std::mutex mu;
  std::string watcher_name;
  cpu_set_t watcher_cpus;
  CPU_ZERO(&watcher_cpus);
  cfg.log = [&](const std::string& line) {
    if (line.find("refused a second consumer") == std::string::npos) return;
    std::lock_guard lock(mu);
    char name[16] = {};
    ::pthread_getname_np(::pthread_self(), name, sizeof name);
    watcher_name = name;
    ::sched_getaffinity(0, sizeof watcher_cpus, &watcher_cpus);
    throw std::runtime_error("the log is full");
  };
  cpu_set_t all, one;
  ASSERT_EQ(::sched_getaffinity(0, sizeof all, &all), 0);
  int first = 0;
  while (!CPU_ISSET(first, &all)) ++first;
  CPU_ZERO(&one);
  CPU_SET(first, &one);

  ServiceRun run;
  Start(cfg, &run, [&one] { ASSERT_EQ(::sched_setaffinity(0, sizeof one, &one), 0); });
  auto c = RingClient::Attach(cfg.job_id, 0, 60.0);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto second = RingClient::Attach(cfg.job_id, 0, 60.0);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(second.status().message().find("already has a consumer (pid " +
                                           std::to_string(::getpid()) + "); one consumer per rank"),
            std::string::npos)
      << second.status().ToString();

  // The first consumer gets what was published, then the reason (the
  // stream has no end: a service that went on would serve all 1000).
  Status ended;
  for (int i = 0; i < 1000 && ended.ok(); ++i) {
    Result<RingBatch> b = (*c)->Next(60.0);
    if (b.ok()) {
      ASSERT_TRUE((*c)->Release(*b).ok());
    } else {
      ended = b.status();
    }
  }
  c->reset();  // a service that went on serving ends once its consumer is gone
  EXPECT_EQ(ended.code(), StatusCode::kUnavailable) << ended.ToString();
  EXPECT_EQ(ended.message(),
            Who(cfg) + " failed: Internal error: socket watcher: exception: the log is full");

  const Status st = run.Join();
  EXPECT_EQ(st.code(), StatusCode::kInternal) << st.ToString();
  EXPECT_EQ(st.message(), Who(cfg) + ": nl-watch 0: exception: the log is full");
  std::lock_guard lock(mu);
  EXPECT_EQ(watcher_name, "nl-watch");
  EXPECT_EQ(CPU_COUNT(&watcher_cpus), 1);
  EXPECT_TRUE(CPU_ISSET(first, &watcher_cpus));
}

}  // namespace
}  // namespace nl
