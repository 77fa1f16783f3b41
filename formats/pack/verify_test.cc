// VerifyShardSet and ReadSample (pack_tool verify / export) on damaged and
// lying shard sets made with CraftRecord and WriteShardSetForTest.
#include "formats/pack/verify.h"

#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>

#include "base/file_util.h"
#include "formats/pack/cifar_source.h"
#include "formats/pack/pack.h"
#include "tests/support/fault_shard_files.h"
#include "tests/support/test_util.h"

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

// Raw records on two threads (the packer's own tests cover the options).
PackOptions RawPack() {
  PackOptions o;
  o.encoding = PackEncoding::kRaw;
  o.threads = 2;
  return o;
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

// ---- the shard files' faults, through the seam: problems naming the shard ----

TEST(Verify, EachShardFileFaultIsAProblemNamingTheShard) {
  ScratchDir dir;
  std::vector<std::vector<uint8_t>> recs;
  for (uint32_t i = 0; i < 40; ++i) recs.push_back(PngRecord(24, 24, i));
  WriteShardSetForTest(dir.path(), recs);
  const std::string data = dir / "train/shard-00000/data.mdb";
  const uint64_t full = *FileSize(data);
  testing::FaultShardFiles seam({.max_read = 5});  // short reads: nothing wrong
  VerifyReport r = VerifyShardSet(dir.path(), {.threads = 1, .files = &seam});
  EXPECT_TRUE(r.ok()) << AllProblems(r);
  EXPECT_EQ(r.records_checked, 40u);
  EXPECT_GT(seam.short_reads(), 0u);
  struct Case {
    testing::ShardFaults faults;
    std::string says;
  };
  const std::vector<Case> cases = {
      {{.open_errno = EIO},
       "train/shard-00000: I/O error: cannot open shard train/shard-00000 (" + data +
           "): Input/output error"},
      {{.size_errno = EIO},
       "train/shard-00000: I/O error: cannot read the size of " + data + ": Input/output error"},
      {{.read_errno = EIO, .read_error_from = 8192},
       "train/shard-00000: I/O error: cannot open shard train/shard-00000 (" + data +
           "): reading page at byte "},
      {{.shrink_to = 8192},
       "train/shard-00000: data.mdb is 8192 bytes, manifest says " + std::to_string(full)},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.says);
    seam.Set(c.faults);
    r = VerifyShardSet(dir.path(), {.threads = 1, .files = &seam});
    EXPECT_NE(AllProblems(r).find(c.says), std::string::npos) << AllProblems(r);
    Result<DecodedSample> s = ReadSample(dir.path(), "train", 1, kDefaultMaxPixels, seam);
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.status().message().find("shard train/shard-00000"), std::string::npos)
        << s.status().ToString();
  }
}

// ---- one pixel limit: verify and export use the loaders' default ----

// A 1x1 PNG whose IHDR declares w x h (CRC fixed up): a few bytes that would
// ask a decoder without a limit for w * h * 3 bytes.
std::vector<uint8_t> PngDeclaring(uint32_t w, uint32_t h) {
  testing::PngSpec spec;
  spec.width = spec.height = 1;
  spec.color_type = PNG_COLOR_TYPE_GRAY;
  spec.samples = {7};
  std::vector<uint8_t> png = testing::EncodePngForTest(spec);
  auto put32 = [&](size_t at, uint32_t v) {
    for (int i = 0; i < 4; ++i) png[at + i] = static_cast<uint8_t>(v >> (24 - 8 * i));
  };
  put32(16, w);
  put32(20, h);
  put32(29, static_cast<uint32_t>(crc32(crc32(0, nullptr, 0), png.data() + 12, 17)));
  return png;
}

