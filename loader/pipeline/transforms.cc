#include "loader/pipeline/transforms.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "loader/pipeline/random.h"

namespace nl {

Result<ResizeMode> ParseResizeMode(const std::string& s) {
  if (s == "squash") return ResizeMode::kSquash;
  if (s == "shorter-crop") return ResizeMode::kShorterCrop;
  return Status::InvalidArgument("unknown resize mode '" + s + "' (use squash or shorter-crop)");
}

Result<Layout> ParseLayout(const std::string& s) {
  if (s == "nchw" || s == "NCHW") return Layout::kNCHW;
  if (s == "nhwc" || s == "NHWC") return Layout::kNHWC;
  return Status::InvalidArgument("unknown layout '" + s + "' (use nchw or nhwc)");
}

Result<DecodeMode> ParseDecodeMode(const std::string& s) {
  if (s == "exact") return DecodeMode::kExact;
  if (s == "fast") return DecodeMode::kFast;
  if (s == "auto") return DecodeMode::kAuto;
  return Status::InvalidArgument("unknown decode mode '" + s + "' (use exact, fast or auto)");
}

const char* DecodeModeName(DecodeMode m) {
  switch (m) {
    case DecodeMode::kFast:
      return "fast";
    case DecodeMode::kAuto:
      return "auto";
    case DecodeMode::kExact:
      break;
  }
  return "exact";
}

namespace {
// The smallest n of 1, 2, 4, 8 with crop * n / 8 >= ratio * full along both
// axes (8 where none is). (Not 3, 5, 6 or 7: libjpeg-turbo's IDCTs for
// those scales, and for the chroma's 10x10 to 14x14 that go with them, are
// plain C, and on our photo set a full-scale SIMD decode and a longer
// resize were faster.)
int SmallestScale(const SampleGeometry& g, double ratio) {
  int n = 1;
  while (n < 8 && (static_cast<double>(g.crop_w) * n < ratio * 8.0 * g.full_w ||
                   static_cast<double>(g.crop_h) * n < ratio * 8.0 * g.full_h)) {
    n *= 2;
  }
  return n;
}
}  // namespace

DecodeChoice SampleTransform::ChooseDecode(const SampleGeometry& g) const {
  if (c_.decode == DecodeMode::kExact) return {8, false};
  const bool padded = g.pad != 0 || g.crop_w < 1 || g.crop_h < 1;
  if (c_.decode == DecodeMode::kFast) return {padded ? 8 : SmallestScale(g, 1.0), true};
  const int n = padded ? 8 : SmallestScale(g, c_.auto_min_ratio);
  return n < 8 ? DecodeChoice{n, true} : DecodeChoice{8, false};
}

SampleGeometry SampleTransform::Scaled(const SampleGeometry& g, int w, int h, int n, int* sw, int* sh) {
  *sw = static_cast<int>((int64_t{w} * n + 7) / 8);
  *sh = static_cast<int>((int64_t{h} * n + 7) / 8);
  SampleGeometry s = g;
  auto axis = [n](int pos, int len, int size, int* spos, int* slen) {
    int lo = static_cast<int>(std::lround(pos * n / 8.0)), hi = static_cast<int>(std::lround((pos + len) * n / 8.0));
    lo = std::clamp(lo, 0, size - 1);
    hi = std::clamp(hi, lo + 1, size);
    *spos = lo;
    *slen = hi - lo;
  };
  axis(g.crop_x, g.crop_w, *sw, &s.crop_x, &s.crop_w);
  axis(g.crop_y, g.crop_h, *sh, &s.crop_y, &s.crop_h);
  return s;
}

SampleTransform::SampleTransform(TransformConfig c) : c_(c) {
  for (int ch = 0; ch < 3; ++ch)
    for (int v = 0; v < 256; ++v) lut_[ch][v] = (v / 255.0f - c_.mean[ch]) / c_.std[ch];
}

size_t SampleTransform::SampleBytes() const {
  const size_t px = static_cast<size_t>(c_.image_size) * c_.image_size * 3;
  return c_.normalize ? px * sizeof(float) : px;
}

SampleGeometry SampleTransform::Geometry(int w, int h, uint64_t epoch, uint64_t index) const {
  SampleGeometry g;
  const int s = c_.image_size;
  Rng rng(c_.seed, epoch, index);
  g.crop_w = w;
  g.crop_h = h;
  if (c_.train && c_.pad_crop > 0) {
    g.pad = c_.pad_crop;
    g.crop_x = static_cast<int>(rng.Below(static_cast<uint64_t>(2 * g.pad + 1)));
    g.crop_y = static_cast<int>(rng.Below(static_cast<uint64_t>(2 * g.pad + 1)));
  }
  if (c_.train && c_.random_resized_crop) {
    // torchvision.transforms.RandomResizedCrop.get_params, with our generator.
    const double area = static_cast<double>(g.crop_w) * g.crop_h;
    const double lr0 = std::log(c_.rrc_ratio[0]), lr1 = std::log(c_.rrc_ratio[1]);
    bool found = false;
    for (int attempt = 0; attempt < 10 && !found; ++attempt) {
      const double target = area * rng.Uniform(c_.rrc_scale[0], c_.rrc_scale[1]);
      const double aspect = std::exp(rng.Uniform(lr0, lr1));
      const int cw = static_cast<int>(std::lround(std::sqrt(target * aspect)));
      const int ch = static_cast<int>(std::lround(std::sqrt(target / aspect)));
      if (cw > 0 && cw <= g.crop_w && ch > 0 && ch <= g.crop_h) {
        g.crop_x += static_cast<int>(rng.Below(static_cast<uint64_t>(g.crop_w - cw + 1)));
        g.crop_y += static_cast<int>(rng.Below(static_cast<uint64_t>(g.crop_h - ch + 1)));
        g.crop_w = cw;
        g.crop_h = ch;
        found = true;
      }
    }
    if (!found) {  // fall back to a centre crop within the ratio bounds
      const double in_ratio = static_cast<double>(g.crop_w) / g.crop_h;
      int cw = g.crop_w, ch = g.crop_h;
      if (in_ratio < c_.rrc_ratio[0]) {
        ch = static_cast<int>(std::lround(cw / c_.rrc_ratio[0]));
      } else if (in_ratio > c_.rrc_ratio[1]) {
        cw = static_cast<int>(std::lround(ch * c_.rrc_ratio[1]));
      }
      g.crop_x += (g.crop_w - cw) / 2;
      g.crop_y += (g.crop_h - ch) / 2;
      g.crop_w = cw;
      g.crop_h = ch;
    }
    g.full_w = g.full_h = s;
  } else if (c_.resize == ResizeMode::kShorterCrop) {
    // torchvision Resize(r): the shorter side becomes r (resize_size, else
    // s), the longer int(r * long / short); then CenterCrop(s) with Python's
    // round().
    const int r = std::max(s, c_.resize_size);
    const bool wide = g.crop_w >= g.crop_h;
    const int shorter = wide ? g.crop_h : g.crop_w, longer = wide ? g.crop_w : g.crop_h;
    const int new_long = static_cast<int>(static_cast<double>(r) * longer / shorter);
    g.full_w = wide ? new_long : r;
    g.full_h = wide ? r : new_long;
    auto py_round_half = [](int diff) {  // round(diff / 2.0), half to even
      return (diff % 2 == 0) ? diff / 2 : ((diff / 2) % 2 == 0 ? diff / 2 : diff / 2 + 1);
    };
    g.out_x = py_round_half(g.full_w - s);
    g.out_y = py_round_half(g.full_h - s);
  } else {
    g.full_w = g.full_h = s;
  }
  if (c_.train && c_.flip) g.flip = (rng.Next() >> 63) != 0;
  return g;
}

void SampleTransform::Apply(const uint8_t* rgb, int w, int h, uint64_t epoch, uint64_t index,
                            uint8_t* out) {
  Apply(SourceView{rgb, w, h, 0, 0, w, h}, Geometry(w, h, epoch, index), out);
}

namespace {
// The inputs [*lo, *hi) an axis's outputs read.
void TapRange(const ResizeAxis& a, int* lo, int* hi) {
  *lo = a.in_size;
  *hi = 0;
  for (size_t o = 0; o < a.first.size(); ++o) {
    if (a.count[o] <= 0) continue;
    *lo = std::min(*lo, a.first[o]);
    *hi = std::max(*hi, a.first[o] + a.count[o]);
  }
  if (*hi <= *lo) *lo = *hi = 0;
}
}  // namespace

void SampleTransform::SourceRegion(const SampleGeometry& g, int w, int h, int* x, int* y, int* rw,
                                   int* rh) {
  const int s = c_.image_size;
  // Columns and rows of the crop (after its flip, for the columns) that the
  // resize to full_w x full_h reads for the window kept.
  int cx0, cx1, cy0, cy1;
  MakeBilinearAxis(g.crop_w, g.full_w, g.out_x, s, &probe_, false);
  TapRange(probe_, &cx0, &cx1);
  if (g.flip) {
    const int lo = g.crop_w - cx1;
    cx1 = g.crop_w - cx0;
    cx0 = lo;
  }
  MakeBilinearAxis(g.crop_h, g.full_h, g.out_y, s, &probe_, false);
  TapRange(probe_, &cy0, &cy1);
  const int x0 = std::clamp(g.crop_x - g.pad + cx0, 0, w), x1 = std::clamp(g.crop_x - g.pad + cx1, 0, w);
  const int y0 = std::clamp(g.crop_y - g.pad + cy0, 0, h), y1 = std::clamp(g.crop_y - g.pad + cy1, 0, h);
  *x = x0;
  *y = y0;
  *rw = x1 - x0;
  *rh = y1 - y0;
}

void SampleTransform::Apply(const SourceView& v, const SampleGeometry& g, uint8_t* out) {
  const int w = v.w, h = v.h;
  const int s = c_.image_size;
  const size_t plane = static_cast<size_t>(g.crop_w) * g.crop_h;
  planes_.resize(plane * 3);
  // Crop (from the zero-padded source), flip, and split into planes, a row
  // at a time: the in-image span of a row, then zeros for the padding.
  uint8_t* p0 = planes_.data();
  uint8_t* p1 = p0 + plane;
  uint8_t* p2 = p1 + plane;
  // Rows and columns outside the view (the resize reads none of them) are
  // zeros, as the padding.
  for (int y = 0; y < g.crop_h; ++y) {
    const int sy = g.crop_y + y - g.pad;
    const size_t row = static_cast<size_t>(y) * g.crop_w;
    if (sy < std::max(0, v.y0) || sy >= std::min(h, v.y0 + v.view_h)) {
      std::memset(p0 + row, 0, g.crop_w);
      std::memset(p1 + row, 0, g.crop_w);
      std::memset(p2 + row, 0, g.crop_w);
      continue;
    }
    // Crop columns x with source column sx = crop_x + x - pad inside [0, w)
    // and the view.
    const int x_lo = std::clamp(std::max(0, v.x0) + g.pad - g.crop_x, 0, g.crop_w);
    const int x_hi = std::clamp(std::min(w, v.x0 + v.view_w) + g.pad - g.crop_x, x_lo, g.crop_w);
    const uint8_t* src =
        v.rgb + (static_cast<size_t>(sy - v.y0) * v.view_w + (g.crop_x + x_lo - g.pad - v.x0)) * 3;
    // Crop columns [x_lo, x_hi) land at [x_lo, x_hi), or flipped at
    // [crop_w - x_hi, crop_w - x_lo) in reverse; zeros on either side.
    const int d_lo = g.flip ? g.crop_w - x_hi : x_lo, d_hi = g.flip ? g.crop_w - x_lo : x_hi;
    for (uint8_t* p : {p0, p1, p2}) {
      std::memset(p + row, 0, d_lo);
      std::memset(p + row + d_hi, 0, g.crop_w - d_hi);
    }
    SplitRgb(src, x_hi - x_lo, g.flip, p0 + row + d_lo, p1 + row + d_lo, p2 + row + d_lo, c_.isa);
  }
  const size_t out_plane = static_cast<size_t>(s) * s;
  const bool direct = c_.layout == Layout::kNCHW && !c_.normalize;
  uint8_t* dst = out;
  if (!direct) {
    staged_.resize(out_plane * 3);
    dst = staged_.data();
  }
  for (int ch = 0; ch < 3; ++ch) {
    resizer_.Resize(planes_.data() + ch * plane, g.crop_w, g.crop_h, g.crop_w, g.full_w, g.full_h,
                    g.out_x, g.out_y, s, s, dst + ch * out_plane, s, c_.isa);
  }
  if (direct) return;
  if (c_.normalize) {
    float* f = reinterpret_cast<float*>(out);
    if (c_.layout == Layout::kNCHW) {
      for (int ch = 0; ch < 3; ++ch)
        for (size_t i = 0; i < out_plane; ++i)
          f[ch * out_plane + i] = lut_[ch][staged_[ch * out_plane + i]];
    } else {
      for (size_t i = 0; i < out_plane; ++i)
        for (int ch = 0; ch < 3; ++ch) f[i * 3 + ch] = lut_[ch][staged_[ch * out_plane + i]];
    }
    return;
  }
  for (size_t i = 0; i < out_plane; ++i)  // NHWC uint8
    for (int ch = 0; ch < 3; ++ch) out[i * 3 + ch] = staged_[ch * out_plane + i];
}

}  // namespace nl
