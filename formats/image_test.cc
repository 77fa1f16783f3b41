// Decoders on images the tests make with libpng and libjpeg-turbo, compared
// with the pixels they encoded, and on bad inputs.
#include "formats/image.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <cmath>
#include <thread>

#include "tests/support/test_util.h"

namespace nl {
namespace {

using testing::EncodePngForTest;
using testing::PngSpec;

constexpr uint32_t kW = 13, kH = 9;  // odd sizes exercise packing and interlace passes

// Builds samples for `spec` and the RGB that Pillow's convert("RGB") gives.
std::vector<uint8_t> Fill(PngSpec* s) {
  int ch = 0;
  switch (s->color_type) {
    case PNG_COLOR_TYPE_GRAY:
      ch = 1;
      break;
    case PNG_COLOR_TYPE_GRAY_ALPHA:
      ch = 2;
      break;
    case PNG_COLOR_TYPE_RGB:
      ch = 3;
      break;
    case PNG_COLOR_TYPE_RGB_ALPHA:
      ch = 4;
      break;
    case PNG_COLOR_TYPE_PALETTE:
      ch = 1;
      break;
  }
  const uint32_t maxv = (1u << s->bit_depth) - 1;
  s->width = kW;
  s->height = kH;
  s->samples.clear();
  std::vector<uint8_t> rgb;
  uint32_t seed = 12345;
  if (s->color_type == PNG_COLOR_TYPE_PALETTE) {
    const uint32_t n = std::min<uint32_t>(maxv + 1, 20);
    for (uint32_t i = 0; i < n; ++i) {
      s->palette.push_back({static_cast<png_byte>(i * 13), static_cast<png_byte>(255 - i * 7),
                            static_cast<png_byte>(i * 101 % 256)});
    }
  }
  for (uint32_t p = 0; p < kW * kH; ++p) {
    uint16_t v[4];
    for (int c = 0; c < ch; ++c) {
      seed = seed * 1664525u + 1013904223u;
      v[c] = static_cast<uint16_t>((seed >> 8) % (maxv + 1));
      if (s->color_type == PNG_COLOR_TYPE_PALETTE)
        v[c] = static_cast<uint16_t>(v[c] % s->palette.size());
      s->samples.push_back(v[c]);
    }
    auto to8 = [&](uint16_t x) -> uint8_t {
      if (s->bit_depth == 16) {
        // Pillow: 16-bit gray (mode I) clips to 255; others keep the high byte.
        return s->color_type == PNG_COLOR_TYPE_GRAY
                   ? static_cast<uint8_t>(std::min<uint16_t>(x, 255))
                   : static_cast<uint8_t>(x >> 8);
      }
      return static_cast<uint8_t>(x * 255 / maxv);
    };
    if (s->color_type == PNG_COLOR_TYPE_PALETTE) {
      const png_color& c = s->palette[v[0]];
      rgb.insert(rgb.end(), {c.red, c.green, c.blue});
    } else if (ch <= 2) {
      const uint8_t g = to8(v[0]);
      rgb.insert(rgb.end(), {g, g, g});
    } else {
      rgb.insert(rgb.end(), {to8(v[0]), to8(v[1]), to8(v[2])});
    }
  }
  return rgb;
}

struct PngCase {
  const char* name;
  int color_type;
  int bit_depth;
  bool interlaced;
  bool trns;
};
// (Otherwise gtest prints a case's bytes, its padding's too: uninitialised,
// which fails the valgrind_jpeg test.)
void PrintTo(const PngCase& c, std::ostream* os) { *os << c.name; }

class PngDecode : public ::testing::TestWithParam<PngCase> {};

TEST_P(PngDecode, MatchesEncodedPixelsExactly) {
  const PngCase& c = GetParam();
  PngSpec spec;
  spec.color_type = c.color_type;
  spec.bit_depth = c.bit_depth;
  spec.interlaced = c.interlaced;
  std::vector<uint8_t> want = Fill(&spec);
  if (c.trns) {
    if (c.color_type == PNG_COLOR_TYPE_PALETTE) {
      for (size_t i = 0; i < spec.palette.size(); ++i)
        spec.palette_alpha.push_back(static_cast<uint8_t>(i * 40));
    } else {
      spec.gray_or_rgb_trns = true;
    }
  }
  std::vector<uint8_t> png = EncodePngForTest(spec);
  ASSERT_EQ(DetectImageFormat(png), ImageFormat::kPng);
  Result<Image> img = DecodeImage(png);
  ASSERT_TRUE(img.ok()) << img.status().ToString();
  EXPECT_EQ(img->width, kW);
  EXPECT_EQ(img->height, kH);
  EXPECT_EQ(img->pixels, want);
  Result<ImageInfo> info = ReadImageInfo(png);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->width, kW);
  EXPECT_EQ(info->height, kH);
}

INSTANTIATE_TEST_SUITE_P(
    AllTypes, PngDecode,
    ::testing::Values(PngCase{"gray1", PNG_COLOR_TYPE_GRAY, 1, false, false},
                      PngCase{"gray2", PNG_COLOR_TYPE_GRAY, 2, false, false},
                      PngCase{"gray4", PNG_COLOR_TYPE_GRAY, 4, false, false},
                      PngCase{"gray8", PNG_COLOR_TYPE_GRAY, 8, false, false},
                      PngCase{"gray8_trns", PNG_COLOR_TYPE_GRAY, 8, false, true},
                      PngCase{"gray16", PNG_COLOR_TYPE_GRAY, 16, false, false},
                      PngCase{"gray_alpha8", PNG_COLOR_TYPE_GRAY_ALPHA, 8, false, false},
                      PngCase{"gray_alpha16", PNG_COLOR_TYPE_GRAY_ALPHA, 16, false, false},
                      PngCase{"palette1", PNG_COLOR_TYPE_PALETTE, 1, false, false},
                      PngCase{"palette2", PNG_COLOR_TYPE_PALETTE, 2, false, false},
                      PngCase{"palette4", PNG_COLOR_TYPE_PALETTE, 4, false, false},
                      PngCase{"palette8", PNG_COLOR_TYPE_PALETTE, 8, false, false},
                      PngCase{"palette8_trns", PNG_COLOR_TYPE_PALETTE, 8, false, true},
                      PngCase{"palette4_trns", PNG_COLOR_TYPE_PALETTE, 4, false, true},
                      PngCase{"rgb8", PNG_COLOR_TYPE_RGB, 8, false, false},
                      PngCase{"rgb8_trns", PNG_COLOR_TYPE_RGB, 8, false, true},
                      PngCase{"rgb16", PNG_COLOR_TYPE_RGB, 16, false, false},
                      PngCase{"rgba8", PNG_COLOR_TYPE_RGB_ALPHA, 8, false, false},
                      PngCase{"rgba16", PNG_COLOR_TYPE_RGB_ALPHA, 16, false, false},
                      PngCase{"gray4_interlaced", PNG_COLOR_TYPE_GRAY, 4, true, false},
                      PngCase{"palette8_interlaced", PNG_COLOR_TYPE_PALETTE, 8, true, true},
                      PngCase{"rgb8_interlaced", PNG_COLOR_TYPE_RGB, 8, true, false},
                      PngCase{"rgba16_interlaced", PNG_COLOR_TYPE_RGB_ALPHA, 16, true, false}),
    [](const auto& p) { return std::string(p.param.name); });

TEST(Png, EncodeDecodeRoundTrip) {
  Image src = testing::PatternImage(31, 17, 4);
  Result<std::vector<uint8_t>> png = EncodePng(src, 1);
  ASSERT_TRUE(png.ok());
  Result<Image> back = DecodeImage(*png);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->pixels, src.pixels);
}

