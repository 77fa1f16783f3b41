#include "formats/record.h"

#include <cstring>
#include <string>

#include "formats/crc32c.h"

namespace nl {
namespace {

void Put16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
}
void Put32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint16_t Get16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
uint32_t Get32(const uint8_t* p) {
  return uint32_t{p[0]} | (uint32_t{p[1]} << 8) | (uint32_t{p[2]} << 16) | (uint32_t{p[3]} << 24);
}

// Header layout (little-endian), 32 bytes:
//   0 magic u32 | 4 version u16 | 6 encoding u8 | 7 channels u8 | 8 label u32
//  12 width u32 | 16 height u32 | 20 payload_length u32 | 24 payload_crc u32
//  28 header_crc u32 (CRC32C of bytes 0..27)
void WriteHeader(const RecordHeader& h, uint32_t magic, uint16_t version, uint8_t* p) {
  Put32(p + 0, magic);
  Put16(p + 4, version);
  p[6] = static_cast<uint8_t>(h.encoding);
  p[7] = h.channels;
  Put32(p + 8, h.label);
  Put32(p + 12, h.width);
  Put32(p + 16, h.height);
  Put32(p + 20, h.payload_length);
  Put32(p + 24, h.payload_crc);
  Put32(p + 28, Crc32c(0, p, 28));
}

std::string Hex(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

}  // namespace

std::string_view EncodingName(Encoding e) {
  switch (e) {
    case Encoding::kRaw:
      return "raw";
    case Encoding::kPng:
      return "png";
    case Encoding::kJpeg:
      return "jpeg";
  }
  return "unknown";
}

Result<Encoding> ParseEncoding(std::string_view name) {
  if (name == "raw") return Encoding::kRaw;
  if (name == "png") return Encoding::kPng;
  if (name == "jpeg") return Encoding::kJpeg;
  return Status::InvalidArgument("unknown encoding '" + std::string(name) + "'");
}

void EncodeHeaderForTest(const RecordHeader& h, uint32_t magic, uint16_t version, uint8_t* out32) {
  WriteHeader(h, magic, version, out32);
}

void EncodeRecord(RecordHeader header, std::span<const uint8_t> payload,
                  std::vector<uint8_t>* out) {
  header.payload_length = static_cast<uint32_t>(payload.size());
  header.payload_crc = Crc32c(0, payload.data(), payload.size());
  out->resize(kRecordHeaderSize + payload.size());
  WriteHeader(header, kRecordMagic, kRecordVersion, out->data());
  if (!payload.empty())
    std::memcpy(out->data() + kRecordHeaderSize, payload.data(), payload.size());
}

Result<RecordView> DecodeRecord(std::span<const uint8_t> value, const RecordLimits& limits) {
  if (value.size() < kRecordHeaderSize) {
    return Status::Corruption("record is " + std::to_string(value.size()) +
                              " bytes, shorter than its " + std::to_string(kRecordHeaderSize) +
                              "-byte header");
  }
  const uint8_t* p = value.data();
  if (uint32_t magic = Get32(p); magic != kRecordMagic) {
    return Status::Corruption("bad record magic " + Hex(magic) + " (expected " + Hex(kRecordMagic) +
                              ")");
  }
  if (uint16_t version = Get16(p + 4); version != kRecordVersion) {
    return Status::Corruption("unsupported record version " + std::to_string(version) +
                              " (this build reads version " + std::to_string(kRecordVersion) + ")");
  }
  if (uint32_t stored = Get32(p + 28), actual = Crc32c(0, p, 28); stored != actual) {
    return Status::Corruption("record header checksum mismatch: stored " + Hex(stored) +
                              ", computed " + Hex(actual));
  }
  RecordView v;
  RecordHeader& h = v.header;
  if (p[6] > static_cast<uint8_t>(Encoding::kJpeg)) {
    return Status::Corruption("record encoding " + std::to_string(p[6]) +
                              " is not raw(0), png(1) or jpeg(2)");
  }
  h.encoding = static_cast<Encoding>(p[6]);
  h.channels = p[7];
  h.label = Get32(p + 8);
  h.width = Get32(p + 12);
  h.height = Get32(p + 16);
  h.payload_length = Get32(p + 20);
  h.payload_crc = Get32(p + 24);
  if (h.channels != 3) {
    return Status::Corruption("record has " + std::to_string(h.channels) +
                              " channels (expected 3)");
  }
  if (h.width == 0 || h.height == 0 || h.width > kMaxRecordDim || h.height > kMaxRecordDim) {
    return Status::Corruption("impossible image size " + std::to_string(h.width) + "x" +
                              std::to_string(h.height) + " (each side must be 1.." +
                              std::to_string(kMaxRecordDim) + ")");
  }
  if (uint64_t px = uint64_t{h.width} * h.height; px > limits.max_pixels) {
    return Status::ResourceExhausted("image of " + std::to_string(h.width) + "x" +
                                     std::to_string(h.height) + " exceeds the limit of " +
                                     std::to_string(limits.max_pixels) + " pixels");
  }
  if (limits.num_classes != 0 && h.label >= limits.num_classes) {
    return Status::Corruption("label " + std::to_string(h.label) + " out of range (" +
                              std::to_string(limits.num_classes) + " classes)");
  }
  const size_t have = value.size() - kRecordHeaderSize;
  if (h.payload_length != have) {
    return Status::Corruption("payload length " + std::to_string(h.payload_length) +
                              " in header, but the record holds " + std::to_string(have) +
                              " payload bytes");
  }
  if (h.encoding == Encoding::kRaw) {
    const uint64_t want = uint64_t{h.width} * h.height * h.channels;
    if (want != h.payload_length) {
      return Status::Corruption("raw payload of " + std::to_string(h.payload_length) +
                                " bytes does not match " + std::to_string(h.width) + "x" +
                                std::to_string(h.height) + "x3 = " + std::to_string(want));
    }
  }
  v.payload = value.subspan(kRecordHeaderSize);
  if (uint32_t actual = Crc32c(0, v.payload.data(), v.payload.size()); actual != h.payload_crc) {
    return Status::Corruption("payload checksum mismatch: stored " + Hex(h.payload_crc) +
                              ", computed " + Hex(actual));
  }
  return v;
}

}  // namespace nl
