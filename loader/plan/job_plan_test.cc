// The job plan: flags and environment in, a plan or a clear error out, and
// every fallback the user asked for written down.
#include "loader/plan/job_plan.h"

#include <gtest/gtest.h>

#include "tests/support/test_topologies.h"

namespace nl {
namespace {

JobPlanRequest Incident(int nproc) {
  JobPlanRequest rq;
  rq.topology_file = std::string(NL_TOPOLOGY_DIR) + "/incident.xml";
  rq.nproc = nproc;
  return rq;
}

bool HasNote(const JobPlan& j, const std::string& words) {
  for (const std::string& n : j.notes)
    if (n.find(words) != std::string::npos) return true;
  return false;
}

TEST(JobPlan, IncidentServerFourRanks) {
  Result<JobPlan> j = MakeJobPlan(Incident(4));
  ASSERT_TRUE(j.ok()) << j.status().ToString();
  ASSERT_EQ(j->plan.ranks.size(), 4u);
  EXPECT_EQ(j->gpus.size(), 4u);
  EXPECT_EQ(j->plan.ranks[2].numa_node, 1);
  EXPECT_EQ(FormatCpuList(j->plan.ranks[2].loader_cpus), "23-32,67-76");
  EXPECT_TRUE(j->notes.empty());
}

TEST(JobPlan, DefaultRanksAreOnePerVisibleGpu) {
  JobPlanRequest rq = Incident(0);
  rq.cuda_visible_devices = "2,3";
  Result<JobPlan> j = MakeJobPlan(rq);
  ASSERT_TRUE(j.ok()) << j.status().ToString();
  ASSERT_EQ(j->plan.ranks.size(), 2u);
  EXPECT_EQ(j->plan.ranks[0].pci_bus_id, "0000:81:00.0");
}

TEST(JobPlan, MoreRanksThanGpusIsAnErrorNotASilentFallback) {
  JobPlanRequest rq = Incident(4);
  rq.cuda_visible_devices = "0,1";
  Status s = MakeJobPlan(rq).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "4 local ranks but only 2 visible GPUs");

  rq.ignore_gpus = true;  // asked for: planned without GPUs, and said so
  Result<JobPlan> j = MakeJobPlan(rq);
  ASSERT_TRUE(j.ok()) << j.status().ToString();
  EXPECT_TRUE(j->gpus.empty());
  EXPECT_EQ(j->plan.ranks[0].gpu, -1);
  EXPECT_TRUE(HasNote(*j, "`ignore_gpus`: planning without the 2 visible GPU(s)"));
}

TEST(JobPlan, SharedCoresOnlyWhenAskedAndThenNoted) {
  JobPlanRequest rq = Incident(100);  // 88 allowed cpus
  rq.ignore_gpus = true;
  Status s = MakeJobPlan(rq).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  rq.allow_shared_cores = true;
  Result<JobPlan> j = MakeJobPlan(rq);
  ASSERT_TRUE(j.ok()) << j.status().ToString();
  EXPECT_TRUE(HasNote(*j, "`allow_shared_cores`: local rank"));
}

TEST(JobPlan, BadFlagTextNamesTheFlag) {
  JobPlanRequest rq = Incident(2);
  rq.gpus = "0,99999999999999999999";
  Status s = MakeJobPlan(rq).status();
  EXPECT_EQ(s.code(), StatusCode::kOutOfRange);
  EXPECT_NE(s.message().find("in `gpus` '0,99999999999999999999'"), std::string::npos)
      << s.message();
  rq.gpus.clear();
  rq.numa_node = "0,-1";
  s = MakeJobPlan(rq).status();
  EXPECT_NE(s.message().find("in `numa_node` '0,-1'"), std::string::npos) << s.message();
  rq.numa_node.clear();
  rq.cpu_affinity = "0-999999999;1";
  s = MakeJobPlan(rq).status();
  EXPECT_NE(s.message().find("cpu indices are 0..65535"), std::string::npos) << s.message();
}

TEST(JobPlan, AbsurdRankCountsAreRefused) {
  for (int n : {100000, 2147483647}) {
    JobPlanRequest rq = Incident(n);
    rq.ignore_gpus = true;
    rq.allow_shared_cores = true;
    Status s = MakeJobPlan(rq).status();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("local ranks must be 1..1024"), std::string::npos) << s.message();
  }
}

TEST(JobPlan, CudaVisibleDevicesSurprisesAreNoted) {
  JobPlanRequest rq = Incident(1);
  rq.cuda_visible_devices = "99999999999999999999999";
  Result<JobPlan> j = MakeJobPlan(rq);
  ASSERT_TRUE(j.ok()) << j.status().ToString();
  EXPECT_TRUE(j->gpus.empty());
  EXPECT_TRUE(HasNote(*j, "CUDA ignores it and every entry after it"));
}

