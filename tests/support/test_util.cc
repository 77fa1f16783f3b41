#include "tests/support/test_util.h"

// jpeglib.h needs size_t and FILE first.
#include <cstdio>
#include <jpeglib.h>

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <csetjmp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <stdexcept>

#include "formats/crc32c.h"
#include "base/file_util.h"
#include "formats/shard.h"

namespace nl::testing {

ScratchDir::ScratchDir() {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = std::string(base && *base ? base : "/tmp") + "/nl-test-XXXXXX";
  if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
  path_ = tmpl;
}

ScratchDir::~ScratchDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

Image PatternImage(uint32_t w, uint32_t h, uint32_t seed) {
  Image img;
  img.width = w;
  img.height = h;
  img.pixels.resize(size_t{w} * h * 3);
  uint32_t s = seed * 2654435761u + 1;
  for (uint32_t y = 0; y < h; ++y) {
    for (uint32_t x = 0; x < w; ++x) {
      s = s * 1664525u + 1013904223u;
      uint8_t* p = &img.pixels[(size_t{y} * w + x) * 3];
      p[0] = static_cast<uint8_t>((x * 255) / std::max(1u, w - 1));
      p[1] = static_cast<uint8_t>((y * 255) / std::max(1u, h - 1));
      p[2] = static_cast<uint8_t>(s >> 24);
    }
  }
  return img;
}

std::vector<uint8_t> Noise(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<uint8_t> v(n);
  for (auto& x : v) x = static_cast<uint8_t>(g());
  return v;
}

namespace {
struct WriteCtx {
  std::vector<uint8_t> out;
};
void Write(png_structp png, png_bytep d, size_t n) {
  auto* c = static_cast<WriteCtx*>(png_get_io_ptr(png));
  c->out.insert(c->out.end(), d, d + n);
}
void Flush(png_structp) {}
int Channels(int color_type) {
  switch (color_type) {
    case PNG_COLOR_TYPE_GRAY:
      return 1;
    case PNG_COLOR_TYPE_GRAY_ALPHA:
      return 2;
    case PNG_COLOR_TYPE_RGB:
      return 3;
    case PNG_COLOR_TYPE_RGB_ALPHA:
      return 4;
    case PNG_COLOR_TYPE_PALETTE:
      return 1;
  }
  return 0;
}
}  // namespace

std::vector<uint8_t> EncodePngForTest(const PngSpec& s) {
  const int ch = Channels(s.color_type);
  const size_t row_samples = size_t{s.width} * ch;
  if (s.samples.size() != row_samples * s.height) throw std::runtime_error("sample count");
  // Rows: one byte per sample for depth <= 8 (libpng packs), big-endian pairs for 16.
  const size_t bps = s.bit_depth == 16 ? 2 : 1;
  std::vector<uint8_t> rows(row_samples * bps * s.height);
  for (size_t i = 0; i < s.samples.size(); ++i) {
    if (bps == 2) {
      rows[2 * i] = static_cast<uint8_t>(s.samples[i] >> 8);
      rows[2 * i + 1] = static_cast<uint8_t>(s.samples[i]);
    } else {
      rows[i] = static_cast<uint8_t>(s.samples[i]);
    }
  }
  std::vector<png_bytep> ptrs(s.height);
  for (uint32_t y = 0; y < s.height; ++y) ptrs[y] = rows.data() + y * row_samples * bps;

  WriteCtx ctx;
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(png);
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    throw std::runtime_error("libpng write failed");
  }
  png_set_write_fn(png, &ctx, Write, Flush);
  png_set_IHDR(png, info, s.width, s.height, s.bit_depth, s.color_type,
               s.interlaced ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  if (s.color_type == PNG_COLOR_TYPE_PALETTE) {
    png_set_PLTE(png, info, s.palette.data(), static_cast<int>(s.palette.size()));
    if (!s.palette_alpha.empty()) {
      png_set_tRNS(png, info, s.palette_alpha.data(), static_cast<int>(s.palette_alpha.size()),
                   nullptr);
    }
  }
  if (s.gray_or_rgb_trns) {
    png_color_16 key{};
    key.gray = key.red = key.green = key.blue = static_cast<png_uint_16>(s.samples[0]);
    png_set_tRNS(png, info, nullptr, 0, &key);
  }
  png_write_info(png, info);
  if (s.bit_depth < 8) png_set_packing(png);
  if (s.interlaced) png_set_interlace_handling(png);
  png_write_image(png, ptrs.data());
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  return ctx.out;
}

std::vector<uint8_t> CraftRecord(RecordHeader h, std::span<const uint8_t> payload) {
  if (h.payload_length == 0) h.payload_length = static_cast<uint32_t>(payload.size());
  h.payload_crc = Crc32c(0, payload.data(), payload.size());
  std::vector<uint8_t> out(kRecordHeaderSize + payload.size());
  EncodeHeaderForTest(h, kRecordMagic, kRecordVersion, out.data());
  std::copy(payload.begin(), payload.end(), out.begin() + kRecordHeaderSize);
  return out;
}

Manifest WriteShardSetForTest(const std::string& root,
                              const std::vector<std::vector<uint8_t>>& records,
                              const TestShardSetSpec& spec) {
  auto check = [](const Status& st) {
    if (!st.ok()) throw std::runtime_error(st.ToString());
  };
  Manifest m;
  m.source_kind = "imagefolder";
  m.source_path = root;
  m.label_kind = "class_dirs";
  for (uint32_t c = 0; c < spec.num_classes; ++c)
    m.classes.push_back(std::string("c").append(std::to_string(c)));
  SplitInfo s;
  s.encoding = spec.encoding;
  s.num_samples = records.size();
  check(MakeDirs(root + "/" + spec.split));
  const uint64_t n = records.size();
  const uint32_t shards = std::max<uint32_t>(1, spec.shards);
  for (uint32_t k = 0; k < shards; ++k) {
    const uint64_t first = n * k / shards, end = n * (k + 1) / shards;
    char name[32];
    std::snprintf(name, sizeof name, "/shard-%05u", k);
    auto w = ShardWriter::Create(root, spec.split + name, first);
    check(w.status());
    for (uint64_t i = first; i < end; ++i) check((*w)->Put(i, records[i]));
    auto info = (*w)->Finish();
    check(info.status());
    s.shards.push_back(*info);
  }
  m.splits[spec.split] = s;
  check(SaveManifest(root, m));
  return m;
}

void WriteBytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!f) throw std::runtime_error("cannot write " + path);
}

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
  if (!f) throw std::runtime_error("cannot write " + path);
}

