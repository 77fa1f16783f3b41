// Binding on the live machine: whatever it has, bind a thread to one of the
// allowed cores and check with the kernel.
#include "loader/plan/affinity.h"

#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>

#include <thread>

namespace nl {
namespace {

CpuList ThreadAffinity() {
  cpu_set_t m;
  CPU_ZERO(&m);
  EXPECT_EQ(sched_getaffinity(0, sizeof m, &m), 0);
  CpuList out;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &m)) out.push_back(c);
  return out;
}

TEST(Affinity, BindThreadToOneCoreShowsInSchedGetaffinity) {
  Result<Topology> t = Topology::Live();
  ASSERT_TRUE(t.ok());
  const int cpu = t->allowed_pus().back();
  BindReport r;
  CpuList seen;
  std::thread th([&] {
    r = BindThisThread(*t, {cpu}, t->numa_nodes()[0].os_index);
    seen = ThreadAffinity();
  });
  th.join();
  EXPECT_EQ(r.cpu, BindState::kApplied) << r.cpu_detail;
  EXPECT_EQ(seen, CpuList{cpu});
  // Memory binding is applied, or honestly reported when the kernel has no NUMA support.
  EXPECT_TRUE(r.mem == BindState::kApplied || r.mem == BindState::kNotSupported) << r.mem_detail;
  if (r.mem != BindState::kApplied) {
    EXPECT_FALSE(r.mem_detail.empty());
  }

  RankPlan plan;
  plan.local_rank = 0;
  plan.numa_node = 0;
  plan.mem_node = 0;
  plan.trainer_cpus = {cpu};
  plan.loader_cpus = {cpu};
  const std::string line = AffinityLine(0, plan, r);
  EXPECT_NE(line.find("cpu_binding=applied"), std::string::npos) << line;
  EXPECT_EQ(line.rfind("[Affinity][Rank 0] local_rank=0 gpu=none numa_node=0", 0), 0u) << line;
}

TEST(Affinity, BadCpuIsAFailureNotSilence) {
  Result<Topology> t = Topology::Live();
  ASSERT_TRUE(t.ok());
  BindReport r;
  std::thread th([&] { r = BindThisThread(*t, {4000}, -1); });
  th.join();
  EXPECT_EQ(r.cpu, BindState::kFailed);
  EXPECT_NE(r.cpu_detail.find("cpus 4000"), std::string::npos) << r.cpu_detail;
  EXPECT_EQ(r.mem, BindState::kNotRequested);
}

TEST(Affinity, FileTopologyCannotBind) {
  Result<Topology> t = Topology::FromXmlFile(std::string(NL_TOPOLOGY_DIR) + "/incident.xml");
  ASSERT_TRUE(t.ok());
  BindReport r = BindThisThread(*t, {0}, 0);
  EXPECT_EQ(r.cpu, BindState::kNotSupported);
  EXPECT_EQ(r.cpu_detail, "topology is not this machine");
}

TEST(Affinity, LoaderThreadHookNamesAndBindsTheWorker) {
  Result<Topology> t = Topology::Live();
  ASSERT_TRUE(t.ok());
  RankPlan plan;
  plan.loader_cpus = {t->allowed_pus().front()};
  plan.mem_node = -1;
  BindReport got;
  int got_worker = -1;
  auto hook = LoaderThreadStartHook(*t, plan, 3, [&](int w, const BindReport& r) {
    got_worker = w;
    got = r;
  });
  char name[32] = {};
  CpuList seen;
  std::thread th([&] {
    hook(5);
    pthread_getname_np(pthread_self(), name, sizeof name);
    seen = ThreadAffinity();
  });
  th.join();
  EXPECT_STREQ(name, "ldr-r3-w05");
  EXPECT_EQ(got_worker, 5);
  EXPECT_EQ(got.cpu, BindState::kApplied);
  EXPECT_EQ(seen, plan.loader_cpus);
}

}  // namespace
}  // namespace nl
