// A stand-in for the CUDA runtime, for testing the staging layer's GPU path on
// machines without a GPU: the functions staging_cuda.cc and its tests call,
// with the real headers' signatures, and the ordering semantics they rely on.
//
// - "Device memory" is host memory; one device (0), named "fake CUDA device".
// - A stream is a thread (base's Thread) running its queued operations in order;
//   cudaStreamSynchronize waits for what was queued before it.
// - Events complete when the stream reaches them; cudaStreamWaitEvent makes a
//   stream wait for the event's latest record at the time of the call.
// - cudaHostRegister refuses overlapping ranges, as the driver does;
//   cudaMemcpyAsync host-to-device from memory that is neither registered nor
//   cudaMallocHost'd is refused (the real runtime would silently copy
//   synchronously: here that is a bug in the caller).
// - FakeCudaLiveObjects() counts what is still allocated, so tests can check
//   that everything is released.
// It is linked only into the fake-runtime test, never into a real binary.
#include "loader/staging/fake_cuda_runtime.h"

#include <cuda_runtime_api.h>

#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>

#include "base/thread.h"

struct CUevent_st {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t recorded = 0;   // records issued
  uint64_t completed = 0;  // records the stream has reached
};

struct CUstream_st {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::function<void()>> queue;
  uint64_t queued = 0, done = 0;
  bool stop = false;
  nl::Thread worker;

  void Run() {
    std::unique_lock lock(mu);
    while (true) {
      cv.wait(lock, [&] { return stop || !queue.empty(); });
      if (queue.empty()) return;
      std::function<void()> op = std::move(queue.front());
      queue.pop_front();
      lock.unlock();
      op();
      lock.lock();
      ++done;
      cv.notify_all();
    }
  }
  void Push(std::function<void()> op) {
    std::lock_guard lock(mu);
    queue.push_back(std::move(op));
    ++queued;
    cv.notify_all();
  }
  void Drain() {
    std::unique_lock lock(mu);
    const uint64_t target = queued;
    cv.wait(lock, [&] { return done >= target; });
  }
};

namespace {

std::mutex g_mu;
std::map<uintptr_t, size_t> g_registered;  // base -> bytes (cudaHostRegister)
std::map<uintptr_t, size_t> g_pinned;      // base -> bytes (cudaMallocHost)
nl::FakeCudaCounts g_live;

bool Within(const std::map<uintptr_t, size_t>& ranges, const void* p, size_t n) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  auto it = ranges.upper_bound(a);
  if (it == ranges.begin()) return false;
  --it;
  return a >= it->first && a + n <= it->first + it->second;
}

}  // namespace

namespace nl {
FakeCudaCounts FakeCudaLiveObjects() {
  std::lock_guard lock(g_mu);
  return g_live;
}
}  // namespace nl

extern "C" {

cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) { return device == 0 ? cudaSuccess : cudaErrorInvalidDevice; }
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (device != 0) return cudaErrorInvalidDevice;
  std::memset(prop, 0, sizeof *prop);
  std::strncpy(prop->name, "fake CUDA device", sizeof prop->name - 1);
  return cudaSuccess;
}
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorHostMemoryAlreadyRegistered:
      return "cudaErrorHostMemoryAlreadyRegistered";
    case cudaErrorHostMemoryNotRegistered:
      return "cudaErrorHostMemoryNotRegistered";
    default:
      return "cudaError (fake)";
  }
}
const char* cudaGetErrorString(cudaError_t error) {
  return error == cudaSuccess ? "no error" : "fake CUDA runtime error";
}

