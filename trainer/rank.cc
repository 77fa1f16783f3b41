#include "trainer/rank.h"

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
#include "loader/cli/option_table.h"
#include "trainer/batch_source.h"
#include "trainer/checkpoint.h"
#include "trainer/comm.h"
#include "trainer/comm_failure.h"
#include "trainer/diagnostics.h"
#include "trainer/grad_reducer.h"
#include "trainer/heartbeat.h"
#include "trainer/outputs.h"
#include "trainer/proc_info.h"
#include "trainer/progress.h"
#include "trainer/rank_error.h"
#include "trainer/rank_startup.h"
#include "trainer/schedule.h"
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

// One rank, in named steps: started (rank_startup.h), then TrainEpoch per
// epoch (TrainStep per batch, EndEpoch), then Finish.
class Rank {
 public:
  Rank(const Options& o, const Placement& p) : o_(s_.o), p_(s_.p) {
    StartRank(o, p, &s_);
    step_ = s_.at.step;
  }
  Rank(const Rank&) = delete;
  Rank& operator=(const Rank&) = delete;
  int Run();

 private:
  void TrainEpoch(int64_t epoch);
  // False when --max-steps stops the run before batch b.
  bool TrainStep(EpochState& ep, int64_t b);
  StepTimes ForwardBackwardStep(const Batch& batch, Clock::time_point t0, double data_ms, double* loss);
  void CheckSync();
  void SyncComputeStream() const;
  void EndEpoch(EpochState& ep);
  void SayEpoch(const EpochRecord& e, double top1, double top5);
  void Finish();

  void Report(int64_t epoch, int64_t step, const Window& w, bool epoch_end, int* straggler);
  void WriteChart(int64_t epoch, const std::vector<RankTiming>& t, int straggler);
  std::pair<double, double> Evaluate();
  void WriteMetrics(const std::string& lines);
  // The checkpoint after batch `done` of epoch (the next epoch's start after its last).
  Checkpoint After(int64_t epoch, int64_t done) const {
    return done == static_cast<int64_t>(s_.schedule.batches_per_epoch) ? s_.Describe(epoch + 1, 0, step_)
                                                                       : s_.Describe(epoch, done, step_);
  }
  void SetPhase(Phase ph, int64_t step) {
    if (s_.hb) s_.hb->Set(ph, step);
  }
  void Save(const Checkpoint& c) {
    SetPhase(Phase::kCheckpoint, c.step);
    SaveCheckpoint(o_.out + "/checkpoint.pt", *s_.model, *s_.opt, c);
  }

  StartedRank s_;
  const Options& o_;    // s_.o
  const Placement& p_;  // s_.p
  std::vector<int> previous_stragglers_;
  int64_t step_ = 0;
  int64_t images_all_ = 0;  // taken from the loader by this rank
  int64_t sync_checks_ = 0;
  bool stop_ = false;
};

int Rank::Run() {
  for (int64_t epoch = s_.at.epoch; epoch < o_.epochs && !stop_; ++epoch) TrainEpoch(epoch);
  Finish();
  return 0;
}

void Rank::TrainEpoch(int64_t epoch) {
  EpochState ep;
  ep.epoch = epoch;
  const int64_t bpe = static_cast<int64_t>(s_.schedule.batches_per_epoch);
  if (p_.rank == 0) {
    ep.bar = std::make_unique<Progress>("Train Epoch " + std::to_string(epoch), bpe, StderrIsTerminal(),
                                        o_.report_every, stderr);
  }
  ep.start = ep.last_end = Clock::now();
  ep.next_batch = epoch == s_.at.epoch ? s_.at.batch : 0;
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
  Batch batch = s_.source->Next(&data_ms);
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
  const int64_t index = step_ > s_.at.step + 1 ? step_ : 0;
  ep.report.Add(t.data, t.compute, t.comm, t.allreduce, t.step, l, batch.size, index);
  ep.whole.Add(t.data, t.compute, t.comm, t.allreduce, t.step, l, batch.size, index);
  if (s_.hb) {
    const auto [frozen_ms, at] = s_.hb->TakeFrozen();
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
  for (auto& g : s_.opt->param_groups()) {
    static_cast<torch::optim::SGDOptions&>(g.options())
        .lr(LearningRate(o_, step_, s_.schedule.schedule_steps, s_.schedule.warmup));
  }
  s_.reducer->Begin();  // (zeroes the gradients: they are views of its buckets)
  torch::Tensor logits = s_.model->forward(batch.x);
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
  const ReduceTimes rt = s_.reducer->Finish("the gradient all-reduce of step " + n);
  if (!s_.buffers.empty() && p_.world > 1) s_.comm->BroadcastCoalesced(s_.buffers, "the buffer broadcast of step " + n);
  SetPhase(Phase::kCompute, step_ + 1);
  SyncComputeStream();
  const auto t3 = Clock::now();
  s_.opt->step();
  *loss_out = loss.item<double>();
  const auto t4 = Clock::now();
  return {data_ms, Ms(data_end, t2), Ms(t2, t3), Ms(t0, t4), rt.allreduce_ms};
}

// Waits for the work queued on the rank's compute stream, for the step's
// timings: not the whole device, so all-reduces in flight on NCCL's own
// stream go on.
void Rank::SyncComputeStream() const {
#if NL_TRAINER_CUDA
  if (s_.g.device.is_cuda()) c10::cuda::getCurrentCUDAStream(s_.g.device.index()).synchronize();
#endif
}

// --check-sync: every rank's parameters equal rank 0's after the step.
void Rank::CheckSync() {
  torch::Tensor h = torch::zeros({p_.world}, torch::kInt64);
  h[p_.rank] = static_cast<int64_t>(ParamHash(*s_.model));
  s_.comm->AllReduceSum(h, "the parameter check of step " + std::to_string(step_));
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
  s_.comm->AllReduceSum(agg, "the epoch's loss reduce");
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
    for (auto& p : s_.model->parameters()) {
      torch::Tensor c = p.detach().to(torch::kCPU, torch::kFloat32).contiguous();
      bytes.append(static_cast<const char*>(c.data_ptr()), static_cast<size_t>(c.numel()) * 4);
    }
    WriteAtomically(o_.params_out, bytes);
  }
  // Everyone is done before anyone leaves (a rank still in a collective
  // would otherwise see its peer vanish).
  const double loader_cpu_s = s_.source->Finish();
  torch::Tensor done = torch::tensor({loader_cpu_s, static_cast<double>(images_all_)}, torch::kFloat64);
  SetPhase(Phase::kComm, step_);
  s_.comm->AllReduceSum(done, "the final reduce");
  SetPhase(Phase::kDone, step_);
  s_.source.reset();
  if (p_.rank == 0 && done[1].item<double>() > 0) {
    char line[256];
    std::snprintf(line, sizeof line, "trainer: loader CPU time %.1f us per image (%s, all ranks), ring bytes per image %d",
                  1e6 * done[0].item<double>() / done[1].item<double>(),
                  o_.loader == "service" ? "the loader services' processes" : "the pipelines' workers",
                  3 * s_.g.ring_size * s_.g.ring_size);
    Say(line);
  }
  s_.metrics.reset();
  if (p_.rank == 0) Say("trainer: done, " + std::to_string(step_) + " steps");
}

