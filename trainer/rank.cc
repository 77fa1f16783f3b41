#include "trainer/rank.h"

#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <thread>

#if NL_TRAINER_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#include "base/child_process.h"
#include "base/clock.h"
#include "base/fd.h"
#include "base/file_util.h"
#include "formats/manifest.h"
#include "loader/plan/affinity.h"
#include "loader/plan/cpu_list.h"
#include "loader/plan/job_plan.h"
#include "trainer/batch_source.h"
#include "trainer/binding_json.h"
#include "trainer/checkpoint.h"
#include "trainer/comm.h"
#include "trainer/comm_failure.h"
#include "trainer/diagnostics.h"
#include "trainer/grad_reducer.h"
#include "trainer/heartbeat.h"
#include "trainer/models.h"
#include "trainer/outputs.h"
#include "trainer/preflight.h"
#include "trainer/proc_info.h"
#include "trainer/progress.h"
#include "trainer/rank_error.h"
#include "trainer/rendezvous.h"
#include "trainer/schedule.h"
#include "trainer/serve_args.h"
#include "trainer/signals.h"
#include "trainer/timing.h"

namespace nl::trainer {
namespace {

namespace F = torch::nn::functional;

// One epoch's running totals.
struct EpochState {
  int64_t epoch = 0;
  int64_t next_batch = 0;  // the batch the loop stopped before (bpe when whole)
  Window report, whole;
  double loss_sum = 0;
  int64_t loss_n = 0, images = 0;
  std::unique_ptr<Progress> bar;  // rank 0's
  Clock::time_point start;
  // Where the last step ended: what the loop did between two steps (a
  // report's gather and table, a checkpoint) is counted in the next step,
  // so a rank's steps add up to the wall time they cover.
  Clock::time_point last_end;
};

// One step's timings, ms.
struct StepTimes {
  double data = 0, compute = 0, comm = 0, step = 0, allreduce = 0;
};

// One rank, in named steps: Setup, then TrainEpoch per epoch (TrainStep per
// batch, EndEpoch), then Finish.
class Rank {
 public:
  Rank(const Options& o, const Placement& p) : o_(o), p_(p) {}
  Rank(const Rank&) = delete;
  Rank& operator=(const Rank&) = delete;
  int Run();

 private:
  // Setup, in order.
  void Setup();
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
  // The loop.
  void TrainEpoch(int64_t epoch);
  // False when --max-steps stops the run before batch b.
  bool TrainStep(EpochState& ep, int64_t b);
  StepTimes ForwardBackwardStep(const Batch& batch, Clock::time_point t0, double data_ms, double* loss);
  void CheckSync();
  void SyncComputeStream() const;
  void EndEpoch(EpochState& ep);
  void SayEpoch(const EpochRecord& e, double top1, double top5);
  void Finish();

  void Log(const std::string& s) const {
    std::fprintf(stderr, "[rank %d] %s\n", p_.rank, s.c_str());
    std::fflush(stderr);
  }
  void Say(const std::string& s) const {  // rank 0's report lines
    std::printf("%s\n", s.c_str());
    std::fflush(stdout);
  }
  PipelineConfig InprocessConfig(const std::string& split) const;
  void Report(int64_t epoch, int64_t step, const Window& w, bool epoch_end, int* straggler);
  void WriteChart(int64_t epoch, const std::vector<RankTiming>& t, int straggler);
  std::pair<double, double> Evaluate();
  void WriteMetrics(const std::string& lines);
  Checkpoint Describe(int64_t epoch, int64_t batch, int64_t step) const;
  // The checkpoint after batch `done` of epoch (the next epoch's start after its last).
  Checkpoint After(int64_t epoch, int64_t done) const {
    return done == static_cast<int64_t>(schedule_.batches_per_epoch) ? Describe(epoch + 1, 0, step_)
                                                                     : Describe(epoch, done, step_);
  }
  void SetPhase(Phase ph, int64_t step) {
    if (hb_) hb_->Set(ph, step);
  }
  void Save(const Checkpoint& c) {
    SetPhase(Phase::kCheckpoint, c.step);
    SaveCheckpoint(o_.out + "/checkpoint.pt", *model_, *opt_, c);
  }