TEST(Verify, HugeDeclaredImageIsOverTheDefaultLimit) {
  ScratchDir dir;
  RecordHeader hd;
  hd.encoding = Encoding::kPng;
  hd.width = hd.height = 1024;  // the header is within the limit; the PNG is not
  WriteShardSetForTest(dir.path(),
                       {PngRecord(8, 8, 1), CraftRecord(hd, PngDeclaring(1u << 20, 1u << 20))});
  VerifyReport r = VerifyShardSet(dir.path(), {.threads = 1});
  ASSERT_EQ(r.problems.size(), 1u) << AllProblems(r);
  EXPECT_EQ(r.problems[0].where, "train/shard-00000 index 1");
  EXPECT_EQ(r.problems[0].what,
            "Limit exceeded: PNG of 1048576x1048576 pixels exceeds the limit of " +
                std::to_string(kDefaultMaxPixels) + " pixels");
  Result<DecodedSample> s = ReadSample(dir.path(), "train", 1);
  EXPECT_EQ(s.status().code(), StatusCode::kResourceExhausted) << s.status().ToString();
  EXPECT_EQ(s.status().message(),
            "split 'train', shard train/shard-00000, index 1: PNG of 1048576x1048576 pixels "
            "exceeds the limit of 178956970 pixels");
}

TEST(Verify, LimitIsTheCallersOwn) {
  ScratchDir dir;
  WriteShardSetForTest(dir.path(), {PngRecord(24, 24, 1)});
  for (bool quick : {false, true}) {
    VerifyReport r = VerifyShardSet(dir.path(), {.quick = quick, .threads = 1, .max_pixels = 500});
    ASSERT_EQ(r.problems.size(), 1u) << AllProblems(r);
    EXPECT_NE(r.problems[0].what.find("exceeds the limit of 500 pixels"), std::string::npos)
        << r.problems[0].what;
    EXPECT_TRUE(VerifyShardSet(dir.path(), {.quick = quick, .threads = 1}).ok());
  }
  EXPECT_EQ(ReadSample(dir.path(), "train", 0, 500).status().code(),
            StatusCode::kResourceExhausted);
  EXPECT_TRUE(ReadSample(dir.path(), "train", 0, 576).ok());
}

// ---- a header that lies about its payload's size ----

TEST(Export, HeaderSizeDifferentFromPayloadIsCorruption) {
  ScratchDir dir;
  Image img = testing::PatternImage(48, 32, 5);
  RecordHeader hd;
  hd.width = 40;
  hd.height = 30;
  hd.encoding = Encoding::kPng;
  std::vector<uint8_t> lying_png = CraftRecord(hd, *EncodePng(img));
  hd.encoding = Encoding::kJpeg;
  std::vector<uint8_t> lying_jpeg = CraftRecord(hd, *EncodeJpeg(img.pixels, 48, 32, 3));
  WriteShardSetForTest(dir.path(), {PngRecord(8, 8, 1), lying_png, lying_jpeg},
                       {.encoding = "mixed"});
  for (uint64_t i : {1u, 2u}) {
    Result<DecodedSample> s = ReadSample(dir.path(), "train", i);
    EXPECT_EQ(s.status().code(), StatusCode::kCorruption) << s.status().ToString();
    EXPECT_EQ(s.status().message(), "split 'train', shard train/shard-00000, index " +
                                        std::to_string(i) +
                                        ": image decodes to 48x32 but the header says 40x30");
  }
  EXPECT_TRUE(ReadSample(dir.path(), "train", 0).ok());
  VerifyReport r = VerifyShardSet(dir.path(), {.threads = 1});
  ASSERT_EQ(r.problems.size(), 2u) << AllProblems(r);
  EXPECT_EQ(r.problems[0].what, "Corruption: image decodes to 48x32 but the header says 40x30");
}

// ---- the same problems, in the same (index) order, for any thread count ----

