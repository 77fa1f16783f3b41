// staging_bench: host-to-device bandwidth of ring slots through the Stager,
// against a plain pinned cudaMemcpy of the same bytes, in one run.
//
// A producer thread in this process publishes batches into a ring (the slots
// are filled once up front, so the producer never limits the rate); the
// Stager copies each batch into device memory and hands the slot back. The
// baseline copies the same number of bytes per batch from a cudaMallocHost
// buffer with cudaMemcpy. Target: the Stager keeps at least 90% of it.
//
//   staging_bench [--batch 256] [--height 224] [--width 224] [--iterations 200]
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

#include "base/thread.h"
#include "loader/cli/option_table.h"
#include "loader/ring/client.h"
#include "loader/ring/producer.h"
#include "loader/staging/staging.h"

namespace {

struct Args {
  uint32_t batch = 256, height = 224, width = 224;
  uint32_t iterations = 200, warmup = 20;
  uint32_t slots = 4, device_buffers = 2;
  int device = -1;
};

using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

nl::Status CudaCheck(cudaError_t rc, const char* call) {
  if (rc == cudaSuccess) return nl::Status::Ok();
  return nl::Status::Internal(std::string("staging_bench: ") + call + ": " + cudaGetErrorName(rc) +
                              ": " + cudaGetErrorString(rc));
}

// The ring's producer side, on its own thread: publishes `count` batches of
// whatever the slots hold (filled once at construction).
class BenchProducer {
 public:
  static nl::Result<std::unique_ptr<BenchProducer>> Start(const Args& a, uint64_t count,
                                                          const std::string& job_id) {
    nl::RingSpec spec;
    spec.job_id = job_id;
    spec.batches_per_epoch = count;
    spec.epochs = 1;
    NL_ASSIGN_OR_RETURN(spec.geometry, nl::ring::MakeGeometry(a.slots, a.batch, a.height, a.width,
                                                              nl::ring::Dtype::kUint8,
                                                              nl::ring::PixelLayout::kNCHW));
    std::unique_ptr<BenchProducer> p(new BenchProducer);
    NL_ASSIGN_OR_RETURN(p->ring_, nl::RingProducer::Create(spec));
    const uint64_t pixel_bytes = uint64_t{a.batch} * spec.geometry.sample_bytes;
    for (uint32_t s = 0; s < a.slots; ++s) {
      nl::BatchBuffer b = p->ring_->slot_buffer(s);
      for (uint64_t k = 0; k < pixel_bytes; ++k) b.pixels[k] = static_cast<uint8_t>(k * 7 + s);
      for (uint32_t i = 0; i < a.batch; ++i) b.labels[i] = b.indices[i] = i;
    }
    NL_ASSIGN_OR_RETURN(p->thread_, nl::Thread::Start("nl-bench-prod", [q = p.get(), count, batch = a.batch] {
                          q->Run(count, batch);
                          return nl::Status::Ok();
                        }));
    return p;
  }
  ~BenchProducer() {
    stop_ = true;
    (void)thread_.Join();
  }

 private:
  BenchProducer() = default;
  void Run(uint64_t count, uint32_t batch) {
    // A failure reaches the consumer as the ring's error text.
    const nl::Status s = Loop(count, batch);
    ring_->Finish(s.ok() ? nl::ring::ProducerState::kEnd : nl::ring::ProducerState::kError,
                  s.ok() ? "" : s.ToString());
    while (!stop_ && !ring_->ConsumerGone()) ring_->WaitForConsumerEvent(0.1);
  }
  nl::Status Loop(uint64_t count, uint32_t batch) {
    NL_RETURN_IF_ERROR(ring_->WaitForConsumer(60.0, &stop_));
    for (uint64_t i = 0; i < count; ++i) {
      NL_RETURN_IF_ERROR(ring_->WaitForFreeSlot(60.0, &stop_));
      nl::BatchMeta meta;
      meta.sequence = i;
      meta.batch = i;
      meta.size = batch;
      NL_RETURN_IF_ERROR(ring_->Publish(meta, ring_->request().id));
    }
    return nl::Status::Ok();
  }