  Options o_;
  Placement p_;
  std::chrono::milliseconds timeout_{300000};
  Manifest manifest_;
  uint64_t train_samples_ = 0;
  JobPlan job_;
  RankPlan mine_, loader_plan_;
  cpu_set_t process_cpus_;  // before the rank bound itself: where its loader service may plan
  bool have_process_cpus_ = false;
  Geometry g_;
  bool cuda_ = false;
  std::shared_ptr<Net> model_;
  std::unique_ptr<torch::optim::SGD> opt_;
  Checkpoint at_;  // where the run starts (a resumed checkpoint's place)
  std::unique_ptr<BatchSource> source_;
  c10::intrusive_ptr<c10d::Store> store_;
  StoreAddress store_address_;
  std::unique_ptr<Heartbeat> hb_;
  std::unique_ptr<Comm> comm_;
  std::unique_ptr<GradReducer> reducer_;
  std::vector<torch::Tensor> buffers_;
  std::vector<RankBinding> bindings_;
  std::vector<int> previous_stragglers_;
  Schedule schedule_;
  ReadPlan read_plan_;  // the train split's, as the loader resolves it
  OutputLock lock_;  // rank 0 outside our launcher (which holds it otherwise)
  FileHandle metrics_;  // flushed after each write
  int64_t step_ = 0;
  int64_t images_all_ = 0;  // taken from the loader by this rank
  int64_t sync_checks_ = 0;
  bool stop_ = false;
};

int Rank::Run() {
  Setup();
  for (int64_t epoch = at_.epoch; epoch < o_.epochs && !stop_; ++epoch) TrainEpoch(epoch);
  Finish();
  return 0;
}

void Rank::Setup() {
  timeout_ = std::chrono::milliseconds(static_cast<int64_t>(o_.timeout_s * 1000));
  manifest_ = Take(LoadManifest(o_.data), "cannot read the shard set");
  Check(CheckData(o_, manifest_), "cannot train on " + o_.data);
  train_samples_ = manifest_.FindSplit("train")->num_samples;
  // Rank 0's outputs first: a path it cannot write fails the job before any
  // rank starts its loader or waits in the rendezvous.
  if (p_.rank == 0) OpenOutputs();
  Plan();
  ChooseDevice();
  // The order the loader will read in, resolved as it will resolve it: a
  // resume checks it against the checkpoint's, and the ranks agree on it.
  read_plan_ = Take(PlanReadingFor(TrainPipeline(o_, p_, 0, 0, g_.ring_size), manifest_),
                    "cannot plan the reading of the train split");
  BuildModel();
  Resume();
  // The loader first (it warms up during the rendezvous), then c10d.
  StartLoader(static_cast<uint64_t>(at_.epoch), static_cast<uint64_t>(at_.batch));
  Rendezvous();
  BroadcastInitialState();
  ExchangeBindings();
  schedule_ = MakeSchedule(o_, train_samples_, p_.world);
  step_ = at_.step;
  if (p_.rank == 0) SayPlan();
}

void Rank::OpenOutputs() {
  Check(CheckOutputs(o_), "cannot write the outputs");
  // Our launcher holds the lock for the job; under torchrun rank 0 does.
  if (!p_.launched_by_us) lock_ = Take(LockOutputs(o_), "cannot lock the outputs");
  // Temporaries a killed job left in --out (kill -9 mid-save): with the
  // outputs locked, none can belong to a running job.
  for (const std::string& path : RemoveStaleOutputTemporaries(o_.out)) {
    Log("removed " + path + ", left by a job that was killed");
  }
  if (o_.metrics_out.empty()) return;
  if (Status s = CreatePrivateFile(o_.metrics_out); !s.ok()) {
    throw RankError("cannot write --metrics-out: " + s.message());
  }
  metrics_.reset(std::fopen(o_.metrics_out.c_str(), o_.resume.empty() ? "w" : "a"));
  if (!metrics_) throw RankError("cannot write --metrics-out " + o_.metrics_out + ": " + std::strerror(errno));
}

void Rank::Plan() {
  JobPlanRequest rq = PlanRequest(o_, p_.local_world);
  job_ = Take(MakeJobPlan(rq), "cannot plan the binding");
  if (p_.local_rank >= static_cast<int>(job_.plan.ranks.size())) {
    throw RankError("the plan has " + std::to_string(job_.plan.ranks.size()) + " local ranks; this is local rank " +
                    std::to_string(p_.local_rank));
  }
  mine_ = job_.plan.ranks[static_cast<size_t>(p_.local_rank)];
  loader_plan_ = mine_;
  if (o_.misbind_rank == p_.rank) {
    if (!job_.plan.binds) throw RankError("--misbind-rank needs a binding plan (not --no-bind)");
    int wrong = -1;
    for (const NumaNode& n : job_.topology.numa_nodes()) {
      if (n.os_index != mine_.numa_node && !n.pus.empty()) {
        wrong = n.os_index;
        break;
      }
    }
    if (wrong < 0) {
      throw RankError("--misbind-rank " + std::to_string(p_.rank) + ": this machine has " +
                      std::to_string(job_.topology.numa_nodes().size()) +
                      " NUMA node(s) with cpus, so there is no wrong node to bind to");
    }
    std::string nodes;
    for (size_t i = 0; i < job_.plan.ranks.size(); ++i) {
      const int n = static_cast<int>(i) == p_.local_rank ? wrong : job_.plan.ranks[i].numa_node;
      nodes += (i ? "," : "") + std::to_string(std::max(0, n));
    }
    rq.numa_node = nodes;
    rq.allow_shared_cores = true;
    JobPlan bad = Take(MakeJobPlan(rq), "cannot plan the misbinding");
    loader_plan_ = bad.plan.ranks[static_cast<size_t>(p_.local_rank)];
    o_.plan.numa_node = nodes;
    o_.plan.allow_shared_cores = true;
  }
  have_process_cpus_ = sched_getaffinity(0, sizeof process_cpus_, &process_cpus_) == 0;
  if (job_.plan.binds && !mine_.trainer_cpus.empty()) {
    const BindReport r = BindThisThread(job_.topology, mine_.trainer_cpus, mine_.mem_node);
    (void)r;
  }
  int threads = o_.threads;
  if (threads <= 0) {
    threads = job_.plan.binds && !mine_.trainer_cpus.empty()
                  ? static_cast<int>(mine_.trainer_cpus.size())
                  : std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / p_.local_world);
  }
  torch::set_num_threads(threads);
}

void Rank::ChooseDevice() {
  g_.model_size = o_.transform.image_size;
  g_.ring_size = o_.transform.image_size;
  if (o_.resize_on == "device") g_.ring_size = static_cast<int>((*manifest_.FindSplit("train")->shape)[0]);
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
  g_.device = cuda_ ? torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(mine_.gpu)) : torch::Device(torch::kCPU);
}

