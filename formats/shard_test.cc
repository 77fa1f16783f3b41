#include "formats/shard.h"

#include <gtest/gtest.h>

#include "formats/file_util.h"
#include "formats/test_util.h"

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

}  // namespace
}  // namespace nl
