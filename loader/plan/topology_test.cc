#include "loader/plan/topology.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "tests/support/test_topologies.h"

namespace nl {
namespace {

Topology Load(const std::string& name) { return testing::LoadTestTopology(name); }

TEST(Topology, IncidentServerMap) {
  Topology t = Load("incident.xml");
  EXPECT_FALSE(t.is_this_system());
  ASSERT_EQ(t.numa_nodes().size(), 2u);
  const NumaNode& n1 = t.numa_nodes()[1];
  EXPECT_EQ(n1.os_index, 1);
  EXPECT_EQ(n1.cores.size(), 22u);
  EXPECT_EQ(FormatCpuList(n1.pus), "22-43,66-87");
  EXPECT_EQ(n1.cores[0].pus, (CpuList{22, 66}));  // SMT siblings of one core
  EXPECT_EQ(t.allowed_pus().size(), 88u);
  ASSERT_EQ(t.gpus().size(), 4u);
  EXPECT_EQ(t.gpus()[0].pci_bus_id, "0000:02:00.0");
  EXPECT_EQ(t.gpus()[0].numa_node, 0);
  EXPECT_EQ(t.gpus()[3].pci_bus_id, "0000:82:00.0");
  EXPECT_EQ(t.gpus()[3].numa_node, 1);
  EXPECT_EQ(t.gpus()[3].vendor_id, 0x10de);
}

TEST(Topology, Nps4GpusSortedByBusIdWithTheirNodes) {
  Topology t = Load("nps4_8gpu.xml");
  ASSERT_EQ(t.numa_nodes().size(), 8u);
  ASSERT_EQ(t.gpus().size(), 8u);
  // Bus 01 hangs off node 5, 21 off node 7, ... (see make_topologies.py).
  const int want_node[] = {5, 7, 4, 6, 1, 3, 0, 2};  // for 01,21,41,61,81,a1,c1,e1
  for (size_t i = 0; i < 8; ++i)
    EXPECT_EQ(t.gpus()[i].numa_node, want_node[i]) << t.gpus()[i].pci_bus_id;
}

TEST(Topology, CgroupAllowedSet) {
  Topology t = Load("incident_cgroup.xml");
  EXPECT_EQ(FormatCpuList(t.allowed_pus()), "0-5,22,44-49,66");
  EXPECT_EQ(t.numa_nodes()[0].cores.size(), 22u);  // the map still shows the whole machine
}

TEST(Topology, LiveMachine) {
  Result<Topology> t = Topology::Live();
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_TRUE(t->is_this_system());
  ASSERT_GE(t->numa_nodes().size(), 1u);
  cpu_set_t mask;
  ASSERT_EQ(sched_getaffinity(0, sizeof mask, &mask), 0);
  for (int c : t->allowed_pus()) EXPECT_TRUE(CPU_ISSET(c, &mask)) << c;
  EXPECT_EQ(static_cast<int>(t->allowed_pus().size()), CPU_COUNT(&mask));
}

// The discovery runs in a child: its crash or stall costs a retry without
// PCI devices, then a clear error, never this process.
void AbortWithPci(int attempt) {
  if (attempt == 0) {
    dprintf(2, "topology-x86.c:123: hwloc_x86_discover: Assertion `x' failed.\n");
    std::abort();
  }
}
void AbortAlways(int) { std::abort(); }
void Stall(int) { ::pause(); }

TEST(Topology, ADiscoveryThatAbortsWithPciDevicesIsTriedAgainWithoutThem) {
  LiveDiscovery how;
  how.in_child = AbortWithPci;
  Result<Topology> t = Topology::Live(how);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_TRUE(t->is_this_system());
  ASSERT_GE(t->numa_nodes().size(), 1u);
  EXPECT_FALSE(t->allowed_pus().empty());
  ASSERT_EQ(t->notes().size(), 1u);
  const std::string& n = t->notes()[0];
  EXPECT_NE(n.find("hwloc's discovery of this machine died of signal 6 (Aborted), printing: "
                   "topology-x86.c:123: hwloc_x86_discover: Assertion `x' failed."),
            std::string::npos)
      << n;
  EXPECT_NE(n.find("read without PCI devices, so no GPU is placed"), std::string::npos) << n;
  // The map is this machine's all the same: the kernel's view of the cores.
  Result<Topology> full = Topology::Live();
  ASSERT_TRUE(full.ok());
  EXPECT_TRUE(full->notes().empty());
  EXPECT_EQ(t->allowed_pus(), full->allowed_pus());
  EXPECT_EQ(t->numa_nodes().size(), full->numa_nodes().size());
}

TEST(Topology, ADiscoveryThatAlwaysAbortsIsAnErrorNamingBothEnds) {
  LiveDiscovery how;
  how.in_child = AbortAlways;
  Status s = Topology::Live(how).status();
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
  EXPECT_EQ(s.message(),
            "cannot read this machine's topology: hwloc's discovery of this machine died of "
            "signal 6 (Aborted); hwloc's discovery of this machine without PCI devices died of "
            "signal 6 (Aborted) (give its map with `topology` FILE, written by `lstopo FILE.xml`)");
}

TEST(Topology, ADiscoveryThatStallsIsKilledAtItsDeadline) {
  LiveDiscovery how;
  how.in_child = Stall;
  how.timeout_s = 0.3;
  Status s = Topology::Live(how).status();
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
  EXPECT_NE(s.message().find("hwloc's discovery of this machine did not finish in 0.3 s (killed)"),
            std::string::npos)
      << s.ToString();
}

TEST(Topology, BadFile) {
  Status s = Topology::FromXmlFile("/nonexistent/topo.xml").status();
  EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.ToString();
  EXPECT_NE(s.message().find("cannot read topology file /nonexistent/topo.xml"), std::string::npos)
      << s.ToString();
}

TEST(Topology, ADeviceOrDirectoryIsRefusedNotReadForEver) {
  // hwloc would read /dev/zero until memory ran out.
  for (const char* path : {"/dev/zero", "/tmp"}) {
    Status s = Topology::FromXmlFile(path).status();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
    EXPECT_EQ(s.message(), std::string("topology file ") + path + " is not a regular file");
  }
}

}  // namespace
}  // namespace nl