std::vector<uint8_t> EncodeJpegCoded(const std::vector<uint8_t>& px, int w, int h, const JpegCoding& k) {
  jpeg_compress_struct c;
  jpeg_error_mgr err;
  c.err = jpeg_std_error(&err);  // valid parameters: libjpeg never fails here
  jpeg_create_compress(&c);
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&c, &buf, &size);
  c.image_width = static_cast<JDIMENSION>(w);
  c.image_height = static_cast<JDIMENSION>(h);
  c.input_components = k.components;
  c.in_color_space = k.components == 1 ? JCS_GRAYSCALE : k.components == 3 ? JCS_RGB : JCS_CMYK;
  jpeg_set_defaults(&c);
  if (k.components == 4) jpeg_set_colorspace(&c, JCS_YCCK);
  jpeg_set_quality(&c, 90, TRUE);
  c.comp_info[0].h_samp_factor = k.h_samp;
  c.comp_info[0].v_samp_factor = k.v_samp;
  for (int i = 1; i < c.num_components; ++i) c.comp_info[i].h_samp_factor = c.comp_info[i].v_samp_factor = 1;
  if (k.progressive) jpeg_simple_progression(&c);
  c.restart_in_rows = k.restart_rows;
  if (k.restart_mcus > 0) c.restart_interval = static_cast<unsigned>(k.restart_mcus);
  jpeg_start_compress(&c, TRUE);
  const size_t stride = static_cast<size_t>(w) * k.components;
  while (c.next_scanline < c.image_height) {
    JSAMPROW row = const_cast<uint8_t*>(px.data()) + c.next_scanline * stride;
    jpeg_write_scanlines(&c, &row, 1);
  }
  jpeg_finish_compress(&c);
  jpeg_destroy_compress(&c);
  std::vector<uint8_t> out(buf, buf + size);
  free(buf);
  return out;
}

