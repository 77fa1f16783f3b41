#include "loader/plan/binding.h"

#include <algorithm>
#include <map>

#include "base/parse_number.h"

namespace nl {
namespace {

// A node's cores restricted to the allowed hardware threads; cores with none left are dropped.
std::vector<CpuList> AllowedCores(const NumaNode& n, const CpuList& allowed) {
  std::vector<CpuList> cores;
  for (const Core& c : n.cores) {
    CpuList a = Intersect(c.pus, allowed);
    if (!a.empty()) cores.push_back(std::move(a));
  }
  return cores;
}

// Splits a slice of cores into trainer and loader cpus.
void SplitSlice(const std::vector<CpuList>& slice, int trainer_cores, RankPlan* r) {
  const size_t t = static_cast<size_t>(std::max(trainer_cores, 1));
  if (slice.size() > t) {
    for (size_t i = 0; i < t; ++i) r->trainer_cpus.push_back(slice[i].front());
    for (size_t i = t; i < slice.size(); ++i) r->loader_cpus = Union(r->loader_cpus, slice[i]);
    std::sort(r->trainer_cpus.begin(), r->trainer_cpus.end());
  } else {
    r->trainer_cpus = {slice.front().front()};
    for (const CpuList& c : slice) r->loader_cpus = Union(r->loader_cpus, c);
    r->reason +=
        "; its " + std::to_string(slice.size()) + "-core slice is shared by the trainer and loader";
  }
}

// Groups a cpu list into the topology's cores (in core order).
std::vector<CpuList> CoresOf(const Topology& topo, const CpuList& cpus) {
  std::vector<std::pair<int, CpuList>> found;
  CpuList seen;
  for (const NumaNode& n : topo.numa_nodes()) {
    for (const Core& c : n.cores) {
      CpuList in = Intersect(c.pus, cpus);
      if (!in.empty()) {
        found.emplace_back(in.front(), in);
        seen = Union(seen, in);
      }
    }
  }
  for (int c : cpus)  // cpus the map does not place in a core: each its own
    if (!std::binary_search(seen.begin(), seen.end(), c)) found.emplace_back(c, CpuList{c});
  std::sort(found.begin(), found.end());
  std::vector<CpuList> out;
  for (auto& f : found) out.push_back(std::move(f.second));
  return out;
}

int NodeOfCpus(const Topology& topo, const CpuList& cpus) {
  int best = -1;
  size_t most = 0;
  for (const NumaNode& n : topo.numa_nodes()) {
    const size_t k = Intersect(n.pus, cpus).size();
    if (k > most) {
      most = k;
      best = n.os_index;
    }
  }
  return best;
}

// Option combinations that cannot be planned, before anything is computed.
Status CheckOptions(const PlanOptions& o) {
  if (o.nproc < 1 || o.nproc > kMaxLocalRanks) {
    return Status::InvalidArgument("local ranks must be 1.." + std::to_string(kMaxLocalRanks) +
                                   " (asked for " + std::to_string(o.nproc) + ")");
  }
  if (o.trainer_cores < 1 || o.trainer_cores > kMaxCpuIndex) {
    return Status::InvalidArgument("`trainer_cores` must be 1.." + std::to_string(kMaxCpuIndex) +
                                   " (asked for " + std::to_string(o.trainer_cores) + ")");
  }
  return Status::Ok();
}

// Step 1: each rank's GPU (CUDA ordinal and bus id).
Status AssignGpus(const PlanOptions& o, BindingPlan* plan) {
  const int n = o.nproc;
  const auto& gpus = o.visible_gpus;
  if (!o.rank_gpu.empty() && static_cast<int>(o.rank_gpu.size()) != n) {
    return Status::InvalidArgument("`gpus` lists " + std::to_string(o.rank_gpu.size()) +
                                   " GPUs for " + std::to_string(n) + " local ranks");
  }
  if (!gpus.empty() && o.rank_gpu.empty() && n > static_cast<int>(gpus.size())) {
    return Status::InvalidArgument(std::to_string(n) + " local ranks but only " +
                                   std::to_string(gpus.size()) + " visible GPUs");
  }
  for (int r = 0; r < n; ++r) {
    RankPlan& rp = plan->ranks[r];
    rp.local_rank = r;
    if (gpus.empty()) {
      if (!o.rank_gpu.empty()) return Status::InvalidArgument("`gpus` given but no GPU is visible");
      continue;
    }
    const int g = o.rank_gpu.empty() ? r : o.rank_gpu[r];
    if (g < 0 || g >= static_cast<int>(gpus.size())) {
      return Status::InvalidArgument("local rank " + std::to_string(r) + " asks for GPU " +
                                     std::to_string(g) + " but only " +
                                     std::to_string(gpus.size()) + " GPUs are visible");
    }
    rp.gpu = gpus[g].index;
    rp.pci_bus_id = gpus[g].gpu.pci_bus_id;
  }
  return Status::Ok();
}

// Step 2: each rank's NUMA node and memory node, with the reason.
Status AssignNodes(const Topology& topo, const PlanOptions& o, BindingPlan* plan) {
  const int n = o.nproc;
  const auto& gpus = o.visible_gpus;
  if (!o.numa_node.empty() && o.numa_node.size() != 1 &&
      static_cast<int>(o.numa_node.size()) != n) {
    return Status::InvalidArgument("`numa_node` lists " + std::to_string(o.numa_node.size()) +
                                   " nodes for " + std::to_string(n) + " local ranks");
  }
  if (!o.cpu_affinity.empty() && static_cast<int>(o.cpu_affinity.size()) != n) {
    return Status::InvalidArgument("`cpu_affinity` lists " + std::to_string(o.cpu_affinity.size()) +
                                   " cpu sets for " + std::to_string(n) + " local ranks");
  }
  std::vector<int> with_cores;  // nodes that have allowed cores, for round-robin
  for (const NumaNode& node : topo.numa_nodes())
    if (!AllowedCores(node, topo.allowed_pus()).empty()) with_cores.push_back(node.os_index);
  if (with_cores.empty()) return Status::InvalidArgument("no allowed cores on any NUMA node");

  for (int r = 0; r < n; ++r) {
    RankPlan& rp = plan->ranks[r];
    if (!o.numa_node.empty()) {
      rp.numa_node = o.numa_node.size() == 1 ? o.numa_node[0] : o.numa_node[r];
      if (!topo.FindNode(rp.numa_node)) {
        return Status::InvalidArgument("`numa_node` " + std::to_string(rp.numa_node) +
                                       " for local rank " + std::to_string(r) +
                                       ": this machine has no such NUMA node");
      }
      rp.reason = "NUMA node " + std::to_string(rp.numa_node) + " set by `numa_node`";
    } else if (!o.cpu_affinity.empty()) {
      rp.numa_node = NodeOfCpus(topo, o.cpu_affinity[r]);
      rp.reason = "cpus set by `cpu_affinity`";
    } else if (rp.gpu >= 0) {
      const int g = o.rank_gpu.empty() ? r : o.rank_gpu[r];
      rp.numa_node = gpus[g].gpu.numa_node;
      if (rp.numa_node >= 0) {
        rp.reason = "GPU " + std::to_string(rp.gpu) + " (" + rp.pci_bus_id + ") is on NUMA node " +
                    std::to_string(rp.numa_node);
      } else {
        rp.numa_node = with_cores[r % with_cores.size()];
        rp.reason = "the NUMA node of GPU " + std::to_string(rp.gpu) +
                    " is unknown; round-robin gave node " + std::to_string(rp.numa_node);
      }
    } else {
      rp.numa_node = with_cores[r % with_cores.size()];
      rp.reason = "no GPU: round-robin over " + std::to_string(with_cores.size()) + " NUMA node" +
                  (with_cores.size() == 1 ? "" : "s") + " gave node " +
                  std::to_string(rp.numa_node);
    }
    rp.mem_node = rp.numa_node;
  }

  return Status::Ok();
}

// Step 3, with --cpu-affinity: the user's cpus, checked against the allowed ones.
Status CoresFromAffinity(const Topology& topo, const PlanOptions& o, BindingPlan* plan) {
  const int n = o.nproc;
  for (int r = 0; r < n; ++r) {
    RankPlan& rp = plan->ranks[r];
    const CpuList& want = o.cpu_affinity[r];
    if (want.empty())
      return Status::InvalidArgument("`cpu_affinity` for local rank " + std::to_string(r) +
                                     " is empty");
    CpuList outside;
    for (int c : want)
      if (!std::binary_search(topo.allowed_pus().begin(), topo.allowed_pus().end(), c))
        outside.push_back(c);
    if (!outside.empty()) {
      return Status::InvalidArgument(
          "`cpu_affinity` for local rank " + std::to_string(r) + " uses cpus " +
          FormatCpuList(outside) +
          " that this process may not use (allowed: " + FormatCpuList(topo.allowed_pus()) + ")");
    }
    SplitSlice(CoresOf(topo, want), o.trainer_cores, &rp);
  }
  return Status::Ok();
}

// Step 3 otherwise: disjoint slices of each node's allowed cores for the ranks on it.
Status SliceNodeCores(const Topology& topo, const PlanOptions& o, BindingPlan* plan) {
  const int n = o.nproc;
  std::map<int, std::vector<int>> ranks_on;  // node -> local ranks, ascending
  for (int r = 0; r < n; ++r) ranks_on[plan->ranks[r].numa_node].push_back(r);
  for (const auto& [node_id, ranks] : ranks_on) {
    const NumaNode& node = *topo.FindNode(node_id);
    const std::vector<CpuList> cores = AllowedCores(node, topo.allowed_pus());
    const size_t c = cores.size(), k = ranks.size();
    const bool shared = c < k;
    if (c == 0 || (shared && !o.allow_shared_cores)) {
      return Status::InvalidArgument(
          "NUMA node " + std::to_string(node_id) + " has " + std::to_string(c) + " allowed core" +
          (c == 1 ? "" : "s") + " (" + FormatCpuList(Intersect(node.pus, topo.allowed_pus())) +
          ") for " + std::to_string(k) + " local ranks (" + FormatRankList(ranks) +
          "): give the job more cores (cgroup/taskset), fewer ranks, or `allow_shared_cores`");
    }
    size_t next = 0;
    for (size_t j = 0; j < k; ++j) {
      RankPlan& rp = plan->ranks[ranks[j]];
      std::vector<CpuList> slice;
      if (!shared) {
        const size_t size = c / k + (j < c % k ? 1 : 0);
        slice.assign(cores.begin() + next, cores.begin() + next + size);
        next += size;
      } else {
        slice.push_back(cores[j * c / k]);
        rp.shares_cores = true;
      }
      if (k > 1) {
        rp.reason += "; ranks " + FormatRankList(ranks) + " share node " + std::to_string(node_id) +
                     ": " + std::to_string(slice.size()) + " of its " + std::to_string(c) +
                     " allowed cores";
      } else {
        rp.reason +=
            "; all " + std::to_string(c) + " allowed cores of node " + std::to_string(node_id);
      }
      if (shared) {
        rp.reason += " (only " + std::to_string(c) + " cores for " + std::to_string(k) +
                     " ranks: cores shared, `allow_shared_cores`)";
      }
      SplitSlice(slice, o.trainer_cores, &rp);
    }
  }
  return Status::Ok();
}

}  // namespace

Result<BindingPlan> Plan(const Topology& topo, const PlanOptions& o) {
  NL_RETURN_IF_ERROR(CheckOptions(o));
  BindingPlan plan;
  plan.ranks.resize(o.nproc);
  NL_RETURN_IF_ERROR(AssignGpus(o, &plan));
  if (o.no_bind) {
    plan.binds = false;
    for (RankPlan& rp : plan.ranks) rp.reason = "binding disabled (`no_bind`)";
    return plan;
  }
  NL_RETURN_IF_ERROR(AssignNodes(topo, o, &plan));
  NL_RETURN_IF_ERROR(o.cpu_affinity.empty() ? SliceNodeCores(topo, o, &plan)
                                            : CoresFromAffinity(topo, o, &plan));
  return plan;
}

std::string PlanLine(int rank, const RankPlan& r) {
  std::string s =
      "[Affinity][Rank " + std::to_string(rank) + "] local_rank=" + std::to_string(r.local_rank);
  s += r.gpu >= 0 ? " gpu=" + std::to_string(r.gpu) + " (" + r.pci_bus_id + ")"
                  : std::string(" gpu=none");
  s += " numa_node=" + (r.numa_node >= 0 ? std::to_string(r.numa_node) : std::string("none"));
  s += " trainer_cpus=" +
       (r.trainer_cpus.empty() ? std::string("any") : FormatCpuList(r.trainer_cpus));
  s +=
      " loader_cpus=" + (r.loader_cpus.empty() ? std::string("any") : FormatCpuList(r.loader_cpus));
  s += " mem_node=" + (r.mem_node >= 0 ? std::to_string(r.mem_node) : std::string("any"));
  return s;
}

Result<std::vector<CpuList>> ParseCpuAffinity(const std::string& text) {
  std::vector<CpuList> out;
  for (std::string_view part : SplitText(text, ';')) {
    Result<CpuList> l = ParseCpuList(std::string(part));
    if (!l.ok()) return l.status().WithContext("`cpu_affinity` rank " + std::to_string(out.size()));
    out.push_back(std::move(*l));
  }
  return out;
}

}  // namespace nl
