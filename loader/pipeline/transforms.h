// Per-sample transforms: crop / resize / flip into one slot of a batch.
//
// Eval: resize only, Pillow-exact (see resize.h), so the pixels equal
// torchvision's on the PIL image:
//   squash        = Resize((S, S))
//   shorter-crop  = Resize(S) then CenterCrop(S)
// Train adds, in this order: pad-and-random-crop (--pad-crop P: zero padding
// P on each side, then a random crop of the original size), or
// random-resized-crop (torchvision's scale and ratio parameters), then a
// random horizontal flip (p = 0.5; applied to the crop before resizing,
// which is cheaper and equal up to rounding). Every random choice comes from
// (seed, epoch, sample index): the same sample in the same epoch gets the
// same bytes whatever the thread count.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "formats/resize.h"

namespace nl {

enum class ResizeMode { kSquash, kShorterCrop };
// How a JPEG is decoded: exact (the crop's region at full scale: the pixels
// of a full decode), fast (that region scaled down in libjpeg's DCT domain
// by 1/2, 1/4 or 1/8 as far as the crop stays at least the resize's size,
// its chroma upsampled by replication, then resized: not Pillow's bytes;
// on photographs 0.4 levels off on average at 224 px, about 2 at 32-64 px,
// see docs/DECODE.md), or auto: per sample, fast at the smallest scale that
// keeps the crop at least TransformConfig::auto_min_ratio times the
// resize's size, and exact where no scale below full does.
enum class DecodeMode { kExact, kFast, kAuto };
Result<DecodeMode> ParseDecodeMode(const std::string& s);  // "exact", "fast" or "auto"
const char* DecodeModeName(DecodeMode m);
// The ratio auto keeps a scaled crop above (docs/DECODE.md: where the mean
// difference from exact stays under 2 levels at every size measured).
inline constexpr double kAutoMinRatio = 2.0;
enum class Layout { kNCHW, kNHWC };
Result<ResizeMode> ParseResizeMode(const std::string& s);
Result<Layout> ParseLayout(const std::string& s);

struct TransformConfig {
  int image_size = 224;
  ResizeMode resize = ResizeMode::kSquash;
  // kShorterCrop: the shorter side becomes resize_size, then the centre
  // image_size square is kept (torchvision Resize(R) + CenterCrop(S);
  // ImageNet's eval: 256 for 224). 0: image_size.
  int resize_size = 0;
  bool train = false;  // augment (otherwise eval: resize only)
  int pad_crop = 0;    // train: pad then random crop
  bool random_resized_crop = false;
  double rrc_scale[2] = {0.08, 1.0};
  double rrc_ratio[2] = {3.0 / 4.0, 4.0 / 3.0};
  bool flip = true;  // train: random horizontal flip
  DecodeMode decode = DecodeMode::kExact;
  double auto_min_ratio = kAutoMinRatio;  // DecodeMode::kAuto's
  Layout layout = Layout::kNCHW;
  bool normalize = false;  // float32 (x/255 - mean) / std instead of uint8
  std::array<float, 3> mean = {0.485f, 0.456f, 0.406f};
  std::array<float, 3> std = {0.229f, 0.224f, 0.225f};
  uint64_t seed = 0;
  Isa isa = BestIsa();
};

// The geometry chosen for one sample (for tests and preview).
struct SampleGeometry {
  int crop_x = 0, crop_y = 0, crop_w = 0, crop_h = 0;  // in the (padded) source
  int pad = 0;
  bool flip = false;
  int full_w = 0, full_h = 0;  // size the crop is resized to
  int out_x = 0, out_y = 0;    // window of that resize that is kept (S x S)
};

// How one sample's JPEG is decoded (SampleTransform::ChooseDecode): at
// scale_eighths / 8, in libjpeg's DCT domain, with chroma by replication
// and no margin when `approximate` (DecodeImageRegionInto).
struct DecodeChoice {
  int scale_eighths = 8;
  bool approximate = false;
};

// The source Apply reads: a full image of w x h whose columns
// [x0, x0 + view_w) and rows [y0, y0 + view_h) `rgb` holds (RGB, rows of
// view_w pixels); the whole image when x0 = y0 = 0 and view_w/h = w/h, else
// what a region decode gave (DecodeImageRegionInto).
struct SourceView {
  const uint8_t* rgb = nullptr;
  int w = 0, h = 0;
  int x0 = 0, y0 = 0, view_w = 0, view_h = 0;
};

class SampleTransform {
 public:
  explicit SampleTransform(TransformConfig c);
  const TransformConfig& config() const { return c_; }
  // Bytes one sample occupies in a batch: S*S*3, times 4 with normalize.
  size_t SampleBytes() const;

  SampleGeometry Geometry(int w, int h, uint64_t epoch, uint64_t index) const;
  // Transforms an RGB image (HWC, w x h) into `out` (SampleBytes() bytes, in
  // the configured layout). Thread-compatible: one SampleTransform per thread.
  void Apply(const uint8_t* rgb, int w, int h, uint64_t epoch, uint64_t index, uint8_t* out);
  // The pixels of a w x h source that geometry `g` reads: the resize's taps
  // for the kept window (shorter-crop keeps the middle of its resize, so
  // the sides of a wide image are never read), within the crop, clipped to
  // the image (empty, w or h 0, when only padding is read). What a region
  // decode is asked for.
  void SourceRegion(const SampleGeometry& g, int w, int h, int* x, int* y, int* rw, int* rh);
  // How a JPEG of this geometry is decoded. kExact: at full scale, exactly.
  // kFast: approximately, at the smallest scale of 1, 2, 4 and 8 eighths
  // that keeps the crop at least the resize's size on both axes. kAuto:
  // approximately at the smallest scale below 8 that keeps it at least
  // auto_min_ratio times that size, else exactly at full scale. A padded
  // crop is decoded at full scale (approximately with kFast).
  DecodeChoice ChooseDecode(const SampleGeometry& g) const;
  // Geometry g (of a w x h source) for that source decoded at n/8 (its
  // size *sw x *sh): the crop scaled, the output unchanged.
  static SampleGeometry Scaled(const SampleGeometry& g, int w, int h, int n, int* sw, int* sh);
  // As Apply, with the geometry given and from a view that holds at least
  // SourceRegion(g) of the image.
  void Apply(const SourceView& src, const SampleGeometry& g, uint8_t* out);

 private:
  TransformConfig c_;
  PlaneResizer resizer_;
  ResizeAxis probe_;  // SourceRegion's scratch
  std::vector<uint8_t> planes_;  // source crop as 3 planes
  std::vector<uint8_t> staged_;  // resized planes, before interleave / normalize
  std::array<std::array<float, 256>, 3> lut_{};
};

}  // namespace nl
