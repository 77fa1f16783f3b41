// The machine's map: NUMA nodes with their cores and hardware threads, the
// cores this process may use, and the NVIDIA GPUs with their PCI bus ids and
// NUMA nodes. One type, two sources: the live machine (hwloc with PCI
// discovery) or an hwloc XML file, so policies run on machines we don't have.
//
//   NL_ASSIGN_OR_RETURN(Topology t, Topology::FromXmlFile("tests/topologies/incident.xml"));
//   for (const NumaNode& n : t.numa_nodes()) ...
#pragma once

#include <hwloc.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "loader/plan/cpu_list.h"

namespace nl {

struct Core {
  int os_index = -1;
  CpuList pus;  // all hardware threads of the core, allowed or not
};

struct NumaNode {
  int os_index = -1;
  uint64_t memory_bytes = 0;
  std::vector<Core> cores;  // ordered by their first hardware thread
  CpuList pus;              // all of the node's hardware threads
};

struct Gpu {
  std::string pci_bus_id;  // "0000:82:00.0", lower-case hex
  uint16_t vendor_id = 0, device_id = 0, class_id = 0;
  int numa_node = -1;  // of its nearest non-I/O ancestor; -1 if unknown
};

struct HwlocTopologyDeleter {
  void operator()(hwloc_topology* t) const { hwloc_topology_destroy(t); }
};
using HwlocTopology = std::unique_ptr<hwloc_topology, HwlocTopologyDeleter>;

// How Topology::Live discovers this machine.
struct LiveDiscovery {
  // A discovery that has not finished in this long is killed (and tried again
  // without PCI devices).
  double timeout_s = 60;
  // Tests only: called first in the discovery child, with the attempt (0:
  // with PCI devices, 1: without), to make a discovery crash or stall.
  void (*in_child)(int attempt) = nullptr;
};

class Topology {
 public:
  // This machine. Allowed cores: hwloc's allowed set (cgroup cpuset)
  // intersected with this process's current affinity (taskset).
  // hwloc discovers the machine in a child process and hands it back as XML:
  // its PCI discovery leaks, and an assertion in it (or a library it loads)
  // must cost a retry, not this process. When the
  // discovery with PCI devices fails, one without them is tried, and notes()
  // says so (no GPU is then placed on its NUMA node by hwloc); when both
  // fail, the error names how each ended and what hwloc printed.
  static Result<Topology> Live(const LiveDiscovery& how = {});
  // An hwloc XML file (`lstopo --of xml`). Allowed cores: the file's
  // allowed_cpuset.
  static Result<Topology> FromXmlFile(const std::string& path);

  const std::string& source() const { return source_; }  // "this machine" or the file
  // What a live discovery had to leave out, and why (empty when nothing).
  const std::vector<std::string>& notes() const { return notes_; }
  bool is_this_system() const { return this_system_; }
  const std::vector<NumaNode>& numa_nodes() const { return nodes_; }
  const NumaNode* FindNode(int os_index) const;
  const CpuList& allowed_pus() const { return allowed_; }
  // NVIDIA display / 3D controllers, in ascending PCI bus id order.
  const std::vector<Gpu>& gpus() const { return gpus_; }
  // The underlying hwloc topology (for binding; live topologies only).
  hwloc_topology_t hwloc() const { return topo_.get(); }

 private:
  static Result<Topology> Load(HwlocTopology topo, std::string source, bool live);
  HwlocTopology topo_;
  std::string source_;
  bool this_system_ = false;
  std::vector<NumaNode> nodes_;
  CpuList allowed_;
  std::vector<Gpu> gpus_;
  std::vector<std::string> notes_;
};

// Converts between hwloc bitmaps and CpuLists.
CpuList ToCpuList(hwloc_const_bitmap_t set);
struct HwlocBitmapDeleter {
  void operator()(hwloc_bitmap_s* b) const { hwloc_bitmap_free(b); }
};
using HwlocBitmap = std::unique_ptr<hwloc_bitmap_s, HwlocBitmapDeleter>;
HwlocBitmap ToBitmap(const CpuList& cpus);

}  // namespace nl
