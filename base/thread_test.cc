// nl::Thread: a pool of one for long-lived named threads. Its body's Status
// (or exception) comes back from Join(); the name, the start hook and the
// binding it inherits are what a service's threads rely on.
#include "base/thread.h"

#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace nl {
namespace {

std::string NameOfThisThread() {
  char name[16] = {};
  EXPECT_EQ(::pthread_getname_np(::pthread_self(), name, sizeof name), 0);
  return name;
}

TEST(Thread, TheBodysStatusComesBackFromJoinNamingTheThread) {
  auto t = Thread::Start("nl-reader", [] { return Status::Corruption("bad record 7"); });
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  const Status st = t->Join();
  EXPECT_EQ(st.code(), StatusCode::kCorruption);
  EXPECT_EQ(st.message(), "nl-reader 0: bad record 7");
  EXPECT_FALSE(t->running());
  EXPECT_EQ(t->Join().message(), "nl-reader 0: bad record 7") << "a second Join returns the first's";
}

TEST(Thread, AnOkBodyJoinsOk) {
  std::atomic<bool> ran{false};
  auto t = Thread::Start("nl-ok", [&] {
    ran = true;
    return Status::Ok();
  });
  ASSERT_TRUE(t.ok());
  EXPECT_TRUE(t->running());
  EXPECT_TRUE(t->Join().ok());
  EXPECT_TRUE(ran);
}

TEST(Thread, ExceptionsBecomeStatusesNotTerminate) {
  auto thrown = Thread::Start("nl-throw", []() -> Status { throw std::runtime_error("disk on fire"); });
  ASSERT_TRUE(thrown.ok());
  const Status st = thrown->Join();
  EXPECT_EQ(st.code(), StatusCode::kInternal);
  EXPECT_EQ(st.message(), "nl-throw 0: exception: disk on fire");

  auto oom = Thread::Start("nl-oom", []() -> Status { throw std::bad_alloc(); });
  ASSERT_TRUE(oom.ok());
  const Status o = oom->Join();
  EXPECT_EQ(o.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(o.message(), "nl-oom 0: out of memory");

  auto hook = Thread::Start(
      "nl-hook", [] { return Status::Ok(); }, [] { throw std::runtime_error("cannot bind"); });
  ASSERT_TRUE(hook.ok());
  EXPECT_EQ(hook->Join().message(), "nl-hook 0: exception: cannot bind");
}

TEST(Thread, TheThreadCarriesItsNameCutToFifteenCharacters) {
  std::string seen, seen_long;
  auto t = Thread::Start("nl-watch", [&] {
    seen = NameOfThisThread();
    return Status::Ok();
  });
  auto l = Thread::Start("nl-a-very-long-thread-name", [&] {
    seen_long = NameOfThisThread();
    return Status::Ok();
  });
  ASSERT_TRUE(t.ok() && l.ok());
  ASSERT_TRUE(t->Join().ok());
  ASSERT_TRUE(l->Join().ok());
  EXPECT_EQ(seen, "nl-watch");
  EXPECT_EQ(seen_long, "nl-a-very-long-");
}

TEST(Thread, OnStartRunsFirstOnTheThreadItself) {
  std::vector<std::string> order;  // written by the new thread only, read after Join
  std::thread::id hook_thread, body_thread;
  auto t = Thread::Start(
      "nl-order",
      [&] {
        body_thread = std::this_thread::get_id();
        order.push_back("body");
        return Status::Ok();
      },
      [&] {
        hook_thread = std::this_thread::get_id();
        order.push_back("on_start (named " + NameOfThisThread() + ")");
      });
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE(t->Join().ok());
  EXPECT_EQ(order, (std::vector<std::string>{"on_start (named nl-order)", "body"}));
  EXPECT_EQ(hook_thread, body_thread);
  EXPECT_NE(body_thread, std::this_thread::get_id());
}

// The service's threads stay on the loader's cores because they inherit the
// binding of the thread that starts them.
TEST(Thread, InheritsTheCpuBindingOfTheThreadThatStartsIt) {
  cpu_set_t before;
  ASSERT_EQ(::sched_getaffinity(0, sizeof before, &before), 0);
  int first = -1;
  for (int c = 0; c < CPU_SETSIZE && first < 0; ++c) {
    if (CPU_ISSET(c, &before)) first = c;
  }
  ASSERT_GE(first, 0);
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  ASSERT_EQ(::sched_setaffinity(0, sizeof one, &one), 0);
  cpu_set_t seen;
  CPU_ZERO(&seen);
  auto t = Thread::Start("nl-bound", [&] {
    return ::sched_getaffinity(0, sizeof seen, &seen) == 0 ? Status::Ok()
                                                           : Status::Internal("sched_getaffinity");
  });
  ASSERT_EQ(::sched_setaffinity(0, sizeof before, &before), 0);  // this test thread as it was
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE(t->Join().ok());
  EXPECT_EQ(CPU_COUNT(&seen), 1);
  EXPECT_TRUE(CPU_ISSET(first, &seen));
}

TEST(Thread, StartDetachedRunsItsBodyNamed) {
  auto told = std::make_shared<std::promise<std::string>>();
  std::future<std::string> name = told->get_future();
  ASSERT_TRUE(Thread::StartDetached("nl-detached", [told] {
                told->set_value(NameOfThisThread());
                return Status::Ok();
              }).ok());
  ASSERT_EQ(name.wait_for(std::chrono::seconds(60)), std::future_status::ready);
  EXPECT_EQ(name.get(), "nl-detached");
}

// A body that sleeps before it finishes: a Thread that did not join would be
// seen with `finished` still false.
Thread::Body SlowBody(std::atomic<bool>* finished, Status result) {
  return [finished, result] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    *finished = true;
    return result;
  };
}

TEST(Thread, MovedThreadIsJoinedByItsNewOwner) {
  std::atomic<bool> finished{false};
  auto t = Thread::Start("nl-moved", SlowBody(&finished, Status::NotFound("no such shard")));
  ASSERT_TRUE(t.ok());
  Thread moved = std::move(*t);
  EXPECT_FALSE(t->running());
  EXPECT_TRUE(t->Join().ok()) << "the moved-from Thread has nothing to join";
  EXPECT_TRUE(moved.running());
  EXPECT_EQ(moved.Join().message(), "nl-moved 0: no such shard");
  EXPECT_TRUE(finished);
}

TEST(Thread, MoveAssignmentJoinsTheThreadItReplaces) {
  std::atomic<bool> first_finished{false}, second_finished{false};
  auto first = Thread::Start("nl-first", SlowBody(&first_finished, Status::Ok()));
  auto second = Thread::Start("nl-second", SlowBody(&second_finished, Status::Aborted("stopped")));
  ASSERT_TRUE(first.ok() && second.ok());
  *first = std::move(*second);
  EXPECT_TRUE(first_finished) << "the replaced thread was not joined";
  EXPECT_EQ(first->Join().message(), "nl-second 0: stopped");
  EXPECT_TRUE(second_finished);
}

TEST(Thread, DestructorJoins) {
  std::atomic<bool> finished{false};
  {
    auto t = Thread::Start("nl-scoped", SlowBody(&finished, Status::Ok()));
    ASSERT_TRUE(t.ok());
  }
  EXPECT_TRUE(finished);
}

TEST(Thread, ANeverStartedThreadJoinsOk) {
  Thread t;
  EXPECT_FALSE(t.running());
  EXPECT_TRUE(t.Join().ok());
}

}  // namespace
}  // namespace nl