cudaError_t cudaHostRegister(void* ptr, size_t size, unsigned int) {
  std::lock_guard lock(g_mu);
  if (ptr == nullptr || size == 0) return cudaErrorInvalidValue;
  const auto a = reinterpret_cast<uintptr_t>(ptr);
  for (const auto& [base, bytes] : g_registered) {
    if (a < base + bytes && base < a + size) return cudaErrorHostMemoryAlreadyRegistered;
  }
  g_registered[a] = size;
  ++g_live.registrations;
  return cudaSuccess;
}
cudaError_t cudaHostUnregister(void* ptr) {
  std::lock_guard lock(g_mu);
  if (g_registered.erase(reinterpret_cast<uintptr_t>(ptr)) == 0) {
    return cudaErrorHostMemoryNotRegistered;
  }
  --g_live.registrations;
  return cudaSuccess;
}
cudaError_t cudaMallocHost(void** ptr, size_t size) {
  *ptr = std::aligned_alloc(4096, (size + 4095) / 4096 * 4096);
  if (*ptr == nullptr) return cudaErrorMemoryAllocation;
  std::lock_guard lock(g_mu);
  g_pinned[reinterpret_cast<uintptr_t>(*ptr)] = size;
  return cudaSuccess;
}
cudaError_t cudaFreeHost(void* ptr) {
  {
    std::lock_guard lock(g_mu);
    if (g_pinned.erase(reinterpret_cast<uintptr_t>(ptr)) == 0) return cudaErrorInvalidValue;
  }
  std::free(ptr);
  return cudaSuccess;
}
cudaError_t cudaMalloc(void** ptr, size_t size) {
  *ptr = std::aligned_alloc(256, (size + 255) / 256 * 256);
  if (*ptr == nullptr) return cudaErrorMemoryAllocation;
  std::lock_guard lock(g_mu);
  ++g_live.device_allocations;
  return cudaSuccess;
}
cudaError_t cudaFree(void* ptr) {
  if (ptr == nullptr) return cudaSuccess;
  std::free(ptr);
  std::lock_guard lock(g_mu);
  --g_live.device_allocations;
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int) {
  auto* s = new CUstream_st;
  nl::Result<nl::Thread> worker = nl::Thread::Start("fake stream", [s] {
    s->Run();
    return nl::Status::Ok();
  });
  if (!worker.ok()) {
    delete s;
    return cudaErrorMemoryAllocation;
  }
  s->worker = std::move(*worker);
  *stream = s;
  std::lock_guard lock(g_mu);
  ++g_live.streams;
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  if (s == nullptr) return cudaErrorInvalidValue;
  s->Drain();
  {
    std::lock_guard lock(s->mu);
    s->stop = true;
    s->cv.notify_all();
  }
  (void)s->worker.Join();  // (Run reports nothing)
  delete s;
  std::lock_guard lock(g_mu);
  --g_live.streams;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  if (s == nullptr) return cudaErrorInvalidValue;  // the tests never use the legacy stream
  s->Drain();
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int) {
  *event = new CUevent_st;
  std::lock_guard lock(g_mu);
  ++g_live.events;
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete e;
  std::lock_guard lock(g_mu);
  --g_live.events;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  if (e == nullptr || s == nullptr) return cudaErrorInvalidValue;
  uint64_t gen;
  {
    std::lock_guard lock(e->mu);
    gen = ++e->recorded;
  }
  s->Push([e, gen] {
    std::lock_guard lock(e->mu);
    if (e->completed < gen) e->completed = gen;
    e->cv.notify_all();
  });
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  std::unique_lock lock(e->mu);
  const uint64_t target = e->recorded;
  e->cv.wait(lock, [&] { return e->completed >= target; });
  return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int) {
  if (e == nullptr || s == nullptr) return cudaErrorInvalidValue;
  uint64_t target;
  {
    std::lock_guard lock(e->mu);
    target = e->recorded;
  }
  s->Push([e, target] {
    std::unique_lock lock(e->mu);
    e->cv.wait(lock, [&] { return e->completed >= target; });
  });
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind) {
  std::memcpy(dst, src, count);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind,
                            cudaStream_t s) {
  if (s == nullptr) return cudaErrorInvalidValue;
  if (kind == cudaMemcpyHostToDevice) {
    std::lock_guard lock(g_mu);
    if (!Within(g_registered, src, count) && !Within(g_pinned, src, count)) {
      return cudaErrorInvalidValue;  // pageable source: see the file comment
    }
  }
  s->Push([dst, src, count] { std::memcpy(dst, src, count); });
  return cudaSuccess;
}
cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void* data) {
  if (s == nullptr) return cudaErrorInvalidValue;
  s->Push([fn, data] { fn(data); });
  return cudaSuccess;
}

}  // extern "C"
