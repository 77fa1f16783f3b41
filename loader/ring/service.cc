#include "loader/ring/service.h"

#include <poll.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <iostream>
#include <thread>

#include "base/mutex.h"
#include "base/thread.h"
#include "formats/manifest.h"
#include "loader/pipeline/sampler.h"
#include "loader/ring/producer.h"
#include "loader/ring/ring_layout.h"

namespace nl {
namespace {

using Clock = std::chrono::steady_clock;

// The pipeline's buffer i is ring slot (base + i) % K, so that its batch g
// lands in the slot of ring position base + g.
class SlotSource : public BufferSource {
 public:
  SlotSource(const RingProducer* p, uint64_t base) : p_(p), base_(base) {}
  size_t count() const override { return p_->slot_count(); }
  BatchBuffer buffer(size_t i) const override {
    return p_->slot_buffer(static_cast<uint32_t>((base_ + i) % p_->slot_count()));
  }

 private:
  const RingProducer* p_;
  uint64_t base_;
};

// The ring's error text, for the crash handler: a producer that crashes
// (SIGSEGV, SIGABRT, ...) says so to its consumer before it dies.
std::atomic<char*> g_error_text{nullptr};
struct sigaction g_previous[32];
constexpr int kCrashSignals[] = {SIGSEGV, SIGBUS, SIGABRT, SIGFPE, SIGILL};

extern "C" void OnCrash(int sig, siginfo_t* info, void* context) {
  if (char* text = g_error_text.load()) {
    const char* name = sig == SIGSEGV   ? "SIGSEGV"
                       : sig == SIGBUS  ? "SIGBUS"
                       : sig == SIGABRT ? "SIGABRT"
                       : sig == SIGFPE  ? "SIGFPE"
                                        : "SIGILL";
    static const char kHead[] = "crashed with ";
    static const char kTail[] = " (see its standard error)";
    size_t n = 0;
    for (const char* p : {kHead, name, kTail}) {
      for (; *p != '\0' && n + 1 < ring::kErrorBytes; ++p) text[n++] = *p;
    }
    text[n] = '\0';
  }
  // Whatever handled it before (the shard reader's SIGBUS naming, a
  // sanitizer, the default) runs next: once this returns, a fault happens
  // again; a signal that was sent is raised again.
  ::sigaction(sig, &g_previous[sig], nullptr);
  if (info == nullptr || info->si_code <= 0) ::raise(sig);
  (void)context;
}

void InstallCrashReport(char* error_text) {
  g_error_text = error_text;
  for (int sig : kCrashSignals) {
    struct sigaction sa {};
    sa.sa_sigaction = OnCrash;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    ::sigaction(sig, &sa, &g_previous[sig]);
  }
}

void RemoveCrashReport() {
  for (int sig : kCrashSignals) ::sigaction(sig, &g_previous[sig], nullptr);
  g_error_text = nullptr;
}

std::string SignalName(int sig) {
  if (sig == SIGINT) return "SIGINT";
  if (sig == SIGTERM) return "SIGTERM";
  const char* s = strsignal(sig);
  return s ? s : "signal " + std::to_string(sig);
}

// The ring's shape, from the split and the transform.
struct RingShape {
  uint64_t batches_per_epoch = 0;
  ring::Geometry geometry;
};

Result<RingShape> ShapeOfRing(const PipelineConfig& pc) {
  NL_ASSIGN_OR_RETURN(const Manifest manifest, LoadManifest(pc.data_dir));
  const SplitInfo* split = manifest.FindSplit(pc.split);
  if (split == nullptr) {
    return Status::NotFound("split '" + pc.split + "' is not in " + pc.data_dir);
  }
  NL_ASSIGN_OR_RETURN(const DistributedSampler sampler,
                      DistributedSampler::Create(SamplerConfigFor(pc, split->num_samples)));
  RingShape shape;
  shape.batches_per_epoch = sampler.batches_per_epoch();
  const uint64_t bpe = shape.batches_per_epoch;
  if (bpe == 0)
    return Status::InvalidArgument("rank " + std::to_string(pc.rank) + " has no batches");
  if (pc.start_batch >= bpe) {
    return Status::InvalidArgument("start batch " + std::to_string(pc.start_batch) +
                                   " is past the " + std::to_string(bpe) + " batches of an epoch");
  }
  const TransformConfig& t = pc.transform;
  NL_RETURN_IF_ERROR(
      CheckBufferMemory(pc.prefetch, pc.batch_size, SampleTransform(t).SampleBytes()));
  NL_ASSIGN_OR_RETURN(
      shape.geometry,
      ring::MakeGeometry(
          pc.prefetch, pc.batch_size, static_cast<uint32_t>(t.image_size),
          static_cast<uint32_t>(t.image_size),
          t.normalize ? ring::Dtype::kFloat32 : ring::Dtype::kUint8,
          t.layout == Layout::kNHWC ? ring::PixelLayout::kNHWC : ring::PixelLayout::kNCHW));
  if (shape.geometry.sample_bytes != SampleTransform(t).SampleBytes()) {
    return Status::Internal("ring sample size differs from the transform's");
  }
  return shape;
}

// One run of the service. Threads: the caller's (Run: the serve loop), the
// watcher (signals, the consumer's socket, second consumers) and the freer
// (slots the consumer freed, back to the pipeline). Both are started from
// the caller's thread, so they inherit its binding (the loader's cores).
class Service {
 public:
  Service(const ServiceConfig& cfg, ServiceReport* report)
      : cfg_(cfg),
        pc0_(cfg.pipeline),
        report_(report),
        who_("loader serve for job " + cfg.job_id + ", rank " + std::to_string(pc0_.rank) +
             " (pid " + std::to_string(::getpid()) + ")"),
        end_epoch_(pc0_.epochs ? pc0_.start_epoch + pc0_.epochs : 0) {}
  ~Service() {
    (void)StopThreads();  // Run() reported it; an early return has nothing to add
    if (crash_report_installed_) RemoveCrashReport();
  }
  Service(const Service&) = delete;
  Service& operator=(const Service&) = delete;

