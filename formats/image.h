// Decoded images and the decoders' shared vocabulary.
//
// Every decoder yields 8-bit RGB, interleaved, row-major, exactly as Pillow's
// `Image.open(f).convert("RGB")` would (see FORMAT.md, "Decoded pixels").
// The format is found from the bytes, never from a file name.
//
//   Result<Image> img = DecodeImage(bytes, {.max_pixels = 16 << 20});
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "formats/record.h"
#include "base/status.h"

namespace nl {

struct Image {
  uint32_t width = 0;
  uint32_t height = 0;
  std::vector<uint8_t> pixels;  // width * height * 3 bytes, RGB
};

enum class ImageFormat { kUnknown, kPng, kJpeg, kGif, kBmp, kWebp, kTiff, kPnm };
std::string_view ImageFormatName(ImageFormat f);
// From magic bytes alone.
ImageFormat DetectImageFormat(std::span<const uint8_t> bytes);

struct DecodeLimits {
  // Checked from the header, before any pixel buffer is allocated.
  uint64_t max_pixels = kDefaultMaxPixels;
};

struct ImageInfo {
  ImageFormat format = ImageFormat::kUnknown;
  uint32_t width = 0;
  uint32_t height = 0;
};

// Header only: format and size. Errors as DecodeImage's.
Result<ImageInfo> ReadImageInfo(std::span<const uint8_t> bytes);

// Decodes a PNG or JPEG to RGB. Errors: Unsupported (another or unknown
// format), Corruption (truncated or damaged data, including libjpeg warnings
// such as premature end of data), ResourceExhausted (over limits.max_pixels).
Result<Image> DecodeImage(std::span<const uint8_t> bytes, const DecodeLimits& limits = {});
// As DecodeImage, reusing out->pixels' capacity.
Status DecodeImageInto(std::span<const uint8_t> bytes, const DecodeLimits& limits, Image* out);

// A rectangle of an image, in pixels: columns [x, x + w), rows [y, y + h).
struct PixelRect {
  uint32_t x = 0, y = 0, w = 0, h = 0;
};

// What a region decode gave: `image` holds the pixels of the full image's
// columns [x, x + image.width) and rows [y, y + image.height), a rectangle
// that contains the region asked for (clipped to the image); the full image
// is full_width x full_height.
struct DecodedRegion {
  Image image;
  uint32_t x = 0, y = 0;
  uint32_t full_width = 0, full_height = 0;  // at the scale decoded
  int scale_eighths = 8;  // the scale decoded: full_width = ceil(image_width * scale_eighths / 8)
  uint32_t image_width = 0, image_height = 0;  // the image's own size
  // Output rows at the top whose entropy-coded data was not read at all: a
  // JPEG whose scan restarts at row starts is decoded from the restart
  // marker above the region (0: from the top).
  uint32_t cut_rows = 0;
};

// Decodes at least `region` of an image; its pixels are identical to the
// same pixels of DecodeImageInto's. A JPEG's iMCU rows above the region are
// entropy-decoded only (jpeg_skip_scanlines), its columns outside are not
// transformed (jpeg_crop_scanline), and decoding stops after the region's
// last row, so a JPEG damaged or cut short below the region decodes (the
// packer and `verify` decode every image whole). A PNG decodes the region's
// rows, whole, and stops after the last (DecodePngRegionInto). An empty
// region (w or h 0) or one outside the image asks for the whole image.
// `scale_eighths` (1..8): a JPEG is decoded at that scale, in libjpeg's DCT
// domain (scale_num / 8: the image is then ceil(w * N / 8) wide), and the
// region is in that scaled image's pixels; its pixels are the same region
// of the full decode at that scale. Other formats decode at full scale
// (out->scale_eighths says which). Errors as DecodeImageInto's.
// `approximate` (--decode fast): a JPEG's chroma is upsampled by replication
// (libjpeg's merged upsampling, not its "fancy" interpolation) and the
// region gets no margin, so its pixels are close to, not equal to, the full
// decode's; other formats are unaffected.
Status DecodeImageRegionInto(std::span<const uint8_t> bytes, const DecodeLimits& limits,
                             const PixelRect& region, DecodedRegion* out, int scale_eighths = 8,
                             bool approximate = false);
Status DecodeJpegRegionInto(std::span<const uint8_t> bytes, const DecodeLimits& limits,
                            const PixelRect& region, DecodedRegion* out, int scale_eighths = 8,
                            bool approximate = false);

// That a record's decoded payload has the size its header states: Corruption
// "image decodes to WxH but the header says WxH" otherwise (the caller adds
// where the record is). Readers that trust the header's shape call this.
Status CheckDecodedShape(const RecordHeader& header, const Image& image);

// A record's pixels, whole: raw payloads copied, PNG and JPEG decoded, and
// the size checked against the header (CheckDecodedShape). `verify` and
// `export` read records this way; the loader's sample path decodes only the
// crop's region (DecodeImageRegionInto) and checks the same way.
Status DecodeRecordImage(const RecordView& rec, const DecodeLimits& limits, Image* out);
Status CheckDecodedShape(const RecordHeader& header, uint32_t width, uint32_t height);

// Format-specific entry points (DecodeImage dispatches to these).
Status DecodePngInto(std::span<const uint8_t> bytes, const DecodeLimits& limits, Image* out);
// As DecodeImageRegionInto for a PNG: whole rows, from the region's first to
// its last, inflating no further (the rows above it are inflated, not kept);
// an interlaced or 16-bit gray PNG decodes whole.
Status DecodePngRegionInto(std::span<const uint8_t> bytes, const DecodeLimits& limits,
                           const PixelRect& region, DecodedRegion* out);
Status DecodeJpegInto(std::span<const uint8_t> bytes, const DecodeLimits& limits, Image* out);
Result<ImageInfo> ReadPngInfo(std::span<const uint8_t> bytes);
Result<ImageInfo> ReadJpegInfo(std::span<const uint8_t> bytes);

enum class ChromaSubsampling { k444, k422, k420, kGray };
struct JpegEncodeOptions {
  int quality = 95;
  ChromaSubsampling subsampling = ChromaSubsampling::k420;
  bool progressive = false;
};
// Encodes interleaved pixels with `channels` = 1 (gray), 3 (RGB) or 4 (CMYK,
// stored as given, Adobe-style). Used by tests and tools.
Result<std::vector<uint8_t>> EncodeJpeg(std::span<const uint8_t> pixels, uint32_t width,
                                        uint32_t height, int channels,
                                        const JpegEncodeOptions& options = {});

// The same JPEG with a restart marker at the start of every row of MCUs, so
// that a region decode skips the entropy decoding of the rows above it
// (pack_tool --jpeg-restarts). Lossless: the coefficients, quantisation
// tables and sampling are copied, so the pixels decoded are the same; the
// Huffman tables are optimised and the markers (APPn, COM) copied. A
// progressive or arithmetic-coded JPEG comes back unchanged (its scans
// cannot be cut by row), as does one that already restarts at every row.
// Corruption as the decoders', for a file libjpeg cannot read whole;
// ResourceExhausted over the pixel limit (its coefficients are held whole).
Result<std::vector<uint8_t>> AddJpegRowRestarts(std::span<const uint8_t> bytes,
                                                const DecodeLimits& limits = {});

// Encodes RGB as an 8-bit, non-interlaced PNG (zlib level 0-9).
Result<std::vector<uint8_t>> EncodePng(const Image& img, int compression_level = 6);

}  // namespace nl
