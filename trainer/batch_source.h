// Where a rank's batches come from: a `loader serve` child and the ring it
// fills (ServiceSource), or the pipeline in this process (InprocessSource).
// Either way a batch arrives as float32 on the rank's device, normalised
// with ImageNet's mean and deviation, resized there when the loader makes
// images of another size. Errors are RankError (kOwn), naming the loader.
#pragma once

#include <sched.h>
#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include <torch/types.h>

#include "base/child_process.h"
#include "base/fd.h"
#include "loader/pipeline/pipeline.h"
#include "loader/ring/client.h"
#include "loader/staging/staging.h"

namespace nl::trainer {

struct Batch {
  torch::Tensor x;  // float32 [n, 3, S, S] on the device, normalised
  torch::Tensor y;  // int64 [n] on the device
  uint64_t epoch = 0, batch = 0;
  uint32_t size = 0;
};

struct Geometry {
  int ring_size = 224;   // side of the images the loader makes
  int model_size = 224;  // side the model sees
  torch::Device device = torch::kCPU;
};

// uint8 or float [n, 3, ring, ring] on the device -> normalised float32 [n, 3, model, model].
torch::Tensor Normalize(torch::Tensor x, const Geometry& g);
// A batch from host memory (copied: the buffers can be released after).
Batch FromHost(const void* pixels, const int64_t* labels, uint32_t n, const Geometry& g);

class BatchSource {
 public:
  virtual ~BatchSource() = default;
  // Waits for the next batch; data_ms gets the wait.
  virtual Batch Next(double* data_ms) = 0;
  // The loader threads' process (for where they ran), 0: this one.
  virtual pid_t loader_pid() const = 0;
  // Stops the loader; the CPU seconds it spent (a service: its process's
  // user + system time; in process: the workers' read, decode and transform time).
  virtual double Finish() = 0;
};

// A `loader serve` child (ServeArgs) and the ring it fills. The child reports
// why it failed through its failure channel; its log (a memfd) is the
// fallback when it could not (killed by a signal) or is still running.
class ServiceSource : public BatchSource {
 public:
  // spawn_cpus: the cpus the service may plan on (the process's, not the
  // rank's own bound core, which a child would otherwise inherit); null: as is.
  // Waits up to attach_limit_s for its ring.
  ServiceSource(const std::vector<std::string>& args, const std::string& job, int rank, double timeout_s,
                const Geometry& g, double attach_limit_s, const cpu_set_t* spawn_cpus);
  ~ServiceSource() override { Finish(); }
  Batch Next(double* data_ms) override;
  pid_t loader_pid() const override { return pid_; }
  double Finish() override;

 private:
  void Spawn(const std::vector<std::string>& args, const cpu_set_t* spawn_cpus);
  void Attach(const std::string& bin, const std::string& job, int rank, double attach_limit_s);
  // The error for a failed wait for a batch, after letting a vanished
  // service be reaped.
  [[noreturn]] void FailNext(const Status& why);
  // What the service said of its end: its failure report, else its log's last lines.
  std::string Account(const proc::ChildExit* e) const;

  double timeout_s_;
  Geometry g_;
  Fd log_;
  proc::ChildProcess serve_;
  pid_t pid_ = 0;
  double cpu_s_ = 0;
  std::unique_ptr<RingClient> client_;
  std::unique_ptr<Stager> stager_;
};

// The pipeline in this process (--loader inprocess); delay_ms before each
// batch (--simulate-slow-rank).
class InprocessSource : public BatchSource {
 public:
  InprocessSource(const PipelineConfig& c, const Geometry& g, double delay_ms);
  Batch Next(double* data_ms) override;
  pid_t loader_pid() const override { return 0; }
  double Finish() override;

 private:
  Geometry g_;
  double delay_ms_;
  double cpu_s_ = 0;
  std::unique_ptr<Pipeline> pipeline_;
};

}  // namespace nl::trainer
