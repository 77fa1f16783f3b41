#include "loader/pipeline/pipeline.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <barrier>
#include <chrono>
#include <cstring>
#include <latch>
#include <stdexcept>
#include <thread>

#include "base/fd.h"
#include "base/file_util.h"
#include "base/memory.h"
#include "formats/pack/pack.h"
#include "formats/shard.h"
#include "tests/support/fault_shard_files.h"
#include "tests/support/test_util.h"

namespace nl {
namespace {

// A packed fake CIFAR-100 (train: n, test: 10), raw records.
std::string PackCifar(const testing::ScratchDir& d, uint64_t n) {
  EXPECT_TRUE(WriteFakeCifar100(d / "src", {.train = n, .test = 10, .seed = 2}).ok());
  PackOptions o;
  o.encoding = PackEncoding::kRaw;
  o.threads = 1;
  EXPECT_TRUE(PackCifar100(d / "src", d / "packed", CifarLabel::kFine, o).ok());
  return d / "packed";
}

PipelineConfig Config(const std::string& dir, uint32_t threads) {
  PipelineConfig c;
  c.data_dir = dir;
  c.batch_size = 16;
  c.threads = threads;
  c.prefetch = 3;
  c.seed = 11;
  c.epochs = 2;
  c.transform.image_size = 40;
  c.transform.train = true;
  c.transform.pad_crop = 4;
  return c;
}

struct Got {
  uint64_t epoch, batch;
  std::vector<uint8_t> pixels;
  std::vector<int64_t> labels, indices;
  bool operator==(const Got&) const = default;
};

std::vector<Got> Drain(Pipeline& p, size_t max_batches = SIZE_MAX) {
  std::vector<Got> out;
  while (out.size() < max_batches) {
    Result<BatchView> b = p.Next();
    if (!b.ok()) {
      EXPECT_EQ(b.status().code(), StatusCode::kOutOfRange) << b.status().ToString();
      break;
    }
    out.push_back({b->epoch, b->batch,
                   std::vector<uint8_t>(b->pixels, b->pixels + b->size * p.sample_bytes()),
                   std::vector<int64_t>(b->labels, b->labels + b->size),
                   std::vector<int64_t>(b->indices, b->indices + b->size)});
    EXPECT_TRUE(p.Release(*b).ok());
  }
  return out;
}

TEST(Pipeline, SameBytesWithOneAndFourThreadsAndMidEpochStart) {
  testing::ScratchDir d;
  const std::string dir = PackCifar(d, 150);
  auto one = Pipeline::Open(Config(dir, 1));
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  std::vector<Got> a = Drain(**one);
  auto four = Pipeline::Open(Config(dir, 4));
  ASSERT_TRUE(four.ok());
  std::vector<Got> b = Drain(**four);
  ASSERT_EQ(a.size(), 20u);  // 150 samples, 1 rank: 10 batches (the last of 6) x 2 epochs
  EXPECT_EQ(a.back().indices.size(), 6u);
  EXPECT_TRUE(a == b) << "thread count changed the bytes";
  EXPECT_NE(a[0].pixels, a[10].pixels) << "epochs should differ";

  PipelineConfig mid = Config(dir, 2);
  mid.start_epoch = 1;
  mid.start_batch = 3;
  mid.epochs = 1;
  auto m = Pipeline::Open(mid);
  ASSERT_TRUE(m.ok());
  std::vector<Got> c = Drain(**m);
  ASSERT_EQ(c.size(), 7u);
  EXPECT_EQ(c[0].epoch, 1u);
  EXPECT_EQ(c[0].batch, 3u);
  EXPECT_TRUE(c[0] == a[13]);
  EXPECT_TRUE(c.back() == a.back());
}

TEST(Pipeline, RanksFollowTheSampler) {
  testing::ScratchDir d;
  const std::string dir = PackCifar(d, 100);
  std::vector<int> seen(100, 0);
  for (int r = 0; r < 3; ++r) {
    PipelineConfig c = Config(dir, 2);
    c.rank = r;
    c.world = 3;
    c.epochs = 1;
    c.transform.train = false;
    auto p = Pipeline::Open(c);
    ASSERT_TRUE(p.ok());
    std::vector<Got> got = Drain(**p);
    std::vector<uint64_t> want = (*p)->sampler().EpochIndices(0);
    std::vector<uint64_t> indices;
    for (const Got& g : got)
      for (int64_t i : g.indices) indices.push_back(static_cast<uint64_t>(i));
    EXPECT_EQ(indices, want);
    for (uint64_t i : indices) ++seen[i];
  }
  for (int i = 0; i < 100; ++i) EXPECT_GE(seen[i], 1) << i;
}

// Blocks order with read-ahead: the same bytes for any thread count and from
// a mid-epoch start, every sample once per epoch over the ranks, and the
// read-ahead asked the kernel for the records (it runs beside the workers).
TEST(Pipeline, BlocksOrderWithReadAheadIsDeterministicAndExact) {
  testing::ScratchDir d;
  const std::string dir = PackCifar(d, 300);
  auto config = [&](uint32_t threads, int rank, int world) {
    PipelineConfig c = Config(dir, threads);
    c.order = OrderChoice::kBlocks;
    c.io_memory = 64 << 10;  // windows of ~10 records: many windows an epoch
    c.rank = rank;
    c.world = world;
    return c;
  };
  auto one = Pipeline::Open(config(1, 0, 1));
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  EXPECT_EQ((*one)->read_plan().order, SampleOrder::kBlocks);
  EXPECT_GT((*one)->read_plan().ahead_samples, 0u);
  std::vector<Got> a = Drain(**one);
  EXPECT_GT((*one)->Stats().ahead_bytes, 0u);
  auto four = Pipeline::Open(config(4, 0, 1));
  ASSERT_TRUE(four.ok());
  EXPECT_TRUE(a == Drain(**four)) << "thread count changed the bytes";
  PipelineConfig mid = config(3, 0, 1);
  mid.start_epoch = 1;
  mid.start_batch = 5;
  mid.epochs = 1;
  auto m = Pipeline::Open(mid);
  ASSERT_TRUE(m.ok());
  std::vector<Got> c = Drain(**m);
  ASSERT_FALSE(c.empty());
  EXPECT_TRUE(c[0] == a[19 + 5]);  // 19 batches an epoch
  std::vector<int> seen(300, 0);
  for (int r = 0; r < 3; ++r) {
    PipelineConfig rc = config(2, r, 3);
    rc.epochs = 1;
    auto p = Pipeline::Open(rc);
    ASSERT_TRUE(p.ok());
    for (const Got& g : Drain(**p))
      for (int64_t i : g.indices) ++seen[static_cast<size_t>(i)];
  }
  for (int i = 0; i < 300; ++i) EXPECT_EQ(seen[i], 1) << i;
  // The windows read into memory by the reader thread give each position
  // of the sampler's list, transformed from the record's own bytes (read
  // here with the split's reader), also with each epoch's last partial batch
  // dropped (positions no batch takes must not hold a window back) and from
  // a mid-epoch start.
  Result<Manifest> man = LoadManifest(dir);
  ASSERT_TRUE(man.ok());
  auto reader = SplitReader::Open(dir, *man, "train");
  ASSERT_TRUE(reader.ok());
  auto txn = (*reader)->BeginRead();
  EXPECT_FALSE((*one)->read_plan().staged) << "the split fits in memory: read with pread";
  for (bool drop : {false, true}) {
    PipelineConfig staged = config(2, 1, 2);
    staged.drop_last_batch = drop;
    staged.epochs = 3;
    staged.start_batch = 2;
    staged.memory_bytes = 1 << 20;  // the 1.2 MB split does not fit in half of it
    auto ps = Pipeline::Open(staged);
    ASSERT_TRUE(ps.ok()) << ps.status().ToString();
    EXPECT_TRUE((*ps)->read_plan().staged);
    EXPECT_TRUE((*ps)->read_plan().direct);
    std::vector<Got> gs = Drain(**ps);
    ASSERT_EQ(gs.size(), drop ? 3u * 9 - 2 : 3u * 10 - 2);
    EXPECT_GT((*ps)->Stats().ahead_bytes, 0u) << "the reader thread read the windows";
    TransformConfig tc = staged.transform;
    tc.seed = staged.seed;  // as the pipeline sets it
    SampleTransform t(tc);
    std::vector<uint8_t> want(t.SampleBytes());
    for (const Got& g : gs) {
      const std::vector<uint64_t> list = (*ps)->sampler().EpochIndices(g.epoch);
      for (size_t j = 0; j < g.indices.size(); ++j) {
        const uint64_t index = list[g.batch * 16 + j];
        ASSERT_EQ(static_cast<uint64_t>(g.indices[j]), index);
        Result<RecordView> rec = txn.Read(index);
        ASSERT_TRUE(rec.ok());
        t.Apply(rec->payload.data(), 32, 32, g.epoch, index, want.data());
        ASSERT_EQ(0, std::memcmp(want.data(), g.pixels.data() + j * want.size(), want.size()))
            << "epoch " << g.epoch << " batch " << g.batch << " sample " << j;
        ASSERT_EQ(g.labels[j], rec->header.label);
      }
    }
  }
}

// Blocks order reads windows into the loader's memory: an --io-memory of
// more than half the memory this process may use is refused, not an OOM kill.
TEST(Pipeline, BlocksOrderRefusesAnIoMemoryBeyondHalfTheMemory) {
  testing::ScratchDir d;
  const std::string dir = PackCifar(d, 50);
  PipelineConfig c = Config(dir, 1);
  c.order = OrderChoice::kBlocks;
  c.memory_bytes = 256 << 10;  // the 200 KB split does not fit in half of it
  c.io_memory = (128 << 10) + 1;
  auto p = Pipeline::Open(c);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(p.status().message().find("is more than half of the"), std::string::npos)
      << p.status().ToString();
  c.io_memory = 128 << 10;
  EXPECT_TRUE(Pipeline::Open(c).ok()) << "half of it is allowed";
  c.io_memory.reset();
  auto by_default = Pipeline::Open(c);
  ASSERT_TRUE(by_default.ok()) << "the default is never refused: " << by_default.status().ToString();
  EXPECT_TRUE((*by_default)->read_plan().staged);
  c.io_memory = 100 << 20;
  c.order = OrderChoice::kRandom;  // a hint to the kernel only: allowed
  EXPECT_TRUE(Pipeline::Open(c).ok());
}

// A damaged record in blocks order with read-ahead: the default mode names
// it; skip mode replaces it and goes on, as without the reader thread.
TEST(Pipeline, BlocksOrderReportsAndSkipsABadRecordReadAhead) {
  testing::ScratchDir d;
  const std::string dir = PackCifar(d, 120);
  // One record's payload byte flipped in place: its CRC no longer matches.
  Result<Manifest> m = LoadManifest(dir);
  ASSERT_TRUE(m.ok());
  uint64_t offset = 0;
  {
    auto reader = SplitReader::Open(dir, *m, "train");
    ASSERT_TRUE(reader.ok());
    auto txn = (*reader)->BeginRead();
    auto e = txn.Locate(77);
    ASSERT_TRUE(e.ok());
    offset = e->offset + e->size - 5;
  }
  const std::string mdb = dir + "/" + m->FindSplit("train")->shards[0].path + "/data.mdb";
  {
    Fd fd(::open(mdb.c_str(), O_RDWR));
    ASSERT_TRUE(fd.valid());
    uint8_t b = 0;
    ASSERT_EQ(::pread(fd.get(), &b, 1, static_cast<off_t>(offset)), 1);
    b ^= 0x5a;
    ASSERT_EQ(::pwrite(fd.get(), &b, 1, static_cast<off_t>(offset)), 1);
  }
  PipelineConfig c = Config(dir, 2);
  c.order = OrderChoice::kBlocks;
  c.io_memory = 32 << 10;
  c.memory_bytes = 512 << 10;  // the split does not fit: the reader thread reads it
  c.epochs = 1;
  auto p = Pipeline::Open(c);
  ASSERT_TRUE(p.ok());
  ASSERT_TRUE((*p)->read_plan().staged);
  Status st = Status::Ok();
  while (st.ok()) {
    Result<BatchView> b = (*p)->Next();
    if (!b.ok()) {
      st = b.status();
      break;
    }
    ASSERT_TRUE((*p)->Release(*b).ok());
  }
  EXPECT_NE(st.message().find("index 77"), std::string::npos) << st.ToString();
  c.on_bad_record = OnBadRecord::kSkip;
  auto q = Pipeline::Open(c);
  ASSERT_TRUE(q.ok());
  uint64_t n = 0;
  for (const Got& g : Drain(**q)) {
    for (int64_t i : g.indices) {
      EXPECT_NE(i, 77);
      ++n;
    }
  }
  EXPECT_EQ(n, 120u);
  EXPECT_EQ((*q)->Stats().skipped, 1u);
}

TEST(Pipeline, ReadPlanFollowsTheSplitAndTheMemory) {
  constexpr uint64_t kGiB = uint64_t{1} << 30;
  PipelineConfig c;
  // auto: random while the split fits in half the memory, then blocks.
  ReadPlan fits = PlanReading(c, 1'000'000, 3 * kGiB, 24 * kGiB, "this machine's memory");
  EXPECT_EQ(fits.order, SampleOrder::kRandom);
  EXPECT_EQ(fits.ahead_samples, 0u);
  EXPECT_FALSE(fits.pread_records) << "a split in memory stays mapped";
  EXPECT_EQ(fits.summary,
            "order random (auto: the split's 3 GiB fits in half of the 24 GiB this process may use "
            "(this machine's memory)); no read-ahead (the split fits in memory)");
  ReadPlan big =
      PlanReading(c, uint64_t{1} << 20, 4 * kGiB, kGiB, "cgroup v1 memory.limit_in_bytes of /x");
  EXPECT_EQ(big.order, SampleOrder::kBlocks);
  EXPECT_EQ(big.io_memory, uint64_t{128} << 20);  // an eighth of 1 GiB
  // 64 MiB windows of 4 KiB records: 512 blocks of 32 records
  EXPECT_EQ(big.block_samples, 32u);
  EXPECT_EQ(big.window_blocks, 512u);
  EXPECT_EQ(big.ahead_samples, 32u * 512u);
  EXPECT_TRUE(big.pread_records);
  EXPECT_TRUE(big.staged && big.direct) << "blocks from disk: windows read past the page cache";
  c.order = OrderChoice::kBlocks;
  EXPECT_FALSE(PlanReading(c, 1'000'000, 3 * kGiB, 24 * kGiB, "x").staged)
      << "blocks order on a split in memory reads it with pread";
  c.order = OrderChoice::kAuto;
  EXPECT_NE(big.summary.find("by a reader thread, past the page cache (O_DIRECT)"),
            std::string::npos)
      << big.summary;
  // A small cgroup: an eighth of it, 4 MiB at least.
  EXPECT_EQ(PlanReading(c, 1'000, 4 << 20, 64 << 20, "x").io_memory, uint64_t{8} << 20);
  EXPECT_EQ(PlanReading(c, 1'000, 4 << 20, 16 << 20, "x").io_memory, uint64_t{4} << 20);
  // ... but never more than half of it (which blocks order would refuse).
  EXPECT_EQ(PlanReading(c, 1'000, 4 << 20, 6 << 20, "x").io_memory, uint64_t{3} << 20);
  EXPECT_NE(
      big.summary.find("order blocks (auto: the split's 4 GiB does not fit in half of the 1 GiB"),
      std::string::npos)
      << big.summary;
  // Asked for: random on the big split reads ahead; --io-memory 0 does not.
  c.order = OrderChoice::kRandom;
  ReadPlan random = PlanReading(c, 1'000'000, 4 * kGiB, kGiB, "x");
  EXPECT_EQ(random.order, SampleOrder::kRandom);
  EXPECT_GT(random.ahead_samples, 0u);
  c.io_memory = 0;
  EXPECT_EQ(PlanReading(c, 1'000'000, 4 * kGiB, kGiB, "x").ahead_samples, 0u);
  EXPECT_EQ(*ParseOrder("blocks"), OrderChoice::kBlocks);
  EXPECT_EQ(ParseOrder("sequential").status().message(),
            "unknown `order` 'sequential' (use random, blocks or auto)");
}

// Blocks order: a window wider than a rank's share shuffles the whole share,
// so the plan caps it there, and two memories that both hold a whole share
// plan one sequence (a resume under another --io-memory is then accepted).
TEST(Pipeline, TheWindowIsCappedAtARanksShare) {
  constexpr uint64_t kMiB = uint64_t{1} << 20;
  PipelineConfig c;
  c.order = OrderChoice::kBlocks;
  c.world = 2;
  const uint64_t n = 10'000, bytes = n * 4096;  // a share of 5,000 samples
  c.io_memory = 1024 * kMiB;
  const ReadPlan wide = PlanReading(c, n, bytes, 24 * 1024 * kMiB, "x");
  c.io_memory = 64 * kMiB;  // windows of 8,192 samples: still more than the share
  const ReadPlan narrower = PlanReading(c, n, bytes, 24 * 1024 * kMiB, "x");
  EXPECT_EQ(wide.block_samples, 9u);  // 5,000 / 512
  EXPECT_EQ(wide.window_blocks, 556u);  // the share's 5,000 samples in blocks of 9
  EXPECT_EQ(SequenceOf(wide), SequenceOf(narrower));
  EXPECT_EQ(SequenceOf(wide), "blocks of 9 samples, 556 a window");
  c.io_memory = 8 * kMiB;  // windows of 1,024: a share of 5 windows, another sequence
  const ReadPlan small = PlanReading(c, n, bytes, 24 * 1024 * kMiB, "x");
  EXPECT_EQ(SequenceOf(small), "blocks of 2 samples, 512 a window");
  c.order = OrderChoice::kRandom;
  EXPECT_EQ(SequenceOf(PlanReading(c, n, bytes, 24 * 1024 * kMiB, "x")), "random");
}

TEST(Pipeline, EvalPixelsAreTheTransformOfTheRecord) {
  testing::ScratchDir d;
  const std::string dir = PackCifar(d, 40);
  PipelineConfig c = Config(dir, 2);
  c.transform.train = false;
  c.epochs = 1;
  auto p = Pipeline::Open(c);
  ASSERT_TRUE(p.ok());
  Result<BatchView> b = (*p)->Next();
  ASSERT_TRUE(b.ok());
  Result<Manifest> m = LoadManifest(dir);
  auto reader = SplitReader::Open(dir, *m, "train");
  auto txn = (*reader)->BeginRead();
  SampleTransform t(c.transform);
  std::vector<uint8_t> want(t.SampleBytes());
  for (uint32_t j = 0; j < b->size; ++j) {
    Result<RecordView> rec = txn.Read(static_cast<uint64_t>(b->indices[j]));
    ASSERT_TRUE(rec.ok());
    t.Apply(rec->payload.data(), 32, 32, 0, static_cast<uint64_t>(b->indices[j]), want.data());
    ASSERT_EQ(0, std::memcmp(want.data(), b->pixels + j * t.SampleBytes(), want.size())) << j;
    EXPECT_EQ(b->labels[j], rec->header.label);
  }
  ASSERT_TRUE((*p)->Release(*b).ok());
}

// A shard set of PNG records where record `bad` has a damaged image whose
// record CRC is still right (so only decoding finds it).
std::string PackWithBadImage(const testing::ScratchDir& d, uint64_t n, uint64_t bad) {
  Manifest m;
  m.source_kind = "imagefolder";
  m.classes = {"a", "b"};
  SplitInfo s;
  s.encoding = "png";
  EXPECT_TRUE(MakeDirs(d / "bad/train").ok());
  auto w = ShardWriter::Create(d / "bad", "train/shard-00000", 0);
  EXPECT_TRUE(w.ok());
  for (uint64_t i = 0; i < n; ++i) {
    std::vector<uint8_t> png = *EncodePng(testing::PatternImage(8, 8, static_cast<uint32_t>(i)));
    if (i == bad) png.resize(png.size() - 30);
    std::vector<uint8_t> rec;
    RecordHeader h;
    h.label = static_cast<uint32_t>(i % 2);
    h.encoding = Encoding::kPng;
    h.width = h.height = 8;
    EncodeRecord(h, png, &rec);
    EXPECT_TRUE((*w)->Put(i, rec).ok());
  }
  s.shards.push_back(*(*w)->Finish());
  s.num_samples = n;
  m.splits["train"] = s;
  EXPECT_TRUE(SaveManifest(d / "bad", m).ok());
  return d / "bad";
}

TEST(Pipeline, BadRecordMidEpochNamesShardAndIndex) {
  testing::ScratchDir d;
  const std::string dir = PackWithBadImage(d, 64, 37);
  PipelineConfig c = Config(dir, 3);
  c.shuffle = false;
  c.epochs = 1;
  c.transform.image_size = 8;
  auto p = Pipeline::Open(c);
  ASSERT_TRUE(p.ok());
  for (int i = 0; i < 2; ++i) {  // batches 0 and 1 (indices 0..31) are fine
    Result<BatchView> b = (*p)->Next();
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    ASSERT_TRUE((*p)->Release(*b).ok());
  }
  Result<BatchView> b = (*p)->Next();
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kCorruption);
  EXPECT_EQ(b.status().message().rfind(
                "split 'train', shard train/shard-00000, index 37: corrupt PNG", 0),
            0u)
      << b.status().ToString();
  Result<BatchView> again = (*p)->Next();  // a failed pipeline stays failed
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), StatusCode::kCorruption);
  EXPECT_NE(again.status().message().find("shard train/shard-00000, index 37: corrupt PNG"),
            std::string::npos)
      << again.status().ToString();
}

// The split's shard files through a fault-injecting seam
// (tests/support/fault_shard_files.h), in random order read with pread and
// in blocks order read ahead by the reader thread: short reads give the
// same batches; a read that fails stops the pipeline with an error naming
// the shard, the index and the byte.
TEST(Pipeline, ShardFileFaultsGiveTheSameBatchesOrAnErrorNamingTheShard) {
  testing::ScratchDir d;
  const std::string dir = PackCifar(d, 150);
  for (OrderChoice order : {OrderChoice::kRandom, OrderChoice::kBlocks}) {
    SCOPED_TRACE(order == OrderChoice::kRandom ? "random order" : "blocks order");
    PipelineConfig c = Config(dir, 2);
    c.order = order;
    c.memory_bytes = 1 << 20;  // the 0.6 MB split does not fit in half of it: pread
    auto local = Pipeline::Open(c);
    ASSERT_TRUE(local.ok()) << local.status().ToString();
    ASSERT_TRUE((*local)->read_plan().pread_records);
    const std::vector<Got> want = Drain(**local);
    ASSERT_EQ(want.size(), 20u);

    testing::FaultShardFiles seam({.max_read = 1000});
    c.shard_files = &seam;
    auto shortly = Pipeline::Open(c);
    ASSERT_TRUE(shortly.ok()) << shortly.status().ToString();
    EXPECT_TRUE(Drain(**shortly) == want) << "short reads changed the bytes";
    EXPECT_GT(seam.short_reads(), 0u);

    seam.Set({});
    auto failing = Pipeline::Open(c);
    ASSERT_TRUE(failing.ok()) << failing.status().ToString();
    seam.Set({.read_errno = EIO, .read_error_from = 8192});  // every page past the meta pages
    // (Batches made before the fault, in flight, come first.)
    Result<BatchView> b = (*failing)->Next();
    for (int got = 0; b.ok() && got < 20; ++got) {
      ASSERT_TRUE((*failing)->Release(*b).ok());
      b = (*failing)->Next();
    }
    ASSERT_FALSE(b.ok());
    EXPECT_EQ(b.status().code(), StatusCode::kIOError) << b.status().ToString();
    EXPECT_EQ(b.status().message().rfind("split 'train', shard train/shard-00000, index ", 0), 0u)
        << b.status().ToString();
    EXPECT_NE(b.status().message().find(" at byte "), std::string::npos) << b.status().ToString();
    EXPECT_NE(b.status().message().find(": Input/output error"), std::string::npos)
        << b.status().ToString();
  }
}

TEST(Pipeline, SkipModeReplacesAndCounts) {
  testing::ScratchDir d;
  const std::string dir = PackWithBadImage(d, 64, 37);
  PipelineConfig c = Config(dir, 3);
  c.shuffle = false;
  c.epochs = 1;
  c.transform.image_size = 8;
  c.on_bad_record = OnBadRecord::kSkip;
  auto p = Pipeline::Open(c);
  ASSERT_TRUE(p.ok());
  std::vector<Got> got = Drain(**p);
  ASSERT_EQ(got.size(), 4u);
  EXPECT_EQ(got[2].indices[5], 38);  // position 37 replaced by the next sample of the list
  EXPECT_EQ(got[2].indices[6], 38);
  EXPECT_EQ((*p)->Stats().skipped, 1u);
  EXPECT_EQ((*p)->Stats().images, 64u);
}

TEST(Pipeline, ShortLastBatchesWithOneBufferDoNotStall) {
  // 301 samples over 2 ranks: 151 each, batches of 32 end with one of 23. With
  // one buffer the consumer frees a batch's slot the moment it is delivered:
  // claims past the end of that short batch must not wait for it.
  // Everything on one core, as when a rank's trainer and loader share one:
  // the consumer then often runs between a batch's last sample and the
  // worker's next claim.
  testing::ScratchDir d;
  const std::string dir = PackCifar(d, 301);
  cpu_set_t saved, one;
  ASSERT_EQ(sched_getaffinity(0, sizeof saved, &saved), 0);
  CPU_ZERO(&one);
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &saved)) {
      CPU_SET(cpu, &one);
      break;
    }
  }
  ASSERT_EQ(sched_setaffinity(0, sizeof one, &one), 0);
  for (uint32_t threads : {1u, 3u}) {
    PipelineConfig c = Config(dir, threads);
    c.world = 2;
    c.batch_size = 32;
    c.prefetch = 1;
    c.epochs = 4;
    c.transform.image_size = 8;
    auto p = Pipeline::Open(c);
    ASSERT_TRUE(p.ok());
    std::vector<Got> got = Drain(**p);
    ASSERT_EQ(got.size(), 20u);
    EXPECT_EQ(got[4].indices.size(), 23u);
  }
  ASSERT_EQ(sched_setaffinity(0, sizeof saved, &saved), 0);
}

TEST(Pipeline, ShutdownWithBatchesInFlight) {
  testing::ScratchDir d;
  const std::string dir = PackCifar(d, 300);
  for (int held : {0, 1, 2}) {
    PipelineConfig c = Config(dir, 4);
    c.epochs = 0;  // unbounded: workers are busy when we stop
    auto p = Pipeline::Open(c);
    ASSERT_TRUE(p.ok());
    for (int i = 0; i < held; ++i) ASSERT_TRUE((*p)->Next().ok());
    p->reset();  // must not hang (ctest's timeout), leak (ASan) or touch freed memory
  }
}

TEST(Pipeline, ConsumerHoldingEveryBufferGetsAnErrorNotADeadlock) {
  testing::ScratchDir d;
  const std::string dir = PackCifar(d, 200);
  PipelineConfig c = Config(dir, 2);
  c.prefetch = 2;
  auto p = Pipeline::Open(c);
  ASSERT_TRUE(p.ok());
  Result<BatchView> a = (*p)->Next(), b = (*p)->Next();
  ASSERT_TRUE(a.ok() && b.ok());
  Status s = (*p)->Next().status();
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("all 2 batch buffers are held"), std::string::npos) << s.ToString();
  ASSERT_TRUE((*p)->Release(*a).ok());
  Result<BatchView> c3 = (*p)->Next();
  ASSERT_TRUE(c3.ok());
  EXPECT_EQ(c3->sequence, 2u);
}

TEST(Pipeline, ReleasingTwiceDoesNotFreeAnotherBatchsBuffer) {
  testing::ScratchDir d;
  const std::string dir = PackCifar(d, 200);
  PipelineConfig c = Config(dir, 2);
  c.prefetch = 2;
  c.epochs = 1;
  c.transform.train = false;
  auto p = Pipeline::Open(c);
  ASSERT_TRUE(p.ok());
  Result<BatchView> a = (*p)->Next();
  ASSERT_TRUE(a.ok());
  Result<BatchView> b = (*p)->Next();
  ASSERT_TRUE(b.ok());
  const std::vector<uint8_t> held(b->pixels, b->pixels + b->size * (*p)->sample_bytes());
  ASSERT_TRUE((*p)->Release(*a).ok());
  const Status twice = (*p)->Release(*a);  // refused: batch 0 is back, batch 1 still held
  EXPECT_EQ(twice.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(twice.message().find("batch 0, which is not held"), std::string::npos)
      << twice.ToString();
  Result<BatchView> c3 = (*p)->Next();
  ASSERT_TRUE(c3.ok());
  EXPECT_EQ(c3->sequence, 2u);
  EXPECT_EQ(0, std::memcmp(held.data(), b->pixels, held.size())) << "a held batch was overwritten";
  Status out = (*p)->Next().status();  // both buffers are out
  EXPECT_EQ(out.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(out.message(),
            "all 2 batch buffers are held by the consumer: Release() one before Next()");
}

TEST(Pipeline, MissingDataIsAClearError) {
  testing::ScratchDir d;
  PipelineConfig c = Config(d / "nothing", 1);
  Status s = Pipeline::Open(c).status();
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find("manifest.json"), std::string::npos);
}

}  // namespace
}  // namespace nl

