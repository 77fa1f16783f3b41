// The GPU path against a real ring (ctest label `gpu`): each test skips,
// and shows as skipped, when there is no CUDA device.
//
// The same tests also build against the fake CUDA runtime
// (fake_cuda_runtime.cc, NL_FAKE_CUDA; binary staging_fake_cuda_test), which
// runs anywhere and checks the path's ordering and that it frees everything.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "loader/staging/staging.h"
#include "loader/staging/staging_test_producer.h"
#ifdef NL_FAKE_CUDA
#include "loader/staging/fake_cuda_runtime.h"
#endif

namespace nl {
namespace {

using staging_test::DiffFromPattern;
using staging_test::ForkedProducer;
using staging_test::ProducerPlan;

int DeviceCount(std::string* why) {
  int n = 0;
  cudaError_t rc = cudaGetDeviceCount(&n);
  if (rc != cudaSuccess) {
    (void)cudaGetLastError();
    *why = std::string("no CUDA device (cudaGetDeviceCount: ") + cudaGetErrorString(rc) + ")";
    return 0;
  }
  if (n == 0) *why = "no CUDA device (cudaGetDeviceCount: 0)";
  return n;
}

#define SKIP_WITHOUT_DEVICE()                          \
  do {                                                 \
    std::string why_;                                  \
    if (DeviceCount(&why_) == 0) GTEST_SKIP() << why_; \
  } while (0)

class StagingGpuTest : public ::testing::Test {
 protected:
  void Start(const std::string& name, ProducerPlan plan = {}) {
    plan.job_id = staging_test::UniqueJobId(name);
    plan_ = plan;
    producer_ = std::make_unique<ForkedProducer>(plan_);
    ASSERT_GT(producer_->pid(), 0) << "fork failed";
    auto c = RingClient::Attach(plan_.job_id, plan_.rank, 30.0);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    client_ = std::move(*c);
  }
  void MakeStager(const StagingOptions& options) {
    auto s = Stager::Create(client_.get(), options);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    stager_ = std::move(*s);
    ASSERT_TRUE(stager_->on_gpu()) << stager_->path_note();
  }
  // Waits for the batch's copy, brings the device bytes back and checks them
  // against the pattern the producer wrote into the slot.
  void ExpectDeviceBatch(const StagedBatch& b, uint64_t sequence) {
    const uint64_t epoch = sequence / plan_.batches_per_epoch;
    const uint64_t batch = sequence % plan_.batches_per_epoch;
    ASSERT_TRUE(b.on_device);
    EXPECT_EQ(b.host.sequence, sequence);
    EXPECT_EQ(b.host.epoch, epoch);
    EXPECT_EQ(b.host.batch, batch);
    ASSERT_EQ(b.host.size, staging_test::BatchSizeOf(plan_, batch));
    EXPECT_EQ(b.host.pixels, nullptr) << "the slot is the producer's again after the copy";
    ASSERT_NE(b.ready_event, nullptr);
    ASSERT_EQ(cudaEventSynchronize(static_cast<cudaEvent_t>(b.ready_event)), cudaSuccess);
    const size_t n = b.host.size;
    std::vector<uint8_t> pixels(n * staging_test::SampleBytes(plan_));
    std::vector<int64_t> labels(n), indices(n);
    ASSERT_EQ(cudaMemcpy(pixels.data(), b.device_pixels, pixels.size(), cudaMemcpyDeviceToHost),
              cudaSuccess);
    ASSERT_EQ(cudaMemcpy(labels.data(), b.device_labels, n * 8, cudaMemcpyDeviceToHost),
              cudaSuccess);
    ASSERT_EQ(cudaMemcpy(indices.data(), b.device_indices, n * 8, cudaMemcpyDeviceToHost),
              cudaSuccess);
    EXPECT_EQ(DiffFromPattern(plan_, epoch, batch, pixels.data(), labels.data(), indices.data()),
              "");
  }

