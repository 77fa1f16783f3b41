#include "formats/shard.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <utility>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "base/file_util.h"
#include "formats/lmdb_env.h"
#include "tests/support/fault_shard_files.h"
#include "tests/support/test_util.h"

namespace nl {
namespace {

std::vector<uint8_t> Record(uint64_t i) {
  std::vector<uint8_t> px(2 * 3 * 3);
  for (size_t k = 0; k < px.size(); ++k) px[k] = static_cast<uint8_t>(i + k);
  std::vector<uint8_t> out;
  RecordHeader h;
  h.label = static_cast<uint32_t>(i % 5);
  h.width = 3;
  h.height = 2;
  EncodeRecord(h, px, &out);
  return out;
}

// Writes `per_shard` sizes as consecutive shards under root/train.
Manifest WriteShards(const std::string& root, const std::vector<uint64_t>& per_shard) {
  Manifest m;
  m.source_kind = "imagefolder";
  m.classes = {"a", "b", "c", "d", "e"};
  SplitInfo s;
  s.encoding = "raw";
  uint64_t index = 0;
  EXPECT_TRUE(MakeDirs(root + "/train").ok());
  for (size_t k = 0; k < per_shard.size(); ++k) {
    auto w = ShardWriter::Create(root, "train/shard-" + std::to_string(k), index);
    EXPECT_TRUE(w.ok()) << w.status().ToString();
    for (uint64_t j = 0; j < per_shard[k]; ++j, ++index)
      EXPECT_TRUE((*w)->Put(index, Record(index)).ok());
    Result<ShardInfo> info = (*w)->Finish();
    EXPECT_TRUE(info.ok());
    s.shards.push_back(*info);
  }
  s.num_samples = index;
  m.splits["train"] = s;
  return m;
}

TEST(Shard, RoundTripAcrossShards) {
  testing::ScratchDir dir;
  Manifest m = WriteShards(dir.path(), {4, 3, 5});
  ASSERT_EQ(m.splits["train"].shards[1].first_index, 4u);
  ASSERT_EQ(m.splits["train"].shards[2].count, 5u);
  auto reader = SplitReader::Open(dir.path(), m, "train");
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  EXPECT_EQ((*reader)->size(), 12u);
  auto txn = (*reader)->BeginRead();
  for (uint64_t i : {11u, 0u, 4u, 3u, 7u, 8u}) {  // any order: reads by key
    Result<RecordView> r = txn.Read(i);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->header.label, i % 5);
    EXPECT_EQ(r->payload[0], static_cast<uint8_t>(i));
  }
  EXPECT_EQ((*reader)->ShardOf(3), 0u);
  EXPECT_EQ((*reader)->ShardOf(4), 1u);
  EXPECT_EQ((*reader)->ShardOf(11), 2u);
}

// The one read transaction type: Get by key and ForEach in key order, the
// values alike, and errors without context (callers add theirs).
TEST(Shard, ReadTxnGetsAndWalksOneShard) {
  testing::ScratchDir dir;
  Manifest m = WriteShards(dir.path(), {4, 3});
  auto shard = ShardReader::Open(dir.path(), m.splits["train"].shards[1]);
  ASSERT_TRUE(shard.ok()) << shard.status().ToString();
  EXPECT_FALSE(ShardReader::ReadTxn().active());
  Result<ShardReader::ReadTxn> txn = (*shard)->BeginRead();
  ASSERT_TRUE(txn.ok()) << txn.status().ToString();
  EXPECT_TRUE(txn->active());
  std::vector<uint64_t> seen;
  Status st = txn->ForEach([&](const ShardReader::Entry& e) {
    EXPECT_EQ(e.key_size, 8u);
    const std::vector<uint8_t> want = Record(e.index);
    EXPECT_TRUE(std::equal(e.value.begin(), e.value.end(), want.begin(), want.end()));
    Result<std::span<const uint8_t>> got = txn->Get(e.index);
    EXPECT_TRUE(got.ok() && got->data() == e.value.data() && got->size() == e.value.size());
    seen.push_back(e.index);
    return Status::Ok();
  });
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(seen, (std::vector<uint64_t>{4, 5, 6}));
  Status missing = txn->Get(3).status();  // in the other shard
  EXPECT_EQ(missing.code(), StatusCode::kCorruption);
  EXPECT_EQ(missing.message(), "record missing");
  // ForEach stops at the visitor's first error and returns it.
  int visits = 0;
  st = txn->ForEach([&](const ShardReader::Entry&) {
    return ++visits == 2 ? Status::Internal("enough") : Status::Ok();
  });
  EXPECT_EQ(st.code(), StatusCode::kInternal);
  EXPECT_EQ(visits, 2);
}

TEST(Shard, IndexOutOfRange) {
  testing::ScratchDir dir;
  Manifest m = WriteShards(dir.path(), {3});
  auto reader = SplitReader::Open(dir.path(), m, "train");
  ASSERT_TRUE(reader.ok());
  auto txn = (*reader)->BeginRead();
  Status s = txn.Read(3).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "index 3 out of range: split 'train' has 3 samples");
}