// A line is written whole or not at all: a failed write (a full disk) is cut
// back to the last whole line, said once, and the run goes on without
// metrics (they are not worth the training).
void Rank::WriteMetrics(const std::string& lines) {
  if (!s_.metrics) return;
  const int fd = fileno(s_.metrics.get());
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
  s_.metrics.reset();
  Say("trainer: cannot write --metrics-out " + o_.metrics_out + ": " + std::strerror(err) + "; " +
      (cut ? "it ends at its last whole line" : "its last line may be cut") +
      ", and the run goes on without metrics");
}

void Rank::Report(int64_t epoch, int64_t step, const Window& w, bool epoch_end, int* straggler) {
  const uint64_t ran = s_.job.plan.binds ? LoaderNodes(s_.source->loader_pid(), s_.job.topology) : 0;
  std::vector<RankTiming> t = GatherTimings(*s_.comm, p_.rank, w, ran);
  if (p_.rank != 0) return;
  const Verdict v = Diagnose(t, s_.bindings, previous_stragglers_);
  if (epoch_end) previous_stragglers_.push_back(v.straggler);
  if (straggler) *straggler = v.straggler;
  if (!epoch_end && StderrIsTerminal()) {  // below the progress bar's line, not on it
    std::fputc('\n', stderr);
    std::fflush(stderr);
  }
  Say(std::string(epoch_end ? "== epoch " + std::to_string(epoch) + " (whole epoch)"
                            : "== epoch " + std::to_string(epoch) + ", step " + std::to_string(step)) +
      ": per-rank time per step (ms)");
  std::string table = FormatTable(t, s_.bindings);
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
  const SplitInfo* split = s_.manifest.FindSplit(o_.eval_split);
  if (!split) return {-1, -1};
  PipelineConfig c = s_.InprocessConfig(o_.eval_split);
  c.prefetch = 2;
  c.shuffle = false;
  c.epochs = 1;
  c.transform.train = false;
  c.transform.decode = DecodeMode::kExact;  // the eval transform's (--decode shapes training's)
  if (o_.eval_transform == "center-crop") {  // torchvision's Resize(S / 0.875) + CenterCrop(S)
    c.transform.resize = ResizeMode::kShorterCrop;
    c.transform.resize_size = static_cast<int>(std::lround(s_.g.ring_size / 0.875));
  }
  std::unique_ptr<Pipeline> pipe = Take(Pipeline::Open(c), "cannot open the " + o_.eval_split + " split");
  torch::NoGradGuard ng;
  s_.model->eval();
  const int64_t k = std::min<int64_t>(5, static_cast<int64_t>(s_.manifest.classes.size()));
  const uint64_t n = split->num_samples;
  double top1 = 0, top5 = 0, count = 0;
  uint64_t k_th = 0;  // this rank's sample counter (position rank + k*world)
  while (true) {
    Result<BatchView> v = pipe->Next();
    if (!v.ok()) {
      if (v.status().code() == StatusCode::kOutOfRange) break;
      Check(v.status(), "evaluating on " + o_.eval_split);
    }
    Batch b = FromHost(v->pixels, v->labels, v->size, s_.g);
    Check(pipe->Release(*v), "releasing an evaluation batch");
    torch::Tensor pred = std::get<1>(s_.model->forward(b.x).topk(k, 1));
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
  s_.model->train();
  torch::Tensor t = torch::tensor({top1, top5, count}, torch::kFloat64);
  s_.comm->AllReduceSum(t, "the evaluation's reduce");
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
  // The libraries name options by their fields (`batch_size`): flags here.
  message = FlagText(message);
  std::fprintf(stderr, "trainer rank %d: error: %s\n", placement.rank, message.c_str());
  proc::WriteFailureReport(placement.failure_fd, kind, message);
  return 1;
}

}  // namespace nl::trainer