  ProducerPlan plan_;
  std::unique_ptr<ForkedProducer> producer_;
  std::unique_ptr<RingClient> client_;
  std::unique_ptr<Stager> stager_;
};

TEST_F(StagingGpuTest, DeviceCopiesEqualTheSlotsInOrderAcrossEpochs) {
  SKIP_WITHOUT_DEVICE();
  ASSERT_NO_FATAL_FAILURE(Start("gpu-inorder"));
  ASSERT_NO_FATAL_FAILURE(MakeStager(StagingOptions{}));
  EXPECT_EQ(stager_->path_note().rfind("GPU path: device ", 0), 0u) << stager_->path_note();
  EXPECT_NE(stager_->path_note().find("ring registered as pinned"), std::string::npos);
  for (uint64_t i = 0; i < plan_.epochs * plan_.batches_per_epoch; ++i) {
    auto b = stager_->Next(30.0);
    ASSERT_TRUE(b.ok()) << "batch " << i << ": " << b.status().ToString();
    ASSERT_NO_FATAL_FAILURE(ExpectDeviceBatch(*b, i));
    ASSERT_TRUE(stager_->Release(*b).ok());
  }
  auto end = stager_->Next(30.0);
  EXPECT_EQ(end.status().code(), StatusCode::kOutOfRange) << end.status().ToString();
  ASSERT_TRUE(stager_->Synchronize().ok());
  stager_.reset();
  client_.reset();
  EXPECT_EQ(producer_->Wait(30.0), 0);
}

TEST_F(StagingGpuTest, SlotsGoBackToTheProducerOnceCopiedWhileDeviceBuffersAreHeld) {
  SKIP_WITHOUT_DEVICE();
  ProducerPlan plan;
  plan.slots = 2;
  ASSERT_NO_FATAL_FAILURE(Start("gpu-release", plan));
  StagingOptions o;
  o.device_buffers = 2;
  ASSERT_NO_FATAL_FAILURE(MakeStager(o));
  // Both device buffers held by us, never released to the stager...
  auto a = stager_->Next(30.0);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  auto b = stager_->Next(30.0);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_NE(a->buffer, b->buffer);
  ASSERT_TRUE(stager_->Synchronize().ok());
  // ...yet both ring slots are the producer's again:
  EXPECT_EQ(client_->held(), 0u);
  auto full = stager_->Next(30.0);
  EXPECT_EQ(full.status().code(), StatusCode::kFailedPrecondition) << full.status().ToString();
  // and it has refilled them: the ring itself hands out batches 2 and 3.
  for (uint64_t want = 2; want < 4; ++want) {
    auto r = client_->Next(30.0);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->sequence, want);
    EXPECT_EQ(DiffFromPattern(plan_, 0, want, r->pixels, r->labels, r->indices), "");
    ASSERT_TRUE(client_->Release(*r).ok());
  }
  // The held device copies were not disturbed by the refill.
  ASSERT_NO_FATAL_FAILURE(ExpectDeviceBatch(*a, 0));
  ASSERT_NO_FATAL_FAILURE(ExpectDeviceBatch(*b, 1));
}

TEST_F(StagingGpuTest, ReleaseWithTheCallersStreamOrdersTheBuffersReuse) {
  SKIP_WITHOUT_DEVICE();
  ASSERT_NO_FATAL_FAILURE(Start("gpu-stream"));
  StagingOptions o;
  o.device_buffers = 1;  // every batch reuses the one buffer
  ASSERT_NO_FATAL_FAILURE(MakeStager(o));
  cudaStream_t mine = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&mine, cudaStreamNonBlocking), cudaSuccess);
  // Our "training step": a long device-to-device copy, then reading the batch
  // back into pinned memory. The batch is released right after queuing it, so
  // the next copy into the buffer is queued while ours is still running; only
  // the stream given to Release keeps it from overwriting what we read.
#ifdef NL_FAKE_CUDA
  const size_t busy_bytes = size_t{64} << 20;  // a host memcpy in the fake
#else
  const size_t busy_bytes = size_t{1} << 30;
#endif
  void* busy = nullptr;
  ASSERT_EQ(cudaMalloc(&busy, 2 * busy_bytes), cudaSuccess);
  const size_t max_pixels = plan_.batch_size * staging_test::SampleBytes(plan_);
  void* pinned = nullptr;
  ASSERT_EQ(cudaMallocHost(&pinned, max_pixels), cudaSuccess);
  auto* got = static_cast<uint8_t*>(pinned);
  std::vector<int64_t> no_labels(plan_.batch_size), no_indices(plan_.batch_size);
  const uint64_t total = plan_.epochs * plan_.batches_per_epoch;
  RingBatch previous;
  for (uint64_t i = 0; i <= total; ++i) {
    Result<StagedBatch> b = Status::OutOfRange("past the run");
    if (i < total) {
      b = stager_->Next(30.0);  // queues a copy into the buffer we may still be reading
      ASSERT_TRUE(b.ok()) << b.status().ToString();
      EXPECT_EQ(b->buffer, 0u);
    }
    if (i > 0) {
      ASSERT_EQ(cudaStreamSynchronize(mine), cudaSuccess);
      // Labels and indices were not read back: give the pattern's own.
      for (uint32_t s = 0; s < previous.size; ++s) {
        no_labels[s] = staging_test::LabelOf(previous.epoch, previous.batch, s);
        no_indices[s] = staging_test::IndexOf(previous.epoch, previous.batch, s);
      }
      EXPECT_EQ(DiffFromPattern(plan_, previous.epoch, previous.batch, got, no_labels.data(),
                                no_indices.data()),
                "");
    }
    if (i == total) break;
    ASSERT_EQ(cudaStreamWaitEvent(mine, static_cast<cudaEvent_t>(b->ready_event), 0), cudaSuccess);
    ASSERT_EQ(cudaMemcpyAsync(static_cast<char*>(busy) + busy_bytes, busy, busy_bytes,
                              cudaMemcpyDeviceToDevice, mine),
              cudaSuccess);
    ASSERT_EQ(
        cudaMemcpyAsync(got, b->device_pixels, b->host.size * staging_test::SampleBytes(plan_),
                        cudaMemcpyDeviceToHost, mine),
        cudaSuccess);
    ASSERT_TRUE(stager_->Release(*b, mine).ok());
    previous = b->host;
  }
  ASSERT_TRUE(stager_->Synchronize().ok());
  EXPECT_EQ(cudaFreeHost(got), cudaSuccess);
  EXPECT_EQ(cudaFree(busy), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(mine), cudaSuccess);
}

