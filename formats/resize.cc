#include "formats/resize.h"

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

namespace {

// Block b's shuffles and weights with windows of `group` outputs; false
// (and blk.fits false) when a tap lies outside its group's 16-byte window.
bool FillBlock(ResizeAxis* a, int b, int group) {
  ResizeAxis::Block& blk = a->blocks[b];
  const int o0 = b * 16, o1 = std::min(a->out_count, o0 + 16);
  blk = {};
  blk.group = group;
  for (int k = 0; k < 16 / group; ++k) {
    const int lo = o0 + k * group, hi = std::min(o1, lo + group);
    blk.base[k] = lo < hi ? a->first[lo] : blk.base[0];
    for (int o = lo; o < hi; ++o) blk.base[k] = std::min(blk.base[k], a->first[o]);
  }
  const size_t at0 = static_cast<size_t>(b) * a->ksize * 16;
  std::fill_n(a->shuffle.begin() + at0, a->ksize * 16, 0x80);
  std::fill_n(a->block_weight.begin() + at0, a->ksize * 16, 0);
  for (int o = o0; o < o1; ++o) {
    blk.taps = std::max(blk.taps, a->count[o]);
    for (int t = 0; t < a->count[o]; ++t) {
      const int rel = a->first[o] + t - blk.base[(o - o0) / group];
      if (rel > 15) return false;
      const size_t at = at0 + static_cast<size_t>(t) * 16 + (o - o0);
      a->shuffle[at] = static_cast<uint8_t>(rel);
      a->block_weight[at] = a->weight[static_cast<size_t>(o) * a->ksize + t];
    }
  }
  blk.fits = true;
  return true;
}

}  // namespace

void MakeBilinearAxis(int in_size, int out_full, int out_begin, int out_count, ResizeAxis* a,
                      bool simd_tables) {
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
  thread_local std::vector<double> k;  // (no allocation per call once warm)
  thread_local std::vector<int32_t> fixed;
  k.resize(a->ksize);
  fixed.resize(a->ksize);
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
      fixed[x] = static_cast<int32_t>(v < 0 ? -0.5 + v * (1 << kResizePrecisionBits)
                                            : 0.5 + v * (1 << kResizePrecisionBits));
    }
    // Taps whose fixed-point weight is 0 add nothing: drop them at both ends
    // (upscaling 32 -> 224 then reads 2 rows per output instead of 3).
    int lo = 0, hi = xmax;
    while (hi - lo > 1 && fixed[lo] == 0) ++lo;
    while (hi - lo > 1 && fixed[hi - 1] == 0) --hi;
    for (int x = lo; x < hi; ++x)
      a->weight[static_cast<size_t>(o) * a->ksize + (x - lo)] = fixed[x];
    a->first[o] = xmin + lo;
    a->count[o] = hi - lo;
  }
  // Shuffle tables for the AVX2 horizontal pass.
  const int nblocks = simd_tables ? (out_count + 15) / 16 : 0;
  a->blocks.assign(nblocks, {});
  a->shuffle.assign(static_cast<size_t>(nblocks) * a->ksize * 16, 0x80);
  a->block_weight.assign(static_cast<size_t>(nblocks) * a->ksize * 16, 0);
  for (int b = 0; b < nblocks; ++b) {
    if (!FillBlock(a, b, 8)) FillBlock(a, b, 4);
  }
}