const std::vector<NamedJpegSampling>& EveryJpegSampling() {
  static const std::vector<NamedJpegSampling> all = {
      {"s444", {3, 1, 1}}, {"s422", {3, 2, 1}}, {"s420", {3, 2, 2}}, {"s440", {3, 1, 2}},
      {"s411", {3, 4, 1}}, {"s441", {3, 1, 4}}, {"s410", {3, 4, 2}}, {"s3x1", {3, 3, 1}},
      {"s3x2", {3, 3, 2}}, {"gray", {1, 1, 1}}};
  return all;
}

std::vector<uint8_t> PhotoLikePixels(int w, int h, int comps, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> px(static_cast<size_t>(w) * h * comps);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int ch = 0; ch < comps; ++ch) {
        const int edge = ((x / 13 + y / 7 + ch) % 3 == 0) ? 60 : 0;
        const int v = (x * (3 + ch) + y * (5 - ch)) % 200 + edge + static_cast<int>(rng() % 24);
        px[(static_cast<size_t>(y) * w + x) * comps + ch] = static_cast<uint8_t>(std::min(v, 255));
      }
  return px;
}

std::vector<uint8_t> JpegRowRestartsCannotEncode() {
  const JDIMENSION w = 64, h = 16;
  std::vector<uint8_t> gray(size_t{w} * h, 128);
  jpeg_compress_struct c;
  jpeg_decompress_struct d;
  jpeg_error_mgr err;  // valid parameters and data: libjpeg never fails here
  c.err = d.err = jpeg_std_error(&err);
  jpeg_create_compress(&c);
  unsigned char* base = nullptr;
  unsigned long base_size = 0;
  jpeg_mem_dest(&c, &base, &base_size);
  c.image_width = w;
  c.image_height = h;
  c.input_components = 1;
  c.in_color_space = JCS_GRAYSCALE;
  jpeg_set_defaults(&c);
  jpeg_start_compress(&c, TRUE);
  while (c.next_scanline < h) {
    JSAMPROW row = gray.data() + size_t{c.next_scanline} * w;
    jpeg_write_scanlines(&c, &row, 1);
  }
  jpeg_finish_compress(&c);
  jpeg_destroy_compress(&c);
  // Its coefficients, the DC values set, written again.
  jpeg_create_decompress(&d);
  jpeg_mem_src(&d, base, base_size);
  jpeg_read_header(&d, TRUE);
  jvirt_barray_ptr* coefs = jpeg_read_coefficients(&d);
  const jpeg_component_info& comp = d.comp_info[0];
  for (JDIMENSION r = 0; r < comp.height_in_blocks; ++r) {
    JBLOCKARRAY blocks = (*d.mem->access_virt_barray)(reinterpret_cast<j_common_ptr>(&d), coefs[0], r, 1, TRUE);
    for (JDIMENSION x = 0; x < comp.width_in_blocks; ++x) {
      const JDIMENSION k = r % 2 == 0 ? x : comp.width_in_blocks - 1 - x;
      blocks[0][x][0] = static_cast<JCOEF>(600 * k);
    }
  }
  jpeg_create_compress(&c);
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&c, &buf, &size);
  jpeg_copy_critical_parameters(&d, &c);
  c.optimize_coding = TRUE;
  jpeg_write_coefficients(&c, coefs);
  const std::vector<uint8_t> text(6000, 'x');
  jpeg_write_marker(&c, JPEG_COM, text.data(), static_cast<unsigned>(text.size()));
  jpeg_finish_compress(&c);
  jpeg_finish_decompress(&d);
  jpeg_destroy_compress(&c);
  jpeg_destroy_decompress(&d);
  std::vector<uint8_t> out(buf, buf + size);
  free(buf);
  free(base);
  return out;
}

}  // namespace nl::testing