void Rank::BuildModel() {
  torch::manual_seed(o_.seed);
  model_ = MakeModel(o_.model, static_cast<int64_t>(manifest_.classes.size()));
  model_->to(g_.device);
  opt_ = std::make_unique<torch::optim::SGD>(
      model_->parameters(),
      torch::optim::SGDOptions(o_.lr).momentum(o_.momentum).weight_decay(o_.weight_decay));
}

void Rank::Resume() {
  if (o_.resume.empty()) return;
  const Checkpoint now = Describe(0, 0, 0);
  at_ = LoadCheckpoint(o_.resume, *model_, *opt_, now);
  std::string changes;
  for (const std::string& c : RunChanges(at_, now)) changes += (changes.empty() ? "" : ", ") + c;
  if (!changes.empty() && !o_.resume_changes) {
    throw RankError("the checkpoint " + o_.resume + " belongs to a run with other settings: " + changes +
                    " (the learning-rate schedule or the images would change mid-run: resume with the same "
                    "settings, or give --resume-changes to resume with these)");
  }
  if (p_.rank == 0) {
    Log("resuming from " + o_.resume + ": epoch " + std::to_string(at_.epoch) + ", batch " +
        std::to_string(at_.batch) + ", step " + std::to_string(at_.step) + " (every tensor checked)" +
        (changes.empty() ? "" : "; with --resume-changes: " + changes));
  }
  if (at_.epoch >= o_.epochs) {
    throw RankError("the checkpoint " + o_.resume + " is at epoch " + std::to_string(at_.epoch) + ", batch " +
                    std::to_string(at_.batch) + ": --epochs " + std::to_string(o_.epochs) +
                    " leaves nothing to train (give more epochs)");
  }
  if (o_.max_steps > 0 && o_.max_steps <= at_.step) {
    throw RankError("the checkpoint " + o_.resume + " is at step " + std::to_string(at_.step) + ": --max-steps " +
                    std::to_string(o_.max_steps) +
                    " leaves nothing to train (it counts from the start of the run: give more)");
  }
  if (static_cast<uint64_t>(at_.seed) != o_.seed) {
    if (p_.rank == 0) Log("resuming with the checkpoint's seed " + std::to_string(at_.seed));
    o_.seed = static_cast<uint64_t>(at_.seed);
  }
}

Checkpoint Rank::Describe(int64_t epoch, int64_t batch, int64_t step) const {
  Checkpoint c;
  c.epoch = epoch;
  c.batch = batch;
  c.step = step;
  c.seed = static_cast<int64_t>(o_.seed);
  c.world = p_.world;
  c.batch_size = o_.batch_size;
  c.model = o_.model;
  c.classes = static_cast<int64_t>(manifest_.classes.size());
  c.train_samples = static_cast<int64_t>(train_samples_);
  c.epochs = o_.epochs;
  c.max_steps = o_.max_steps;
  c.warmup_steps = o_.warmup_steps;
  c.image_size = o_.transform.image_size;
  c.lr = o_.lr;
  c.momentum = o_.momentum;
  c.weight_decay = o_.weight_decay;
  c.label_smoothing = o_.label_smoothing;
  c.order = SequenceOf(read_plan_);
  c.io_memory = static_cast<int64_t>(read_plan_.io_memory);
  return c;
}

