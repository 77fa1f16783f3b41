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

// JPEG records are decoded only as far as the sample's crop reads them
// (DecodeImageRegionInto): every sample, for random-resized crops of
// photograph-sized images in several epochs, equals the full decode put
// through the transform alone, and so does the eval transform's.
TEST(SamplePath, AJpegDecodedAsFarAsItsCropGivesTheFullDecodesSample) {
  testing::ScratchDir d;
  std::vector<std::vector<uint8_t>> records;
  std::vector<Image> images;
  const uint32_t sizes[][2] = {{301, 203}, {160, 320}, {97, 61}};
  for (uint32_t i = 0; i < 3; ++i) {
    images.push_back(testing::PatternImage(sizes[i][0], sizes[i][1], 40 + i));
    JpegEncodeOptions jo;
    jo.quality = 90;
    jo.subsampling = i == 1 ? ChromaSubsampling::k422 : ChromaSubsampling::k420;
    jo.progressive = i == 2;
    const std::vector<uint8_t> jpg = *EncodeJpeg(images[i].pixels, images[i].width, images[i].height, 3, jo);
    images[i] = *DecodeImage(jpg);  // the full decode
    RecordHeader h;
    h.label = static_cast<int64_t>(i);
    h.encoding = Encoding::kJpeg;
    h.width = images[i].width;
    h.height = images[i].height;
    records.push_back(testing::CraftRecord(h, jpg));
  }
  testing::TestShardSetSpec spec;
  spec.encoding = "jpeg";
  spec.num_classes = 3;
  testing::WriteShardSetForTest(d / "set", records, spec);
  Opened o = Open(d / "set");
  TransformConfig train;
  train.image_size = 32;
  train.train = true;
  train.random_resized_crop = true;
  train.seed = 3;
  TransformConfig eval;
  eval.image_size = 32;
  eval.resize = ResizeMode::kShorterCrop;
  int cropped = 0;
  for (const TransformConfig& tc : {train, eval}) {
    SamplePath path(*o.reader, tc, DecodeLimits{});
    SampleTransform alone(tc);
    std::vector<uint8_t> got(path.sample_bytes()), want(path.sample_bytes());
    for (uint64_t epoch = 0; epoch < 8; ++epoch) {
      for (uint64_t i = 0; i < 3; ++i) {
        int64_t label = -1;
        const Status st = path.Load(epoch, i, got.data(), &label);
        ASSERT_TRUE(st.ok()) << st.ToString();
        EXPECT_EQ(label, static_cast<int64_t>(i));
        const Image& img = images[i];
        alone.Apply(img.pixels.data(), static_cast<int>(img.width), static_cast<int>(img.height), epoch, i,
                    want.data());
        ASSERT_EQ(got, want) << "epoch " << epoch << " sample " << i;
        const SampleGeometry g = alone.Geometry(static_cast<int>(img.width), static_cast<int>(img.height), epoch, i);
        cropped += g.crop_w * 2 < static_cast<int>(img.width) && g.crop_h * 2 < static_cast<int>(img.height);
      }
    }
  }
  EXPECT_GT(cropped, 0) << "no crop was small enough to leave most of an image undecoded";
}

// A shard set of one JPEG record: a 480x360 pattern (seed `seed`), in *img,
// encoded as *jpg.
Opened OneJpegSet(const testing::ScratchDir& d, int seed, Image* img, std::vector<uint8_t>* jpg) {
  *img = testing::PatternImage(480, 360, seed);
  *jpg = *EncodeJpeg(img->pixels, img->width, img->height, 3);
  RecordHeader h;
  h.encoding = Encoding::kJpeg;
  h.width = img->width;
  h.height = img->height;
  testing::TestShardSetSpec spec;
  spec.encoding = "jpeg";
  testing::WriteShardSetForTest(d / "set", {testing::CraftRecord(h, *jpg)}, spec);
  return Open(d / "set");
}