// JPEG is lossy: compare with the encoded pixels by mean and max absolute error.
void ExpectClose(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b, double mean_tol,
                 int max_tol) {
  ASSERT_EQ(a.size(), b.size());
  double sum = 0;
  int worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const int d = std::abs(int{a[i]} - int{b[i]});
    sum += d;
    worst = std::max(worst, d);
  }
  EXPECT_LE(sum / a.size(), mean_tol);
  EXPECT_LE(worst, max_tol);
}

// Smooth content so that quality-95 JPEG stays within a few levels.
Image Smooth(uint32_t w, uint32_t h) {
  Image img;
  img.width = w;
  img.height = h;
  for (uint32_t y = 0; y < h; ++y)
    for (uint32_t x = 0; x < w; ++x)
      img.pixels.insert(img.pixels.end(),
                        {static_cast<uint8_t>(40 + 3 * x), static_cast<uint8_t>(200 - 2 * y),
                         static_cast<uint8_t>(100 + x + y)});
  return img;
}

struct JpegCase {
  const char* name;
  ChromaSubsampling ss;
  bool progressive;
};
void PrintTo(const JpegCase& c, std::ostream* os) { *os << c.name; }
class JpegDecode : public ::testing::TestWithParam<JpegCase> {};

TEST_P(JpegDecode, CloseToEncodedPixels) {
  Image src = Smooth(40, 24);
  JpegEncodeOptions o;
  o.subsampling = GetParam().ss;
  o.progressive = GetParam().progressive;
  Result<std::vector<uint8_t>> jpg = EncodeJpeg(src.pixels, src.width, src.height, 3, o);
  ASSERT_TRUE(jpg.ok()) << jpg.status().ToString();
  ASSERT_EQ(DetectImageFormat(*jpg), ImageFormat::kJpeg);
  Result<Image> img = DecodeImage(*jpg);
  ASSERT_TRUE(img.ok()) << img.status().ToString();
  EXPECT_EQ(img->width, 40u);
  EXPECT_EQ(img->height, 24u);
  ExpectClose(img->pixels, src.pixels, 2.0, 12);
}

