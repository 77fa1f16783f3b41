// The shard-file seam (shard_files.h): the local files, and the readers
// through a fault-injecting one (tests/support/fault_shard_files.h): every
// fault is an error naming the shard file and what went wrong, never a
// signal or a record silently lost.
#include "formats/shard_files.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <string>
#include <vector>

#include "base/file_util.h"
#include "formats/shard.h"
#include "tests/support/fault_shard_files.h"
#include "tests/support/test_util.h"

namespace nl {
namespace {

using testing::FaultShardFiles;

std::vector<uint8_t> Record(uint64_t i) {
  std::vector<uint8_t> px(2 * 3 * 3);
  for (size_t k = 0; k < px.size(); ++k) px[k] = static_cast<uint8_t>(i * 7 + k);
  std::vector<uint8_t> out;
  RecordHeader h;
  h.label = static_cast<uint32_t>(i % 3);
  h.width = 3;
  h.height = 2;
  EncodeRecord(h, px, &out);
  return out;
}

// One split "train" of one shard, train/shard-0, of `n` records: 600 make
// a tree of many leaf pages under a branch page.
Manifest WriteSplit(const std::string& root, uint64_t n) {
  EXPECT_TRUE(MakeDirs(root + "/train").ok());
  auto w = ShardWriter::Create(root, "train/shard-0", 0);
  EXPECT_TRUE(w.ok()) << w.status().ToString();
  for (uint64_t i = 0; i < n; ++i) EXPECT_TRUE((*w)->Put(i, Record(i)).ok());
  Result<ShardInfo> info = (*w)->Finish();
  EXPECT_TRUE(info.ok()) << info.status().ToString();
  Manifest m;
  m.source_kind = "imagefolder";
  m.classes = {"a", "b", "c"};
  m.splits["train"].encoding = "raw";
  m.splits["train"].num_samples = n;
  m.splits["train"].shards = {*info};
  return m;
}

bool SameBytes(std::span<const uint8_t> got, const std::vector<uint8_t>& want) {
  return std::equal(got.begin(), got.end(), want.begin(), want.end());
}

TEST(ShardFiles, LocalOpensTheShardSetsOwnFile) {
  testing::ScratchDir dir;
  const Manifest m = WriteSplit(dir.path(), 20);
  const ShardInfo& info = m.splits.at("train").shards[0];
  Result<std::unique_ptr<ShardFile>> f = ShardFiles::Local().Open(dir.path(), info);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ((*f)->dir(), dir / "train/shard-0");
  EXPECT_EQ(*(*f)->Size(), info.bytes);
  const std::vector<uint8_t> want = *ReadFileBytes(dir / "train/shard-0/data.mdb");
  std::vector<uint8_t> got(100);
  EXPECT_EQ(*(*f)->ReadSome(4090, got.data(), got.size()), got.size());
  EXPECT_TRUE(std::equal(got.begin(), got.end(), want.begin() + 4090));
  EXPECT_EQ(*(*f)->ReadSome(want.size(), got.data(), got.size()), 0u) << "the file's end";
  ASSERT_TRUE(RemoveAll(dir / "train/shard-0").ok());
  Status s = ShardFiles::Local().Open(dir.path(), info).status();
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "cannot open shard train/shard-0 (" + dir.path() +
                             "/train/shard-0/data.mdb): No such file or directory");
}

TEST(ShardFiles, ShortReadsReadTheSameRecords) {
  testing::ScratchDir dir;
  const Manifest m = WriteSplit(dir.path(), 600);
  for (size_t most : {size_t{1}, size_t{7}, size_t{4095}}) {
    SCOPED_TRACE("at most " + std::to_string(most) + " bytes a read");
    FaultShardFiles seam({.max_read = most});
    auto reader = SplitReader::Open(dir.path(), m, "train", seam);
    ASSERT_TRUE(reader.ok()) << reader.status().ToString();
    auto txn = (*reader)->BeginRead();
    std::vector<uint8_t> copy;
    for (uint64_t i = 0; i < 600; i += (most == 1 ? 37 : 1)) {
      Result<std::span<const uint8_t>> got = txn.Get(i);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      EXPECT_TRUE(SameBytes(*got, Record(i))) << i;
      got = txn.CopyOf(i, &copy);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      EXPECT_TRUE(SameBytes(*got, Record(i))) << i;
    }
    EXPECT_TRUE((*reader)->shards()[0]->CheckWholeTree().ok());
    EXPECT_GT(seam.short_reads(), 0u);
  }
}

TEST(ShardFiles, AnErrorOpeningTheFileNamesIt) {
  testing::ScratchDir dir;
  const Manifest m = WriteSplit(dir.path(), 20);
  FaultShardFiles seam({.open_errno = EIO});
  Status s = SplitReader::Open(dir.path(), m, "train", seam).status();
  EXPECT_EQ(s.code(), StatusCode::kIOError) << s.ToString();
  EXPECT_EQ(s.message(), "cannot open shard train/shard-0 (" + dir.path() +
                             "/train/shard-0/data.mdb): Input/output error");
}

TEST(ShardFiles, AnErrorReadingTheSizeNamesTheFile) {
  testing::ScratchDir dir;
  const Manifest m = WriteSplit(dir.path(), 20);
  FaultShardFiles seam({.size_errno = EIO});
  Status s = SplitReader::Open(dir.path(), m, "train", seam).status();
  EXPECT_EQ(s.code(), StatusCode::kIOError) << s.ToString();
  EXPECT_EQ(s.message(), "cannot open shard train/shard-0 (" + dir.path() +
                             "/train/shard-0/data.mdb): reading its size: Input/output error");
}

TEST(ShardFiles, AnErrorReadingAPageAtOpenNamesTheFileAndTheByte) {
  testing::ScratchDir dir;
  const Manifest m = WriteSplit(dir.path(), 600);
  const std::string what =
      "cannot open shard train/shard-0 (" + dir.path() + "/train/shard-0/data.mdb): ";
  // The meta pages, then the first record's path (a tree page past them).
  FaultShardFiles seam({.read_errno = EIO});
  Status s = SplitReader::Open(dir.path(), m, "train", seam).status();
  EXPECT_EQ(s.code(), StatusCode::kIOError) << s.ToString();
  EXPECT_EQ(s.message(), what + "reading its first meta page at byte 0: Input/output error");
  seam.Set({.read_errno = EIO, .read_error_from = 8192});
  s = SplitReader::Open(dir.path(), m, "train", seam).status();
  EXPECT_EQ(s.code(), StatusCode::kIOError) << s.ToString();
  EXPECT_EQ(s.message().rfind(what + "reading page at byte ", 0), 0u) << s.ToString();
  EXPECT_NE(s.message().find(": Input/output error"), std::string::npos) << s.ToString();
}

TEST(ShardFiles, AnErrorReadingARecordNamesTheShardTheIndexAndTheByte) {
  testing::ScratchDir dir;
  const Manifest m = WriteSplit(dir.path(), 600);
  FaultShardFiles seam;
  auto reader = SplitReader::Open(dir.path(), m, "train", seam);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  auto txn = (*reader)->BeginRead();
  std::vector<uint8_t> copy;
  for (uint64_t i = 0; i < 600; ++i) ASSERT_TRUE(txn.CopyOf(i, &copy).ok()) << i;
  Result<ShardReader::ReadTxn::Extent> at = txn.Locate(400);
  ASSERT_TRUE(at.ok()) << at.status().ToString();
  Result<ShardReader::ReadTxn::Extent> before = txn.Locate(10);
  ASSERT_TRUE(before.ok() && before->offset + before->size <= at->offset);
  // Reads from record 400's first byte on fail; the ones before still read.
  seam.Set({.read_errno = EIO, .read_error_from = at->offset});
  Status s = txn.CopyOf(400, &copy).status();
  EXPECT_EQ(s.code(), StatusCode::kIOError) << s.ToString();
  EXPECT_EQ(s.message(),
            "split 'train', shard train/shard-0, index 400: reading data.mdb at byte " +
                std::to_string(at->offset) + ": Input/output error");
  Result<std::span<const uint8_t>> ok = txn.CopyOf(10, &copy);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_TRUE(SameBytes(*ok, Record(10)));
  // The whole tree's walk reads every page with the seam: one past the byte fails.
  s = (*reader)->shards()[0]->CheckWholeTree();
  EXPECT_EQ(s.code(), StatusCode::kIOError) << s.ToString();
  EXPECT_NE(s.message().find("Input/output error"), std::string::npos) << s.ToString();
}

TEST(ShardFiles, AFileThatShrinksUnderAReaderIsAnErrorWhereverItIsRead) {
  testing::ScratchDir dir;
  const Manifest m = WriteSplit(dir.path(), 600);
  const uint64_t full = m.splits.at("train").shards[0].bytes;
  FaultShardFiles seam;
  auto reader = SplitReader::Open(dir.path(), m, "train", seam);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  auto txn = (*reader)->BeginRead();
  std::vector<uint8_t> copy;
  ASSERT_TRUE(txn.CopyOf(0, &copy).ok());
  Result<ShardReader::ReadTxn::Extent> at = txn.Locate(500);
  ASSERT_TRUE(at.ok()) << at.status().ToString();
  const uint64_t cut = at->offset + 1;  // record 500's first byte is left
  seam.Set({.shrink_to = cut});
  // A transaction begun now: refused before LMDB reads its map.
  auto later = (*reader)->BeginRead();
  Status s = later.Read(3).status();
  EXPECT_EQ(s.code(), StatusCode::kCorruption) << s.ToString();
  EXPECT_EQ(s.message(), "split 'train', shard train/shard-0, index 3: data.mdb is now " +
                             std::to_string(cut) + " bytes, " + std::to_string(full) +
                             " when the shard was opened: it was truncated while open");
  // The transaction begun before: records read with pread end at the cut.
  s = txn.CopyOf(500, &copy).status();
  EXPECT_EQ(s.code(), StatusCode::kCorruption) << s.ToString();
  EXPECT_EQ(s.message(), "split 'train', shard train/shard-0, index 500: data.mdb ends at byte " +
                             std::to_string(cut) + ", inside this record (bytes " +
                             std::to_string(at->offset) + ".." +
                             std::to_string(at->offset + at->size) + "): the shard is truncated");
  Result<std::span<const uint8_t>> ok = txn.CopyOf(2, &copy);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_TRUE(SameBytes(*ok, Record(2)));
  // The whole tree's walk meets the end too.
  s = (*reader)->shards()[0]->CheckWholeTree();
  EXPECT_EQ(s.code(), StatusCode::kCorruption) << s.ToString();
  EXPECT_NE(s.message().find("lies past the end of the file"), std::string::npos) << s.ToString();
  // Opened again, it is shorter than the manifest says.
  s = SplitReader::Open(dir.path(), m, "train", seam).status();
  EXPECT_EQ(s.code(), StatusCode::kCorruption) << s.ToString();
  EXPECT_EQ(s.message(), "cannot open shard train/shard-0 (" + dir.path() +
                             "/train/shard-0/data.mdb): data.mdb is " + std::to_string(cut) +
                             " bytes but the manifest says " + std::to_string(full) +
                             ": the shard is truncated");
}

TEST(ShardFiles, OnlyTheFaultyShardFails) {
  testing::ScratchDir dir;
  const Manifest m = WriteSplit(dir.path(), 20);
  FaultShardFiles seam({.shard = "train/shard-9", .open_errno = EIO});
  EXPECT_TRUE(SplitReader::Open(dir.path(), m, "train", seam).ok());
  seam.Set({.shard = "train/shard-0", .open_errno = EIO});
  EXPECT_EQ(SplitReader::Open(dir.path(), m, "train", seam).status().code(), StatusCode::kIOError);
}

}  // namespace
}  // namespace nl
