// PNG decode and encode through libpng.
//
// libpng reports errors by longjmp. Everything that owns memory lives in a
// context object created before setjmp, so a longjmp out of libpng never
// skips a destructor; the functions that run under setjmp hold only trivially
// destructible locals.
#include <png.h>
#include <zlib.h>

#include <algorithm>
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
  bool rows_done = false;  // every row decoded: what follows cannot fail the image
  // Where the image data ends in the file (see ReadBytes); npos: the file is
  // cut before that, or its structure breaks first.
  size_t tail_from = std::string::npos;
  // An IDAT whose declared length runs past the end of the file is read as
  // holding the rest of the file (Pillow feeds those bytes to zlib).
  size_t patch_at = std::string::npos;
  uint8_t patch[4] = {0, 0, 0, 0};
  bool gray16 = false;     // rows in `scratch`, converted at the end
  bool reading_rows = false;  // inside png_read_image
  png_uint_32 height = 0;
  bool interlaced = false;
  // A region decode: rows [first_row, end_row) are wanted (end_row 0: all).
  // Set to what was decoded: the region's rows when libpng could stop after
  // them (8-bit output, not interlaced), else all.
  png_uint_32 first_row = 0, end_row = 0, region_x = 0;
  png_uint_32 full_height = 0;
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

// Unknown chunks, critical ones included, are skipped (as Pillow does).
int OnUnknownChunk(png_structp, png_unknown_chunkp) { return 1; }

uint32_t Be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}
bool IsChunkType(const uint8_t* t) {
  for (int i = 0; i < 4; ++i) {
    const uint8_t c = t[i];
    if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z'))) return false;
  }
  return true;
}

// Walks the chunks as Pillow reads them. Before the image data each chunk
// needs a type of four letters and a matching CRC, or the file is refused
// (Pillow's rule; image data and later chunks are not checked: libpng is told
// below to use them whatever their CRC). Notes in ctx where the image data
// ends (ReadBytes) and an IDAT length that runs past the end of the file.
Status WalkChunks(std::span<const uint8_t> bytes, PngContext* ctx) {
  size_t pos = 8;
  bool seen_idat = false;
  while (pos + 8 <= bytes.size()) {
    const uint32_t len = Be32(bytes.data() + pos);
    const uint8_t* type = bytes.data() + pos + 4;
    const bool idat = std::memcmp(type, "IDAT", 4) == 0;
    const size_t room = bytes.size() - pos - 8;  // bytes after this header
    if (!IsChunkType(type)) {
      if (seen_idat) return Status::Ok();
      return Status::Corruption("corrupt PNG: the chunk at offset " + std::to_string(pos) +
                                " has no valid type");
    }
    if (idat) {
      seen_idat = true;
      if (len > room) {  // Pillow reads what there is
        const uint32_t rest = static_cast<uint32_t>(std::min<size_t>(room, 0x7fffffff));
        ctx->patch_at = pos;
        const uint8_t be[4] = {static_cast<uint8_t>(rest >> 24), static_cast<uint8_t>(rest >> 16),
                               static_cast<uint8_t>(rest >> 8), static_cast<uint8_t>(rest)};
        std::memcpy(ctx->patch, be, 4);
        ctx->tail_from = bytes.size();
        return Status::Ok();
      }
      ctx->tail_from = pos + 8 + len;
    } else if (seen_idat) {
      return Status::Ok();  // the image data is over
    } else {
      if (len > room || room - len < 4) return Status::Ok();  // cut: libpng says where
      const uint32_t want = Be32(bytes.data() + pos + 8 + len);
      const uint32_t got = static_cast<uint32_t>(crc32(crc32(0, nullptr, 0), type, 4 + len));
      if (want != got) {
        return Status::Corruption("corrupt PNG: bad CRC in the " +
                                  std::string(reinterpret_cast<const char*>(type), 4) +
                                  " chunk at offset " + std::to_string(pos));
      }
    }
    pos += 12 + size_t{len};
  }
  return Status::Ok();
}