  Status Run() {
    NL_RETURN_IF_ERROR(Listen());
    NL_RETURN_IF_ERROR(StartWatcher());
    const auto start = Clock::now();
    Status st = WaitForConsumer();
    if (!st.ok()) return StoppedBeforeAttach(st);
    st = StartFreer();
    if (st.ok()) {
      st = Serve();
    } else {
      Fail(st);
    }
    const Status threads = StopThreads();
    report_->seconds = std::chrono::duration<double>(Clock::now() - start).count();
    return Outcome(st, threads);
  }

 private:
  struct Out {
    uint64_t position;
    BatchView view;
  };

  void Log(const std::string& line) const {
    if (cfg_.log) {
      cfg_.log(line);
    } else {
      std::cerr << line << "\n";
    }
  }
  // Ends the stream with an error the consumer reports.
  void Fail(const Status& st) { producer_->Finish(ring::ProducerState::kError, st.ToString()); }

  // Binds the socket and makes the ring; a crash from here on is told to
  // the consumer.
  Status Listen() {
    NL_ASSIGN_OR_RETURN(const RingShape shape, ShapeOfRing(pc0_));
    bpe_ = shape.batches_per_epoch;
    geometry_ = shape.geometry;
    RingSpec spec;
    spec.job_id = cfg_.job_id;
    spec.rank = pc0_.rank;
    spec.geometry = geometry_;
    spec.batches_per_epoch = bpe_;
    spec.epochs = pc0_.epochs;
    spec.first_epoch = pc0_.start_epoch;
    spec.first_batch = pc0_.start_batch;
    spec.log = cfg_.log;
    NL_ASSIGN_OR_RETURN(producer_, RingProducer::Create(spec));
    slots_ = producer_->slot_count();
    InstallCrashReport(producer_->header()->error);
    crash_report_installed_ = true;
    if (cfg_.on_listening) cfg_.on_listening();
    return Status::Ok();
  }

  // A failure of the watcher or the freer (an error, or an exception caught
  // here) stops the service: without them it would not see its consumer
  // die, or would not refill freed slots. Join() returns it.
  Status Guarded(const std::string& what, const std::function<Status()>& body) {
    const Status st = RunGuarded(body);
    if (!st.ok()) {
      Fail(st.WithContext(what));
      stop_ = true;
      cv_.NotifyAll();
    }
    return st;
  }

  Status StartWatcher() {
    NL_ASSIGN_OR_RETURN(watcher_, Thread::Start("nl-watch", [this] {
                          return Guarded("socket watcher", [this] { return Watch(); });
                        }));
    return Status::Ok();
  }

