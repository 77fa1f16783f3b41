// A ShardFiles that serves the shard set's own files with faults injected,
// as leveldb's fault-injecting Envs do: for tests of what the readers make
// of an unreadable, short-reading or shrinking data.mdb, without a special
// file system. The files on disk are not changed; only what the seam says
// of them is.
//
//   testing::FaultShardFiles files;              // no faults yet: the local files
//   auto reader = SplitReader::Open(root, m, "train", files);
//   files.Set({.shrink_to = 8192});               // the open files shrink now
//   reader->BeginRead() ... -> Corruption "data.mdb is now 8192 bytes, ..."
//
// What it cannot reach is what LMDB does itself (formats/shard_files.h): a
// shrink it reports is not a shrink of LMDB's map, so reads through the map
// still see the whole file.
#pragma once

#include <cerrno>
#include <cstdint>
#include <memory>
#include <string>

#include "formats/shard_files.h"

namespace nl::testing {

struct ShardFaults {
  // Only this shard's file (its manifest path) is faulty; "": every shard's.
  std::string shard = {};
  int open_errno = 0;  // Open fails with it (as open(2) would)
  int size_errno = 0;  // Size fails with it (as fstat(2) would)
  // ReadSome fails with read_errno for reads that reach read_error_from or
  // beyond (0: every read; the meta pages are at bytes 0..8191).
  int read_errno = 0;
  uint64_t read_error_from = 0;
  // >0: every ReadSome returns at most this many bytes (short reads).
  size_t max_read = 0;
  // The file's size as seen through the seam: Size says it, and reads end
  // there (0 bytes past it), as a file cut short would. UINT64_MAX: none.
  uint64_t shrink_to = UINT64_MAX;
  // OpenDirect fails with it (a file system that refuses O_DIRECT): 0
  // passes it on, EINVAL by default so that every read takes ReadSome.
  int direct_errno = EINVAL;
};

class FaultShardFiles final : public ShardFiles {
 public:
  explicit FaultShardFiles(ShardFaults faults = {});
  // The faults from now on, for files opened before too. Thread-safe.
  void Set(ShardFaults faults);
  Result<std::unique_ptr<ShardFile>> Open(const std::string& root,
                                          const ShardInfo& info) const override;
  // ReadSome calls answered so far, and those that were cut short by max_read.
  uint64_t reads() const;
  uint64_t short_reads() const;

  struct State;  // shared with the files it opened

 private:
  std::shared_ptr<State> state_;
};

}  // namespace nl::testing