TEST(Shard, MissingSplitNamesWhatExists) {
  testing::ScratchDir dir;
  Manifest m = WriteShards(dir.path(), {2});
  Status s = SplitReader::Open(dir.path(), m, "val").status();
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find("no split 'val' (it has: train)"), std::string::npos) << s.ToString();
}

TEST(Shard, OutOfOrderPutRefused) {
  testing::ScratchDir dir;
  auto w = ShardWriter::Create(dir.path(), "s", 10);
  ASSERT_TRUE(w.ok());
  EXPECT_TRUE((*w)->Put(10, Record(10)).ok());
  Status s = (*w)->Put(12, Record(12));
  EXPECT_EQ(s.message(), "shard s: index 12 written out of order (expected 11)");
}

TEST(Shard, CorruptRecordNamesShardAndIndex) {
  testing::ScratchDir dir;
  auto w = ShardWriter::Create(dir.path(), "train-0", 0);
  ASSERT_TRUE(w.ok());
  std::vector<uint8_t> bad = Record(1);
  bad.back() ^= 1;
  ASSERT_TRUE((*w)->Put(0, Record(0)).ok());
  ASSERT_TRUE((*w)->Put(1, bad).ok());
  Result<ShardInfo> info = (*w)->Finish();
  ASSERT_TRUE(info.ok());
  Manifest m;
  m.classes = {"a", "b", "c", "d", "e"};
  m.splits["train"].num_samples = 2;
  m.splits["train"].encoding = "raw";
  m.splits["train"].shards = {*info};
  auto reader = SplitReader::Open(dir.path(), m, "train");
  ASSERT_TRUE(reader.ok());
  auto txn = (*reader)->BeginRead();
  EXPECT_TRUE(txn.Read(0).ok());
  Status s = txn.Read(1).status();
  EXPECT_EQ(s.code(), StatusCode::kCorruption);
  EXPECT_EQ(
      s.message().rfind("split 'train', shard train-0, index 1: payload checksum mismatch", 0), 0u)
      << s.ToString();
}

TEST(Shard, MissingShardFileIsNotFound) {
  testing::ScratchDir dir;
  Manifest m = WriteShards(dir.path(), {2});
  ASSERT_TRUE(RemoveAll(dir.path() + "/train/shard-0").ok());
  Status s = SplitReader::Open(dir.path(), m, "train").status();
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find("train/shard-0/data.mdb"), std::string::npos) << s.ToString();
}

TEST(Shard, GarbageShardFileIsAnError) {
  testing::ScratchDir dir;
  Manifest m = WriteShards(dir.path(), {2});
  testing::WriteText(dir.path() + "/train/shard-0/data.mdb", std::string(8192, 'x'));
  Status s = SplitReader::Open(dir.path(), m, "train").status();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("cannot open shard"), std::string::npos) << s.ToString();
}

// ---- truncated and lying shards: errors naming the shard, never a signal ----

// data.mdb cut to `size` bytes (as `truncate -s` would).
void Truncate(const std::string& path, uint64_t size) {
  ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(size)), 0) << path;
}

// The file cut on disk, or only as the shard-file seam reports it (its size,
// and reads that end there): the reader's checks see the same.
enum class CutBy { kFile, kSeam };
std::string Name(CutBy by) { return by == CutBy::kFile ? "the file" : "the seam"; }

TEST(Shard, TruncatedDataFileIsCorruptionNamingTheShard) {
  testing::ScratchDir dir;
  const Manifest written = WriteShards(dir.path(), {600});
  const std::string data = dir.path() + "/train/shard-0/data.mdb";
  const uint64_t full = *FileSize(data);
  ASSERT_GT(full, 12288u + 4096u);
  for (CutBy by : {CutBy::kFile, CutBy::kSeam}) {
    for (bool manifest_follows : {false, true}) {
      for (uint64_t cut : {uint64_t{8191}, uint64_t{8192}, uint64_t{12288}, full - 4096}) {
        SCOPED_TRACE("cut at " + std::to_string(cut) + " by " + Name(by) +
                     (manifest_follows ? ", manifest updated" : ""));
        testing::ScratchDir copy;
        Manifest m = WriteShards(copy.path(), {600});
        testing::FaultShardFiles seam;
        if (by == CutBy::kFile) Truncate(copy.path() + "/train/shard-0/data.mdb", cut);
        if (by == CutBy::kSeam) seam.Set({.shrink_to = cut});
        // With the manifest's bytes updated too, LMDB's own last page still tells.
        if (manifest_follows) m.splits["train"].shards[0].bytes = cut;
        Status s = SplitReader::Open(copy.path(), m, "train", seam).status();
        EXPECT_EQ(s.code(), StatusCode::kCorruption) << s.ToString();
        EXPECT_NE(s.message().find("shard train/shard-0"), std::string::npos) << s.ToString();
        EXPECT_NE(s.message().find("truncated"), std::string::npos) << s.ToString();
        Result<std::unique_ptr<ShardReader>> r =
            ShardReader::Open(copy.path(), m.splits["train"].shards[0], seam);
        EXPECT_EQ(r.status().code(), StatusCode::kCorruption) << r.status().ToString();
      }
    }
  }
}

