// Timed locking and waiting on the ring's process-shared objects: every wait
// is cut into short slices, so a waiter can look at its peer (the socket)
// between them and never blocks for good on a peer that died.
#pragma once

#include <boost/date_time/posix_time/posix_time_types.hpp>
#include <boost/interprocess/sync/scoped_lock.hpp>

#include "loader/ring/ring_layout.h"

namespace nl::ring {

using RingLock = boost::interprocess::scoped_lock<boost::interprocess::interprocess_mutex>;

inline boost::posix_time::ptime In(int ms) {
  return boost::posix_time::microsec_clock::universal_time() +
         boost::posix_time::milliseconds(ms);
}

inline constexpr int kSliceMs = 50;  // how often a waiter looks at its peer

// Locks within `ms`; an unlocked RingLock when the mutex stayed held (by a
// peer that may have died holding it).
inline RingLock TryLockFor(Control& c, int ms) {
  RingLock lock(c.mutex, boost::interprocess::defer_lock);
  (void)lock.timed_lock(In(ms));
  return lock;
}

}  // namespace nl::ring
