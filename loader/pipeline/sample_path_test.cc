// The sample path: what every consumer of a stored sample goes through, and
// records that lie about their size (valid checksums, wrong header).
#include "loader/pipeline/sample_path.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "formats/manifest.h"
#include "tests/support/test_util.h"

namespace nl {
namespace {

std::vector<uint8_t> PngRecord(uint32_t img_side, uint32_t header_w, uint32_t header_h,
                               uint32_t seed) {
  const std::vector<uint8_t> png = *EncodePng(testing::PatternImage(img_side, img_side, seed));
  RecordHeader h;
  h.label = 1;
  h.encoding = Encoding::kPng;
  h.width = header_w;
  h.height = header_h;
  return testing::CraftRecord(h, png);
}

// Sample 0 tells the truth; 1 claims to be larger than its PNG, 2 smaller.
std::string LyingSet(const testing::ScratchDir& d) {
  testing::WriteShardSetForTest(
      d / "set", {PngRecord(8, 8, 8, 1), PngRecord(8, 64, 64, 2), PngRecord(8, 4, 8, 3)});
  return d / "set";
}

struct Opened {
  Manifest manifest;
  std::unique_ptr<SplitReader> reader;
};
Opened Open(const std::string& dir) {
  Opened o;
  o.manifest = *LoadManifest(dir);
  auto r = SplitReader::Open(dir, o.manifest, "train");
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  o.reader = std::move(*r);
  return o;
}

TEST(SamplePath, ATruthfulRecordIsResizedLikeTheTransformAlone) {
  testing::ScratchDir d;
  Opened o = Open(LyingSet(d));
  TransformConfig tc;
  tc.image_size = 16;
  SamplePath path(*o.reader, tc, DecodeLimits{});
  std::vector<uint8_t> got(path.sample_bytes()), want(path.sample_bytes());
  int64_t label = -1;
  SampleTimes times;
  ASSERT_TRUE(path.Load(0, 0, got.data(), &label, &times).ok());
  EXPECT_EQ(label, 1);
  const Image img = testing::PatternImage(8, 8, 1);
  SampleTransform(tc).Apply(img.pixels.data(), 8, 8, 0, 0, want.data());
  EXPECT_EQ(got, want);
}

TEST(SamplePath, RecordsReadWithPreadGiveTheSameSampleAsThroughTheMap) {
  testing::ScratchDir d;
  Opened o = Open(LyingSet(d));
  TransformConfig tc;
  tc.image_size = 16;
  SamplePath mapped(*o.reader, tc, DecodeLimits{}, false), copied(*o.reader, tc, DecodeLimits{}, true);
  std::vector<uint8_t> a(mapped.sample_bytes()), b(copied.sample_bytes());
  int64_t la = -1, lb = -2;
  ASSERT_TRUE(mapped.Load(0, 0, a.data(), &la).ok());
  ASSERT_TRUE(copied.Load(0, 0, b.data(), &lb).ok());
  EXPECT_EQ(a, b);
  EXPECT_EQ(la, lb);
  Status bad = copied.Load(0, 1, b.data(), &lb);
  EXPECT_EQ(bad.ToString(), mapped.Load(0, 1, a.data(), &la).ToString()) << "the same errors too";
}

TEST(SamplePath, AHeaderThatDisagreesWithItsPayloadIsCorruptionNamingTheSample) {
  testing::ScratchDir d;
  Opened o = Open(LyingSet(d));
  SamplePath path(*o.reader, TransformConfig{}, DecodeLimits{});
  std::vector<uint8_t> out(path.sample_bytes());
  int64_t label = 0;
  Status larger = path.Load(0, 1, out.data(), &label);
  EXPECT_EQ(larger.code(), StatusCode::kCorruption);
  EXPECT_EQ(larger.message(),
            "split 'train', shard train/shard-00000, index 1: image decodes to 8x8 but the "
            "header says 64x64");
  Status smaller = path.Load(0, 2, out.data(), &label);
  EXPECT_EQ(smaller.code(), StatusCode::kCorruption);
  EXPECT_NE(smaller.message().find("index 2: image decodes to 8x8 but the header says 4x8"),
            std::string::npos)
      << smaller.message();
  EXPECT_TRUE(path.Load(0, 0, out.data(), &label).ok()) << "one bad record leaves the path usable";
}

// `loader preview` read past the decoded image on such a record (ASan:
// heap-buffer-overflow; Release: SIGSEGV). It goes through SamplePath now.
TEST(SamplePath, LoaderPreviewRefusesALyingRecordInsteadOfReadingPastIt) {
  // ctest sets NL_BIN_DIR; run by hand, the test binary sits beside `loader`.
  const char* env = std::getenv("NL_BIN_DIR");
  const std::string bin =
      env ? env : std::filesystem::read_symlink("/proc/self/exe").parent_path().string();
  testing::ScratchDir d;
  const std::string set = LyingSet(d);
  const std::string cmd =
      bin + "/loader preview --data " + set + " --indices 1 --out " + (d / "pv") + " 2>&1";
  FILE* f = ::popen(cmd.c_str(), "r");
  ASSERT_NE(f, nullptr);
  std::string out;
  char buf[512];
  while (std::fgets(buf, sizeof buf, f)) out += buf;
  const int status = ::pclose(f);
  ASSERT_TRUE(WIFEXITED(status)) << "killed by a signal: " << out;
  EXPECT_EQ(WEXITSTATUS(status), 1) << out;
  EXPECT_NE(out.find("index 1: image decodes to 8x8 but the header says 64x64"), std::string::npos)
      << out;
}

}  // namespace
}  // namespace nl
