// libFuzzer target: bytes through our PNG and JPEG wrappers (with a pixel
// limit), header-only, whole and region decodes; a region decode
// must hold its region and, where the whole decode succeeds too, equal it
// there (for a JPEG with restart markers only after AddJpegRowRestarts: a
// region below a restart skips damage above it that the whole decode
// decodes around). Built twice: png_fuzz (seeds: PNGs)
// and jpeg_fuzz (seeds: JPEGs); both take any bytes.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "formats/image.h"

namespace {

// The region's pixels of `part` equal `img`'s (the whole decode's, full
// scale); the region clipped, an empty or outside one the whole image.
void CheckRegion(const nl::PixelRect& r, const nl::DecodedRegion& part, const nl::Image& img) {
  const nl::Image& p = part.image;
  if (part.full_width != img.width || part.full_height != img.height) __builtin_trap();
  const bool whole = r.w == 0 || r.h == 0 || r.x >= img.width || r.y >= img.height;
  const uint32_t x0 = whole ? 0 : r.x, y0 = whole ? 0 : r.y;
  const uint32_t x1 = whole ? img.width : static_cast<uint32_t>(std::min<uint64_t>(img.width, uint64_t{r.x} + r.w));
  const uint32_t y1 = whole ? img.height : static_cast<uint32_t>(std::min<uint64_t>(img.height, uint64_t{r.y} + r.h));
  if (part.x > x0 || part.y > y0 || part.x + p.width < x1 || part.y + p.height < y1) __builtin_trap();
  for (uint32_t y = y0; y < y1; ++y)
    for (uint32_t x = x0; x < x1; ++x)
      for (int c = 0; c < 3; ++c)
        if (p.pixels[(size_t{y - part.y} * p.width + (x - part.x)) * 3 + c] !=
            img.pixels[(size_t{y} * img.width + x) * 3 + c])
          __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const uint8_t> bytes(data, size);
  (void)nl::ReadImageInfo(bytes);
  nl::DecodeLimits limits;
  limits.max_pixels = 1u << 22;
  nl::Image img;
#if defined(NL_FUZZ_JPEG)
  nl::Status s = nl::DecodeJpegInto(bytes, limits, &img);
#else
  nl::Status s = nl::DecodePngInto(bytes, limits, &img);
#endif
  if (s.ok() && img.pixels.size() != size_t{img.width} * img.height * 3) __builtin_trap();
#if defined(NL_FUZZ_JPEG)
  // A region from the input's last bytes: the same bytes also steer the
  // decoder, so regions vary with the coverage.
  if (size >= 8) {
    const uint8_t* t = data + size - 8;
    const nl::PixelRect r{uint32_t{t[0]} | uint32_t{t[1]} << 8, uint32_t{t[2]} | uint32_t{t[3]} << 8,
                          uint32_t{t[4]} | uint32_t{t[5]} << 8, uint32_t{t[6]} | uint32_t{t[7]} << 8};
    // A DCT scale too (1..8 eighths), from the input's length; the pixel
    // check is at full scale.
    const int scale = size % 3 == 0 ? static_cast<int>(size / 3 % 8) + 1 : 8;
    nl::DecodedRegion part;
    if (nl::DecodeJpegRegionInto(bytes, limits, r, &part, scale).ok()) {
      const nl::Image& p = part.image;
      if (p.pixels.size() != size_t{p.width} * p.height * 3) __builtin_trap();
      if (uint64_t{part.x} + p.width > part.full_width || uint64_t{part.y} + p.height > part.full_height)
        __builtin_trap();
      if (part.scale_eighths != scale || part.full_width != (uint64_t{part.image_width} * scale + 7) / 8)
        __builtin_trap();
      const uint8_t dri[2] = {0xFF, 0xDD};
      if (s.ok() && scale == 8 && std::search(data, data + size, dri, dri + 2) == data + size) {
        CheckRegion(r, part, img);
      }
    }
    // With a restart marker at every row (pack_tool --jpeg-restarts), which
    // keeps the coefficients the whole decode decoded: the region decode
    // starts at a marker above the region, and equals the whole decode.
    if (s.ok()) {
      nl::Result<std::vector<uint8_t>> rows = nl::AddJpegRowRestarts(bytes, limits);
      nl::DecodedRegion cut;
      if (rows.ok()) {
        if (!nl::DecodeJpegRegionInto(*rows, limits, r, &cut).ok()) __builtin_trap();
        CheckRegion(r, cut, img);
      }
    }
    // --decode fast's approximate decode (merged upsampling, no margin): the
    // same shape contract, at the same scale.
    nl::DecodedRegion approx;
    if (nl::DecodeJpegRegionInto(bytes, limits, r, &approx, scale, true).ok()) {
      const nl::Image& p = approx.image;
      if (p.pixels.size() != size_t{p.width} * p.height * 3) __builtin_trap();
      if (uint64_t{approx.x} + p.width > approx.full_width || uint64_t{approx.y} + p.height > approx.full_height)
        __builtin_trap();
      if (approx.scale_eighths != scale || approx.full_width != (uint64_t{approx.image_width} * scale + 7) / 8)
        __builtin_trap();
    }
  }
#else
  // A PNG region: whole rows from the region's first, equal to the full
  // decode's where that succeeds.
  if (size >= 8) {
    const uint8_t* t = data + size - 8;
    const nl::PixelRect r{uint32_t{t[0]}, uint32_t{t[1]} | uint32_t{t[2]} << 8, uint32_t{t[3]},
                          uint32_t{t[4]} | uint32_t{t[5]} << 8};
    nl::DecodedRegion part;
    if (nl::DecodePngRegionInto(bytes, limits, r, &part).ok()) {
      const nl::Image& p = part.image;
      if (p.pixels.size() != size_t{p.width} * p.height * 3 || part.x != 0 || p.width != part.full_width ||
          uint64_t{part.y} + p.height > part.full_height)
        __builtin_trap();
      if (s.ok()) {
        if (part.full_width != img.width || part.full_height != img.height) __builtin_trap();
        if (!std::equal(p.pixels.begin(), p.pixels.end(), img.pixels.begin() + size_t{part.y} * img.width * 3))
          __builtin_trap();
      }
    }
  }
#endif
  return 0;
}
