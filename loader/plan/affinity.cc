#include "loader/plan/affinity.h"

#include <pthread.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace nl {

std::string_view BindStateName(BindState s) {
  switch (s) {
    case BindState::kApplied:
      return "applied";
    case BindState::kNotSupported:
      return "not_supported";
    case BindState::kFailed:
      return "failed";
    case BindState::kNotRequested:
      return "not_requested";
  }
  return "unknown";
}

namespace {

BindReport Bind(const Topology& topo, const CpuList& cpus, int mem_node) {
  BindReport r;
  hwloc_topology_t h = topo.hwloc();
  const bool live = topo.is_this_system() && h;
  const hwloc_topology_support* sup = h ? hwloc_topology_get_support(h) : nullptr;
  if (!cpus.empty()) {
    const bool can = live && sup && sup->cpubind->set_thisthread_cpubind;
    if (!can) {
      r.cpu = BindState::kNotSupported;
      r.cpu_detail =
          live ? "hwloc cannot bind cpus on this system" : "topology is not this machine";
    } else {
      HwlocBitmap set = ToBitmap(cpus);
      const int flags = HWLOC_CPUBIND_THREAD | HWLOC_CPUBIND_STRICT;
      if (hwloc_set_cpubind(h, set.get(), flags) == 0) {
        r.cpu = BindState::kApplied;
      } else {
        r.cpu = errno == ENOSYS ? BindState::kNotSupported : BindState::kFailed;
        r.cpu_detail = "cpus " + FormatCpuList(cpus) + ": " + std::strerror(errno);
      }
    }
  }
  if (mem_node >= 0) {
    const bool can =
        live && sup && sup->membind->set_thisthread_membind && sup->membind->bind_membind;
    if (!can) {
      r.mem = BindState::kNotSupported;
      r.mem_detail =
          live ? "hwloc cannot bind memory on this system" : "topology is not this machine";
    } else {
      HwlocBitmap nodes(hwloc_bitmap_alloc());
      hwloc_bitmap_only(nodes.get(), static_cast<unsigned>(mem_node));
      const int flags = HWLOC_MEMBIND_THREAD | HWLOC_MEMBIND_BYNODESET;
      if (hwloc_set_membind(h, nodes.get(), HWLOC_MEMBIND_BIND, flags) == 0) {
        r.mem = BindState::kApplied;
      } else {
        r.mem = errno == ENOSYS ? BindState::kNotSupported : BindState::kFailed;
        r.mem_detail = "node " + std::to_string(mem_node) + ": " + std::strerror(errno);
      }
    }
  }
  return r;
}

}  // namespace

BindReport BindThisThread(const Topology& topo, const CpuList& cpus, int mem_node) {
  return Bind(topo, cpus, mem_node);
}

std::string AffinityLine(int rank, const RankPlan& plan, const BindReport& r) {
  std::string s = PlanLine(rank, plan);
  s += " cpu_binding=" + std::string(BindStateName(r.cpu));
  s += " mem_binding=" + std::string(BindStateName(r.mem));
  if (!r.cpu_detail.empty()) s += " cpu_reason=\"" + r.cpu_detail + "\"";
  if (!r.mem_detail.empty()) s += " mem_reason=\"" + r.mem_detail + "\"";
  return s;
}

void SetThreadName(const std::string& name) {
  pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
}

std::string LoaderThreadName(int rank, int worker) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "ldr-r%d-w%02d", rank, worker);
  return buf;
}

std::function<void(int)> LoaderThreadStartHook(
    const Topology& topo, RankPlan plan, int rank,
    std::function<void(int, const BindReport&)> on_bound) {
  return [&topo, plan = std::move(plan), rank, on_bound = std::move(on_bound)](int worker) {
    SetThreadName(LoaderThreadName(rank, worker));
    BindReport r = BindThisThread(topo, plan.loader_cpus, plan.mem_node);
    if (on_bound) on_bound(worker, r);
  };
}

}  // namespace nl
