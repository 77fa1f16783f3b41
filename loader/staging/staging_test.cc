// The staging layer's CPU path against a real ring: a producer in a forked
// child process publishes a known pattern; the consumer side checks every byte.
#include "loader/staging/staging.h"

#include <gtest/gtest.h>

#ifdef NL_STAGING_CUDA
#include <cuda_runtime_api.h>
#endif

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "loader/staging/staging_test_producer.h"

namespace nl {
namespace {

using staging_test::DiffFromPattern;
using staging_test::ForkedProducer;
using staging_test::ProducerPlan;

bool HaveCudaDevice() {
#ifdef NL_STAGING_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return n > 0;
#else
  return false;
#endif
}

class StagingTest : public ::testing::Test {
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
  }
  // Checks one CPU batch: position, pointers, and every byte.
  void ExpectBatch(const StagedBatch& b, uint64_t sequence) {
    const uint64_t epoch = sequence / plan_.batches_per_epoch;
    const uint64_t batch = sequence % plan_.batches_per_epoch;
    EXPECT_EQ(b.host.sequence, sequence);
    EXPECT_EQ(b.host.epoch, epoch);
    EXPECT_EQ(b.host.batch, batch);
    EXPECT_EQ(b.host.size, staging_test::BatchSizeOf(plan_, batch));
    EXPECT_FALSE(b.on_device);
    EXPECT_EQ(b.device_pixels, nullptr);
    EXPECT_EQ(b.device_labels, nullptr);
    EXPECT_EQ(b.device_indices, nullptr);
    EXPECT_EQ(b.ready_event, nullptr);
    EXPECT_EQ(b.buffer, b.host.slot);
    EXPECT_EQ(DiffFromPattern(plan_, epoch, batch, b.host.pixels, b.host.labels, b.host.indices),
              "");
  }
  // Ends the run: the stager and client go, and the producer exits cleanly.
  void Finish() {
    stager_.reset();
    client_.reset();
    EXPECT_EQ(producer_->Wait(30.0), 0) << "the test producer did not exit cleanly";
  }

  ProducerPlan plan_;
  std::unique_ptr<ForkedProducer> producer_;
  std::unique_ptr<RingClient> client_;
  std::unique_ptr<Stager> stager_;
};

TEST_F(StagingTest, CpuPathHandsOutTheSlotBytesInOrderAcrossEpochs) {
  ASSERT_NO_FATAL_FAILURE(Start("inorder"));
  StagingOptions o;
  o.cpu = true;
  ASSERT_NO_FATAL_FAILURE(MakeStager(o));
  EXPECT_FALSE(stager_->on_gpu());
  EXPECT_EQ(stager_->path_note(), "CPU path: asked for (StagingOptions::cpu)");
  const uint64_t total = plan_.epochs * plan_.batches_per_epoch;  // 10 batches through 3 slots
  for (uint64_t i = 0; i < total; ++i) {
    auto b = stager_->Next(30.0);
    ASSERT_TRUE(b.ok()) << "batch " << i << ": " << b.status().ToString();
    ExpectBatch(*b, i);
    ASSERT_TRUE(stager_->Release(*b).ok());
  }
  auto end = stager_->Next(30.0);
  ASSERT_FALSE(end.ok());
  EXPECT_EQ(end.status().code(), StatusCode::kOutOfRange) << end.status().ToString();
  EXPECT_TRUE(stager_->Synchronize().ok());
  Finish();
}

TEST_F(StagingTest, HeldBatchesKeepTheirBytesUntilReleasedInAnyOrder) {
  ASSERT_NO_FATAL_FAILURE(Start("held"));
  StagingOptions o;
  o.cpu = true;
  ASSERT_NO_FATAL_FAILURE(MakeStager(o));
  // Hold every slot, so the producer can overwrite none of them.
  std::vector<StagedBatch> held;
  std::set<uint32_t> slots;
  for (uint32_t i = 0; i < plan_.slots; ++i) {
    auto b = stager_->Next(30.0);
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    held.push_back(*b);
    slots.insert(b->host.slot);
  }
  EXPECT_EQ(slots.size(), plan_.slots) << "each held batch has its own slot";
  for (uint64_t i = 0; i < held.size(); ++i) ExpectBatch(held[i], i);
  // Newest first, then the rest of the run.
  for (auto it = held.rbegin(); it != held.rend(); ++it) ASSERT_TRUE(stager_->Release(*it).ok());
  for (uint64_t i = plan_.slots; i < plan_.epochs * plan_.batches_per_epoch; ++i) {
    auto b = stager_->Next(30.0);
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    ExpectBatch(*b, i);
    ASSERT_TRUE(stager_->Release(*b).ok());
  }
  Finish();
}

TEST_F(StagingTest, ReleasingABatchTwiceOrOneNeverHandedOutIsRefused) {
  ASSERT_NO_FATAL_FAILURE(Start("twice"));
  StagingOptions o;
  o.cpu = true;
  ASSERT_NO_FATAL_FAILURE(MakeStager(o));
  auto b = stager_->Next(30.0);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  ASSERT_TRUE(stager_->Release(*b).ok());
  Status again = stager_->Release(*b);
  EXPECT_EQ(again.code(), StatusCode::kInvalidArgument) << again.ToString();
  EXPECT_NE(again.message().find("sequence 0"), std::string::npos) << again.ToString();
  EXPECT_NE(again.message().find("not out"), std::string::npos) << again.ToString();

  StagedBatch forged = *b;
  forged.host.sequence = 99;
  EXPECT_EQ(stager_->Release(forged).code(), StatusCode::kInvalidArgument);
  StagedBatch device_kind = *b;
  device_kind.on_device = true;
  EXPECT_EQ(stager_->Release(device_kind).code(), StatusCode::kInvalidArgument);
  // The stream goes on as before.
  auto next = stager_->Next(30.0);
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  ExpectBatch(*next, 1);
  ASSERT_TRUE(stager_->Release(*next).ok());
}

TEST_F(StagingTest, WithoutADeviceDefaultOptionsFallBackToTheCpuPathAndSayWhy) {
  if (HaveCudaDevice()) GTEST_SKIP() << "a CUDA device is present: the GPU tests cover it";
  ASSERT_NO_FATAL_FAILURE(Start("fallback"));
  ASSERT_NO_FATAL_FAILURE(MakeStager(StagingOptions{}));
  EXPECT_FALSE(stager_->on_gpu());
#ifdef NL_STAGING_CUDA
  // Built with CUDA, no device at run time: the runtime's own reason.
  const std::string prefix = "CPU path: no CUDA device (cudaGetDeviceCount: ";
  EXPECT_EQ(stager_->path_note().rfind(prefix, 0), 0u) << stager_->path_note();
  EXPECT_GT(stager_->path_note().size(), prefix.size() + 1) << stager_->path_note();
#else
  EXPECT_EQ(stager_->path_note(), "CPU path: built without CUDA");
#endif
  auto b = stager_->Next(30.0);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  ExpectBatch(*b, 0);
  ASSERT_TRUE(stager_->Release(*b).ok());
}

TEST_F(StagingTest, AskingForADeviceThatIsNotThereIsAnErrorNotAFallback) {
  if (HaveCudaDevice()) GTEST_SKIP() << "a CUDA device is present: the GPU tests cover it";
  ASSERT_NO_FATAL_FAILURE(Start("nodevice"));
  StagingOptions o;
  o.device = 0;
  auto s = Stager::Create(client_.get(), o);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument) << s.status().ToString();
  EXPECT_NE(s.status().message().find("device 0 asked for"), std::string::npos)
      << s.status().ToString();
}

