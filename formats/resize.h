// Pillow-exact bilinear resampling of 8-bit planes.
//
// The formula (Pillow's Resample.c, which torchvision's Resize uses on PIL
// images): along one axis, resizing a box of `in` pixels to `out` pixels,
// scale = in / out and filterscale = max(scale, 1) (so shrinking
// antialiases), support = filterscale. Output pixel o has
//   center = (o + 0.5) * scale
//   taps   i in [max(0, trunc(center - support + 0.5)), min(in, trunc(center + support + 0.5)))
//   weight w_i = tri((i - center + 0.5) / filterscale), tri(t) = max(0, 1 - |t|),
//          normalised to sum 1, then fixed point: round(w_i * 2^22).
//   value  = clamp((2^21 + sum_i w_i * p_i) >> 22, 0, 255)
// applied horizontally first, rounding to 8 bits, then vertically.
// The AVX2 and scalar passes give identical bytes (tested).
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "formats/image.h"

namespace nl {

enum class Isa { kScalar, kAvx2 };
Isa BestIsa();  // AVX2 when the CPU has it

inline constexpr int kResizePrecisionBits = 22;

// Coefficients for resizing `in_size` pixels to `out_full`, for the outputs
// [out_begin, out_begin + out_count) only (a crop of the resized image costs
// only its own pixels).
struct ResizeAxis {
  int in_size = 0, out_full = 0, out_begin = 0, out_count = 0;
  int ksize = 0;                // taps stored per output (max count)
  std::vector<int32_t> first;   // first input pixel of each output
  std::vector<int32_t> count;   // taps of each output
  std::vector<int32_t> weight;  // out_count * ksize fixed-point weights
  bool identity() const { return in_size == out_full && out_begin == 0 && out_count == out_full; }

  // For the AVX2 horizontal pass: outputs in blocks of 16, each group of
  // `group` outputs (8, or 4 where 8 do not fit) reading a 16-byte window of
  // its row (at base[k] for group k) through a byte shuffle per tap:
  // shrinking by up to ~1.7x fits in groups of 8, up to ~2.7x in groups of 4.
  struct Block {
    int base[4] = {0, 0, 0, 0};
    int group = 8;
    int taps = 0;
    bool fits = false;  // every tap of every output lies inside its group's window
  };
  std::vector<Block> blocks;
  std::vector<uint8_t> shuffle;       // blocks * ksize * 16 byte indices
  std::vector<int32_t> block_weight;  // blocks * ksize * 16 weights (0 for unused lanes)
};
// Fills *axis (reusing its storage); without `simd_tables`, only the taps
// and weights (blocks, shuffle and block_weight left empty: for asking
// which inputs an axis reads, not for resizing).
void MakeBilinearAxis(int in_size, int out_full, int out_begin, int out_count, ResizeAxis* axis,
                      bool simd_tables = true);

// Resamples along columns within each row: dst[r][o] = sum over taps t of
// weight * src[r][first[o] + t], for `rows` rows.
void HorizontalPass(const uint8_t* src, ptrdiff_t src_stride, int rows, const ResizeAxis& axis,
                    uint8_t* dst, ptrdiff_t dst_stride, Isa isa);

// Resamples along rows: dst row o = sum over taps t of weight * source row
// (first[o] + t), for `width` bytes per row. `src` points at source row
// `src_row0` (the rows before it are not needed by the axis).
void ResamplePass(const uint8_t* src, ptrdiff_t src_stride, int src_row0, int width,
                  const ResizeAxis& axis, uint8_t* dst, ptrdiff_t dst_stride, Isa isa);

// Splits n interleaved RGB pixels into three planes: d_c[j] = rgb[3j + c],
// or with `reverse` (a horizontal flip) d_c[j] = rgb[3(n - 1 - j) + c].
// The AVX2 path (16 pixels a step, byte shuffles) and the scalar one give
// the same bytes (tested).
void SplitRgb(const uint8_t* rgb, int n, bool reverse, uint8_t* d0, uint8_t* d1, uint8_t* d2,
              Isa isa);

// Resizes one plane (in_h x in_w, row stride src_stride) to the window
// [x0, x0+out_w) x [y0, y0+out_h) of its (full_w x full_h) resize, into dst.
// Scratch buffers are owned and reused: no allocation once warmed up.
class PlaneResizer {
 public:
  void Resize(const uint8_t* src, int in_w, int in_h, ptrdiff_t src_stride, int full_w, int full_h,
              int x0, int y0, int out_w, int out_h, uint8_t* dst, ptrdiff_t dst_stride, Isa isa);

 private:
  ResizeAxis h_, v_;
  std::vector<uint8_t> c_;
};

// The size an image of width x height is stored at under `pack_tool
// --max-side n` (0: no limit): when its longer side L exceeds n,
// round(width * n / L) x round(height * n / L) (halves round up), each at
// least 1; otherwise its own size.
std::pair<uint32_t, uint32_t> MaxSideSize(uint32_t width, uint32_t height, uint32_t n);

// The whole RGB image resized to width x height into *out: Pillow's
// resize((width, height), Image.BILINEAR) of it, each channel as a plane.
void ResizeImage(const Image& src, uint32_t width, uint32_t height, Image* out);

}  // namespace nl
