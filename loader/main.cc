// loader: the loader's command line. `loader topo` shows the machine's
// GPU/NUMA/CPU map and the binding plan (more subcommands come with the
// pipeline: serve, preview).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <nlohmann/json.hpp>

#include "loader/binding.h"
#include "loader/gpu_order.h"
#include "loader/topology.h"

namespace {

int Fail(const nl::Status& s) {
  std::fprintf(stderr, "loader: error: %s\n", s.ToString().c_str());
  return 1;
}

std::string Gib(uint64_t b) {
  if (b == 0) return "?";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GiB", static_cast<double>(b) / (1ull << 30));
  return buf;
}

struct TopoArgs {
  std::string topology_file;
  int nproc = 0;
  std::string gpus, cpu_affinity, numa_node;
  int trainer_cores = 1;
  bool allow_shared = false, no_bind = false, json = false;
};

void PrintMap(const nl::Topology& t, const std::vector<nl::VisibleGpu>& gpus,
              const std::string& gpu_note) {
  std::printf("machine: %s\n", t.source().c_str());
  std::printf("allowed cpus: %s\n", nl::FormatCpuList(t.allowed_pus()).c_str());
  std::printf("\nNUMA node  cores  cpus                          memory      GPUs\n");
  for (const nl::NumaNode& n : t.numa_nodes()) {
    std::string g;
    for (const auto& v : gpus)
      if (v.gpu.numa_node == n.os_index)
        g += (g.empty() ? "" : " ") + ("GPU" + std::to_string(v.index));
    std::printf("%-10d %-6zu %-29s %-11s %s\n", n.os_index, n.cores.size(),
                nl::FormatCpuList(n.pus).c_str(), Gib(n.memory_bytes).c_str(),
                g.empty() ? "-" : g.c_str());
  }
  std::printf("\nGPU   PCI bus id     NUMA node  CPU affinity\n");
  if (gpus.empty())
    std::printf("(none visible%s)\n", gpu_note.empty() ? "" : (": " + gpu_note).c_str());
  for (const auto& v : gpus) {
    const nl::NumaNode* n = t.FindNode(v.gpu.numa_node);
    std::printf("GPU%-3d%-15s%-11s%s\n", v.index, v.gpu.pci_bus_id.c_str(),
                v.gpu.numa_node >= 0 ? std::to_string(v.gpu.numa_node).c_str() : "?",
                n ? nl::FormatCpuList(n->pus).c_str() : "?");
  }
}

nlohmann::json ToJson(const nl::Topology& t, const std::vector<nl::VisibleGpu>& gpus,
                      const nl::BindingPlan& plan) {
  using nlohmann::json;
  json j;
  j["source"] = t.source();
  j["allowed_cpus"] = t.allowed_pus();
  j["numa_nodes"] = json::array();
  for (const nl::NumaNode& n : t.numa_nodes()) {
    json cores = json::array();
    for (const nl::Core& c : n.cores) cores.push_back(c.pus);
    j["numa_nodes"].push_back({{"os_index", n.os_index},
                               {"cpus", n.pus},
                               {"cores", cores},
                               {"memory_bytes", n.memory_bytes}});
  }
  j["gpus"] = json::array();
  for (const auto& v : gpus) {
    j["gpus"].push_back(
        {{"index", v.index}, {"pci", v.gpu.pci_bus_id}, {"numa_node", v.gpu.numa_node}});
  }
  j["binds"] = plan.binds;
  j["ranks"] = json::array();
  for (const nl::RankPlan& r : plan.ranks) {
    j["ranks"].push_back({{"local_rank", r.local_rank},
                          {"gpu", r.gpu},
                          {"pci", r.pci_bus_id},
                          {"numa_node", r.numa_node},
                          {"trainer_cpus", r.trainer_cpus},
                          {"loader_cpus", r.loader_cpus},
                          {"mem_node", r.mem_node},
                          {"shares_cores", r.shares_cores},
                          {"reason", r.reason}});
  }
  return j;
}

int Topo(const TopoArgs& a) {
  nl::Result<nl::Topology> topo =
      a.topology_file.empty() ? nl::Topology::Live() : nl::Topology::FromXmlFile(a.topology_file);
  if (!topo.ok()) return Fail(topo.status());
  nl::GpuOrderInputs in;
  if (const char* cvd = std::getenv("CUDA_VISIBLE_DEVICES")) in.cuda_visible_devices = cvd;
  std::string gpu_note;
  if (a.topology_file.empty()) in.cuda_bus_ids = nl::QueryCudaBusIds(&gpu_note);
  nl::Result<std::vector<nl::VisibleGpu>> gpus = nl::ResolveVisibleGpus(*topo, in);
  if (!gpus.ok()) return Fail(gpus.status());

  nl::PlanOptions o;
  o.nproc = a.nproc > 0 ? a.nproc : std::max<int>(1, static_cast<int>(gpus->size()));
  o.visible_gpus = *gpus;
  o.trainer_cores = a.trainer_cores;
  o.allow_shared_cores = a.allow_shared;
  o.no_bind = a.no_bind;
  if (!a.gpus.empty()) {
    auto l = nl::ParseIntList(a.gpus, "--gpus");
    if (!l.ok()) return Fail(l.status());
    o.rank_gpu = *l;
  }
  if (!a.numa_node.empty()) {
    auto l = nl::ParseIntList(a.numa_node, "--numa-node");
    if (!l.ok()) return Fail(l.status());
    o.numa_node = *l;
  }
  if (!a.cpu_affinity.empty()) {
    auto l = nl::ParseCpuAffinity(a.cpu_affinity);
    if (!l.ok()) return Fail(l.status());
    o.cpu_affinity = *l;
  }
  nl::Result<nl::BindingPlan> plan = nl::Plan(*topo, o);
  if (!plan.ok()) return Fail(plan.status());
  if (a.json) {
    std::cout << ToJson(*topo, *gpus, *plan).dump() << "\n";
    return 0;
  }
  PrintMap(*topo, *gpus, gpu_note);
  std::printf("\nbinding plan for %d local rank%s:\n", o.nproc, o.nproc == 1 ? "" : "s");
  for (const nl::RankPlan& r : plan->ranks) {
    std::printf("%s\n    because: %s\n", nl::PlanLine(r.local_rank, r).c_str(), r.reason.c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"loader: NUMA-aware image loading"};
  app.require_subcommand(1);
  TopoArgs t;
  auto* topo = app.add_subcommand("topo", "Show the GPU/NUMA/CPU map and the binding plan");
  topo->add_option("--topology", t.topology_file, "An hwloc XML file instead of this machine");
  topo->add_option("--nproc-per-node", t.nproc,
                   "Local ranks (default: one per visible GPU, at least 1)");
  topo->add_option("--gpus", t.gpus,
                   "GPU index of each local rank, e.g. 0,2 (default: rank i uses GPU i)");
  topo->add_option("--trainer-cores", t.trainer_cores, "Cores reserved for each trainer rank")
      ->capture_default_str();
  topo->add_option("--cpu-affinity", t.cpu_affinity,
                   "One cpu list per local rank: \"0-9,44-53;10-21,54-65\"");
  topo->add_option("--numa-node", t.numa_node,
                   "NUMA node of each local rank (or one for all), e.g. 0,0,1,1");
  topo->add_flag("--allow-shared-cores", t.allow_shared,
                 "Let ranks share cores when a node has too few");
  topo->add_flag("--no-bind", t.no_bind, "A plan that binds nothing");
  topo->add_flag("--json", t.json, "Print the map and plan as one JSON object");
  CLI11_PARSE(app, argc, argv);
  if (topo->parsed()) return Topo(t);
  return 2;
}
