#include "loader/pipeline/sample_path.h"

#include <algorithm>
#include <chrono>

namespace nl {
namespace {

using Clock = std::chrono::steady_clock;
uint64_t NanosSince(Clock::time_point t) {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t).count());
}

}  // namespace

SamplePath::SamplePath(const SplitReader& reader, const TransformConfig& transform,
                       const DecodeLimits& limits, bool pread_records)
    : reader_(&reader),
      txn_(reader.BeginRead()),
      transform_(transform),
      limits_(limits),
      pread_records_(pread_records) {}

Status SamplePath::Load(uint64_t epoch, uint64_t index, uint8_t* dst, int64_t* label,
                        SampleTimes* times, std::span<const uint8_t> staged) {
  SampleTimes t;
  const auto t0 = Clock::now();
  RecordLimits rl;
  rl.max_pixels = limits_.max_pixels;
  NL_ASSIGN_OR_RETURN(RecordView rec,
                      staged.empty() ? txn_.Read(index, rl, pread_records_ ? &record_ : nullptr)
                                     : txn_.Decode(index, staged, rl));
  const auto t1 = Clock::now();
  t.read_ns = NanosSince(t0);
  const int w = static_cast<int>(rec.header.width), h = static_cast<int>(rec.header.height);
  SampleGeometry g = transform_.Geometry(w, h, epoch, index);
  SourceView view{rec.payload.data(), w, h, 0, 0, w, h};
  if (rec.header.encoding != Encoding::kRaw) {
    // --decode fast or auto: a JPEG decoded at n/8 (its geometry scaled to
    // match), approximately (DecodeImageRegionInto).
    // The decoders go by the payload's bytes, and so does the scale.
    const DecodeChoice choice = DetectImageFormat(rec.payload) == ImageFormat::kJpeg
                                    ? transform_.ChooseDecode(g)
                                    : DecodeChoice{};
    const int n = choice.scale_eighths;
    int sw = w, sh = h;
    if (n < 8) g = SampleTransform::Scaled(g, w, h, n, &sw, &sh);
    int x, y, rw, rh;
    transform_.SourceRegion(g, sw, sh, &x, &y, &rw, &rh);
    const PixelRect region{static_cast<uint32_t>(x), static_cast<uint32_t>(y), static_cast<uint32_t>(rw),
                           static_cast<uint32_t>(rh)};
    Status st =
        DecodeImageRegionInto(rec.payload, limits_, region, &decoded_, n, choice.approximate);
    if (st.ok()) st = CheckDecodedShape(rec.header, decoded_.image_width, decoded_.image_height);
    const DecodedRegion& d = decoded_;
    if (st.ok() && (d.scale_eighths != n || d.full_width != static_cast<uint32_t>(sw) ||
                    d.full_height != static_cast<uint32_t>(sh) || d.x > region.x || d.y > region.y ||
                    d.x + d.image.width < region.x + region.w || d.y + d.image.height < region.y + region.h)) {
      st = Status::Internal("the region decode does not hold the crop");  // never: DecodeImageRegionInto's contract
    }
    if (!st.ok()) return st.WithContext(reader_->Where(index));
    view = SourceView{d.image.pixels.data(), sw, sh, static_cast<int>(d.x), static_cast<int>(d.y),
                      static_cast<int>(d.image.width), static_cast<int>(d.image.height)};
  }
  const auto t2 = Clock::now();
  t.decode_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(t2 - t1).count();
  transform_.Apply(view, g, dst);
  t.transform_ns = NanosSince(t2);
  *label = rec.header.label;
  if (times) {
    times->read_ns += t.read_ns;
    times->decode_ns += t.decode_ns;
    times->transform_ns += t.transform_ns;
  }
  return Status::Ok();
}

void SamplePath::Prefetch(std::span<const uint8_t> staged) {
  const size_t n = std::min<size_t>(staged.size(), 8 << 10);
  for (size_t off = 0; off < n; off += 64) __builtin_prefetch(staged.data() + off, 0, 3);
}

void SamplePath::Prefetch(uint64_t soon, uint64_t later) {
  if (pread_records_) return;
  txn_.PrefetchRecord(soon);
  txn_.PrefetchLocation(later);
}

}  // namespace nl