  std::unique_ptr<nl::RingProducer> ring_;
  std::atomic<bool> stop_{false};
  nl::Thread thread_;
};

// Bytes one batch moves: pixels, labels and indices.
uint64_t BatchBytes(const Args& a) {
  return uint64_t{a.batch} * (uint64_t{3} * a.height * a.width + 2 * sizeof(int64_t));
}

// The baseline: plain cudaMemcpy from one pinned buffer, batch after batch.
nl::Result<double> PinnedMemcpyGBps(const Args& a) {
  const uint64_t bytes = BatchBytes(a);
  void* host = nullptr;
  void* dev = nullptr;
  NL_RETURN_IF_ERROR(CudaCheck(cudaMallocHost(&host, bytes), "cudaMallocHost"));
  std::unique_ptr<void, void (*)(void*)> host_owner(host, [](void* p) { (void)cudaFreeHost(p); });
  NL_RETURN_IF_ERROR(CudaCheck(cudaMalloc(&dev, bytes), "cudaMalloc"));
  std::unique_ptr<void, void (*)(void*)> dev_owner(dev, [](void* p) { (void)cudaFree(p); });
  std::memset(host, 1, bytes);
  for (uint32_t i = 0; i < a.warmup; ++i) {
    NL_RETURN_IF_ERROR(
        CudaCheck(cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy"));
  }
  const auto t0 = Clock::now();
  for (uint32_t i = 0; i < a.iterations; ++i) {
    NL_RETURN_IF_ERROR(
        CudaCheck(cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy"));
  }
  const double s = Seconds(t0, Clock::now());
  return static_cast<double>(bytes) * a.iterations / s / 1e9;
}

// Ring slots through the Stager: each batch is released at once (nothing
// reads it), so the copies queue back to back on the stager's stream.
nl::Result<double> StagerGBps(const Args& a, std::string* note) {
  const std::string job = "staging-bench-" + std::to_string(getpid());
  NL_ASSIGN_OR_RETURN(auto producer,
                      BenchProducer::Start(a, uint64_t{a.warmup} + a.iterations, job));
  NL_ASSIGN_OR_RETURN(auto client, nl::RingClient::Attach(job, 0, 30.0));
  nl::StagingOptions o;
  o.device = a.device;
  o.device_buffers = a.device_buffers;
  NL_ASSIGN_OR_RETURN(auto stager, nl::Stager::Create(client.get(), o));
  *note = stager->path_note();
  if (!stager->on_gpu()) {
    return nl::Status::FailedPrecondition("staging_bench: the Stager took the CPU path: " + *note);
  }
  auto run = [&](uint32_t n) -> nl::Status {
    for (uint32_t i = 0; i < n; ++i) {
      NL_ASSIGN_OR_RETURN(nl::StagedBatch b, stager->Next(60.0));
      NL_RETURN_IF_ERROR(stager->Release(b));
    }
    return stager->Synchronize();
  };
  NL_RETURN_IF_ERROR(run(a.warmup));
  const auto t0 = Clock::now();
  NL_RETURN_IF_ERROR(run(a.iterations));
  const double s = Seconds(t0, Clock::now());
  return static_cast<double>(BatchBytes(a)) * a.iterations / s / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app{"staging_bench: H2D GB/s from ring slots via the Stager against pinned cudaMemcpy"};
  nl::Add(&app, nl::opt::kBatchSize, &a.batch)->check(CLI::Range(1u, 4096u));
  app.add_option("--height", a.height, "Image height")->check(CLI::Range(1u, 4096u));
  app.add_option("--width", a.width, "Image width")->check(CLI::Range(1u, 4096u));
  app.add_option("--iterations", a.iterations, "Batches timed per method")
      ->check(CLI::Range(1u, 1000000u));
  app.add_option("--warmup", a.warmup, "Batches copied before timing")
      ->check(CLI::Range(0u, 10000u));
  app.add_option("--slots", a.slots, "Ring slots")->check(CLI::Range(2u, 64u));
  app.add_option("--device-buffers", a.device_buffers, "The Stager's device buffers")
      ->check(CLI::Range(1u, nl::kMaxDeviceBuffers));
  app.add_option("--cuda-device", a.device, "CUDA device (-1: the current one)")
      ->check(CLI::Range(-1, 1024));
  CLI11_PARSE(app, argc, argv);

  int count = 0;
  cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc != cudaSuccess || count == 0) {
    std::printf("staging_bench: no CUDA device: nothing measured (cudaGetDeviceCount: %s)\n",
                rc != cudaSuccess ? cudaGetErrorString(rc) : "0 devices");
    return 0;
  }
  std::printf(
      "staging_bench: batch %u x 3x%ux%u uint8 (%.1f MB per batch with labels and "
      "indices), %u batches timed per method after %u warm-up\n",
      a.batch, a.height, a.width, static_cast<double>(BatchBytes(a)) / 1e6, a.iterations, a.warmup);
  nl::Result<double> base = PinnedMemcpyGBps(a);
  if (!base.ok()) {
    std::fprintf(stderr, "%s\n", base.status().ToString().c_str());
    return 1;
  }
  std::string note;
  nl::Result<double> staged = StagerGBps(a, &note);
  if (!note.empty()) std::printf("  %s\n", note.c_str());
  if (!staged.ok()) {
    std::fprintf(stderr, "%s\n", staged.status().ToString().c_str());
    return 1;
  }
  const double ratio = *staged / *base;
  std::printf("  pinned cudaMemcpy (baseline): %8.2f GB/s\n", *base);
  std::printf("  ring slots via Stager:        %8.2f GB/s\n", *staged);
  std::printf("  ratio: %.1f%% of the baseline (target >= 90%%): %s\n", ratio * 100.0,
              ratio >= 0.9 ? "met" : "NOT met");
  return 0;
}
