// Per-rank step timings, the table rank 0 prints, the straggler verdict, the
// metrics lines and the chart. Plain C++ (no LibTorch): the rank gathers the
// numbers, this file decides what they mean.
//
// The straggler rule (docs/guide/training.md, "Which rank is slow, and why"): rank r is a
// straggler when its mean data_time is
//   - more than 2x the median of the other ranks' mean data_time, and
//   - more than 10% of its own mean step_time, and
//   - at least 1 ms (below that it is noise);
// when several qualify, the one with the largest data_time is named. With
// no data straggler, rank r is a compute straggler when its mean
// compute_time is more than 1.5x the others' median, at least 1 ms more, and
// that excess is over 10% of its step (cause "compute", or "simulated" when
// --slow-phase compute made it so): the others wait for it in the
// all-reduce, and the verdict says how long. A job of one rank has nobody to
// compare with: no straggler. A data straggler's cause, in order:
//   binding   its loader's threads are bound to (or ran on) another NUMA node
//             than the one its GPU (or, without GPUs, its plan) puts it on;
//   simulated its loader was slowed on purpose (--simulate-slow-rank);
//   capacity  bound right, but its threads cannot keep up with the step rate
//             (such a straggler tends to move between ranks from epoch to
//             epoch, while a binding straggler stays).
// The other ranks' share of that wait shows in their comm_time: they sit in
// the all-reduce until the straggler arrives, and the verdict says so.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace nl::trainer {

// Mean and 95th percentile (nearest rank) of a sample; zeros when empty.
struct Summary {
  double mean = 0, p95 = 0;
};
Summary Summarize(std::vector<double> v);

// One rank's timings over a report window (milliseconds per step).
struct RankTiming {
  int rank = 0;
  // comm: the step's exposed wait for its collectives (after backward);
  // allreduce: the gradients' all-reduce from first launch to last arrival,
  // overlapped with backward or not.
  Summary data_ms, compute_ms, comm_ms, step_ms, allreduce_ms;
  double images_per_s = 0;
  double loss = 0;  // mean over the window
  int64_t steps = 0;
  // Bit n set: a loader thread of this rank was last seen running on NUMA node n.
  uint64_t ran_on_nodes = 0;
  // The window's longest step by the rank's own work (data wait + compute),
  // its number, and whether the data wait was the larger part; the longest
  // time the rank's process did not run at all, and the step it was at.
  double own_max_ms = 0;
  int64_t own_max_step = 0;
  bool own_max_in_data = false;
  double frozen_ms = 0;
  int64_t frozen_step = 0;
};

// Stalls in a window, one sentence each (docs/guide/training.md, "Which rank
// is slow, and why"): a rank whose process did not run for a second or more, or whose
// own work on one step took a second or more and over 10x the ranks'
// median step work. Stalls shorter than --timeout end no collective; this
// names them, with their length and step.
std::vector<std::string> DescribeStalls(const std::vector<RankTiming>& t);

// Where one rank's work runs (exchanged once at start).
struct RankBinding {
  int rank = 0;
  std::string host;
  std::string loader_cpus;  // "0-9,44-53", "" when unbound
  int loader_node = -1;     // the node its loader is bound to; -1: unbound
  int planned_node = -1;    // the node it should be on: its GPU's, else its plan's
  int gpu = -1;             // CUDA ordinal, -1: CPU
  int gpu_node = -1;
  int loader_threads = 0;
  bool misbound = false;        // --misbind-rank
  double simulated_delay_ms = 0;  // --simulate-slow-rank
  std::string simulated_phase = "data";  // --slow-phase: where that delay is spent
};

struct Verdict {
  int straggler = -1;  // -1: nobody
  std::string cause;   // "binding", "simulated", "capacity", "compute" (empty with nobody)
  std::string sentence;  // plain words: who, how slow, why, what to change
  std::string waiting;   // the others' wait in the all-reduce, when it shows
};

// `previous` holds the stragglers named at earlier epoch ends (-1 for none):
// a straggler that moves points to capacity.
Verdict Diagnose(const std::vector<RankTiming>& t, const std::vector<RankBinding>& b,
                 const std::vector<int>& previous = {});

// The per-rank table (one header line, one line per rank).
std::string FormatTable(const std::vector<RankTiming>& t, const std::vector<RankBinding>& b);

// One JSON line per rank for a report.
std::string ReportJsonLines(int64_t epoch, int64_t step, const std::vector<RankTiming>& t);
struct EpochRecord {
  int64_t epoch = 0;
  double train_loss = 0, test_top1 = 0, test_top5 = 0, images_per_s = 0;
  int straggler = -1;
  int64_t steps = 0;
  bool evaluated = true;
};
std::string EpochJsonLine(const EpochRecord& e);

// A stacked bar per rank (data / compute / comm, mean ms per step), as SVG.
std::string ChartSvg(const std::string& title, const std::vector<RankTiming>& t,
                     int straggler);

// NUMA nodes in a bit set, "0" or "0,1".
std::string NodeList(uint64_t bits);
// The table's node column: the bound node alone when the loader ran only
// there, else "0, ran 1"; "ran 0" unbound; "-" unbound and unseen.
std::string NodeText(int bound, uint64_t ran_on);

}  // namespace nl::trainer
