#include "loader/plan/topology.h"

#include <sched.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

namespace nl {

CpuList ToCpuList(hwloc_const_bitmap_t set) {
  CpuList out;
  if (hwloc_bitmap_iszero(set) || hwloc_bitmap_weight(set) < 0) return out;
  for (int i = hwloc_bitmap_first(set); i >= 0; i = hwloc_bitmap_next(set, i)) out.push_back(i);
  return out;
}

HwlocBitmap ToBitmap(const CpuList& cpus) {
  HwlocBitmap b(hwloc_bitmap_alloc());
  for (int c : cpus) hwloc_bitmap_set(b.get(), static_cast<unsigned>(c));
  return b;
}

namespace {

HwlocTopology NewTopology() {
  hwloc_topology_t t = nullptr;
  if (hwloc_topology_init(&t) != 0) return nullptr;
  HwlocTopology topo(t);
  // GPUs are PCI devices: ask for I/O discovery (bridges and important devices).
  hwloc_topology_set_io_types_filter(t, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  // Keep disallowed PUs so the map shows the whole machine; the allowed set
  // is tracked separately.
  hwloc_topology_set_flags(t, HWLOC_TOPOLOGY_FLAG_INCLUDE_DISALLOWED);
  return topo;
}

std::string BusId(const hwloc_obj_t pci) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%04x:%02x:%02x.%01x", pci->attr->pcidev.domain,
                pci->attr->pcidev.bus, pci->attr->pcidev.dev, pci->attr->pcidev.func);
  return buf;
}

}  // namespace

Result<Topology> Topology::Live() {
  HwlocTopology t = NewTopology();
  if (!t) return Status::Internal("hwloc_topology_init failed");
  if (hwloc_topology_load(t.get()) != 0) {
    return Status::FromErrno("hwloc could not load this machine's topology", errno);
  }
  return Load(std::move(t), "this machine", true);
}

Result<Topology> Topology::FromXmlFile(const std::string& path) {
  // hwloc reads whatever it is given to the end: /dev/zero or a FIFO would
  // never return. A topology is a regular file, and even a large machine's
  // is a few MiB.
  constexpr off_t kMaxTopologyFileBytes = off_t{64} << 20;
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    return Status::FromErrno("cannot read topology file " + path, errno);
  }
  if (!S_ISREG(st.st_mode)) {
    return Status::InvalidArgument("topology file " + path + " is not a regular file");
  }
  if (st.st_size > kMaxTopologyFileBytes) {
    return Status::InvalidArgument("topology file " + path + " is " + std::to_string(st.st_size) +
                                   " bytes: not an hwloc XML topology (those are a few MiB)");
  }
  HwlocTopology t = NewTopology();
  if (!t) return Status::Internal("hwloc_topology_init failed");
  if (hwloc_topology_set_xml(t.get(), path.c_str()) != 0) {
    return Status::FromErrno("cannot read topology file " + path, errno);
  }
  if (hwloc_topology_load(t.get()) != 0) {
    return Status::InvalidArgument("topology file " + path + " is not a valid hwloc XML topology");
  }
  return Load(std::move(t), path, false);
}

Result<Topology> Topology::Load(HwlocTopology topo, std::string source, bool live) {
  Topology t;
  hwloc_topology_t h = topo.get();
  t.source_ = std::move(source);
  t.this_system_ = live && hwloc_topology_is_thissystem(h);

  t.allowed_ = ToCpuList(hwloc_topology_get_allowed_cpuset(h));
  if (live) {
    // hwloc's allowed set reflects the cgroup; the process mask reflects taskset.
    cpu_set_t mask;
    CPU_ZERO(&mask);
    if (sched_getaffinity(0, sizeof mask, &mask) == 0) {
      CpuList mine;
      for (int c = 0; c < CPU_SETSIZE; ++c)
        if (CPU_ISSET(c, &mask)) mine.push_back(c);
      t.allowed_ = Intersect(t.allowed_, mine);
    }
  }

  const int nnodes = hwloc_get_nbobjs_by_type(h, HWLOC_OBJ_NUMANODE);
  for (int i = 0; i < nnodes; ++i) {
    hwloc_obj_t n = hwloc_get_obj_by_type(h, HWLOC_OBJ_NUMANODE, static_cast<unsigned>(i));
    NumaNode node;
    node.os_index = static_cast<int>(n->os_index);
    node.memory_bytes = n->attr ? n->attr->numanode.local_memory : 0;
    node.pus = ToCpuList(n->cpuset);
    for (hwloc_obj_t c =
             hwloc_get_next_obj_inside_cpuset_by_type(h, n->cpuset, HWLOC_OBJ_CORE, nullptr);
         c; c = hwloc_get_next_obj_inside_cpuset_by_type(h, n->cpuset, HWLOC_OBJ_CORE, c)) {
      node.cores.push_back({static_cast<int>(c->os_index), ToCpuList(c->cpuset)});
    }
    if (node.cores.empty()) {  // no Core level (rare): each PU is its own core
      for (int pu : node.pus) node.cores.push_back({pu, {pu}});
    }
    std::sort(node.cores.begin(), node.cores.end(),
              [](const Core& a, const Core& b) { return a.pus.front() < b.pus.front(); });
    t.nodes_.push_back(std::move(node));
  }
  std::sort(t.nodes_.begin(), t.nodes_.end(),
            [](const NumaNode& a, const NumaNode& b) { return a.os_index < b.os_index; });

  for (hwloc_obj_t p = hwloc_get_next_pcidev(h, nullptr); p; p = hwloc_get_next_pcidev(h, p)) {
    const auto& a = p->attr->pcidev;
    const bool display = a.class_id == 0x0300 || a.class_id == 0x0302;
    if (!display || a.vendor_id != 0x10de) continue;
    Gpu g;
    g.pci_bus_id = BusId(p);
    g.vendor_id = a.vendor_id;
    g.device_id = a.device_id;
    g.class_id = a.class_id;
    hwloc_obj_t anc = hwloc_get_non_io_ancestor_obj(h, p);
    if (anc && anc->nodeset) {
      // The nearest NUMA node: the first node whose cpus cover the ancestor's.
      for (const NumaNode& n : t.nodes_) {
        if (!n.pus.empty() && IsSubset(ToCpuList(anc->cpuset), n.pus)) {
          g.numa_node = n.os_index;
          break;
        }
      }
      if (g.numa_node < 0 && hwloc_bitmap_weight(anc->nodeset) == 1) {
        g.numa_node = hwloc_bitmap_first(anc->nodeset);
      }
    }
    t.gpus_.push_back(std::move(g));
  }
  std::sort(t.gpus_.begin(), t.gpus_.end(),
            [](const Gpu& a, const Gpu& b) { return a.pci_bus_id < b.pci_bus_id; });
  t.topo_ = std::move(topo);
  return t;
}

const NumaNode* Topology::FindNode(int os_index) const {
  for (const NumaNode& n : nodes_)
    if (n.os_index == os_index) return &n;
  return nullptr;
}

}  // namespace nl
