#include "loader/plan/job_plan.h"

#include "base/parse_number.h"

namespace nl {
namespace {

Result<std::vector<int>> IntList(const std::string& text, const char* flag, int64_t max) {
  NL_ASSIGN_OR_RETURN(std::vector<int64_t> l, ParseIntList(text, flag, 0, max));
  return std::vector<int>(l.begin(), l.end());
}

Status ParsePlanFlags(const JobPlanRequest& rq, PlanOptions* o) {
  if (!rq.gpus.empty()) {
    NL_ASSIGN_OR_RETURN(o->rank_gpu, IntList(rq.gpus, "`gpus`", kMaxGpuIndex));
  }
  if (!rq.numa_node.empty()) {
    NL_ASSIGN_OR_RETURN(o->numa_node, IntList(rq.numa_node, "`numa_node`", kMaxCpuIndex));
  }
  if (!rq.cpu_affinity.empty()) {
    NL_ASSIGN_OR_RETURN(o->cpu_affinity, ParseCpuAffinity(rq.cpu_affinity));
  }
  return Status::Ok();
}

// Flags that contradict each other: an error naming both, before anything is loaded.
Status CheckContradictions(const JobPlanRequest& rq) {
  if (rq.ignore_gpus && !rq.gpus.empty()) {
    return Status::InvalidArgument("`gpus` '" + rq.gpus +
                                   "' and `ignore_gpus` contradict: `ignore_gpus` plans as if no "
                                   "GPU were visible; drop one of them");
  }
  if (rq.no_bind) {
    const char* with = !rq.numa_node.empty()      ? "`numa_node`"
                       : !rq.cpu_affinity.empty() ? "`cpu_affinity`"
                       : rq.trainer_cores != 1    ? "`trainer_cores`"
                                                  : nullptr;
    if (with) {
      return Status::InvalidArgument(std::string(with) + " and `no_bind` contradict: " + with +
                                     " says where ranks run, `no_bind` binds nothing; drop one "
                                     "of them");
    }
  }
  return Status::Ok();
}

}  // namespace

Result<JobPlan> MakeJobPlan(const JobPlanRequest& rq) {
  NL_RETURN_IF_ERROR(CheckContradictions(rq));
  const bool live = rq.topology_file.empty();
  NL_ASSIGN_OR_RETURN(Topology topo,
                      live ? Topology::Live() : Topology::FromXmlFile(rq.topology_file));
  JobPlan job{std::move(topo), {}, {}, {}, {}};
  job.notes = job.topology.notes();
  GpuOrderInputs in;
  in.cuda_visible_devices = rq.cuda_visible_devices;
  if (live) in.cuda_bus_ids = QueryCudaBusIds(&job.gpu_note);
  std::string cvd_note;
  NL_ASSIGN_OR_RETURN(std::vector<VisibleGpu> gpus,
                      ResolveVisibleGpus(job.topology, in, &cvd_note));
  if (!cvd_note.empty()) job.notes.push_back(cvd_note);
  if (rq.ignore_gpus) {
    if (!gpus.empty()) {
      job.notes.push_back("`ignore_gpus`: planning without the " + std::to_string(gpus.size()) +
                          " visible GPU(s); ranks go round-robin over NUMA nodes");
    }
  } else {
    job.gpus = std::move(gpus);
  }

  PlanOptions o;
  o.nproc = rq.nproc > 0 ? rq.nproc : std::max<int>(1, static_cast<int>(job.gpus.size()));
  o.visible_gpus = job.gpus;
  o.trainer_cores = rq.trainer_cores;
  o.allow_shared_cores = rq.allow_shared_cores;
  o.no_bind = rq.no_bind;
  NL_RETURN_IF_ERROR(ParsePlanFlags(rq, &o));
  NL_ASSIGN_OR_RETURN(job.plan, Plan(job.topology, o));
  std::vector<int> shared, short_trainer;
  for (const RankPlan& r : job.plan.ranks) {
    if (r.shares_cores) shared.push_back(r.local_rank);
    if (job.plan.binds && static_cast<int>(r.trainer_cpus.size()) < rq.trainer_cores)
      short_trainer.push_back(r.local_rank);
  }
  if (!shared.empty()) {  // one line, however many ranks
    job.notes.push_back("`allow_shared_cores`: local rank" +
                        std::string(shared.size() == 1 ? " " : "s ") + FormatRankList(shared) +
                        (shared.size() == 1 ? " shares its" : " share their") +
                        " cores with another rank");
  }
  if (!short_trainer.empty()) {
    const RankPlan& r = job.plan.ranks[short_trainer.front()];
    job.notes.push_back(
        "`trainer_cores` " + std::to_string(rq.trainer_cores) + ": local rank" +
        (short_trainer.size() == 1 ? " " : "s ") + FormatRankList(short_trainer) +
        (short_trainer.size() == 1 ? " has" : " have") +
        " too few cores for that; each trainer got 1 cpu shared with its loader threads "
        "(local rank " +
        std::to_string(r.local_rank) + ": trainer_cpus=" + FormatCpuList(r.trainer_cpus) +
        " loader_cpus=" + FormatCpuList(r.loader_cpus) + ")");
  }
  if (!job.plan.binds) job.notes.push_back("`no_bind`: no rank is bound");
  return job;
}

}  // namespace nl
