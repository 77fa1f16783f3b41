// PNG decode and encode through libpng.
//
// libpng reports errors by longjmp. Everything that owns memory lives in a
// context object created before setjmp, so a longjmp out of libpng never
// skips a destructor; the functions that run under setjmp hold only trivially
// destructible locals.
#include <png.h>

#include <csetjmp>
#include <cstring>
#include <string>

#include "formats/image.h"
#include "formats/record.h"

namespace nl {
namespace {

struct PngContext {
  std::span<const uint8_t> data;
  size_t pos = 0;
  std::string error;
  std::vector<png_bytep> rows;
  std::vector<uint8_t> scratch;  // 16-bit gray rows before clipping
  std::vector<uint8_t> encoded;  // encoder output
};

[[noreturn]] void OnError(png_structp png, png_const_charp msg) {
  auto* ctx = static_cast<PngContext*>(png_get_error_ptr(png));
  if (ctx->error.empty()) ctx->error = msg ? msg : "unknown libpng error";
  png_longjmp(png, 1);
}
void OnWarning(png_structp, png_const_charp) {}  // ancillary-chunk issues; pixels unaffected

void ReadBytes(png_structp png, png_bytep out, size_t n) {
  auto* ctx = static_cast<PngContext*>(png_get_io_ptr(png));
  if (ctx->data.size() - ctx->pos < n) {
    // The message is built before png_error, which longjmps: no temporary may
    // be alive across it.
    ctx->error = "truncated PNG: wanted " + std::to_string(n) + " bytes at offset " +
                 std::to_string(ctx->pos) + " of a " + std::to_string(ctx->data.size()) +
                 "-byte file";
    png_error(png, "truncated");
  }
  std::memcpy(out, ctx->data.data() + ctx->pos, n);
  ctx->pos += n;
}

class ReadStruct {
 public:
  explicit ReadStruct(PngContext* ctx) {
    png_ = png_create_read_struct(PNG_LIBPNG_VER_STRING, ctx, OnError, OnWarning);
    if (png_) info_ = png_create_info_struct(png_);
    if (png_) {
      png_set_read_fn(png_, ctx, ReadBytes);
      png_set_user_limits(png_, 0x7fffffff, 0x7fffffff);  // our own limit is checked below
    }
  }
  ~ReadStruct() { png_destroy_read_struct(&png_, info_ ? &info_ : nullptr, nullptr); }
  ReadStruct(const ReadStruct&) = delete;
  ReadStruct& operator=(const ReadStruct&) = delete;
  bool ok() const { return png_ && info_; }
  png_structp png() const { return png_; }
  png_infop info() const { return info_; }