namespace {

inline uint8_t Clip8(int32_t v) {
  v >>= kResizePrecisionBits;
  return static_cast<uint8_t>(v < 0 ? 0 : v > 255 ? 255 : v);
}

void HorizontalScalar(const uint8_t* src, ptrdiff_t ss, int rows, const ResizeAxis& a, uint8_t* dst,
                      ptrdiff_t ds) {
  for (int r = 0; r < rows; ++r) {
    const uint8_t* row = src + r * ss;
    uint8_t* out = dst + r * ds;
    for (int o = 0; o < a.out_count; ++o) {
      const int32_t* w = &a.weight[static_cast<size_t>(o) * a.ksize];
      const uint8_t* p = row + a.first[o];
      int32_t acc = 1 << (kResizePrecisionBits - 1);
      for (int t = 0; t < a.count[o]; ++t) acc += p[t] * w[t];
      out[o] = Clip8(acc);
    }
  }
}

void PassScalar(const uint8_t* src, ptrdiff_t ss, int width, const ResizeAxis& a, int src_row0,
                uint8_t* dst, ptrdiff_t ds) {
  for (int o = 0; o < a.out_count; ++o) {
    const int32_t* w = &a.weight[static_cast<size_t>(o) * a.ksize];
    const uint8_t* row = src + (a.first[o] - src_row0) * ss;
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
// Packs 16 int32 accumulators (>> precision) into 16 bytes; the saturating
// packs clamp to 0..255 exactly as Clip8.
__attribute__((target("avx2"))) inline __m128i Pack16(__m256i lo, __m256i hi) {
  lo = _mm256_srai_epi32(lo, kResizePrecisionBits);
  hi = _mm256_srai_epi32(hi, kResizePrecisionBits);
  __m256i p16 = _mm256_permute4x64_epi64(_mm256_packs_epi32(lo, hi), 0xD8);
  const __m256i p8 = _mm256_packus_epi16(p16, _mm256_setzero_si256());
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(p8, 0x08));
}

// round + a * w0 + b * w1 for the low 8 bytes of a and b.
__attribute__((target("avx2"))) inline __m256i Mac2(__m128i a, __m128i b, __m256i w0, __m256i w1,
                                                    __m256i round) {
  return _mm256_add_epi32(round, _mm256_add_epi32(_mm256_mullo_epi32(_mm256_cvtepu8_epi32(a), w0),
                                                  _mm256_mullo_epi32(_mm256_cvtepu8_epi32(b), w1)));
}

__attribute__((target("avx2"))) void PassAvx2(const uint8_t* src, ptrdiff_t ss, int width,
                                              const ResizeAxis& a, int src_row0, uint8_t* dst,
                                              ptrdiff_t ds) {
  const __m256i round = _mm256_set1_epi32(1 << (kResizePrecisionBits - 1));
  for (int o = 0; o < a.out_count; ++o) {
    const int32_t* w = &a.weight[static_cast<size_t>(o) * a.ksize];
    const uint8_t* row = src + (a.first[o] - src_row0) * ss;
    const int n = a.count[o];
    uint8_t* out = dst + o * ds;
    int x = 0;
    if (n == 2) {  // upscaling: two source rows per output row, 32 bytes per step
      const __m256i w0 = _mm256_set1_epi32(w[0]), w1 = _mm256_set1_epi32(w[1]);
      const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
      const uint8_t* r0 = row;
      const uint8_t* r1 = row + ss;
      for (; x + 32 <= width; x += 32) {
        const __m128i a0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(r0 + x));
        const __m128i a1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(r0 + x + 16));
        const __m128i b0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(r1 + x));
        const __m128i b1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(r1 + x + 16));
        const __m256i s0 = _mm256_srai_epi32(Mac2(a0, b0, w0, w1, round), kResizePrecisionBits);
        const __m256i s1 =
            _mm256_srai_epi32(Mac2(_mm_srli_si128(a0, 8), _mm_srli_si128(b0, 8), w0, w1, round),
                              kResizePrecisionBits);
        const __m256i s2 = _mm256_srai_epi32(Mac2(a1, b1, w0, w1, round), kResizePrecisionBits);
        const __m256i s3 =
            _mm256_srai_epi32(Mac2(_mm_srli_si128(a1, 8), _mm_srli_si128(b1, 8), w0, w1, round),
                              kResizePrecisionBits);
        const __m256i p =
            _mm256_packus_epi16(_mm256_packs_epi32(s0, s1), _mm256_packs_epi32(s2, s3));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + x),
                            _mm256_permutevar8x32_epi32(p, order));
      }
    }
    for (; x + 16 <= width; x += 16) {
      __m256i lo = round, hi = round;
      for (int t = 0; t < n; ++t) {
        const __m128i px = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + t * ss + x));
        const __m256i wt = _mm256_set1_epi32(w[t]);
        lo = _mm256_add_epi32(lo, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(px), wt));
        hi = _mm256_add_epi32(hi,
                              _mm256_mullo_epi32(_mm256_cvtepu8_epi32(_mm_srli_si128(px, 8)), wt));
      }
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + x), Pack16(lo, hi));
    }
    for (; x < width; ++x) {
      int32_t acc = 1 << (kResizePrecisionBits - 1);
      for (int t = 0; t < n; ++t) acc += row[t * ss + x] * w[t];
      out[x] = Clip8(acc);
    }
  }
}
#endif

