#include "trainer/rank_startup.h"

#include <sched.h>
#include <unistd.h>

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <thread>

#include "base/file_util.h"
#include "loader/cli/option_table.h"
#include "loader/plan/affinity.h"
#include "loader/plan/cpu_list.h"
#include "trainer/binding_json.h"
#include "trainer/outputs.h"
#include "trainer/progress.h"
#include "trainer/rank_error.h"
#include "trainer/rendezvous.h"
#include "trainer/serve_args.h"
#include "trainer/settings.h"

namespace nl::trainer {
namespace {

// The start-up's steps, in the order Run takes them, each filling its part
// of the StartedRank.
class RankStartup {
 public:
  RankStartup(const Options& o, const Placement& p, StartedRank* s) : s_(*s), o_(s->o), p_(s->p) {
    s_.o = o;
    s_.p = p;
  }
  RankStartup(const RankStartup&) = delete;
  RankStartup& operator=(const RankStartup&) = delete;
  void Run();

 private:
  void OpenOutputs();
  void Plan();
  void ChooseDevice();
  void BuildModel();
  void Resume();
  void StartLoader(uint64_t start_epoch, uint64_t start_batch);
  void Rendezvous();
  void BroadcastInitialState();
  void ExchangeBindings();
  void SayPlan() const;

  void Log(const std::string& s) const {
    std::fprintf(stderr, "[rank %d] %s\n", p_.rank, FlagText(s).c_str());
    std::fflush(stderr);
  }

