#include "loader/resize.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace nl {

Isa BestIsa() {
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2");
  return avx2 ? Isa::kAvx2 : Isa::kScalar;
#else
  return Isa::kScalar;
#endif
}

void MakeBilinearAxis(int in_size, int out_full, int out_begin, int out_count, ResizeAxis* a) {
  a->in_size = in_size;
  a->out_full = out_full;
  a->out_begin = out_begin;
  a->out_count = out_count;
  const double scale = static_cast<double>(in_size) / out_full;
  const double filterscale = std::max(scale, 1.0);
  const double support = 1.0 * filterscale;
  a->ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  a->first.resize(out_count);
  a->count.resize(out_count);
  a->weight.assign(static_cast<size_t>(out_count) * a->ksize, 0);
  std::vector<double> k(a->ksize);
  const double ss = 1.0 / filterscale;
  for (int o = 0; o < out_count; ++o) {
    const double center = (out_begin + o + 0.5) * scale;
    int xmin = static_cast<int>(center - support + 0.5);
    if (xmin < 0) xmin = 0;
    int xmax = static_cast<int>(center + support + 0.5);
    if (xmax > in_size) xmax = in_size;
    xmax -= xmin;
    double ww = 0.0;
    for (int x = 0; x < xmax; ++x) {
      double t = (x + xmin - center + 0.5) * ss;
      if (t < 0) t = -t;
      const double w = t < 1.0 ? 1.0 - t : 0.0;
      k[x] = w;
      ww += w;
    }
    for (int x = 0; x < xmax; ++x) {
      const double v = ww != 0.0 ? k[x] / ww : k[x];
      a->weight[static_cast<size_t>(o) * a->ksize + x] = static_cast<int32_t>(
          v < 0 ? -0.5 + v * (1 << kResizePrecisionBits) : 0.5 + v * (1 << kResizePrecisionBits));
    }
    a->first[o] = xmin;
    a->count[o] = xmax;
  }
}

namespace {

inline uint8_t Clip8(int32_t v) {
  v >>= kResizePrecisionBits;
  return static_cast<uint8_t>(v < 0 ? 0 : v > 255 ? 255 : v);
}

void PassScalar(const uint8_t* src, ptrdiff_t ss, int width, const ResizeAxis& a, uint8_t* dst,
                ptrdiff_t ds) {
  for (int o = 0; o < a.out_count; ++o) {
    const int32_t* w = &a.weight[static_cast<size_t>(o) * a.ksize];
    const uint8_t* row = src + a.first[o] * ss;
    const int n = a.count[o];
    uint8_t* out = dst + o * ds;
    for (int x = 0; x < width; ++x) {
      int32_t acc = 1 << (kResizePrecisionBits - 1);
      for (int t = 0; t < n; ++t) acc += row[t * ss + x] * w[t];
      out[x] = Clip8(acc);
    }
  }
}

#if defined(__x86_64__)
__attribute__((target("avx2"))) void PassAvx2(const uint8_t* src, ptrdiff_t ss, int width,
                                              const ResizeAxis& a, uint8_t* dst, ptrdiff_t ds) {
  const __m256i round = _mm256_set1_epi32(1 << (kResizePrecisionBits - 1));
  const __m256i zero = _mm256_setzero_si256();
  for (int o = 0; o < a.out_count; ++o) {
    const int32_t* w = &a.weight[static_cast<size_t>(o) * a.ksize];
    const uint8_t* row = src + a.first[o] * ss;
    const int n = a.count[o];
    uint8_t* out = dst + o * ds;
    int x = 0;
    for (; x + 16 <= width; x += 16) {
      __m256i lo = round, hi = round;
      for (int t = 0; t < n; ++t) {
        const __m128i px = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + t * ss + x));
        const __m256i wt = _mm256_set1_epi32(w[t]);
        lo = _mm256_add_epi32(lo, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(px), wt));
        hi = _mm256_add_epi32(hi,
                              _mm256_mullo_epi32(_mm256_cvtepu8_epi32(_mm_srli_si128(px, 8)), wt));
      }
      lo = _mm256_srai_epi32(lo, kResizePrecisionBits);
      hi = _mm256_srai_epi32(hi, kResizePrecisionBits);
      // Saturating packs clamp to 0..255 exactly as Clip8.
      __m256i p16 = _mm256_packs_epi32(lo, hi);           // lanes: lo0 hi0 | lo1 hi1
      p16 = _mm256_permute4x64_epi64(p16, 0xD8);          // lo0 lo1 | hi0 hi1
      const __m256i p8 = _mm256_packus_epi16(p16, zero);  // 8 bytes per lane
      const __m256i ordered = _mm256_permute4x64_epi64(p8, 0x08);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + x), _mm256_castsi256_si128(ordered));
    }
    for (; x < width; ++x) {
      int32_t acc = 1 << (kResizePrecisionBits - 1);
      for (int t = 0; t < n; ++t) acc += row[t * ss + x] * w[t];
      out[x] = Clip8(acc);
    }
  }
}
#endif

}  // namespace

