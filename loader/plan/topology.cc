#include "loader/plan/topology.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "base/child_process.h"
#include "base/fd.h"

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

HwlocTopology NewTopology(bool with_io = true, unsigned long flags = 0) {
  hwloc_topology_t t = nullptr;
  if (hwloc_topology_init(&t) != 0) return nullptr;
  HwlocTopology topo(t);
  // GPUs are PCI devices: ask for I/O discovery (bridges and important devices).
  hwloc_topology_set_io_types_filter(
      t, with_io ? HWLOC_TYPE_FILTER_KEEP_IMPORTANT : HWLOC_TYPE_FILTER_KEEP_NONE);
  // Keep disallowed PUs so the map shows the whole machine; the allowed set
  // is tracked separately.
  hwloc_topology_set_flags(t, HWLOC_TOPOLOGY_FLAG_INCLUDE_DISALLOWED | flags);
  return topo;
}

// Writes all of [p, p + n) to fd (in the discovery child: no allocation).
bool WriteAll(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// The discovery child's work (base's spawner runs it in a child that runs
// no program, its stderr on the error pipe): loads the topology hwloc was
// set up with (plugins loaded before the fork) and writes it to out_fd as
// XML; 0 when done.
int DiscoveryChild(hwloc_topology_t t, int out_fd, int attempt, const LiveDiscovery& how) {
  if (how.in_child) how.in_child(attempt);
  if (hwloc_topology_load(t) != 0) {
    dprintf(2, "hwloc_topology_load failed: %s\n", strerror(errno));
    return 2;
  }
  char* xml = nullptr;
  int len = 0;
  if (hwloc_topology_export_xmlbuffer(t, &xml, &len, 0) != 0 || len <= 0) {
    dprintf(2, "hwloc_topology_export_xmlbuffer failed: %s\n", strerror(errno));
    return 3;
  }
  return WriteAll(out_fd, xml, static_cast<size_t>(len)) ? 0 : 4;
}

// Reads the child's XML (out) and messages (err) until both close or the
// deadline passes; false on the deadline.
bool ReadUntilClosed(int out, int err, double timeout_s, std::string* xml, std::string* msg) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
  pollfd fds[2] = {{out, POLLIN, 0}, {err, POLLIN, 0}};
  std::string* into[2] = {xml, msg};
  int open = 2;
  char buf[65536];
  while (open > 0) {
    const double left = std::chrono::duration<double>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    const int r = poll(fds, 2, static_cast<int>(left * 1000) + 1);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return false;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      const ssize_t n = read(fds[i].fd, buf, sizeof buf);
      if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (n > 0 && into[i]->size() < (size_t{256} << 20)) {
        into[i]->append(buf, static_cast<size_t>(n));
      } else if (n <= 0) {
        fds[i].fd = -1;
        --open;
      }
    }
  }
  return true;
}

// How the discovery child ended, with the end of what it printed.
std::string DescribeChildEnd(int status, bool timed_out, double timeout_s, std::string msg) {
  std::string what;
  if (timed_out) {
    char secs[32];
    std::snprintf(secs, sizeof secs, "%g", timeout_s);
    what = std::string("did not finish in ") + secs + " s (killed)";
  } else if (WIFSIGNALED(status)) {
    const char* name = strsignal(WTERMSIG(status));
    what = "died of signal " + std::to_string(WTERMSIG(status)) + " (" + (name ? name : "?") + ")";
  } else {
    what = "exited with status " + std::to_string(WEXITSTATUS(status));
  }
  while (!msg.empty() && (msg.back() == '\n' || msg.back() == '\r')) msg.pop_back();
  if (msg.size() > 600) msg = "..." + msg.substr(msg.size() - 600);
  for (char& c : msg)
    if (c == '\n') c = ' ';
  return what + (msg.empty() ? "" : ", printing: " + msg);
}