  StartedRank& s_;
  Options& o_;          // s_.o
  const Placement& p_;  // s_.p
  std::chrono::milliseconds timeout_{300000};
  RankPlan mine_;  // the plan's place for this rank
  cpu_set_t process_cpus_;  // before the rank bound itself: where its loader service may plan
  bool have_process_cpus_ = false;
  bool cuda_ = false;
  StoreAddress store_address_;
};

void RankStartup::Run() {
  timeout_ = std::chrono::milliseconds(static_cast<int64_t>(o_.timeout_s * 1000));
  s_.manifest = Take(LoadManifest(o_.data), "cannot read the shard set");
  Check(CheckData(o_, s_.manifest), "cannot train on " + o_.data);
  s_.train_samples = s_.manifest.FindSplit("train")->num_samples;
  // Rank 0's outputs first: a path it cannot write fails the job before any
  // rank starts its loader or waits in the rendezvous.
  if (p_.rank == 0) OpenOutputs();
  Plan();
  ChooseDevice();
  // The order the loader will read in, resolved as it will resolve it: a
  // resume checks it against the checkpoint's, and the ranks agree on it.
  s_.read_plan = Take(PlanReadingFor(TrainPipeline(o_, p_, 0, 0, s_.g.ring_size), s_.manifest),
                      "cannot plan the reading of the train split");
  BuildModel();
  Resume();
  // The loader first (it warms up during the rendezvous), then c10d.
  StartLoader(static_cast<uint64_t>(s_.at.epoch), static_cast<uint64_t>(s_.at.batch));
  Rendezvous();
  BroadcastInitialState();
  ExchangeBindings();
  s_.schedule = MakeSchedule(o_, s_.train_samples, p_.world);
  if (p_.rank == 0) SayPlan();
}

void RankStartup::OpenOutputs() {
  Check(CheckOutputs(o_), "cannot write the outputs");
  // Our launcher holds the lock for the job; under torchrun rank 0 does.
  if (!p_.launched_by_us) s_.lock = Take(LockOutputs(o_), "cannot lock the outputs");
  // Temporaries a killed job left in --out (kill -9 mid-save): with the
  // outputs locked, none can belong to a running job.
  for (const std::string& path : RemoveStaleOutputTemporaries(o_.out)) {
    Log("removed " + path + ", left by a job that was killed");
  }
  if (o_.metrics_out.empty()) return;
  if (Status s = CreatePrivateFile(o_.metrics_out); !s.ok()) {
    throw RankError("cannot write --metrics-out: " + s.message());
  }
  s_.metrics.reset(std::fopen(o_.metrics_out.c_str(), o_.resume.empty() ? "w" : "a"));
  if (!s_.metrics) throw RankError("cannot write --metrics-out " + o_.metrics_out + ": " + std::strerror(errno));
}

void RankStartup::Plan() {
  JobPlanRequest rq = PlanRequest(o_, p_.local_world);
  s_.job = Take(MakeJobPlan(rq), "cannot plan the binding");
  if (p_.local_rank >= static_cast<int>(s_.job.plan.ranks.size())) {
    throw RankError("the plan has " + std::to_string(s_.job.plan.ranks.size()) + " local ranks; this is local rank " +
                    std::to_string(p_.local_rank));
  }
  mine_ = s_.job.plan.ranks[static_cast<size_t>(p_.local_rank)];
  s_.loader_plan = mine_;
  if (o_.misbind_rank == p_.rank) {
    if (!s_.job.plan.binds) throw RankError("--misbind-rank needs a binding plan (not --no-bind)");
    int wrong = -1;
    for (const NumaNode& n : s_.job.topology.numa_nodes()) {
      if (n.os_index != mine_.numa_node && !n.pus.empty()) {
        wrong = n.os_index;
        break;
      }
    }
    if (wrong < 0) {
      throw RankError("--misbind-rank " + std::to_string(p_.rank) + ": this machine has " +
                      std::to_string(s_.job.topology.numa_nodes().size()) +
                      " NUMA node(s) with cpus, so there is no wrong node to bind to");
    }
    std::string nodes;
    for (size_t i = 0; i < s_.job.plan.ranks.size(); ++i) {
      const int n = static_cast<int>(i) == p_.local_rank ? wrong : s_.job.plan.ranks[i].numa_node;
      nodes += (i ? "," : "") + std::to_string(std::max(0, n));
    }
    rq.numa_node = nodes;
    rq.allow_shared_cores = true;
    JobPlan bad = Take(MakeJobPlan(rq), "cannot plan the misbinding");
    s_.loader_plan = bad.plan.ranks[static_cast<size_t>(p_.local_rank)];
    o_.plan.numa_node = nodes;
    o_.plan.allow_shared_cores = true;
  }
  have_process_cpus_ = sched_getaffinity(0, sizeof process_cpus_, &process_cpus_) == 0;
  if (s_.job.plan.binds && !mine_.trainer_cpus.empty()) {
    const BindReport r = BindThisThread(s_.job.topology, mine_.trainer_cpus, mine_.mem_node);
    (void)r;
  }
  int threads = o_.threads;
  if (threads <= 0) {
    threads = s_.job.plan.binds && !mine_.trainer_cpus.empty()
                  ? static_cast<int>(mine_.trainer_cpus.size())
                  : std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / p_.local_world);
  }
  torch::set_num_threads(threads);
}

void RankStartup::ChooseDevice() {
  s_.g.model_size = o_.transform.image_size;
  s_.g.ring_size = o_.transform.image_size;
  if (o_.resize_on == "device") s_.g.ring_size = static_cast<int>((*s_.manifest.FindSplit("train")->shape)[0]);
#if NL_TRAINER_CUDA
  cuda_ = o_.device != "cpu" && torch::cuda::is_available() && mine_.gpu >= 0;
#endif
  if (o_.device == "cuda" && !cuda_) {
#if NL_TRAINER_CUDA
    throw RankError("--device cuda: no CUDA device for this rank (LibTorch sees none, or the plan "
                    "gives it no GPU)");
#else
    throw RankError("--device cuda: this trainer was built against a LibTorch without CUDA");
#endif
  }
  s_.g.device =
      cuda_ ? torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(mine_.gpu)) : torch::Device(torch::kCPU);
}

void RankStartup::BuildModel() {
  torch::manual_seed(o_.seed);
  s_.model = MakeModel(o_.model, static_cast<int64_t>(s_.manifest.classes.size()));
  s_.model->to(s_.g.device);
  s_.opt = std::make_unique<torch::optim::SGD>(
      s_.model->parameters(),
      torch::optim::SGDOptions(o_.lr).momentum(o_.momentum).weight_decay(o_.weight_decay));
}

