// Record codec: round trip, and each corruption with its exact error
// (in the manner of leveldb's db/log_test.cc).
#include "formats/record.h"

#include <gtest/gtest.h>

namespace nl {
namespace {

std::vector<uint8_t> RawRecord(uint32_t w = 4, uint32_t h = 2, uint32_t label = 7) {
  std::vector<uint8_t> pixels(size_t{w} * h * 3);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<uint8_t>(i * 7);
  std::vector<uint8_t> out;
  RecordHeader hdr;
  hdr.label = label;
  hdr.encoding = Encoding::kRaw;
  hdr.width = w;
  hdr.height = h;
  EncodeRecord(hdr, pixels, &out);
  return out;
}

// Rewrites the header with the given fields (valid header CRC) over `rec`.
void Rewrite(std::vector<uint8_t>* rec, RecordHeader h, uint32_t magic = kRecordMagic,
             uint16_t version = kRecordVersion) {
  EncodeHeaderForTest(h, magic, version, rec->data());
}

RecordHeader HeaderOf(const std::vector<uint8_t>& rec) {
  Result<RecordView> v = DecodeRecord(rec);
  EXPECT_TRUE(v.ok()) << v.status().ToString();
  return v->header;
}

TEST(Record, RoundTrip) {
  std::vector<uint8_t> rec = RawRecord(4, 2, 7);
  ASSERT_EQ(rec.size(), kRecordHeaderSize + 24);
  Result<RecordView> v = DecodeRecord(rec, {.max_pixels = 100, .num_classes = 10});
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(v->header.label, 7u);
  EXPECT_EQ(v->header.encoding, Encoding::kRaw);
  EXPECT_EQ(v->header.width, 4u);
  EXPECT_EQ(v->header.height, 2u);
  EXPECT_EQ(v->payload.size(), 24u);
  EXPECT_EQ(v->payload.data(), rec.data() + kRecordHeaderSize);  // a view, not a copy
  EXPECT_EQ(v->payload[5], 35);
}

TEST(Record, LittleEndianLayout) {
  std::vector<uint8_t> rec = RawRecord(4, 2, 0x01020304);
  EXPECT_EQ(std::string(rec.begin(), rec.begin() + 4), "NLRC");
  EXPECT_EQ(rec[4], 1);  // version
  EXPECT_EQ(rec[5], 0);
  EXPECT_EQ(rec[8], 0x04);  // label, least significant byte first
  EXPECT_EQ(rec[11], 0x01);
  EXPECT_EQ(rec[12], 4);   // width
  EXPECT_EQ(rec[20], 24);  // payload length
}

TEST(Record, FlippedPayloadByte) {
  std::vector<uint8_t> rec = RawRecord();
  rec[kRecordHeaderSize + 3] ^= 0x10;
  Status s = DecodeRecord(rec).status();
  EXPECT_EQ(s.code(), StatusCode::kCorruption);
  EXPECT_NE(s.message().find("payload checksum mismatch"), std::string::npos) << s.ToString();
}

TEST(Record, FlippedHeaderByte) {
  std::vector<uint8_t> rec = RawRecord();
  rec[13] ^= 0x01;  // width
  Status s = DecodeRecord(rec).status();
  EXPECT_EQ(s.code(), StatusCode::kCorruption);
  EXPECT_NE(s.message().find("record header checksum mismatch"), std::string::npos) << s.ToString();
}

TEST(Record, TruncatedValue) {
  std::vector<uint8_t> rec = RawRecord();
  rec.resize(rec.size() - 5);
  Status s = DecodeRecord(rec).status();
  EXPECT_EQ(s.message(), "payload length 24 in header, but the record holds 19 payload bytes");
  rec.resize(20);
  EXPECT_EQ(DecodeRecord(rec).status().message(),
            "record is 20 bytes, shorter than its 32-byte header");
}

TEST(Record, WrongMagicAndVersion) {
  std::vector<uint8_t> rec = RawRecord();
  RecordHeader h = HeaderOf(rec);
  Rewrite(&rec, h, 0xDEADBEEF);
  EXPECT_EQ(DecodeRecord(rec).status().message(),
            "bad record magic 0xdeadbeef (expected 0x43524c4e)");
  Rewrite(&rec, h, kRecordMagic, 9);
  EXPECT_EQ(DecodeRecord(rec).status().message(),
            "unsupported record version 9 (this build reads version 1)");
}

TEST(Record, ImpossibleDimensionsAndLengths) {
  std::vector<uint8_t> rec = RawRecord();
  RecordHeader h = HeaderOf(rec);
  RecordHeader bad = h;
  bad.width = 0;
  Rewrite(&rec, bad);
  EXPECT_EQ(DecodeRecord(rec).status().message(),
            "impossible image size 0x2 (each side must be 1..1048576)");
  bad = h;
  bad.height = 5'000'000;
  Rewrite(&rec, bad);
  Status tall = DecodeRecord(rec).status();
  EXPECT_EQ(tall.code(), StatusCode::kCorruption);
  EXPECT_NE(tall.message().find("impossible image size "), std::string::npos) << tall.ToString();
  EXPECT_NE(tall.message().find("x5000000 (each side must be 1..1048576)"), std::string::npos)
      << tall.ToString();
  bad = h;
  bad.width = 8;  // raw payload no longer matches w*h*3
  Rewrite(&rec, bad);
  EXPECT_EQ(DecodeRecord(rec).status().message(),
            "raw payload of 24 bytes does not match 8x2x3 = 48");
  bad = h;
  bad.payload_length = 1u << 31;
  Rewrite(&rec, bad);
  EXPECT_EQ(DecodeRecord(rec).status().message(),
            "payload length 2147483648 in header, but the record holds 24 payload bytes");
  bad = h;
  bad.channels = 4;
  Rewrite(&rec, bad);
  EXPECT_EQ(DecodeRecord(rec).status().message(), "record has 4 channels (expected 3)");
  bad = h;
  bad.encoding = static_cast<Encoding>(9);
  Rewrite(&rec, bad);
  EXPECT_EQ(DecodeRecord(rec).status().message(),
            "record encoding 9 is not raw(0), png(1) or jpeg(2)");
}

TEST(Record, LabelAndPixelLimits) {
  std::vector<uint8_t> rec = RawRecord(4, 2, 12);
  EXPECT_EQ(DecodeRecord(rec, {.num_classes = 10}).status().message(),
            "label 12 out of range (10 classes)");
  Status s = DecodeRecord(rec, {.max_pixels = 7}).status();
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(s.message(), "image of 4x2 exceeds the limit of 7 pixels");
}

}  // namespace
}  // namespace nl
