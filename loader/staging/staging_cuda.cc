// The GPU path (built when the CUDA toolkit is found) and the path choice.
//
// Per batch, on the stager's own non-blocking stream:
//   [wait for the caller's work on this buffer, if it gave a stream at Release]
//   cudaMemcpyAsync pixels, labels, indices: pinned ring slot -> device buffer
//   cudaEventRecord(buffer's ready event)        <- the caller waits on this
//   cudaLaunchHostFunc(ReleaseSlot)              <- the slot goes back to the producer
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "base/mutex.h"
#include "loader/staging/staging_backend.h"

namespace nl {
namespace {

std::string CudaText(cudaError_t rc) {
  return std::string(cudaGetErrorName(rc)) + ": " + cudaGetErrorString(rc);
}

// "staging: cudaMemcpyAsync (pixels) failed on device 0, batch (epoch 1, batch 3): ..."
Status CudaFailure(const char* call, cudaError_t rc, const std::string& where) {
  return Status::Internal("staging: " + std::string(call) + " failed on " + where + ": " +
                          CudaText(rc));
}

#define NL_CUDA_RETURN_IF_ERROR(expr, what, where)                                \
  do {                                                                            \
    cudaError_t nl_cuda_rc_ = (expr);                                             \
    if (nl_cuda_rc_ != cudaSuccess) return CudaFailure(what, nl_cuda_rc_, where); \
  } while (0)

std::string DeviceWhere(int device) { return "device " + std::to_string(device); }
std::string BatchWhere(int device, const RingBatch& b) {
  return DeviceWhere(device) + ", batch (epoch " + std::to_string(b.epoch) + ", batch " +
         std::to_string(b.batch) + ", sequence " + std::to_string(b.sequence) + ")";
}

std::string Mib(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return buf;
}

// Makes `device` current for the calling thread while in scope (the current
// device is per thread, and the caller may be on another one).
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    rc_ = previous_ == device ? cudaSuccess : cudaSetDevice(device);
    switched_ = rc_ == cudaSuccess && previous_ != device && previous_ >= 0;
  }
  ~DeviceScope() {
    if (switched_) (void)cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;
  cudaError_t rc() const { return rc_; }

 private:
  int previous_ = -1;
  cudaError_t rc_ = cudaSuccess;
  bool switched_ = false;
};

// RAII owners of the CUDA handles.
struct StreamDestroy {
  void operator()(cudaStream_t s) const { (void)cudaStreamDestroy(s); }
};
using Stream = std::unique_ptr<CUstream_st, StreamDestroy>;
struct EventDestroy {
  void operator()(cudaEvent_t e) const { (void)cudaEventDestroy(e); }
};
using Event = std::unique_ptr<CUevent_st, EventDestroy>;
struct DeviceFree {
  void operator()(void* p) const { (void)cudaFree(p); }
};
using DeviceMemory = std::unique_ptr<void, DeviceFree>;

// Host memory registered as pinned; unregistered when destroyed.
struct HostUnregister {
  void operator()(void* base) const { (void)cudaHostUnregister(base); }
};
using HostRegistration = std::unique_ptr<void, HostUnregister>;

Result<Event> MakeEvent(const std::string& where) {
  cudaEvent_t e = nullptr;
  NL_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming),
                          "cudaEventCreateWithFlags", where);
  return Event(e);
}

