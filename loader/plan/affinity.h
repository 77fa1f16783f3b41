// Applying a rank's plan: binds the calling thread to
// cpus and its memory to a NUMA node with hwloc, and says what happened.
// A failure is reported, never silent.
//
//   BindReport r = BindThisThread(topo, plan.loader_cpus, plan.mem_node);
//   std::cerr << AffinityLine(rank, plan, r) << "\n";
#pragma once

#include <functional>
#include <string>

#include "loader/plan/binding.h"
#include "loader/plan/topology.h"

namespace nl {

enum class BindState { kApplied, kNotSupported, kFailed, kNotRequested };
std::string_view BindStateName(
    BindState s);  // "applied", "not_supported", "failed", "not_requested"

struct BindReport {
  BindState cpu = BindState::kNotRequested;
  BindState mem = BindState::kNotRequested;
  std::string cpu_detail, mem_detail;  // why, when not applied
};

// Empty cpus / mem_node < 0: that part is not requested. Only a topology of
// this machine (Topology::Live) can bind; others report not_supported.
BindReport BindThisThread(const Topology& topo, const CpuList& cpus, int mem_node);

// PlanLine plus " cpu_binding=applied mem_binding=applied" (and the reasons
// for anything not applied).
std::string AffinityLine(int rank, const RankPlan& plan, const BindReport& report);

// Sets the calling thread's name (at most 15 characters are kept).
void SetThreadName(const std::string& name);
// "ldr-r3-w05".
std::string LoaderThreadName(int rank, int worker);

// A start hook for the loader's worker threads: the worker binds itself to
// the rank's loader cpus and memory node, takes its name, and hands its
// report to `on_bound` (called on the worker thread). `topo` is held by
// reference: it must outlive every thread that runs the hook.
std::function<void(int worker)> LoaderThreadStartHook(
    const Topology& topo, RankPlan plan, int rank,
    std::function<void(int worker, const BindReport&)> on_bound);

}  // namespace nl
