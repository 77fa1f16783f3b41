#include "trainer/batch_source.h"

#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include <torch/nn/functional/upsampling.h>

#if NL_TRAINER_CUDA
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#endif

#include "base/clock.h"
#include "loader/ring/ring_socket.h"
#include "trainer/rank_error.h"

namespace nl::trainer {
namespace {

namespace F = torch::nn::functional;

std::string WithTail(const std::string& s, const std::string& tail) {
  return tail.empty() ? s : s + ": " + tail;
}

}  // namespace

torch::Tensor Normalize(torch::Tensor x, const Geometry& g) {
  if (g.ring_size != g.model_size) {
    x = F::interpolate(x, F::InterpolateFuncOptions()
                              .size(std::vector<int64_t>{g.model_size, g.model_size})
                              .mode(torch::kBilinear)
                              .align_corners(false));
  }
  static const float mean[3] = {0.485f, 0.456f, 0.406f}, stdv[3] = {0.229f, 0.224f, 0.225f};
  auto m = torch::tensor({mean[0] * 255, mean[1] * 255, mean[2] * 255}).view({1, 3, 1, 1});
  auto s = torch::tensor({stdv[0] * 255, stdv[1] * 255, stdv[2] * 255}).view({1, 3, 1, 1});
  return (x - m.to(g.device)) / s.to(g.device);
}

Batch FromHost(const void* pixels, const int64_t* labels, uint32_t n, const Geometry& g) {
  Batch b;
  auto u8 = torch::from_blob(const_cast<void*>(pixels), {n, 3, g.ring_size, g.ring_size},
                             torch::TensorOptions().dtype(torch::kUInt8));
  b.x = Normalize(u8.to(g.device, torch::kFloat32), g);
  b.y = torch::from_blob(const_cast<int64_t*>(labels), {n}, torch::TensorOptions().dtype(torch::kInt64))
            .to(g.device, /*non_blocking=*/false, /*copy=*/true);
  b.size = n;
  return b;
}

// ---- ServiceSource ----

ServiceSource::ServiceSource(const std::vector<std::string>& args, const std::string& job, int rank,
                             double timeout_s, const Geometry& g, double attach_limit_s,
                             const cpu_set_t* spawn_cpus)
    : timeout_s_(timeout_s), g_(g) {
  Spawn(args, spawn_cpus);
  Attach(args[0], job, rank, attach_limit_s);
  StagingOptions so;
  so.cpu = !g.device.is_cuda();
  if (g.device.is_cuda()) so.device = g.device.index();
  stager_ = Take(Stager::Create(client_.get(), so), "cannot stage its ring");
}

void ServiceSource::Spawn(const std::vector<std::string>& args, const cpu_set_t* spawn_cpus) {
  log_ = Take(proc::MakeLogFd("loader-serve"), "cannot make a log for its loader service");
  cpu_set_t bound;
  const bool swap = spawn_cpus && sched_getaffinity(0, sizeof bound, &bound) == 0 &&
                    sched_setaffinity(0, sizeof *spawn_cpus, spawn_cpus) == 0;
  Result<proc::ChildProcess> started =
      proc::ChildProcess::Start(args, {}, log_.get(), log_.get(), /*failure_channel=*/true);
  if (swap) sched_setaffinity(0, sizeof bound, &bound);
  serve_ = Take(std::move(started), "cannot start its loader service");
  pid_ = serve_.pid();
}

void ServiceSource::Attach(const std::string& bin, const std::string& job, int rank, double attach_limit_s) {
  const auto start = Clock::now();
  while (true) {
    proc::ChildExit e;
    if (serve_.Exited(&e)) {
      throw RankError(WithTail("its loader service (" + bin + " serve, pid " + std::to_string(pid_) + ") ended (" +
                                   e.Describe() + ") before the rank attached",
                               Account(&e)));
    }
    Result<std::unique_ptr<RingClient>> c = RingClient::Attach(job, rank, 0.5);
    if (c.ok()) {
      client_ = std::move(*c);
      return;
    }
    const StatusCode code = c.status().code();
    if (code != StatusCode::kDeadlineExceeded && code != StatusCode::kNotFound &&
        code != StatusCode::kUnavailable) {
      Check(c.status(), "cannot attach to its loader service");
    }
    if (std::chrono::duration<double>(Clock::now() - start).count() > attach_limit_s) {
      throw RankError(WithTail("its loader service (pid " + std::to_string(pid_) + ") did not open its ring within " +
                                   Seconds(attach_limit_s) + " s (--timeout); it is " + proc::ProcessState(pid_),
                               Account(nullptr)));
    }
  }
}

std::string ServiceSource::Account(const proc::ChildExit* e) const {
  if (e && !e->failure.message.empty()) return e->failure.message;
  return proc::TailOf(log_.get(), 3);
}

double ServiceSource::Finish() {
  stager_.reset();
  client_.reset();  // detaches: the service exits by itself
  if (serve_.pid() > 0) {
    Result<proc::ChildExit> e = serve_.WaitFor(10.0, "loader serve");
    if (e.ok()) {
      cpu_s_ = static_cast<double>(e->usage.ru_utime.tv_sec + e->usage.ru_stime.tv_sec) +
               1e-6 * static_cast<double>(e->usage.ru_utime.tv_usec + e->usage.ru_stime.tv_usec);
    }
  }
  return cpu_s_;
}

void ServiceSource::FailNext(const Status& why) {
  proc::ChildExit e;
  bool exited = serve_.Exited(&e);
  if (!exited && why.code() == StatusCode::kUnavailable) {
    const auto until = Clock::now() + std::chrono::seconds(2);
    while (!(exited = serve_.Exited(&e)) && Clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  if (exited && WIFSIGNALED(e.status)) {
    // What it said before it died (its SIGBUS handler names the shard cut under it).
    throw RankError(WithTail("its loader service (pid " + std::to_string(pid_) + ") was " + e.Describe() +
                                 " while the rank waited for a batch",
                             Account(&e)));
  }
  throw RankError("its loader service (pid " + std::to_string(pid_) + ")" +
                  (exited ? " (" + e.Describe() + ")" : "") + ": " + why.ToString());
}

Batch ServiceSource::Next(double* data_ms) {
  const auto t0 = Clock::now();
  Result<StagedBatch> r = stager_->Next(timeout_s_);
  *data_ms = MsSince(t0);
  if (!r.ok()) FailNext(r.status());
  const StagedBatch& s = *r;
  Batch b;
#if NL_TRAINER_CUDA
  if (s.on_device) {
    auto stream = c10::cuda::getCurrentCUDAStream(g_.device.index()).stream();
    cudaStreamWaitEvent(stream, static_cast<cudaEvent_t>(s.ready_event), 0);
    auto u8 = torch::from_blob(s.device_pixels, {s.host.size, 3, g_.ring_size, g_.ring_size},
                               torch::TensorOptions().dtype(torch::kUInt8).device(g_.device));
    b.x = Normalize(u8.to(torch::kFloat32), g_);
    b.y = torch::from_blob(s.device_labels, {s.host.size},
                           torch::TensorOptions().dtype(torch::kInt64).device(g_.device))
              .clone();
    b.size = s.host.size;
    Check(stager_->Release(s, stream), "releasing a staged batch");
  } else
#endif
  {
    b = FromHost(s.host.pixels, s.host.labels, s.host.size, g_);
    Check(stager_->Release(s), "releasing a ring slot");
  }
  b.epoch = s.host.epoch;
  b.batch = s.host.batch;
  return b;
}

// ---- InprocessSource ----

InprocessSource::InprocessSource(const PipelineConfig& c, const Geometry& g, double delay_ms)
    : g_(g), delay_ms_(delay_ms) {
  pipeline_ = Take(Pipeline::Open(c), "cannot open its loader pipeline");
}

Batch InprocessSource::Next(double* data_ms) {
  const auto t0 = Clock::now();
  if (delay_ms_ > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(delay_ms_));
  Result<BatchView> v = pipeline_->Next();
  *data_ms = MsSince(t0);
  if (!v.ok()) throw RankError("its loader pipeline: " + v.status().ToString());
  Batch b = FromHost(v->pixels, v->labels, v->size, g_);
  b.epoch = v->epoch;
  b.batch = v->batch;
  Check(pipeline_->Release(*v), "releasing a batch");
  return b;
}

double InprocessSource::Finish() {
  if (pipeline_) {
    const PipelineStats st = pipeline_->Stats();
    cpu_s_ = st.read_s + st.decode_s + st.transform_s;
    pipeline_.reset();
  }
  return cpu_s_;
}

}  // namespace nl::trainer
