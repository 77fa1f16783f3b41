#include "loader/ring/ring_layout.h"

#include <time.h>

#include <limits>

namespace nl::ring {
namespace {

uint64_t RoundUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

// a + b and a * b, false on overflow.
bool Add(uint64_t a, uint64_t b, uint64_t* out) { return !__builtin_add_overflow(a, b, out); }
bool Mul(uint64_t a, uint64_t b, uint64_t* out) { return !__builtin_mul_overflow(a, b, out); }

}  // namespace

const char* ActivityName(Activity a) {
  switch (a) {
    case Activity::kIdle:
      return "idle";
    case Activity::kWaitingForConsumer:
      return "waiting for a consumer to attach";
    case Activity::kFilling:
      return "filling a batch (reading, decoding, resizing)";
    case Activity::kWaitingForSlot:
      return "waiting for the consumer to release a slot";
    case Activity::kRestarting:
      return "restarting at the position the consumer asked for";
    case Activity::kEnded:
      return "done: its last epoch is out";
  }
  return "unknown";
}

Result<Geometry> MakeGeometry(uint32_t slot_count, uint32_t batch_size, uint32_t height,
                              uint32_t width, Dtype dtype, PixelLayout layout) {
  if (slot_count < 1 || slot_count > kMaxSlots) {
    return Status::InvalidArgument("ring slots must be 1.." + std::to_string(kMaxSlots) +
                                   ", not " + std::to_string(slot_count));
  }
  if (batch_size < 1 || batch_size > kMaxBatch) {
    return Status::InvalidArgument("ring batch size must be 1.." + std::to_string(kMaxBatch) +
                                   ", not " + std::to_string(batch_size));
  }
  if (height < 1 || width < 1 || height > kMaxSide || width > kMaxSide) {
    return Status::InvalidArgument("ring image sides must be 1.." + std::to_string(kMaxSide) +
                                   ", not " + std::to_string(width) + "x" +
                                   std::to_string(height));
  }
  Geometry g;
  g.slot_count = slot_count;
  g.batch_size = batch_size;
  g.channels = 3;
  g.height = height;
  g.width = width;
  g.dtype = dtype;
  g.layout = layout;
  g.sample_bytes = uint64_t{3} * height * width * DtypeBytes(dtype);
  g.pixels_offset = RoundUp(sizeof(SlotHeader), kPage);
  g.labels_offset = RoundUp(g.pixels_offset + g.sample_bytes * batch_size, 64);
  g.indices_offset = g.labels_offset + uint64_t{8} * batch_size;
  g.slot_bytes = RoundUp(g.indices_offset + uint64_t{8} * batch_size, kPage);
  g.slots_offset = RoundUp(sizeof(Header), kPage);
  g.total_bytes = g.slots_offset + g.slot_bytes * slot_count;
  if (g.total_bytes > kMaxSegmentBytes) {
    return Status::ResourceExhausted("a ring of " + std::to_string(slot_count) + " slots of " +
                                     std::to_string(g.slot_bytes) + " bytes is over the " +
                                     std::to_string(kMaxSegmentBytes >> 30) + " GiB limit");
  }
  return g;
}

Status CheckGeometry(const Header& h, uint64_t segment_bytes) {
  auto bad = [](const std::string& what) {
    return Status::Corruption("the ring segment is not one this consumer can read: " + what);
  };
  if (segment_bytes < sizeof(Header)) {
    return bad("it has " + std::to_string(segment_bytes) + " bytes, less than a header (" +
               std::to_string(sizeof(Header)) + ")");
  }
  if (h.magic != kMagic) return bad("wrong magic (not a numa_loader ring)");
  if (h.version != kVersion) {
    return bad("version " + std::to_string(h.version) + ", this consumer reads version " +
               std::to_string(kVersion) + " (loader serve and the client are from different builds)");
  }
  if (h.header_bytes != sizeof(Header)) {
    return bad("header of " + std::to_string(h.header_bytes) + " bytes, expected " +
               std::to_string(sizeof(Header)));
  }
  const Geometry& g = h.geometry;
  if (g.slot_count < 1 || g.slot_count > kMaxSlots) {
    return bad("slot count " + std::to_string(g.slot_count));
  }
  if (g.batch_size < 1 || g.batch_size > kMaxBatch) {
    return bad("batch size " + std::to_string(g.batch_size));
  }
  if (g.channels != 3) return bad(std::to_string(g.channels) + " channels (3 expected)");
  if (g.height < 1 || g.width < 1 || g.height > kMaxSide || g.width > kMaxSide) {
    return bad("image size " + std::to_string(g.width) + "x" + std::to_string(g.height));
  }
  if (g.dtype != Dtype::kUint8 && g.dtype != Dtype::kFloat32) {
    return bad("dtype " + std::to_string(static_cast<uint32_t>(g.dtype)));
  }
  if (g.layout != PixelLayout::kNCHW && g.layout != PixelLayout::kNHWC) {
    return bad("layout " + std::to_string(static_cast<uint32_t>(g.layout)));
  }
  if (g.sample_bytes != uint64_t{3} * g.height * g.width * DtypeBytes(g.dtype)) {
    return bad("sample bytes " + std::to_string(g.sample_bytes) + " do not match the image shape");
  }
  uint64_t pixels = 0, pixels_end = 0, labels_end = 0, indices_end = 0, slots = 0, end = 0;
  if (g.pixels_offset < sizeof(SlotHeader) || g.pixels_offset % kPage != 0 ||
      !Mul(g.sample_bytes, g.batch_size, &pixels) ||
      !Add(g.pixels_offset, pixels, &pixels_end)) {
    return bad("pixel area at " + std::to_string(g.pixels_offset));
  }
  if (g.labels_offset < pixels_end || g.labels_offset % 8 != 0 ||
      !Add(g.labels_offset, uint64_t{8} * g.batch_size, &labels_end)) {
    return bad("labels at " + std::to_string(g.labels_offset) + " overlap the pixels");
  }
  if (g.indices_offset < labels_end || g.indices_offset % 8 != 0 ||
      !Add(g.indices_offset, uint64_t{8} * g.batch_size, &indices_end)) {
    return bad("indices at " + std::to_string(g.indices_offset) + " overlap the labels");
  }
  if (g.slot_bytes < indices_end || g.slot_bytes % kPage != 0) {
    return bad("slot of " + std::to_string(g.slot_bytes) + " bytes cannot hold a batch");
  }
  if (g.slots_offset < sizeof(Header) || g.slots_offset % kPage != 0 ||
      !Mul(g.slot_bytes, g.slot_count, &slots) || !Add(g.slots_offset, slots, &end)) {
    return bad("slots at " + std::to_string(g.slots_offset));
  }
  if (end != g.total_bytes || g.total_bytes != segment_bytes) {
    return bad("geometry says " + std::to_string(end) + " bytes (header: " +
               std::to_string(g.total_bytes) + "), the segment has " +
               std::to_string(segment_bytes));
  }
  if (h.job_id[kJobIdMax] != '\0') return bad("job id not terminated");
  return Status::Ok();
}

Result<std::string> SocketName(const std::string& job_id, int rank) {
  if (job_id.empty() || job_id.size() > kJobIdMax) {
    return Status::InvalidArgument("a job id has 1.." + std::to_string(kJobIdMax) +
                                   " characters, not " + std::to_string(job_id.size()));
  }
  for (unsigned char c : job_id) {
    if (c < 0x21 || c > 0x7e || c == '/') {
      return Status::InvalidArgument(
          "a job id is printable ASCII without spaces or '/': byte " + std::to_string(c) +
          " is not allowed");
    }
  }
  if (rank < 0 || rank > (1 << 20)) {
    return Status::InvalidArgument("rank " + std::to_string(rank) + " is out of range");
  }
  return "numa_loader/" + job_id + "/" + std::to_string(rank);
}

uint64_t MonotonicNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

}  // namespace nl::ring