TEST_F(StagingTest, BadOptionsAreRefusedWithTheReason) {
  auto none = Stager::Create(nullptr, StagingOptions{});
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(none.status().message().find("no ring client"), std::string::npos);

  ASSERT_NO_FATAL_FAILURE(Start("options"));
  StagingOptions zero;
  zero.device_buffers = 0;
  auto z = Stager::Create(client_.get(), zero);
  ASSERT_FALSE(z.ok());
  EXPECT_NE(z.status().message().find("device_buffers is 0, must be 1..64"), std::string::npos)
      << z.status().ToString();
  StagingOptions many;
  many.device_buffers = kMaxDeviceBuffers + 1;
  EXPECT_EQ(Stager::Create(client_.get(), many).status().code(), StatusCode::kInvalidArgument);
  StagingOptions both;
  both.cpu = true;
  both.device = 0;
  auto bt = Stager::Create(client_.get(), both);
  ASSERT_FALSE(bt.ok());
  EXPECT_NE(bt.status().message().find("both the CPU path and device 0"), std::string::npos)
      << bt.status().ToString();
  StagingOptions negative;
  negative.device = -2;
  EXPECT_EQ(Stager::Create(client_.get(), negative).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(StagingTest, TheProducersErrorTextReachesTheCaller) {
  ProducerPlan plan;
  plan.fail_after = 2;
  plan.error_text = "test producer: bad record 17 in shard train/shard-00000";
  ASSERT_NO_FATAL_FAILURE(Start("error", plan));
  StagingOptions o;
  o.cpu = true;
  ASSERT_NO_FATAL_FAILURE(MakeStager(o));
  for (uint64_t i = 0; i < 2; ++i) {  // what it published before failing comes first
    auto b = stager_->Next(30.0);
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    ExpectBatch(*b, i);
    ASSERT_TRUE(stager_->Release(*b).ok());
  }
  auto failed = stager_->Next(30.0);
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().code(), StatusCode::kUnavailable) << failed.status().ToString();
  EXPECT_NE(failed.status().message().find(plan.error_text), std::string::npos)
      << failed.status().ToString();
  EXPECT_EQ(producer_->Wait(30.0), 3);
}

}  // namespace
}  // namespace nl