  // Signals, the consumer's connection (its close is the death notice), and
  // second consumers on the listening socket, until done_.
  Status Watch() {
    Clock::time_point gone_at{};
    while (!done_.load()) {
      NoticeStopSignal();
      pollfd fds[2] = {{-1, 0, 0}, {-1, 0, 0}};
      if (attached_.load()) {
        // Once the consumer is gone its socket polls ready at once: stop
        // watching it (no spinning while the serve loop winds down).
        if (!consumer_gone_.load()) fds[0] = {producer_->connection_fd(), POLLIN | POLLRDHUP, 0};
        fds[1] = {producer_->listen_fd(), POLLIN, 0};
      }
      ::poll(fds, 2, 50);
      if (attached_.load() && !consumer_gone_.load() && fds[0].revents != 0) {
        NoticeConsumerGone(&gone_at);
      }
      if (fds[1].revents & POLLIN) producer_->RefuseOne();
      if (consumer_gone_.load() && Clock::now() - gone_at > std::chrono::seconds(1)) {
        // The pipeline is stuck inside a batch (slow storage): nothing of
        // ours outlives the process (the segment and socket have no name).
        Log(who_ + ": the consumer is gone; exiting without waiting for the batch in progress");
        std::fflush(nullptr);
        std::_Exit(detached_.load() ? 0 : 1);
      }
    }
    return Status::Ok();
  }

  void NoticeStopSignal() {
    const int sig = cfg_.stop_signal ? cfg_.stop_signal->load() : 0;
    if (sig != 0 && stopped_by_.load() == 0) {
      stopped_by_ = sig;
      producer_->Finish(ring::ProducerState::kStopped, "stopped by " + SignalName(sig));
      stop_ = true;
      cv_.NotifyAll();
    }
  }

  void NoticeConsumerGone(Clock::time_point* gone_at) {
    bool said_bye = false;
    if (producer_->ConsumerGone(&said_bye)) {
      detached_ = said_bye;
      consumer_gone_ = true;
      stop_ = true;
      *gone_at = Clock::now();
      cv_.NotifyAll();
    }
  }

  Status WaitForConsumer() {
    NL_RETURN_IF_ERROR(producer_->WaitForConsumer(cfg_.attach_timeout_s, &stop_));
    report_->consumer_pid = producer_->consumer_pid();
    Log(who_ + ": consumer pid " + std::to_string(report_->consumer_pid) + " attached (" +
        std::to_string(slots_) + " slots of " + std::to_string(geometry_.slot_bytes >> 10) +
        " KiB)");
    attached_ = true;
    return Status::Ok();
  }

  Status StoppedBeforeAttach(const Status& waited) {
    const Status threads = StopThreads();
    if (stopped_by_.load() != 0) {
      return Status::Aborted(who_ + " was stopped by " + SignalName(stopped_by_.load()) +
                             " before a consumer attached");
    }
    if (!threads.ok()) return threads.WithContext(who_);
    return waited;
  }

  Status StartFreer() {
    NL_ASSIGN_OR_RETURN(freer_, Thread::Start("nl-free", [this] {
                          return Guarded("slot freer", [this] {
                            while (!freer_done_.load()) {
                              producer_->WaitForConsumerEvent(0.05);
                              GiveBackFreedSlots();
                            }
                            return Status::Ok();
                          });
                        }));
    return Status::Ok();
  }

  // Gives slots the consumer freed back to the pipeline at once, so it
  // refills while the consumer computes; wakes the serve loop (a seek).
  void GiveBackFreedSlots() {
    MutexLock lock(&mu_);
    for (auto it = outstanding_.begin(); it != outstanding_.end();) {
      if (producer_->IsFree(it->position)) {
        const Status st = pipeline_->Release(it->view);
        if (!st.ok()) Log(who_ + ": " + st.ToString());
        it = outstanding_.erase(it);
      } else {
        ++it;
      }
    }
    cv_.NotifyAll();
  }

  // Joins the freer, closes the pipeline, then joins the watcher (which
  // still sees a consumer go while the pipeline closes); the first failure
  // of either thread. Idempotent.
  Status StopThreads() {
    freer_done_ = true;
    Status st = freer_.Join();
    ClosePipeline();
    done_ = true;
    cv_.NotifyAll();
    const Status watched = watcher_.Join();
    return st.ok() ? watched : st;
  }