INSTANTIATE_TEST_SUITE_P(
    Kinds, JpegDecode,
    ::testing::Values(JpegCase{"s444", ChromaSubsampling::k444, false},
                      JpegCase{"s422", ChromaSubsampling::k422, false},
                      JpegCase{"s420", ChromaSubsampling::k420, false},
                      JpegCase{"s420_progressive", ChromaSubsampling::k420, true},
                      JpegCase{"s444_progressive", ChromaSubsampling::k444, true}),
    [](const auto& p) { return std::string(p.param.name); });

TEST(Jpeg, GrayscaleBecomesEqualRgb) {
  std::vector<uint8_t> gray(32 * 16);
  for (size_t i = 0; i < gray.size(); ++i) gray[i] = static_cast<uint8_t>(50 + (i % 32) * 4);
  Result<std::vector<uint8_t>> jpg = EncodeJpeg(gray, 32, 16, 1);
  ASSERT_TRUE(jpg.ok());
  Result<Image> img = DecodeImage(*jpg);
  ASSERT_TRUE(img.ok()) << img.status().ToString();
  std::vector<uint8_t> want;
  for (uint8_t g : gray) want.insert(want.end(), {g, g, g});
  for (size_t i = 0; i < img->pixels.size(); i += 3) {
    ASSERT_EQ(img->pixels[i], img->pixels[i + 1]);
    ASSERT_EQ(img->pixels[i], img->pixels[i + 2]);
  }
  ExpectClose(img->pixels, want, 1.0, 6);
}