#if defined(__x86_64__)
// The 16 bytes a block's tap reads from one row: `idx` applied to each
// group's window, the groups' lanes taken from their own window.
__attribute__((target("avx2"))) inline __m128i Gather16(const ResizeAxis::Block& blk,
                                                       const __m128i win[4], __m128i idx) {
  if (blk.group == 8) {
    return _mm_blend_epi16(_mm_shuffle_epi8(win[0], idx), _mm_shuffle_epi8(win[1], idx), 0xF0);
  }
  const __m128i s01 = _mm_blend_epi32(_mm_shuffle_epi8(win[0], idx), _mm_shuffle_epi8(win[1], idx), 0x2);
  const __m128i s23 = _mm_blend_epi32(_mm_shuffle_epi8(win[2], idx), _mm_shuffle_epi8(win[3], idx), 0x8);
  return _mm_blend_epi32(s01, s23, 0xC);
}

__attribute__((target("avx2"))) void LoadWindows(const uint8_t* row, const ResizeAxis::Block& blk,
                                                 __m128i win[4]) {
  for (int k = 0; k < 16 / blk.group; ++k)
    win[k] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + blk.base[k]));
}

__attribute__((target("avx2"))) void HorizontalAvx2(const uint8_t* src, ptrdiff_t ss, int rows,
                                                    const ResizeAxis& a, uint8_t* dst,
                                                    ptrdiff_t ds) {
  // Two rows at a time (two independent sums per tap, one set of shuffles
  // and weights), each copied into a buffer with 16 spare bytes so the
  // 16-byte window loads never read past it.
  thread_local std::vector<uint8_t> padded;
  const size_t stride = static_cast<size_t>(a.in_size) + 32;
  padded.resize(stride * 2);
  alignas(16) uint8_t tail[16];
  const int nblocks = static_cast<int>(a.blocks.size());
  const __m256i round = _mm256_set1_epi32(1 << (kResizePrecisionBits - 1));
  for (int r = 0; r < rows; r += 2) {
    const int nr = std::min(2, rows - r);
    const uint8_t* row[2] = {padded.data(), padded.data() + stride};
    for (int k = 0; k < nr; ++k) std::memcpy(padded.data() + k * stride, src + (r + k) * ss, a.in_size);
    if (nr == 1) row[1] = row[0];
    for (int b = 0; b < nblocks; ++b) {
      const ResizeAxis::Block& blk = a.blocks[b];
      const int o0 = b * 16, n = std::min(16, a.out_count - o0);
      if (!blk.fits) {  // a window wider than 16 bytes (strong shrinking): scalar
        for (int k = 0; k < nr; ++k) {
          for (int o = o0; o < o0 + n; ++o) {
            const int32_t* w = &a.weight[static_cast<size_t>(o) * a.ksize];
            int32_t acc = 1 << (kResizePrecisionBits - 1);
            for (int t = 0; t < a.count[o]; ++t) acc += row[k][a.first[o] + t] * w[t];
            dst[(r + k) * ds + o] = Clip8(acc);
          }
        }
        continue;
      }
      __m128i win0[4], win1[4];
      LoadWindows(row[0], blk, win0);
      LoadWindows(row[1], blk, win1);
      __m256i lo0 = round, hi0 = round, lo1 = round, hi1 = round;
      for (int t = 0; t < blk.taps; ++t) {
        const size_t at = (static_cast<size_t>(b) * a.ksize + t) * 16;
        const __m128i idx = _mm_loadu_si128(reinterpret_cast<const __m128i*>(&a.shuffle[at]));
        const __m256i wlo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(&a.block_weight[at]));
        const __m256i whi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(&a.block_weight[at + 8]));
        const __m128i p0 = Gather16(blk, win0, idx), p1 = Gather16(blk, win1, idx);
        lo0 = _mm256_add_epi32(lo0, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(p0), wlo));
        hi0 = _mm256_add_epi32(hi0, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(_mm_srli_si128(p0, 8)), whi));
        lo1 = _mm256_add_epi32(lo1, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(p1), wlo));
        hi1 = _mm256_add_epi32(hi1, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(_mm_srli_si128(p1, 8)), whi));
      }
      const __m128i packed[2] = {Pack16(lo0, hi0), Pack16(lo1, hi1)};
      for (int k = 0; k < nr; ++k) {
        uint8_t* out = dst + (r + k) * ds + o0;
        if (n == 16) {
          _mm_storeu_si128(reinterpret_cast<__m128i*>(out), packed[k]);
        } else {
          _mm_store_si128(reinterpret_cast<__m128i*>(tail), packed[k]);
          std::memcpy(out, tail, n);
        }
      }
    }
  }
}
#endif

}  // namespace

