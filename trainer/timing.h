// The per-step timings of a window of steps (a report's, or a whole epoch's),
// and the row of numbers each rank contributes to the gathered table
// (comm.h's GatherTimings all-reduces a [world, kTimingFields] table).
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "trainer/diagnostics.h"

namespace nl::trainer {

struct Window {
  std::vector<double> data, compute, comm, allreduce, step;  // ms, one per step
  double loss_sum = 0;
  int64_t images = 0;
  // The step whose own work (data wait + compute) took longest, and where;
  // the longest time the process did not run (Heartbeat::TakeFrozen).
  double own_max_ms = 0;
  int64_t own_max_step = 0;
  bool own_max_in_data = false;
  double frozen_ms = 0;
  int64_t frozen_step = 0;
  // index: the step's number (for the longest one); 0 leaves the step out
  // of that (a process's first step, which warms up).
  void Add(double d, double c, double m, double a, double s, double loss, int64_t n, int64_t index = 0);
  void NoteFrozen(double ms, int64_t at);
  void Clear() { *this = Window(); }
  int64_t steps() const { return static_cast<int64_t>(step.size()); }
};

inline constexpr int kTimingFields = 19;
using TimingRow = std::array<double, kTimingFields>;

// A rank's window as its row: means and p95s, images/s, mean loss, steps,
// the nodes its loader ran on (bits), all-reduce, the longest step's own
// work and the longest freeze.
TimingRow RowOf(const Window& w, uint64_t ran_on);
// The row back as the rank's RankTiming.
RankTiming TimingOf(int rank, const TimingRow& row);

}  // namespace nl::trainer