TEST(Jpeg, CmykConvertedLikePillow) {
  // Stored CMYK values are Adobe-inverted; Pillow reads them as CMYK;I and
  // converts with R = (255-K) - C*(255-K)/255. Uniform colour, so little loss.
  const uint8_t stored[4] = {245, 235, 225, 215};  // C=10, M=20, Y=30, K=40 after inversion
  std::vector<uint8_t> cmyk;
  for (int i = 0; i < 16 * 16; ++i) cmyk.insert(cmyk.end(), stored, stored + 4);
  JpegEncodeOptions o;
  o.subsampling = ChromaSubsampling::k444;
  o.quality = 100;
  Result<std::vector<uint8_t>> jpg = EncodeJpeg(cmyk, 16, 16, 4, o);
  ASSERT_TRUE(jpg.ok()) << jpg.status().ToString();
  Result<Image> img = DecodeImage(*jpg);
  ASSERT_TRUE(img.ok()) << img.status().ToString();
  // Pillow gives (207, 198, 190) for CMYK (10, 20, 30, 40).
  std::vector<uint8_t> want;
  for (int i = 0; i < 16 * 16; ++i) want.insert(want.end(), {207, 198, 190});
  ExpectClose(img->pixels, want, 1.0, 2);
}

// ---- bad inputs ----

TEST(BadInput, ZeroBytes) {
  Status s = DecodeImage({}).status();
  EXPECT_EQ(s.code(), StatusCode::kCorruption);
  EXPECT_EQ(s.message(), "empty file (0 bytes)");
}

TEST(BadInput, TextNamedJpg) {
  const std::string text = "this is not an image\n";
  Status s = DecodeImage({reinterpret_cast<const uint8_t*>(text.data()), text.size()}).status();
  EXPECT_EQ(s.code(), StatusCode::kUnsupported);
  EXPECT_NE(s.message().find("not an image"), std::string::npos);
}

TEST(BadInput, OtherFormatsNamed) {
  const std::string gif = "GIF89a....";
  Status s = DecodeImage({reinterpret_cast<const uint8_t*>(gif.data()), gif.size()}).status();
  EXPECT_EQ(s.message(), "GIF images are not supported (only PNG and JPEG)");
}

TEST(BadInput, TruncatedPngAtEveryLength) {
  Image src = testing::PatternImage(20, 20, 1);
  std::vector<uint8_t> png = *EncodePng(src);
  // Cut in the last IDAT's CRC or in IEND, after every byte of image data,
  // a PNG loads whole (as in Pillow, which stops reading once it has the rows).
  const size_t data_end = png.size() - 12 - 4;
  for (size_t n = data_end; n < png.size(); ++n) {
    std::vector<uint8_t> cut(png.begin(), png.begin() + n);
    Result<Image> img = DecodeImage(cut);
    ASSERT_TRUE(img.ok()) << n << ": " << img.status().ToString();
    EXPECT_EQ(img->pixels, src.pixels) << n;
  }
  for (size_t n = 0; n < data_end; n += 7) {
    std::vector<uint8_t> cut(png.begin(), png.begin() + n);
    Status s = DecodeImage(cut).status();
    EXPECT_FALSE(s.ok()) << "accepted a PNG truncated to " << n << " of " << png.size();
    if (n == 0) {
      EXPECT_EQ(s.ToString(), "Corruption: empty file (0 bytes)");
    } else if (n < 8) {  // not even the PNG signature
      EXPECT_EQ(s.code(), StatusCode::kUnsupported) << n << ": " << s.ToString();
      EXPECT_NE(s.message().find("not an image"), std::string::npos) << n << ": " << s.ToString();
    } else {
      EXPECT_EQ(s.code(), StatusCode::kCorruption) << n << ": " << s.ToString();
      EXPECT_NE(s.message().find("PNG"), std::string::npos) << n << ": " << s.ToString();
    }
  }
  std::vector<uint8_t> cut(png.begin(), png.begin() + png.size() / 2);
  Status s = DecodeImage(cut).status();
  EXPECT_EQ(s.code(), StatusCode::kCorruption);
  EXPECT_NE(s.message().find("truncated PNG"), std::string::npos) << s.ToString();
}

