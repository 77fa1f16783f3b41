// VerifyShardSet and ReadSample (pack_tool verify / export) on damaged and
// lying shard sets made with CraftRecord and WriteShardSetForTest.
#include "formats/verify.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include "formats/file_util.h"
#include "formats/test_util.h"

namespace nl {
namespace {

using testing::CraftRecord;
using testing::ScratchDir;
using testing::WriteShardSetForTest;

std::vector<uint8_t> PngRecord(uint32_t w, uint32_t h, uint32_t seed) {
  Image img = testing::PatternImage(w, h, seed);
  std::vector<uint8_t> png = *EncodePng(img);
  RecordHeader hd;
  hd.encoding = Encoding::kPng;
  hd.width = w;
  hd.height = h;
  return CraftRecord(hd, png);
}

std::string AllProblems(const VerifyReport& r) {
  std::string s;
  for (const auto& p : r.problems) s += p.where + ": " + p.what + "\n";
  return s;
}

// ---- truncated data.mdb: a problem naming the shard, never SIGBUS ----

TEST(Verify, TruncatedShardIsReportedNotASignal) {
  ScratchDir proto;
  std::vector<std::vector<uint8_t>> recs;
  for (uint32_t i = 0; i < 40; ++i) recs.push_back(PngRecord(24, 24, i));
  WriteShardSetForTest(proto.path(), recs);
  const uint64_t full = *FileSize(proto / "train/shard-00000/data.mdb");
  ASSERT_GT(full, 12288u + 4096u);
  for (uint64_t cut : {uint64_t{0}, uint64_t{8191}, uint64_t{8192}, uint64_t{12288}, full - 4096}) {
    for (bool quick : {false, true}) {
      SCOPED_TRACE("cut at " + std::to_string(cut) + (quick ? ", --quick" : ""));
      ScratchDir dir;
      WriteShardSetForTest(dir.path(), recs);
      const std::string data = dir / "train/shard-00000/data.mdb";
      ASSERT_EQ(::truncate(data.c_str(), static_cast<off_t>(cut)), 0);
      VerifyReport r = VerifyShardSet(dir.path(), {.quick = quick, .threads = 1});
      ASSERT_FALSE(r.ok());
      const std::string all = AllProblems(r);
      EXPECT_NE(all.find("data.mdb is " + std::to_string(cut) + " bytes, manifest says " +
                         std::to_string(full)),
                std::string::npos)
          << all;
      EXPECT_NE(all.find("Corruption: cannot open shard train/shard-00000"), std::string::npos)
          << all;
      EXPECT_NE(all.find(cut == 0 ? "empty (0 bytes)" : "truncated"), std::string::npos) << all;
      Result<DecodedSample> s = ReadSample(dir.path(), "train", 1);
      EXPECT_EQ(s.status().code(), StatusCode::kCorruption) << s.status().ToString();
      EXPECT_NE(s.status().message().find("shard train/shard-00000"), std::string::npos);
    }
  }
}

}  // namespace
}  // namespace nl