namespace nl {
namespace {

// Buffers the test owns (as the ring will): anonymous mappings, untouched
// until a worker writes them.
class MappedBuffers : public BufferSource {
 public:
  MappedBuffers(size_t count, uint32_t batch_size, size_t sample_bytes) {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    pixels_ = (batch_size * sample_bytes + page - 1) / page * page;
    bytes_ = pixels_ + page;  // labels, indices, meta in the last page
    for (size_t i = 0; i < count; ++i) {
      void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      EXPECT_NE(p, MAP_FAILED);
      maps_.push_back(static_cast<uint8_t*>(p));
    }
    batch_ = batch_size;
  }
  ~MappedBuffers() override {
    for (uint8_t* p : maps_) munmap(p, bytes_);
  }
  size_t count() const override { return maps_.size(); }
  BatchBuffer buffer(size_t i) const override {
    uint8_t* base = maps_[i];
    auto* labels = reinterpret_cast<int64_t*>(base + pixels_);
    return {base, labels, labels + batch_, reinterpret_cast<BatchMeta*>(labels + 2 * batch_)};
  }
  // Pages of all buffers now resident (written, or read, by anyone).
  size_t ResidentPages() const {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    std::vector<unsigned char> v(bytes_ / page);
    size_t n = 0;
    for (uint8_t* p : maps_) {
      EXPECT_EQ(mincore(p, bytes_, v.data()), 0);
      for (unsigned char c : v) n += c & 1;
    }
    return n;
  }

