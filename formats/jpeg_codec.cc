// JPEG decode through libjpeg-turbo's libjpeg API, encode through its TurboJPEG API.
#include <turbojpeg.h>
// jpeglib.h needs size_t and FILE first.
#include <cstdio>
#include <jpeglib.h>
#include <jerror.h>
// For the entropy decoder's method table (FastRestartMcu).
#include <jpegint.h>

#include <algorithm>
#include <csetjmp>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <numeric>
#include <span>
#include <string>
#include <vector>

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

// Decoding goes through libjpeg's own API (libjpeg-turbo) rather than
// TurboJPEG's: its error manager tells a fatal error from a warning, and which
// warning. (TurboJPEG reports any failure after a warning as a warning, so a
// decode that stopped on an error looked like a damaged image that loaded.)
// Pillow's decisions, which ours follow: a fatal error refuses the file;
// "Premature end of JPEG file" (the data ends before its end marker) refuses
// it as truncated; any other warning (corrupt data libjpeg decodes around, an
// unknown JFIF revision, extraneous bytes before a marker) loads it.
struct JpegErrors {
  jpeg_error_mgr pub;
  std::jmp_buf jump;
  bool truncated = false;
  char message[JMSG_LENGTH_MAX] = {0};
};

// Progressive JPEGs can hold thousands of tiny scans, each a full pass over
// the coefficients: a small file that takes minutes. Over this many, refused
// (as TurboJPEG's TJFLAG_LIMITSCANS does; Pillow has no such limit).
constexpr int kMaxScans = 500;

extern "C" void OnJpegError(j_common_ptr c) {
  auto* e = reinterpret_cast<JpegErrors*>(c->err);
  (*c->err->format_message)(c, e->message);
  std::longjmp(e->jump, 1);
}
extern "C" void OnJpegMessage(j_common_ptr c, int level) {
  if (level >= 0) return;  // trace messages
  auto* e = reinterpret_cast<JpegErrors*>(c->err);
  if (c->err->msg_code == JWRN_JPEG_EOF) e->truncated = true;
  c->err->num_warnings++;
}
extern "C" void OnJpegProgress(j_common_ptr c) {
  auto* d = reinterpret_cast<j_decompress_ptr>(c);
  if (c->is_decompressor && d->input_scan_number > kMaxScans) {
    auto* e = reinterpret_cast<JpegErrors*>(c->err);
    std::snprintf(e->message, sizeof e->message, "more than %d scans (a progressive-scan bomb)", kMaxScans);
    std::longjmp(e->jump, 1);
  }
}

// A data source that gives libjpeg a JPEG cut above a restart marker: the
// header (its frame height lowered) and then the entropy-coded data from
// that marker on. `shift` is the number of the interval the cut starts at,
// modulo 8: the markers that follow are numbered from it, and libjpeg, which
// expects them numbered from 0, is told they are in order (resync).
struct CutSource {
  jpeg_source_mgr pub;
  // The header up to its frame height, the height, the rest of the header,
  // the data after the marker.
  std::span<const uint8_t> pieces[4];
  uint8_t height[2] = {0, 0};
  int next = 0;
  int shift = 0;
};

extern "C" void CutInit(j_decompress_ptr c) {
  auto* s = reinterpret_cast<CutSource*>(c->src);
  s->next = 0;
  s->pub.bytes_in_buffer = 0;
}
extern "C" boolean CutFill(j_decompress_ptr c) {
  auto* s = reinterpret_cast<CutSource*>(c->src);
  while (s->next < 4) {
    const std::span<const uint8_t> p = s->pieces[s->next++];
    if (p.empty()) continue;
    s->pub.next_input_byte = p.data();
    s->pub.bytes_in_buffer = p.size();
    return TRUE;
  }
  // Out of data, as jpeg_mem_src: a warning (truncated) and an end marker.
  static const JOCTET kEoi[2] = {0xFF, JPEG_EOI};
  WARNMS(c, JWRN_JPEG_EOF);
  s->pub.next_input_byte = kEoi;
  s->pub.bytes_in_buffer = 2;
  return TRUE;
}
extern "C" void CutSkip(j_decompress_ptr c, long n) {
  jpeg_source_mgr* s = c->src;
  if (n <= 0) return;
  while (n > static_cast<long>(s->bytes_in_buffer)) {
    n -= static_cast<long>(s->bytes_in_buffer);
    (void)(*s->fill_input_buffer)(c);
  }
  s->next_input_byte += n;
  s->bytes_in_buffer -= static_cast<size_t>(n);
}
extern "C" boolean CutResync(j_decompress_ptr c, int desired) {
  auto* s = reinterpret_cast<CutSource*>(c->src);
  if (c->unread_marker == JPEG_RST0 + ((desired + s->shift) & 7)) {
    c->unread_marker = 0;
    return TRUE;
  }
  // Out of order (a damaged file): libjpeg's recovery, in the file's numbering.
  return jpeg_resync_to_restart(c, (desired + s->shift) & 7);
}
extern "C" void CutTerm(j_decompress_ptr) {}