TEST_F(StagingGpuTest, MoreDeviceBuffersThanRingSlotsHoldsTheWholeBatchesAndGoesOn) {
  SKIP_WITHOUT_DEVICE();
  ProducerPlan plan;
  plan.slots = 2;
  ASSERT_NO_FATAL_FAILURE(Start("gpu-morebuffers", plan));
  StagingOptions o;
  o.device_buffers = 4;  // twice the ring: copies must free slots before the ring runs dry
  ASSERT_NO_FATAL_FAILURE(MakeStager(o));
  const uint64_t total = plan_.epochs * plan_.batches_per_epoch;
  uint64_t next = 0;
  while (next < total) {
    std::vector<StagedBatch> held;
    for (uint32_t k = 0; k < o.device_buffers && next < total; ++k, ++next) {
      auto b = stager_->Next(30.0);
      ASSERT_TRUE(b.ok()) << "batch " << next << ": " << b.status().ToString();
      held.push_back(*b);
    }
    for (size_t k = 0; k < held.size(); ++k) {
      ASSERT_NO_FATAL_FAILURE(ExpectDeviceBatch(held[k], next - held.size() + k));
    }
    for (const StagedBatch& b : held) ASSERT_TRUE(stager_->Release(b).ok());
  }
  ASSERT_TRUE(stager_->Synchronize().ok());
}

TEST_F(StagingGpuTest, ADeviceThatDoesNotExistIsRefused) {
  std::string why;
  int n = DeviceCount(&why);
  if (n == 0) GTEST_SKIP() << why;
  ASSERT_NO_FATAL_FAILURE(Start("gpu-nodevice"));
  StagingOptions o;
  o.device = n;
  auto s = Stager::Create(client_.get(), o);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("device " + std::to_string(n) + " does not exist"),
            std::string::npos)
      << s.status().ToString();
}

TEST_F(StagingGpuTest, ASecondStagerOnOneClientIsRefusedAndLeavesNothingBehind) {
  SKIP_WITHOUT_DEVICE();
  ASSERT_NO_FATAL_FAILURE(Start("gpu-twice"));
#ifdef NL_FAKE_CUDA
  const FakeCudaCounts before = FakeCudaLiveObjects();
#endif
  ASSERT_NO_FATAL_FAILURE(MakeStager(StagingOptions{}));
  // The ring is registered already: the second registration fails, and the
  // message names the call and the device.
  auto second = Stager::Create(client_.get(), StagingOptions{});
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find("cudaHostRegister of the ring failed on device "),
            std::string::npos)
      << second.status().ToString();
  // The first still works.
  auto b = stager_->Next(30.0);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  ASSERT_NO_FATAL_FAILURE(ExpectDeviceBatch(*b, 0));
  ASSERT_TRUE(stager_->Release(*b).ok());
#ifdef NL_FAKE_CUDA
  const FakeCudaCounts with = FakeCudaLiveObjects();
  EXPECT_EQ(with.streams - before.streams, 1);
  EXPECT_EQ(with.registrations - before.registrations, 1);
  EXPECT_EQ(with.device_allocations - before.device_allocations, 2);  // device_buffers
  EXPECT_EQ(with.events - before.events, 4);  // ready + consumer_done per buffer
  stager_.reset();
  const FakeCudaCounts after = FakeCudaLiveObjects();
  EXPECT_EQ(after.streams, before.streams);
  EXPECT_EQ(after.events, before.events);
  EXPECT_EQ(after.device_allocations, before.device_allocations);
  EXPECT_EQ(after.registrations, before.registrations);
#endif
}

}  // namespace
}  // namespace nl
