// The job plan: from what the user and the environment say to where each
// local rank runs. One function, used by `loader topo`, `loader_bench` and
// (next) `loader serve` and the trainer's launcher, so they cannot drift.
//
// Environment variables are read by the caller (the command line's main) and
// passed in; nothing here reads the environment. There is no silent
// fallback: a request that cannot be met is an error, and a fallback the user
// asked for (shared cores, GPUs ignored) is listed in `notes`, which the
// caller prints.
//
//   JobPlanRequest rq;  rq.nproc = 4;  rq.cuda_visible_devices = EnvOrNull("CUDA_VISIBLE_DEVICES");
//   NL_ASSIGN_OR_RETURN(JobPlan job, MakeJobPlan(rq));
//   for (const std::string& n : job.notes) std::fprintf(stderr, "%s\n", n.c_str());
//   RankPlan mine = job.plan.ranks[local_rank];   // job.topology must outlive its use
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "loader/plan/binding.h"
#include "loader/plan/gpu_order.h"
#include "loader/plan/topology.h"

namespace nl {

struct JobPlanRequest {
  std::string topology_file;  // an hwloc XML file; empty: this machine
  int nproc = 0;              // local ranks; 0: one per visible GPU (at least 1)
  // Flag texts, parsed here (errors name the flag): "0,2", "0,0,1,1", "0-9;10-19".
  std::string gpus, numa_node, cpu_affinity;
  int trainer_cores = 1;
  bool allow_shared_cores = false;  // ranks may share cores when a node has too few
  bool ignore_gpus = false;         // plan as if no GPU were visible (ranks round-robin)
  bool no_bind = false;             // a plan that binds nothing
  // The environment's CUDA_VISIBLE_DEVICES, when set.
  std::optional<std::string> cuda_visible_devices;
};

struct JobPlan {
  Topology topology;
  std::vector<VisibleGpu> gpus;  // visible GPUs, CUDA ordinal order (empty with ignore_gpus)
  std::string gpu_note;          // why no GPU was found through CUDA, when none was
  BindingPlan plan;
  std::vector<std::string> notes;  // fallbacks asked for, and surprises in the environment
};

// Loads the topology (this machine, with the CUDA runtime's GPU order when
// it has one, or the XML file), resolves the visible GPUs, and plans.
Result<JobPlan> MakeJobPlan(const JobPlanRequest& request);

}  // namespace nl