 private:
  std::vector<uint8_t*> maps_;
  size_t pixels_ = 0, bytes_ = 0;
  uint32_t batch_ = 0;
};

TEST(PipelineContract, CallerBuffersGetTheSameBatchesAndEachBuffersMetaDescribesIt) {
  testing::ScratchDir d;
  const std::string dir = PackCifar(d, 100);
  PipelineConfig c = Config(dir, 2);
  auto heap = Pipeline::Open(c);
  ASSERT_TRUE(heap.ok());
  const std::vector<Got> want = Drain(**heap);

  MappedBuffers mine(c.prefetch, c.batch_size, (*heap)->sample_bytes());
  c.buffers = &mine;
  auto p = Pipeline::Open(c);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  std::vector<Got> got;
  while (true) {
    Result<BatchView> b = (*p)->Next();
    if (!b.ok()) {
      EXPECT_EQ(b.status().code(), StatusCode::kOutOfRange);
      break;
    }
    const BatchBuffer buf = mine.buffer(b->sequence % c.prefetch);
    EXPECT_EQ(b->buffer, b->sequence % c.prefetch) << "batch g lives in buffer g % prefetch";
    EXPECT_EQ(b->pixels, buf.pixels);
    EXPECT_EQ(buf.meta->sequence, b->sequence);
    EXPECT_EQ(buf.meta->epoch, b->epoch);
    EXPECT_EQ(buf.meta->batch, b->batch);
    EXPECT_EQ(buf.meta->size, b->size);
    got.push_back({b->epoch, b->batch,
                   std::vector<uint8_t>(b->pixels, b->pixels + b->size * (*p)->sample_bytes()),
                   std::vector<int64_t>(b->labels, b->labels + b->size),
                   std::vector<int64_t>(b->indices, b->indices + b->size)});
    ASSERT_TRUE((*p)->Release(*b).ok());
  }
  EXPECT_EQ(got, want);
}

TEST(PipelineContract, TooFewCallerBuffersIsAnError) {
  testing::ScratchDir d;
  const std::string dir = PackCifar(d, 40);
  PipelineConfig c = Config(dir, 1);
  MappedBuffers two(2, c.batch_size, 40 * 40 * 3);
  c.buffers = &two;
  Status s = Pipeline::Open(c).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "the buffer source has 2 buffers for a prefetch of 3");
}

// The NUMA point of the project: a worker binds (in its start hook) before
// it writes any page of a batch buffer, so first touch places the pages on
// the bound node. A barrier in the hook holds every worker until all hooks
// have run; its completion step sees whether any buffer page was touched.
TEST(PipelineContract, EveryStartHookRunsBeforeAnyBufferPageIsWritten) {
  testing::ScratchDir d;
  const std::string dir = PackCifar(d, 64);
  PipelineConfig c = Config(dir, 3);
  MappedBuffers mine(c.prefetch, c.batch_size, 40 * 40 * 3);
  ASSERT_EQ(mine.ResidentPages(), 0u);
  size_t resident_when_all_hooked = SIZE_MAX;
  std::barrier hooks(3, [&]() noexcept { resident_when_all_hooked = mine.ResidentPages(); });
  c.buffers = &mine;
  c.thread_start = [&](int) { hooks.arrive_and_wait(); };
  auto p = Pipeline::Open(c);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  Result<BatchView> b = (*p)->Next();
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(resident_when_all_hooked, 0u);
  EXPECT_GT(mine.ResidentPages(), 0u) << "the workers did write afterwards";
}

TEST(PipelineContract, AThrowingStartHookIsAnErrorFromNextNotTerminate) {
  testing::ScratchDir d;
  const std::string dir = PackCifar(d, 64);
  PipelineConfig c = Config(dir, 2);
  c.thread_start = [](int w) {
    if (w == 1) throw std::runtime_error("hwloc: cannot bind to node 7");
  };
  auto p = Pipeline::Open(c);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  Status s;
  for (int i = 0; i < 100 && s.ok(); ++i) {  // batches worker 0 finished may come first
    Result<BatchView> b = (*p)->Next();
    s = b.status();
    if (b.ok()) {
      ASSERT_TRUE((*p)->Release(*b).ok());
    }
  }
  EXPECT_EQ(s.code(), StatusCode::kInternal) << s.ToString();
  EXPECT_NE(s.message().find("loader worker 1: exception: hwloc: cannot bind to node 7"),
            std::string::npos)
      << s.message();
}

TEST(PipelineContract, ASecondConcurrentNextIsRefusedNotGivenTheSameBatch) {
  testing::ScratchDir d;
  const std::string dir = PackCifar(d, 64);
  PipelineConfig c = Config(dir, 1);
  std::latch go(1);
  c.thread_start = [&](int) { go.wait(); };  // no batch is ready until `go`
  auto p = Pipeline::Open(c);
  ASSERT_TRUE(p.ok());
  Result<BatchView> first = Status::Internal("not run");
  std::thread consumer([&] { first = (*p)->Next(); });
  while (!(*p)->Stats().consumer_waiting) std::this_thread::yield();
  Result<BatchView> second = (*p)->Next();
  EXPECT_EQ(second.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(second.status().message().find("one consumer thread at a time"), std::string::npos);
  go.count_down();
  consumer.join();
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(first->sequence, 0u);
  ASSERT_TRUE((*p)->Release(*first).ok());
  Result<BatchView> next = (*p)->Next();
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(next->sequence, 1u);
}

TEST(PipelineContract, AbsurdCountsAreRefusedBeforeAllocating) {
  testing::ScratchDir d;
  const std::string dir = PackCifar(d, 20);
  PipelineConfig c = Config(dir, 1);
  c.threads = 2147483647;
  EXPECT_NE(Pipeline::Open(c).status().message().find("loader threads must be 1..1024"),
            std::string::npos);
  c.threads = 1;
  c.prefetch = 2147483647;
  EXPECT_NE(Pipeline::Open(c).status().message().find("`prefetch` must be 1..1024"),
            std::string::npos);
  c.prefetch = 1024;
  c.batch_size = 1 << 20;
  c.transform.image_size = 224;
  Status s = Pipeline::Open(c).status();
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("more than half of this machine's"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace nl

namespace nl {
namespace {

TEST(PipelineContract, ReleasingOutOfOrderThenNextSaysWhichBatchToReleaseInsteadOfHanging) {
  testing::ScratchDir d;
  const std::string dir = PackCifar(d, 100);
  PipelineConfig c = Config(dir, 2);
  c.prefetch = 2;
  auto p = Pipeline::Open(c);
  ASSERT_TRUE(p.ok());
  Result<BatchView> b0 = (*p)->Next(), b1 = (*p)->Next();
  ASSERT_TRUE(b0.ok() && b1.ok());
  ASSERT_TRUE((*p)->Release(*b1).ok());  // out of order: allowed
  Status s = (*p)->Next().status();      // batch 2 needs batch 0's buffer
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("batch 2 goes into the buffer of batch 0, which the consumer still "
                             "holds: Release() it first"),
            std::string::npos)
      << s.ToString();
  ASSERT_TRUE((*p)->Release(*b0).ok());
  Result<BatchView> b2 = (*p)->Next();
  ASSERT_TRUE(b2.ok()) << b2.status().ToString();
  EXPECT_EQ(b2->sequence, 2u);
}

TEST(PipelineContract, TwoNextCallsAtTheEndOfTheRunBothReturn) {
  testing::ScratchDir d;
  const std::string dir = PackCifar(d, 40);
  PipelineConfig c = Config(dir, 2);
  c.epochs = 1;
  auto p = Pipeline::Open(c);
  ASSERT_TRUE(p.ok());
  (void)Drain(**p);
  Status s1, s2;
  std::thread t1([&] { s1 = (*p)->Next().status(); });
  std::thread t2([&] { s2 = (*p)->Next().status(); });
  t1.join();  // (they used to join the worker pool twice: one hung for ever)
  t2.join();
  for (const Status& s : {s1, s2}) {
    EXPECT_TRUE(s.code() == StatusCode::kOutOfRange || s.code() == StatusCode::kFailedPrecondition)
        << s.ToString();
  }
}

TEST(PipelineContract, SkipModeStopsAfterARunOfBadSamplesInsteadOfDecodingTheWholeList) {
  testing::ScratchDir d;
  std::vector<std::vector<uint8_t>> records;
  for (uint32_t i = 0; i < 2000; ++i) {  // every record lies about its size
    RecordHeader h;
    h.encoding = Encoding::kPng;
    h.width = h.height = 64;
    records.push_back(testing::CraftRecord(h, *EncodePng(testing::PatternImage(8, 8, i))));
  }
  testing::WriteShardSetForTest(d / "bad", records);
  PipelineConfig c = Config(d / "bad", 2);
  c.on_bad_record = OnBadRecord::kSkip;
  c.transform.train = false;
  auto p = Pipeline::Open(c);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  Status s = (*p)->Next().status();
  EXPECT_EQ(s.code(), StatusCode::kCorruption) << s.ToString();
  EXPECT_NE(s.message().find("65 samples in a row of rank 0's list failed"), std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("image decodes to 8x8 but the header says 64x64"), std::string::npos);
  // At most 65 attempts for each sample of the batches in flight (3 x 16),
  // where the whole list (2000) was tried for each before.
  EXPECT_LE((*p)->Stats().skipped, uint64_t{3 * 16} * 65) << "bounded work";
}

TEST(PipelineContract, EpochCountsThatOverflowAreRefused) {
  testing::ScratchDir d;
  const std::string dir = PackCifar(d, 40);
  PipelineConfig c = Config(dir, 1);
  c.epochs = uint64_t{1} << 63;
  Status s = Pipeline::Open(c).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("overflow the batch count"), std::string::npos) << s.message();
}

// The last epoch number, 2^64 - 1 (a consumer's seek can ask for it): its
// batches, then the end of the run, never epoch 0 again; an epoch count
// that would pass it is refused.
TEST(PipelineContract, TheLastEpochNumberEndsTheRunInsteadOfWrapping) {
  testing::ScratchDir d;
  const std::string dir = PackCifar(d, 40);  // 3 batches of 16 an epoch
  PipelineConfig c = Config(dir, 2);
  c.start_epoch = UINT64_MAX;
  c.start_batch = 1;
  c.epochs = 0;  // no count: until the numbers end
  auto p = Pipeline::Open(c);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  const std::vector<Got> got = Drain(**p, 10);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].epoch, UINT64_MAX);
  EXPECT_EQ(got[0].batch, 1u);
  EXPECT_EQ(got[1].batch, 2u);
  c.start_epoch = UINT64_MAX - 1;
  c.start_batch = 0;
  c.epochs = 3;
  const Status s = Pipeline::Open(c).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("go past the last epoch number"), std::string::npos) << s.message();
  c.epochs = 2;
  auto two = Pipeline::Open(c);
  ASSERT_TRUE(two.ok()) << two.status().ToString();
  EXPECT_EQ(Drain(**two, 10).size(), 6u);
}

}  // namespace
}  // namespace nl
