#include "loader/cli/serve_options.h"

#include <cstdlib>

#include "base/parse_number.h"
#include "base/worker_pool.h"

namespace nl {

namespace {

void AddServiceOptions(CLI::App* s, ServeFlags* f) {
  ServiceConfig& sc = f->request.service;
  s->add_option("--job-id", sc.job_id,
                "Job id shared with the consumer (printable ASCII, no '/', at most 64 bytes)")
      ->required();
  s->add_option("--rank", f->rank, "Global rank (default: $RANK, else 0)");
  s->add_option("--world-size", f->world, "World size (default: $WORLD_SIZE, else 1)");
  s->add_option("--local-rank", f->local_rank, "Local rank (default: $LOCAL_RANK, else 0)");
  s->add_option("--local-world-size", f->local_world,
                "Ranks on this node, for the binding plan (default: $LOCAL_WORLD_SIZE, else one "
                "per visible GPU)");
  s->add_option("--epochs", sc.pipeline.epochs,
                "Epochs to serve, then end the stream (0: as long as the consumer asks)")
      ->check(CLI::Range(uint64_t{0}, uint64_t{1} << 32))
      ->capture_default_str();
  s->add_option("--start-epoch", sc.pipeline.start_epoch, "First epoch")
      ->check(CLI::Range(uint64_t{0}, uint64_t{1} << 32));
  s->add_option("--start-batch", sc.pipeline.start_batch, "First batch of that epoch")
      ->check(CLI::Range(uint64_t{0}, uint64_t{1} << 40));
  s->add_option("--threads", f->request.threads,
                "Loader threads (default: the plan's loader cores for this rank)")
      ->check(CLI::Range(1u, WorkerPool::kMaxThreads));
  s->add_option("--attach-timeout", sc.attach_timeout_s,
                "Seconds to wait for a consumer (default: no limit)")
      ->check(CLI::Range(0.0, 1e7));
  s->add_option("--stall-warning", sc.stall_warning_s,
                "Warn when the consumer holds every slot this many seconds")
      ->check(CLI::Range(0.0, 1e7))
      ->capture_default_str();
  s->add_option("--simulate-delay-ms", sc.delay_per_batch_ms,
                "Testing: sleep this long before each batch (a slow loader, to see the "
                "trainer's straggler diagnosis)")
      ->check(CLI::Range(0.0, 1e6));
}

void Push(std::vector<std::string>* argv, const char* flag, const std::string& value) {
  argv->push_back(flag);
  argv->push_back(value);
}

void PushIf(std::vector<std::string>* argv, bool on, const char* flag) {
  if (on) argv->push_back(flag);
}

std::string Triple(const std::array<float, 3>& v) {
  return FormatNumber(v[0]) + "," + FormatNumber(v[1]) + "," + FormatNumber(v[2]);
}

void PushPipeline(std::vector<std::string>* a, const PipelineConfig& p) {
  Push(a, "--data", p.data_dir);
  Push(a, "--split", p.split);
  Push(a, "--batch-size", std::to_string(p.batch_size));
  Push(a, "--prefetch", std::to_string(p.prefetch));
  Push(a, "--seed", std::to_string(p.seed));
  PushIf(a, !p.shuffle, "--no-shuffle");
  PushIf(a, p.drop_last, "--drop-last");
  PushIf(a, p.drop_last_batch, "--drop-last-batch");
  Push(a, "--on-bad-record", OnBadRecordName(p.on_bad_record));
  Push(a, "--order", OrderChoiceName(p.order));
  if (p.io_memory) Push(a, "--io-memory", std::to_string(*p.io_memory));
  Push(a, "--epochs", std::to_string(p.epochs));
  Push(a, "--start-epoch", std::to_string(p.start_epoch));
  Push(a, "--start-batch", std::to_string(p.start_batch));
}

void PushTransform(std::vector<std::string>* a, const TransformConfig& t) {
  Push(a, "--image-size", std::to_string(t.image_size));
  Push(a, "--resize", ResizeModeName(t.resize));
  if (t.resize_size != 0) Push(a, "--resize-size", std::to_string(t.resize_size));
  if (t.train) {
    a->push_back("--augment");
    Push(a, "--pad-crop", std::to_string(t.pad_crop));
    PushIf(a, t.random_resized_crop, "--random-resized-crop");
    PushIf(a, !t.flip, "--no-flip");
  }
  Push(a, "--decode", DecodeModeName(t.decode));
  Push(a, "--layout", LayoutName(t.layout));
  if (t.normalize) {
    a->push_back("--normalize");
    Push(a, "--mean", Triple(t.mean));
    Push(a, "--std", Triple(t.std));
  }
}

void PushPlan(std::vector<std::string>* a, const JobPlanRequest& p) {
  if (!p.gpus.empty()) Push(a, "--gpus", p.gpus);
  if (!p.numa_node.empty()) Push(a, "--numa-node", p.numa_node);
  if (!p.cpu_affinity.empty()) Push(a, "--cpu-affinity", p.cpu_affinity);
  Push(a, "--trainer-cores", std::to_string(p.trainer_cores));
  PushIf(a, p.allow_shared_cores, "--allow-shared-cores");
  PushIf(a, p.ignore_gpus, "--ignore-gpus");
  PushIf(a, p.no_bind, "--no-bind");
}

}  // namespace

std::vector<std::string> ServeArgv(const std::string& loader, const ServeRequest& r) {
  const ServiceConfig& s = r.service;
  std::vector<std::string> a = {loader, "serve"};
  Push(&a, "--job-id", s.job_id);
  Push(&a, "--rank", std::to_string(s.pipeline.rank));
  Push(&a, "--world-size", std::to_string(s.pipeline.world));
  Push(&a, "--local-rank", std::to_string(r.local_rank));
  Push(&a, "--local-world-size", std::to_string(r.local_world));
  PushPipeline(&a, s.pipeline);
  PushTransform(&a, s.pipeline.transform);
  if (r.threads != 0) Push(&a, "--threads", std::to_string(r.threads));
  if (s.attach_timeout_s >= 0) Push(&a, "--attach-timeout", FormatNumber(s.attach_timeout_s));
  Push(&a, "--stall-warning", FormatNumber(s.stall_warning_s));
  if (s.delay_per_batch_ms > 0) Push(&a, "--simulate-delay-ms", FormatNumber(s.delay_per_batch_ms));
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

Result<int64_t> FlagOrEnv(const std::string& flag_text, const char* flag, const char* variable,
                          int64_t def, int64_t min, int64_t max, EnvLookup env) {
  if (!flag_text.empty()) return ParseInt(flag_text, flag, min, max);
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
  NL_ASSIGN_OR_RETURN(const int64_t rank, FlagOrEnv(f.rank, "--rank", "RANK", 0, 0, 1 << 20, env));
  NL_ASSIGN_OR_RETURN(const int64_t world,
                      FlagOrEnv(f.world, "--world-size", "WORLD_SIZE", 1, 1, 1 << 20, env));
  NL_ASSIGN_OR_RETURN(const int64_t local, FlagOrEnv(f.local_rank, "--local-rank", "LOCAL_RANK", 0,
                                                     0, kMaxLocalRanks - 1, env));
  NL_ASSIGN_OR_RETURN(const int64_t local_world,
                      FlagOrEnv(f.local_world, "--local-world-size", "LOCAL_WORLD_SIZE", 0, 0,
                                kMaxLocalRanks, env));
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
