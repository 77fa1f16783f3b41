#include "base/worker_pool.h"

#include <exception>
#include <system_error>

namespace nl {

Result<std::unique_ptr<WorkerPool>> WorkerPool::Start(const Options& options, Body body) {
  if (options.threads < 1 || options.threads > kMaxThreads) {
    return Status::InvalidArgument(options.name + " threads must be 1.." +
                                   std::to_string(kMaxThreads) + " (asked for " +
                                   std::to_string(options.threads) + ")");
  }
  std::unique_ptr<WorkerPool> pool(new WorkerPool());
  pool->options_ = options;
  pool->body_ = std::move(body);
  if (options.run_inline) {
    for (uint32_t w = 0; w < options.threads; ++w) pool->Run(static_cast<int>(w));
    return pool;
  }
  WorkerPool* raw = pool.get();
  for (uint32_t w = 0; w < options.threads; ++w) {
    try {
      MutexLock lock(&pool->join_mu_);
      pool->threads_.emplace_back([raw, w] { raw->Run(static_cast<int>(w)); });
    } catch (const std::system_error& e) {
      const Status st = Status::ResourceExhausted(
          "cannot start " + options.name + " thread " + std::to_string(w) + " of " +
          std::to_string(options.threads) + ": " + e.what());
      pool->Record(st);
      (void)pool->Join();
      return st;
    }
  }
  return pool;
}

Status RunGuarded(const std::function<Status()>& f) {
  try {
    return f();
  } catch (const std::bad_alloc&) {
    return Status::ResourceExhausted("out of memory");
  } catch (const std::exception& e) {
    return Status::Internal(std::string("exception: ") + e.what());
  } catch (...) {
    return Status::Internal("unknown exception");
  }
}

void WorkerPool::Run(int worker) {
  const Status st = RunGuarded([&] {
    if (options_.on_start) options_.on_start(worker);
    return body_(worker);
  });
  if (!st.ok()) Record(st.WithContext(options_.name + " " + std::to_string(worker)));
}

void WorkerPool::Record(const Status& st) {
  {
    MutexLock lock(&mu_);
    if (first_error_.ok()) first_error_ = st;
  }
  if (options_.on_error) {
    try {
      options_.on_error(st);
    } catch (...) {  // a reporting hook must not take the worker down
    }
  }
}

Status WorkerPool::Join() {
  MutexLock joining(&join_mu_);  // two threads may call Join(): one joins, both wait
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
  MutexLock lock(&mu_);
  return first_error_;
}

WorkerPool::~WorkerPool() { (void)Join(); }

}  // namespace nl