// --decode fast: a JPEG whose crop is at least twice the output is decoded
// at a DCT scale n/8 < 1 (n a power of two), as far as its scaled crop
// reads it, approximately (chroma by replication); the sample is the
// transform of the whole image decoded so, with the crop scaled
// (SampleTransform::Scaled), and near the exact sample (smooth content: red
// and green are gradients; blue, noise, is left out).
TEST(SamplePath, FastDecodeScalesInTheDctDomainAndStaysNearExact) {
  testing::ScratchDir d;
  Image img;
  std::vector<uint8_t> jpg;
  Opened o = OneJpegSet(d, 2, &img, &jpg);
  TransformConfig exact;
  exact.image_size = 64;
  exact.train = true;
  exact.random_resized_crop = true;
  exact.layout = Layout::kNHWC;
  TransformConfig fast = exact;
  fast.decode = DecodeMode::kFast;
  SamplePath fast_path(*o.reader, fast, DecodeLimits{}), exact_path(*o.reader, exact, DecodeLimits{});
  SampleTransform alone(fast);
  std::vector<uint8_t> got(fast_path.sample_bytes()), want(got.size()), ex(got.size());
  int scaled = 0;
  double diff = 0;
  size_t n = 0;
  for (uint64_t epoch = 0; epoch < 24; ++epoch) {
    int64_t label;
    ASSERT_TRUE(fast_path.Load(epoch, 0, got.data(), &label).ok());
    ASSERT_TRUE(exact_path.Load(epoch, 0, ex.data(), &label).ok());
    const SampleGeometry g = alone.Geometry(480, 360, epoch, 0);
    const int scale = alone.ChooseDecode(g).scale_eighths;
    ASSERT_TRUE(scale == 1 || scale == 2 || scale == 4 || scale == 8) << scale;
    if (scale < 8) {
      EXPECT_GE(g.crop_w * scale, 8 * 64) << "the scaled crop is at least the output";
      EXPECT_GE(g.crop_h * scale, 8 * 64) << "the scaled crop is at least the output";
    }
    if (scale > 1) {
      EXPECT_LT(std::min(g.crop_w, g.crop_h) * (scale / 2), 8 * 64) << "and the smallest such scale";
    }
    int sw, sh;
    const SampleGeometry gs = SampleTransform::Scaled(g, 480, 360, scale, &sw, &sh);
    DecodedRegion whole;
    ASSERT_TRUE(DecodeJpegRegionInto(jpg, {}, {}, &whole, scale, true).ok());
    alone.Apply(SourceView{whole.image.pixels.data(), sw, sh, 0, 0, sw, sh}, gs, want.data());
    ASSERT_EQ(got, want) << "epoch " << epoch << " scale " << scale;
    scaled += scale < 8;
    for (size_t i = 0; i < got.size(); i += 3) {
      diff += std::abs(got[i] - ex[i]) + std::abs(got[i + 1] - ex[i + 1]);
      n += 2;
    }
  }
  std::printf("--decode fast against exact: mean |difference| %.2f levels (24 samples, %d decoded scaled)\n",
              diff / static_cast<double>(n), scaled);
  EXPECT_GT(scaled, 3) << "few crops were small enough to scale";
  EXPECT_LT(diff / static_cast<double>(n), 2.0) << "mean |fast - exact| in levels";
}

// --decode auto: each sample decoded as ChooseDecode says from its
// geometry, through the same path: where the crop at a scale below 8/8
// stays at least twice the output, the fast decode at that scale (the
// transform of the whole image decoded so); elsewhere exactly the exact
// sample. Both kinds occur over these crops.
TEST(SamplePath, AutoIsFastWhereTheScaledCropStaysTwiceTheOutputAndExactElsewhere) {
  testing::ScratchDir d;
  Image img;
  std::vector<uint8_t> jpg;
  Opened o = OneJpegSet(d, 3, &img, &jpg);
  TransformConfig exact;
  exact.image_size = 48;
  exact.train = true;
  exact.random_resized_crop = true;
  exact.layout = Layout::kNHWC;
  TransformConfig automatic = exact;
  automatic.decode = DecodeMode::kAuto;
  SamplePath auto_path(*o.reader, automatic, DecodeLimits{}),
      exact_path(*o.reader, exact, DecodeLimits{});
  SampleTransform alone(automatic);
  std::vector<uint8_t> got(auto_path.sample_bytes()), want(got.size());
  int scaled = 0, exacts = 0;
  for (uint64_t epoch = 0; epoch < 32; ++epoch) {
    int64_t label;
    ASSERT_TRUE(auto_path.Load(epoch, 0, got.data(), &label).ok());
    const SampleGeometry g = alone.Geometry(480, 360, epoch, 0);
    const DecodeChoice c = alone.ChooseDecode(g);
    if (!c.approximate) {
      ASSERT_EQ(c.scale_eighths, 8);
      ASSERT_TRUE(exact_path.Load(epoch, 0, want.data(), &label).ok());
      EXPECT_EQ(got, want) << "epoch " << epoch << ": exact";
      ++exacts;
      continue;
    }
    ASSERT_LT(c.scale_eighths, 8);
    EXPECT_GE(g.crop_w * c.scale_eighths, 2 * 8 * g.full_w) << "epoch " << epoch;
    EXPECT_GE(g.crop_h * c.scale_eighths, 2 * 8 * g.full_h) << "epoch " << epoch;
    int sw, sh;
    const SampleGeometry gs = SampleTransform::Scaled(g, 480, 360, c.scale_eighths, &sw, &sh);
    DecodedRegion whole;
    ASSERT_TRUE(DecodeJpegRegionInto(jpg, {}, {}, &whole, c.scale_eighths, true).ok());
    alone.Apply(SourceView{whole.image.pixels.data(), sw, sh, 0, 0, sw, sh}, gs, want.data());
    EXPECT_EQ(got, want) << "epoch " << epoch << " at " << c.scale_eighths << "/8";
    ++scaled;
  }
  EXPECT_GT(scaled, 3);
  EXPECT_GT(exacts, 3);
}

