// GPU staging: takes batches from a rank's ring (RingClient) and puts them in
// GPU memory, or, without a GPU, hands out zero-copy views of the ring slots.
//
//   NL_ASSIGN_OR_RETURN(auto client, RingClient::Attach("job1", 0, 30.0));
//   NL_ASSIGN_OR_RETURN(auto stager, Stager::Create(client.get(), StagingOptions{}));
//   std::puts(stager->path_note().c_str());   // which path, and why
//   while (true) {
//     Result<StagedBatch> b = stager->Next(60.0);   // errors: as RingClient::Next
//     if (!b.ok()) break;
//     if (b->on_device) {
//       cudaStreamWaitEvent(my_stream, static_cast<cudaEvent_t>(b->ready_event), 0);
//       Train(my_stream, b->device_pixels, b->device_labels, b->host.size);
//       NL_RETURN_IF_ERROR(stager->Release(*b, my_stream));  // buffer reused after my work
//     } else {
//       Train(b->host.pixels, b->host.labels, b->host.size);
//       NL_RETURN_IF_ERROR(stager->Release(*b));             // the slot goes back
//     }
//   }
//
// Paths:
// - GPU (built with CUDA, a device present, cpu not forced): the client's
//   whole ring is registered as pinned memory once; each batch is copied
//   with cudaMemcpyAsync on the stager's own non-blocking stream into one of
//   `device_buffers` device buffers, an event is recorded after the copy,
//   and the ring slot goes back to the producer as soon as the copy has
//   completed (without waiting for the caller), so the producer refills it
//   while the GPU computes.
// - CPU: StagedBatch::host views the slot itself (zero copy); Release gives
//   the slot back.
// path_note() says which path was taken and why, e.g.
//   "GPU path: device 0 (NVIDIA H200), ring registered as pinned (154 MB)"
//   "CPU path: built without CUDA"
//   "CPU path: no CUDA device (cudaGetDeviceCount: no CUDA-capable device is detected)"
//   "CPU path: asked for (StagingOptions::cpu)"
// The automatic fallback happens only with device = -1; asking for a device
// that does not exist (or for any device in a build without CUDA) is an error.
//
// Threads: one thread at a time calls Next/Release/Synchronize (a training
// loop may hand over between threads). On the GPU path a CUDA host callback
// thread releases ring slots concurrently (RingClient::Release is safe for
// that); the caller must not use the client directly while a stager does.
// Ownership: the client must outlive the stager, and a client gets one
// stager at a time (its ring can be registered as pinned memory once).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "base/status.h"
#include "loader/ring/client.h"

namespace nl {

struct StagingOptions {
  int device = -1;              // -1: the calling thread's current CUDA device
  bool cpu = false;             // force the CPU path
  uint32_t device_buffers = 2;  // batches that may be on the device at once (1..64)
};

inline constexpr uint32_t kMaxDeviceBuffers = 64;

struct StagedBatch {
  // The batch's metadata (size, epoch, batch, sequence, slot, position).
  // CPU path: pixels/labels/indices view the ring slot until Release().
  // GPU path: they are null, since the slot is handed back to the producer
  // as soon as the copy completes and may be overwritten from then on.
  RingBatch host;
  // GPU path: the batch in device memory (same layout and dtype as the ring;
  // host.size samples), valid until Release(). Null on the CPU path.
  void* device_pixels = nullptr;
  int64_t* device_labels = nullptr;
  int64_t* device_indices = nullptr;
  // GPU path: a cudaEvent_t that completes when the device copy is complete;
  // wait on it (cudaStreamWaitEvent / cudaEventSynchronize) before reading the
  // device buffers. Owned by the stager; null on the CPU path.
  void* ready_event = nullptr;
  bool on_device = false;
  uint32_t buffer = 0;  // GPU: the device buffer's index; CPU: the ring slot
};

class Stager {
 public:
  // Chooses the path (see above) and, for the GPU, registers the ring and
  // allocates the stream, events and device buffers. `client` is not owned.
  // InvalidArgument: null client, device_buffers out of range, a device that
  // does not exist; Internal/IOError-like failures of CUDA calls name the
  // call and the device.
  static Result<std::unique_ptr<Stager>> Create(RingClient* client, const StagingOptions& options);
  // GPU: waits for every queued copy (and its slot's release), then frees the
  // device buffers, events and stream and unregisters the ring.
  ~Stager();
  Stager(const Stager&) = delete;
  Stager& operator=(const Stager&) = delete;

  // The next batch in order. Errors from the ring (OutOfRange at the end,
  // Unavailable when the producer died, DeadlineExceeded when it is stuck)
  // come back unchanged; FailedPrecondition when every device buffer is held
  // (release one first); a failed CUDA call names the call, device and batch.
  Result<StagedBatch> Next(double timeout_s);

  // Hands a batch back: the CPU path releases its slot; the GPU path makes
  // its device buffer reusable. `consumer_stream` (GPU only, a cudaStream_t;
  // may be null): the next copy into this buffer waits, on the GPU, for the
  // work queued on that stream so far, so the caller may release right after
  // queuing its kernels. With null, the caller must have finished reading the
  // buffer. Releasing a batch that is not out is InvalidArgument.
  Status Release(const StagedBatch& batch, void* consumer_stream = nullptr);

  // Waits until every copy queued so far has completed and its ring slot has
  // been handed back (a no-op on the CPU path).
  Status Synchronize();

  bool on_gpu() const;
  const std::string& path_note() const;

  // The stager's internals: a CPU and a CUDA implementation.
  class Backend;

 private:
  Stager(std::unique_ptr<Backend> backend, std::string note);
  std::unique_ptr<Backend> backend_;
  std::string note_;
};

}  // namespace nl