TEST(Shard, EmptyDataFileSaysEmpty) {
  for (CutBy by : {CutBy::kFile, CutBy::kSeam}) {
    SCOPED_TRACE("cut by " + Name(by));
    testing::ScratchDir dir;
    Manifest m = WriteShards(dir.path(), {3});
    testing::FaultShardFiles seam;
    if (by == CutBy::kFile) Truncate(dir.path() + "/train/shard-0/data.mdb", 0);
    if (by == CutBy::kSeam) seam.Set({.shrink_to = 0});
    Status s = SplitReader::Open(dir.path(), m, "train", seam).status();
    EXPECT_EQ(s.code(), StatusCode::kCorruption) << s.ToString();
    EXPECT_NE(s.message().find("shard train/shard-0"), std::string::npos) << s.ToString();
    EXPECT_NE(s.message().find("empty (0 bytes)"), std::string::npos) << s.ToString();
    EXPECT_EQ(s.message().find("Bad file descriptor"), std::string::npos) << s.ToString();
  }
}

TEST(Shard, ManifestCountMustMatchTheShard) {
  testing::ScratchDir dir;
  Manifest m = WriteShards(dir.path(), {4, 3});
  for (uint64_t lie : {uint64_t{5}, uint64_t{1} << 28, uint64_t{1} << 63}) {
    Manifest bad = m;
    bad.splits["train"].shards[1].count = lie;
    bad.splits["train"].num_samples = 4 + lie;
    Status s = SplitReader::Open(dir.path(), bad, "train").status();
    EXPECT_EQ(s.code(), StatusCode::kCorruption) << s.ToString();
    EXPECT_EQ(s.message(), "split 'train', shard train/shard-1: the manifest says " +
                               std::to_string(lie) + " records but the shard holds 3");
  }
  Manifest bad = m;
  bad.splits["train"].num_samples = 1ull << 63;
  Status s = SplitReader::Open(dir.path(), bad, "train").status();
  EXPECT_EQ(s.code(), StatusCode::kCorruption) << s.ToString();
  EXPECT_EQ(s.message(),
            "split 'train': num_samples is 9223372036854775808 but its shards hold 7 records");
}

// Byte-level edits of a written data.mdb (LMDB 0.9's layout: see
// shard_tree_check.cc), as a damaged disk or a hostile file would make them.
class RawShard {
 public:
  explicit RawShard(std::string path) : path_(std::move(path)) { bytes_ = *ReadFileBytes(path_); }
  template <typename T>
  T Get(size_t off) const {
    T v;
    std::memcpy(&v, bytes_.data() + off, sizeof v);
    return v;
  }
  template <typename T>
  void Set(size_t off, T v) {
    std::memcpy(bytes_.data() + off, &v, sizeof v);
  }
  // The meta page LMDB uses (the higher transaction id) and the tree's root page.
  size_t Meta() const { return Get<uint64_t>(4096 + 144) > Get<uint64_t>(144) ? 4096 : 0; }
  size_t Root() const { return Get<uint64_t>(Meta() + 128) * 4096; }
  // Node i of the page at byte `page`, and a branch node's child page.
  size_t Node(size_t page, size_t i) const { return page + Get<uint16_t>(page + 16 + 2 * i); }
  uint64_t Child(size_t node) const {
    return Get<uint16_t>(node) | (uint64_t{Get<uint16_t>(node + 2)} << 16) |
           (uint64_t{Get<uint16_t>(node + 4)} << 32);
  }
  void SetChild(size_t node, uint64_t pgno) {
    for (int k = 0; k < 3; ++k) Set<uint16_t>(node + 2 * k, static_cast<uint16_t>(pgno >> (16 * k)));
  }
  void Save() const { ASSERT_TRUE(WriteFile(path_, bytes_.data(), bytes_.size()).ok()); }
  const uint8_t* bytes_at(size_t off) const { return bytes_.data() + off; }

 private:
  std::string path_;
  std::vector<uint8_t> bytes_;
};

// A 3,000-record shard: its root is a branch page, its children leaves.
struct BranchShard {
  explicit BranchShard(const std::string& dir)
      : manifest(WriteShards(dir, {3000})), raw(dir + "/train/shard-0/data.mdb"), root(raw.Root()) {
    EXPECT_EQ(raw.Get<uint16_t>(root + 10), 1) << "the root is a branch page";
  }
  Manifest manifest;
  RawShard raw;
  size_t root;
};