TEST(Verify, ProblemsInIndexOrderWhateverTheThreadCount) {
  ScratchDir dir;
  std::vector<std::vector<uint8_t>> recs;
  std::vector<uint64_t> bad;
  for (uint32_t i = 0; i < 200; ++i) {
    RecordHeader hd;
    hd.encoding = Encoding::kPng;
    if (i == 3) {  // slow to find: a large PNG whose header lies about its size
      hd.width = 1000;
      hd.height = 999;
      recs.push_back(CraftRecord(hd, *EncodePng(testing::PatternImage(1000, 1000, i))));
      bad.push_back(i);
    } else if (i % 7 == 5) {  // quick to find: a label past the classes
      hd.width = hd.height = 8;
      hd.label = 7;
      recs.push_back(CraftRecord(hd, *EncodePng(testing::PatternImage(8, 8, i))));
      bad.push_back(i);
    } else {
      recs.push_back(PngRecord(8, 8, i));
    }
  }
  WriteShardSetForTest(dir.path(), recs, {.shards = 2});
  const VerifyReport one = VerifyShardSet(dir.path(), {.threads = 1});
  ASSERT_EQ(one.problems.size(), bad.size()) << AllProblems(one);
  for (size_t k = 0; k < bad.size(); ++k) {
    const std::string& where = one.problems[k].where;
    EXPECT_EQ(where.substr(where.find(" index ")), " index " + std::to_string(bad[k])) << where;
  }
  EXPECT_EQ(one.problems[0].what,
            "Corruption: image decodes to 1000x1000 but the header says "
            "1000x999");
  for (int run = 0; run < 3; ++run) {
    const VerifyReport four = VerifyShardSet(dir.path(), {.threads = 4});
    EXPECT_EQ(AllProblems(four), AllProblems(one)) << "run " << run;
    EXPECT_EQ(four.records_checked, 200u);
    EXPECT_EQ(four.images_decoded, 200u);
  }
}

TEST(Export, CheckDecodedShape) {
  RecordHeader hd;
  hd.width = 3;
  hd.height = 2;
  Image img;
  img.width = 3;
  img.height = 2;
  EXPECT_TRUE(CheckDecodedShape(hd, img).ok());
  img.height = 4;
  Status s = CheckDecodedShape(hd, img);
  EXPECT_EQ(s.code(), StatusCode::kCorruption);
  EXPECT_EQ(s.message(), "image decodes to 3x4 but the header says 3x2");
}

// ---- damage found in packed sets (moved from pack_test.cc) ----

TEST(Verify, FindsDamageInShardFiles) {
  testing::ScratchDir d;
  ASSERT_TRUE(WriteFakeCifar100(d / "src", {.train = 200, .test = 20}).ok());
  ASSERT_TRUE(PackCifar100(d / "src", d / "out", CifarLabel::kFine, RawPack()).ok());
  // Flip one byte inside a record's pixels: the last record's payload is near
  // the end of the data pages; find one by content instead of guessing offsets.
  const std::string path = d / "out/train/shard-00000/data.mdb";
  std::vector<uint8_t> db = *ReadFileBytes(path);
  Result<DecodedSample> s = ReadSample(d / "out", "train", 150);
  ASSERT_TRUE(s.ok());
  auto it = std::search(db.begin(), db.end(), s->image.pixels.begin(), s->image.pixels.end());
  ASSERT_NE(it, db.end());
  it[100] ^= 0x55;
  testing::WriteBytes(path, db);
  VerifyReport rep = VerifyShardSet(d / "out", {.quick = true});
  ASSERT_FALSE(rep.ok());
  bool named = false;
  for (const auto& p : rep.problems) {
    if (p.where == "train/shard-00000 index 150" &&
        p.what.find("payload checksum mismatch") != std::string::npos)
      named = true;
  }
  EXPECT_TRUE(named);
  EXPECT_NE(rep.problems[0].what.find("checksum"), std::string::npos);
}

TEST(Verify, MissingShardAndManifest) {
  testing::ScratchDir d;
  ASSERT_TRUE(WriteFakeCifar100(d / "src", {.train = 20, .test = 20}).ok());
  ASSERT_TRUE(PackCifar100(d / "src", d / "out", CifarLabel::kFine, RawPack()).ok());
  ASSERT_TRUE(RemoveAll(d / "out/test").ok());
  VerifyReport rep = VerifyShardSet(d / "out", {});
  ASSERT_EQ(rep.problems.size(), 1u);
  EXPECT_EQ(rep.problems[0].where, "test/shard-00000");
  ASSERT_TRUE(RemoveAll(d / "out/manifest.json").ok());
  rep = VerifyShardSet(d / "out", {});
  ASSERT_EQ(rep.problems.size(), 1u);
  EXPECT_NE(rep.problems[0].what.find("Not found"), std::string::npos);
}

}  // namespace
}  // namespace nl
