// Internal to nl_staging: the interface both paths implement, and the
// function (staging_cuda.cc or staging_cpu.cc, one per build) that picks one.
#pragma once

#include <memory>
#include <string>

#include "base/status.h"
#include "loader/staging/staging.h"

namespace nl {

class Stager::Backend {
 public:
  virtual ~Backend() = default;
  virtual Result<StagedBatch> Next(double timeout_s) = 0;
  virtual Status Release(const StagedBatch& batch, void* consumer_stream) = 0;
  virtual Status Synchronize() = 0;
  virtual bool on_gpu() const = 0;
};

// The CPU path (staging.cc; in every build).
std::unique_ptr<Stager::Backend> MakeCpuBackend(RingClient* client);

struct BackendChoice {
  std::unique_ptr<Stager::Backend> backend;
  std::string note;  // Stager::path_note()
};

// Picks the path for options with cpu == false: the GPU when built with CUDA
// and a device is there, else the CPU path (device == -1 only) saying why.
Result<BackendChoice> ChooseBackend(RingClient* client, const StagingOptions& options);

}  // namespace nl