// Records of 3,000 bytes: each in its own overflow pages, as images are.
Manifest WriteBigRecords(const std::string& root, uint64_t n) {
  Manifest m;
  m.source_kind = "imagefolder";
  m.classes = {"a"};
  SplitInfo s;
  s.encoding = "raw";
  EXPECT_TRUE(MakeDirs(root + "/train").ok());
  auto w = ShardWriter::Create(root, "train/shard-0", 0);
  for (uint64_t i = 0; i < n; ++i) {
    std::vector<uint8_t> px(1000 * 3, static_cast<uint8_t>(i)), rec;
    RecordHeader h;
    h.width = 1000;
    h.height = 1;
    EncodeRecord(h, px, &rec);
    EXPECT_TRUE((*w)->Put(i, rec).ok());
  }
  s.shards.push_back(*(*w)->Finish());
  s.num_samples = n;
  m.splits["train"] = s;
  return m;
}

TEST(Shard, AValueSizePastTheFileIsCorruptionNotASignal) {
  // LMDB takes a value's size from its leaf node unchecked: 64 MiB here,
  // in a file of a few pages, made it read past the file's end (SIGBUS).
  testing::ScratchDir dir;
  Manifest m = WriteBigRecords(dir.path(), 4);
  RawShard raw(dir.path() + "/train/shard-0/data.mdb");
  const size_t root = raw.Root();
  ASSERT_EQ(raw.Get<uint16_t>(root + 10), 2) << "the root is a leaf page";
  const size_t node = root + raw.Get<uint16_t>(root + 16);  // the first node
  ASSERT_EQ(raw.Get<uint16_t>(node + 4) & 1, 1) << "its value is in overflow pages";
  raw.Set<uint16_t>(node + 2, 0x400);  // size's high half: 64 MiB
  raw.Save();
  Result<std::unique_ptr<SplitReader>> r = SplitReader::Open(dir.path(), m, "train");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kCorruption) << r.status().ToString();
  EXPECT_NE(r.status().message().find("shard train/shard-0"), std::string::npos);
  EXPECT_NE(r.status().message().find("lies outside the file"), std::string::npos)
      << r.status().ToString();
}

TEST(Shard, ANodeOffsetOutsideItsPageIsCorruption) {
  testing::ScratchDir dir;
  Manifest m = WriteShards(dir.path(), {20});
  RawShard raw(dir.path() + "/train/shard-0/data.mdb");
  raw.Set<uint16_t>(raw.Root() + 16, 0xFFF0);
  raw.Save();
  Status s = SplitReader::Open(dir.path(), m, "train").status();
  EXPECT_EQ(s.code(), StatusCode::kCorruption) << s.ToString();
  EXPECT_NE(s.message().find("node 0 lies outside the page's nodes"), std::string::npos)
      << s.ToString();
}

TEST(Shard, ABranchPageReachedTwiceIsCorruptionNotAnEndlessWalk) {
  // A branch page whose children are itself: without a record of the pages
  // seen, the whole-tree walk went down it 32 levels deep, ~2,000 ways at
  // each. A read's path is as deep as the meta page says, then needs a leaf.
  testing::ScratchDir dir;
  BranchShard shard(dir.path());
  Manifest& m = shard.manifest;
  RawShard& raw = shard.raw;
  const size_t root = shard.root;
  const uint64_t root_pgno = root / 4096;
  raw.SetChild(raw.Node(root, 0), root_pgno);  // the first two children: the root itself
  raw.SetChild(raw.Node(root, 1), root_pgno);
  raw.Set<uint16_t>(raw.Meta() + 88 + 6, 32);  // and as deep as allowed
  raw.Save();
  Status s = SplitReader::Open(dir.path(), m, "train").status();
  EXPECT_EQ(s.code(), StatusCode::kCorruption) << s.ToString();
  EXPECT_NE(s.message().find("page " + std::to_string(root_pgno) +
                             " has flags 1, expected a leaf page"),
            std::string::npos)
      << s.ToString();
}

TEST(Shard, APageWithTwoParentsIsFoundByTheWholeTreeWalk) {
  // The root's second child is its first one again: every page a read visits
  // is sound (a record under the lost page is missing), the cursor's walk
  // over the whole tree says what is wrong.
  testing::ScratchDir dir;
  BranchShard shard(dir.path());
  Manifest& m = shard.manifest;
  RawShard& raw = shard.raw;
  const size_t root = shard.root;
  raw.SetChild(raw.Node(root, 1), raw.Child(raw.Node(root, 0)));
  raw.Save();
  Result<std::unique_ptr<SplitReader>> r = SplitReader::Open(dir.path(), m, "train");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  SplitReader::ReadTxn txn = (*r)->BeginRead();
  EXPECT_TRUE(txn.Read(0).ok());
  Status whole = (*r)->shards()[0]->CheckWholeTree();
  EXPECT_EQ(whole.code(), StatusCode::kCorruption) << whole.ToString();
  EXPECT_NE(whole.message().find("is reached twice"), std::string::npos) << whole.ToString();
  Result<ShardReader::ReadTxn> t = (*r)->shards()[0]->BeginRead();
  ASSERT_TRUE(t.ok());
  Status walk = t->ForEach([](const ShardReader::Entry&) { return Status::Ok(); });
  EXPECT_EQ(walk.ToString(), whole.ToString()) << "a cursor asks for the same check";
}

