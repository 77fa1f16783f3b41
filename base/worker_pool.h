// The one worker pool of the project: packing, verification and the loader
// pipeline (and the ring producer) run their threads through it; long-lived
// single threads (a watcher, a heartbeat) through base/thread.h, which is a
// pool of one.
//
//   WorkerPool::Options o;
//   o.threads = 4;
//   o.on_start = [&](int w) { BindToMyNode(w); };      // before the body touches memory
//   o.on_error = [&](const Status&) { stop = true; };  // tell the other workers to stop
//   NL_ASSIGN_OR_RETURN(auto pool, WorkerPool::Start(o, [&](int w) -> Status { ... }));
//   Status st = pool->Join();   // the first error of any worker, or ok
//
// Each worker runs on_start, then body(worker). A body's error, and any
// exception thrown by on_start or the body (std::bad_alloc, std::system_error,
// ...), becomes a Status: exceptions never leave a worker thread. The pool
// does not stop bodies itself: a body that loops watches its owner's stop
// flag, which on_error can set.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "base/mutex.h"
#include "base/status.h"

namespace nl {

// The exception boundary every project thread runs behind: f's Status, or
// an exception it threw as one (bad_alloc: ResourceExhausted; others:
// Internal, with what() quoted).
Status RunGuarded(const std::function<Status()>& f);

class WorkerPool {
 public:
  // Threads one pool may start: beyond this a request is a mistake, not a machine.
  static constexpr uint32_t kMaxThreads = 1024;

  struct Options {
    uint32_t threads = 1;         // 1..kMaxThreads
    std::string name = "worker";  // in errors: "<name> 3: ..."
    // Called first on each worker thread with its index (binding, naming).
    std::function<void(int worker)> on_start;
    // Called (on the failing thread, or in Start() when a thread cannot be
    // created) with each error as it happens, before Join() returns it.
    std::function<void(const Status&)> on_error;
    // Tests: run the workers one after another on the calling thread, inside
    // Start(), in index order (a deterministic, serial pool).
    bool run_inline = false;
  };
  using Body = std::function<Status(int worker)>;

  // Starts the workers. When a thread cannot be created, on_error hears of
  // it, the workers already started are joined, and Start() returns the
  // error (ResourceExhausted, naming the thread count).
  static Result<std::unique_ptr<WorkerPool>> Start(const Options& options, Body body);

  // Waits for every worker; returns the first error any of them had (in the
  // order they happened). Idempotent, and safe to call from several threads
  // at once (not from a worker of this pool).
  Status Join() NL_EXCLUDES(join_mu_, mu_);
  ~WorkerPool();  // joins

  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

 private:
  WorkerPool() = default;
  void Run(int worker);
  void Record(const Status& st) NL_EXCLUDES(mu_);

  Options options_;
  Body body_;
  Mutex join_mu_;  // serialises Join()
  std::vector<std::thread> threads_ NL_GUARDED_BY(join_mu_);
  Mutex mu_;
  Status first_error_ NL_GUARDED_BY(mu_);
};

}  // namespace nl