  // The serve loop, until the stream fails, the service is stopped, or the
  // consumer goes. Its error (the stream's), or ok.
  Status Serve() {
    result_ = OpenPipeline(pc0_.start_epoch, pc0_.start_batch);
    if (!result_.ok()) Fail(result_);
    while (result_.ok() && !stop_.load()) {
      const RingProducer::Request req = producer_->request();
      if (req.id != generation_.load()) {
        if (!Restart(req)) break;
      } else if (ended_) {
        MutexLock lock(&mu_);
        (void)cv_.WaitFor(&mu_, std::chrono::milliseconds(50));
      } else if (!WaitedForOldestSlot() && !ServeOneBatch()) {
        break;
      }
    }
    return result_;
  }

  Status OpenPipeline(uint64_t epoch, uint64_t batch) {
    PipelineConfig pc = pc0_;
    pc.start_epoch = epoch;
    pc.start_batch = batch;
    pc.epochs = end_epoch_ ? end_epoch_ - epoch : 0;
    auto src = std::make_unique<SlotSource>(producer_.get(), producer_->published());
    pc.buffers = src.get();
    NL_ASSIGN_OR_RETURN(auto p, Pipeline::Open(pc));
    if (!plan_said_) {  // once: a seek opens the pipeline again with the same plan
      Log(who_ + ": " + p->read_plan().summary);
      plan_said_ = true;
    }
    MutexLock lock(&mu_);
    source_ = std::move(src);
    pipeline_ = std::move(p);
    run_epoch_ = epoch;
    run_batch_ = batch;
    delivered_ = 0;
    return Status::Ok();
  }

  void ClosePipeline() {
    MutexLock lock(&mu_);
    pipeline_.reset();  // joins its workers: no one writes the slots after this
    source_.reset();
    outstanding_.clear();
  }

  // A seek: drops the batches in flight, takes back the ring, and opens a
  // pipeline at the position asked for. False when serving ends here.
  bool Restart(const RingProducer::Request& req) {
    ClosePipeline();
    producer_->SetActivity(ring::Activity::kRestarting, req.epoch, req.batch);
    if (!producer_->Reclaim(req.id, -1, &stop_).ok())
      return false;  // stopped, or the consumer is gone
    if (req.batch >= bpe_ ||
        (end_epoch_ && (req.epoch < pc0_.start_epoch || req.epoch >= end_epoch_))) {
      result_ = Status::InvalidArgument(
          "the consumer asked for epoch " + std::to_string(req.epoch) + ", batch " +
          std::to_string(req.batch) + ", outside what " + who_ + " serves");
      Fail(result_);
      return false;
    }
    generation_ = req.id;
    ended_ = false;
    result_ = OpenPipeline(req.epoch, req.batch);
    if (!result_.ok()) Fail(result_);
    return true;
  }

  // The pipeline writes its batch `delivered_` into the buffer of batch
  // delivered_ - K, so that one must be back (the consumer may release out
  // of order: a count of outstanding batches is not enough). True when it
  // is not, after waiting a slice for it.
  bool WaitedForOldestSlot() {
    MutexLock lock(&mu_);
    if (outstanding_.empty() || outstanding_.front().view.sequence + slots_ > delivered_) {
      full_since_ = {};
      warned_ = false;
      return false;
    }
    if (full_since_ == Clock::time_point{}) full_since_ = Clock::now();
    producer_->SetActivity(ring::Activity::kWaitingForSlot);
    (void)cv_.WaitFor(&mu_, std::chrono::milliseconds(50));
    const double held_s = std::chrono::duration<double>(Clock::now() - full_since_).count();
    if (!warned_ && cfg_.stall_warning_s >= 0 && held_s > cfg_.stall_warning_s) {
      warned_ = true;
      Log(who_ + ": the consumer (pid " + std::to_string(report_->consumer_pid) +
          ") has held all " + std::to_string(slots_) + " slots for " +
          std::to_string(static_cast<int>(held_s)) + " s without releasing one");
    }
    return true;
  }

  // Fills the next batch and publishes it. False when serving ends here.
  bool ServeOneBatch() {
    const uint64_t pos = run_batch_ + delivered_;
    // Before the simulated delay: a consumer that gives up waiting learns
    // which batch was in the making (not a stale "waiting for a consumer").
    producer_->SetActivity(ring::Activity::kFilling, run_epoch_ + pos / bpe_, pos % bpe_);
    if (!SimulateDelay()) return true;  // stopped: the loop sees it
    Pipeline* pipeline;
    {
      MutexLock lock(&mu_);
      pipeline = pipeline_.get();  // reset by this thread only: it stays valid here
    }
    Result<BatchView> view = pipeline->Next();
    if (!view.ok()) {
      if (view.status().code() == StatusCode::kOutOfRange) {
        producer_->Finish(ring::ProducerState::kEnd, "");
        Log(who_ + ": served its last epoch (" + std::to_string(end_epoch_ - 1) +
            "); waiting for the consumer to seek or detach");
        ended_ = true;
        return true;
      }
      result_ = view.status();
      Fail(result_);
      return false;
    }
    ++delivered_;
    return Publish(*view);
  }