TEST(Shard, ADamagedLeafAwayFromTheFirstRecordIsFoundByTheReadThatVisitsIt) {
  // Opening checks the first record's path only; the read of a record under
  // the damaged leaf checks that leaf before LMDB reads it.
  testing::ScratchDir dir;
  BranchShard shard(dir.path());
  Manifest& m = shard.manifest;
  RawShard& raw = shard.raw;
  const size_t root = shard.root;
  const size_t nodes = (raw.Get<uint16_t>(root + 12) - 16u) / 2;
  ASSERT_GE(nodes, 3u);
  const uint64_t leaf = raw.Child(raw.Node(root, nodes - 1));
  ASSERT_EQ(raw.Get<uint16_t>(leaf * 4096 + 10), 2) << "a leaf page";
  raw.Set<uint16_t>(leaf * 4096 + 16, 0xFFF0);  // its first node's offset
  raw.Save();
  Result<std::unique_ptr<SplitReader>> r = SplitReader::Open(dir.path(), m, "train");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  SplitReader::ReadTxn txn = (*r)->BeginRead();
  EXPECT_TRUE(txn.Read(0).ok());
  for (int attempt = 0; attempt < 2; ++attempt) {  // the page is not taken as checked after failing
    Result<RecordView> bad = txn.Read(2999);
    ASSERT_FALSE(bad.ok());
    EXPECT_EQ(bad.status().code(), StatusCode::kCorruption) << bad.status().ToString();
    EXPECT_EQ(bad.status().message(),
              "split 'train', shard train/shard-0, index 2999: its LMDB tree is damaged: page " +
                  std::to_string(leaf) + " node 0 lies outside the page's nodes");
  }
  EXPECT_TRUE(txn.Read(1).ok());
}

TEST(Shard, BranchKeysOutOfOrderAreCorruption) {
  // LMDB's binary search and the check's must take the same path: keys out
  // of order would let them part.
  testing::ScratchDir dir;
  BranchShard shard(dir.path());
  Manifest& m = shard.manifest;
  RawShard& raw = shard.raw;
  const size_t root = shard.root;
  const size_t a = raw.Node(root, 1), b = raw.Node(root, 2);
  ASSERT_EQ(raw.Get<uint16_t>(a + 6), 8);
  ASSERT_EQ(raw.Get<uint16_t>(b + 6), 8);
  const uint64_t ka = raw.Get<uint64_t>(a + 8), kb = raw.Get<uint64_t>(b + 8);
  raw.Set<uint64_t>(a + 8, kb);
  raw.Set<uint64_t>(b + 8, ka);
  raw.Save();
  Status s = SplitReader::Open(dir.path(), m, "train").status();
  EXPECT_EQ(s.code(), StatusCode::kCorruption) << s.ToString();
  EXPECT_NE(s.message().find("node 2's key is not after the key before it"), std::string::npos)
      << s.ToString();
}

TEST(Shard, GetAndCopyFindTheRecordsLmdbsCursorGivesInAnyOrderAndAgain) {
  // Get (through the map) and Copy search the checked pages themselves, no
  // mdb_get, and locate every record of a leaf they read (later reads need
  // no tree page): for every record of a deep tree of inline values and of
  // a shard of values in overflow pages, in shuffled order, the first time
  // and again from the located records, the bytes (for Get, the very
  // address) that LMDB's own cursor gives.
  testing::ScratchDir small, big;
  for (const auto& [root, m] : {std::pair{small.path(), WriteShards(small.path(), {40000})},
                                std::pair{big.path(), WriteBigRecords(big.path(), 300)}}) {
    Result<std::unique_ptr<SplitReader>> r = SplitReader::Open(root, m, "train");
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    Result<ShardReader::ReadTxn> txn = (*r)->shards()[0]->BeginRead();
    ASSERT_TRUE(txn.ok());
    std::vector<std::span<const uint8_t>> lmdb;
    ASSERT_TRUE(txn->ForEach([&](const ShardReader::Entry& e) {
                     EXPECT_EQ(e.index, lmdb.size());
                     lmdb.push_back(e.value);
                     return Status::Ok();
                   }).ok());
    const uint64_t n = (*r)->size();
    ASSERT_EQ(lmdb.size(), n);
    std::vector<uint64_t> order(n);
    for (uint64_t i = 0; i < n; ++i) order[i] = (i * 7919) % n;  // 7919 is prime: a permutation
    std::vector<uint8_t> buffer;
    for (int pass = 0; pass < 2; ++pass) {
      for (uint64_t i : order) {
        Result<std::span<const uint8_t>> got = txn->Get(i);
        Result<std::span<const uint8_t>> copy = txn->Copy(i, &buffer);
        ASSERT_TRUE(got.ok() && copy.ok()) << i;
        ASSERT_EQ(got->data(), lmdb[i].data()) << i;
        ASSERT_EQ(got->size(), lmdb[i].size()) << i;
        ASSERT_TRUE(std::equal(lmdb[i].begin(), lmdb[i].end(), copy->begin(), copy->end())) << i;
      }
    }
    EXPECT_EQ(txn->Copy(n, &buffer).status().message(), "record missing");
    EXPECT_EQ(txn->Get(n).status().message(), "record missing");
  }
}

