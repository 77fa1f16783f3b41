// JPEG decode and encode through the TurboJPEG API of libjpeg-turbo.
#include <turbojpeg.h>

#include <memory>
#include <string>

#include "formats/image.h"
#include "formats/record.h"

namespace nl {
namespace {

struct TjDeleter {
  void operator()(void* h) const {
    if (h) tjDestroy(h);
  }
};
using TjHandle = std::unique_ptr<void, TjDeleter>;

// One decompressor per thread: creating one costs more than decoding a small
// image. libjpeg keeps state from a failed decode (quantisation tables, the
// error state), which then fails the thread's next images too ("Bogus DQT
// index", "empty image"): after any failure the handle is replaced.
TjHandle& ThreadDecompressorSlot() {
  thread_local TjHandle handle;
  return handle;
}
tjhandle ThreadDecompressor() {
  TjHandle& h = ThreadDecompressorSlot();
  if (!h) h.reset(tjInitDecompress());
  return h.get();
}
void DiscardThreadDecompressor() { ThreadDecompressorSlot().reset(); }

// Runs `body` with this thread's decompressor; a failed body discards it.
template <typename Body>
auto WithDecompressor(Body body) -> decltype(body(tjhandle{})) {
  tjhandle h = ThreadDecompressor();
  if (!h) return Status::Internal("TurboJPEG: cannot create a decompressor");
  auto result = body(h);
  if (!result.ok()) DiscardThreadDecompressor();
  return result;
}

std::string TjError(tjhandle h) { return tjGetErrorStr2(h); }

Status ReadHeader(tjhandle h, std::span<const uint8_t> bytes, int* w, int* ht, int* subsamp,
                  int* colorspace) {
  if (tjDecompressHeader3(h, bytes.data(), bytes.size(), w, ht, subsamp, colorspace) != 0) {
    return Status::Corruption("corrupt JPEG: not a valid JPEG header (libjpeg: " + TjError(h) +
                              ")");
  }
  if (*w <= 0 || *ht <= 0) {
    return Status::Corruption("corrupt JPEG: not a valid JPEG header (it declares a " +
                              std::to_string(*w) + "x" + std::to_string(*ht) + " image)");
  }
  return Status::Ok();
}

// Pillow opens 4-component JPEGs as CMYK with Adobe's inverted convention
// ("CMYK;I") and converts CMYK -> RGB as R = (255-K) - (C*(255-K))/255,
// rounded with its MULDIV255. Reproduced here so pixels match exactly.
inline uint8_t MulDiv255(unsigned a, unsigned b) {
  const unsigned t = a * b + 128;
  return static_cast<uint8_t>(((t >> 8) + t) >> 8);
}
void InvertedCmykToRgb(const uint8_t* cmyk, size_t n, uint8_t* rgb) {
  for (size_t i = 0; i < n; ++i, cmyk += 4, rgb += 3) {
    const unsigned nk = cmyk[3];  // stored inverted: 255 - K
    rgb[0] = static_cast<uint8_t>(nk - MulDiv255(255u - cmyk[0], nk));
    rgb[1] = static_cast<uint8_t>(nk - MulDiv255(255u - cmyk[1], nk));
    rgb[2] = static_cast<uint8_t>(nk - MulDiv255(255u - cmyk[2], nk));
  }
}

}  // namespace

Result<ImageInfo> ReadJpegInfo(std::span<const uint8_t> bytes) {
  return WithDecompressor([&](tjhandle h) -> Result<ImageInfo> {
    int w = 0, ht = 0, ss = 0, cs = 0;
    NL_RETURN_IF_ERROR(ReadHeader(h, bytes, &w, &ht, &ss, &cs));
    return ImageInfo{ImageFormat::kJpeg, static_cast<uint32_t>(w), static_cast<uint32_t>(ht)};
  });
}

Status DecodeJpegInto(std::span<const uint8_t> bytes, const DecodeLimits& limits, Image* out) {
  return WithDecompressor([&](tjhandle h) -> Status {
    int w = 0, ht = 0, subsamp = 0, colorspace = 0;
    NL_RETURN_IF_ERROR(ReadHeader(h, bytes, &w, &ht, &subsamp, &colorspace));
    if (static_cast<uint64_t>(w) * ht > limits.max_pixels) {
      return Status::ResourceExhausted("JPEG of " + std::to_string(w) + "x" + std::to_string(ht) +
                                       " pixels exceeds the limit of " +
                                       std::to_string(limits.max_pixels) + " pixels");
    }
    // Warnings (e.g. "premature end of data segment") are errors: a damaged
    // image must not be packed as if it were whole.
    const int flags = TJFLAG_STOPONWARNING | TJFLAG_LIMITSCANS;
    const size_t npx = static_cast<size_t>(w) * ht;
    out->width = static_cast<uint32_t>(w);
    out->height = static_cast<uint32_t>(ht);
    out->pixels.resize(npx * 3);
    int rc;
    if (colorspace == TJCS_CMYK || colorspace == TJCS_YCCK) {
      std::vector<uint8_t> cmyk(npx * 4);
      rc = tjDecompress2(h, bytes.data(), bytes.size(), cmyk.data(), w, 0, ht, TJPF_CMYK, flags);
      if (rc == 0) InvertedCmykToRgb(cmyk.data(), npx, out->pixels.data());
    } else {
      rc = tjDecompress2(h, bytes.data(), bytes.size(), out->pixels.data(), w, 0, ht, TJPF_RGB,
                         flags);
    }
    if (rc != 0) return Status::Corruption("corrupt JPEG: " + TjError(h));
    return Status::Ok();
  });
}

Result<std::vector<uint8_t>> EncodeJpeg(std::span<const uint8_t> pixels, uint32_t width,
                                        uint32_t height, int channels,
                                        const JpegEncodeOptions& options) {
  int pf;
  switch (channels) {
    case 1:
      pf = TJPF_GRAY;
      break;
    case 3:
      pf = TJPF_RGB;
      break;
    case 4:
      pf = TJPF_CMYK;
      break;
    default:
      return Status::InvalidArgument("EncodeJpeg: channels must be 1, 3 or 4");
  }
  if (pixels.size() != size_t{width} * height * channels) {
    return Status::InvalidArgument("EncodeJpeg: pixel buffer size does not match the image");
  }
  int ss = TJSAMP_420;
  switch (options.subsampling) {
    case ChromaSubsampling::k444:
      ss = TJSAMP_444;
      break;
    case ChromaSubsampling::k422:
      ss = TJSAMP_422;
      break;
    case ChromaSubsampling::k420:
      ss = TJSAMP_420;
      break;
    case ChromaSubsampling::kGray:
      ss = TJSAMP_GRAY;
      break;
  }
  if (channels == 1) ss = TJSAMP_GRAY;
  TjHandle h(tjInitCompress());
  if (!h) return Status::Internal("TurboJPEG: cannot create a compressor");
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  const int flags = options.progressive ? TJFLAG_PROGRESSIVE : 0;
  if (tjCompress2(h.get(), pixels.data(), static_cast<int>(width), 0, static_cast<int>(height), pf,
                  &buf, &size, ss, options.quality, flags) != 0) {
    if (buf) tjFree(buf);
    return Status::Internal("JPEG encode failed: " + TjError(h.get()));
  }
  std::vector<uint8_t> out(buf, buf + size);
  tjFree(buf);
  return out;
}

}  // namespace nl