PipelineConfig Rank::InprocessConfig(const std::string& split) const {
  PipelineConfig c;
  c.data_dir = o_.data;
  c.split = split;
  c.rank = p_.rank;
  c.world = p_.world;
  c.batch_size = o_.batch_size;
  c.threads = o_.loader_threads ? o_.loader_threads
                                : static_cast<uint32_t>(std::max<size_t>(1, loader_plan_.loader_cpus.size()));
  c.transform.image_size = g_.ring_size;
  if (job_.plan.binds) c.thread_start = LoaderThreadStartHook(job_.topology, loader_plan_, p_.rank, nullptr);
  return c;
}

void Rank::StartLoader(uint64_t start_epoch, uint64_t start_batch) {
  const bool delay = o_.simulate_slow_rank == p_.rank && o_.delay_ms > 0 && o_.slow_phase == "data";
  PipelineConfig c = TrainPipeline(o_, p_, start_epoch, start_batch, g_.ring_size);
  if (o_.loader == "inprocess") {
    const PipelineConfig own = InprocessConfig("train");
    c.threads = own.threads;
    c.thread_start = own.thread_start;
    source_ = std::make_unique<InprocessSource>(c, g_, delay ? o_.delay_ms : 0);
    return;
  }
  source_ = std::make_unique<ServiceSource>(ServeArgs(o_, p_, LoaderBinary(o_), c, delay), p_.job_id, p_.rank,
                                            o_.timeout_s, g_, o_.timeout_s,
                                            have_process_cpus_ ? &process_cpus_ : nullptr);
}

void Rank::Rendezvous() {
  ResolveMasterAddr(p_.master_addr);
  store_ = ConnectRendezvousStore(p_, timeout_, &store_address_);
  // Everyone joins: one process per rank, all of one WORLD_SIZE, all there.
  Join(*store_, p_.rank, p_.world, p_.launched_by_us, StoreWhere(p_), timeout_);
  // ... and with the same settings, before any collective could mismatch.
  const std::string resume_at = o_.resume.empty() ? "none" : "epoch " + std::to_string(at_.epoch) + ", batch " +
                                                                  std::to_string(at_.batch) + ", step " +
                                                                  std::to_string(at_.step);
  AgreeSettings(*store_, p_.rank, p_.world, SharedSettings(o_, manifest_, resume_at, SequenceOf(read_plan_)),
                StoreWhere(p_), timeout_);
  hb_ = std::make_unique<Heartbeat>(store_address_, p_.rank, p_.world);
  comm_ = std::make_unique<Comm>(CreateProcessGroup(store_, p_, timeout_, g_.device.is_cuda()), p_.world, timeout_,
                                 hb_.get());
}

// Everyone starts from rank 0's parameters and buffers.
void Rank::BroadcastInitialState() {
  std::vector<torch::Tensor> state;
  for (auto& p : model_->parameters()) state.push_back(p);
  for (auto& b : model_->buffers()) state.push_back(b);
  comm_->BroadcastCoalesced(state, "the broadcast of rank 0's initial parameters");
  buffers_ = model_->buffers();
  reducer_ = std::make_unique<GradReducer>(model_->parameters(), 25 * 1024 * 1024, comm_.get(),
                                           o_.reduce == "after-backward" ? ReduceMode::kAfterBackward
                                                                         : ReduceMode::kOverlap);
}

// Bindings, exchanged once through the store; rank 0 keeps them for its table.
void Rank::ExchangeBindings() {
  RankBinding b;
  b.rank = p_.rank;
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  b.host = host;
  b.loader_cpus = job_.plan.binds ? FormatCpuList(loader_plan_.loader_cpus) : "";
  b.loader_node = job_.plan.binds ? loader_plan_.numa_node : -1;
  b.planned_node = job_.plan.binds ? mine_.numa_node : -1;
  b.gpu = cuda_ ? mine_.gpu : -1;
  b.gpu_node = cuda_ ? mine_.numa_node : -1;
  b.loader_threads = static_cast<int>(
      o_.loader_threads ? o_.loader_threads : std::max<size_t>(1, loader_plan_.loader_cpus.size()));
  b.misbound = o_.misbind_rank == p_.rank;
  b.simulated_delay_ms = o_.simulate_slow_rank == p_.rank ? o_.delay_ms : 0;
  b.simulated_phase = o_.slow_phase;
  const std::string j = BindingToJson(b);
  store_->set("binding/" + std::to_string(p_.rank), std::vector<uint8_t>(j.begin(), j.end()));
  if (p_.rank != 0) return;
  for (int r = 0; r < p_.world; ++r) {
    const std::vector<uint8_t> v = store_->get("binding/" + std::to_string(r));
    bindings_.push_back(BindingFromJson(std::string(v.begin(), v.end())));
  }
}