  // A deliberately slow loader (--simulate-delay-ms). False when stopped
  // during the delay.
  bool SimulateDelay() {
    if (cfg_.delay_per_batch_ms <= 0) return true;
    const auto until =
        Clock::now() + std::chrono::duration<double, std::milli>(cfg_.delay_per_batch_ms);
    while (!stop_.load() && Clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return !stop_.load();
  }

  bool Publish(const BatchView& view) {
    MutexLock lock(&mu_);
    const uint64_t position = producer_->published();
    BatchMeta meta;
    meta.sequence = view.sequence;
    meta.epoch = view.epoch;
    meta.batch = view.batch;
    meta.size = view.size;
    const Status published = producer_->Publish(meta, generation_.load());
    if (!published.ok()) {
      if (!consumer_gone_.load()) result_ = published;
      return false;
    }
    outstanding_.push_back({position, view});
    ++report_->batches;
    report_->images += view.size;
    return true;
  }

  // What the run comes to, after the threads have stopped: the stream's
  // error, a thread's failure, a stop signal, or how the consumer left.
  Status Outcome(const Status& served, const Status& threads) {
    // The serve loop may have seen the consumer go before the watcher did.
    bool said_bye = false;
    if (!consumer_gone_.load() && producer_->ConsumerGone(&said_bye)) {
      consumer_gone_ = true;
      detached_ = said_bye;
    }
    report_->detached = detached_.load();
    if (!served.ok()) return served.WithContext(who_);
    if (!threads.ok()) return threads.WithContext(who_);
    if (stopped_by_.load() != 0) {
      return Status::Aborted(who_ + " was stopped by " + SignalName(stopped_by_.load()));
    }
    const std::string consumer = "the consumer (pid " + std::to_string(report_->consumer_pid) + ")";
    if (consumer_gone_.load() && !detached_.load() && !producer_->refusal().empty()) {
      return Status::FailedPrecondition(who_ + ": " + consumer +
                                        " refused the ring: " + producer_->refusal());
    }
    if (consumer_gone_.load() && !detached_.load()) {
      return Status::Unavailable(who_ + ": " + consumer +
                                 " went away without detaching (killed, or crashed); " +
                                 std::to_string(report_->batches) + " batches were served");
    }
    return Status::Ok();
  }

  const ServiceConfig& cfg_;
  const PipelineConfig& pc0_;
  ServiceReport* report_;
  const std::string who_;
  const uint64_t end_epoch_;
  uint64_t bpe_ = 0;
  ring::Geometry geometry_;
  uint32_t slots_ = 0;
  std::unique_ptr<RingProducer> producer_;
  bool crash_report_installed_ = false;

  std::atomic<bool> stop_{false}, attached_{false}, done_{false}, consumer_gone_{false};
  std::atomic<bool> detached_{false}, freer_done_{false};
  std::atomic<int> stopped_by_{0};
  std::atomic<uint64_t> generation_{0};
  Mutex mu_;
  CondVar cv_;
  std::unique_ptr<SlotSource> source_ NL_GUARDED_BY(mu_);
  std::unique_ptr<Pipeline> pipeline_ NL_GUARDED_BY(mu_);
  std::deque<Out> outstanding_ NL_GUARDED_BY(mu_);  // published, not yet given back to the pipeline

  // The serve loop's own state (its thread only).
  Status result_;
  uint64_t run_epoch_ = 0, run_batch_ = 0, delivered_ = 0;
  bool ended_ = false, warned_ = false;
  bool plan_said_ = false;  // the read plan was logged (the service thread only)
  Clock::time_point full_since_{};

  Thread watcher_, freer_;  // last: joined (~Service) before the state they use goes
};

}  // namespace

Status RunService(const ServiceConfig& cfg, ServiceReport* report) {
  ServiceReport local_report;
  Service service(cfg, report != nullptr ? report : &local_report);
  return service.Run();
}

}  // namespace nl
