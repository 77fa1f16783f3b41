// Record codec: one sample as stored in a shard (spec: formats/FORMAT.md).
//
//   std::vector<uint8_t> value;
//   EncodeRecord({.label = 3, .encoding = Encoding::kPng, .width = 32, .height = 32},
//                png_bytes, &value);
//   Result<RecordView> r = DecodeRecord(value);   // checks every field and the CRCs
//   if (r.ok()) Decode(r->payload);               // payload points into `value`
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace nl {

enum class Encoding : uint8_t {
  kRaw = 0,   // 8-bit RGB, row-major, interleaved (HWC)
  kPng = 1,   // a PNG file's bytes
  kJpeg = 2,  // a JPEG file's bytes
};
std::string_view EncodingName(Encoding e);
Result<Encoding> ParseEncoding(std::string_view name);

inline constexpr uint32_t kRecordMagic = 0x4352'4C4Eu;  // bytes "NLRC"
inline constexpr uint16_t kRecordVersion = 1;
inline constexpr size_t kRecordHeaderSize = 32;
inline constexpr uint32_t kMaxRecordDim = 1u << 20;
// The pixel limit (width x height) used by default everywhere an image is
// decoded or a record read: packing, verify, export and the loaders. It is
// Pillow's: Image.open refuses an image of more than 2 x MAX_IMAGE_PIXELS
// (2 x 89,478,485) pixels as a decompression bomb, so what trains under
// torchvision packs here. `--max-megapixels` changes it (megapixels are 2^20
// pixels); kDefaultMaxMegapixels is the default rounded up to them.
inline constexpr uint64_t kDefaultMaxPixels = 2 * 89'478'485ull;
inline constexpr uint64_t kDefaultMaxMegapixels = (kDefaultMaxPixels + (1u << 20) - 1) >> 20;

struct RecordHeader {
  uint32_t label = 0;
  Encoding encoding = Encoding::kRaw;
  uint32_t width = 0;
  uint32_t height = 0;
  uint8_t channels = 3;
  uint32_t payload_length = 0;  // filled in by EncodeRecord
  uint32_t payload_crc = 0;     // filled in by EncodeRecord
};

struct RecordLimits {
  uint64_t max_pixels = kDefaultMaxPixels;  // width * height
  uint32_t num_classes = 0;                 // labels must be < this; 0: not checked
};

// A decoded record. `payload` points into the bytes given to DecodeRecord and
// is valid as long as they are (for a shard value: its read transaction).
struct RecordView {
  RecordHeader header;
  std::span<const uint8_t> payload;
};

// Replaces *out with header + payload. The header's payload_length and
// payload_crc are computed here.
void EncodeRecord(RecordHeader header, std::span<const uint8_t> payload, std::vector<uint8_t>* out);

// Checks, in this order: size >= header, magic, version, header CRC, encoding,
// channels, dimensions and pixel limit, label, payload length (against the
// value size, and for raw against width*height*channels), payload CRC.
// Each failure is a Corruption (ResourceExhausted for the pixel limit) that
// names the field and both values.
Result<RecordView> DecodeRecord(std::span<const uint8_t> value, const RecordLimits& limits = {});

// Writes a header with arbitrary fields and a correct header CRC, without any
// checks. For tests that build impossible records.
void EncodeHeaderForTest(const RecordHeader& h, uint32_t magic, uint16_t version, uint8_t* out32);

}  // namespace nl