TEST(Shard, LocatedRecordsStayWithinTheProcesssBudgetAndAreGivenBackOnClose) {
  // 16 bytes a record for every shard open, within one budget for the
  // process: a split of billions of records must not grow the loader's
  // memory without bound. Over the budget, reads search the tree (the same
  // answers).
  testing::ScratchDir dir;
  const Manifest m = WriteShards(dir.path(), {40000});
  const uint64_t before = ShardReader::LocatedBytes();
  auto read_all = [&](const SplitReader& r) {
    Result<ShardReader::ReadTxn> txn = r.shards()[0]->BeginRead();
    ASSERT_TRUE(txn.ok());
    std::vector<std::span<const uint8_t>> lmdb;
    ASSERT_TRUE(txn->ForEach([&](const ShardReader::Entry& e) {
                     lmdb.push_back(e.value);
                     return Status::Ok();
                   }).ok());
    for (int pass = 0; pass < 2; ++pass) {
      for (uint64_t i = 0; i < lmdb.size(); i += 7) {
        Result<std::span<const uint8_t>> got = txn->Get(i);
        ASSERT_TRUE(got.ok()) << i;
        ASSERT_EQ(got->data(), lmdb[i].data()) << i;
      }
    }
  };
  {
    Result<std::unique_ptr<SplitReader>> r = SplitReader::Open(dir.path(), m, "train");
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(ShardReader::LocatedBytes(), before + 40000 * 16);
    read_all(**r);
  }
  EXPECT_EQ(ShardReader::LocatedBytes(), before) << "given back when the shard closes";
  ShardReader::SetLocatedBudget(before + 40000 * 16 - 1);
  {
    Result<std::unique_ptr<SplitReader>> r = SplitReader::Open(dir.path(), m, "train");
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(ShardReader::LocatedBytes(), before) << "over the budget: nothing reserved";
    read_all(**r);
  }
  ShardReader::SetLocatedBudget(uint64_t{1} << 30);
}

TEST(Shard, ARecordInALeafLmdbsSearchDoesNotRouteToIsMissingEvenAfterItsLeafWasRead) {
  // A branch key lowered (still in order): the last records of the leaf
  // before it are now routed, by LMDB's search, to the next leaf, which does
  // not hold them: for LMDB they are missing. Reading a record of the first
  // leaf locates its records, only those LMDB routes there.
  testing::ScratchDir dir;
  BranchShard shard(dir.path());
  RawShard& raw = shard.raw;
  const size_t b1 = raw.Node(shard.root, 1), b2 = raw.Node(shard.root, 2);
  ASSERT_EQ(raw.Get<uint16_t>(b2 + 6), 8);
  unsigned char key[8];
  std::memcpy(key, &raw.bytes_at(b1 + 8)[0], 8);
  const uint64_t k1 = DecodeKey(key);
  std::memcpy(key, &raw.bytes_at(b2 + 8)[0], 8);
  const uint64_t k2 = DecodeKey(key);
  ASSERT_GT(k2, k1 + 20);
  EncodeKey(k2 - 10, key);
  for (int i = 0; i < 8; ++i) raw.Set<uint8_t>(b2 + 8 + i, key[i]);
  raw.Save();
  Result<std::unique_ptr<SplitReader>> r = SplitReader::Open(dir.path(), shard.manifest, "train");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  Result<ShardReader::ReadTxn> txn = (*r)->shards()[0]->BeginRead();
  ASSERT_TRUE(txn.ok());
  std::vector<uint8_t> buffer;
  ASSERT_TRUE(txn->Get(k2 - 20).ok());  // in the first leaf, routed there
  for (uint64_t i = k2 - 10; i < k2; ++i) {
    EXPECT_EQ(txn->Get(i).status().message(), "record missing") << i;
    EXPECT_EQ(txn->Copy(i, &buffer).status().message(), "record missing") << i;
  }
  EXPECT_TRUE(txn->Get(k2 - 11).ok());
  EXPECT_TRUE(txn->Get(k2).ok());
}

// Read system calls this process made (/proc/self/io's syscr), or -1.
long long ReadCalls() {
  std::ifstream io("/proc/self/io");
  std::string key;
  long long v;
  while (io >> key >> v)
    if (key == "syscr:") return v;
  return -1;
}