namespace {

void SplitRgbScalar(const uint8_t* rgb, int n, bool reverse, uint8_t* d0, uint8_t* d1, uint8_t* d2) {
  for (int j = 0; j < n; ++j) {
    const uint8_t* px = rgb + static_cast<size_t>(reverse ? n - 1 - j : j) * 3;
    d0[j] = px[0];
    d1[j] = px[1];
    d2[j] = px[2];
  }
}

#if defined(__x86_64__)
// Byte shuffles taking plane c of 16 pixels (48 bytes, as three 16-byte
// chunks) to 16 bytes: kSplitMasks[reverse][c][chunk], -1 (0x80) where the
// output byte comes from another chunk.
struct SplitMasks {
  alignas(16) int8_t m[2][3][3][16];
  constexpr SplitMasks() : m{} {
    for (int r = 0; r < 2; ++r)
      for (int c = 0; c < 3; ++c)
        for (int j = 0; j < 16; ++j) {
          const int src = 3 * (r ? 15 - j : j) + c;
          for (int k = 0; k < 3; ++k) m[r][c][k][j] = static_cast<int8_t>(src / 16 == k ? src % 16 : -128);
        }
  }
};
constexpr SplitMasks kSplitMasks;

__attribute__((target("avx2"))) void SplitRgbAvx2(const uint8_t* rgb, int n, bool reverse,
                                                  uint8_t* d0, uint8_t* d1, uint8_t* d2) {
  uint8_t* d[3] = {d0, d1, d2};
  __m128i mask[3][3];
  for (int c = 0; c < 3; ++c)
    for (int k = 0; k < 3; ++k)
      mask[c][k] = _mm_load_si128(reinterpret_cast<const __m128i*>(kSplitMasks.m[reverse][c][k]));
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    const uint8_t* p = rgb + static_cast<size_t>(i) * 3;
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16));
    const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 32));
    const int at = reverse ? n - 16 - i : i;  // where these 16 pixels land
    for (int c = 0; c < 3; ++c) {
      const __m128i v = _mm_or_si128(
          _mm_or_si128(_mm_shuffle_epi8(a, mask[c][0]), _mm_shuffle_epi8(b, mask[c][1])),
          _mm_shuffle_epi8(e, mask[c][2]));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(d[c] + at), v);
    }
  }
  // The last n % 16 pixels: at the end of the planes, or (reversed) at their start.
  const int left = n - i;
  if (left > 0) {
    const int at = reverse ? 0 : i;
    SplitRgbScalar(rgb + static_cast<size_t>(i) * 3, left, reverse, d0 + at, d1 + at, d2 + at);
  }
}
#endif

}  // namespace