uint64_t AlignUp(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

class CudaBackend : public Stager::Backend {
 public:
  static Result<std::unique_ptr<CudaBackend>> Create(RingClient* client, int device,
                                                     uint32_t buffer_count, std::string* note);
  ~CudaBackend() override;

  Result<StagedBatch> Next(double timeout_s) override;
  Status Release(const StagedBatch& b, void* consumer_stream) override;
  Status Synchronize() override;
  bool on_gpu() const override { return true; }

 private:
  struct Buffer {
    DeviceMemory memory;
    void* pixels = nullptr;
    int64_t* labels = nullptr;
    int64_t* indices = nullptr;
    Event ready;          // recorded after the copy into this buffer
    Event consumer_done;  // recorded on the caller's stream at Release
    bool wait_for_consumer = false;
    bool held = false;  // handed to the caller, not yet released
    uint64_t sequence = 0;
  };
  // One copy's slot, on its way back to the producer (owned by the callback).
  struct PendingRelease {
    CudaBackend* backend;
    RingBatch batch;
  };

  CudaBackend(RingClient* client, int device) : client_(client), device_(device) {}
  static void CUDART_CB ReleaseSlot(void* data);
  Status Enqueue(Buffer& buf, const RingBatch& ring);
  void GiveBackAfterFailure(const RingBatch& ring);
  Status DeferredError() NL_EXCLUDES(deferred_mutex_);

  RingClient* client_;
  int device_;
  uint64_t sample_bytes_ = 0;
  uint32_t slot_count_ = 0;
  // Declared so that they are destroyed in this order: buffers (events,
  // device memory), stream, then the ring's registration.
  HostRegistration registration_;
  Stream stream_;
  std::vector<Buffer> buffers_;
  uint32_t next_buffer_ = 0;

  // Slots whose copy is queued and whose release callback has not run yet.
  std::atomic<uint32_t> slots_in_flight_{0};
  Mutex deferred_mutex_;
  // A failed release from the callback; reported from then on.
  Status deferred_ NL_GUARDED_BY(deferred_mutex_);
};

Result<std::unique_ptr<CudaBackend>> CudaBackend::Create(RingClient* client, int device,
                                                         uint32_t buffer_count, std::string* note) {
  const std::string where = DeviceWhere(device);
  DeviceScope scope(device);
  NL_CUDA_RETURN_IF_ERROR(scope.rc(), "cudaSetDevice", where);
  cudaDeviceProp prop{};
  NL_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties", where);

  std::unique_ptr<CudaBackend> b(new CudaBackend(client, device));
  const ring::Geometry& g = client->info().geometry;
  b->sample_bytes_ = g.sample_bytes;
  b->slot_count_ = g.slot_count;

  // The whole mapping at once: every slot lies in it, so one registration
  // (one pinning of its pages) serves every batch of the run.
  void* base = client->ring_base();
  const uint64_t ring_bytes = client->ring_bytes();
  NL_CUDA_RETURN_IF_ERROR(cudaHostRegister(base, ring_bytes, cudaHostRegisterDefault),
                          "cudaHostRegister of the ring", where + " (" + Mib(ring_bytes) + ")");
  b->registration_.reset(base);

  cudaStream_t s = nullptr;
  NL_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking),
                          "cudaStreamCreateWithFlags", where);
  b->stream_.reset(s);

  // Each buffer holds a full batch: pixels, then labels and indices, each
  // starting on a 256-byte boundary.
  const uint64_t pixel_bytes = uint64_t{g.batch_size} * g.sample_bytes;
  const uint64_t labels_at = AlignUp(pixel_bytes, 256);
  const uint64_t indices_at = AlignUp(labels_at + uint64_t{g.batch_size} * 8, 256);
  const uint64_t buffer_bytes = indices_at + uint64_t{g.batch_size} * 8;
  b->buffers_.resize(buffer_count);
  for (uint32_t i = 0; i < buffer_count; ++i) {
    Buffer& buf = b->buffers_[i];
    const std::string bwhere = where + ", device buffer " + std::to_string(i);
    void* p = nullptr;
    NL_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, buffer_bytes), "cudaMalloc",
                            bwhere + " (" + Mib(buffer_bytes) + ")");
    buf.memory.reset(p);
    buf.pixels = p;
    buf.labels = reinterpret_cast<int64_t*>(static_cast<char*>(p) + labels_at);
    buf.indices = reinterpret_cast<int64_t*>(static_cast<char*>(p) + indices_at);
    NL_ASSIGN_OR_RETURN(buf.ready, MakeEvent(bwhere));
    NL_ASSIGN_OR_RETURN(buf.consumer_done, MakeEvent(bwhere));
  }
  *note = "GPU path: " + where + " (" + prop.name + "), ring registered as pinned (" +
          Mib(ring_bytes) + "), " + std::to_string(buffer_count) + " device buffers of " +
          Mib(buffer_bytes);
  return b;
}

