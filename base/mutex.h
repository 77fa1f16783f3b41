// The project's lock, its scoped holder and its condition variable: a
// std::mutex and std::condition_variable whose rules clang checks
// (base/thread_annotations.h). Every mutex of product code that lives in one
// process is a Mutex, each member it protects NL_GUARDED_BY it.
//
//   Mutex mu_;
//   CondVar ready_;
//   bool done_ NL_GUARDED_BY(mu_) = false;
//
//   void Finish() NL_EXCLUDES(mu_) {
//     {
//       MutexLock lock(&mu_);
//       done_ = true;
//     }
//     ready_.NotifyAll();
//   }
//   void AwaitDone() NL_EXCLUDES(mu_) {
//     MutexLock lock(&mu_);
//     while (!done_) ready_.Wait(&mu_);  // the condition in the loop, under the lock
//   }
//
// A wait's condition is written as a loop around Wait(), not as a lambda:
// the analysis looks at a lambda as a function of its own, which holds no
// lock. (The ring's process-shared mutex is Boost's; loader/ring/ring_lock.h
// says why it is not one of these.)
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "base/thread_annotations.h"

namespace nl {

class NL_CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() NL_ACQUIRE() { mu_.lock(); }
  void Unlock() NL_RELEASE() { mu_.unlock(); }
  // Takes the lock if it is free; true when taken.
  bool TryLock() NL_TRY_ACQUIRE(true) { return mu_.try_lock(); }

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Holds a Mutex from its construction to the end of its scope.
class NL_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) NL_ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  // Takes over a lock the caller holds already (after a TryLock).
  struct Adopt {};
  MutexLock(Mutex* mu, Adopt) NL_REQUIRES(mu) : mu_(mu) {}
  ~MutexLock() NL_RELEASE() {
    if (held_) mu_->Unlock();
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  // Lets go for a while within the scope (a call that must not hold it),
  // and takes it back.
  void Unlock() NL_RELEASE() {
    mu_->Unlock();
    held_ = false;
  }
  void Lock() NL_ACQUIRE() {
    mu_->Lock();
    held_ = true;
  }

 private:
  Mutex* const mu_;
  bool held_ = true;
};

// A condition variable for Mutex. Each wait releases the mutex while it
// sleeps and holds it again when it returns, after a notification, a
// spurious wake-up or the timeout: the caller checks its condition again.
class CondVar {
 public:
  CondVar() = default;
  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;

  void Wait(Mutex* mu) NL_REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();  // still held: the caller's
  }
  // False when `timeout` passed without a wake-up.
  template <class Rep, class Period>
  bool WaitFor(Mutex* mu, std::chrono::duration<Rep, Period> timeout) NL_REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    const std::cv_status st = cv_.wait_for(lock, timeout);
    lock.release();
    return st == std::cv_status::no_timeout;
  }
  // False when `deadline` passed without a wake-up.
  template <class Clock, class Duration>
  bool WaitUntil(Mutex* mu, std::chrono::time_point<Clock, Duration> deadline) NL_REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    const std::cv_status st = cv_.wait_until(lock, deadline);
    lock.release();
    return st == std::cv_status::no_timeout;
  }
  void NotifyOne() { cv_.notify_one(); }
  void NotifyAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace nl