void RankStartup::Resume() {
  if (o_.resume.empty()) return;
  const Checkpoint now = s_.Describe(0, 0, 0);
  s_.at = LoadCheckpoint(o_.resume, *s_.model, *s_.opt, now);
  std::string changes;
  for (const std::string& c : RunChanges(s_.at, now)) changes += (changes.empty() ? "" : ", ") + c;
  if (!changes.empty() && !o_.resume_changes) {
    throw RankError("the checkpoint " + o_.resume + " belongs to a run with other settings: " + changes +
                    " (the learning-rate schedule or the images would change mid-run: resume with the same "
                    "settings, or give --resume-changes to resume with these)");
  }
  if (p_.rank == 0) {
    Log("resuming from " + o_.resume + ": epoch " + std::to_string(s_.at.epoch) + ", batch " +
        std::to_string(s_.at.batch) + ", step " + std::to_string(s_.at.step) + " (every tensor checked)" +
        (changes.empty() ? "" : "; with --resume-changes: " + changes));
  }
  if (s_.at.epoch >= o_.epochs) {
    throw RankError("the checkpoint " + o_.resume + " is at epoch " + std::to_string(s_.at.epoch) + ", batch " +
                    std::to_string(s_.at.batch) + ": --epochs " + std::to_string(o_.epochs) +
                    " leaves nothing to train (give more epochs)");
  }
  if (o_.max_steps > 0 && o_.max_steps <= s_.at.step) {
    throw RankError("the checkpoint " + o_.resume + " is at step " + std::to_string(s_.at.step) + ": --max-steps " +
                    std::to_string(o_.max_steps) +
                    " leaves nothing to train (it counts from the start of the run: give more)");
  }
  if (static_cast<uint64_t>(s_.at.seed) != o_.seed) {
    if (p_.rank == 0) Log("resuming with the checkpoint's seed " + std::to_string(s_.at.seed));
    o_.seed = static_cast<uint64_t>(s_.at.seed);
  }
}

void RankStartup::StartLoader(uint64_t start_epoch, uint64_t start_batch) {
  const bool delay = o_.simulate_slow_rank == p_.rank && o_.delay_ms > 0 && o_.slow_phase == "data";
  PipelineConfig c = TrainPipeline(o_, p_, start_epoch, start_batch, s_.g.ring_size);
  if (o_.loader == "inprocess") {
    const PipelineConfig own = s_.InprocessConfig("train");
    c.threads = own.threads;
    c.thread_start = own.thread_start;
    s_.source = std::make_unique<InprocessSource>(c, s_.g, delay ? o_.delay_ms : 0);
    return;
  }
  s_.source = std::make_unique<ServiceSource>(ServeArgs(o_, p_, LoaderBinary(o_), c, delay), p_.job_id, p_.rank,
                                              o_.timeout_s, s_.g, o_.timeout_s,
                                              have_process_cpus_ ? &process_cpus_ : nullptr);
}

void RankStartup::Rendezvous() {
  ResolveMasterAddr(p_.master_addr);
  s_.store = ConnectRendezvousStore(p_, timeout_, &store_address_);
  // Everyone joins: one process per rank, all of one WORLD_SIZE, all there.
  Join(*s_.store, p_.rank, p_.world, p_.launched_by_us, StoreWhere(p_), timeout_);
  // ... and with the same settings, before any collective could mismatch.
  const std::string resume_at = o_.resume.empty() ? "none" : "epoch " + std::to_string(s_.at.epoch) + ", batch " +
                                                                  std::to_string(s_.at.batch) + ", step " +
                                                                  std::to_string(s_.at.step);
  AgreeSettings(*s_.store, p_.rank, p_.world, SharedSettings(o_, s_.manifest, resume_at, SequenceOf(s_.read_plan)),
                StoreWhere(p_), timeout_);
  s_.hb = std::make_unique<Heartbeat>(store_address_, p_.rank, p_.world);
  s_.comm = std::make_unique<Comm>(CreateProcessGroup(s_.store, p_, timeout_, s_.g.device.is_cuda()), p_.world,
                                   timeout_, s_.hb.get());
}

// Everyone starts from rank 0's parameters and buffers.
void RankStartup::BroadcastInitialState() {
  std::vector<torch::Tensor> state;
  for (auto& p : s_.model->parameters()) state.push_back(p);
  for (auto& b : s_.model->buffers()) state.push_back(b);
  s_.comm->BroadcastCoalesced(state, "the broadcast of rank 0's initial parameters");
  s_.buffers = s_.model->buffers();
  s_.reducer = std::make_unique<GradReducer>(s_.model->parameters(), 25 * 1024 * 1024, s_.comm.get(),
                                             o_.reduce == "after-backward" ? ReduceMode::kAfterBackward
                                                                           : ReduceMode::kOverlap);
}

