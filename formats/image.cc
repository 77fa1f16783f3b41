#include "formats/image.h"

#include <cstring>
#include <string>

namespace nl {

std::string_view ImageFormatName(ImageFormat f) {
  switch (f) {
    case ImageFormat::kPng:
      return "PNG";
    case ImageFormat::kJpeg:
      return "JPEG";
    case ImageFormat::kGif:
      return "GIF";
    case ImageFormat::kBmp:
      return "BMP";
    case ImageFormat::kWebp:
      return "WebP";
    case ImageFormat::kTiff:
      return "TIFF";
    case ImageFormat::kPnm:
      return "PNM";
    case ImageFormat::kUnknown:
      break;
  }
  return "unknown";
}

ImageFormat DetectImageFormat(std::span<const uint8_t> b) {
  auto starts = [&](std::string_view magic, size_t at = 0) {
    return b.size() >= at + magic.size() &&
           std::memcmp(b.data() + at, magic.data(), magic.size()) == 0;
  };
  if (starts("\x89PNG\r\n\x1a\n")) return ImageFormat::kPng;
  if (starts("\xFF\xD8")) return ImageFormat::kJpeg;  // SOI
  if (starts("GIF87a") || starts("GIF89a")) return ImageFormat::kGif;
  if (starts("BM")) return ImageFormat::kBmp;
  if (starts("RIFF") && starts("WEBP", 8)) return ImageFormat::kWebp;
  if (starts(std::string_view("II*\0", 4)) || starts(std::string_view("MM\0*", 4)))
    return ImageFormat::kTiff;
  if (b.size() >= 2 && b[0] == 'P' && b[1] >= '1' && b[1] <= '6') return ImageFormat::kPnm;
  return ImageFormat::kUnknown;
}

namespace {
Status NotDecodable(std::span<const uint8_t> bytes, ImageFormat f) {
  if (bytes.empty()) return Status::Corruption("empty file (0 bytes)");
  if (f == ImageFormat::kUnknown) {
    return Status::Unsupported("not an image: the first bytes match no known image format");
  }
  return Status::Unsupported(std::string(ImageFormatName(f)) +
                             " images are not supported (only PNG and JPEG)");
}
}  // namespace

Result<ImageInfo> ReadImageInfo(std::span<const uint8_t> bytes) {
  switch (ImageFormat f = DetectImageFormat(bytes)) {
    case ImageFormat::kPng:
      return ReadPngInfo(bytes);
    case ImageFormat::kJpeg:
      return ReadJpegInfo(bytes);
    default:
      return NotDecodable(bytes, f);
  }
}

Status DecodeImageInto(std::span<const uint8_t> bytes, const DecodeLimits& limits, Image* out) {
  switch (ImageFormat f = DetectImageFormat(bytes)) {
    case ImageFormat::kPng:
      return DecodePngInto(bytes, limits, out);
    case ImageFormat::kJpeg:
      return DecodeJpegInto(bytes, limits, out);
    default:
      return NotDecodable(bytes, f);
  }
}

Status DecodeImageRegionInto(std::span<const uint8_t> bytes, const DecodeLimits& limits,
                             const PixelRect& region, DecodedRegion* out, int scale_eighths,
                             bool approximate) {
  if (DetectImageFormat(bytes) == ImageFormat::kJpeg)
    return DecodeJpegRegionInto(bytes, limits, region, out, scale_eighths, approximate);
  if (DetectImageFormat(bytes) == ImageFormat::kPng) return DecodePngRegionInto(bytes, limits, region, out);
  NL_RETURN_IF_ERROR(DecodeImageInto(bytes, limits, &out->image));
  out->x = out->y = 0;
  out->full_width = out->image_width = out->image.width;
  out->full_height = out->image_height = out->image.height;
  out->scale_eighths = 8;
  return Status::Ok();
}

Status CheckDecodedShape(const RecordHeader& header, uint32_t width, uint32_t height) {
  if (width != header.width || height != header.height) {
    return Status::Corruption("image decodes to " + std::to_string(width) + "x" + std::to_string(height) +
                              " but the header says " + std::to_string(header.width) + "x" +
                              std::to_string(header.height));
  }
  return Status::Ok();
}

Status CheckDecodedShape(const RecordHeader& header, const Image& image) {
  return CheckDecodedShape(header, image.width, image.height);
}

Status DecodeRecordImage(const RecordView& rec, const DecodeLimits& limits, Image* out) {
  if (rec.header.encoding == Encoding::kRaw) {
    out->width = rec.header.width;
    out->height = rec.header.height;
    out->pixels.assign(rec.payload.begin(), rec.payload.end());
    return Status::Ok();
  }
  NL_RETURN_IF_ERROR(DecodeImageInto(rec.payload, limits, out));
  return CheckDecodedShape(rec.header, *out);
}

Result<Image> DecodeImage(std::span<const uint8_t> bytes, const DecodeLimits& limits) {
  Image img;
  NL_RETURN_IF_ERROR(DecodeImageInto(bytes, limits, &img));
  return img;
}

}  // namespace nl
