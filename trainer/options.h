// What `trainer` is asked to do: the command line (main.cc parses it) and the
// process's place in the job (torchrun's variables, or ours when we launch).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "loader/pipeline/pipeline.h"
#include "loader/pipeline/transforms.h"
#include "loader/plan/job_plan.h"

namespace nl::trainer {

// The trainer's transform unless told otherwise: the train transform,
// pad-crop 4 and flip (as `--augment` alone).
inline TransformConfig TrainerDefaultTransform() {
  TransformConfig t;
  t.train = true;
  t.pad_crop = 4;
  return t;
}

struct Options {
  // Data and loader.
  std::string data;
  std::string loader = "service";  // service (a `loader serve` per rank) or inprocess
  std::string loader_bin;          // the `loader` executable; default: beside `trainer`
  uint32_t loader_threads = 0;     // 0: the plan's loader cores for the rank
  uint32_t prefetch = 4;           // ring slots / batches in flight
  OrderChoice order = OrderChoice::kAuto;  // --order (loader/pipeline/pipeline.h)
  std::optional<uint64_t> io_memory;        // --io-memory; unset: the loader's default
  std::string resize_on = "loader";  // loader or device
  // The train split's transform: the loader's transform options
  // (loader/cli/cli_options.h), the train transform by default (pad-crop 4
  // and flip); transform.image_size is the model's input size.
  TransformConfig transform = TrainerDefaultTransform();
  std::string eval_split = "test";
  std::string eval_transform = "squash";  // squash, or center-crop (shorter side S/0.875, centre SxS)

  // Launch (ignored when RANK/WORLD_SIZE/LOCAL_RANK are set).
  int nproc_per_node = 1, nnodes = 1, node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;

  // Binding: the job plan's options as `loader serve` takes them (parsed by
  // AddPlanOptions; nproc and CUDA_VISIBLE_DEVICES are filled in where the
  // plan is made, PlanRequest).
  JobPlanRequest plan;

  // Training.
  std::string model = "resnet18";  // resnet18, resnet50, smallcnn (no batch norm)
  std::string device = "auto";     // auto, cpu, cuda
  int epochs = 1;
  uint32_t batch_size = 64;  // per rank
  double lr = 0.1, momentum = 0.9, weight_decay = 5e-4, label_smoothing = 0;
  int64_t warmup_steps = -1;  // -1: a tenth of the run's steps, at most 500
  int64_t max_steps = 0;  // 0: whole epochs
  uint64_t seed = 0;
  std::string out;  // checkpoints, metrics and charts
  int64_t checkpoint_every = 0;
  std::string resume;
  bool resume_changes = false;  // resume although the run's schedule or sizes differ
  int threads = 0;  // LibTorch intra-op threads; 0: the rank's trainer cores

  // Diagnostics.
  int64_t report_every = 50;
  std::string metrics_out;
  int simulate_slow_rank = -1;
  double delay_ms = 0;
  std::string reduce = "overlap";    // overlap (during backward) or after-backward
  std::string slow_phase = "data";  // where --delay-ms is spent: data (the loader) or compute
  int misbind_rank = -1;
  bool check_sync = false;  // compare parameters across ranks after every step
  std::string params_out;   // rank 0 writes its final parameters (float32, flat)
  double timeout_s = 300;   // ring waits and collectives
};

// The process's place in the job.
struct Placement {
  int rank = 0, world = 1, local_rank = 0, local_world = 1, node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string job_id;          // shared by the job's loader services
  bool agent_store = false;    // torchrun's agent hosts the store (TORCHELASTIC_USE_AGENT_STORE)
  bool launched_by_us = false;
  int failure_fd = -1;         // where the rank reports why it failed (base/child_process.h), or -1
};

}  // namespace nl::trainer
