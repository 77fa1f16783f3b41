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
  std::vector<double> data, compute, comm, step;  // ms, one per step
  double loss_sum = 0;
  int64_t images = 0;
  void Add(double d, double c, double m, double s, double loss, int64_t n);
  void Clear() { *this = Window(); }
  int64_t steps() const { return static_cast<int64_t>(step.size()); }
};

inline constexpr int kTimingFields = 12;
using TimingRow = std::array<double, kTimingFields>;

// A rank's window as its row: means and p95s, images/s, mean loss, steps and
// the nodes its loader ran on (bits).
TimingRow RowOf(const Window& w, uint64_t ran_on);
// The row back as the rank's RankTiming.
RankTiming TimingOf(int rank, const TimingRow& row);

}  // namespace nl::trainer
