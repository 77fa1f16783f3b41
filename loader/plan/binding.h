// The binding plan: for each local rank, its GPU, that GPU's NUMA node, the
// cores of that node for the trainer rank and for its loader threads, and the
// memory node. A pure function of a topology and options, so it is tested on
// topology files of machines we do not have (contract 3 of the architecture).
//
//   PlanOptions o;  o.nproc = 4;  o.visible_gpus = *ResolveVisibleGpus(topo, inputs);
//   Result<BindingPlan> plan = Plan(topo, o);
#pragma once

#include <string>
#include <vector>

#include "base/status.h"
#include "loader/plan/cpu_list.h"
#include "loader/plan/gpu_order.h"
#include "loader/plan/topology.h"

namespace nl {

// Bounds on what a plan may be asked for (checked by Plan()).
inline constexpr int kMaxLocalRanks = 1024;
inline constexpr int kMaxGpuIndex = 1023;

struct PlanOptions {
  int nproc = 1;                         // local ranks
  std::vector<VisibleGpu> visible_gpus;  // in CUDA ordinal order (ResolveVisibleGpus)
  std::vector<int> rank_gpu;             // local rank -> GPU index; empty: rank i uses GPU i
  int trainer_cores = 1;                 // cores reserved for the trainer rank itself
  std::vector<CpuList> cpu_affinity;     // --cpu-affinity: one list per rank, or empty
  std::vector<int> numa_node;            // --numa-node: one per rank (or one for all), or empty
  bool allow_shared_cores = false;       // let ranks share cores when a node has too few
  bool no_bind = false;                  // a plan that binds nothing
};

struct RankPlan {
  int local_rank = 0;
  int gpu = -1;            // CUDA ordinal, -1 for CPU training
  std::string pci_bus_id;  // of that GPU
  int numa_node = -1;      // -1: not bound
  CpuList trainer_cpus;    // the trainer rank's thread(s)
  CpuList loader_cpus;     // the rank's loader threads
  int mem_node = -1;       // memory binding, -1: none
  bool shares_cores = false;
  std::string reason;  // why, in plain words
};

struct BindingPlan {
  std::vector<RankPlan> ranks;
  bool binds = true;  // false for --no-bind
};

// Rules (each tested):
// - A rank's NUMA node is its GPU's node (--numa-node overrides). Without
//   GPUs, ranks go round-robin over the nodes that have allowed cores.
// - Ranks on the same node get disjoint slices of its allowed cores: whole
//   cores, hardware threads of a core together, sizes within one core of each
//   other, extra cores to the lowest ranks. Too few cores for the ranks on a
//   node is an error, unless allow_shared_cores (then slices overlap and the
//   reason says so).
// - Within a slice, the first `trainer_cores` cores go to the trainer (one
//   hardware thread each; their siblings stay idle so the trainer owns the
//   core) and the rest, whole, to the loader; a one-core slice is shared.
// - More ranks than visible GPUs, when there are GPUs, is an error.
Result<BindingPlan> Plan(const Topology& topo, const PlanOptions& options);

// One line per rank, the form users know from the incident:
// [Affinity][Rank 3] local_rank=3 gpu=3 (0000:82:00.0) numa_node=1 trainer_cpus=22
// loader_cpus=23-32,67-76 mem_node=1
std::string PlanLine(int rank, const RankPlan& r);

// "0-9,44-53;10-21,54-65" -> one CpuList per rank.
Result<std::vector<CpuList>> ParseCpuAffinity(const std::string& text);

}  // namespace nl