// One attempt at discovering this machine: hwloc runs in a child process and
// hands the topology back as XML.
Result<std::string> DiscoverInChild(bool with_io, int attempt, const LiveDiscovery& how) {
  HwlocTopology t = NewTopology(with_io);
  if (!t) return Status::Internal("hwloc_topology_init failed");
  // Only what the map needs: Linux's sysfs for cores and NUMA nodes, PCI for
  // GPUs. Not the x86 CPUID backend (it binds to each core in turn and only
  // adds caches), nor the OpenCL and OpenGL device plugins.
  for (const char* c : {"x86", "opencl", "gl"})
    hwloc_topology_set_components(t.get(), HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST, c);
  int out[2], err[2];
  if (pipe2(out, O_CLOEXEC) != 0) return Status::FromErrno("cannot make a pipe", errno);
  Fd out_r(out[0]), out_w(out[1]);
  if (pipe2(err, O_CLOEXEC) != 0) return Status::FromErrno("cannot make a pipe", errno);
  Fd err_r(err[0]), err_w(err[1]);
  const int out_fd = out_w.get();
  const std::function<int()> body = [&] { return DiscoveryChild(t.get(), out_fd, attempt, how); };
  Result<proc::ChildProcess> child = proc::ChildProcess::Fork("hwloc's discovery of this machine", body, -1,
                                                              err_w.get());
  if (!child.ok()) return child.status();
  out_w.Reset();
  err_w.Reset();
  std::string xml, msg;
  const bool done = ReadUntilClosed(out_r.get(), err_r.get(), how.timeout_s, &xml, &msg);
  if (!done) child->Kill();
  NL_ASSIGN_OR_RETURN(const proc::ChildExit e, child->WaitFor(-1, "hwloc's discovery of this machine"));
  const int status = e.status;
  if (done && e.Succeeded() && !xml.empty()) return xml;
  return Status::Unavailable("hwloc's discovery of this machine" +
                             std::string(with_io ? "" : " without PCI devices") + " " +
                             DescribeChildEnd(status, !done, how.timeout_s, msg));
}

// This machine's topology from the XML a discovery child wrote: the binding
// calls act on this machine (IS_THISSYSTEM).
Result<HwlocTopology> LoadLiveXml(const std::string& xml, bool with_io) {
  HwlocTopology t = NewTopology(with_io, HWLOC_TOPOLOGY_FLAG_IS_THISSYSTEM);
  if (!t) return Status::Internal("hwloc_topology_init failed");
  if (hwloc_topology_set_xmlbuffer(t.get(), xml.data(), static_cast<int>(xml.size())) != 0 ||
      hwloc_topology_load(t.get()) != 0) {
    return Status::Internal("hwloc could not read back the topology its discovery wrote (" +
                            std::to_string(xml.size()) + " bytes of XML)");
  }
  return t;
}

std::string BusId(const hwloc_obj_t pci) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%04x:%02x:%02x.%01x", pci->attr->pcidev.domain,
                pci->attr->pcidev.bus, pci->attr->pcidev.dev, pci->attr->pcidev.func);
  return buf;
}

}  // namespace

Result<Topology> Topology::Live(const LiveDiscovery& how) {
  bool with_io = true;
  std::string note;
  Result<std::string> xml = DiscoverInChild(true, 0, how);
  if (!xml.ok()) {
    const std::string first = xml.status().message();
    with_io = false;
    xml = DiscoverInChild(false, 1, how);
    if (!xml.ok()) {
      return Status::Unavailable("cannot read this machine's topology: " + first + "; " +
                                 xml.status().message() +
                                 " (give its map with `topology` FILE, written by `lstopo FILE.xml`)");
    }
    note = first + "; its map was read without PCI devices, so no GPU is placed on its NUMA "
                   "node by its PCI bus";
  }
  NL_ASSIGN_OR_RETURN(HwlocTopology t, LoadLiveXml(*xml, with_io));
  NL_ASSIGN_OR_RETURN(Topology topo, Load(std::move(t), "this machine", true));
  if (!note.empty()) topo.notes_.push_back(std::move(note));
  return topo;
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