TEST(BadInput, CorruptPngDataChunk) {
  Image src = testing::PatternImage(20, 20, 2);
  std::vector<uint8_t> png = *EncodePng(src);
  png[png.size() / 2] ^= 0xFF;  // inside IDAT: chunk CRC no longer matches
  Status s = DecodeImage(png).status();
  EXPECT_EQ(s.code(), StatusCode::kCorruption) << s.ToString();
}

TEST(BadInput, TruncatedJpegIsAnError) {
  Image src = Smooth(64, 64);
  std::vector<uint8_t> jpg = *EncodeJpeg(src.pixels, 64, 64, 3);
  for (size_t n : {size_t{2}, size_t{100}, jpg.size() / 2, jpg.size() - 2}) {
    std::vector<uint8_t> cut(jpg.begin(), jpg.begin() + n);
    Status s = DecodeImage(cut).status();
    EXPECT_EQ(s.code(), StatusCode::kCorruption) << "length " << n << ": " << s.ToString();
  }
  std::vector<uint8_t> cut(jpg.begin(), jpg.begin() + jpg.size() / 2);
  EXPECT_NE(DecodeImage(cut).status().message().find("corrupt JPEG"), std::string::npos)
      << DecodeImage(cut).status().ToString();
}

TEST(BadInput, HugePngHeaderRejectedBeforeAllocation) {
  // A valid 1x1 PNG whose IHDR claims 100000x100000 (CRC fixed up).
  PngSpec spec;
  spec.width = spec.height = 1;
  spec.color_type = PNG_COLOR_TYPE_GRAY;
  spec.samples = {7};
  std::vector<uint8_t> png = EncodePngForTest(spec);
  auto put32 = [&](size_t at, uint32_t v) {
    for (int i = 0; i < 4; ++i) png[at + i] = static_cast<uint8_t>(v >> (24 - 8 * i));
  };
  put32(16, 100000);
  put32(20, 100000);
  put32(29, static_cast<uint32_t>(crc32(crc32(0, nullptr, 0), png.data() + 12, 17)));
  Status s = DecodeImage(png).status();
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
  EXPECT_EQ(s.message(), "PNG of 100000x100000 pixels exceeds the limit of 178956970 pixels");
  Result<ImageInfo> info = ReadImageInfo(png);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->width, 100000u);
}

