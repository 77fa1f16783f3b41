// The binding plan on topologies of machines we do not have
// (tests/topologies/make_topologies.py makes them).
#include "loader/plan/binding.h"

#include <gtest/gtest.h>

#include <map>

#include "tests/support/test_topologies.h"

namespace nl {
namespace {

Topology Load(const std::string& name) { return testing::LoadTestTopology(name); }

PlanOptions Options(const Topology& t, int nproc, std::optional<std::string> cvd = std::nullopt) {
  PlanOptions o;
  o.nproc = nproc;
  o.visible_gpus = *ResolveVisibleGpus(t, {cvd, {}});
  return o;
}

// Cores of the topology as lists of allowed PUs, keyed by first PU.
std::map<int, CpuList> CoreOfPu(const Topology& t) {
  std::map<int, CpuList> m;
  for (const NumaNode& n : t.numa_nodes())
    for (const Core& c : n.cores)
      for (int pu : c.pus) m[pu] = Intersect(c.pus, t.allowed_pus());
  return m;
}

// The invariants every plan must satisfy.
void CheckInvariants(const Topology& t, const PlanOptions& o, const BindingPlan& p) {
  ASSERT_EQ(static_cast<int>(p.ranks.size()), o.nproc);
  auto core_of = CoreOfPu(t);
  std::map<int, std::vector<size_t>> cores_per_node;  // node -> slice sizes in cores
  CpuList used;
  for (const RankPlan& r : p.ranks) {
    SCOPED_TRACE("rank " + std::to_string(r.local_rank) + ": " + PlanLine(r.local_rank, r));
    const NumaNode* node = t.FindNode(r.numa_node);
    ASSERT_NE(node, nullptr);
    if (r.gpu >= 0) {
      for (const auto& g : o.visible_gpus)
        if (g.index == r.gpu) {
          EXPECT_EQ(r.numa_node, g.gpu.numa_node) << "rank not on its GPU's node";
        }
    }
    EXPECT_EQ(r.mem_node, r.numa_node);
    const CpuList all = Union(r.trainer_cpus, r.loader_cpus);
    EXPECT_FALSE(r.loader_cpus.empty());
    EXPECT_EQ(r.trainer_cpus.size(), 1u);
    EXPECT_TRUE(IsSubset(all, node->pus)) << "cpus outside the node";
    EXPECT_TRUE(IsSubset(all, t.allowed_pus())) << "cpus outside the allowed set";
    // Loader cpus are whole (allowed) cores.
    size_t loader_cores = 0;
    for (int pu : r.loader_cpus) {
      EXPECT_TRUE(IsSubset(core_of[pu], r.loader_cpus)) << "core of cpu " << pu << " split";
      if (core_of[pu].front() == pu) ++loader_cores;
    }
    if (!r.shares_cores) {
      EXPECT_TRUE(Disjoint(all, used)) << "slices overlap";
      // The trainer's core is its own: its siblings are not given to the loader.
      EXPECT_TRUE(Disjoint(core_of[r.trainer_cpus[0]], r.loader_cpus));
    }
    used = Union(used, all);
    cores_per_node[r.numa_node].push_back(loader_cores + 1);
  }
  for (const auto& [node, sizes] : cores_per_node) {
    auto [mn, mx] = std::minmax_element(sizes.begin(), sizes.end());
    EXPECT_LE(*mx - *mn, 1u) << "unbalanced slices on node " << node;
  }
}

TEST(Plan, IncidentServerFourRanks) {
  Topology t = Load("incident.xml");
  PlanOptions o = Options(t, 4);
  Result<BindingPlan> p = Plan(t, o);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  CheckInvariants(t, o, *p);
  const auto& r = p->ranks;
  EXPECT_EQ(r[0].numa_node, 0);
  EXPECT_EQ(r[1].numa_node, 0);
  EXPECT_EQ(r[2].numa_node, 1);
  EXPECT_EQ(r[3].numa_node, 1);
  EXPECT_EQ(PlanLine(3, r[3]),
            "[Affinity][Rank 3] local_rank=3 gpu=3 (0000:82:00.0) numa_node=1 trainer_cpus=33 "
            "loader_cpus=34-43,78-87 mem_node=1");
  EXPECT_EQ(FormatCpuList(r[0].trainer_cpus), "0");
  EXPECT_EQ(FormatCpuList(r[0].loader_cpus), "1-10,45-54");
  EXPECT_EQ(FormatCpuList(r[1].loader_cpus),
            "12-21,56-65");  // 11 cores each: trainer 11, loader 12-21
  EXPECT_NE(r[3].reason.find("GPU 3 (0000:82:00.0) is on NUMA node 1"), std::string::npos)
      << r[3].reason;
}

TEST(Plan, IncidentGpuSubsets) {
  Topology t = Load("incident.xml");
  struct Case {
    const char* cvd;
    std::vector<std::string> pci;
    std::vector<int> nodes;
  };
  for (const Case& c : {Case{"0,2,3", {"0000:02:00.0", "0000:81:00.0", "0000:82:00.0"}, {0, 1, 1}},
                        Case{"1,3", {"0000:03:00.0", "0000:82:00.0"}, {0, 1}},
                        Case{"3,2,1,0",
                             {"0000:82:00.0", "0000:81:00.0", "0000:03:00.0", "0000:02:00.0"},
                             {1, 1, 0, 0}}}) {
    SCOPED_TRACE(c.cvd);
    PlanOptions o = Options(t, static_cast<int>(c.pci.size()), c.cvd);
    Result<BindingPlan> p = Plan(t, o);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    CheckInvariants(t, o, *p);
    for (size_t i = 0; i < c.pci.size(); ++i) {
      EXPECT_EQ(p->ranks[i].gpu, static_cast<int>(i));
      EXPECT_EQ(p->ranks[i].pci_bus_id, c.pci[i]);
      EXPECT_EQ(p->ranks[i].numa_node, c.nodes[i]);
    }
  }
  // 1,3: one rank per node, so each gets its node's 22 cores.
  PlanOptions o = Options(t, 2, "1,3");
  Result<BindingPlan> p = Plan(t, o);
  EXPECT_EQ(FormatCpuList(p->ranks[1].loader_cpus), "23-43,67-87");
}

TEST(Plan, OneNodeEightGpus) {
  Topology t = Load("one_node_8gpu.xml");
  PlanOptions o = Options(t, 8);
  Result<BindingPlan> p = Plan(t, o);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  CheckInvariants(t, o, *p);
  for (const RankPlan& r : p->ranks)
    EXPECT_EQ(r.loader_cpus.size(), 2u);  // 16 cores / 8 = 2: 1 trainer + 1 loader core
  // Five ranks: 16 = 4+3+3+3+3, extra core to the lowest rank.
  o = Options(t, 5);
  p = Plan(t, o);
  ASSERT_TRUE(p.ok());
  CheckInvariants(t, o, *p);
  EXPECT_EQ(p->ranks[0].loader_cpus.size(), 6u);
  EXPECT_EQ(p->ranks[4].loader_cpus.size(), 4u);
}

TEST(Plan, Nps4BusIdsNotInNodeOrder) {
  Topology t = Load("nps4_8gpu.xml");
  PlanOptions o = Options(t, 8);
  Result<BindingPlan> p = Plan(t, o);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  CheckInvariants(t, o, *p);
  const int want[] = {5, 7, 4, 6, 1, 3, 0, 2};  // GPU i (ascending bus id) -> its node
  for (int i = 0; i < 8; ++i) EXPECT_EQ(p->ranks[i].numa_node, want[i]) << i;
}

TEST(Plan, NoGpuRoundRobin) {
  Topology t = Load("no_gpu.xml");
  PlanOptions o = Options(t, 4);
  EXPECT_TRUE(o.visible_gpus.empty());
  Result<BindingPlan> p = Plan(t, o);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  CheckInvariants(t, o, *p);
  EXPECT_EQ(p->ranks[0].numa_node, 0);
  EXPECT_EQ(p->ranks[1].numa_node, 1);
  EXPECT_EQ(p->ranks[2].numa_node, 0);
  EXPECT_EQ(p->ranks[3].numa_node, 1);
  EXPECT_EQ(p->ranks[0].gpu, -1);
  EXPECT_NE(PlanLine(0, p->ranks[0]).find("gpu=none"), std::string::npos);
  EXPECT_NE(p->ranks[1].reason.find("no GPU: round-robin over 2 NUMA nodes"), std::string::npos);
}

TEST(Plan, CgroupLimitsStayInside) {
  Topology t = Load("incident_cgroup.xml");
  // Two ranks (GPUs 0 and 1, both on node 0): six allowed cores shared 3/3.
  PlanOptions o = Options(t, 2);
  Result<BindingPlan> p = Plan(t, o);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  CheckInvariants(t, o, *p);
  EXPECT_EQ(FormatCpuList(p->ranks[0].loader_cpus), "1-2,45-46");
  EXPECT_EQ(FormatCpuList(p->ranks[1].loader_cpus), "4-5,48-49");
  // Four ranks: node 1 has one allowed core for ranks 2 and 3.
  o = Options(t, 4);
  Status s = Plan(t, o).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(
      s.message(),
      "NUMA node 1 has 1 allowed core (22,66) for 2 local ranks (2,3): give the job more cores "
      "(cgroup/taskset), fewer ranks, or `allow_shared_cores`");
  o.allow_shared_cores = true;
  p = Plan(t, o);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  CheckInvariants(t, o, *p);
  EXPECT_TRUE(p->ranks[2].shares_cores);
  EXPECT_EQ(p->ranks[2].loader_cpus, p->ranks[3].loader_cpus);
  EXPECT_NE(p->ranks[3].reason.find("cores shared"), std::string::npos);
}

TEST(Plan, MoreRanksThanGpus) {
  Topology t = Load("incident.xml");
  Status s = Plan(t, Options(t, 5)).status();
  EXPECT_EQ(s.message(), "5 local ranks but only 4 visible GPUs");
  s = Plan(t, Options(t, 3, "1,3")).status();
  EXPECT_EQ(s.message(), "3 local ranks but only 2 visible GPUs");
}

TEST(Plan, Overrides) {
  Topology t = Load("incident.xml");
  PlanOptions o = Options(t, 2);
  o.cpu_affinity = *ParseCpuAffinity("0-9,44-53;10-21,54-65");
  Result<BindingPlan> p = Plan(t, o);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(FormatCpuList(p->ranks[0].trainer_cpus), "0");
  EXPECT_EQ(FormatCpuList(p->ranks[0].loader_cpus), "1-9,45-53");
  EXPECT_EQ(FormatCpuList(p->ranks[1].loader_cpus), "11-21,55-65");
  o.cpu_affinity = *ParseCpuAffinity("0-3;200-201");
  EXPECT_NE(Plan(t, o).status().message().find("uses cpus 200-201 that this process may not use"),
            std::string::npos);
  o.cpu_affinity = *ParseCpuAffinity("0-3");
  EXPECT_EQ(Plan(t, o).status().message(), "`cpu_affinity` lists 1 cpu sets for 2 local ranks");

  o = Options(t, 2);
  o.numa_node = {1, 1};
  p = Plan(t, o);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->ranks[0].numa_node, 1);
  EXPECT_EQ(FormatCpuList(p->ranks[1].loader_cpus), "34-43,78-87");
  o.numa_node = {3};
  EXPECT_NE(Plan(t, o).status().message().find("no such NUMA node"), std::string::npos);

  o = Options(t, 2);
  o.rank_gpu = {3, 0};
  p = Plan(t, o);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->ranks[0].pci_bus_id, "0000:82:00.0");
  EXPECT_EQ(p->ranks[0].numa_node, 1);

  o = Options(t, 4);
  o.no_bind = true;
  p = Plan(t, o);
  ASSERT_TRUE(p.ok());
  EXPECT_FALSE(p->binds);
  EXPECT_TRUE(p->ranks[2].loader_cpus.empty());
  EXPECT_EQ(p->ranks[2].numa_node, -1);
  EXPECT_EQ(p->ranks[2].pci_bus_id, "0000:81:00.0");
}

}  // namespace
}  // namespace nl
