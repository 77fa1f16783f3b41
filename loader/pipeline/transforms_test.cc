// Tests of loader/transforms.h: the per-sample geometry (flips, crops), the
// output layouts and normalization.
#include "loader/pipeline/transforms.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <tuple>

#include "tests/support/test_util.h"

namespace nl {
namespace {

using testing::Noise;

std::vector<uint8_t> Rgb(int w, int h, uint32_t seed) {
  return Noise(static_cast<size_t>(w) * h * 3, seed);
}

TEST(Transform, FlipAndCropGeometry) {
  TransformConfig c;
  c.image_size = 4;
  c.train = true;
  c.flip = true;
  c.pad_crop = 0;
  SampleTransform t(c);
  // A 4x4 image resized to 4x4 is copied: the flip is visible exactly.
  std::vector<uint8_t> img = Rgb(4, 4, 1);
  std::vector<uint8_t> out(t.SampleBytes());
  int flipped = 0;
  for (uint64_t idx = 0; idx < 32; ++idx) {
    const bool flip = t.Geometry(4, 4, 0, idx).flip;
    flipped += flip;
    t.Apply(img.data(), 4, 4, 0, idx, out.data());
    for (int ch = 0; ch < 3; ++ch)
      for (int y = 0; y < 4; ++y)
        for (int x = 0; x < 4; ++x) {
          const int sx = flip ? 3 - x : x;
          ASSERT_EQ(out[ch * 16 + y * 4 + x], img[(y * 4 + sx) * 3 + ch]);
        }
  }
  EXPECT_GT(flipped, 4);
  EXPECT_LT(flipped, 28);

  // Pad-crop: a 4x4 window of the zero-padded image.
  c.flip = false;
  c.pad_crop = 2;
  SampleTransform pc(c);
  for (uint64_t idx = 0; idx < 16; ++idx) {
    SampleGeometry g = pc.Geometry(4, 4, 1, idx);
    ASSERT_LE(g.crop_x, 4);
    pc.Apply(img.data(), 4, 4, 1, idx, out.data());
    for (int y = 0; y < 4; ++y)
      for (int x = 0; x < 4; ++x) {
        const int sx = g.crop_x + x - 2, sy = g.crop_y + y - 2;
        const bool inside = sx >= 0 && sx < 4 && sy >= 0 && sy < 4;
        ASSERT_EQ(out[y * 4 + x], inside ? img[(sy * 4 + sx) * 3] : 0);
      }
  }
}

TEST(Transform, ShorterCropMatchesTorchvisionGeometry) {
  TransformConfig c;
  c.image_size = 224;
  c.resize = ResizeMode::kShorterCrop;
  SampleTransform t(c);
  SampleGeometry g =
      t.Geometry(500, 375, 0, 0);  // Resize(224): 298x224, CenterCrop: left round(37.0)=37
  EXPECT_EQ(g.full_w, 298);
  EXPECT_EQ(g.full_h, 224);
  EXPECT_EQ(g.out_x, 37);
  g = t.Geometry(375, 501, 0,
                 0);  // 224 x int(224*501/375)=299; top = round(37.5) = 38 (half to even)
  EXPECT_EQ(g.full_h, 299);
  EXPECT_EQ(g.out_y, 38);
  g = t.Geometry(100, 251, 0, 0);  // 224 x int(562.24)=562; top = round(169.0) = 169
  EXPECT_EQ(g.out_y, 169);
}

// ImageNet's eval: Resize(256) + CenterCrop(224).
TEST(Transform, ResizeSizeThenCentreCropMatchesTorchvisionGeometry) {
  TransformConfig c;
  c.image_size = 224;
  c.resize = ResizeMode::kShorterCrop;
  c.resize_size = 256;
  SampleTransform t(c);
  SampleGeometry g = t.Geometry(500, 375, 0, 0);  // 341x256 (int(341.33)); left round(58.5) = 58, top 16
  EXPECT_EQ(g.full_w, 341);
  EXPECT_EQ(g.full_h, 256);
  EXPECT_EQ(g.out_x, 58);
  EXPECT_EQ(g.out_y, 16);
  g = t.Geometry(375, 500, 0, 0);
  EXPECT_EQ(g.full_w, 256);
  EXPECT_EQ(g.full_h, 341);
  EXPECT_EQ(g.out_x, 16);
  EXPECT_EQ(g.out_y, 58);
}

TEST(Transform, RandomResizedCropStaysInsideAndVaries) {
  TransformConfig c;
  c.image_size = 16;
  c.train = true;
  c.random_resized_crop = true;
  SampleTransform t(c);
  std::set<std::pair<int, int>> sizes;
  for (uint64_t i = 0; i < 200; ++i) {
    SampleGeometry g = t.Geometry(50, 40, 3, i);
    ASSERT_GE(g.crop_x, 0);
    ASSERT_GE(g.crop_y, 0);
    ASSERT_LE(g.crop_x + g.crop_w, 50);
    ASSERT_LE(g.crop_y + g.crop_h, 40);
    const double area = static_cast<double>(g.crop_w) * g.crop_h / 2000.0;
    ASSERT_GE(area, 0.06);
    sizes.insert({g.crop_w, g.crop_h});
  }
  EXPECT_GT(sizes.size(), 50u);
}

// What a region decode is asked for (SourceRegion) is all the transform
// reads: from a view that holds only that region (the rest of the image
// absent), every transform gives the full image's bytes, for eval's squash
// and shorter-crop (which reads only the middle of a wide image), pad-crop
// and random-resized crops, flipped or not, shrinking and enlarging.
TEST(Transform, AViewOfTheSourceRegionGivesTheWholeImagesBytes) {
  std::vector<TransformConfig> configs(5);
  configs[0].resize = ResizeMode::kSquash;
  configs[1].resize = ResizeMode::kShorterCrop;
  configs[2].train = true;
  configs[2].pad_crop = 4;
  configs[3].train = true;
  configs[3].random_resized_crop = true;
  configs[4] = configs[3];
  configs[4].normalize = true;
  configs[4].layout = Layout::kNHWC;
  int narrower = 0;
  for (size_t ci = 0; ci < configs.size(); ++ci) {
    TransformConfig c = configs[ci];
    for (const int s : {24, 64}) {
      c.image_size = s;
      c.seed = 9;
      SampleTransform t(c);
      for (const auto& [w, h] : {std::pair{97, 41}, std::pair{30, 52}, std::pair{24, 24}}) {
        const std::vector<uint8_t> img = Rgb(w, h, 7);
        for (uint64_t index = 0; index < 12; ++index) {
          std::vector<uint8_t> want(t.SampleBytes()), got(t.SampleBytes(), 0xAB);
          t.Apply(img.data(), w, h, 3, index, want.data());
          const SampleGeometry g = t.Geometry(w, h, 3, index);
          int x, y, rw, rh;
          t.SourceRegion(g, w, h, &x, &y, &rw, &rh);
          ASSERT_TRUE(x >= 0 && y >= 0 && x + rw <= w && y + rh <= h);
          narrower += rw < w || rh < h;
          // The region alone, in a buffer of its own size.
          std::vector<uint8_t> part(static_cast<size_t>(std::max(rw, 1)) * std::max(rh, 1) * 3);
          for (int r = 0; r < rh; ++r)
            std::copy_n(img.data() + (static_cast<size_t>(y + r) * w + x) * 3, static_cast<size_t>(rw) * 3,
                        part.data() + static_cast<size_t>(r) * rw * 3);
          t.Apply(SourceView{part.data(), w, h, x, y, rw, rh}, g, got.data());
          ASSERT_EQ(got, want) << "config " << ci << " size " << s << " image " << w << "x"
                               << h << " index " << index;
        }
      }
    }
  }
  EXPECT_GT(narrower, 20);
}

TEST(Transform, LayoutsAndNormalizeAgree) {
  std::vector<uint8_t> img = Rgb(32, 32, 5);
  TransformConfig c;
  c.image_size = 48;
  SampleTransform nchw(c);
  std::vector<uint8_t> a(nchw.SampleBytes());
  nchw.Apply(img.data(), 32, 32, 0, 0, a.data());
  c.layout = Layout::kNHWC;
  SampleTransform nhwc(c);
  std::vector<uint8_t> b(nhwc.SampleBytes());
  nhwc.Apply(img.data(), 32, 32, 0, 0, b.data());
  c.layout = Layout::kNCHW;
  c.normalize = true;
  SampleTransform norm(c);
  std::vector<uint8_t> f(norm.SampleBytes());
  norm.Apply(img.data(), 32, 32, 0, 0, f.data());
  const float* fp = reinterpret_cast<const float*>(f.data());
  const size_t plane = 48 * 48;
  for (size_t i = 0; i < plane; ++i) {
    for (int ch = 0; ch < 3; ++ch) {
      ASSERT_EQ(a[ch * plane + i], b[i * 3 + ch]);
      ASSERT_FLOAT_EQ(fp[ch * plane + i], (a[ch * plane + i] / 255.0f - c.mean[ch]) / c.std[ch]);
    }
  }
}

TEST(Transform, ParsesModesAndLayoutsAndNamesBadOnes) {
  EXPECT_EQ(*ParseResizeMode("squash"), ResizeMode::kSquash);
  EXPECT_EQ(*ParseResizeMode("shorter-crop"), ResizeMode::kShorterCrop);
  Status mode = ParseResizeMode("crop").status();
  EXPECT_EQ(mode.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(mode.message(), "unknown resize mode 'crop' (use squash or shorter-crop)");
  EXPECT_EQ(*ParseLayout("nchw"), Layout::kNCHW);
  EXPECT_EQ(*ParseLayout("NHWC"), Layout::kNHWC);
  Status layout = ParseLayout("chw").status();
  EXPECT_EQ(layout.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(layout.message(), "unknown layout 'chw' (use nchw or nhwc)");
  for (const DecodeMode m : {DecodeMode::kExact, DecodeMode::kFast, DecodeMode::kAuto}) {
    EXPECT_EQ(*ParseDecodeMode(DecodeModeName(m)), m) << DecodeModeName(m);
  }
  EXPECT_EQ(ParseDecodeMode("quick").status().message(),
            "unknown decode mode 'quick' (use exact, fast or auto)");
}

// A geometry: a crop of cw x ch resized to full x full, padded by `pad`.
SampleGeometry Crop(int cw, int ch, int full, int pad = 0) {
  SampleGeometry g;
  g.crop_w = cw;
  g.crop_h = ch;
  g.full_w = g.full_h = full;
  g.pad = pad;
  return g;
}

// The decode each mode picks from the geometry alone: exact is full scale;
// fast the smallest of 1/8, 1/4, 1/2 and 1 that keeps the crop at least
// the output size; auto the smallest below 1 that keeps it at least
// auto_min_ratio (2) times that size, approximately, else exact. The
// bounds are met exactly at 2x (a 256 px crop for 64 px at 1/2 is 128).
TEST(Transform, AutoDecodesScaledOnlyWhereTheScaledCropStaysTwiceTheOutput) {
  TransformConfig c;
  c.image_size = 64;
  const SampleTransform exact(c);
  c.decode = DecodeMode::kFast;
  const SampleTransform fast(c);
  c.decode = DecodeMode::kAuto;
  const SampleTransform automatic(c);
  ASSERT_EQ(c.auto_min_ratio, 2.0);
  struct Case {
    SampleGeometry g;
    DecodeChoice exact, fast, automatic;
  };
  const Case cases[] = {
      // 300 rows at 1/4 are 75 >= 64; at 1/2, 150 >= 128 (2x).
      {Crop(400, 300, 64), {8, false}, {2, true}, {4, true}},
      {Crop(256, 256, 64), {8, false}, {2, true}, {4, true}},    // 128 = 2 x 64
      {Crop(255, 256, 64), {8, false}, {4, true}, {8, false}},   // 63.75 < 64; 127.5 < 128
      {Crop(1024, 1024, 64), {8, false}, {1, true}, {1, true}},  // 128 at 1/8
      {Crop(1023, 2048, 64), {8, false}, {1, true}, {2, true}},
      {Crop(200, 150, 64), {8, false}, {4, true}, {8, false}},  // 75 at 1/2: under 2x
      {Crop(100, 100, 64),
       {8, false},
       {8, true},
       {8, false}},  // no scale: fast is still approximate
      {Crop(1000, 1000, 64, 4), {8, false}, {8, true}, {8, false}},  // padded: full scale
      {Crop(0, 0, 64), {8, false}, {8, true}, {8, false}},
      // The crop is compared with what it is resized to (shorter-crop's
      // full_w x full_h), not the window kept.
      {[] {
         SampleGeometry g = Crop(900, 600, 0);
         g.full_w = 96;
         g.full_h = 64;
         return g;
       }(),
       {8, false},
       {1, true},
       {2, true}},
  };
  for (const Case& k : cases) {
    const std::string what = std::to_string(k.g.crop_w) + "x" + std::to_string(k.g.crop_h) +
                             " to " + std::to_string(k.g.full_w) + "x" +
                             std::to_string(k.g.full_h) + ", pad " + std::to_string(k.g.pad);
    for (const auto& [t, want, name] :
         {std::tuple{&exact, k.exact, "exact"}, std::tuple{&fast, k.fast, "fast"},
          std::tuple{&automatic, k.automatic, "auto"}}) {
      const DecodeChoice got = t->ChooseDecode(k.g);
      EXPECT_EQ(got.scale_eighths, want.scale_eighths) << name << ", " << what;
      EXPECT_EQ(got.approximate, want.approximate) << name << ", " << what;
    }
  }
  // Over RandomResizedCrop's geometries and another ratio: auto's scale is
  // the smallest that keeps the scaled crop at least ratio x the output on
  // both axes, never smaller than fast's, and full scale is exact.
  c.random_resized_crop = c.train = true;
  c.auto_min_ratio = 3;
  const SampleTransform rrc(c);
  for (uint64_t i = 0; i < 500; ++i) {
    const SampleGeometry g = rrc.Geometry(500, 375, 0, i);
    const DecodeChoice a = rrc.ChooseDecode(g);
    const int n = a.scale_eighths;
    ASSERT_TRUE(n == 1 || n == 2 || n == 4 || n == 8) << n;
    EXPECT_EQ(a.approximate, n < 8) << i;
    EXPECT_GE(n, fast.ChooseDecode(g).scale_eighths) << i;
    const auto fits = [&g](int m) {
      return g.crop_w * m >= 3 * 8 * g.full_w && g.crop_h * m >= 3 * 8 * g.full_h;
    };
    if (n < 8) {
      EXPECT_TRUE(fits(n)) << i;
    }
    if (n > 1) {
      EXPECT_FALSE(fits(n / 2)) << i;
    }
  }
}

}  // namespace
}  // namespace nl