CudaBackend::~CudaBackend() {
  // Every queued copy and release callback must be done before the slots are
  // unpinned and before the client (which the callbacks call) may go away.
  DeviceScope scope(device_);
  if (stream_) (void)cudaStreamSynchronize(stream_.get());
}

Status CudaBackend::DeferredError() {
  MutexLock lock(&deferred_mutex_);
  return deferred_;
}

// Why a host callback rather than querying events on the next call: the
// slot should go back the moment its copy is done, while the caller is
// still computing on the batch. Polling at the next Next() would keep each
// slot a whole training step longer, so the producer would run with fewer
// slots to fill than the ring has. The callback runs on a CUDA driver
// thread, which RingClient::Release allows (it locks the ring); it makes no
// CUDA call (which a host function must not), and it only delays our own
// stream's later copies by the length of one Release.
void CUDART_CB CudaBackend::ReleaseSlot(void* data) {
  std::unique_ptr<PendingRelease> p(static_cast<PendingRelease*>(data));
  CudaBackend* self = p->backend;
  Status s = self->client_->Release(p->batch);
  if (!s.ok()) {
    MutexLock lock(&self->deferred_mutex_);
    if (self->deferred_.ok()) {
      self->deferred_ =
          s.WithContext("staging: giving ring slot " + std::to_string(p->batch.slot) +
                        " back after the copy of " + BatchWhere(self->device_, p->batch));
    }
  }
  self->slots_in_flight_.fetch_sub(1, std::memory_order_acq_rel);
}

// The slot of a batch whose copy could not be queued: wait for whatever was
// queued to drain, then give it back here.
void CudaBackend::GiveBackAfterFailure(const RingBatch& ring) {
  (void)cudaStreamSynchronize(stream_.get());
  (void)client_->Release(ring);
}

Status CudaBackend::Enqueue(Buffer& buf, const RingBatch& ring) {
  const std::string where = BatchWhere(device_, ring);
  cudaStream_t s = stream_.get();
  if (buf.wait_for_consumer) {
    NL_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(s, buf.consumer_done.get(), 0),
                            "cudaStreamWaitEvent (the caller's work on the buffer)", where);
    buf.wait_for_consumer = false;
  }
  const uint64_t n = ring.size;
  NL_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(buf.pixels, ring.pixels, n * sample_bytes_, cudaMemcpyHostToDevice, s),
      "cudaMemcpyAsync (pixels)", where);
  NL_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(buf.labels, ring.labels, n * sizeof(int64_t), cudaMemcpyHostToDevice, s),
      "cudaMemcpyAsync (labels)", where);
  NL_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(buf.indices, ring.indices, n * sizeof(int64_t), cudaMemcpyHostToDevice, s),
      "cudaMemcpyAsync (indices)", where);
  NL_CUDA_RETURN_IF_ERROR(cudaEventRecord(buf.ready.get(), s), "cudaEventRecord", where);
  auto pending = std::make_unique<PendingRelease>(PendingRelease{this, ring});
  slots_in_flight_.fetch_add(1, std::memory_order_acq_rel);
  cudaError_t rc = cudaLaunchHostFunc(s, &CudaBackend::ReleaseSlot, pending.get());
  if (rc != cudaSuccess) {
    slots_in_flight_.fetch_sub(1, std::memory_order_acq_rel);
    return CudaFailure("cudaLaunchHostFunc (the slot's release)", rc, where);
  }
  pending.release();  // the callback owns it now
  return Status::Ok();
}