// Bindings, exchanged once through the store; rank 0 keeps them for its table.
void RankStartup::ExchangeBindings() {
  RankBinding b;
  b.rank = p_.rank;
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  b.host = host;
  b.loader_cpus = s_.job.plan.binds ? FormatCpuList(s_.loader_plan.loader_cpus) : "";
  b.loader_node = s_.job.plan.binds ? s_.loader_plan.numa_node : -1;
  b.planned_node = s_.job.plan.binds ? mine_.numa_node : -1;
  b.gpu = cuda_ ? mine_.gpu : -1;
  b.gpu_node = cuda_ ? mine_.numa_node : -1;
  b.loader_threads = static_cast<int>(
      o_.loader_threads ? o_.loader_threads : std::max<size_t>(1, s_.loader_plan.loader_cpus.size()));
  b.misbound = o_.misbind_rank == p_.rank;
  b.simulated_delay_ms = o_.simulate_slow_rank == p_.rank ? o_.delay_ms : 0;
  b.simulated_phase = o_.slow_phase;
  const std::string j = BindingToJson(b);
  s_.store->set("binding/" + std::to_string(p_.rank), std::vector<uint8_t>(j.begin(), j.end()));
  if (p_.rank != 0) return;
  for (int r = 0; r < p_.world; ++r) {
    const std::vector<uint8_t> v = s_.store->get("binding/" + std::to_string(r));
    s_.bindings.push_back(BindingFromJson(std::string(v.begin(), v.end())));
  }
}

void RankStartup::SayPlan() const {
  Say("trainer: " + o_.model + ", " + std::to_string(p_.world) + " rank(s) x batch " + std::to_string(o_.batch_size) +
      ", " + std::to_string(s_.schedule.batches_per_epoch) + " steps an epoch, " +
      std::to_string(s_.schedule.total_steps) + " steps in all, image " + std::to_string(s_.g.model_size) +
      (s_.g.ring_size != s_.g.model_size ? " (resized on the device from " + std::to_string(s_.g.ring_size) + ")"
                                         : "") +
      ", device " + s_.g.device.str() + ", loader " + o_.loader + ", " + std::to_string(s_.reducer->buckets()) +
      " gradient bucket(s) reduced " + (o_.reduce == "overlap" ? "during" : "after") + " backward, backend " +
      s_.comm->backend_name());
  Say("trainer: ring bytes per image " + std::to_string(3 * s_.g.ring_size * s_.g.ring_size));
  Say("trainer: train transform " + DescribeTransform(o_.transform) + "; eval transform " +
      (o_.eval_transform == "center-crop"
           ? "resize shorter side to " + std::to_string(std::lround(s_.g.ring_size / 0.875)) + ", centre crop"
           : std::string("squash")) +
      " (--augment, --pad-crop, --random-resized-crop, --no-flip, --eval-transform choose them)");
}

}  // namespace

Checkpoint StartedRank::Describe(int64_t epoch, int64_t batch, int64_t step) const {
  Checkpoint c;
  c.epoch = epoch;
  c.batch = batch;
  c.step = step;
  c.seed = static_cast<int64_t>(o.seed);
  c.world = p.world;
  c.batch_size = o.batch_size;
  c.model = o.model;
  c.classes = static_cast<int64_t>(manifest.classes.size());
  c.train_samples = static_cast<int64_t>(train_samples);
  c.epochs = o.epochs;
  c.max_steps = o.max_steps;
  c.warmup_steps = o.warmup_steps;
  c.image_size = o.transform.image_size;
  c.lr = o.lr;
  c.momentum = o.momentum;
  c.weight_decay = o.weight_decay;
  c.label_smoothing = o.label_smoothing;
  c.order = SequenceOf(read_plan);
  c.io_memory = static_cast<int64_t>(read_plan.io_memory);
  return c;
}

PipelineConfig StartedRank::InprocessConfig(const std::string& split) const {
  PipelineConfig c;
  c.data_dir = o.data;
  c.split = split;
  c.rank = p.rank;
  c.world = p.world;
  c.batch_size = o.batch_size;
  c.threads = o.loader_threads ? o.loader_threads
                               : static_cast<uint32_t>(std::max<size_t>(1, loader_plan.loader_cpus.size()));
  c.transform.image_size = g.ring_size;
  if (job.plan.binds) c.thread_start = LoaderThreadStartHook(job.topology, loader_plan, p.rank, nullptr);
  return c;
}

void StartRank(const Options& o, const Placement& p, StartedRank* s) { RankStartup(o, p, s).Run(); }

}  // namespace nl::trainer
