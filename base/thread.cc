#include "base/thread.h"

#include <pthread.h>

#include <system_error>
#include <thread>
#include <utility>

namespace nl {

void NameThisThread(const std::string& name) {
  ::pthread_setname_np(::pthread_self(), name.substr(0, 15).c_str());
}

Result<Thread> Thread::Start(const std::string& name, Body body, std::function<void()> on_start) {
  WorkerPool::Options o;
  o.threads = 1;
  o.name = name;
  o.on_start = [name, hook = std::move(on_start)](int) {
    NameThisThread(name);
    if (hook) hook();
  };
  NL_ASSIGN_OR_RETURN(std::unique_ptr<WorkerPool> pool,
                      WorkerPool::Start(o, [b = std::move(body)](int) { return b(); }));
  Thread t;
  t.pool_ = std::move(pool);
  return t;
}

Status Thread::StartDetached(const std::string& name, Body body) {
  try {
    std::thread([name, b = std::move(body)] {
      NameThisThread(name);
      (void)RunGuarded(b);
    }).detach();
  } catch (const std::system_error& e) {
    return Status::ResourceExhausted("cannot start thread " + name + ": " + e.what());
  }
  return Status::Ok();
}

Thread& Thread::operator=(Thread&& o) noexcept {
  if (this != &o) {
    (void)Join();
    pool_ = std::move(o.pool_);
    result_ = std::move(o.result_);
  }
  return *this;
}

Thread::~Thread() { (void)Join(); }

Status Thread::Join() {
  if (pool_) {
    result_ = pool_->Join();
    pool_.reset();
  }
  return result_;
}

}  // namespace nl