void Rank::SayPlan() const {
  Say("trainer: " + o_.model + ", " + std::to_string(p_.world) + " rank(s) x batch " + std::to_string(o_.batch_size) +
      ", " + std::to_string(schedule_.batches_per_epoch) + " steps an epoch, " +
      std::to_string(schedule_.total_steps) + " steps in all, image " + std::to_string(g_.model_size) +
      (g_.ring_size != g_.model_size ? " (resized on the device from " + std::to_string(g_.ring_size) + ")" : "") +
      ", device " + g_.device.str() + ", loader " + o_.loader + ", " + std::to_string(reducer_->buckets()) +
      " gradient bucket(s) reduced " + (o_.reduce == "overlap" ? "during" : "after") + " backward, backend " +
      comm_->backend_name());
  Say("trainer: ring bytes per image " + std::to_string(3 * g_.ring_size * g_.ring_size));
  Say("trainer: train transform " + DescribeTransform(o_.transform) + "; eval transform " +
      (o_.eval_transform == "center-crop"
           ? "resize shorter side to " + std::to_string(std::lround(g_.ring_size / 0.875)) + ", centre crop"
           : std::string("squash")) +
      " (--augment, --pad-crop, --random-resized-crop, --no-flip, --eval-transform choose them)");
}

void Rank::TrainEpoch(int64_t epoch) {
  EpochState ep;
  ep.epoch = epoch;
  const int64_t bpe = static_cast<int64_t>(schedule_.batches_per_epoch);
  if (p_.rank == 0) {
    ep.bar = std::make_unique<Progress>("Train Epoch " + std::to_string(epoch), bpe, StderrIsTerminal(),
                                        o_.report_every, stderr);
  }
  ep.start = ep.last_end = Clock::now();
  ep.next_batch = epoch == at_.epoch ? at_.batch : 0;
  for (; ep.next_batch < bpe; ++ep.next_batch) {
    if (!TrainStep(ep, ep.next_batch)) {
      stop_ = true;
      break;
    }
  }
  EndEpoch(ep);
}

bool Rank::TrainStep(EpochState& ep, int64_t b) {
  if (o_.max_steps > 0 && step_ >= o_.max_steps) return false;
  const auto t0 = Clock::now();
  double data_ms = 0;
  SetPhase(Phase::kData, step_ + 1);
  Batch batch = source_->Next(&data_ms);
  SetPhase(Phase::kCompute, step_ + 1);
  if (static_cast<int64_t>(batch.epoch) != ep.epoch || static_cast<int64_t>(batch.batch) != b) {
    throw RankError("the loader delivered epoch " + std::to_string(batch.epoch) + " batch " +
                    std::to_string(batch.batch) + " where epoch " + std::to_string(ep.epoch) + " batch " +
                    std::to_string(b) + " was due");
  }
  double l = 0;
  StepTimes t = ForwardBackwardStep(batch, t0, data_ms, &l);
  const auto end = Clock::now();
  t.step = Ms(ep.last_end, end);  // (the step, and whatever ran since the last one)
  ep.last_end = end;
  ++step_;
  if (!std::isfinite(l)) throw RankError("the loss is " + std::to_string(l) + " at step " + std::to_string(step_));
  if (o_.check_sync && p_.world > 1) CheckSync();
  // (The process's first step warms up: the loader's first batch, first
  // allocations; it is no stall.)
  const int64_t index = step_ > at_.step + 1 ? step_ : 0;
  ep.report.Add(t.data, t.compute, t.comm, t.allreduce, t.step, l, batch.size, index);
  ep.whole.Add(t.data, t.compute, t.comm, t.allreduce, t.step, l, batch.size, index);
  if (hb_) {
    const auto [frozen_ms, at] = hb_->TakeFrozen();
    if (frozen_ms > 0) {
      ep.report.NoteFrozen(static_cast<double>(frozen_ms), at);
      ep.whole.NoteFrozen(static_cast<double>(frozen_ms), at);
    }
  }
  ep.loss_sum += l;
  ++ep.loss_n;
  ep.images += batch.size;
  images_all_ += batch.size;
  if (ep.bar) ep.bar->Update(b + 1, l);
  if (o_.report_every > 0 && step_ % o_.report_every == 0) {
    Report(ep.epoch, step_, ep.report, false, nullptr);
    ep.report.Clear();
  }
  if (o_.checkpoint_every > 0 && step_ % o_.checkpoint_every == 0 && p_.rank == 0 && !o_.out.empty()) {
    Save(After(ep.epoch, b + 1));
    SetPhase(Phase::kCompute, step_);
  }
  return true;
}

