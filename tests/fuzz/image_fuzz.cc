// libFuzzer target: bytes through our PNG and JPEG wrappers (with a pixel
// limit), header-only and whole decodes. Built twice: png_fuzz (seeds: PNGs)
// and jpeg_fuzz (seeds: JPEGs); both take any bytes.
#include <cstddef>
#include <cstdint>

#include "formats/image.h"

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
  return 0;
}