TEST(BadInput, LimitIsAdjustable) {
  Image src = testing::PatternImage(20, 20, 3);
  std::vector<uint8_t> png = *EncodePng(src);
  Status png_over = DecodeImage(png, {.max_pixels = 399}).status();
  EXPECT_EQ(png_over.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(png_over.message(), "PNG of 20x20 pixels exceeds the limit of 399 pixels");
  EXPECT_TRUE(DecodeImage(png, {.max_pixels = 400}).ok());
  std::vector<uint8_t> jpg = *EncodeJpeg(src.pixels, 20, 20, 3);
  Status jpg_over = DecodeImage(jpg, {.max_pixels = 399}).status();
  EXPECT_EQ(jpg_over.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(jpg_over.message(), "JPEG of 20x20 pixels exceeds the limit of 399 pixels");
}

// ---- one decoder per thread: a bad image must not poison the next ----

// Offset of the first byte after the DQT marker's length field (the Pq/Tq byte).
size_t DqtTableByte(const std::vector<uint8_t>& jpg) {
  for (size_t i = 2; i + 4 < jpg.size(); ++i) {
    if (jpg[i] == 0xFF && jpg[i + 1] == 0xDB) return i + 4;
  }
  return 0;
}
size_t FirstSos(const std::vector<uint8_t>& jpg) {
  for (size_t i = 2; i + 1 < jpg.size(); ++i) {
    if (jpg[i] == 0xFF && jpg[i + 1] == 0xDA) return i;
  }
  return 0;
}

TEST(BadInput, BadJpegDoesNotPoisonTheThreadsDecoder) {
  Image src = Smooth(48, 32);
  const std::vector<uint8_t> good = *EncodeJpeg(src.pixels, 48, 32, 3);
  const Image want = *DecodeImage(good);  // decoded alone, on a fresh decoder
  std::vector<uint8_t> bad_dqt = good;
  const size_t dqt = DqtTableByte(good);
  ASSERT_GT(dqt, 0u);
  bad_dqt[dqt] |= 0x0F;  // table index 15: "Bogus DQT index 15"
  const std::vector<uint8_t> before_scan(good.begin(), good.begin() + FirstSos(good));
  const std::vector<uint8_t> truncated(good.begin(), good.begin() + good.size() / 2);
  std::vector<uint8_t> garbage_header = {0xFF, 0xD8, 0xFF, 0x00, 'g', 'a', 'r', 'b', 'a', 'g', 'e'};
  garbage_header.resize(64, 0x11);

  // Each bad one's reason when decoded alone, each on a fresh thread.
  const std::vector<std::vector<uint8_t>> bads = {bad_dqt, before_scan, truncated, garbage_header};
  std::vector<std::string> alone;
  for (const auto& b : bads) {
    std::string msg;
    std::thread([&] { msg = DecodeImage(b).status().ToString(); }).join();
    alone.push_back(msg);
  }
  EXPECT_NE(alone[0].find("Bogus DQT index 15"), std::string::npos) << alone[0];

  // Alternating on this thread: every good one decodes to the same pixels,
  // every bad one fails with its own reason, twice over.
  for (int round = 0; round < 2; ++round) {
    for (size_t i = 0; i < bads.size(); ++i) {
      Result<Image> g = DecodeImage(good);
      ASSERT_TRUE(g.ok()) << "round " << round << ", after bad " << i << ": "
                          << g.status().ToString();
      EXPECT_EQ(g->pixels, want.pixels);
      Result<ImageInfo> info = ReadImageInfo(good);
      ASSERT_TRUE(info.ok()) << info.status().ToString();
      EXPECT_EQ(info->width, 48u);
      Status s = DecodeImage(bads[i]).status();
      EXPECT_EQ(s.code(), StatusCode::kCorruption) << s.ToString();
      EXPECT_EQ(s.ToString(), alone[i]) << "bad " << i << " in round " << round;
    }
  }
}

TEST(BadInput, BadPngDoesNotPoisonTheNextDecode) {
  Image src = testing::PatternImage(20, 20, 4);
  const std::vector<uint8_t> good = *EncodePng(src);
  std::vector<uint8_t> bad = good;
  bad[bad.size() / 2] ^= 0xFF;
  const std::vector<uint8_t> cut(good.begin(), good.begin() + good.size() / 2);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(DecodeImage(bad).status().code(), StatusCode::kCorruption);
    Result<Image> g = DecodeImage(good);
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    EXPECT_EQ(g->pixels, src.pixels);
    EXPECT_NE(DecodeImage(cut).status().message().find("truncated PNG"), std::string::npos);
  }
}

TEST(BadInput, GarbageJpegHeaderSaysSo) {
  std::vector<uint8_t> garbage = {0xFF, 0xD8, 0xFF, 0x00, 'n', 'o', 'p', 'e'};
  garbage.resize(64, 0x11);
  for (int i = 0; i < 2; ++i) {
    Status s = DecodeImage(garbage).status();
    EXPECT_EQ(s.code(), StatusCode::kCorruption);
    EXPECT_NE(s.message().find("not a valid JPEG header"), std::string::npos) << s.ToString();
    EXPECT_EQ(s.message().find("empty image"), std::string::npos) << s.ToString();
  }
}

}  // namespace
// Pillow's decisions on damaged JPEGs (the corpus test checks many more).
std::vector<uint8_t> WithoutSegment(const std::vector<uint8_t>& jpg, uint8_t marker) {
  size_t pos = 2;
  while (pos + 4 <= jpg.size() && jpg[pos] == 0xFF && jpg[pos + 1] != 0xDA) {
    const size_t len = (size_t{jpg[pos + 2]} << 8) | jpg[pos + 3];
    if (jpg[pos + 1] == marker) {
      std::vector<uint8_t> out(jpg.begin(), jpg.begin() + static_cast<long>(pos));
      out.insert(out.end(), jpg.begin() + static_cast<long>(pos + 2 + len), jpg.end());
      return out;
    }
    pos += 2 + len;
  }
  return jpg;
}

