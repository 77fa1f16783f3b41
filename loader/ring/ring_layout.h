// The shared-memory ring's layout: what lies where in one rank's segment.
// The protocol that moves batches through it is in loader/ring/PROTOCOL.md.
//
// Everything here is plain data at fixed offsets (no pointers), little-endian
// on the one machine both processes share. The producer (`loader serve`)
// creates the segment; the consumer maps it and trusts nothing in it until
// CheckGeometry() has accepted the header against the segment's real size.
#pragma once

#include <boost/interprocess/sync/interprocess_mutex.hpp>
#include <boost/interprocess/sync/interprocess_semaphore.hpp>
#include <cstddef>
#include <cstdint>
#include <string>

#include "base/status.h"
#include "loader/pipeline/pipeline.h"

namespace nl::ring {

inline constexpr uint64_t kMagic = 0x31474e49524c4e00ull;  // "\0NLRING1" read little-endian
inline constexpr uint32_t kVersion = 2;  // 2: semaphore wake-ups (1 had condition variables)
inline constexpr size_t kPage = 4096;          // slots and pixel areas start on a page
inline constexpr size_t kErrorBytes = 4096;    // the producer's last words, NUL-terminated
inline constexpr size_t kJobIdMax = 64;        // bytes of a job id (printable ASCII)
inline constexpr uint32_t kMaxSlots = 1024;    // = kMaxPrefetch
inline constexpr uint32_t kMaxBatch = 1u << 16;
inline constexpr uint32_t kMaxSide = 1u << 14;
inline constexpr uint64_t kMaxSegmentBytes = 1ull << 40;

enum class Dtype : uint32_t { kUint8 = 0, kFloat32 = 1 };
enum class PixelLayout : uint32_t { kNCHW = 0, kNHWC = 1 };

// Who holds a slot. Changed only under Control::mutex.
enum class SlotState : uint32_t {
  kFree = 0,   // the producer's: its pipeline may be writing it
  kReady = 1,  // published, waiting for the consumer
  kTaken = 2,  // the consumer's, until it frees it
};

// The producer's state as the consumer sees it. Changed only under the mutex.
enum class ProducerState : uint32_t {
  kStarting = 0,  // segment made, no consumer yet
  kRunning = 1,   // publishing batches
  kEnd = 2,       // the last of --epochs is out (a seek starts it again)
  kError = 3,     // Header::error says why; the producer exits
  kStopped = 4,   // stopped by a signal (Header::error says which); it exits
};

// What the producer was doing, for "alive but stuck" reports.
enum class Activity : uint32_t {
  kIdle = 0,
  kWaitingForConsumer = 1,
  kFilling = 2,       // waiting for the pipeline to finish batch (epoch, batch)
  kWaitingForSlot = 3,  // every slot is held by the consumer
  kRestarting = 4,    // answering a seek
  kEnded = 5,
};
const char* ActivityName(Activity a);

struct Geometry {
  uint32_t slot_count = 0;
  uint32_t batch_size = 0;
  uint32_t channels = 3, height = 0, width = 0;
  Dtype dtype = Dtype::kUint8;
  PixelLayout layout = PixelLayout::kNCHW;
  uint32_t reserved = 0;
  uint64_t sample_bytes = 0;    // channels * height * width * dtype size
  uint64_t slot_bytes = 0;      // distance between slots (a multiple of kPage)
  uint64_t pixels_offset = 0;   // within a slot: batch_size * sample_bytes
  uint64_t labels_offset = 0;   // within a slot: batch_size int64
  uint64_t indices_offset = 0;  // within a slot: batch_size int64
  uint64_t slots_offset = 0;    // from the start of the segment
  uint64_t total_bytes = 0;     // the segment's size
};

// The start of each slot.
struct SlotHeader {
  uint32_t state = 0;        // SlotState
  uint32_t reserved = 0;
  uint64_t generation = 0;   // the consumer request this batch answers
  uint64_t position = 0;     // publication number (the ring's sequence, never reset)
  BatchMeta meta;            // written by the pipeline before publication
};

// Wake-ups are semaphores, not condition variables: glibc's
// pthread_cond_broadcast can wait for a waiter that was killed inside
// pthread_cond_wait (it never confirms its wake-up), which would hang the
// survivor. sem_post never waits for anyone. A side posts only when the
// other has said (under the mutex) that it is about to wait, so the counts
// stay at 0 or 1.
//
// The mutex is Boost's process-shared one, not a base/mutex.h Mutex, and
// the fields it guards carry no NL_GUARDED_BY: they lie in shared memory,
// written by the other process too, which no compiler sees; and the lock is
// taken with a timeout (TryLockFor, ring_lock.h) whose success is a value
// known at run time, in a lock object returned by value, and let go inside
// SleepUntilWoken, none of which clang's analysis follows (it would need an
// assertion at each use that checks nothing). Its rule is kept by
// PROTOCOL.md and the ring's tests instead.
struct Control {
  boost::interprocess::interprocess_mutex mutex;
  boost::interprocess::interprocess_semaphore on_publish{0};  // producer -> consumer
  boost::interprocess::interprocess_semaphore on_free{0};     // consumer -> producer: freed, seek
  // Guarded by mutex:
  uint32_t consumer_waiting = 0;  // the consumer waits on on_publish
  uint32_t producer_waiting = 0;  // the producer waits on on_free
  uint32_t state = 0;          // ProducerState
  uint32_t activity = 0;       // Activity
  uint64_t activity_since_ns = 0;  // CLOCK_MONOTONIC (shared by both processes)
  uint64_t activity_epoch = 0, activity_batch = 0;
  uint64_t last_publish_ns = 0;
  uint64_t published = 0;      // batches published so far (positions 0 .. published-1)
  uint64_t consumed = 0;       // next position the consumer takes
  uint64_t request_id = 0;     // bumped by each seek; batches carry it as generation
  uint64_t request_epoch = 0, request_batch = 0;
  uint64_t serving_request = 0;  // the request the producer's pipeline answers now
};

struct Header {
  uint64_t magic = 0;
  uint32_t version = 0;
  uint32_t header_bytes = 0;  // sizeof(Header) of the producer
  Geometry geometry;
  int32_t producer_pid = 0;
  uint32_t producer_uid = 0;
  int32_t consumer_pid = 0;   // written by the consumer once it has accepted the segment
  int32_t rank = 0;
  uint64_t batches_per_epoch = 0;
  uint64_t epochs = 0;        // 0: unbounded
  uint64_t first_epoch = 0;
  uint64_t first_batch = 0;   // where the producer starts before any seek
  char job_id[kJobIdMax + 1] = {};
  alignas(64) Control control;
  char error[kErrorBytes] = {};
};

// Lays out a segment for the given batch shape: header, then slot_count
// page-aligned slots (header, pixels on a page, labels, indices).
Result<Geometry> MakeGeometry(uint32_t slot_count, uint32_t batch_size, uint32_t height,
                              uint32_t width, Dtype dtype, PixelLayout layout);

// Checks a header read from a segment of `segment_bytes`: magic, version,
// header size, and a geometry that is self-consistent and fits the segment
// (every offset and size bounded, no overflow). The message names the field.
Status CheckGeometry(const Header& h, uint64_t segment_bytes);

inline size_t DtypeBytes(Dtype d) { return d == Dtype::kFloat32 ? 4 : 1; }
inline SlotHeader* SlotAt(Header* h, uint32_t i) {
  return reinterpret_cast<SlotHeader*>(reinterpret_cast<char*>(h) + h->geometry.slots_offset +
                                       i * h->geometry.slot_bytes);
}
inline char* SlotBase(Header* h, uint32_t i) { return reinterpret_cast<char*>(SlotAt(h, i)); }

// The abstract-namespace socket name of a job's rank ("numa_loader/<job>/<rank>"),
// after checking the job id: 1..kJobIdMax printable ASCII bytes, no '/'.
Result<std::string> SocketName(const std::string& job_id, int rank);

uint64_t MonotonicNs();

}  // namespace nl::ring
