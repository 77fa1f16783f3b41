// Timed locking and waiting on the ring's process-shared objects: every wait
// is cut into short slices, so a waiter can look at its peer (the socket)
// between them and never blocks for good on a peer that died. (Why these
// locks are outside clang's lock checks: Control, in ring_layout.h.)
#pragma once

#include <boost/date_time/posix_time/posix_time_types.hpp>
#include <boost/interprocess/exceptions.hpp>
#include <boost/interprocess/sync/scoped_lock.hpp>

#include "loader/ring/ring_layout.h"

namespace nl::ring {

using RingLock = boost::interprocess::scoped_lock<boost::interprocess::interprocess_mutex>;

inline boost::posix_time::ptime In(int ms) {
  return boost::posix_time::microsec_clock::universal_time() +
         boost::posix_time::milliseconds(ms);
}

inline constexpr int kSliceMs = 50;  // how often a waiter looks at its peer

// Under the held lock: wakes the other side if it said it waits.
inline void Wake(boost::interprocess::interprocess_semaphore& s, uint32_t& waiting) {
  if (waiting != 0) {
    waiting = 0;
    try {
      s.post();
    } catch (const boost::interprocess::interprocess_exception&) {
      // Only EOVERFLOW is possible, and the count stays at 0 or 1; the
      // waiter's slice ends within kSliceMs anyway.
    }
  }
}

// Says (under the held lock) that this side waits, unlocks, and sleeps until
// woken or `ms` pass. The lock is released on return.
inline void SleepUntilWoken(RingLock& lock, boost::interprocess::interprocess_semaphore& s,
                            uint32_t& waiting, int ms) {
  waiting = 1;
  lock.unlock();
  // Boost throws where sem_timedwait fails: EINTR when a signal (Ctrl-C)
  // arrives. Either way the caller's loop looks again.
  try {
    (void)s.timed_wait(In(ms));
    while (s.try_wait()) {
    }
  } catch (const boost::interprocess::interprocess_exception&) {
  }
}

// Locks within `ms`; an unlocked RingLock when the mutex stayed held (by a
// peer that may have died holding it).
inline RingLock TryLockFor(Control& c, int ms) {
  RingLock lock(c.mutex, boost::interprocess::defer_lock);
  try {
    (void)lock.timed_lock(In(ms));
  } catch (const boost::interprocess::interprocess_exception&) {
    // Treated as not locked: the caller looks at its peer and tries again.
  }
  return lock;
}

}  // namespace nl::ring
