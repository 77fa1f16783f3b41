// Packing: a SampleSource into shards, and whole shard sets on disk, atomically.
//
//   PackOptions o;  o.encoding = PackEncoding::kRaw;  o.threads = 2;
//   Result<PackSummary> s = PackCifar100("/data/cifar-100-binary", "/data/c100", o);
//
// Decoding (validation) runs on `threads` workers while one writer appends
// records in index order, so the same input always gives byte-identical
// shards. The output appears only when complete: a shard set is built in a
// temporary directory beside OUT and renamed into place; a split added to an
// existing OUT is built inside it and becomes visible when the manifest is
// replaced (atomically). Interrupted packs leave only temporaries, which the
// next pack into the same OUT removes.
//
// Packs into one OUT exclude each other: each holds an exclusive flock on
// "OUT.pack-lock" (beside OUT) from before it looks at OUT until it has
// committed, so a second pack waits and then sees the first one's result.
// Each temporary holds its own lock file (".pack-lock" inside it); a
// temporary is removed as stale only when that lock can be taken.
//
// --force replaces only a shard set: OUT that exists but is not one is
// refused unless replace_non_shard_set. OUT inside SRC or SRC inside OUT
// (canonical paths) is always refused.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

#include "formats/image.h"
#include "formats/manifest.h"
#include "formats/pack/cifar_source.h"
#include "formats/pack/source.h"
#include "base/status.h"

namespace nl {

// keep: a file's own bytes (CIFAR: raw); raw: decoded RGB; png, jpeg:
// re-encoded (jpeg at PackOptions::jpeg_quality, 4:2:0).
enum class PackEncoding { kKeep, kRaw, kPng, kJpeg };
Result<PackEncoding> ParsePackEncoding(const std::string& s);

struct PackProgress {
  std::string split;
  uint64_t done = 0;  // samples handled (written or skipped)
  uint64_t total = 0;
  uint64_t bytes = 0;  // record bytes written
  double seconds = 0;  // since this split's pack began
};

struct PackOptions {
  PackEncoding encoding = PackEncoding::kKeep;
  uint32_t shards = 0;   // per split; 0: one per 100,000 samples
  uint32_t threads = 0;  // 0: all cores this process may use
  bool skip_bad = false;
  bool force = false;
  // Allows replacing (deleting) an OUT that is not a shard set. Implies force.
  bool replace_non_shard_set = false;
  int png_level = 6;
  int jpeg_quality = 90;  // 1..100, for jpeg (and keep's re-encoded JPEGs)
  // Images whose longer side exceeds this are stored at MaxSideSize (our
  // Pillow-exact bilinear resize); 0: as they are. With keep, a resized
  // image is re-encoded in its own format (JPEG at jpeg_quality, PNG). The
  // manifest keeps every sample's original size (SplitInfo::max_side,
  // original_sizes).
  uint32_t max_side = 0;
  // JPEGs stored (kept files and re-encoded ones) get a restart marker at
  // every row of MCUs (AddJpegRowRestarts): the same pixels, about as many
  // bytes, and a crop's decode skips the rows above it; one the rewrite
  // cannot encode is stored as it is. Off: keep stores each file's bytes as
  // they are.
  bool jpeg_restarts = false;
  DecodeLimits limits;
  // Called from the writing thread after each batch of samples. May be empty.
  std::function<void(const PackProgress&)> progress;
  // Set from another thread (e.g. a signal handler) to stop; the pack then
  // fails with Aborted and leaves nothing behind.
  const std::atomic<bool>* cancel = nullptr;
  // Called once, before waiting, when another pack holds OUT's lock file
  // (its path is the argument). May be empty.
  std::function<void(const std::string& lock_file)> on_wait;
};

// The lock file a pack into `out` holds: "<out>.pack-lock".
std::string PackLockPath(const std::string& out);

struct PackSummary {
  Manifest manifest;
  std::vector<std::string> splits_written;
  uint64_t samples = 0;
  uint64_t skipped = 0;
  uint64_t bytes = 0;
  double seconds = 0;
};

// Packs `source` into root/<split>/shard-NNNNN and returns the split's
// description. Without skip_bad, the first bad sample (in index order) stops
// the pack with an error naming it.
Result<SplitInfo> PackSplit(const SampleSource& source, const std::string& root,
                            const std::string& split, const PackOptions& options);

// Both splits (train, test) of CIFAR-100 into a new OUT. PackEncoding::kKeep
// means raw here (the source is not image files).
Result<PackSummary> PackCifar100(const std::string& src, const std::string& out, CifarLabel label,
                                 const PackOptions& options);

// One split of an ImageFolder into OUT: a new OUT, or a split added to an
// existing one (its classes must match). A split that already exists is
// refused unless options.force, which replaces that split.
Result<PackSummary> PackImageFolder(const std::string& src, const std::string& out,
                                    const std::string& split, const PackOptions& options);

uint32_t DefaultThreads();

}  // namespace nl