 private:
  png_structp png_ = nullptr;
  png_infop info_ = nullptr;
};

Status CheckSize(png_uint_32 w, png_uint_32 h, const DecodeLimits& limits) {
  if (w == 0 || h == 0 || w > kMaxRecordDim || h > kMaxRecordDim) {
    return Status::Corruption("PNG size " + std::to_string(w) + "x" + std::to_string(h) +
                              " is out of range");
  }
  if (uint64_t{w} * h > limits.max_pixels) {
    return Status::ResourceExhausted("PNG of " + std::to_string(w) + "x" + std::to_string(h) +
                                     " pixels exceeds the limit of " +
                                     std::to_string(limits.max_pixels) + " pixels");
  }
  return Status::Ok();
}

// Runs under setjmp: no locals with destructors.
Status DecodeBody(png_structp png, png_infop info, PngContext* ctx, const DecodeLimits& limits,
                  Image* out) {
  png_read_info(png, info);
  png_uint_32 w = 0, h = 0;
  int depth = 0, color = 0, interlace = 0;
  png_get_IHDR(png, info, &w, &h, &depth, &color, &interlace, nullptr, nullptr);
  if (Status s = CheckSize(w, h, limits); !s.ok()) return s;

  // Pillow opens 16-bit grayscale (no alpha) as mode "I", and I -> RGB clips
  // each value to 0..255. Every other 16-bit type keeps the high byte.
  const bool gray16 = (color == PNG_COLOR_TYPE_GRAY && depth == 16);
  if (color == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if (color == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(png);
  if (depth == 16 && !gray16) png_set_strip_16(png);
  if (!gray16 && (color == PNG_COLOR_TYPE_GRAY || color == PNG_COLOR_TYPE_GRAY_ALPHA)) {
    png_set_gray_to_rgb(png);
  }
  // Alpha (and palette transparency, which palette_to_rgb expands) is dropped.
  png_set_strip_alpha(png);
  png_set_interlace_handling(png);
  png_read_update_info(png, info);

  const size_t rowbytes = png_get_rowbytes(png, info);
  const size_t want = gray16 ? size_t{w} * 2 : size_t{w} * 3;
  if (rowbytes != want) {
    return Status::Internal("libpng row of " + std::to_string(rowbytes) + " bytes, expected " +
                            std::to_string(want));
  }
  out->width = w;
  out->height = h;
  out->pixels.resize(size_t{w} * h * 3);
  uint8_t* base = out->pixels.data();
  if (gray16) {
    ctx->scratch.resize(rowbytes * h);
    base = ctx->scratch.data();
  }
  ctx->rows.resize(h);
  for (png_uint_32 y = 0; y < h; ++y) ctx->rows[y] = base + y * rowbytes;
  png_read_image(png, ctx->rows.data());
  png_read_end(png, nullptr);

  if (gray16) {
    const uint8_t* src = ctx->scratch.data();
    uint8_t* dst = out->pixels.data();
    for (size_t i = 0, n = size_t{w} * h; i < n; ++i) {
      const unsigned v = (unsigned{src[2 * i]} << 8) | src[2 * i + 1];
      const uint8_t c = v > 255 ? 255 : static_cast<uint8_t>(v);
      dst[3 * i] = dst[3 * i + 1] = dst[3 * i + 2] = c;
    }
  }
  return Status::Ok();
}

Status RunDecode(std::span<const uint8_t> bytes, const DecodeLimits& limits, Image* out,
                 ImageInfo* info_only) {
  if (bytes.size() < 8 || png_sig_cmp(bytes.data(), 0, 8) != 0) {
    return Status::Corruption("not a PNG file (bad signature)");
  }
  PngContext ctx;
  ctx.data = bytes;
  ReadStruct rs(&ctx);
  if (!rs.ok()) return Status::Internal("libpng: cannot allocate read structures");
  if (setjmp(png_jmpbuf(rs.png()))) {
    return Status::Corruption("corrupt PNG: " + ctx.error);
  }
  if (info_only) {
    png_read_info(rs.png(), rs.info());
    info_only->format = ImageFormat::kPng;
    info_only->width = png_get_image_width(rs.png(), rs.info());
    info_only->height = png_get_image_height(rs.png(), rs.info());
    return Status::Ok();
  }
  return DecodeBody(rs.png(), rs.info(), &ctx, limits, out);
}

void WriteBytes(png_structp png, png_bytep data, size_t n) {
  auto* ctx = static_cast<PngContext*>(png_get_io_ptr(png));
  ctx->encoded.insert(ctx->encoded.end(), data, data + n);
}
void Flush(png_structp) {}

}  // namespace

Status DecodePngInto(std::span<const uint8_t> bytes, const DecodeLimits& limits, Image* out) {
  return RunDecode(bytes, limits, out, nullptr);
}

Result<ImageInfo> ReadPngInfo(std::span<const uint8_t> bytes) {
  ImageInfo info;
  NL_RETURN_IF_ERROR(RunDecode(bytes, {}, nullptr, &info));
  return info;
}

Result<std::vector<uint8_t>> EncodePng(const Image& img, int compression_level) {
  if (img.width == 0 || img.height == 0 ||
      img.pixels.size() != size_t{img.width} * img.height * 3) {
    return Status::InvalidArgument("EncodePng: image of " + std::to_string(img.width) + "x" +
                                   std::to_string(img.height) + " with " +
                                   std::to_string(img.pixels.size()) + " bytes is not RGB");
  }
  PngContext ctx;
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, &ctx, OnError, OnWarning);
  png_infop info = png ? png_create_info_struct(png) : nullptr;
  struct Guard {
    png_structp* p;
    png_infop* i;
    ~Guard() { png_destroy_write_struct(p, i); }
  } guard{&png, &info};
  if (!png || !info) return Status::Internal("libpng: cannot allocate write structures");
  ctx.rows.resize(img.height);
  for (uint32_t y = 0; y < img.height; ++y) {
    ctx.rows[y] = const_cast<png_bytep>(img.pixels.data() + size_t{y} * img.width * 3);
  }
  ctx.encoded.reserve(img.pixels.size() / 2 + 128);
  if (setjmp(png_jmpbuf(png))) return Status::Internal("PNG encode failed: " + ctx.error);
  png_set_write_fn(png, &ctx, WriteBytes, Flush);
  png_set_compression_level(png, compression_level);
  png_set_IHDR(png, info, img.width, img.height, 8, PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  png_write_image(png, ctx.rows.data());
  png_write_end(png, nullptr);
  return std::move(ctx.encoded);
}

}  // namespace nl
