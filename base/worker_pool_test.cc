// The worker pool: hooks before bodies, errors and exceptions as values, the
// inline mode, and refusing absurd thread counts before starting anything.
#include "base/worker_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <thread>

namespace nl {
namespace {

TEST(WorkerPool, StartHookRunsFirstOnEachWorkersOwnThread) {
  constexpr int kThreads = 4;
  std::thread::id hook_thread[kThreads], body_thread[kThreads];
  std::atomic<int> order_errors{0};
  bool hooked[kThreads] = {};
  WorkerPool::Options o;
  o.threads = kThreads;
  o.on_start = [&](int w) {
    hook_thread[w] = std::this_thread::get_id();
    hooked[w] = true;
  };
  auto pool = WorkerPool::Start(o, [&](int w) {
    body_thread[w] = std::this_thread::get_id();
    if (!hooked[w]) ++order_errors;
    return Status::Ok();
  });
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  EXPECT_TRUE((*pool)->Join().ok());
  EXPECT_EQ(order_errors, 0);
  for (int w = 0; w < kThreads; ++w) {
    EXPECT_EQ(hook_thread[w], body_thread[w]);
    EXPECT_NE(body_thread[w], std::this_thread::get_id());
  }
}

TEST(WorkerPool, ABodysErrorIsReturnedNamingTheWorker) {
  WorkerPool::Options o;
  o.threads = 3;
  o.name = "decode worker";
  std::atomic<int> heard{0};
  o.on_error = [&](const Status&) { ++heard; };
  auto pool = WorkerPool::Start(
      o, [](int w) { return w == 1 ? Status::Corruption("bad record 7") : Status::Ok(); });
  ASSERT_TRUE(pool.ok());
  const Status s = (*pool)->Join();
  EXPECT_EQ(s.code(), StatusCode::kCorruption);
  EXPECT_EQ(s.message(), "decode worker 1: bad record 7");
  EXPECT_EQ(heard, 1);
  EXPECT_EQ((*pool)->Join().code(), StatusCode::kCorruption) << "Join is idempotent";
}

TEST(WorkerPool, ExceptionsFromBodyOrHookBecomeErrorsNotTerminate) {
  WorkerPool::Options o;
  o.threads = 2;
  auto pool = WorkerPool::Start(o, [](int w) -> Status {
    if (w == 0) throw std::bad_alloc();
    return Status::Ok();
  });
  ASSERT_TRUE(pool.ok());
  Status s = (*pool)->Join();
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(s.message(), "worker 0: out of memory");

  o.on_start = [](int) { throw std::runtime_error("cannot bind to node 3"); };
  bool body_ran = false;
  pool = WorkerPool::Start(o, [&](int) {
    body_ran = true;
    return Status::Ok();
  });
  ASSERT_TRUE(pool.ok());
  s = (*pool)->Join();
  EXPECT_EQ(s.code(), StatusCode::kInternal);
  EXPECT_NE(s.message().find("exception: cannot bind to node 3"), std::string::npos);
  EXPECT_FALSE(body_ran) << "a worker whose hook failed must not run its body";
}

TEST(WorkerPool, InlineRunsWorkersInOrderOnTheCallersThread) {
  WorkerPool::Options o;
  o.threads = 3;
  o.run_inline = true;
  std::vector<int> order;
  const std::thread::id caller = std::this_thread::get_id();
  auto pool = WorkerPool::Start(o, [&](int w) {
    EXPECT_EQ(std::this_thread::get_id(), caller);
    order.push_back(w);
    return Status::Ok();
  });
  ASSERT_TRUE(pool.ok());
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2})) << "all ran inside Start()";
  EXPECT_TRUE((*pool)->Join().ok());
}

TEST(WorkerPool, AbsurdThreadCountsAreRefusedBeforeStartingAny) {
  for (uint32_t n : {0u, WorkerPool::kMaxThreads + 1, 100000u, 2147483647u}) {
    WorkerPool::Options o;
    o.threads = n;
    o.name = "pack";
    bool ran = false;
    auto pool = WorkerPool::Start(o, [&](int) {
      ran = true;
      return Status::Ok();
    });
    ASSERT_FALSE(pool.ok());
    EXPECT_EQ(pool.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(pool.status().message().find("pack threads must be 1..1024"), std::string::npos)
        << pool.status().message();
    EXPECT_FALSE(ran);
  }
}

}  // namespace
}  // namespace nl

namespace nl {
namespace {

TEST(WorkerPool, JoinFromTwoThreadsAtOnceReturnsInBoth) {
  WorkerPool::Options o;
  o.threads = 2;
  auto pool = WorkerPool::Start(o, [](int w) {
    return w == 1 ? Status::Aborted("worker stopped") : Status::Ok();
  });
  ASSERT_TRUE(pool.ok());
  Status a, b;
  std::thread t1([&] { a = (*pool)->Join(); });
  std::thread t2([&] { b = (*pool)->Join(); });
  t1.join();
  t2.join();
  EXPECT_EQ(a.code(), StatusCode::kAborted);
  EXPECT_EQ(b.code(), StatusCode::kAborted);
}

}  // namespace
}  // namespace nl