TEST(Shard, OpeningAndOneReadCostTheSameFewReadsWhateverTheShardsSize) {
  // Opening used to walk the whole tree: every branch and leaf page of a
  // shard, read by read. Now: the meta pages and one record's path.
  if (ReadCalls() < 0) GTEST_SKIP() << "/proc/self/io is not readable here: read calls not counted";
  auto cost = [](uint64_t records, long long* whole_tree) {
    testing::ScratchDir dir;
    Manifest m = WriteShards(dir.path(), {records});
    const long long before = ReadCalls();
    Result<std::unique_ptr<SplitReader>> r = SplitReader::Open(dir.path(), m, "train");
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (!r.ok()) return 0LL;
    SplitReader::ReadTxn txn = (*r)->BeginRead();
    EXPECT_TRUE(txn.Read(records / 2).ok());
    const long long open_and_read = ReadCalls() - before;
    EXPECT_TRUE((*r)->shards()[0]->CheckWholeTree().ok());
    *whole_tree = ReadCalls() - before - open_and_read;
    return open_and_read;
  };
  long long small_whole = 0, large_whole = 0;
  const long long small = cost(2000, &small_whole), large = cost(40000, &large_whole);
  EXPECT_GT(small, 0);
  EXPECT_LE(large, 2 * small) << "2,000 records: " << small << " reads; 40,000: " << large;
  // The count sees page reads: the whole tree of the larger shard is hundreds of them.
  EXPECT_GT(large_whole, 10 * large) << large_whole << " reads to walk the whole tree";
}

TEST(Shard, TheMetaPageCheckedIsTheOneLmdbUses) {
  // Equal transaction ids: LMDB uses the first meta page. Its root is made
  // bad; the check must look at that one, not at the intact second.
  testing::ScratchDir dir;
  Manifest m = WriteShards(dir.path(), {20});
  RawShard raw(dir.path() + "/train/shard-0/data.mdb");
  const size_t used = raw.Meta(), other = 4096 - used;
  raw.Set<uint64_t>(other + 144, raw.Get<uint64_t>(used + 144));  // tie
  for (size_t off = 16; off < 152; ++off) raw.Set<uint8_t>(other + off, raw.Get<uint8_t>(used + off));
  raw.Set<uint64_t>(0 + 88 + 40, 1);  // meta 0's root: page 1, a meta page
  raw.Save();
  Status s = SplitReader::Open(dir.path(), m, "train").status();
  EXPECT_EQ(s.code(), StatusCode::kCorruption) << s.ToString();
  EXPECT_NE(s.message().find("page 1 is outside the file's pages"), std::string::npos) << s.ToString();
}

TEST(Shard, APageSizeLmdbCannotUseIsCorruption) {
  // LMDB takes the page size from the meta page unchecked: 0 divided by
  // zero, small ones read past its buffers, huge ones past the file.
  for (uint32_t psize : {0u, 16u, 100u, 1000u, 65536u, 1u << 30}) {
    SCOPED_TRACE(psize);
    testing::ScratchDir dir;
    Manifest m = WriteShards(dir.path(), {5});
    RawShard raw(dir.path() + "/train/shard-0/data.mdb");
    raw.Set<uint32_t>(40, psize);
    raw.Set<uint32_t>(4096 + 40, psize);
    raw.Save();
    Status s = SplitReader::Open(dir.path(), m, "train").status();
    EXPECT_EQ(s.code(), StatusCode::kCorruption) << s.ToString();
    EXPECT_NE(s.message().find("page size of " + std::to_string(psize)), std::string::npos)
        << s.ToString();
  }
  // Found by shard_fuzz: LMDB takes the page size of the newer meta page;
  // only the first one's was checked (SIGFPE in mdb_env_open).
  testing::ScratchDir dir;
  Manifest m = WriteShards(dir.path(), {5});
  RawShard raw(dir.path() + "/train/shard-0/data.mdb");
  raw.Set<uint64_t>(4096 + 144, raw.Get<uint64_t>(144) + 1);  // the second is newer
  raw.Set<uint32_t>(4096 + 40, 0);
  raw.Save();
  Status s = SplitReader::Open(dir.path(), m, "train").status();
  EXPECT_EQ(s.code(), StatusCode::kCorruption) << s.ToString();
  EXPECT_NE(s.message().find("its meta pages give page sizes 4096 and 0"), std::string::npos)
      << s.ToString();
}

TEST(Shard, ADeepTreeWrittenOverManyTransactionsPassesTheCheck) {
  // 40,000 records: a tree of depth 3 (branch, branch, leaf), written in
  // many transactions with the map grown, and records in overflow pages.
  testing::ScratchDir dir;
  Manifest m = WriteShards(dir.path(), {40000});
  RawShard raw(dir.path() + "/train/shard-0/data.mdb");
  EXPECT_GE(raw.Get<uint16_t>(raw.Meta() + 88 + 6), 3) << "depth";
  Result<std::unique_ptr<SplitReader>> r = SplitReader::Open(dir.path(), m, "train");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  SplitReader::ReadTxn txn = (*r)->BeginRead();
  for (uint64_t i : {uint64_t{0}, uint64_t{12345}, uint64_t{39999}}) {
    Result<RecordView> v = txn.Read(i);
    ASSERT_TRUE(v.ok()) << v.status().ToString();
    EXPECT_EQ(v->header.label, i % 5);
  }
  testing::ScratchDir big;
  Manifest mb = WriteBigRecords(big.path(), 300);
  EXPECT_TRUE(SplitReader::Open(big.path(), mb, "train").ok());
}