// The scale follows the payload's bytes, not the record's encoding field: a
// PNG stored under a JPEG header (a crafted or mislabelled record; the
// decoders find the format from the bytes) loads with --decode fast as with
// exact, at full scale, instead of being refused for one mode only.
TEST(SamplePath, FastDecodeOfAPngUnderAJpegHeaderLoadsAsExact) {
  testing::ScratchDir d;
  const Image img = testing::PatternImage(400, 300, 4);
  RecordHeader h;
  h.encoding = Encoding::kJpeg;
  h.width = img.width;
  h.height = img.height;
  testing::TestShardSetSpec spec;
  spec.encoding = "jpeg";
  testing::WriteShardSetForTest(d / "set", {testing::CraftRecord(h, *EncodePng(img))}, spec);
  Opened o = Open(d / "set");
  TransformConfig exact;
  exact.image_size = 32;
  exact.train = true;
  exact.random_resized_crop = true;
  TransformConfig fast = exact;
  fast.decode = DecodeMode::kFast;
  SamplePath fast_path(*o.reader, fast, DecodeLimits{}), exact_path(*o.reader, exact, DecodeLimits{});
  std::vector<uint8_t> a(fast_path.sample_bytes()), b(a.size());
  for (uint64_t epoch = 0; epoch < 4; ++epoch) {
    int64_t label;
    const Status st = fast_path.Load(epoch, 0, a.data(), &label);
    ASSERT_TRUE(st.ok()) << st.ToString();
    ASSERT_TRUE(exact_path.Load(epoch, 0, b.data(), &label).ok());
    EXPECT_EQ(a, b) << "epoch " << epoch;
  }
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

// The same for JPEG records decoded as far as a random crop reads them: the
// crop is chosen from the header's size, so a header that lies makes a
// crop inside or outside the real image; either way the sample is refused
// with the sizes, whatever the crop (8 epochs), never read past.
TEST(SamplePath, AJpegWhoseHeaderLiesIsCorruptionWhateverItsCrop) {
  testing::ScratchDir d;
  const Image img = testing::PatternImage(40, 30, 5);
  const std::vector<uint8_t> jpg = *EncodeJpeg(img.pixels, 40, 30, 3);
  std::vector<std::vector<uint8_t>> records;
  for (const auto& [w, h] : {std::pair{400u, 300u}, std::pair{20u, 15u}, std::pair{40u, 31u}}) {
    RecordHeader hd;
    hd.encoding = Encoding::kJpeg;
    hd.width = w;
    hd.height = h;
    records.push_back(testing::CraftRecord(hd, jpg));
  }
  testing::TestShardSetSpec spec;
  spec.encoding = "jpeg";
  testing::WriteShardSetForTest(d / "set", records, spec);
  Opened o = Open(d / "set");
  TransformConfig tc;
  tc.image_size = 16;
  tc.train = true;
  tc.random_resized_crop = true;
  SamplePath path(*o.reader, tc, DecodeLimits{});
  std::vector<uint8_t> out(path.sample_bytes());
  int64_t label = 0;
  for (uint64_t epoch = 0; epoch < 8; ++epoch) {
    for (uint64_t i = 0; i < 3; ++i) {
      const Status st = path.Load(epoch, i, out.data(), &label);
      EXPECT_EQ(st.code(), StatusCode::kCorruption) << st.ToString();
      EXPECT_NE(st.message().find("index " + std::to_string(i) + ": image decodes to 40x30 but the header says"),
                std::string::npos)
          << st.message();
    }
  }
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