extern "C" JSAMPARRAY ZeroedSampleRows(j_common_ptr c, int pool, JDIMENSION width, JDIMENSION rows);

// A fresh decompressor for every image (0.2 us to make), as Pillow does: one
// reused keeps the previous image's quantisation tables, so a file missing
// its own would decode with another's instead of failing, and after a failed
// decode its state fails the next images.
struct JpegDecoder {
  jpeg_decompress_struct cinfo;
  JpegErrors err;
  jpeg_progress_mgr progress;
  std::vector<uint8_t> cmyk;
  std::vector<JSAMPROW> rows;
  CutSource cut;
  // Restarts on the fast Huffman path (FastRestartMcu): the scan's restart
  // interval, the MCUs decoded, and libjpeg's own decode_mcu.
  uint64_t interval = 0, mcu = 0;
  boolean (*decode_mcu)(j_decompress_ptr, JBLOCKROW*) = nullptr;
  // libjpeg's own sample-array allocator (ZeroedSampleRows wraps it).
  JSAMPARRAY (*alloc_sarray)(j_common_ptr, int, JDIMENSION, JDIMENSION) = nullptr;
  bool header_done = false;
  JpegDecoder() {
    cinfo.client_data = this;  // (jpeg_create_decompress keeps it)
    cinfo.err = jpeg_std_error(&err.pub);
    err.pub.error_exit = OnJpegError;
    err.pub.emit_message = OnJpegMessage;
    jpeg_create_decompress(&cinfo);
    progress.progress_monitor = OnJpegProgress;
    cinfo.progress = &progress;
    alloc_sarray = cinfo.mem->alloc_sarray;
    cinfo.mem->alloc_sarray = ZeroedSampleRows;
  }
  ~JpegDecoder() { jpeg_destroy_decompress(&cinfo); }
  JpegDecoder(const JpegDecoder&) = delete;
  JpegDecoder& operator=(const JpegDecoder&) = delete;
};

