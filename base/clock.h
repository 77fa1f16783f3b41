// The one clock for spans of time (steady: never steps with the wall clock)
// and its spans as milliseconds, for timings and deadlines.
#pragma once

#include <chrono>

namespace nl {

using Clock = std::chrono::steady_clock;

// Milliseconds from a to b (negative when b is earlier).
inline double Ms(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}
inline double MsSince(Clock::time_point t0) { return Ms(t0, Clock::now()); }

}  // namespace nl