int CountNotes(const JobPlan& j, const std::string& words) {
  int n = 0;
  for (const std::string& note : j.notes) n += note.find(words) != std::string::npos;
  return n;
}

TEST(JobPlan, SetButEmptyCudaVisibleDevicesIsNoted) {
  JobPlanRequest rq = Incident(1);
  rq.cuda_visible_devices = "";
  Result<JobPlan> j = MakeJobPlan(rq);
  ASSERT_TRUE(j.ok()) << j.status().ToString();
  EXPECT_TRUE(j->gpus.empty());
  EXPECT_TRUE(HasNote(*j, "CUDA_VISIBLE_DEVICES is set but empty: no GPU is visible"));
}

TEST(JobPlan, TooManyTrainerCoresIsNoted) {
  JobPlanRequest rq = Incident(4);  // slices of 11 cores
  rq.trainer_cores = 65535;
  Result<JobPlan> j = MakeJobPlan(rq);
  ASSERT_TRUE(j.ok()) << j.status().ToString();
  EXPECT_EQ(j->plan.ranks[0].trainer_cpus.size(), 1u);
  EXPECT_EQ(CountNotes(*j, "`trainer_cores` 65535: local ranks 0-3 have too few cores"), 1);
  EXPECT_TRUE(HasNote(*j,
                      "each trainer got 1 cpu shared with its loader threads (local rank 0: "
                      "trainer_cpus=0 loader_cpus=0-10,44-54)"));
  rq.trainer_cores = 2;  // fits: no note
  j = MakeJobPlan(rq);
  ASSERT_TRUE(j.ok()) << j.status().ToString();
  EXPECT_EQ(j->plan.ranks[0].trainer_cpus.size(), 2u);
  EXPECT_TRUE(j->notes.empty());
  rq = Incident(1);  // a 2-core slice: trainer cores 2 cannot leave the loader a core
  rq.cpu_affinity = "0-1";
  rq.trainer_cores = 2;
  j = MakeJobPlan(rq);
  ASSERT_TRUE(j.ok()) << j.status().ToString();
  EXPECT_TRUE(HasNote(*j, "`trainer_cores` 2: local rank 0 has too few cores"));
}

TEST(JobPlan, ContradictingFlagsAreRefusedNamingBoth) {
  JobPlanRequest rq = Incident(1);
  rq.ignore_gpus = true;
  rq.gpus = "0";
  Status s = MakeJobPlan(rq).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("`gpus` '0' and `ignore_gpus` contradict"), std::string::npos)
      << s.message();
  rq = Incident(1);
  rq.no_bind = true;
  rq.numa_node = "5";
  s = MakeJobPlan(rq).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("`numa_node` and `no_bind` contradict"), std::string::npos)
      << s.message();
  rq.numa_node.clear();
  rq.cpu_affinity = "0-3";
  s = MakeJobPlan(rq).status();
  EXPECT_NE(s.message().find("`cpu_affinity` and `no_bind` contradict"), std::string::npos)
      << s.message();
  rq.cpu_affinity.clear();
  rq.trainer_cores = 2;
  s = MakeJobPlan(rq).status();
  EXPECT_NE(s.message().find("`trainer_cores` and `no_bind` contradict"), std::string::npos)
      << s.message();
  rq.trainer_cores = 1;
  EXPECT_TRUE(MakeJobPlan(rq).ok());
}

TEST(JobPlan, RankListsInMessagesStayShort) {
  JobPlanRequest rq = Incident(1024);
  rq.ignore_gpus = true;
  Status s = MakeJobPlan(rq).status();  // 512 ranks on each node: too few cores
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("for 512 local ranks (0,2,4,"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find(",... (512 ranks))"), std::string::npos) << s.message();
  EXPECT_LT(s.message().size(), 400u) << s.message();
  rq.allow_shared_cores = true;
  Result<JobPlan> j = MakeJobPlan(rq);
  ASSERT_TRUE(j.ok()) << j.status().ToString();
  EXPECT_EQ(CountNotes(*j, "`allow_shared_cores`"), 1);
  EXPECT_TRUE(HasNote(*j, "`allow_shared_cores`: local ranks 0-1023 share their cores"));
  EXPECT_LT(j->plan.ranks[0].reason.size(), 400u) << j->plan.ranks[0].reason;
}

TEST(JobPlan, MissingTopologyFileIsAnError) {
  JobPlanRequest rq;
  rq.topology_file = "/nonexistent/topo.xml";
  Status s = MakeJobPlan(rq).status();
  EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.ToString();
  EXPECT_NE(s.message().find("cannot read topology file /nonexistent/topo.xml"), std::string::npos)
      << s.ToString();
}

}  // namespace
}  // namespace nl
