// Helpers for the formats tests: scratch directories and images the tests make.
#pragma once

#include <png.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "formats/image.h"
#include "formats/manifest.h"
#include "formats/record.h"

namespace nl::testing {

// A fresh directory under $TMPDIR (or /tmp), removed with everything in it.
class ScratchDir {
 public:
  ScratchDir();
  ~ScratchDir();
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// A deterministic RGB image with varied content.
Image PatternImage(uint32_t w, uint32_t h, uint32_t seed);

// n pseudo-random bytes (std::mt19937 seeded with `seed`), the same on every run.
std::vector<uint8_t> Noise(size_t n, uint32_t seed);

struct PngSpec {
  uint32_t width = 0, height = 0;
  int color_type = PNG_COLOR_TYPE_RGB;  // libpng's PNG_COLOR_TYPE_*
  int bit_depth = 8;
  bool interlaced = false;
  // One value per sample (channel), row-major; values < 2^bit_depth.
  std::vector<uint16_t> samples;
  std::vector<png_color> palette;      // for PNG_COLOR_TYPE_PALETTE
  std::vector<uint8_t> palette_alpha;  // tRNS for a palette
  bool gray_or_rgb_trns = false;       // add a tRNS colour key to gray/RGB
};
std::vector<uint8_t> EncodePngForTest(const PngSpec& spec);

// How a test JPEG is coded by libjpeg's own compressor, which (unlike
// TurboJPEG's) takes any sampling factors and restart intervals.
struct JpegCoding {
  int components = 3;  // 1 gray, 3 RGB (coded YCbCr), 4 CMYK (coded YCCK)
  int h_samp = 2, v_samp = 2;  // the first component's; the others 1x1
  bool progressive = false;
  int restart_rows = 0;  // a restart marker every N MCU rows (0: none)
  int restart_mcus = 0;  // a restart marker every N MCUs (0: none), rows or not
};
// `px` (w x h x k.components, row-major) as a quality-90 JPEG coded as `k`.
std::vector<uint8_t> EncodeJpegCoded(const std::vector<uint8_t>& px, int w, int h, const JpegCoding& k);

// Every chroma sampling a photograph arrives in, named (s444, s422, s420,
// s440, s411, s441, s410, s3x1, s3x2, gray), and with them every way
// libjpeg-turbo upsamples chroma: merged with the colour conversion (4:2:0,
// 4:2:2 without fancy upsampling), fancy (4:2:0, 4:2:2, 4:4:0), and
// int_upsample's replication (4:4:0 without fancy upsampling, 4:1:1, 4:4:1,
// 4:1:0, 3x1, 3x2).
struct NamedJpegSampling {
  std::string name;
  JpegCoding coding;
};
const std::vector<NamedJpegSampling>& EveryJpegSampling();

// A photograph-like image of `comps` channels: smooth colour gradients with
// noise and edges, so that every block has chroma and detail.
std::vector<uint8_t> PhotoLikePixels(int w, int h, int comps, uint32_t seed);

// A valid gray 64x16 JPEG (6 KB of comment first) that AddJpegRowRestarts
// cannot rewrite: its DC coefficients climb by 600 a block along one row
// and come down along the next, so every difference between neighbours fits
// the DC code (11 bits), but at the second row's start, where a restart
// makes the difference the value itself (4200), none does.
std::vector<uint8_t> JpegRowRestartsCannotEncode();

// A record with any header fields (lying ones included) and valid checksums:
// the header CRC and the payload CRC are computed over what is written. The
// header's payload_length is used as given when non-zero, else payload.size().
std::vector<uint8_t> CraftRecord(RecordHeader header, std::span<const uint8_t> payload);

// Writes a one-split shard set at `root` (created): records[i] is sample i,
// stored as given (no checks), in `shards` shards; classes "c0".."c{n-1}".
// Returns the manifest it saved. Throws on failure.
struct TestShardSetSpec {
  std::string split = "train";
  std::string encoding = "png";
  uint32_t num_classes = 2;
  uint32_t shards = 1;
};
Manifest WriteShardSetForTest(const std::string& root,
                              const std::vector<std::vector<uint8_t>>& records,
                              const TestShardSetSpec& spec = {});

void WriteBytes(const std::string& path, const std::vector<uint8_t>& bytes);
void WriteText(const std::string& path, const std::string& text);

}  // namespace nl::testing