TEST(PillowAgreement, AJpegWithoutItsQuantisationTablesIsRefusedEvenAfterAGoodOne) {
  // A reused decompressor kept the last image's tables, so this file decoded
  // with them and loaded; Pillow (a fresh decompressor) refuses it.
  Image src = Smooth(32, 32);
  const std::vector<uint8_t> good = *EncodeJpeg(src.pixels, 32, 32, 3);
  std::vector<uint8_t> bad = good;
  for (int i = 0; i < 4; ++i) bad = WithoutSegment(bad, 0xDB);  // every DQT
  ASSERT_LT(bad.size(), good.size());
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(DecodeImage(good).ok());
    Status s = DecodeImage(bad).status();
    EXPECT_EQ(s.code(), StatusCode::kCorruption) << s.ToString();
    EXPECT_NE(s.message().find("Quantization table"), std::string::npos) << s.ToString();
  }
}

TEST(PillowAgreement, JpegWarningsLoadButAMissingEndIsTruncated) {
  Image src = Smooth(32, 32);
  std::vector<uint8_t> jpg = *EncodeJpeg(src.pixels, 32, 32, 3);
  const std::vector<uint8_t> whole = DecodeImage(jpg)->pixels;
  // An unknown JFIF revision: libjpeg warns, Pillow loads.
  std::vector<uint8_t> rev = jpg;
  ASSERT_EQ(rev[6], 'J');
  rev[11] = 3;
  Result<Image> r = DecodeImage(rev);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->pixels, whole);
  // Extraneous bytes before a marker: a warning, it loads.
  std::vector<uint8_t> junk = jpg;
  junk.insert(junk.begin() + 20, {0x00, 0x11});
  ASSERT_TRUE(DecodeImage(junk).ok()) << DecodeImage(junk).status().ToString();
  // No end marker: every row is there, but Pillow says "truncated"; so do we.
  std::vector<uint8_t> noeoi(jpg.begin(), jpg.end() - 2);
  Status s = DecodeImage(noeoi).status();
  EXPECT_EQ(s.code(), StatusCode::kCorruption);
  EXPECT_NE(s.message().find("truncated JPEG"), std::string::npos) << s.ToString();
  // Not FF D8 FF: Pillow does not take it for a JPEG.
  std::vector<uint8_t> magic = jpg;
  magic[2] = 0xFB;
  EXPECT_FALSE(DecodeImage(magic).ok());
}

TEST(PillowAgreement, PngChecksumsAsPillowChecksThem) {
  Image src = testing::PatternImage(16, 16, 3);
  const std::vector<uint8_t> png = *EncodePng(src);
  // The IDAT's CRC is not checked (Pillow does not read it).
  std::vector<uint8_t> idat_crc = png;
  idat_crc[png.size() - 12 - 1] ^= 0x5A;
  Result<Image> r = DecodeImage(idat_crc);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->pixels, src.pixels);
  // IHDR's is (before the image data, Pillow checks every CRC).
  std::vector<uint8_t> ihdr_crc = png;
  ihdr_crc[29] ^= 0x01;
  Status s = DecodeImage(ihdr_crc).status();
  EXPECT_EQ(s.code(), StatusCode::kCorruption);
  EXPECT_NE(s.message().find("bad CRC in the IHDR chunk"), std::string::npos) << s.ToString();
  // zlib's checksum is, when it is there.
  std::vector<uint8_t> adler = png;
  adler[png.size() - 12 - 4 - 1] ^= 0x01;
  EXPECT_FALSE(DecodeImage(adler).ok());
}

}  // namespace nl
