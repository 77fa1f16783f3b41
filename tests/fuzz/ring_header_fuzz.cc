// libFuzzer target: the ring header a consumer validates on attach
// (CheckGeometry), before it touches any slot. The input picks a valid
// geometry (MakeGeometry), then overwrites bytes of the header (offset,
// bytes) and the segment size, so the fuzzer reaches deep checks as well as
// plain garbage. A header accepted must keep every slot inside the segment.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "loader/ring/ring_layout.h"

namespace {
struct Reader {
  const uint8_t* p;
  size_t n;
  template <typename T>
  T Take() {
    T v{};
    const size_t k = n < sizeof v ? n : sizeof v;
    std::memcpy(&v, p, k);
    p += k;
    n -= k;
    return v;
  }
};
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Reader in{data, size};
  auto* h = new nl::ring::Header();
  const uint32_t slots = 1 + in.Take<uint8_t>() % 8, batch = 1 + in.Take<uint16_t>() % 512;
  const uint32_t side = 1 + in.Take<uint16_t>() % 256;
  const uint8_t kinds = in.Take<uint8_t>();
  nl::Result<nl::ring::Geometry> g =
      nl::ring::MakeGeometry(slots, batch, side, side, (kinds & 1) ? nl::ring::Dtype::kFloat32 : nl::ring::Dtype::kUint8,
                             (kinds & 2) ? nl::ring::PixelLayout::kNHWC : nl::ring::PixelLayout::kNCHW);
  h->magic = nl::ring::kMagic;
  h->version = nl::ring::kVersion;
  h->header_bytes = sizeof(nl::ring::Header);
  if (g.ok()) h->geometry = *g;
  uint64_t segment = g.ok() ? g->total_bytes : 0;
  if (kinds & 4) segment = in.Take<uint64_t>();
  // Then (offset, byte) edits of the header.
  auto* bytes = reinterpret_cast<uint8_t*>(h);
  while (in.n >= 3) {
    const uint16_t at = in.Take<uint16_t>() % sizeof(nl::ring::Header);
    bytes[at] = in.Take<uint8_t>();
  }
  if (nl::ring::CheckGeometry(*h, segment).ok()) {
    const nl::ring::Geometry& x = h->geometry;
    unsigned __int128 end = x.slots_offset + static_cast<unsigned __int128>(x.slot_count) * x.slot_bytes;
    if (end > segment || x.indices_offset + 8ull * x.batch_size > x.slot_bytes) __builtin_trap();
  }
  delete h;
  return 0;
}