// Every sample array libjpeg allocates for a decode (the IDCT's output rows,
// the upsampler's), its rows rounded up to 64 samples and zeroed. Why: its
// SIMD colour conversion (jsimd_ycc_rgb_convert, AVX2 or SSE2) loads whole
// vectors of the Y, Cb and Cr rows, past output_width into their padding,
// converts every lane and stores the first output_width pixels: each
// pixel's lanes are its own, so the padding never reaches a stored pixel
// (JpegPadding.NeverReachesThePixels fills it with other bytes to show it).
// But where the chroma is upsampled by int_upsample (4:4:0, 4:4:1, 4:1:0,
// 3x1, 3x2: a vertical or a non-power-of-2 horizontal factor), or the row
// is a crop (jpeg_crop_scanline), the rows are written only to output_width
// and their padding was never written; valgrind's memcheck follows the Cb
// and Cr term of G (PMADDWD) 64 bits at a time, so it marked the G of a
// row's last one or two pixels uninitialised whenever the width was not a
// multiple of 4, and every value computed from them after (issue 29 item 3).
// Zeroed, the padding is defined and a memory checker's reports are real
// ones. (Asked for rounded up here rather than by libjpeg-turbo's own
// rounding, which is the same, so that every byte zeroed is one asked for.)
// Zeroed once a decode: 2 to 23 KB for a 500x375 JPEG, under 2 us
// against the decode's 0.5 to 1 ms.
extern "C" JSAMPARRAY ZeroedSampleRows(j_common_ptr c, int pool, JDIMENSION width,
                                       JDIMENSION rows) {
  auto* d = static_cast<JpegDecoder*>(c->client_data);
  constexpr uint64_t kPad = 64;
  const uint64_t padded = (uint64_t{width} + kPad - 1) / kPad * kPad;
  // (libjpeg refuses a row this long itself.)
  if (padded > 1'000'000'000) return d->alloc_sarray(c, pool, width, rows);
  const JSAMPARRAY a = d->alloc_sarray(c, pool, static_cast<JDIMENSION>(padded), rows);
  for (JDIMENSION r = 0; r < rows; ++r) std::memset(a[r], 0, padded * sizeof(JSAMPLE));
  return a;
}

// libjpeg-turbo decodes every MCU of a scan that has restart markers on its
// slow Huffman path (its decode_mcu sets usefast = 0 whenever
// restart_interval is set): a row-restarted file (--jpeg-restarts) lost to
// that what its cut saved. So the entropy decoder is told of a restart
// interval of 1 at the first MCU of each of the file's intervals (it reads
// the marker there, checks its number and resets the DC predictions, as for
// any restart, and counts that interval down to 0 after the MCU) and of
// none at the others, which go on its fast path (an MCU that runs into the
// next marker is handed back to the slow path, as at the end of any scan).
// The coefficients are the same; only the path differs.
extern "C" boolean FastRestartMcu(j_decompress_ptr c, JBLOCKROW* data) {
  auto* d = static_cast<JpegDecoder*>(c->client_data);
  c->restart_interval = d->mcu % d->interval == 0 ? 1 : 0;
  const boolean ok = d->decode_mcu(c, data);
  if (ok) ++d->mcu;
  return ok;
}

// Before jpeg_start_decompress: a single sequential Huffman scan with
// restarts is started with an interval of 1 (so that the first MCU counts
// its interval down to 0, see FastRestartMcu).
void PrepareFastRestarts(JpegDecoder* d) {
  jpeg_decompress_struct& c = d->cinfo;
  d->interval = 0;
  if (c.progressive_mode || c.arith_code || c.restart_interval == 0 || c.comps_in_scan != c.num_components) {
    return;
  }
  d->interval = c.restart_interval;
  d->mcu = 0;
  c.restart_interval = 1;
}
// After jpeg_start_decompress, which made the entropy decoder.
void InstallFastRestarts(JpegDecoder* d) {
  if (d->interval == 0) return;
  d->decode_mcu = d->cinfo.entropy->decode_mcu;
  d->cinfo.entropy->decode_mcu = FastRestartMcu;
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

// The rows and columns to decode for `region` (null: all): the region
// clipped to the image, widened by one iMCU on each side (with `margin`),
// where fancy upsampling reads a chroma sample's neighbours;
// jpeg_crop_scanline then widens the columns to whole iMCUs.
PixelRect Widened(const jpeg_decompress_struct& c, const PixelRect* region, bool margin) {
  const uint32_t w = c.output_width, h = c.output_height;
  if (region == nullptr || region->w == 0 || region->h == 0 || region->x >= w || region->y >= h) {
    return {0, 0, w, h};
  }
  // An iMCU in output pixels (its blocks are min_DCT_scaled_size wide).
#if JPEG_LIB_VERSION >= 70
  const uint64_t bw = static_cast<unsigned>(c.min_DCT_h_scaled_size), bh = static_cast<unsigned>(c.min_DCT_v_scaled_size);
#else
  const uint64_t bw = static_cast<unsigned>(c.min_DCT_scaled_size), bh = bw;
#endif
  const uint64_t mx = margin ? bw * static_cast<unsigned>(c.max_h_samp_factor) : 0;
  const uint64_t my = margin ? bh * static_cast<unsigned>(c.max_v_samp_factor) : 0;
  const uint64_t x0 = region->x > mx ? region->x - mx : 0, y0 = region->y > my ? region->y - my : 0;
  const uint64_t x1 = std::min<uint64_t>(w, uint64_t{region->x} + region->w + mx);
  const uint64_t y1 = std::min<uint64_t>(h, uint64_t{region->y} + region->h + my);
  return {static_cast<uint32_t>(x0), static_cast<uint32_t>(y0), static_cast<uint32_t>(x1 - x0),
          static_cast<uint32_t>(y1 - y0)};
}

// The offset of the frame height (its SOF segment's Y field) in a JPEG
// header of `n` bytes, or 0 when there is none before the scan.
size_t FrameHeightAt(const uint8_t* b, size_t n) {
  size_t pos = 2;  // after SOI
  while (pos + 4 <= n) {
    if (b[pos] != 0xFF) return 0;
    const uint8_t m = b[pos + 1];
    if (m == 0xFF) {  // a fill byte before a marker
      ++pos;
      continue;
    }
    if (m == 0x01 || (m >= 0xD0 && m <= 0xD7)) {  // TEM, RSTn: no length (libjpeg passes them)
      pos += 2;
      continue;
    }
    const size_t len = (size_t{b[pos + 2]} << 8) | b[pos + 3];
    if (m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC) {
      return pos + 7 <= n ? pos + 5 : 0;  // FF Cn, length, precision, then Y
    }
    if (m == 0xDA || len < 2) return 0;
    pos += 2 + len;
  }
  return 0;
}

// The byte after the k-th restart marker (k >= 1) of the entropy-coded data
// in [p, end), or null when it holds fewer, or one out of order.
const uint8_t* AfterRestart(const uint8_t* p, const uint8_t* end, uint64_t k) {
  uint64_t seen = 0;
  while (end - p >= 2) {
    p = static_cast<const uint8_t*>(std::memchr(p, 0xFF, static_cast<size_t>(end - p - 1)));
    if (p == nullptr) return nullptr;
    const uint8_t m = p[1];
    if (m == 0x00 || m == 0xFF) {  // a stuffed FF, or fill
      ++p;
      continue;
    }
    if (m < JPEG_RST0 || m > JPEG_RST0 + 7) return nullptr;  // the scan ended
    ++seen;
    if (m != JPEG_RST0 + ((seen - 1) & 7)) return nullptr;
    if (seen == k) return p + 2;
    p += 2;
  }
  return nullptr;
}

// Rows of MCUs above the part to decode need no entropy decoding when the
// scan restarts at row starts (pack_tool --jpeg-restarts writes a marker at
// every row): the JPEG is cut at the last restart marker above the part's
// first row and decoded from there as an image of its lower rows. Restarts
// reset the DC predictions, so the rows below the cut decode to the same
// pixels, but for the cut's first output row where fancy upsampling would
// read the chroma row above: the cut is made above the part, so that row is
// not in it. Header read, output set; returns the output rows cut away and
// leaves `c` ready for jpeg_read_header on the cut, or 0 (nothing changed).
uint32_t CutAbove(JpegDecoder* d, std::span<const uint8_t> bytes, const PixelRect& part) {
  jpeg_decompress_struct& c = d->cinfo;
  // One sequential Huffman scan of every component (one block an MCU when
  // there is a single component).
  if (c.progressive_mode || c.arith_code || c.restart_interval == 0 ||
      c.comps_in_scan != c.num_components ||
      (c.num_components == 1 && (c.max_h_samp_factor != 1 || c.max_v_samp_factor != 1))) {
    return 0;
  }
#if JPEG_LIB_VERSION >= 70
  const uint64_t scaled = static_cast<unsigned>(c.min_DCT_v_scaled_size);
#else
  const uint64_t scaled = static_cast<unsigned>(c.min_DCT_scaled_size);
#endif
  const uint64_t mcu_w = 8u * static_cast<unsigned>(c.max_h_samp_factor);
  const uint64_t mcu_h = 8u * static_cast<unsigned>(c.max_v_samp_factor);
  const uint64_t out_h = scaled * static_cast<unsigned>(c.max_v_samp_factor);  // an MCU row, output
  const uint64_t per_row = (c.image_width + mcu_w - 1) / mcu_w;
  const uint64_t interval = c.restart_interval;
  // The cut row: a row whose first MCU starts a restart interval, and whose
  // first output row lies above the part (that row's chroma context is the
  // cut's edge, not the row above it: it is the only row that differs).
  const uint64_t step = interval / std::gcd(per_row, interval);
  const uint64_t r0 = (part.y - 1) / out_h / step * step;
  if (r0 == 0 || r0 * mcu_h >= c.image_height) return 0;
  const uint8_t* data = c.src->next_input_byte;  // the scan's first byte
  const uint8_t* end = bytes.data() + bytes.size();
  if (data < bytes.data() || data > end) return 0;
  const uint64_t k0 = r0 * per_row / interval;
  const uint8_t* tail = AfterRestart(data, end, k0);
  const size_t header = static_cast<size_t>(data - bytes.data());
  const size_t at = FrameHeightAt(bytes.data(), header);
  if (tail == nullptr || at == 0 || ((unsigned{bytes[at]} << 8) | bytes[at + 1]) != c.image_height) {
    return 0;
  }
  const uint64_t rows = c.image_height - r0 * mcu_h;
  d->cut.height[0] = static_cast<uint8_t>(rows >> 8);
  d->cut.height[1] = static_cast<uint8_t>(rows & 0xFF);
  d->cut.pub.init_source = CutInit;
  d->cut.pub.fill_input_buffer = CutFill;
  d->cut.pub.skip_input_data = CutSkip;
  d->cut.pub.resync_to_restart = CutResync;
  d->cut.pub.term_source = CutTerm;
  d->cut.pieces[0] = bytes.first(at);
  d->cut.pieces[1] = d->cut.height;
  d->cut.pieces[2] = std::span<const uint8_t>(bytes.data() + at + 2, data);
  d->cut.pieces[3] = std::span<const uint8_t>(tail, end);
  d->cut.shift = static_cast<int>(k0 & 7);
  jpeg_abort_decompress(&c);
  c.src = &d->cut.pub;
  return static_cast<uint32_t>(r0 * out_h);
}

// Whether jpeg_crop_scanline gives the right pixels for this decode.
// libjpeg-turbo before 3.0 (its issue 669) sets a cropped component's
// downsampled_width to ceil(output_width * h / max_h), which holds only
// where the component's IDCT is scaled as the smallest one's: with DCT
// scaling, libjpeg scales the IDCT of a 4x-subsampled component up (4:1:0
// and 4:1:1 at 1/2 with fancy upsampling: to 8x8 where the luma's is 4x4)
// so that what is left to upsample is 2x; a crop then upsamples half the
// row, and the colour conversion reads the rest of the row from a buffer
// the upsampler never wrote (zeros since ZeroedSampleRows, before that
// whatever the heap held). Not where that component comes out of its IDCT
// at full size (4:2:0 and 4:2:2 at every scale), where the width is unused.
bool CropIsRight(const jpeg_decompress_struct& c) {
#if defined(LIBJPEG_TURBO_VERSION_NUMBER) && LIBJPEG_TURBO_VERSION_NUMBER >= 3000000
  (void)c;
  return true;
#else
#if JPEG_LIB_VERSION >= 70
  const int min = c.min_DCT_h_scaled_size;
#else
  const int min = c.min_DCT_scaled_size;
#endif
  for (int ci = 0; ci < c.num_components; ++ci) {
    const jpeg_component_info& k = c.comp_info[ci];
#if JPEG_LIB_VERSION >= 70
    const int size = k.DCT_h_scaled_size;
#else
    const int size = k.DCT_scaled_size;
#endif
    if (size != min && k.h_samp_factor * size != c.max_h_samp_factor * min) return false;
  }
  return true;
#endif
}

// Decodes the rows and columns of `*part` into `out` (part->w x part->h;
// jpeg_crop_scanline may widen the columns, and `*part` then says so: to
// the whole width where it would be wrong, see CropIsRight).
// Under setjmp, as DecodeUnderJump.
void ReadPart(JpegDecoder* d, bool cmyk, PixelRect* part, Image* out) {
  jpeg_decompress_struct& c = d->cinfo;
  if ((part->x > 0 || part->w < c.output_width) && !CropIsRight(c)) {
    part->x = 0;
    part->w = c.output_width;
  }
  if (part->x > 0 || part->w < c.output_width) {
    JDIMENSION x = part->x, w = part->w;
    jpeg_crop_scanline(&c, &x, &w);
    part->x = x;
    part->w = w;
  }
  if (part->y > 0 && jpeg_skip_scanlines(&c, part->y) != part->y) {
    ERREXIT(&c, JERR_BAD_STATE);  // never: the rows exist
  }
  const uint32_t w = part->w, h = part->h;
  const int comps = cmyk ? 4 : 3;
  const size_t npx = size_t{w} * h;
  out->width = w;
  out->height = h;
  out->pixels.resize(npx * 3);
  uint8_t* base = out->pixels.data();
  if (cmyk) {
    d->cmyk.resize(npx * 4);
    base = d->cmyk.data();
  }
  d->rows.resize(h);
  for (uint32_t y = 0; y < h; ++y) d->rows[y] = base + size_t{y} * w * comps;
  while (c.output_scanline < part->y + h) {
    const uint32_t done = c.output_scanline - part->y;
    jpeg_read_scanlines(&c, d->rows.data() + done, h - done);
  }
  // The whole image's end is read (a file cut short is found there); a
  // part above the last row stops here.
  if (c.output_scanline == c.output_height) {
    jpeg_finish_decompress(&c);
  } else {
    jpeg_abort_decompress(&c);
  }
  if (cmyk) InvertedCmykToRgb(d->cmyk.data(), npx, out->pixels.data());
}

// The output asked of libjpeg: RGB (CMYK for 4 components, converted here),
// at scale/8. Approximate: chroma upsampled by replication, merged with the
// colour conversion (libjpeg-turbo's SIMD merged upsampler), so a region
// needs no margin.
void SetOutput(jpeg_decompress_struct* c, bool cmyk, int scale_eighths, bool approximate) {
  c->out_color_space = cmyk ? JCS_CMYK : JCS_EXT_RGB;
  c->scale_num = static_cast<unsigned>(scale_eighths);
  c->scale_denom = 8;
  if (approximate) c->do_fancy_upsampling = FALSE;
}

// Runs under setjmp (libjpeg's errors longjmp here): no locals with
// destructors; the buffers live in `d` and `out`. `region` (null: the whole
// image) is what to decode at least, and `*where` what was.
Status DecodeUnderJump(JpegDecoder* d, std::span<const uint8_t> bytes, const DecodeLimits& limits,
                       Image* out, ImageInfo* info_only, const PixelRect* region, DecodedRegion* where,
                       int scale_eighths, bool approximate) {
  jpeg_decompress_struct& c = d->cinfo;
  jpeg_mem_src(&c, bytes.data(), static_cast<unsigned long>(bytes.size()));
  if (jpeg_read_header(&c, TRUE) != JPEG_HEADER_OK) {
    return Status::Corruption("corrupt JPEG: not a valid JPEG header (it holds tables but no image)");
  }
  d->header_done = true;
  const uint32_t w = c.image_width, h = c.image_height;
  if (w == 0 || h == 0) {
    return Status::Corruption("corrupt JPEG: not a valid JPEG header (it declares a " + std::to_string(w) +
                              "x" + std::to_string(h) + " image)");
  }
  if (info_only) {
    info_only->format = ImageFormat::kJpeg;
    info_only->width = w;
    info_only->height = h;
    jpeg_abort_decompress(&c);
    return Status::Ok();
  }
  if (uint64_t{w} * h > limits.max_pixels) {
    jpeg_abort_decompress(&c);
    return Status::ResourceExhausted("JPEG of " + std::to_string(w) + "x" + std::to_string(h) +
                                     " pixels exceeds the limit of " + std::to_string(limits.max_pixels) +
                                     " pixels");
  }
  const bool cmyk = c.jpeg_color_space == JCS_CMYK || c.jpeg_color_space == JCS_YCCK;
  SetOutput(&c, cmyk, scale_eighths, approximate);
  jpeg_calc_output_dimensions(&c);
  PixelRect p = Widened(c, region, !approximate);
  const uint32_t cut = p.y > 0 ? CutAbove(d, bytes, p) : 0;
  if (cut > 0) {
    if (jpeg_read_header(&c, TRUE) != JPEG_HEADER_OK) {
      return Status::Corruption("corrupt JPEG: no scan after its restart marker");
    }
    SetOutput(&c, cmyk, scale_eighths, approximate);
    p.y -= cut;
  }
  PrepareFastRestarts(d);
  jpeg_start_decompress(&c);
  InstallFastRestarts(d);
  const int comps = cmyk ? 4 : 3;
  const uint64_t sw = (uint64_t{w} * static_cast<unsigned>(scale_eighths) + 7) / 8;
  const uint64_t sh = (uint64_t{h} * static_cast<unsigned>(scale_eighths) + 7) / 8;
  if (c.output_components != comps || c.output_width != sw || c.output_height != sh - cut) {
    jpeg_abort_decompress(&c);
    return Status::Internal("libjpeg decodes to " + std::to_string(c.output_width) + "x" +
                            std::to_string(c.output_height) + "x" + std::to_string(c.output_components) +
                            (cut ? " below a restart marker" : ""));
  }
  ReadPart(d, cmyk, &p, out);
  if (where) {
    where->x = p.x;
    where->y = p.y + cut;
    where->cut_rows = cut;
    where->full_width = static_cast<uint32_t>(sw);  // (output_width is the crop's now)
    where->full_height = static_cast<uint32_t>(sh);
    where->scale_eighths = scale_eighths;
    where->image_width = w;
    where->image_height = h;
  }
  return Status::Ok();
}

Status RunJpeg(std::span<const uint8_t> bytes, const DecodeLimits& limits, Image* out, ImageInfo* info_only,
               const PixelRect* region = nullptr, DecodedRegion* where = nullptr, int scale_eighths = 8,
               bool approximate = false) {
  if (bytes.size() < 3 || bytes[0] != 0xFF || bytes[1] != 0xD8 || bytes[2] != 0xFF) {
    return Status::Corruption("not a JPEG file (it does not start with FF D8 FF)");
  }
  const std::unique_ptr<JpegDecoder> d = std::make_unique<JpegDecoder>();
  if (setjmp(d->err.jump)) {
    return Status::Corruption(std::string(d->header_done ? "corrupt JPEG: " : "corrupt JPEG: not a valid JPEG header: ") +
                              "libjpeg: " + d->err.message);
  }
  NL_RETURN_IF_ERROR(
      DecodeUnderJump(d.get(), bytes, limits, out, info_only, region, where, scale_eighths, approximate));
  if (d->err.truncated && !info_only) {
    return Status::Corruption("truncated JPEG: its data ends before the end marker (libjpeg: Premature end of JPEG file)");
  }
  return Status::Ok();
}

}  // namespace

Result<ImageInfo> ReadJpegInfo(std::span<const uint8_t> bytes) {
  ImageInfo info;
  NL_RETURN_IF_ERROR(RunJpeg(bytes, {}, nullptr, &info));
  return info;
}

Status DecodeJpegInto(std::span<const uint8_t> bytes, const DecodeLimits& limits, Image* out) {
  return RunJpeg(bytes, limits, out, nullptr);
}

Status DecodeJpegRegionInto(std::span<const uint8_t> bytes, const DecodeLimits& limits,
                            const PixelRect& region, DecodedRegion* out, int scale_eighths,
                            bool approximate) {
  if (scale_eighths < 1 || scale_eighths > 8) {
    return Status::InvalidArgument("JPEG scale must be 1/8..8/8, not " + std::to_string(scale_eighths) + "/8");
  }
  return RunJpeg(bytes, limits, &out->image, nullptr, &region, out, scale_eighths, approximate);
}

namespace {

// The compressor writes into `out`, grown as it fills. (Not jpeg_mem_dest:
// it frees its first buffer when it grows and tells the caller the new one
// only at the end, so after an error mid-file the caller holds a freed
// pointer.)
struct VectorDest {
  jpeg_destination_mgr pub;
  std::vector<uint8_t> out;
};
// Grows `v->out` to n bytes, or fails as libjpeg's allocator does (no
// exception through libjpeg's frames).
void GrowTo(j_compress_ptr c, VectorDest* v, size_t n) {
  bool ok = true;
  try {
    v->out.resize(n);
  } catch (const std::bad_alloc&) {
    ok = false;
  }
  if (!ok) ERREXIT1(c, JERR_OUT_OF_MEMORY, 0);
}
extern "C" void VectorDestInit(j_compress_ptr c) {
  auto* v = reinterpret_cast<VectorDest*>(c->dest);
  GrowTo(c, v, size_t{1} << 16);
  v->pub.next_output_byte = v->out.data();
  v->pub.free_in_buffer = v->out.size();
}
extern "C" boolean VectorDestGrow(j_compress_ptr c) {  // called when the buffer is full
  auto* v = reinterpret_cast<VectorDest*>(c->dest);
  const size_t used = v->out.size();
  GrowTo(c, v, used * 2);
  v->pub.next_output_byte = v->out.data() + used;
  v->pub.free_in_buffer = v->out.size() - used;
  return TRUE;
}
extern "C" void VectorDestTerm(j_compress_ptr c) {
  auto* v = reinterpret_cast<VectorDest*>(c->dest);
  v->out.resize(v->out.size() - v->pub.free_in_buffer);
}

// A transcode's state, on the heap so that nothing under setjmp has a
// destructor: the decompressor (and the error manager both use), the
// compressor, and its output.
struct Transcoder {
  JpegDecoder d;
  jpeg_compress_struct cc{};
  bool cc_made = false;
  VectorDest dest{};
  ~Transcoder() {
    if (cc_made) jpeg_destroy_compress(&cc);
  }
};

// True when the markers an encoder writes itself already say what `m` says.
bool WrittenByEncoder(const jpeg_compress_struct& cc, jpeg_saved_marker_ptr m) {
  const auto starts = [m](const char* tag, unsigned n) {
    return m->data_length >= n && std::memcmp(m->data, tag, n) == 0;
  };
  return (cc.write_JFIF_header && m->marker == JPEG_APP0 && starts("JFIF\0", 5)) ||
         (cc.write_Adobe_marker && m->marker == JPEG_APP0 + 14 && starts("Adobe", 5));
}

enum class Transcoded { kDone, kAsItIs, kTooLarge };

// Under setjmp, as DecodeUnderJump.
Transcoded TranscodeUnderJump(Transcoder* t, std::span<const uint8_t> bytes, const DecodeLimits& limits) {
  jpeg_decompress_struct& c = t->d.cinfo;
  jpeg_mem_src(&c, bytes.data(), static_cast<unsigned long>(bytes.size()));
  jpeg_save_markers(&c, JPEG_COM, 0xFFFF);
  for (int k = 0; k < 16; ++k) jpeg_save_markers(&c, JPEG_APP0 + k, 0xFFFF);
  if (jpeg_read_header(&c, TRUE) != JPEG_HEADER_OK) ERREXIT(&c, JERR_NO_IMAGE);
  t->d.header_done = true;
  // (Its coefficients are read whole: the pixel limit first, as a decode's.)
  if (uint64_t{c.image_width} * c.image_height > limits.max_pixels) return Transcoded::kTooLarge;
  const uint64_t mcu_w = 8u * static_cast<unsigned>(c.max_h_samp_factor);
  const uint64_t per_row = (c.image_width + mcu_w - 1) / mcu_w;
  if (c.progressive_mode || c.arith_code ||
      (c.restart_interval != 0 && per_row % c.restart_interval == 0)) {
    return Transcoded::kAsItIs;
  }
  jvirt_barray_ptr* coefs = jpeg_read_coefficients(&c);
  t->cc.err = c.err;
  jpeg_create_compress(&t->cc);
  t->cc_made = true;
  jpeg_copy_critical_parameters(&c, &t->cc);
  t->cc.restart_in_rows = 1;
  t->cc.optimize_coding = TRUE;
  t->dest.pub.init_destination = VectorDestInit;
  t->dest.pub.empty_output_buffer = VectorDestGrow;
  t->dest.pub.term_destination = VectorDestTerm;
  t->cc.dest = &t->dest.pub;
  jpeg_write_coefficients(&t->cc, coefs);
  for (jpeg_saved_marker_ptr m = c.marker_list; m != nullptr; m = m->next) {
    if (!WrittenByEncoder(t->cc, m)) jpeg_write_marker(&t->cc, m->marker, m->data, m->data_length);
  }
  jpeg_finish_compress(&t->cc);
  jpeg_finish_decompress(&c);
  return Transcoded::kDone;
}

}  // namespace

Result<std::vector<uint8_t>> AddJpegRowRestarts(std::span<const uint8_t> bytes, const DecodeLimits& limits) {
  if (bytes.size() < 3 || bytes[0] != 0xFF || bytes[1] != 0xD8 || bytes[2] != 0xFF) {
    return Status::Corruption("not a JPEG file (it does not start with FF D8 FF)");
  }
  const std::unique_ptr<Transcoder> t = std::make_unique<Transcoder>();
  if (setjmp(t->d.err.jump)) {
    return Status::Corruption(std::string(t->d.header_done ? "corrupt JPEG: " : "corrupt JPEG: not a valid JPEG header: ") +
                              "libjpeg: " + t->d.err.message);
  }
  const Transcoded done = TranscodeUnderJump(t.get(), bytes, limits);
  if (done == Transcoded::kTooLarge) {
    const jpeg_decompress_struct& c = t->d.cinfo;
    return Status::ResourceExhausted("JPEG of " + std::to_string(c.image_width) + "x" +
                                     std::to_string(c.image_height) + " pixels exceeds the limit of " +
                                     std::to_string(limits.max_pixels) + " pixels");
  }
  if (done == Transcoded::kAsItIs) return std::vector<uint8_t>(bytes.begin(), bytes.end());
  if (t->d.err.truncated) {
    return Status::Corruption("truncated JPEG: its data ends before the end marker (libjpeg: Premature end of JPEG file)");
  }
  return std::move(t->dest.out);
}

namespace {
std::string TjError(tjhandle h) { return tjGetErrorStr2(h); }
}  // namespace

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