void ReadBytes(png_structp png, png_bytep out, size_t n) {
  auto* ctx = static_cast<PngContext*>(png_get_io_ptr(png));
  if (ctx->data.size() - std::min(ctx->pos, ctx->data.size()) < n && ctx->pos >= ctx->tail_from) {
    // Past the image data, Pillow stops reading: a file cut there loads.
    // libpng reads on (the last IDAT's CRC, the next chunk's header), so the
    // missing tail reads as zeros (a CRC, which is not checked there) and an
    // IEND header. If zlib wanted more data, the IEND makes libpng fail with
    // "Not enough image data", as Pillow fails with "truncated".
    static const uint8_t kIend[8] = {0, 0, 0, 0, 'I', 'E', 'N', 'D'};
    if (n == 8) {
      std::memcpy(out, kIend, 8);
    } else {
      const size_t have = std::min(n, ctx->data.size() - std::min(ctx->pos, ctx->data.size()));
      if (have) std::memcpy(out, ctx->data.data() + ctx->pos, have);
      std::memset(out + have, 0, n - have);
    }
    ctx->pos += n;
    return;
  }
  if (ctx->data.size() - ctx->pos < n) {
    // The message is built before png_error, which longjmps: no temporary may
    // be alive across it.
    ctx->error = "truncated PNG: wanted " + std::to_string(n) + " bytes at offset " +
                 std::to_string(ctx->pos) + " of a " + std::to_string(ctx->data.size()) +
                 "-byte file";
    png_error(png, "truncated");
  }
  std::memcpy(out, ctx->data.data() + ctx->pos, n);
  if (ctx->patch_at != std::string::npos && ctx->pos <= ctx->patch_at && ctx->patch_at + 4 <= ctx->pos + n) {
    std::memcpy(out + (ctx->patch_at - ctx->pos), ctx->patch, 4);
  }
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
      // What Pillow tolerates: image data whatever its chunks' CRCs and its
      // zlib checksum, unknown chunks, and (benign errors) extra data.
      png_set_crc_action(png_, PNG_CRC_QUIET_USE, PNG_CRC_QUIET_USE);
      png_set_benign_errors(png_, 1);
      png_set_read_user_chunk_fn(png_, nullptr, OnUnknownChunk);
      png_set_keep_unknown_chunks(png_, PNG_HANDLE_CHUNK_NEVER, nullptr, 0);
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

// 16-bit gray rows (kept in ctx->scratch) to RGB, clipped as Pillow's I -> RGB.
Status FinishGray16(PngContext* ctx, Image* out) {
  if (!ctx->gray16) return Status::Ok();
  const uint8_t* src = ctx->scratch.data();
  uint8_t* dst = out->pixels.data();
  for (size_t i = 0, n = size_t{out->width} * out->height; i < n; ++i) {
    const unsigned v = (unsigned{src[2 * i]} << 8) | src[2 * i + 1];
    const uint8_t c = v > 255 ? 255 : static_cast<uint8_t>(v);
    dst[3 * i] = dst[3 * i + 1] = dst[3 * i + 2] = c;
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
  ctx->gray16 = gray16;
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
  // A region: inflate down to its last row and stop (the rows above it are
  // inflated into one scratch row). Not for 16-bit gray (converted at the
  // end) or interlaced images (every pass reaches the last row).
  ctx->full_height = h;
  if (ctx->end_row > 0 && ctx->first_row < h && ctx->region_x < w && !gray16 &&
      interlace == PNG_INTERLACE_NONE) {
    const png_uint_32 y0 = std::min(ctx->first_row, h - 1), y1 = std::clamp(ctx->end_row, y0 + 1, h);
    out->width = w;
    out->height = y1 - y0;
    out->pixels.resize(size_t{w} * (y1 - y0) * 3);
    ctx->scratch.resize(rowbytes);
    ctx->height = y1;  // (for the error handler: the rows wanted)
    ctx->reading_rows = true;
    for (png_uint_32 y = 0; y < y1; ++y) {
      png_read_row(png, y < y0 ? ctx->scratch.data() : out->pixels.data() + size_t{y - y0} * rowbytes, nullptr);
    }
    ctx->rows_done = true;
    ctx->first_row = y0;
    ctx->end_row = y1;
    return Status::Ok();
  }
  ctx->first_row = 0;
  ctx->end_row = h;
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
  ctx->height = h;
  ctx->interlaced = interlace != PNG_INTERLACE_NONE;
  ctx->reading_rows = true;
  png_read_image(png, ctx->rows.data());
  // Every row is in: a damaged or missing end (IEND cut off, a bad CRC after
  // the image data) does not fail the image, as in Pillow.
  ctx->rows_done = true;
  png_read_end(png, nullptr);
  return FinishGray16(ctx, out);
}

// What a region decode holds: whole rows [first_row, first_row + height).
void FillWhere(const PngContext& ctx, const Image& out, DecodedRegion* where) {
  where->x = 0;
  where->y = ctx.first_row;
  where->full_width = where->image_width = out.width;
  where->full_height = where->image_height = ctx.full_height;
  where->scale_eighths = 8;
}

Status RunDecode(std::span<const uint8_t> bytes, const DecodeLimits& limits, Image* out,
                 ImageInfo* info_only, const PixelRect* region = nullptr, DecodedRegion* where = nullptr) {
  if (bytes.size() < 8 || png_sig_cmp(bytes.data(), 0, 8) != 0) {
    return Status::Corruption("not a PNG file (bad signature)");
  }
  PngContext ctx;
  ctx.data = bytes;
  if (region && region->w > 0 && region->h > 0) {
    ctx.first_row = region->y;
    ctx.region_x = region->x;
    ctx.end_row = static_cast<png_uint_32>(std::min<uint64_t>(UINT32_MAX, uint64_t{region->y} + region->h));
  }
  ReadStruct rs(&ctx);
  if (!rs.ok()) return Status::Internal("libpng: cannot allocate read structures");
  NL_RETURN_IF_ERROR(WalkChunks(bytes, &ctx));
  if (setjmp(png_jmpbuf(rs.png()))) {
    // libpng fails after the last row when what follows the image data is
    // missing (the zlib checksum, the CRC, IEND): it reads on to the end of
    // the zlib stream. Pillow stops once it has every row, so such a file
    // loads. libpng's row counter says whether the last row was complete:
    // past it (pass 7 of an interlaced image), the failure came after the rows.
    const bool all_rows =
        ctx.reading_rows && (ctx.interlaced ? png_get_current_pass_number(rs.png()) >= 7
                                            : png_get_current_row_number(rs.png()) >= ctx.height);
    if ((ctx.rows_done || all_rows) && !info_only) {
      NL_RETURN_IF_ERROR(FinishGray16(&ctx, out));
      if (where) FillWhere(ctx, *out, where);
      return Status::Ok();
    }
    if (ctx.pos > bytes.size()) {  // ReadBytes made up the missing tail, and zlib wanted more
      return Status::Corruption("corrupt PNG: truncated PNG: the " + std::to_string(bytes.size()) +
                                "-byte file ends before its image data does (" + ctx.error + ")");
    }
    return Status::Corruption("corrupt PNG: " + ctx.error);
  }
  if (info_only) {
    png_read_info(rs.png(), rs.info());
    info_only->format = ImageFormat::kPng;
    info_only->width = png_get_image_width(rs.png(), rs.info());
    info_only->height = png_get_image_height(rs.png(), rs.info());
    return Status::Ok();
  }
  NL_RETURN_IF_ERROR(DecodeBody(rs.png(), rs.info(), &ctx, limits, out));
  if (where) FillWhere(ctx, *out, where);
  return Status::Ok();
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

Status DecodePngRegionInto(std::span<const uint8_t> bytes, const DecodeLimits& limits,
                           const PixelRect& region, DecodedRegion* out) {
  return RunDecode(bytes, limits, &out->image, nullptr, &region, out);
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
