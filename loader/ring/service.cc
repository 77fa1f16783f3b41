#include "loader/ring/service.h"

#include <poll.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <deque>
#include <iostream>
#include <mutex>
#include <thread>

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

}  // namespace

Status RunService(const ServiceConfig& cfg, ServiceReport* report) {
  auto log = [&](const std::string& line) {
    if (cfg.log) {
      cfg.log(line);
    } else {
      std::cerr << line << "\n";
    }
  };
  ServiceReport local_report;
  if (report == nullptr) report = &local_report;
  const PipelineConfig& pc0 = cfg.pipeline;
  const std::string who = "loader serve for job " + cfg.job_id + ", rank " +
                          std::to_string(pc0.rank) + " (pid " + std::to_string(::getpid()) + ")";

  // The ring's shape, from the split and the transform.
  NL_ASSIGN_OR_RETURN(const Manifest manifest, LoadManifest(pc0.data_dir));
  const SplitInfo* split = manifest.FindSplit(pc0.split);
  if (split == nullptr) {
    return Status::NotFound("split '" + pc0.split + "' is not in " + pc0.data_dir);
  }
  SamplerConfig sc;
  sc.dataset_size = split->num_samples;
  sc.rank = pc0.rank;
  sc.world = pc0.world;
  sc.seed = pc0.seed;
  sc.shuffle = pc0.shuffle;
  sc.drop_last = pc0.drop_last;
  sc.batch_size = pc0.batch_size;
  sc.drop_last_batch = pc0.drop_last_batch;
  NL_ASSIGN_OR_RETURN(const DistributedSampler sampler, DistributedSampler::Create(sc));
  const uint64_t bpe = sampler.batches_per_epoch();
  if (bpe == 0) return Status::InvalidArgument("rank " + std::to_string(pc0.rank) + " has no batches");
  if (pc0.start_batch >= bpe) {
    return Status::InvalidArgument("start batch " + std::to_string(pc0.start_batch) +
                                   " is past the " + std::to_string(bpe) + " batches of an epoch");
  }
  const TransformConfig& t = pc0.transform;
  NL_RETURN_IF_ERROR(CheckBufferMemory(pc0.prefetch, pc0.batch_size, SampleTransform(t).SampleBytes()));
  NL_ASSIGN_OR_RETURN(
      const ring::Geometry geometry,
      ring::MakeGeometry(pc0.prefetch, pc0.batch_size, static_cast<uint32_t>(t.image_size),
                         static_cast<uint32_t>(t.image_size),
                         t.normalize ? ring::Dtype::kFloat32 : ring::Dtype::kUint8,
                         t.layout == Layout::kNHWC ? ring::PixelLayout::kNHWC
                                                   : ring::PixelLayout::kNCHW));
  if (geometry.sample_bytes != SampleTransform(t).SampleBytes()) {
    return Status::Internal("ring sample size differs from the transform's");
  }
  RingSpec spec;
  spec.job_id = cfg.job_id;
  spec.rank = pc0.rank;
  spec.geometry = geometry;
  spec.batches_per_epoch = bpe;
  spec.epochs = pc0.epochs;
  spec.first_epoch = pc0.start_epoch;
  spec.first_batch = pc0.start_batch;
  spec.log = cfg.log;
  NL_ASSIGN_OR_RETURN(std::unique_ptr<RingProducer> producer, RingProducer::Create(spec));
  const uint32_t slots = producer->slot_count();
  InstallCrashReport(producer->header()->error);
  struct Uninstall {
    ~Uninstall() { RemoveCrashReport(); }
  } uninstall;
  if (cfg.on_listening) cfg.on_listening();

  std::atomic<bool> stop{false}, attached{false}, done{false}, consumer_gone{false};
  std::atomic<bool> detached{false};
  std::atomic<int> stopped_by{0};
  std::atomic<uint64_t> generation{0};
  std::mutex mu;  // the pipeline, its source and `outstanding`
  std::condition_variable cv;
  std::unique_ptr<SlotSource> source;
  std::unique_ptr<Pipeline> pipeline;
  struct Out {
    uint64_t position;
    BatchView view;
  };
  std::deque<Out> outstanding;  // published, not yet given back to the pipeline

  // Watcher: signals, the consumer's connection (its close is the death
  // notice), and second consumers on the listening socket.
  std::thread watcher([&] {
    Clock::time_point gone_at{};
    while (!done.load()) {
      const int sig = cfg.stop_signal ? cfg.stop_signal->load() : 0;
      if (sig != 0 && stopped_by.load() == 0) {
        stopped_by = sig;
        producer->Finish(ring::ProducerState::kStopped, "stopped by " + SignalName(sig));
        stop = true;
        cv.notify_all();
      }
      pollfd fds[2] = {{-1, 0, 0}, {-1, 0, 0}};
      if (attached.load()) {
        // Once the consumer is gone its socket polls ready at once: stop
        // watching it (no spinning while the main loop winds down).
        if (!consumer_gone.load()) fds[0] = {producer->connection_fd(), POLLIN | POLLRDHUP, 0};
        fds[1] = {producer->listen_fd(), POLLIN, 0};
      }
      ::poll(fds, 2, 50);
      if (attached.load() && !consumer_gone.load() && fds[0].revents != 0) {
        bool said_bye = false;
        if (producer->ConsumerGone(&said_bye)) {
          detached = said_bye;
          consumer_gone = true;
          stop = true;
          gone_at = Clock::now();
          cv.notify_all();
        }
      }
      if (fds[1].revents & POLLIN) producer->RefuseOne();
      if (consumer_gone.load() && Clock::now() - gone_at > std::chrono::seconds(1)) {
        // The pipeline is stuck inside a batch (slow storage): nothing of
        // ours outlives the process (the segment and socket have no name).
        log(who + ": the consumer is gone; exiting without waiting for the batch in progress");
        std::fflush(nullptr);
        std::_Exit(detached.load() ? 0 : 1);
      }
    }
  });
  struct JoinAtEnd {
    std::atomic<bool>* done;
    std::thread* t;
    std::condition_variable* cv;
    ~JoinAtEnd() {
      done->store(true);
      cv->notify_all();
      if (t->joinable()) t->join();
    }
  };

  Status result;
  const auto start = Clock::now();
  {
    JoinAtEnd join_watcher{&done, &watcher, &cv};
    const Status waited = producer->WaitForConsumer(cfg.attach_timeout_s, &stop);
    if (!waited.ok()) {
      if (stopped_by.load() != 0) {
        return Status::Aborted(who + " was stopped by " + SignalName(stopped_by.load()) +
                               " before a consumer attached");
      }
      return waited;
    }
    report->consumer_pid = producer->consumer_pid();
    log(who + ": consumer pid " + std::to_string(report->consumer_pid) + " attached (" +
        std::to_string(slots) + " slots of " + std::to_string(geometry.slot_bytes >> 10) + " KiB)");
    attached = true;

    // Freer: gives slots the consumer freed back to the pipeline at once, so
    // it refills while the consumer computes; notices seeks.
    std::atomic<bool> freer_done{false};
    std::thread freer([&] {
      while (!freer_done.load()) {
        producer->WaitForConsumerEvent(0.05);
        std::lock_guard lock(mu);
        for (auto it = outstanding.begin(); it != outstanding.end();) {
          if (producer->IsFree(it->position)) {
            const Status st = pipeline->Release(it->view);
            if (!st.ok()) log(who + ": " + st.ToString());
            it = outstanding.erase(it);
          } else {
            ++it;
          }
        }
        cv.notify_all();
      }
    });
    struct JoinFreer {
      std::atomic<bool>* done;
      std::thread* t;
      ~JoinFreer() {
        done->store(true);
        if (t->joinable()) t->join();
      }
    } join_freer{&freer_done, &freer};

    const uint64_t end_epoch = pc0.epochs ? pc0.start_epoch + pc0.epochs : 0;
    uint64_t run_epoch = pc0.start_epoch, run_batch = pc0.start_batch, delivered = 0;
    auto open = [&](uint64_t epoch, uint64_t batch) -> Status {
      PipelineConfig pc = pc0;
      pc.start_epoch = epoch;
      pc.start_batch = batch;
      pc.epochs = end_epoch ? end_epoch - epoch : 0;
      auto src = std::make_unique<SlotSource>(producer.get(), producer->published());
      pc.buffers = src.get();
      NL_ASSIGN_OR_RETURN(auto p, Pipeline::Open(pc));
      std::lock_guard lock(mu);
      source = std::move(src);
      pipeline = std::move(p);
      run_epoch = epoch;
      run_batch = batch;
      delivered = 0;
      return Status::Ok();
    };
    auto close_pipeline = [&] {
      std::lock_guard lock(mu);
      pipeline.reset();  // joins its workers: no one writes the slots after this
      source.reset();
      outstanding.clear();
    };
    result = open(pc0.start_epoch, pc0.start_batch);
    if (!result.ok()) producer->Finish(ring::ProducerState::kError, result.ToString());
    bool ended = false;
    Clock::time_point full_since{};
    bool warned = false;
    while (result.ok() && !stop.load()) {
      const RingProducer::Request req = producer->request();
      if (req.id != generation.load()) {
        close_pipeline();
        producer->SetActivity(ring::Activity::kRestarting, req.epoch, req.batch);
        const Status st = producer->Reclaim(req.id, -1, &stop);
        if (!st.ok()) break;  // stopped, or the consumer is gone
        if (req.batch >= bpe ||
            (end_epoch && (req.epoch < pc0.start_epoch || req.epoch >= end_epoch))) {
          result = Status::InvalidArgument("the consumer asked for epoch " +
                                           std::to_string(req.epoch) + ", batch " +
                                           std::to_string(req.batch) + ", outside what " + who +
                                           " serves");
          producer->Finish(ring::ProducerState::kError, result.ToString());
          break;
        }
        generation = req.id;
        ended = false;
        result = open(req.epoch, req.batch);
        if (!result.ok()) {
          producer->Finish(ring::ProducerState::kError, result.ToString());
        }
        continue;
      }
      if (ended) {
        std::unique_lock lock(mu);
        cv.wait_for(lock, std::chrono::milliseconds(50));
        continue;
      }
      {
        std::unique_lock lock(mu);
        // The pipeline writes its batch `delivered` into the buffer of batch
        // delivered - K, so that one must be back. (The consumer may release
        // out of order: a count of outstanding batches is not enough.)
        if (!outstanding.empty() && outstanding.front().view.sequence + slots <= delivered) {
          if (full_since == Clock::time_point{}) full_since = Clock::now();
          producer->SetActivity(ring::Activity::kWaitingForSlot);
          cv.wait_for(lock, std::chrono::milliseconds(50));
          const double held_s = std::chrono::duration<double>(Clock::now() - full_since).count();
          if (!warned && cfg.stall_warning_s >= 0 && held_s > cfg.stall_warning_s) {
            warned = true;
            log(who + ": the consumer (pid " + std::to_string(report->consumer_pid) +
                ") has held all " + std::to_string(slots) + " slots for " +
                std::to_string(static_cast<int>(held_s)) + " s without releasing one");
          }
          continue;
        }
      }
      full_since = {};
      warned = false;
      const uint64_t pos = run_batch + delivered;
      // Before the simulated delay: a consumer that gives up waiting learns
      // which batch was in the making (not a stale "waiting for a consumer").
      producer->SetActivity(ring::Activity::kFilling, run_epoch + pos / bpe, pos % bpe);
      if (cfg.delay_per_batch_ms > 0) {  // a deliberately slow loader (--simulate-delay-ms)
        const auto until = Clock::now() + std::chrono::duration<double, std::milli>(
                                              cfg.delay_per_batch_ms);
        while (!stop.load() && Clock::now() < until) {
          std::this_thread::sleep_for(std::chrono::milliseconds(2));
        }
        if (stop.load()) continue;
      }
      Result<BatchView> view = pipeline->Next();
      if (!view.ok()) {
        if (view.status().code() == StatusCode::kOutOfRange) {
          producer->Finish(ring::ProducerState::kEnd, "");
          log(who + ": served its last epoch (" + std::to_string(end_epoch - 1) +
              "); waiting for the consumer to seek or detach");
          ended = true;
          continue;
        }
        result = view.status();
        producer->Finish(ring::ProducerState::kError, result.ToString());
        break;
      }
      ++delivered;
      std::lock_guard lock(mu);
      const uint64_t position = producer->published();
      BatchMeta meta;
      meta.sequence = view->sequence;
      meta.epoch = view->epoch;
      meta.batch = view->batch;
      meta.size = view->size;
      const Status published = producer->Publish(meta, generation.load());
      if (!published.ok()) {
        if (!consumer_gone.load()) result = published;
        break;
      }
      outstanding.push_back({position, *view});
      ++report->batches;
      report->images += view->size;
    }
    freer_done = true;
    if (freer.joinable()) freer.join();
    close_pipeline();
  }
  report->seconds = std::chrono::duration<double>(Clock::now() - start).count();
  {
    // The main loop may have seen the consumer go before the watcher did.
    bool said_bye = false;
    if (!consumer_gone.load() && producer->ConsumerGone(&said_bye)) {
      consumer_gone = true;
      detached = said_bye;
    }
  }
  report->detached = detached.load();
  if (!result.ok()) return result.WithContext(who);
  if (stopped_by.load() != 0) {
    return Status::Aborted(who + " was stopped by " + SignalName(stopped_by.load()));
  }
  if (consumer_gone.load() && !detached.load() && !producer->refusal().empty()) {
    return Status::FailedPrecondition(who + ": the consumer (pid " +
                                      std::to_string(report->consumer_pid) +
                                      ") refused the ring: " + producer->refusal());
  }
  if (consumer_gone.load() && !detached.load()) {
    return Status::Unavailable(who + ": the consumer (pid " + std::to_string(report->consumer_pid) +
                               ") went away without detaching (killed, or crashed); " +
                               std::to_string(report->batches) + " batches were served");
  }
  return Status::Ok();
}

}  // namespace nl