// Forward, backward, the gradients' all-reduce (and buffers' broadcast), the
// optimizer's step; step_ is the step before this one.
StepTimes Rank::ForwardBackwardStep(const Batch& batch, Clock::time_point t0, double data_ms, double* loss_out) {
  const auto data_end = t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::milli>(data_ms));
  for (auto& g : opt_->param_groups()) {
    static_cast<torch::optim::SGDOptions&>(g.options())
        .lr(LearningRate(o_, step_, schedule_.schedule_steps, schedule_.warmup));
  }
  reducer_->Begin();  // (zeroes the gradients: they are views of its buckets)
  torch::Tensor logits = model_->forward(batch.x);
  torch::Tensor loss =
      F::cross_entropy(logits, batch.y, F::CrossEntropyFuncOptions().label_smoothing(o_.label_smoothing));
  loss.backward();  // (overlapped: buckets' all-reduces start from here)
  SyncComputeStream();
  if (o_.simulate_slow_rank == p_.rank && o_.slow_phase == "compute") {  // a slow device, on purpose
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(o_.delay_ms));
  }
  const auto t2 = Clock::now();
  const std::string n = std::to_string(step_ + 1);
  SetPhase(Phase::kComm, step_ + 1);
  const ReduceTimes rt = reducer_->Finish("the gradient all-reduce of step " + n);
  if (!buffers_.empty() && p_.world > 1) comm_->BroadcastCoalesced(buffers_, "the buffer broadcast of step " + n);
  SetPhase(Phase::kCompute, step_ + 1);
  SyncComputeStream();
  const auto t3 = Clock::now();
  opt_->step();
  *loss_out = loss.item<double>();
  const auto t4 = Clock::now();
  return {data_ms, Ms(data_end, t2), Ms(t2, t3), Ms(t0, t4), rt.allreduce_ms};
}

// Waits for the work queued on the rank's compute stream, for the step's
// timings: not the whole device, so all-reduces in flight on NCCL's own
// stream go on.
void Rank::SyncComputeStream() const {
#if NL_TRAINER_CUDA
  if (cuda_) c10::cuda::getCurrentCUDAStream(g_.device.index()).synchronize();
#endif
}

// --check-sync: every rank's parameters equal rank 0's after the step.
void Rank::CheckSync() {
  torch::Tensor h = torch::zeros({p_.world}, torch::kInt64);
  h[p_.rank] = static_cast<int64_t>(ParamHash(*model_));
  comm_->AllReduceSum(h, "the parameter check of step " + std::to_string(step_));
  for (int r = 1; r < p_.world; ++r) {
    if (h[r].item<int64_t>() != h[0].item<int64_t>()) {
      throw RankError("parameters differ between rank 0 and rank " + std::to_string(r) + " after step " +
                      std::to_string(step_));
    }
  }
  ++sync_checks_;
}

void Rank::EndEpoch(EpochState& ep) {
  if (ep.bar) ep.bar->Finish(ep.loss_n ? ep.loss_sum / static_cast<double>(ep.loss_n) : 0);
  const double epoch_s = std::chrono::duration<double>(Clock::now() - ep.start).count();
  int straggler = -1;
  Report(ep.epoch, step_, ep.whole, true, &straggler);
  SetPhase(Phase::kEval, step_);
  const auto [top1, top5] = Evaluate();
  SetPhase(Phase::kComm, step_);
  torch::Tensor agg = torch::tensor({ep.loss_sum, static_cast<double>(ep.loss_n), static_cast<double>(ep.images)},
                                    torch::kFloat64);
  comm_->AllReduceSum(agg, "the epoch's loss reduce");
  if (p_.rank != 0) return;
  EpochRecord e;
  e.epoch = ep.epoch;
  e.train_loss = agg[1].item<double>() > 0 ? agg[0].item<double>() / agg[1].item<double>() : 0;
  e.test_top1 = top1;
  e.test_top5 = top5;
  e.evaluated = top1 >= 0;
  e.images_per_s = epoch_s > 0 ? agg[2].item<double>() / epoch_s : 0;
  e.straggler = straggler;
  e.steps = step_;
  WriteMetrics(EpochJsonLine(e));
  SayEpoch(e, top1, top5);
  if (!o_.out.empty()) Save(After(ep.epoch, ep.next_batch));
}

