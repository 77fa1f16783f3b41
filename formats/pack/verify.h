// Checking a shard set against its manifest, and reading samples back.
#pragma once

#include <string>
#include <vector>

#include "formats/image.h"
#include "formats/manifest.h"
#include "formats/shard_files.h"
#include "base/status.h"

namespace nl {

struct VerifyProblem {
  std::string where;  // "train/shard-00000 index 17", or the manifest's path
  std::string what;
};

struct VerifyReport {
  uint64_t records_checked = 0;
  uint64_t images_decoded = 0;
  std::vector<VerifyProblem> problems;
  bool ok() const { return problems.empty(); }
};

struct VerifyOptions {
  bool quick = false;    // manifest, counts, keys, sizes, checksums; no decoding
  uint32_t threads = 0;  // for decoding; 0: all allowed cores
  size_t max_problems = 1000;
  // Records and images over this many pixels are problems (as the loaders
  // refuse them), checked from the header before anything is allocated.
  uint64_t max_pixels = kDefaultMaxPixels;
  // Where the shards' files come from; null: ShardFiles::Local(). Not owned.
  const ShardFiles* files = nullptr;
};

// Every problem found is reported (up to max_problems), not just the first.
// Only an unreadable manifest makes the whole check fail early.
VerifyReport VerifyShardSet(const std::string& root, const VerifyOptions& options);

// Reads sample `index` of `split` and returns its pixels (decoded if stored as
// PNG/JPEG, within `max_pixels`), with its label. A payload that decodes to
// another size than its header states is Corruption naming the split, shard,
// index and both sizes.
struct DecodedSample {
  Image image;
  uint32_t label = 0;
};
Result<DecodedSample> ReadSample(const std::string& root, const std::string& split, uint64_t index,
                                 uint64_t max_pixels = kDefaultMaxPixels,
                                 const ShardFiles& files = ShardFiles::Local());

}  // namespace nl
