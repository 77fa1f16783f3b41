// Region decode (DecodeJpegRegionInto): its pixels are the full decode's,
// for every sampling, colour space and coding a photograph arrives in.
#include <csetjmp>
#include <cstdio>
#include <jpeglib.h>

#include <gtest/gtest.h>
#if __has_include(<valgrind/memcheck.h>)
#include <valgrind/memcheck.h>
#define NL_HAVE_MEMCHECK 1
#endif

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "formats/image.h"
#include "tests/support/test_util.h"

namespace nl {
namespace {

// How a test JPEG is coded (nl::testing::JpegCoding: libjpeg's own
// compressor, any sampling factors and restart intervals), named.
struct Coding {
  std::string name;
  int components = 3;  // 1 gray, 3 RGB (coded YCbCr), 4 CMYK (coded YCCK)
  int h_samp = 2, v_samp = 2;  // the first component's; the others 1x1
  bool progressive = false;
  int restart_rows = 0;  // a restart marker every N MCU rows (0: none)
  int restart_mcus = 0;  // a restart marker every N MCUs (0: none), rows or not
  bool row_restarts = false;  // then through AddJpegRowRestarts (the packer's --jpeg-restarts)
};

void PrintTo(const Coding& k, std::ostream* os) { *os << k.name; }

std::vector<uint8_t> Encode(const std::vector<uint8_t>& px, int w, int h, const Coding& k) {
  return nl::testing::EncodeJpegCoded(px, w, h, {k.components, k.h_samp, k.v_samp, k.progressive, k.restart_rows, k.restart_mcus});
}

// `k`'s JPEG of `px`; with row restarts, checked to decode to the same
// pixels as the JPEG it was made from.
std::vector<uint8_t> EncodeChecked(const std::vector<uint8_t>& px, int w, int h, const Coding& k) {
  std::vector<uint8_t> jpg = Encode(px, w, h, k);
  if (!k.row_restarts) return jpg;
  Result<std::vector<uint8_t>> with = AddJpegRowRestarts(jpg);
  EXPECT_TRUE(with.ok()) << with.status().ToString();
  if (!with.ok()) return jpg;
  Result<Image> a = DecodeImage(jpg), b = DecodeImage(*with);
  EXPECT_TRUE(a.ok() && b.ok());
  if (a.ok() && b.ok()) {
    EXPECT_EQ(a->pixels, b->pixels) << k.name << ": the restarts changed pixels";
  }
  EXPECT_EQ(*with == jpg, k.progressive) << k.name << ": only a progressive JPEG comes back unchanged";
  return std::move(*with);
}

using nl::testing::PhotoLikePixels;

// Every pixel of `region` (clipped to the image) in the region decode
// equals the full decode's; the decoded part contains the region.
void ExpectRegionExact(const std::vector<uint8_t>& jpg, const Image& full, PixelRect r,
                       const std::string& what, int scale = 8, bool approximate = false) {
  DecodedRegion got;
  ASSERT_TRUE(DecodeJpegRegionInto(jpg, {}, r, &got, scale, approximate).ok()) << what;
  ASSERT_EQ(got.scale_eighths, scale);
  ASSERT_EQ(got.full_width, full.width);
  ASSERT_EQ(got.full_height, full.height);
  const bool whole = r.w == 0 || r.h == 0 || r.x >= full.width || r.y >= full.height;
  if (whole) r = {0, 0, full.width, full.height};
  const uint32_t x1 = std::min<uint64_t>(full.width, uint64_t{r.x} + r.w);
  const uint32_t y1 = std::min<uint64_t>(full.height, uint64_t{r.y} + r.h);
  ASSERT_LE(got.x, r.x) << what;
  ASSERT_LE(got.y, r.y) << what;
  ASSERT_GE(got.x + got.image.width, x1) << what;
  ASSERT_GE(got.y + got.image.height, y1) << what;
  ASSERT_LE(got.x + got.image.width, full.width) << what;
  ASSERT_LE(got.y + got.image.height, full.height) << what;
  ASSERT_EQ(got.image.pixels.size(), size_t{got.image.width} * got.image.height * 3);
  // Every row given (the margin's too), in the region's columns.
  for (uint32_t y = got.y; y < got.y + got.image.height; ++y) {
    const uint8_t* a = full.pixels.data() + (size_t{y} * full.width + r.x) * 3;
    const uint8_t* b = got.image.pixels.data() + (size_t{y - got.y} * got.image.width + (r.x - got.x)) * 3;
    ASSERT_TRUE(std::equal(a, a + size_t{x1 - r.x} * 3, b))
        << what << ": row " << y << " of region " << r.x << "," << r.y << " " << r.w << "x" << r.h
        << " differs from the full decode";
  }
}

class JpegRegion : public ::testing::TestWithParam<Coding> {};

// Regions at odd offsets and sizes, 1-pixel regions, edges, corners, the
// whole image, and regions that reach past the image (clipped): identical
// to the full decode, at two image sizes that are not whole MCUs.
TEST_P(JpegRegion, PixelsAreTheFullDecodesPixels) {
  const Coding& k = GetParam();
  for (const auto& [w, h] : {std::pair{203, 157}, std::pair{64, 33}}) {
    const std::vector<uint8_t> jpg = EncodeChecked(PhotoLikePixels(w, h, k.components, 11), w, h, k);
    Result<Image> full = DecodeImage(jpg);
    ASSERT_TRUE(full.ok()) << full.status().ToString();
    const uint32_t W = static_cast<uint32_t>(w), H = static_cast<uint32_t>(h);
    std::vector<PixelRect> regions = {
        {0, 0, W, H},         {0, 0, 1, 1},         {W - 1, H - 1, 1, 1}, {W / 2, H / 2, 1, 1},
        {17, 9, 1, H - 9},    {5, 31, W - 5, 1},    {W - 3, 0, 3, H},     {0, H - 2, W, 2},
        {13, 7, 40, 23},      {W - 20, H - 20, 500, 500}, {0, 0, 0, 0},   {W + 4, 0, 5, 5}};
    std::mt19937 rng(5);
    for (int i = 0; i < 60; ++i) {
      const uint32_t x = static_cast<uint32_t>(rng() % W), y = static_cast<uint32_t>(rng() % H);
      regions.push_back({x, y, static_cast<uint32_t>(1 + rng() % (W - x)), static_cast<uint32_t>(1 + rng() % (H - y))});
    }
    for (const PixelRect& r : regions) {
      ExpectRegionExact(jpg, *full, r, k.name + " " + std::to_string(w) + "x" + std::to_string(h));
      if (::testing::Test::HasFatalFailure()) return;
    }
    // A scan restarting at every row is decoded from the marker above a
    // region near the bottom, not from the top.
    if (k.row_restarts && !k.progressive && h > 100) {
      DecodedRegion low;
      ASSERT_TRUE(DecodeJpegRegionInto(jpg, {}, {0, H - 2, W, 2}, &low).ok());
      EXPECT_GT(low.cut_rows, H / 2) << k.name;
      EXPECT_TRUE(DecodeJpegRegionInto(jpg, {}, {0, H - 2, W, 2}, &low, 8, true).ok());
      EXPECT_GT(low.cut_rows, H / 2) << k.name << ", fast";
    }
    // Scaled in the DCT domain (--decode fast): the region of the decode at
    // that scale, against the whole decode at that scale.
    for (const int scale : {7, 4, 3, 1}) {
      DecodedRegion whole;
      ASSERT_TRUE(DecodeJpegRegionInto(jpg, {}, {}, &whole, scale).ok());
      const uint32_t sw = (W * scale + 7) / 8, sh = (H * scale + 7) / 8;
      ASSERT_EQ(whole.image.width, sw);
      ASSERT_EQ(whole.image.height, sh);
      EXPECT_EQ(whole.image_width, W);
      std::mt19937 srng(scale);
      for (int i = 0; i < 30; ++i) {
        const uint32_t x = static_cast<uint32_t>(srng() % sw), y = static_cast<uint32_t>(srng() % sh);
        const PixelRect r{x, y, static_cast<uint32_t>(1 + srng() % (sw - x)), static_cast<uint32_t>(1 + srng() % (sh - y))};
        ExpectRegionExact(jpg, whole.image, r, k.name + " at " + std::to_string(scale) + "/8", scale);
        if (::testing::Test::HasFatalFailure()) return;
      }
    }
    // Approximate (--decode fast: chroma by replication, no margin): a region
    // is the same region of the approximate whole decode, and that is near
    // the exact one (on this picture, whose chroma changes every few pixels,
    // 8.7 levels on average at worst; on photographs well under 1, see
    // bench/jpeg_compare.sh).
    for (const int scale : {8, 4, 1}) {
      DecodedRegion whole, exact;
      ASSERT_TRUE(DecodeJpegRegionInto(jpg, {}, {}, &whole, scale, true).ok());
      ASSERT_TRUE(DecodeJpegRegionInto(jpg, {}, {}, &exact, scale).ok());
      ASSERT_EQ(whole.image.pixels.size(), exact.image.pixels.size());
      double sum = 0;
      for (size_t i = 0; i < exact.image.pixels.size(); ++i)
        sum += std::abs(int{whole.image.pixels[i]} - int{exact.image.pixels[i]});
      EXPECT_LT(sum / exact.image.pixels.size(), 10.0) << k.name << " at " << scale << "/8";
      const uint32_t sw = whole.image.width, sh = whole.image.height;
      std::mt19937 arng(scale + 100);
      for (int i = 0; i < 30; ++i) {
        const uint32_t x = static_cast<uint32_t>(arng() % sw), y = static_cast<uint32_t>(arng() % sh);
        const PixelRect r{x, y, static_cast<uint32_t>(1 + arng() % (sw - x)), static_cast<uint32_t>(1 + arng() % (sh - y))};
        ExpectRegionExact(jpg, whole.image, r, k.name + " approximate at " + std::to_string(scale) + "/8",
                          scale, true);
        if (::testing::Test::HasFatalFailure()) return;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Codings, JpegRegion,
    ::testing::Values(Coding{"s444", 3, 1, 1}, Coding{"s422", 3, 2, 1}, Coding{"s420", 3, 2, 2},
                    Coding{"s440", 3, 1, 2}, Coding{"s411", 3, 4, 1}, Coding{"gray", 1, 1, 1},
                    Coding{"cmyk", 4, 2, 2}, Coding{"progressive420", 3, 2, 2, true},
                    Coding{"progressive444", 3, 1, 1, true}, Coding{"restart420", 3, 2, 2, false, 1},
                    Coding{"progressiveRestart422", 3, 2, 1, true, 2},
                    // Restarts every few MCUs, a row's width not a multiple:
                    // rows start an interval only every few rows.
                    Coding{"mcuRestarts420", 3, 2, 2, false, 0, 3}, Coding{"mcuRestarts444", 3, 1, 1, false, 0, 7},
                    // The packer's --jpeg-restarts.
                    Coding{"rows444", 3, 1, 1, false, 0, 0, true}, Coding{"rows422", 3, 2, 1, false, 0, 0, true},
                    Coding{"rows420", 3, 2, 2, false, 0, 0, true}, Coding{"rows440", 3, 1, 2, false, 0, 0, true},
                    Coding{"rows411", 3, 4, 1, false, 0, 0, true}, Coding{"rowsGray", 1, 1, 1, false, 0, 0, true},
                    Coding{"rowsCmyk", 4, 2, 2, false, 0, 0, true},
                    Coding{"rowsProgressive", 3, 2, 2, true, 0, 0, true},
                    Coding{"rowsOverMcuRestarts", 3, 2, 2, false, 0, 5, true}),
    [](const ::testing::TestParamInfo<Coding>& i) { return i.param.name; });

// Under valgrind's memcheck, the offset of the first byte of [p, p + n) it
// holds undefined (and it reports it); -1 when every byte is defined, and
// always when not under valgrind (the valgrind_jpeg test runs these tests
// under it).
long FirstUndefinedByte(const uint8_t* p, size_t n) {
#ifdef NL_HAVE_MEMCHECK
  if (RUNNING_ON_VALGRIND) {
    const uintptr_t at = VALGRIND_CHECK_MEM_IS_DEFINED(p, n);
    if (at != 0) return static_cast<long>(at - reinterpret_cast<uintptr_t>(p));
  }
#endif
  (void)p;
  (void)n;
  return -1;
}

// nl::testing::EveryJpegSampling(), as Codings.
std::vector<Coding> Samplings() {
  std::vector<Coding> out;
  for (const nl::testing::NamedJpegSampling& s : nl::testing::EveryJpegSampling()) {
    out.push_back({s.name, s.coding.components, s.coding.h_samp, s.coding.v_samp});
  }
  return out;
}
const std::vector<Coding> kSamplings = Samplings();

class JpegSampling : public ::testing::TestWithParam<Coding> {};

// Fast and exact region decodes of each sampling at every scale the loader
// picks, whole and cropped (crops of each width modulo 4, and to the right
// edge), into output buffers that held 0x00 and 0xFF before: every byte is
// written (the two agree), defined as memcheck sees it (issue 29 item 3:
// the last pixels' G of 4:4:0, 4:1:0, 4:4:1, 3x1 and 3x2 rows were not, at
// widths that are not a multiple of 4), and the same as the same pixels of
// the whole decode, exact or fast, which are near each other.
TEST_P(JpegSampling, EveryByteIsWrittenAndDefined) {
  const Coding& k = GetParam();
  for (const auto& [w, h] : {std::pair{501, 75}, std::pair{203, 46}}) {
    const std::vector<uint8_t> jpg = Encode(PhotoLikePixels(w, h, k.components, 7), w, h, k);
    for (const int scale : {8, 4, 2, 1}) {
      // The references: the whole image decoded exact and fast, at this scale.
      DecodedRegion whole[2];
      ASSERT_TRUE(DecodeJpegRegionInto(jpg, {}, {}, &whole[0], scale).ok()) << k.name;
      ASSERT_TRUE(DecodeJpegRegionInto(jpg, {}, {}, &whole[1], scale, true).ok()) << k.name;
      const uint32_t sw = whole[0].image.width, sh = whole[0].image.height;
      ASSERT_EQ(whole[1].image.pixels.size(), whole[0].image.pixels.size());
      double sum = 0;
      for (size_t i = 0; i < whole[0].image.pixels.size(); ++i) {
        sum += std::abs(int{whole[0].image.pixels[i]} - int{whole[1].image.pixels[i]});
      }
      // (This picture's chroma changes every few pixels: a fast decode is
      // further from exact than a photograph's, see JpegRegion.)
      EXPECT_LT(sum / static_cast<double>(whole[0].image.pixels.size()), 16.0)
          << k.name << " at " << scale << "/8: fast, far from exact";
      std::vector<PixelRect> regions = {{0, 0, 0, 0}, {sw / 3, sh / 4, sw, sh}};
      for (uint32_t cw = sw / 2; cw < sw / 2 + 4; ++cw)
        regions.push_back({sw / 5 + 1, sh / 4, cw, sh / 2 + 1});
      for (const bool approximate : {false, true}) {
        for (const PixelRect& r : regions) {
          const std::string what = k.name + " " + std::to_string(w) + "x" + std::to_string(h) +
                                   " at " + std::to_string(scale) + "/8" +
                                   (approximate ? ", fast" : ", exact") + ", region " +
                                   std::to_string(r.x) + "," + std::to_string(r.y) + " " +
                                   std::to_string(r.w) + "x" + std::to_string(r.h);
          DecodedRegion a, b;
          a.image.pixels.assign(size_t{sw} * sh * 3, 0x00);
          b.image.pixels.assign(size_t{sw} * sh * 3, 0xFF);
          ASSERT_TRUE(DecodeJpegRegionInto(jpg, {}, r, &a, scale, approximate).ok()) << what;
          ASSERT_TRUE(DecodeJpegRegionInto(jpg, {}, r, &b, scale, approximate).ok()) << what;
          ASSERT_EQ(a.image.pixels.size(), size_t{a.image.width} * a.image.height * 3) << what;
          const long undefined = FirstUndefinedByte(a.image.pixels.data(), a.image.pixels.size());
          ASSERT_EQ(undefined, -1)
              << what << ": memcheck holds byte " << undefined % 3 << " of pixel ("
              << undefined / 3 % a.image.width << ", " << undefined / 3 / a.image.width
              << ") of the " << a.image.width << "x" << a.image.height << " decode undefined";
          ASSERT_TRUE(a.image.pixels == b.image.pixels)
              << what << ": a byte kept what the buffer held";
          ExpectRegionExact(jpg, whole[approximate].image, r, what, scale, approximate);
          if (::testing::Test::HasFatalFailure()) return;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Samplings, JpegSampling, ::testing::ValuesIn(kSamplings),
                         [](const ::testing::TestParamInfo<Coding>& i) { return i.param.name; });

// libjpeg's decode with every sample array it allocates (rows rounded up to
// 64 samples, as the codec's ZeroedSampleRows asks) filled with `fill`
// first: what its SIMD code reads past a row's written samples. RGB into
// `px`, cropped to columns [x, x + cw) when cw > 0 (jpeg_crop_scanline
// widens them; *x and *cw say to what). *scaled_apart: a component's IDCT
// is scaled apart from the smallest one's and it is still upsampled after,
// where libjpeg-turbo before 3.0 crops wrong (its issue 669; the codec's
// CropIsRight decodes the whole width there).
struct FilledDecoder {
  jpeg_decompress_struct c;
  jpeg_error_mgr pub;
  std::jmp_buf jump;
  uint8_t fill = 0;
  JSAMPARRAY (*alloc_sarray)(j_common_ptr, int, JDIMENSION, JDIMENSION) = nullptr;
};
JSAMPARRAY FilledRows(j_common_ptr c, int pool, JDIMENSION width, JDIMENSION rows) {
  auto* d = static_cast<FilledDecoder*>(c->client_data);
  const JDIMENSION padded = (width + 63) / 64 * 64;
  const JSAMPARRAY a = d->alloc_sarray(c, pool, padded, rows);
  for (JDIMENSION r = 0; r < rows; ++r) std::memset(a[r], d->fill, padded);
  return a;
}
void FilledError(j_common_ptr c) {
  std::longjmp(static_cast<FilledDecoder*>(c->client_data)->jump, 1);
}
bool DecodeFilled(const std::vector<uint8_t>& jpg, uint8_t fill, int scale, bool fancy,
                  JDIMENSION* x, JDIMENSION* cw, std::vector<uint8_t>* px, bool* scaled_apart) {
  const std::unique_ptr<FilledDecoder> d = std::make_unique<FilledDecoder>();
  d->c.err = jpeg_std_error(&d->pub);
  d->pub.error_exit = FilledError;
  d->c.client_data = d.get();
  jpeg_create_decompress(&d->c);
  d->fill = fill;
  d->alloc_sarray = d->c.mem->alloc_sarray;
  d->c.mem->alloc_sarray = FilledRows;
  if (setjmp(d->jump)) {
    jpeg_destroy_decompress(&d->c);
    return false;
  }
  jpeg_mem_src(&d->c, jpg.data(), static_cast<unsigned long>(jpg.size()));
  jpeg_read_header(&d->c, TRUE);
  d->c.out_color_space = JCS_EXT_RGB;
  d->c.scale_num = static_cast<unsigned>(scale);
  d->c.scale_denom = 8;
  d->c.do_fancy_upsampling = fancy ? TRUE : FALSE;
  jpeg_start_decompress(&d->c);
  *scaled_apart = false;
  for (int ci = 0; ci < d->c.num_components; ++ci) {
    const jpeg_component_info& k = d->c.comp_info[ci];
    const int min = d->c.min_DCT_scaled_size;
    *scaled_apart |= k.DCT_scaled_size != min &&
                     k.h_samp_factor * k.DCT_scaled_size != d->c.max_h_samp_factor * min;
  }
  if (*cw > 0) {
    jpeg_crop_scanline(&d->c, x, cw);
  } else {
    *x = 0;
    *cw = d->c.output_width;
  }
  px->resize(size_t{*cw} * d->c.output_height * 3);
  while (d->c.output_scanline < d->c.output_height) {
    JSAMPROW row = px->data() + size_t{d->c.output_scanline} * *cw * 3;
    jpeg_read_scanlines(&d->c, &row, 1);
  }
  jpeg_finish_decompress(&d->c);
  jpeg_destroy_decompress(&d->c);
  return true;
}

// What ZeroedSampleRows (jpeg_codec.cc) rests on: whatever libjpeg's sample
// arrays held before it wrote them (their padding past a row's samples,
// which its SIMD colour conversion reads), the pixels are the same: no byte
// libjpeg leaves unwritten reaches them, for every sampling, scale,
// upsampling, and crop that the codec asks of it. So zeroing those arrays
// changes no pixel; it only makes them defined for a memory checker. The
// crops it does not ask for (CropIsRight) are the ones that do read
// unwritten bytes, with libjpeg-turbo before 3.0: 4:1:0 at 1/2 and 1/4
// with fancy upsampling is one.
TEST(JpegPadding, NeverReachesThePixels) {
  int wrong_crops = 0;
  for (const Coding& k : kSamplings) {
    for (const auto& [w, h] : {std::pair{501, 40}, std::pair{202, 35}}) {
      const std::vector<uint8_t> jpg = Encode(PhotoLikePixels(w, h, k.components, 3), w, h, k);
      for (const int scale : {8, 4, 2, 1}) {
        for (const bool fancy : {true, false}) {
          const JDIMENSION sw = static_cast<JDIMENSION>((w * scale + 7) / 8);
          for (const JDIMENSION crop : {JDIMENSION{0}, sw / 2 + 1, sw / 2 + 2, sw / 2 + 3}) {
            std::vector<uint8_t> px[3];
            bool scaled_apart = false;
            const std::string what =
                k.name + " " + std::to_string(w) + " wide at " + std::to_string(scale) + "/8" +
                (fancy ? "" : ", no fancy upsampling") + ", crop " + std::to_string(crop);
            const uint8_t fills[3] = {0x00, 0xFF, 0x5A};
            for (int i = 0; i < 3; ++i) {
              JDIMENSION x = sw / 3, cw = crop;
              ASSERT_TRUE(DecodeFilled(jpg, fills[i], scale, fancy, &x, &cw, &px[i], &scaled_apart))
                  << what;
            }
            const bool same = px[0] == px[1] && px[0] == px[2];
            if (crop > 0 && scaled_apart) {
              wrong_crops += !same;
              continue;
            }
            EXPECT_TRUE(same) << what << ": the pixels depend on what libjpeg's rows held";
          }
        }
      }
    }
  }
#if LIBJPEG_TURBO_VERSION_NUMBER < 3000000
  EXPECT_GT(wrong_crops, 0)
      << "no crop reads unwritten rows: is this libjpeg-turbo's issue 669 fixed? "
         "(then CropIsRight can allow these crops)";
#endif
}

// The entropy-coded bytes of `jpg` after its n-th restart marker (n >= 1)
// up to the next marker: the MCUs of that restart interval.
std::pair<size_t, size_t> Interval(const std::vector<uint8_t>& jpg, int n) {
  int seen = 0;
  size_t begin = 0;
  for (size_t i = 0; i + 1 < jpg.size(); ++i) {
    if (jpg[i] != 0xFF || jpg[i + 1] < 0xD0 || jpg[i + 1] > 0xD7) continue;
    if (seen == n) return {begin, i};
    if (++seen == n) begin = i + 2;
  }
  return {0, 0};
}

// With a restart marker at every row (--jpeg-restarts), a region decode
// never entropy-decodes the rows of MCUs above the cut: bytes there that do
// not decode do not touch it, while the full decode reads them and differs.
// A file whose markers are damaged decodes as the full decode does.
TEST(JpegRegionDecode, SkipsTheRowsAboveARestartMarker) {
  const int w = 96, h = 160;  // 6 x 10 MCUs of 16x16
  const Coding k{"rows420", 3, 2, 2, false, 1};
  const std::vector<uint8_t> jpg = Encode(PhotoLikePixels(w, h, 3, 21), w, h, k);
  Result<Image> full = DecodeImage(jpg);
  ASSERT_TRUE(full.ok());
  // Row of MCUs 2 (after marker 2) scrambled: its bytes no longer match.
  std::vector<uint8_t> bad = jpg;
  const auto [b, e] = Interval(jpg, 2);
  ASSERT_GT(e, b + 8);
  for (size_t i = b; i < e; ++i) bad[i] = static_cast<uint8_t>((bad[i] * 7 + 3) & 0x7F);
  Result<Image> bad_full = DecodeImage(bad);
  ASSERT_TRUE(bad_full.ok()) << bad_full.status().ToString();
  ASSERT_NE(bad_full->pixels, full->pixels) << "the scrambled row decodes, to other pixels";
  // Rows 112.. need MCU rows 6.. and a margin from row 5: cut below row 2.
  // (With a marker at every row the damage stays in its row whether it is
  // decoded or not: cut_rows says it was not.)
  ExpectRegionExact(bad, *full, {10, 112, 50, 30}, "below the scrambled row");
  DecodedRegion low;
  ASSERT_TRUE(DecodeJpegRegionInto(bad, {}, {10, 112, 50, 30}, &low).ok());
  EXPECT_EQ(low.cut_rows, 80u) << "decoded from the marker of MCU row 5";
  DecodedRegion fast;
  ASSERT_TRUE(DecodeJpegRegionInto(jpg, {}, {}, &fast, 8, true).ok());
  ExpectRegionExact(bad, fast.image, {10, 112, 50, 30}, "below the scrambled row, fast", 8, true);
  // Within the scrambled row: as the full decode of the damaged file.
  ExpectRegionExact(bad, *bad_full, {10, 36, 50, 30}, "over the scrambled row");
  // Markers without a length in the header (TEM, an RSTn), which libjpeg
  // passes over: the cut still finds the frame height.
  std::vector<uint8_t> tem = bad;
  const std::vector<uint8_t> standalone = {0xFF, 0x01, 0xFF, 0xD3};
  tem.insert(tem.begin() + 2, standalone.begin(), standalone.end());
  ASSERT_TRUE(DecodeImage(tem).ok());
  ExpectRegionExact(tem, *full, {10, 112, 50, 30}, "below the scrambled row, markers without a length");
  ASSERT_TRUE(DecodeJpegRegionInto(tem, {}, {10, 112, 50, 30}, &low).ok());
  EXPECT_EQ(low.cut_rows, 80u) << "markers without a length before the frame header";
  // A marker numbered out of order, one missing: no cut, the full decode's
  // pixels (libjpeg resynchronises as it does for the whole image).
  for (const int damage : {0, 1}) {
    std::vector<uint8_t> odd = jpg;
    const size_t at = Interval(jpg, 3).first - 1;  // marker 3's number
    if (damage == 0) {
      odd[at] = static_cast<uint8_t>(0xD0 + ((odd[at] - 0xD0 + 3) & 7));
    } else {
      odd.erase(odd.begin() + static_cast<long>(at) - 1, odd.begin() + static_cast<long>(at) + 1);
    }
    Result<Image> odd_full = DecodeImage(odd);
    if (!odd_full.ok()) {
      DecodedRegion r;
      EXPECT_EQ(DecodeJpegRegionInto(odd, {}, {10, 112, 50, 30}, &r).code(), odd_full.status().code());
      continue;
    }
    ExpectRegionExact(odd, *odd_full, {10, 112, 50, 30}, "a damaged marker " + std::to_string(damage));
  }
}

// libjpeg's own decode, through none of ours (its fast Huffman path is not
// used where the scan has restart markers): RGB, or false on an error.
struct RefDecoder {
  jpeg_decompress_struct c;
  jpeg_error_mgr pub;
  std::jmp_buf jump;
};
void RefError(j_common_ptr c) { std::longjmp(static_cast<RefDecoder*>(c->client_data)->jump, 1); }
void RefMessage(j_common_ptr, int) {}
bool LibjpegDecode(const std::vector<uint8_t>& jpg, std::vector<uint8_t>* px) {
  const std::unique_ptr<RefDecoder> d = std::make_unique<RefDecoder>();
  d->c.err = jpeg_std_error(&d->pub);
  d->pub.error_exit = RefError;
  d->pub.emit_message = RefMessage;
  jpeg_create_decompress(&d->c);
  d->c.client_data = d.get();
  if (setjmp(d->jump)) {
    jpeg_destroy_decompress(&d->c);
    return false;
  }
  jpeg_mem_src(&d->c, jpg.data(), static_cast<unsigned long>(jpg.size()));
  jpeg_read_header(&d->c, TRUE);
  d->c.out_color_space = JCS_EXT_RGB;
  jpeg_start_decompress(&d->c);
  px->resize(size_t{d->c.output_width} * d->c.output_height * 3);
  while (d->c.output_scanline < d->c.output_height) {
    JSAMPROW row = px->data() + size_t{d->c.output_scanline} * d->c.output_width * 3;
    jpeg_read_scanlines(&d->c, &row, 1);
  }
  jpeg_finish_decompress(&d->c);
  jpeg_destroy_decompress(&d->c);
  return true;
}

// Scans with restart markers decode on libjpeg-turbo's fast Huffman path
// (FastRestartMcu): every pixel as libjpeg's own decode gives, for restarts
// at rows and every few MCUs, and for damage it decodes around (scrambled
// data, a marker renumbered, removed, or one too many); where libjpeg fails,
// ours does.
TEST(JpegRestarts, DecodeAsLibjpegDoes) {
  const std::vector<Coding> codings = {
      {"rows420", 3, 2, 2, false, 1}, {"rows444", 3, 1, 1, false, 2}, {"every1_422", 3, 2, 1, false, 0, 1},
      {"every3_420", 3, 2, 2, false, 0, 3}, {"every7_440", 3, 1, 2, false, 0, 7}, {"every5_gray", 1, 1, 1, false, 0, 5}};
  for (const Coding& k : codings) {
    for (const auto& [w, h] : {std::pair{203, 157}, std::pair{64, 72}}) {
      const std::vector<uint8_t> jpg = Encode(PhotoLikePixels(w, h, k.components, 17), w, h, k);
      std::vector<std::vector<uint8_t>> files = {jpg};
      const auto [b, e] = Interval(jpg, 2);
      ASSERT_GT(e, b) << k.name;
      std::vector<uint8_t> f = jpg;  // interval 2 scrambled (no FF bytes)
      for (size_t i = b; i < e; ++i) f[i] = static_cast<uint8_t>((f[i] * 7 + 3) & 0x7F);
      files.push_back(f);
      f = jpg;  // marker 2 renumbered
      f[b - 1] = static_cast<uint8_t>(0xD0 + ((f[b - 1] - 0xD0 + 3) & 7));
      files.push_back(f);
      f = jpg;  // marker 2 removed
      f.erase(f.begin() + static_cast<long>(b) - 2, f.begin() + static_cast<long>(b));
      files.push_back(f);
      f = jpg;  // a marker inside interval 2
      const std::vector<uint8_t> rst = {0xFF, 0xD5};
      f.insert(f.begin() + static_cast<long>((b + e) / 2), rst.begin(), rst.end());
      files.push_back(f);
      for (size_t n = 0; n < files.size(); ++n) {
        const std::string what = k.name + " " + std::to_string(w) + "x" + std::to_string(h) + " file " + std::to_string(n);
        std::vector<uint8_t> want;
        const bool ref_ok = LibjpegDecode(files[n], &want);
        Result<Image> got = DecodeImage(files[n]);
        ASSERT_EQ(got.ok(), ref_ok) << what << ": " << got.status().ToString();
        if (ref_ok) {
          EXPECT_TRUE(got->pixels == want) << what << ": pixels differ from libjpeg's";
        }
      }
    }
  }
}

// A file the row restarts cannot encode is refused with libjpeg's reason
// (the packer then stores it as it is), and nothing is freed twice.
TEST(JpegRowRestarts, AFileTheRestartsCannotEncodeIsRefusedCleanly) {
  const std::vector<uint8_t> jpg = nl::testing::JpegRowRestartsCannotEncode();
  ASSERT_TRUE(DecodeImage(jpg).ok()) << "the file itself decodes";
  const Status st = AddJpegRowRestarts(jpg).status();
  EXPECT_EQ(st.code(), StatusCode::kCorruption) << st.ToString();
  EXPECT_NE(st.message().find("DCT coefficient out of range"), std::string::npos) << st.ToString();
}

// AddJpegRowRestarts keeps the file's markers (EXIF, ICC, comments) and
// sampling, is idempotent, and refuses what is not a whole JPEG.
TEST(JpegRowRestarts, KeepsMarkersAndRefusesDamage) {
  const int w = 75, h = 50;
  const std::vector<uint8_t> jpg = Encode(PhotoLikePixels(w, h, 3, 4), w, h, Coding{"s420", 3, 2, 2});
  // An APP1 "Exif" and a COM segment after SOI/APP0 (JFIF).
  const std::vector<uint8_t> exif = {0xFF, 0xE1, 0x00, 0x0C, 'E', 'x', 'i', 'f', 0, 0, 'M', 'M', 0, 42};
  const std::vector<uint8_t> com = {0xFF, 0xFE, 0x00, 0x07, 'h', 'e', 'l', 'l', 'o'};
  std::vector<uint8_t> marked(jpg.begin(), jpg.begin() + 20);  // SOI + JFIF APP0 (18 bytes)
  ASSERT_EQ(marked[2], 0xFF);
  ASSERT_EQ(marked[3], 0xE0);
  marked.insert(marked.end(), exif.begin(), exif.end());
  marked.insert(marked.end(), com.begin(), com.end());
  marked.insert(marked.end(), jpg.begin() + 20, jpg.end());
  Result<std::vector<uint8_t>> with = AddJpegRowRestarts(marked);
  ASSERT_TRUE(with.ok()) << with.status().ToString();
  const auto has = [&](const std::vector<uint8_t>& seg) {
    return std::search(with->begin(), with->end(), seg.begin(), seg.end()) != with->end();
  };
  EXPECT_TRUE(has(exif));
  EXPECT_TRUE(has(com));
  const std::vector<uint8_t> jfif = {0xFF, 0xE0, 0x00, 0x10, 'J', 'F', 'I', 'F', 0};
  int jfifs = 0;
  for (auto it = with->begin(); (it = std::search(it, with->end(), jfif.begin(), jfif.end())) != with->end(); ++it) ++jfifs;
  EXPECT_EQ(jfifs, 1) << "the JFIF marker once, not copied beside the encoder's";
  EXPECT_EQ(DecodeImage(*with)->pixels, DecodeImage(jpg)->pixels);
  // Every row restarts: 4 rows of 16 pixels, 3 markers.
  int markers = 0;
  for (size_t i = 0; i + 1 < with->size(); ++i) markers += (*with)[i] == 0xFF && (*with)[i + 1] >= 0xD0 && (*with)[i + 1] <= 0xD7;
  EXPECT_EQ(markers, 3);
  Result<std::vector<uint8_t>> again = AddJpegRowRestarts(*with);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *with) << "a file that restarts at every row comes back as it is";
  // Truncated, not a JPEG, a header alone: Corruption naming it.
  const std::vector<uint8_t> cut(jpg.begin(), jpg.begin() + static_cast<long>(jpg.size() / 2));
  const Status st = AddJpegRowRestarts(cut).status();
  EXPECT_EQ(st.code(), StatusCode::kCorruption);
  EXPECT_NE(st.message().find("truncated JPEG"), std::string::npos) << st.ToString();
  EXPECT_EQ(AddJpegRowRestarts(std::vector<uint8_t>{0x89, 'P', 'N', 'G'}).status().code(), StatusCode::kCorruption);
  EXPECT_EQ(AddJpegRowRestarts(jpg, {.max_pixels = 75 * 50 - 1}).status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(AddJpegRowRestarts(jpg, {.max_pixels = 75 * 50}).ok());
  EXPECT_EQ(AddJpegRowRestarts(std::vector<uint8_t>(jpg.begin(), jpg.begin() + 30)).status().code(),
            StatusCode::kCorruption);
}

// A PNG's inflation stops after the region's last row too: cut short below
// the region, the region decodes (as JPEG's); within it, it is refused.
TEST(PngRegionDecode, StopsAfterTheRegionsLastRow) {
  const int w = 40, h = 200;
  Image img;
  img.width = w;
  img.height = h;
  img.pixels = PhotoLikePixels(w, h, 3, 8);
  const std::vector<uint8_t> png = *EncodePng(img, 1);
  const std::vector<uint8_t> cut(png.begin(), png.begin() + static_cast<long>(png.size() / 2));
  EXPECT_EQ(DecodeImage(cut).status().code(), StatusCode::kCorruption);
  DecodedRegion top;
  ASSERT_TRUE(DecodeImageRegionInto(cut, {}, {3, 10, 5, 20}, &top).ok());
  EXPECT_EQ(top.image.pixels,
            std::vector<uint8_t>(img.pixels.begin() + 10 * w * 3, img.pixels.begin() + 30 * w * 3));
  DecodedRegion bottom;
  EXPECT_EQ(DecodeImageRegionInto(cut, {}, {3, 180, 5, 10}, &bottom).code(), StatusCode::kCorruption);
}

// Decoding stops after the region's last row: a JPEG cut short below the
// region gives the region (the packer decodes every image whole, so a pack
// holds none such); one cut short within the region is refused as
// truncated, as the full decode is.
TEST(JpegRegionDecode, StopsAfterTheRegionsLastRow) {
  const int w = 160, h = 320;
  const std::vector<uint8_t> jpg = Encode(PhotoLikePixels(w, h, 3, 3), w, h, Coding{"s420", 3, 2, 2});
  const std::vector<uint8_t> cut(jpg.begin(), jpg.begin() + static_cast<long>(jpg.size() * 6 / 10));
  EXPECT_EQ(DecodeImage(cut).status().code(), StatusCode::kCorruption);
  Result<Image> full = DecodeImage(jpg);
  ASSERT_TRUE(full.ok());
  DecodedRegion top;
  ASSERT_TRUE(DecodeJpegRegionInto(cut, {}, {10, 10, 50, 40}, &top).ok());
  ExpectRegionExact(jpg, *full, {10, 10, 50, 40}, "top of the uncut file");
  DecodedRegion bottom;
  const Status st = DecodeJpegRegionInto(cut, {}, {10, 280, 50, 30}, &bottom);
  EXPECT_EQ(st.code(), StatusCode::kCorruption);
  EXPECT_NE(st.message().find("truncated JPEG"), std::string::npos) << st.ToString();
}

// The pixel limit is the whole image's, checked from the header, whatever
// the region; a PNG decodes the region's rows.
TEST(JpegRegionDecode, LimitsAndOtherFormats) {
  const int w = 64, h = 48;
  const std::vector<uint8_t> px = PhotoLikePixels(w, h, 3, 9);
  const std::vector<uint8_t> jpg = Encode(px, w, h, Coding{"s420", 3, 2, 2});
  DecodedRegion r;
  EXPECT_EQ(DecodeImageRegionInto(jpg, {.max_pixels = 100}, {0, 0, 2, 2}, &r).code(),
            StatusCode::kResourceExhausted);
  Image img;
  img.width = w;
  img.height = h;
  img.pixels = px;
  Result<std::vector<uint8_t>> png = EncodePng(img);
  ASSERT_TRUE(png.ok());
  // A PNG: the region's rows, whole, at full scale whatever is asked.
  ASSERT_TRUE(DecodeImageRegionInto(*png, {}, {5, 5, 3, 3}, &r, 4).ok());
  EXPECT_EQ(r.x, 0u);
  EXPECT_EQ(r.y, 5u);
  EXPECT_EQ(r.image.width, 64u);
  EXPECT_EQ(r.image.height, 3u);
  EXPECT_EQ(r.full_width, 64u);
  EXPECT_EQ(r.full_height, 48u);
  EXPECT_EQ(r.image_height, 48u);
  EXPECT_EQ(r.image.pixels, std::vector<uint8_t>(px.begin() + 5 * 64 * 3, px.begin() + 8 * 64 * 3));
  EXPECT_EQ(r.scale_eighths, 8) << "a PNG decodes at full scale whatever is asked";
  // Empty, outside, or past the bottom: the whole image, or rows to the end.
  for (const PixelRect& whole : {PixelRect{0, 0, 0, 0}, PixelRect{70, 0, 3, 3}, PixelRect{0, 48, 3, 3}}) {
    ASSERT_TRUE(DecodeImageRegionInto(*png, {}, whole, &r).ok());
    EXPECT_EQ(r.y, 0u);
    EXPECT_EQ(r.image.pixels, px);
  }
  ASSERT_TRUE(DecodeImageRegionInto(*png, {}, {0, 40, 64, 100}, &r).ok());
  EXPECT_EQ(r.y, 40u);
  EXPECT_EQ(r.image.height, 8u);
  EXPECT_EQ(r.image.pixels, std::vector<uint8_t>(px.begin() + 40 * 64 * 3, px.end()));
  EXPECT_EQ(DecodeImageRegionInto(std::vector<uint8_t>{0xFF, 0xD8, 0xFF, 0x00}, {}, {0, 0, 1, 1}, &r).code(),
            StatusCode::kCorruption);
  EXPECT_EQ(DecodeJpegRegionInto(jpg, {}, {0, 0, 1, 1}, &r, 0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodeJpegRegionInto(jpg, {}, {0, 0, 1, 1}, &r, 9).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace nl
