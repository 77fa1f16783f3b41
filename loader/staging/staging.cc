// Stager's common part and the CPU path (zero-copy views of ring slots).
#include "loader/staging/staging.h"

#include <string>
#include <unordered_map>
#include <utility>

#include "loader/staging/staging_backend.h"

namespace nl {
namespace {

class CpuBackend : public Stager::Backend {
 public:
  explicit CpuBackend(RingClient* client) : client_(client) {}

  Result<StagedBatch> Next(double timeout_s) override {
    NL_ASSIGN_OR_RETURN(RingBatch ring, client_->Next(timeout_s));
    StagedBatch b;
    b.host = ring;
    b.on_device = false;
    b.buffer = ring.slot;
    out_[ring.sequence] = ring.slot;
    return b;
  }

  Status Release(const StagedBatch& b, void* consumer_stream) override {
    if (b.on_device) {
      return Status::InvalidArgument("staging: a device batch (sequence " +
                                     std::to_string(b.host.sequence) +
                                     ") released to the CPU path");
    }
    auto it = out_.find(b.host.sequence);
    if (it == out_.end() || it->second != b.host.slot) {
      return Status::InvalidArgument("staging: batch sequence " + std::to_string(b.host.sequence) +
                                     " (slot " + std::to_string(b.host.slot) +
                                     ") is not out: released twice or never handed out");
    }
    (void)consumer_stream;  // nothing on the device to order against
    NL_RETURN_IF_ERROR(client_->Release(b.host));
    out_.erase(it);
    return Status::Ok();
  }

  Status Synchronize() override { return Status::Ok(); }
  bool on_gpu() const override { return false; }

 private:
  RingClient* client_;
  std::unordered_map<uint64_t, uint32_t> out_;  // sequence -> slot of each batch handed out
};

}  // namespace

std::unique_ptr<Stager::Backend> MakeCpuBackend(RingClient* client) {
  return std::make_unique<CpuBackend>(client);
}

Result<std::unique_ptr<Stager>> Stager::Create(RingClient* client, const StagingOptions& options) {
  if (client == nullptr) return Status::InvalidArgument("staging: no ring client given");
  if (options.device_buffers < 1 || options.device_buffers > kMaxDeviceBuffers) {
    return Status::InvalidArgument("staging: device_buffers is " +
                                   std::to_string(options.device_buffers) + ", must be 1.." +
                                   std::to_string(kMaxDeviceBuffers));
  }
  if (options.device < -1) {
    return Status::InvalidArgument("staging: device is " + std::to_string(options.device) +
                                   ", must be -1 (current) or a device number");
  }
  if (options.cpu) {
    if (options.device >= 0) {
      return Status::InvalidArgument("staging: both the CPU path and device " +
                                     std::to_string(options.device) + " asked for");
    }
    return std::unique_ptr<Stager>(
        new Stager(MakeCpuBackend(client), "CPU path: asked for (StagingOptions::cpu)"));
  }
  NL_ASSIGN_OR_RETURN(BackendChoice choice, ChooseBackend(client, options));
  return std::unique_ptr<Stager>(new Stager(std::move(choice.backend), std::move(choice.note)));
}

Stager::Stager(std::unique_ptr<Backend> backend, std::string note)
    : backend_(std::move(backend)), note_(std::move(note)) {}

Stager::~Stager() = default;

Result<StagedBatch> Stager::Next(double timeout_s) { return backend_->Next(timeout_s); }

Status Stager::Release(const StagedBatch& batch, void* consumer_stream) {
  return backend_->Release(batch, consumer_stream);
}

Status Stager::Synchronize() { return backend_->Synchronize(); }

bool Stager::on_gpu() const { return backend_->on_gpu(); }

const std::string& Stager::path_note() const { return note_; }

}  // namespace nl
