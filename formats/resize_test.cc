#include "formats/resize.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "tests/support/test_util.h"

namespace nl {
namespace {

using testing::Noise;

// The documented formula, straight from its text, in double precision up to
// the final fixed-point step; one axis at a time.
std::vector<uint8_t> ReferenceAxis(const std::vector<uint8_t>& src, int rows, int cols, int out,
                                   bool along_rows) {
  const int in = along_rows ? rows : cols;
  const double scale = static_cast<double>(in) / out, fs = std::max(scale, 1.0), support = fs;
  std::vector<uint8_t> dst(along_rows ? static_cast<size_t>(out) * cols
                                      : static_cast<size_t>(rows) * out);
  for (int o = 0; o < out; ++o) {
    const double center = (o + 0.5) * scale;
    const int lo = std::max(0, static_cast<int>(center - support + 0.5));
    const int hi = std::min(in, static_cast<int>(center + support + 0.5));
    std::vector<double> w;
    double sum = 0;
    for (int i = lo; i < hi; ++i) {
      const double t = std::fabs((i - center + 0.5) / fs);
      w.push_back(t < 1 ? 1 - t : 0);
      sum += w.back();
    }
    std::vector<int64_t> fixed;
    for (double x : w) fixed.push_back(static_cast<int64_t>(0.5 + x / sum * (1 << 22)));
    const int other = along_rows ? cols : rows;
    for (int j = 0; j < other; ++j) {
      int64_t acc = 1 << 21;
      for (int i = lo; i < hi; ++i) {
        const uint8_t p = along_rows ? src[static_cast<size_t>(i) * cols + j]
                                     : src[static_cast<size_t>(j) * cols + i];
        acc += p * fixed[i - lo];
      }
      const int64_t v = std::clamp<int64_t>(acc >> 22, 0, 255);
      (along_rows ? dst[static_cast<size_t>(o) * cols + j]
                  : dst[static_cast<size_t>(j) * out + o]) = static_cast<uint8_t>(v);
    }
  }
  return dst;
}

std::vector<uint8_t> Reference(const std::vector<uint8_t>& src, int w, int h, int ow, int oh) {
  std::vector<uint8_t> tmp =
      w == ow ? src : ReferenceAxis(src, h, w, ow, false);  // horizontal first
  return h == oh ? tmp : ReferenceAxis(tmp, h, ow, oh, true);
}

std::vector<uint8_t> Ours(const std::vector<uint8_t>& src, int w, int h, int ow, int oh, Isa isa) {
  PlaneResizer r;
  std::vector<uint8_t> out(static_cast<size_t>(ow) * oh);
  r.Resize(src.data(), w, h, w, ow, oh, 0, 0, ow, oh, out.data(), ow, isa);
  return out;
}

TEST(Resize, MatchesTheDocumentedFormulaUpAndDown) {
  struct Case {
    int w, h, ow, oh;
  };
  for (const Case& c : {Case{32, 32, 224, 224}, Case{5, 3, 17, 11}, Case{40, 30, 13, 7},
                        Case{100, 20, 33, 20}, Case{20, 100, 20, 9}, Case{7, 9, 70, 4}}) {
    SCOPED_TRACE(std::to_string(c.w) + "x" + std::to_string(c.h) + " -> " + std::to_string(c.ow) +
                 "x" + std::to_string(c.oh));
    std::vector<uint8_t> src = Noise(static_cast<size_t>(c.w) * c.h, c.w * 131 + c.h);
    const std::vector<uint8_t> want = Reference(src, c.w, c.h, c.ow, c.oh);
    EXPECT_EQ(Ours(src, c.w, c.h, c.ow, c.oh, Isa::kScalar), want);
    if (BestIsa() == Isa::kAvx2) {
      EXPECT_EQ(Ours(src, c.w, c.h, c.ow, c.oh, Isa::kAvx2), want);
    }
  }
}

TEST(Resize, HandComputedValues) {
  // 2x1 -> 4x1 upscale: centres 0.25, 0.75, 1.25, 1.75 of [a, b].
  // Outputs 0 and 3 copy the edges; 1 and 2 are 3/4 a + 1/4 b and 1/4 a + 3/4 b.
  std::vector<uint8_t> src = {0, 200};
  EXPECT_EQ(Ours(src, 2, 1, 4, 1, Isa::kScalar), (std::vector<uint8_t>{0, 50, 150, 200}));
  // 4x1 -> 2x1 downscale, antialiased: support 2; output 0 (centre 1) weighs
  // pixels 0, 1, 2 by tri(-0.25), tri(0.25), tri(0.75) = 3/7, 3/7, 1/7:
  // (0*3 + 60*3 + 120) / 7 = 42.86 -> 43. Output 1 (centre 3): pixels 1, 2, 3
  // by 1/7, 3/7, 3/7: (60 + 360 + 540) / 7 = 137.1 -> 137.
  std::vector<uint8_t> down = {0, 60, 120, 180};
  EXPECT_EQ(Ours(down, 4, 1, 2, 1, Isa::kScalar), (std::vector<uint8_t>{43, 137}));
}

TEST(Resize, SimdAndScalarIdenticalOnManySizes) {
  if (BestIsa() != Isa::kAvx2) GTEST_SKIP() << "no AVX2 on this CPU";
  std::mt19937 g(3);
  for (int i = 0; i < 200; ++i) {
    const int w = 1 + g() % 80, h = 1 + g() % 80, ow = 1 + g() % 120, oh = 1 + g() % 120;
    std::vector<uint8_t> src = Noise(static_cast<size_t>(w) * h, i);
    ASSERT_EQ(Ours(src, w, h, ow, oh, Isa::kScalar), Ours(src, w, h, ow, oh, Isa::kAvx2))
        << w << "x" << h << " -> " << ow << "x" << oh;
  }
  // RandomResizedCrop's common case: shrinking by 1..2x on wide rows, where
  // each half block of 8 outputs reads its own 16-byte window.
  // Past ~1.7x, groups of 4 outputs read their own windows (up to ~2.7x);
  // past that, the scalar loop.
  for (const auto& [w, ow] : {std::pair{300, 224}, std::pair{381, 224}, std::pair{440, 224}, std::pair{225, 224},
                              std::pair{250, 160}, std::pair{449, 256}, std::pair{420, 224}, std::pair{500, 224},
                              std::pair{600, 224}, std::pair{640, 224}, std::pair{900, 224}, std::pair{333, 101}}) {
    std::vector<uint8_t> src = Noise(static_cast<size_t>(w) * 5, static_cast<uint32_t>(w));
    ASSERT_EQ(Ours(src, w, 5, ow, 5, Isa::kScalar), Ours(src, w, 5, ow, 5, Isa::kAvx2)) << w << " -> " << ow;
    ResizeAxis axis;
    MakeBilinearAxis(w, ow, 0, ow, &axis);
    int groups4 = 0, scalar = 0;
    for (const ResizeAxis::Block& b : axis.blocks) {
      groups4 += b.fits && b.group == 4;
      scalar += !b.fits;
    }
    const double shrink = static_cast<double>(w) / ow;
    if (shrink > 1.8 && shrink < 2.6) {
      EXPECT_GT(groups4, 0) << w << " -> " << ow;
    }
    if (shrink < 2.6) {
      EXPECT_EQ(scalar, 0) << w << " -> " << ow;
    }
  }
}

TEST(SplitRgb, PlanesAndTheirMirrorOnEveryLengthBothPathsAlike) {
  std::vector<Isa> isas = {Isa::kScalar};
  if (BestIsa() == Isa::kAvx2) isas.push_back(Isa::kAvx2);
  for (int n = 0; n <= 70; ++n) {
    const std::vector<uint8_t> rgb = Noise(static_cast<size_t>(n) * 3, static_cast<uint32_t>(n + 1));
    for (bool reverse : {false, true}) {
      for (Isa isa : isas) {
        // A guard byte on each side: nothing is written outside the planes.
        std::vector<uint8_t> d[3];
        for (auto& p : d) p.assign(n + 2, 0xA5);
        SplitRgb(rgb.data(), n, reverse, d[0].data() + 1, d[1].data() + 1, d[2].data() + 1, isa);
        for (int c = 0; c < 3; ++c) {
          ASSERT_EQ(d[c].front(), 0xA5) << n;
          ASSERT_EQ(d[c].back(), 0xA5) << n;
          for (int j = 0; j < n; ++j) {
            const int from = reverse ? n - 1 - j : j;
            ASSERT_EQ(d[c][j + 1], rgb[from * 3 + c])
                << "n=" << n << " reverse=" << reverse << " isa=" << static_cast<int>(isa) << " c=" << c << " j=" << j;
          }
        }
      }
    }
  }
}

TEST(MaxSideSize, LongerSideToNTheOtherRoundedHalvesUp) {
  using P = std::pair<uint32_t, uint32_t>;
  EXPECT_EQ(MaxSideSize(640, 480, 0), (P{640, 480}));    // no limit
  EXPECT_EQ(MaxSideSize(640, 480, 640), (P{640, 480}));  // not over it
  EXPECT_EQ(MaxSideSize(640, 480, 256), (P{256, 192}));
  EXPECT_EQ(MaxSideSize(480, 640, 256), (P{192, 256}));
  EXPECT_EQ(MaxSideSize(23, 17, 12), (P{12, 9}));        // 8.87 -> 9
  EXPECT_EQ(MaxSideSize(4, 2, 3), (P{3, 2}));            // 1.5 -> 2 (half up)
  EXPECT_EQ(MaxSideSize(10000, 1, 100), (P{100, 1}));    // never 0
  EXPECT_EQ(MaxSideSize(1u << 20, 1u << 20, 1), (P{1, 1}));
}

// The whole-image resize is Pillow's per channel: each plane of it equals
// the plane resized alone.
TEST(ResizeImage, EachChannelIsThePlaneResizedAlone) {
  Image src;
  src.width = 37;
  src.height = 23;
  src.pixels = Noise(size_t{37} * 23 * 3, 4);
  Image out;
  ResizeImage(src, 15, 9, &out);
  ASSERT_EQ(out.width, 15u);
  ASSERT_EQ(out.height, 9u);
  for (int c = 0; c < 3; ++c) {
    std::vector<uint8_t> plane(37 * 23);
    for (size_t i = 0; i < plane.size(); ++i) plane[i] = src.pixels[i * 3 + c];
    const std::vector<uint8_t> want = Ours(plane, 37, 23, 15, 9, Isa::kScalar);
    for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(out.pixels[i * 3 + c], want[i]) << c << " " << i;
  }
}

TEST(Resize, CropWindowEqualsCropOfFullResize) {
  std::vector<uint8_t> src = Noise(37 * 23, 9);
  const std::vector<uint8_t> full = Ours(src, 37, 23, 90, 56, BestIsa());
  PlaneResizer r;
  std::vector<uint8_t> win(40 * 30);
  r.Resize(src.data(), 37, 23, 37, 90, 56, 25, 13, 40, 30, win.data(), 40, BestIsa());
  for (int y = 0; y < 30; ++y)
    for (int x = 0; x < 40; ++x)
      ASSERT_EQ(win[y * 40 + x], full[(y + 13) * 90 + x + 25]) << x << "," << y;
}

}  // namespace
}  // namespace nl