TEST(Shard, AnEntryCountTheFileCannotHoldIsCorruption) {
  // The meta page's count (2^40) with a manifest that agrees: readers
  // sized their index arrays by it (an 8 TiB allocation).
  testing::ScratchDir dir;
  Manifest m = WriteShards(dir.path(), {20});
  RawShard raw(dir.path() + "/train/shard-0/data.mdb");
  raw.Set<uint64_t>(120, uint64_t{1} << 40);
  raw.Set<uint64_t>(4096 + 120, uint64_t{1} << 40);
  raw.Save();
  m.splits["train"].shards[0].count = m.splits["train"].num_samples = uint64_t{1} << 40;
  Status s = SplitReader::Open(dir.path(), m, "train").status();
  EXPECT_EQ(s.code(), StatusCode::kCorruption) << s.ToString();
  EXPECT_NE(s.message().find("its meta page counts 1099511627776 records, more than its"),
            std::string::npos)
      << s.ToString();
}

TEST(Shard, AShardLinkedFromOutsideTheSetIsRefused) {
  testing::ScratchDir dir, elsewhere;
  Manifest m = WriteShards(dir.path(), {3});
  const std::string shard = dir.path() + "/train/shard-0";
  ASSERT_EQ(std::rename(shard.c_str(), (elsewhere.path() + "/s").c_str()), 0);
  ASSERT_EQ(::symlink((elsewhere.path() + "/s").c_str(), shard.c_str()), 0);
  Status s = SplitReader::Open(dir.path(), m, "train").status();
  EXPECT_EQ(s.code(), StatusCode::kCorruption) << s.ToString();
  EXPECT_NE(s.message().find("outside the shard set"), std::string::npos) << s.ToString();
  // A link that stays inside the set is fine.
  ASSERT_EQ(::unlink(shard.c_str()), 0);
  ASSERT_EQ(std::rename((elsewhere.path() + "/s").c_str(), (dir.path() + "/moved").c_str()), 0);
  ASSERT_EQ(::symlink("../moved", shard.c_str()), 0);
  EXPECT_TRUE(SplitReader::Open(dir.path(), m, "train").ok());
}

TEST(Shard, WrittenFilesAreTheUsersOnly) {
  testing::ScratchDir dir;
  const mode_t old = ::umask(022);
  WriteShards(dir.path(), {3});
  ::umask(old);
  struct stat st {};
  ASSERT_EQ(::stat((dir.path() + "/train/shard-0").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  ASSERT_EQ(::stat((dir.path() + "/train/shard-0/data.mdb").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

// Cut before a transaction begins: an error (BeginRead compares the size
// with the one at open), not the SIGBUS of LMDB's first read of its map.
TEST(Shard, TruncatedBeforeATransactionBeginsIsCorruptionNotASignal) {
  testing::ScratchDir dir;
  Manifest m = WriteShards(dir.path(), {600});
  const std::string data = dir.path() + "/train/shard-0/data.mdb";
  const uint64_t full = *FileSize(data);
  auto reader = SplitReader::Open(dir.path(), m, "train");
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  Truncate(data, 8192);
  auto txn = (*reader)->BeginRead();
  Status s = txn.Read(599).status();
  EXPECT_EQ(s.code(), StatusCode::kCorruption) << s.ToString();
  EXPECT_EQ(s.message(), "split 'train', shard train/shard-0, index 599: data.mdb is now 8192 "
                         "bytes, " + std::to_string(full) +
                             " when the shard was opened: it was truncated while open");
}

TEST(ShardDeathTest, TruncatedUnderAReaderNamesTheShard) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  testing::ScratchDir dir;
  Manifest m = WriteShards(dir.path(), {600});
  const std::string data = dir.path() + "/train/shard-0/data.mdb";
  EXPECT_EXIT(
      {
        auto reader = SplitReader::Open(dir.path(), m, "train");
        if (!reader.ok()) std::_Exit(3);
        auto txn = (*reader)->BeginRead();
        if (!txn.Read(0).ok()) std::_Exit(5);  // the transaction begun before the cut
        Truncate(data, 8192);
        for (uint64_t i = 0; i < 600; ++i) (void)txn.Read(i);
        std::_Exit(4);
      },
      ::testing::KilledBySignal(SIGBUS), "SIGBUS reading shard train/shard-0 .*truncated");
}

}  // namespace
}  // namespace nl
