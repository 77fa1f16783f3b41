#include "loader/plan/topology.h"

#include <gtest/gtest.h>
#include <sched.h>

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
