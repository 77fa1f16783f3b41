// A long-lived named thread (a service's watcher, a trainer's heartbeat): a
// worker pool of one, so it has the pool's start hook and exception
// boundary, and its failure comes back as a Status from Join().
//
//   NL_ASSIGN_OR_RETURN(Thread watcher, Thread::Start("nl-watch", [&]() -> Status {
//     while (!stop) { ... }
//     return Status::Ok();
//   }));
//   ...
//   Status st = watcher.Join();  // the body's Status; the destructor joins too
//
// The name (at most 15 characters are kept, as the kernel allows) is what
// `top -H` and a debugger show. Move-only; Join() and the destructor are for
// the owner's thread.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "base/status.h"
#include "base/worker_pool.h"

namespace nl {

class Thread {
 public:
  using Body = std::function<Status()>;
  // Starts body on a new thread named `name`, after on_start (may be empty:
  // binding, say). ResourceExhausted when the thread cannot be created.
  static Result<Thread> Start(const std::string& name, Body body,
                              std::function<void()> on_start = {});
  // Starts body on a thread nobody joins, for a question that may outlive
  // its asker (a timed call into a library that has no timeout of its own):
  // body must own, by value or shared pointer, everything it touches. Its
  // failure is dropped; report through what it owns.
  static Status StartDetached(const std::string& name, Body body);

  Thread() = default;
  Thread(Thread&&) noexcept = default;
  Thread& operator=(Thread&& o) noexcept;
  Thread(const Thread&) = delete;
  Thread& operator=(const Thread&) = delete;
  ~Thread();

  bool running() const { return pool_ != nullptr; }
  // Waits for the body; its Status (an exception becomes one). Ok when not
  // started; a second call returns the first's result.
  Status Join();

 private:
  std::unique_ptr<WorkerPool> pool_;
  Status result_;
};

// Names the calling thread (at most 15 characters are kept).
void NameThisThread(const std::string& name);

}  // namespace nl