void SplitRgb(const uint8_t* rgb, int n, bool reverse, uint8_t* d0, uint8_t* d1, uint8_t* d2,
              Isa isa) {
  if (n <= 0) return;
#if defined(__x86_64__)
  if (isa == Isa::kAvx2) return SplitRgbAvx2(rgb, n, reverse, d0, d1, d2);
#endif
  (void)isa;
  SplitRgbScalar(rgb, n, reverse, d0, d1, d2);
}

void HorizontalPass(const uint8_t* src, ptrdiff_t src_stride, int rows, const ResizeAxis& axis,
                    uint8_t* dst, ptrdiff_t dst_stride, Isa isa) {
#if defined(__x86_64__)
  if (isa == Isa::kAvx2) return HorizontalAvx2(src, src_stride, rows, axis, dst, dst_stride);
#endif
  (void)isa;
  HorizontalScalar(src, src_stride, rows, axis, dst, dst_stride);
}

void ResamplePass(const uint8_t* src, ptrdiff_t src_stride, int src_row0, int width,
                  const ResizeAxis& axis, uint8_t* dst, ptrdiff_t dst_stride, Isa isa) {
#if defined(__x86_64__)
  if (isa == Isa::kAvx2) return PassAvx2(src, src_stride, width, axis, src_row0, dst, dst_stride);
#endif
  (void)isa;
  PassScalar(src, src_stride, width, axis, src_row0, dst, dst_stride);
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
    c_.resize(static_cast<size_t>(rows) * out_w);
    HorizontalPass(h_src, src_stride, rows, h_, c_.data(), out_w, isa);
    c_plane = c_.data();
    c_stride = out_w;
  }
  if (v_.identity()) {
    for (int y = 0; y < out_h; ++y)
      std::memcpy(dst + y * dst_stride, c_plane + y * c_stride, out_w);
    return;
  }
  ResamplePass(c_plane, c_stride, row0, out_w, v_, dst, dst_stride, isa);  // c_plane starts at row0
}

std::pair<uint32_t, uint32_t> MaxSideSize(uint32_t width, uint32_t height, uint32_t n) {
  const uint64_t longer = std::max(width, height);
  if (n == 0 || longer <= n) return {width, height};
  auto side = [&](uint64_t v) {  // round(v * n / longer), halves up, at least 1
    return static_cast<uint32_t>(std::max<uint64_t>(1, (2 * v * n + longer) / (2 * longer)));
  };
  return {side(width), side(height)};
}

void ResizeImage(const Image& src, uint32_t width, uint32_t height, Image* out) {
  const size_t in_px = size_t{src.width} * src.height, out_px = size_t{width} * height;
  std::vector<uint8_t> planes(in_px * 3), resized(out_px * 3);
  const Isa isa = BestIsa();
  // Row by row: SplitRgb counts pixels in an int, and an image may hold more
  // than 2^31 of them (--max-megapixels allows what memory holds).
  for (size_t y = 0, w = src.width; y < src.height; ++y) {
    SplitRgb(src.pixels.data() + y * w * 3, static_cast<int>(w), false, planes.data() + y * w,
             planes.data() + in_px + y * w, planes.data() + 2 * in_px + y * w, isa);
  }
  PlaneResizer r;
  for (int c = 0; c < 3; ++c) {
    r.Resize(planes.data() + c * in_px, static_cast<int>(src.width), static_cast<int>(src.height),
             src.width, static_cast<int>(width), static_cast<int>(height), 0, 0,
             static_cast<int>(width), static_cast<int>(height), resized.data() + c * out_px, width, isa);
  }
  out->width = width;
  out->height = height;
  out->pixels.resize(out_px * 3);
  for (size_t i = 0; i < out_px; ++i)
    for (int c = 0; c < 3; ++c) out->pixels[i * 3 + c] = resized[c * out_px + i];
}

}  // namespace nl
