#include "loader/cli/serve_options.h"

#include <cstdlib>

#include "base/parse_number.h"
#include "base/worker_pool.h"
#include "loader/cli/option_table.h"

namespace nl {

namespace {

void AddServiceOptions(CLI::App* s, ServeFlags* f) {
  ServiceConfig& sc = f->request.service;
  Add(s, opt::kJobId, &sc.job_id);
  Add(s, opt::kRank, &f->rank);
  Add(s, opt::kWorldSize, &f->world);
  Add(s, opt::kLocalRank, &f->local_rank);
  Add(s, opt::kLocalWorldSize, &f->local_world);
  Add(s, opt::kEpochs, &sc.pipeline.epochs);
  Add(s, opt::kStartEpoch, &sc.pipeline.start_epoch);
  Add(s, opt::kStartBatch, &sc.pipeline.start_batch);
  Add(s, opt::kThreads, &f->request.threads);
  Add(s, opt::kAttachTimeout, &sc.attach_timeout_s)->default_str("");  // none: no limit
  Add(s, opt::kStallWarning, &sc.stall_warning_s);
  Add(s, opt::kSimulateDelayMs, &sc.delay_per_batch_ms);
}

std::string Triple(const std::array<float, 3>& v) {
  return FormatNumber(v[0]) + "," + FormatNumber(v[1]) + "," + FormatNumber(v[2]);
}

void PushPipeline(std::vector<std::string>* a, const PipelineConfig& p) {
  Push(a, opt::kData, p.data_dir);
  Push(a, opt::kSplit, p.split);
  Push(a, opt::kBatchSize, p.batch_size);
  Push(a, opt::kPrefetch, p.prefetch);
  Push(a, opt::kSeed, p.seed);
  Push(a, opt::kNoShuffle, !p.shuffle);
  Push(a, opt::kDropLast, p.drop_last);
  Push(a, opt::kDropLastBatch, p.drop_last_batch);
  Push(a, opt::kOnBadRecord, OnBadRecordName(p.on_bad_record));
  Push(a, opt::kOrder, OrderChoiceName(p.order));
  if (p.io_memory) Push(a, opt::kIoMemory, *p.io_memory);
  Push(a, opt::kEpochs, p.epochs);
  Push(a, opt::kStartEpoch, p.start_epoch);
  Push(a, opt::kStartBatch, p.start_batch);
}

void PushTransform(std::vector<std::string>* a, const TransformConfig& t) {
  Push(a, opt::kImageSize, t.image_size);
  Push(a, opt::kResize, ResizeModeName(t.resize));
  if (t.resize_size != 0) Push(a, opt::kResizeSize, t.resize_size);
  if (t.train) {
    Push(a, opt::kAugment, true);
    Push(a, opt::kPadCrop, t.pad_crop);
    Push(a, opt::kRandomResizedCrop, t.random_resized_crop);
    Push(a, opt::kNoFlip, !t.flip);
  }
  Push(a, opt::kDecode, DecodeModeName(t.decode));
  Push(a, opt::kLayout, LayoutName(t.layout));
  if (t.normalize) {
    Push(a, opt::kNormalize, true);
    Push(a, opt::kMean, Triple(t.mean));
    Push(a, opt::kStd, Triple(t.std));
  }
}

void PushPlan(std::vector<std::string>* a, const JobPlanRequest& p) {
  if (!p.gpus.empty()) Push(a, opt::kGpus, p.gpus);
  if (!p.numa_node.empty()) Push(a, opt::kNumaNode, p.numa_node);
  if (!p.cpu_affinity.empty()) Push(a, opt::kCpuAffinity, p.cpu_affinity);
  Push(a, opt::kTrainerCores, p.trainer_cores);
  Push(a, opt::kAllowSharedCores, p.allow_shared_cores);
  Push(a, opt::kIgnoreGpus, p.ignore_gpus);
  Push(a, opt::kNoBind, p.no_bind);
}

}  // namespace

std::vector<std::string> ServeArgv(const std::string& loader, const ServeRequest& r) {
  const ServiceConfig& s = r.service;
  std::vector<std::string> a = {loader, "serve"};
  Push(&a, opt::kJobId, s.job_id);
  Push(&a, opt::kRank, s.pipeline.rank);
  Push(&a, opt::kWorldSize, s.pipeline.world);
  Push(&a, opt::kLocalRank, r.local_rank);
  Push(&a, opt::kLocalWorldSize, r.local_world);
  PushPipeline(&a, s.pipeline);
  PushTransform(&a, s.pipeline.transform);
  if (r.threads != 0) Push(&a, opt::kThreads, r.threads);
  if (s.attach_timeout_s >= 0) Push(&a, opt::kAttachTimeout, s.attach_timeout_s);
  Push(&a, opt::kStallWarning, s.stall_warning_s);
  if (s.delay_per_batch_ms > 0) Push(&a, opt::kSimulateDelayMs, s.delay_per_batch_ms);
  PushPlan(&a, r.plan);
  return a;
}

void AddServeOptions(CLI::App* s, ServeFlags* f) {
  PipelineConfig& pc = f->request.service.pipeline;
  pc.epochs = 0;
  AddPipelineOptions(s, &pc, &f->pipeline);
  AddTransformOptions(s, &pc.transform, &f->transform);
  AddServiceOptions(s, f);
  AddPlanOptions(s, &f->request.plan, kPlanPlacement | kPlanFallbacks | kPlanNoBind);
}

const char* ProcessEnv(const char* name) { return std::getenv(name); }

Result<int64_t> FlagOrEnv(const std::string& flag_text, const OptionDef& d, const char* variable,
                          int64_t def, EnvLookup env) {
  const int64_t min = d.min, max = static_cast<int64_t>(d.max);
  if (!flag_text.empty()) return ParseInt(flag_text, d.flag, min, max);
  if (const char* v = env(variable); v != nullptr && *v != '\0') {
    return ParseInt(v, std::string("the environment variable ") + variable, min, max);
  }
  return def;
}

Result<ServeRequest> FinishServeOptions(const ServeFlags& f, EnvLookup env) {
  ServeRequest r = f.request;
  PipelineConfig& pc = r.service.pipeline;
  NL_RETURN_IF_ERROR(FinishPipelineOptions(f.pipeline, &pc));
  NL_RETURN_IF_ERROR(FinishTransformOptions(f.transform, &pc.transform));
  NL_ASSIGN_OR_RETURN(const int64_t rank, FlagOrEnv(f.rank, opt::kRank, "RANK", 0, env));
  NL_ASSIGN_OR_RETURN(const int64_t world,
                      FlagOrEnv(f.world, opt::kWorldSize, "WORLD_SIZE", 1, env));
  NL_ASSIGN_OR_RETURN(const int64_t local, FlagOrEnv(f.local_rank, opt::kLocalRank, "LOCAL_RANK", 0, env));
  NL_ASSIGN_OR_RETURN(const int64_t local_world,
                      FlagOrEnv(f.local_world, opt::kLocalWorldSize, "LOCAL_WORLD_SIZE", 0, env));
  if (rank >= world) {
    return Status::InvalidArgument("rank " + std::to_string(rank) +
                                   " is not below the world size " + std::to_string(world));
  }
  if (local_world != 0 && local >= local_world) {
    return Status::InvalidArgument("local rank " + std::to_string(local) +
                                   " is not below the local world size " +
                                   std::to_string(local_world));
  }
  pc.rank = static_cast<int>(rank);
  pc.world = static_cast<int>(world);
  r.local_rank = static_cast<int>(local);
  r.local_world = static_cast<int>(local_world);
  return r;
}

}  // namespace nl