void Rank::SayEpoch(const EpochRecord& e, double top1, double top5) {
  char line[256];
  if (e.evaluated) {
    std::snprintf(line, sizeof line, "epoch %lld: train loss %.4f, %s top-1 %.2f%%, top-5 %.2f%%, %.1f images/s",
                  static_cast<long long>(e.epoch), e.train_loss, o_.eval_split.c_str(), 100 * top1, 100 * top5,
                  e.images_per_s);
  } else {
    const std::string why =
        o_.eval_split == "none" ? "not evaluated: --eval-split none" : "no " + o_.eval_split + " split to evaluate";
    std::snprintf(line, sizeof line, "epoch %lld: train loss %.4f (%s), %.1f images/s", static_cast<long long>(e.epoch),
                  e.train_loss, why.c_str(), e.images_per_s);
  }
  Say(line);
}

void Rank::Finish() {
  if (o_.check_sync && p_.rank == 0 && p_.world > 1) {
    Say("parameters identical on all ranks after every step (" + std::to_string(sync_checks_) + " checks)");
  }
  if (p_.rank == 0 && !o_.params_out.empty()) {
    std::string bytes;
    for (auto& p : model_->parameters()) {
      torch::Tensor c = p.detach().to(torch::kCPU, torch::kFloat32).contiguous();
      bytes.append(static_cast<const char*>(c.data_ptr()), static_cast<size_t>(c.numel()) * 4);
    }
    WriteAtomically(o_.params_out, bytes);
  }
  // Everyone is done before anyone leaves (a rank still in a collective
  // would otherwise see its peer vanish).
  const double loader_cpu_s = source_->Finish();
  torch::Tensor done = torch::tensor({loader_cpu_s, static_cast<double>(images_all_)}, torch::kFloat64);
  SetPhase(Phase::kComm, step_);
  comm_->AllReduceSum(done, "the final reduce");
  SetPhase(Phase::kDone, step_);
  source_.reset();
  if (p_.rank == 0 && done[1].item<double>() > 0) {
    char line[256];
    std::snprintf(line, sizeof line, "trainer: loader CPU time %.1f us per image (%s, all ranks), ring bytes per image %d",
                  1e6 * done[0].item<double>() / done[1].item<double>(),
                  o_.loader == "service" ? "the loader services' processes" : "the pipelines' workers",
                  3 * g_.ring_size * g_.ring_size);
    Say(line);
  }
  metrics_.reset();
  if (p_.rank == 0) Say("trainer: done, " + std::to_string(step_) + " steps");
}

// A line is written whole or not at all: a failed write (a full disk) is cut
// back to the last whole line, said once, and the run goes on without
// metrics (they are not worth the training).
void Rank::WriteMetrics(const std::string& lines) {
  if (!metrics_) return;
  const int fd = fileno(metrics_.get());
  struct stat st {};
  const bool sized = fstat(fd, &st) == 0;
  size_t done = 0;
  int err = 0;
  while (done < lines.size()) {
    const ssize_t n = ::write(fd, lines.data() + done, lines.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      err = n < 0 ? errno : ENOSPC;
      break;
    }
    done += static_cast<size_t>(n);
  }
  if (err == 0) return;
  const bool cut = sized && ftruncate(fd, st.st_size) == 0;
  metrics_.reset();
  Say("trainer: cannot write --metrics-out " + o_.metrics_out + ": " + std::strerror(err) + "; " +
      (cut ? "it ends at its last whole line" : "its last line may be cut") +
      ", and the run goes on without metrics");
}

void Rank::Report(int64_t epoch, int64_t step, const Window& w, bool epoch_end, int* straggler) {
  const uint64_t ran = job_.plan.binds ? LoaderNodes(source_->loader_pid(), job_.topology) : 0;
  std::vector<RankTiming> t = GatherTimings(*comm_, p_.rank, w, ran);
  if (p_.rank != 0) return;
  const Verdict v = Diagnose(t, bindings_, previous_stragglers_);
  if (epoch_end) previous_stragglers_.push_back(v.straggler);
  if (straggler) *straggler = v.straggler;
  if (!epoch_end && StderrIsTerminal()) {  // below the progress bar's line, not on it
    std::fputc('\n', stderr);
    std::fflush(stderr);
  }
  Say(std::string(epoch_end ? "== epoch " + std::to_string(epoch) + " (whole epoch)"
                            : "== epoch " + std::to_string(epoch) + ", step " + std::to_string(step)) +
      ": per-rank time per step (ms)");
  std::string table = FormatTable(t, bindings_);
  if (!table.empty() && table.back() == '\n') table.pop_back();
  Say(table);
  if (v.straggler >= 0) {
    Say("straggler: " + v.sentence);
    if (!v.waiting.empty()) Say("straggler: " + v.waiting);
  } else if (p_.world > 1) {
    Say("straggler: none (no rank's data wait or compute stands out: the rules are a data wait over 2x the "
        "others' median, a compute over 1.5x, each over 10% of its step)");
  }
  for (const std::string& s : DescribeStalls(t)) Say("stall: " + s);
  WriteMetrics(ReportJsonLines(epoch, step, t));
  if (epoch_end) WriteChart(epoch, t, v.straggler);
}

