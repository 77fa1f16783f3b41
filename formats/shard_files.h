// Where a shard set's shard files come from: the seam between the shard
// readers and the bytes, as leveldb's Env is for its files. A reader asks
// it for a shard's data.mdb (opened, resolved to a local directory), the
// file's size, and byte ranges of it; it does not open, stat or pread the
// file itself.
//
//   const ShardFiles& files = ShardFiles::Local();  // root/<shard>/data.mdb
//   NL_ASSIGN_OR_RETURN(std::unique_ptr<ShardFile> f, files.Open(root, info));
//   NL_ASSIGN_OR_RETURN(uint64_t size, f->Size());
//   NL_ASSIGN_OR_RETURN(size_t got, f->ReadSome(offset, buffer, n));
//
// What does not go through it: LMDB opens the shard's directory by path
// (mdb_env_open on dir()), reads its meta pages through its own descriptor
// and maps data.mdb itself; ShardReader::ReadTxn::Get's zero-copy views
// point into LMDB's map. So a source must leave a readable local file in
// dir(), and the reader checks that the file LMDB opened is the one the
// seam opened (the same inode as fd()). Tests inject faults with
// tests/support/fault_shard_files.h; docs/DESIGN.md ("Shard files") says
// which reads take which path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "base/fd.h"
#include "base/status.h"
#include "formats/manifest.h"

namespace nl {

// One shard's data.mdb, open for reading. Thread-safe: readers share it.
// Errors of Size, ReadSome and OpenDirect are what the system said
// (Status::FromErrno's code: NotFound for ENOENT, else IOError), with no
// file or offset in the message: callers add theirs with WithContext.
class ShardFile {
 public:
  virtual ~ShardFile() = default;
  // The local directory holding data.mdb: what LMDB opens (it takes a path).
  virtual const std::string& dir() const = 0;
  // A descriptor of data.mdb open for reading, owned by this file: the
  // identity LMDB's own descriptor is checked against, and the target of
  // posix_fadvise hints (SplitReader::ReadTxn::WillNeed).
  virtual int fd() const = 0;
  // The file's size now (it may change under a reader: cut short, replaced).
  virtual Result<uint64_t> Size() const = 0;
  // Reads up to `n` bytes at `offset` into `out`: the count read, fewer than
  // `n` allowed (callers read on), 0 at the file's end.
  virtual Result<size_t> ReadSome(uint64_t offset, uint8_t* out, size_t n) const = 0;
  // A second descriptor of the same file whose reads bypass the page cache
  // (O_DIRECT: offsets, sizes and memory 4 KiB-aligned), for the window
  // stager's reads; an error where the file system or the source refuses
  // it (the stager then reads through ReadSome).
  virtual Result<Fd> OpenDirect() const = 0;
};

// Resolves a shard to its file. Thread-safe. Only Open uses the ShardFiles;
// the files it opens may outlive it.
class ShardFiles {
 public:
  virtual ~ShardFiles() = default;
  // Shard `info.path` of the shard set at `root`, opened. Errors name the
  // shard and the file: "cannot open shard train/shard-00000
  // (/data/set/train/shard-00000/data.mdb): No such file or directory".
  virtual Result<std::unique_ptr<ShardFile>> Open(const std::string& root,
                                                  const ShardInfo& info) const = 0;
  // The shard set's own files: root/<info.path>/data.mdb, a regular file
  // that stays inside root (through symbolic links too).
  static const ShardFiles& Local();
};

// Opens dir/data.mdb, a regular file, for reading, with Local()'s checks and
// messages (`name`: the shard's path in the manifest); with `within`, the
// file must also lie inside that directory. What Local() opens, and what a
// source that first brings a shard into a local directory (a cache of
// fetched shards) opens then.
Result<std::unique_ptr<ShardFile>> OpenLocalShardFile(const std::string& name,
                                                      const std::string& dir,
                                                      const std::string& within = "");

}  // namespace nl