Result<StagedBatch> CudaBackend::Next(double timeout_s) {
  NL_RETURN_IF_ERROR(DeferredError());
  const uint32_t n = static_cast<uint32_t>(buffers_.size());
  uint32_t pick = n;
  for (uint32_t k = 0; k < n; ++k) {
    uint32_t i = (next_buffer_ + k) % n;
    if (!buffers_[i].held) {
      pick = i;
      break;
    }
  }
  if (pick == n) {
    return Status::FailedPrecondition("staging: all " + std::to_string(n) +
                                      " device buffers are held (the oldest by batch "
                                      "sequence " +
                                      std::to_string(buffers_[next_buffer_].sequence) +
                                      "): release a batch before asking for the next");
  }
  DeviceScope scope(device_);
  NL_CUDA_RETURN_IF_ERROR(scope.rc(), "cudaSetDevice", DeviceWhere(device_));
  // With more device buffers than ring slots, every slot may still be on its
  // way back: let those copies finish rather than have the client refuse.
  if (slots_in_flight_.load(std::memory_order_acquire) >= slot_count_) {
    NL_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_.get()), "cudaStreamSynchronize",
                            DeviceWhere(device_));
  }
  NL_ASSIGN_OR_RETURN(RingBatch ring, client_->Next(timeout_s));
  Buffer& buf = buffers_[pick];
  Status queued = Enqueue(buf, ring);
  if (!queued.ok()) {
    GiveBackAfterFailure(ring);
    return queued;
  }
  buf.held = true;
  buf.sequence = ring.sequence;
  next_buffer_ = (pick + 1) % n;

  StagedBatch b;
  b.host = ring;
  b.host.pixels = nullptr;  // the slot is the producer's again once the copy is done
  b.host.labels = nullptr;
  b.host.indices = nullptr;
  b.device_pixels = buf.pixels;
  b.device_labels = buf.labels;
  b.device_indices = buf.indices;
  b.ready_event = buf.ready.get();
  b.on_device = true;
  b.buffer = pick;
  return b;
}

Status CudaBackend::Release(const StagedBatch& b, void* consumer_stream) {
  if (!b.on_device || b.buffer >= buffers_.size() || !buffers_[b.buffer].held ||
      buffers_[b.buffer].sequence != b.host.sequence) {
    return Status::InvalidArgument("staging: batch sequence " + std::to_string(b.host.sequence) +
                                   " (device buffer " + std::to_string(b.buffer) +
                                   ") is not out: released twice or never handed out");
  }
  Buffer& buf = buffers_[b.buffer];
  if (consumer_stream != nullptr) {
    DeviceScope scope(device_);
    NL_CUDA_RETURN_IF_ERROR(scope.rc(), "cudaSetDevice", DeviceWhere(device_));
    NL_CUDA_RETURN_IF_ERROR(
        cudaEventRecord(buf.consumer_done.get(), static_cast<cudaStream_t>(consumer_stream)),
        "cudaEventRecord (on the caller's stream, releasing)", BatchWhere(device_, b.host));
    buf.wait_for_consumer = true;
  }
  buf.held = false;
  return Status::Ok();
}

Status CudaBackend::Synchronize() {
  DeviceScope scope(device_);
  NL_CUDA_RETURN_IF_ERROR(scope.rc(), "cudaSetDevice", DeviceWhere(device_));
  NL_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_.get()), "cudaStreamSynchronize",
                          DeviceWhere(device_));
  return DeferredError();
}

}  // namespace

Result<BackendChoice> ChooseBackend(RingClient* client, const StagingOptions& options) {
  int count = 0;
  cudaError_t rc = cudaGetDeviceCount(&count);
  std::string why;
  if (rc != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky, but leave nothing behind for the caller
    why = "cudaGetDeviceCount: " + CudaText(rc);
  } else if (count == 0) {
    why = "cudaGetDeviceCount: 0 devices";
  }
  if (!why.empty()) {
    if (options.device >= 0) {
      return Status::InvalidArgument("staging: device " + std::to_string(options.device) +
                                     " asked for, but there is no CUDA device (" + why + ")");
    }
    return BackendChoice{MakeCpuBackend(client), "CPU path: no CUDA device (" + why + ")"};
  }
  int device = options.device;
  if (device < 0) {
    NL_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device), "cudaGetDevice", "the current device");
  }
  if (device >= count) {
    return Status::InvalidArgument("staging: device " + std::to_string(device) +
                                   " does not exist (" + std::to_string(count) + " CUDA devices)");
  }
  std::string note;
  NL_ASSIGN_OR_RETURN(auto backend,
                      CudaBackend::Create(client, device, options.device_buffers, &note));
  return BackendChoice{std::move(backend), std::move(note)};
}

}  // namespace nl