void Rank::WriteChart(int64_t epoch, const std::vector<RankTiming>& t, int straggler) {
  const std::string dir = !o_.metrics_out.empty() ? DirOf(o_.metrics_out) : o_.out;
  if (dir.empty()) return;
  const std::string path = dir + "/timing-epoch-" + std::to_string(epoch) + ".svg";
  try {
    WriteAtomically(path, ChartSvg("Epoch " + std::to_string(epoch) + ": where each rank's step time went", t,
                                   straggler));
  } catch (const RankError& e) {  // a chart is not worth the training either
    Say(std::string("trainer: ") + e.what() + "; the run goes on without this chart");
    return;
  }
  Say("chart: " + path);
}

std::pair<double, double> Rank::Evaluate() {
  const SplitInfo* split = manifest_.FindSplit(o_.eval_split);
  if (!split) return {-1, -1};
  PipelineConfig c = InprocessConfig(o_.eval_split);
  c.prefetch = 2;
  c.shuffle = false;
  c.epochs = 1;
  c.transform.train = false;
  c.transform.decode = DecodeMode::kExact;  // the eval transform's (--decode shapes training's)
  if (o_.eval_transform == "center-crop") {  // torchvision's Resize(S / 0.875) + CenterCrop(S)
    c.transform.resize = ResizeMode::kShorterCrop;
    c.transform.resize_size = static_cast<int>(std::lround(g_.ring_size / 0.875));
  }
  std::unique_ptr<Pipeline> pipe = Take(Pipeline::Open(c), "cannot open the " + o_.eval_split + " split");
  torch::NoGradGuard ng;
  model_->eval();
  const int64_t k = std::min<int64_t>(5, static_cast<int64_t>(manifest_.classes.size()));
  const uint64_t n = split->num_samples;
  double top1 = 0, top5 = 0, count = 0;
  uint64_t k_th = 0;  // this rank's sample counter (position rank + k*world)
  while (true) {
    Result<BatchView> v = pipe->Next();
    if (!v.ok()) {
      if (v.status().code() == StatusCode::kOutOfRange) break;
      Check(v.status(), "evaluating on " + o_.eval_split);
    }
    Batch b = FromHost(v->pixels, v->labels, v->size, g_);
    Check(pipe->Release(*v), "releasing an evaluation batch");
    torch::Tensor pred = std::get<1>(model_->forward(b.x).topk(k, 1));
    torch::Tensor hit = pred.eq(b.y.unsqueeze(1)).to(torch::kCPU);
    auto h = hit.accessor<bool, 2>();
    for (uint32_t i = 0; i < b.size; ++i, ++k_th) {
      // Padding (positions past the split's end repeat samples): not counted.
      if (static_cast<uint64_t>(p_.rank) + k_th * static_cast<uint64_t>(p_.world) >= n) continue;
      bool any = false;
      for (int64_t j = 0; j < k; ++j) any = any || h[i][j];
      top1 += h[i][0] ? 1 : 0;
      top5 += any ? 1 : 0;
      count += 1;
    }
  }
  model_->train();
  torch::Tensor t = torch::tensor({top1, top5, count}, torch::kFloat64);
  comm_->AllReduceSum(t, "the evaluation's reduce");
  const double total = t[2].item<double>();
  return {total > 0 ? t[0].item<double>() / total : 0, total > 0 ? t[1].item<double>() / total : 0};
}

}  // namespace

int RunRank(const Options& options, const Placement& placement) {
  InstallSignalHandlers();
  std::string message;
  proc::FailureKind kind = proc::FailureKind::kOwn;
  try {
    Rank r(options, placement);
    return r.Run();
  } catch (const RankError& e) {
    message = e.what();
    kind = e.kind();
  } catch (const std::exception& e) {
    // An exception no step turned into a RankError (a store call, say): an
    // echo when it is a timeout or a lost connection.
    message = FailureText(e);
    kind = ClassifyCommFailure(e) == CommFailure::kOther ? proc::FailureKind::kOwn : proc::FailureKind::kEcho;
  }
  std::fprintf(stderr, "trainer rank %d: error: %s\n", placement.rank, message.c_str());
  proc::WriteFailureReport(placement.failure_fd, kind, message);
  return 1;
}

}  // namespace nl::trainer
