// A rank's start-up, in named steps: the shard set checked, rank 0's outputs
// opened, the binding planned and the rank bound, the device chosen, the
// model built (and resumed), the loader started (it warms up during the
// rendezvous), the rendezvous with the settings agreed, rank 0's parameters
// broadcast, the bindings exchanged and, on rank 0, the plan said. What it
// made is a StartedRank, which the training loop (rank.cc) runs on.
// Errors are RankError (or c10d's exceptions, which RunRank classifies).
//
//   StartedRank s;
//   StartRank(options, placement, &s);  // throws; s releases what it holds
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/optim/sgd.h>

#include "base/fd.h"
#include "formats/manifest.h"
#include "loader/pipeline/pipeline.h"
#include "loader/plan/job_plan.h"
#include "trainer/batch_source.h"
#include "trainer/checkpoint.h"
#include "trainer/comm.h"
#include "trainer/diagnostics.h"
#include "trainer/grad_reducer.h"
#include "trainer/heartbeat.h"
#include "trainer/models.h"
#include "trainer/options.h"
#include "trainer/preflight.h"
#include "trainer/schedule.h"

namespace nl::trainer {

// What a started rank holds, for the life of the rank. Filled in place and
// never moved: the in-process loader's thread hooks point at `job`'s
// topology. Members are destroyed in reverse order: the gradient reducer
// before the communication it uses, that before the heartbeat and the
// store, those before the loader, the optimizer before the model.
struct StartedRank {
  StartedRank() = default;
  StartedRank(const StartedRank&) = delete;
  StartedRank& operator=(const StartedRank&) = delete;

  // What the checkpoint at (epoch, batch, step) of this run says of it.
  Checkpoint Describe(int64_t epoch, int64_t batch, int64_t step) const;
  // The in-process pipeline of `split` for this rank: its threads bound
  // where the plan puts the rank's loader.
  PipelineConfig InprocessConfig(const std::string& split) const;

  Options o;  // as started: the checkpoint's seed, --misbind-rank's plan
  Placement p;
  Manifest manifest;
  uint64_t train_samples = 0;
  JobPlan job;
  RankPlan loader_plan;  // where the rank's loader runs (another node with --misbind-rank)
  Geometry g;
  std::shared_ptr<Net> model;
  std::unique_ptr<torch::optim::SGD> opt;
  Checkpoint at;  // where the run starts (a resumed checkpoint's place)
  std::unique_ptr<BatchSource> source;
  c10::intrusive_ptr<c10d::Store> store;
  std::unique_ptr<Heartbeat> hb;
  std::unique_ptr<Comm> comm;
  std::unique_ptr<GradReducer> reducer;
  std::vector<torch::Tensor> buffers;  // the model's, broadcast after each step
  std::vector<RankBinding> bindings;   // every rank's, on rank 0 (for its table)
  Schedule schedule;
  ReadPlan read_plan;  // the train split's, as the loader resolves it
  OutputLock lock;     // rank 0 outside our launcher (which holds it otherwise)
  FileHandle metrics;  // rank 0's --metrics-out, flushed after each write
};

// Starts this rank into *s (default-constructed). Throws on failure; what
// *s holds by then is released with it (the loader service stops with its
// source).
void StartRank(const Options& o, const Placement& p, StartedRank* s);

}  // namespace nl::trainer