void ResamplePass(const uint8_t* src, ptrdiff_t src_stride, int width, const ResizeAxis& axis,
                  uint8_t* dst, ptrdiff_t dst_stride, Isa isa) {
#if defined(__x86_64__)
  if (isa == Isa::kAvx2) return PassAvx2(src, src_stride, width, axis, dst, dst_stride);
#endif
  (void)isa;
  PassScalar(src, src_stride, width, axis, dst, dst_stride);
}

void Transpose(const uint8_t* src, int rows, int cols, ptrdiff_t ss, uint8_t* dst, ptrdiff_t ds) {
  constexpr int kTile = 16;
  for (int r0 = 0; r0 < rows; r0 += kTile) {
    const int r1 = std::min(rows, r0 + kTile);
    for (int c0 = 0; c0 < cols; c0 += kTile) {
      const int c1 = std::min(cols, c0 + kTile);
      for (int r = r0; r < r1; ++r)
        for (int c = c0; c < c1; ++c) dst[c * ds + r] = src[r * ss + c];
    }
  }
}

void PlaneResizer::Resize(const uint8_t* src, int in_w, int in_h, ptrdiff_t src_stride, int full_w,
                          int full_h, int x0, int y0, int out_w, int out_h, uint8_t* dst,
                          ptrdiff_t dst_stride, Isa isa) {
  if (h_.in_size != in_w || h_.out_full != full_w || h_.out_begin != x0 || h_.out_count != out_w) {
    MakeBilinearAxis(in_w, full_w, x0, out_w, &h_);
  }
  if (v_.in_size != in_h || v_.out_full != full_h || v_.out_begin != y0 || v_.out_count != out_h) {
    MakeBilinearAxis(in_h, full_h, y0, out_h, &v_);
  }
  // Only the source rows the vertical pass reads need the horizontal pass.
  const int row0 = v_.identity() ? 0 : v_.first.front();
  const int row1 = v_.identity() ? in_h : v_.first.back() + v_.count.back();
  const int rows = row1 - row0;
  const uint8_t* h_src = src + row0 * src_stride;
  const uint8_t* c_plane = h_src;  // rows x out_w after the horizontal pass
  ptrdiff_t c_stride = src_stride;
  if (!h_.identity()) {
    // Horizontal pass as a vertical pass over the transposed plane.
    a_.resize(static_cast<size_t>(in_w) * rows);
    b_.resize(static_cast<size_t>(out_w) * rows);
    c_.resize(static_cast<size_t>(rows) * out_w);
    Transpose(h_src, rows, in_w, src_stride, a_.data(), rows);
    ResamplePass(a_.data(), rows, rows, h_, b_.data(), rows, isa);
    Transpose(b_.data(), out_w, rows, rows, c_.data(), out_w);
    c_plane = c_.data();
    c_stride = out_w;
  }
  if (v_.identity()) {
    for (int y = 0; y < out_h; ++y)
      std::memcpy(dst + y * dst_stride, c_plane + y * c_stride, out_w);
    return;
  }
  // The vertical axis indexes source rows from 0; c_plane starts at row0.
  ResizeAxis& v = v_;
  for (int& f : v.first) f -= row0;
  ResamplePass(c_plane, c_stride, out_w, v, dst, dst_stride, isa);
  for (int& f : v.first) f += row0;
}

}  // namespace nl
