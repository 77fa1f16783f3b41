// The ring between processes: a real `loader serve` (spawned) or a
// RingProducer in this process, and RingClient on the other end.
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <thread>

#include "base/file_util.h"
#include "formats/image.h"
#include "formats/manifest.h"
#include "formats/record.h"
#include "formats/shard.h"
#include "loader/pipeline/pipeline.h"
#include "loader/ring/client.h"
#include "loader/ring/producer.h"
#include "loader/ring/ring_layout.h"
#include "tests/support/test_util.h"

extern char** environ;

namespace nl {
namespace {

std::string JobId(const std::string& name) {
  return name + "-" + std::to_string(::getpid());
}

// n PNG records of varied 8..40-pixel images, labels i % 3.
std::string PackPngs(const testing::ScratchDir& d, uint64_t n) {
  const std::string root = d / "data";
  Manifest m;
  m.source_kind = "imagefolder";
  m.classes = {"a", "b", "c"};
  SplitInfo s;
  s.encoding = "png";
  EXPECT_TRUE(MakeDirs(root + "/train").ok());
  auto w = ShardWriter::Create(root, "train/shard-00000", 0);
  EXPECT_TRUE(w.ok());
  for (uint64_t i = 0; i < n; ++i) {
    const uint32_t side = 8 + static_cast<uint32_t>(i * 7 % 33);
    std::vector<uint8_t> png = *EncodePng(testing::PatternImage(side, side + 3, static_cast<uint32_t>(i)));
    std::vector<uint8_t> rec;
    RecordHeader h;
    h.label = static_cast<uint32_t>(i % 3);
    h.encoding = Encoding::kPng;
    h.width = side;
    h.height = side + 3;
    EncodeRecord(h, png, &rec);
    EXPECT_TRUE((*w)->Put(i, rec).ok());
  }
  s.shards.push_back(*(*w)->Finish());
  s.num_samples = n;
  m.splits["train"] = s;
  EXPECT_TRUE(SaveManifest(root, m).ok());
  return root;
}

// A spawned `loader serve`, killed (and reaped) when it goes out of scope.
class ServeProcess {
 public:
  explicit ServeProcess(std::vector<std::string> args) {
    const char* bin = std::getenv("NL_BIN_DIR");
    std::string loader = std::string(bin ? bin : "bin") + "/loader";
    args.insert(args.begin(), {loader, "serve"});
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    EXPECT_EQ(0, posix_spawn(&pid_, loader.c_str(), nullptr, nullptr, argv.data(), environ))
        << loader;
  }
  ~ServeProcess() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  // Its exit status after it ends by itself (waits up to 10 s).
  int Wait() {
    for (int i = 0; i < 200; ++i) {
      int st = 0;
      if (::waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return -1;
  }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
};

PipelineConfig InProcessConfig(const std::string& data) {
  PipelineConfig c;
  c.data_dir = data;
  c.batch_size = 8;
  c.threads = 2;
  c.prefetch = 3;
  c.seed = 11;
  c.epochs = 2;
  c.transform.image_size = 24;
  return c;
}

TEST(RingService, BatchesOfTwoEpochsEqualTheInProcessPipelineByteForByte) {
  testing::ScratchDir d;
  const std::string data = PackPngs(d, 61);  // 7 full batches and one of 5 per epoch
  const std::string job = JobId("equal");
  ServeProcess serve({"--data", data, "--job-id", job, "--batch-size", "8", "--threads", "2",
                      "--prefetch", "3", "--seed", "11", "--epochs", "2", "--image-size", "24",
                      "--no-bind"});
  auto client = RingClient::Attach(job, 0, 20.0);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  const RingInfo& info = (*client)->info();
  EXPECT_EQ(info.geometry.batch_size, 8u);
  EXPECT_EQ(info.geometry.height, 24u);
  EXPECT_EQ(info.geometry.slot_count, 3u);
  EXPECT_EQ(info.batches_per_epoch, 8u);
  EXPECT_EQ(info.producer_pid, serve.pid());

  auto pipeline = Pipeline::Open(InProcessConfig(data));
  ASSERT_TRUE(pipeline.ok()) << pipeline.status().ToString();
  const size_t sample_bytes = (*pipeline)->sample_bytes();
  ASSERT_EQ(sample_bytes, info.geometry.sample_bytes);
  for (uint64_t i = 0; i < 16; ++i) {
    Result<RingBatch> r = (*client)->Next(20.0);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    Result<BatchView> p = (*pipeline)->Next();
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    EXPECT_EQ(r->sequence, i);
    EXPECT_EQ(r->epoch, i / 8);
    EXPECT_EQ(r->batch, i % 8);
    ASSERT_EQ(r->size, p->size);
    EXPECT_EQ(r->size, i % 8 == 7 ? 5u : 8u);
    EXPECT_EQ(0, std::memcmp(r->indices, p->indices, r->size * 8)) << "batch " << i;
    EXPECT_EQ(0, std::memcmp(r->labels, p->labels, r->size * 8)) << "batch " << i;
    EXPECT_EQ(0, std::memcmp(r->pixels, p->pixels, r->size * sample_bytes)) << "batch " << i;
    ASSERT_TRUE((*client)->Release(*r).ok());
    ASSERT_TRUE((*pipeline)->Release(*p).ok());
  }
  Result<RingBatch> end = (*client)->Next(20.0);
  ASSERT_FALSE(end.ok());
  EXPECT_EQ(end.status().code(), StatusCode::kOutOfRange) << end.status().ToString();
  client->reset();  // detach: the producer exits 0
  EXPECT_EQ(serve.Wait(), 0);
}

TEST(RingService, SeekAnswersWithThatPositionAndDropsWhatWasPublishedBefore) {
  testing::ScratchDir d;
  const std::string data = PackPngs(d, 40);
  const std::string job = JobId("seek");
  ServeProcess serve({"--data", data, "--job-id", job, "--batch-size", "4", "--threads", "1",
                      "--prefetch", "4", "--image-size", "16", "--no-bind"});
  auto client = RingClient::Attach(job, 0, 20.0);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  RingClient& c = **client;
  Result<RingBatch> first = c.Next(20.0);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(first->epoch, 0u);
  EXPECT_EQ(first->batch, 0u);
  // With a batch held, a seek is refused (its slot could not be taken back).
  Status held = c.Seek(5, 3);
  EXPECT_EQ(held.code(), StatusCode::kFailedPrecondition) << held.ToString();
  ASSERT_TRUE(c.Release(*first).ok());
  EXPECT_EQ(c.Release(*first).code(), StatusCode::kInvalidArgument);  // twice
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // let the ring fill up
  ASSERT_TRUE(c.Seek(5, 3).ok());
  for (uint64_t i = 0; i < 12; ++i) {
    Result<RingBatch> b = c.Next(20.0);
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    const uint64_t pos = 3 + i;
    EXPECT_EQ(b->epoch, 5 + pos / 10) << i;
    EXPECT_EQ(b->batch, pos % 10) << i;
    ASSERT_TRUE(c.Release(*b).ok());
  }
  EXPECT_EQ(c.Seek(0, 10).code(), StatusCode::kInvalidArgument);  // past the epoch's 10 batches
  // set_epoch to where it is going anyway changes nothing.
  ASSERT_TRUE(c.Seek(6, 5).ok());
  Result<RingBatch> b = c.Next(20.0);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->epoch, 6u);
  EXPECT_EQ(b->batch, 5u);
  ASSERT_TRUE(c.Release(*b).ok());
}

TEST(RingService, AfterTheLastEpochASeekStartsTheStreamAgain) {
  testing::ScratchDir d;
  const std::string data = PackPngs(d, 12);
  const std::string job = JobId("again");
  ServeProcess serve({"--data", data, "--job-id", job, "--batch-size", "4", "--threads", "1",
                      "--prefetch", "2", "--image-size", "8", "--epochs", "2", "--no-bind"});
  auto client = RingClient::Attach(job, 0, 20.0);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  RingClient& c = **client;
  for (int round = 0; round < 3; ++round) {
    for (uint64_t i = 0; i < 6; ++i) {
      Result<RingBatch> b = c.Next(20.0);
      ASSERT_TRUE(b.ok()) << "round " << round << ": " << b.status().ToString();
      EXPECT_EQ(b->epoch, i / 3);
      EXPECT_EQ(b->batch, i % 3);
      ASSERT_TRUE(c.Release(*b).ok());
    }
    Result<RingBatch> end = c.Next(20.0);
    ASSERT_FALSE(end.ok());
    ASSERT_EQ(end.status().code(), StatusCode::kOutOfRange) << end.status().ToString();
    EXPECT_EQ(c.Seek(2, 0).code(), StatusCode::kInvalidArgument);  // it serves epochs 0 and 1
    ASSERT_TRUE(c.Seek(0, 0).ok());
  }
}

TEST(RingService, EveryBatchHeldMakesNextFailInsteadOfWaitingForItself) {
  testing::ScratchDir d;
  const std::string data = PackPngs(d, 40);
  const std::string job = JobId("held");
  ServeProcess serve({"--data", data, "--job-id", job, "--batch-size", "4", "--threads", "1",
                      "--prefetch", "2", "--image-size", "16", "--no-bind"});
  auto client = RingClient::Attach(job, 0, 20.0);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  Result<RingBatch> a = (*client)->Next(20.0);
  Result<RingBatch> b = (*client)->Next(20.0);
  ASSERT_TRUE(a.ok() && b.ok());
  Result<RingBatch> c = (*client)->Next(20.0);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kFailedPrecondition) << c.status().ToString();
  // A forged release (a position that wraps) changes nothing.
  RingBatch forged = *a;
  forged.slot = 1 - a->slot;
  forged.position = ~uint64_t{0};
  EXPECT_EQ((*client)->Release(forged).code(), StatusCode::kInvalidArgument);
  // Released out of order: with batch 0 still held, batch 2 (its slot) cannot
  // come, and Next says so instead of waiting for itself.
  ASSERT_TRUE((*client)->Release(*b).ok());
  Result<RingBatch> blocked = (*client)->Next(20.0);
  ASSERT_FALSE(blocked.ok());
  EXPECT_EQ(blocked.status().code(), StatusCode::kFailedPrecondition) << blocked.status().ToString();
  EXPECT_NE(blocked.status().message().find("release it first"), std::string::npos);
  ASSERT_TRUE((*client)->Release(*a).ok());
  Result<RingBatch> next = (*client)->Next(20.0);
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_EQ(next->batch, 2u);
}

TEST(RingService, ReleaseFromAnotherThreadWhileNextWaits) {
  testing::ScratchDir d;
  const std::string data = PackPngs(d, 40);
  const std::string job = JobId("threads");
  ServeProcess serve({"--data", data, "--job-id", job, "--batch-size", "4", "--threads", "1",
                      "--prefetch", "1", "--image-size", "16", "--no-bind"});
  auto client = RingClient::Attach(job, 0, 20.0);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  RingClient& c = **client;
  for (int i = 0; i < 20; ++i) {
    Result<RingBatch> b = c.Next(20.0);
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    // One slot: the next batch exists only after this release, which
    // another thread makes while... this thread has gone on (as a GPU
    // copy's completion callback would).
    std::thread t([&c, batch = *b] { ASSERT_TRUE(c.Release(batch).ok()); });
    t.join();
  }
}

// --- segments that must be refused ------------------------------------------

// A producer in a thread whose header `tamper` changes before it is handed over.
Status AttachToTampered(const std::string& name, const std::function<void(ring::Header&)>& tamper) {
  RingSpec spec;
  spec.job_id = JobId(name);
  spec.geometry = *ring::MakeGeometry(2, 4, 16, 16, ring::Dtype::kUint8, ring::PixelLayout::kNCHW);
  spec.batches_per_epoch = 3;
  std::vector<std::string> log;
  spec.log = [&log](const std::string& l) { log.push_back(l); };
  auto p = RingProducer::Create(spec);
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  tamper(*(*p)->header());
  std::thread producer([&] { (void)(*p)->WaitForConsumer(10.0, nullptr); });
  auto c = RingClient::Attach(spec.job_id, 0, 10.0);
  producer.join();
  EXPECT_FALSE(c.ok());
  // The producer hears why.
  for (int i = 0; i < 50 && !(*p)->ConsumerGone(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE((*p)->ConsumerGone());
  return c.ok() ? Status::Ok() : c.status();
}

TEST(RingSegment, WrongMagicIsRefused) {
  Status s = AttachToTampered("magic", [](ring::Header& h) { h.magic ^= 1; });
  EXPECT_NE(s.message().find("wrong magic"), std::string::npos) << s.ToString();
}

TEST(RingSegment, WrongVersionIsRefusedNamingBoth) {
  Status s = AttachToTampered("version", [](ring::Header& h) { h.version = 99; });
  EXPECT_NE(s.message().find("version 99, this consumer reads version 2"), std::string::npos)
      << s.ToString();
}

TEST(RingSegment, GeometryThatDoesNotFitTheSegmentIsRefused) {
  Status s = AttachToTampered("slots", [](ring::Header& h) { h.geometry.slot_count = 3; });
  EXPECT_NE(s.message().find("the segment has"), std::string::npos) << s.ToString();
  s = AttachToTampered("batch", [](ring::Header& h) { h.geometry.batch_size = 0; });
  EXPECT_NE(s.message().find("batch size 0"), std::string::npos) << s.ToString();
  s = AttachToTampered("overlap", [](ring::Header& h) { h.geometry.labels_offset -= 64; });
  EXPECT_NE(s.message().find("overlap the pixels"), std::string::npos) << s.ToString();
  s = AttachToTampered("shape", [](ring::Header& h) { h.geometry.height = 17; });
  EXPECT_NE(s.message().find("do not match the image shape"), std::string::npos) << s.ToString();
  s = AttachToTampered("huge", [](ring::Header& h) { h.geometry.slot_bytes = ~uint64_t{0} & ~uint64_t{4095}; });
  EXPECT_FALSE(s.ok());
}

TEST(RingSegment, AnotherJobsSegmentIsRefused) {
  Status s = AttachToTampered("job", [](ring::Header& h) { h.job_id[0] = 'X'; });
  EXPECT_NE(s.message().find("its segment is for job X"), std::string::npos) << s.ToString();
}

TEST(RingSegment, MakeGeometryBoundsItsInputs) {
  using ring::Dtype;
  using ring::PixelLayout;
  EXPECT_FALSE(ring::MakeGeometry(0, 4, 8, 8, Dtype::kUint8, PixelLayout::kNCHW).ok());
  EXPECT_FALSE(ring::MakeGeometry(2, 0, 8, 8, Dtype::kUint8, PixelLayout::kNCHW).ok());
  EXPECT_FALSE(ring::MakeGeometry(2, 4, 0, 8, Dtype::kUint8, PixelLayout::kNCHW).ok());
  EXPECT_FALSE(ring::MakeGeometry(1024, 65536, 16384, 16384, Dtype::kFloat32, PixelLayout::kNCHW).ok());
  auto g = ring::MakeGeometry(3, 256, 224, 224, Dtype::kUint8, PixelLayout::kNHWC);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->sample_bytes, 3u * 224 * 224);
  EXPECT_EQ(g->slot_bytes % ring::kPage, 0u);
  EXPECT_EQ(g->pixels_offset % ring::kPage, 0u);
  ring::Header h;
  h.magic = ring::kMagic;
  h.version = ring::kVersion;
  h.header_bytes = sizeof(ring::Header);
  h.geometry = *g;
  EXPECT_TRUE(ring::CheckGeometry(h, g->total_bytes).ok());
  EXPECT_FALSE(ring::CheckGeometry(h, g->total_bytes - ring::kPage).ok());
}

TEST(RingSocket, JobIdsAreCheckedBeforeAnyNameIsMade) {
  EXPECT_TRUE(ring::SocketName("job-1.a_b", 3).ok());
  EXPECT_EQ(*ring::SocketName("j", 3), "numa_loader/j/3");
  EXPECT_FALSE(ring::SocketName("", 0).ok());
  EXPECT_FALSE(ring::SocketName("a/b", 0).ok());
  EXPECT_FALSE(ring::SocketName("a b", 0).ok());
  EXPECT_FALSE(ring::SocketName("caf\xc3\xa9", 0).ok());
  EXPECT_FALSE(ring::SocketName(std::string(65, 'x'), 0).ok());
  EXPECT_FALSE(ring::SocketName("j", -1).ok());
}

TEST(RingSocket, NoProducerIsNotFoundAfterTheTimeout) {
  auto c = RingClient::Attach(JobId("nobody-serves-this"), 0, 0.2);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kNotFound);
  EXPECT_NE(c.status().message().find("appeared within 0.2 s"), std::string::npos);
}

}  // namespace
}  // namespace nl
