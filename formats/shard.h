// Shards: one LMDB environment each (a directory with data.mdb), keys the
// global sample index as 8-byte big-endian, values records (record.h).
//
// Writing:
//   NL_ASSIGN_OR_RETURN(auto w, ShardWriter::Create(root, "train/shard-00000", 0));
//   NL_RETURN_IF_ERROR(w->Put(0, record_bytes));  // indices consecutive from first_index
//   NL_ASSIGN_OR_RETURN(ShardInfo info, w->Finish());
//
// Reading a split (open once per process, then one ReadTxn per reading thread):
//   NL_ASSIGN_OR_RETURN(auto split, SplitReader::Open(root, manifest, "train"));
//   auto txn = split->BeginRead();
//   Result<RecordView> rec = txn->Read(17);   // view valid while txn lives
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "formats/lmdb_env.h"
#include "formats/manifest.h"
#include "formats/record.h"
#include "formats/shard_files.h"

namespace nl {

class ShardWriter {
 public:
  // Creates root/rel_path/ (must not exist) and an empty environment in it.
  static Result<std::unique_ptr<ShardWriter>> Create(const std::string& root,
                                                     const std::string& rel_path,
                                                     uint64_t first_index);
  // Appends one record; `index` must be first_index + records so far.
  Status Put(uint64_t index, std::span<const uint8_t> value);
  // Commits, closes the environment, and describes the shard. Call once.
  Result<ShardInfo> Finish();

 private:
  ShardWriter() = default;
  Status BeginTxn();
  // Commits the open transaction and notes the pages now in use.
  Status CommitTxn();
  // Makes room in the map for `need` more bytes in this transaction, ending
  // it and growing the map when needed; leaves a transaction open.
  Status Reserve(uint64_t need);

  std::string root_, rel_path_;
  LmdbEnv env_;
  LmdbTxn txn_;
  MDB_dbi dbi_ = 0;
  uint64_t first_index_ = 0, count_ = 0;
  uint64_t txn_bytes_ = 0;
  uint64_t map_size_ = 0;  // current LMDB map size
  uint64_t used_ = 0;      // bytes of pages in use after the last commit
  uint64_t txn_need_ = 0;  // worst-case bytes the open transaction may take
  uint32_t page_size_ = 4096;
  uint32_t crc_ = 0;
};

// One shard, opened read-only (MDB_RDONLY | MDB_NOLOCK: shards are immutable).
//
// Its data.mdb comes through a ShardFiles (shard_files.h; the shard set's own
// files by default): the reader's own size checks and reads go through it;
// LMDB opens the directory it names by path and maps the file itself.
//
// Open checks data.mdb's size before LMDB touches a data page: an empty file,
// one shorter than the manifest's `bytes`, or one ending before LMDB's last
// page is Corruption naming the shard (reading it would raise SIGBUS). While a
// reader is open, a SIGBUS inside its map (the file truncated under it) writes
// a line naming the shard to stderr before the process dies as it would have.
class ShardReader {
  class TreeCheck;  // formats/shard_tree_check.h (private)

 public:
  static Result<std::unique_ptr<ShardReader>> Open(const std::string& root, const ShardInfo& info,
                                                   const ShardFiles& files = ShardFiles::Local());
  ~ShardReader();
  ShardReader(const ShardReader&) = delete;
  ShardReader& operator=(const ShardReader&) = delete;

  const ShardInfo& info() const { return info_; }
  // Records in the shard, as LMDB counts them (not the manifest's count).
  uint64_t entries() const { return entries_; }

  // One key/value pair as stored. A well-formed key is 8 bytes (the index).
  struct Entry {
    size_t key_size = 0;
    uint64_t index = 0;  // when key_size == 8
    std::span<const uint8_t> value;
  };

  // A read transaction on this shard: one thread at a time, any thread
  // (MDB_NOTLS). Values point into the map and stay valid while it lives.
  // Errors say what went wrong, not where: callers add their context
  // (split, shard, index) with WithContext.
  class ReadTxn {
   public:
    ReadTxn() = default;  // not begun; assign the result of BeginRead()
    bool active() const { return txn_.get() != nullptr; }
    // The record at `index`; Corruption "record missing" when absent. Found
    // as Copy finds it (the tree check's own search, or the record located
    // when its leaf was first read) and pointing into the map; through
    // mdb_get only where the map's address is unknown.
    Result<std::span<const uint8_t>> Get(uint64_t index) const;
    // The record at `index` read with pread into *out (grown as needed),
    // found by the tree check's own search of the checked pages (the same
    // path and node as LMDB's mdb_get), not through the map: no page fault
    // and no page-table entry for the record (on a split of millions of
    // records, faults cost more than the copy), one search instead of two.
    // A file cut short under the reader: Corruption where the record's bytes
    // are cut, the SIGBUS handler's message where a tree page is.
    Result<std::span<const uint8_t>> Copy(uint64_t index, std::vector<uint8_t>* out) const;
    // Where that record lies: data.mdb's descriptor (the reader's), byte
    // offset, size, and the file it was opened as (the reader's, valid while
    // the reader lives), to read it through.
    struct Extent {
      int fd = -1;
      uint64_t offset = 0;
      uint64_t size = 0;
      const ShardFile* file = nullptr;
    };
    Result<Extent> Locate(uint64_t index) const;
    // A hint to the CPU: start loading where record `index` was located (no
    // effect before its leaf was read, or without located records).
    void PrefetchLocation(uint64_t index) const;
    // Visits every entry in key order with a cursor, stopping at the first
    // error fn returns. A failed cursor step is an error "cursor: ...".
    Status ForEach(const std::function<Status(const Entry&)>& fn) const;

   private:
    friend class ShardReader;
    ReadTxn(LmdbTxn txn, MDB_dbi dbi, const uint8_t* map, uint64_t file_bytes, TreeCheck* check)
        : txn_(std::move(txn)), dbi_(dbi), map_(map), file_bytes_(file_bytes), check_(check) {}
    // A key or value LMDB hands back must lie in the file's bytes: LMDB takes
    // a value's size from its page unchecked, so a damaged page can point past
    // the file's end (SIGBUS) or the map's (SIGSEGV).
    Status CheckInFile(const MDB_val& v, const char* what) const;
    LmdbTxn txn_;
    MDB_dbi dbi_ = 0;
    const uint8_t* map_ = nullptr;
    uint64_t file_bytes_ = 0;
    TreeCheck* check_ = nullptr;
  };
  // A file now shorter than when it was opened is Corruption (reading it
  // through the map would raise SIGBUS); one cut short under a transaction
  // is not seen here (see the class comment).
  Result<ReadTxn> BeginRead() const;

  // The whole tree checked (every page; as many records as the meta page
  // says); a cursor (ForEach) asks for it first. Reads by key check only
  // the pages on their way, each once per reader.
  Status CheckWholeTree() const;

  // Records located once (see shard_tree_check.cc) take 16 bytes each, for
  // all the shards this process has open within one budget: an eighth of the
  // memory it may use (cgroup limit included; 256 MiB where unknown), set at
  // first use or by SetLocatedBudget (tests). A shard that does not fit in
  // what is left searches its tree at every read instead.
  static uint64_t LocatedBytes();  // reserved now, by the shards open
  static void SetLocatedBudget(uint64_t bytes);

 private:
  ShardReader() = default;
  ShardInfo info_;
  LmdbEnv env_;
  MDB_dbi dbi_ = 0;
  uint64_t entries_ = 0;
  const uint8_t* map_ = nullptr;  // LMDB's map of data.mdb
  uint64_t file_bytes_ = 0;       // data.mdb's size when opened
  int map_slot_ = -1;             // in the SIGBUS handler's table of maps
  std::unique_ptr<ShardFile> file_;   // data.mdb, as the ShardFiles opened it
  std::unique_ptr<TreeCheck> check_;  // the pages LMDB may read, checked first; reads file_
};

// All shards of one split. Thread-safe to share; each thread takes its own ReadTxn.
// Open refuses (Corruption) a shard whose LMDB entry count differs from the
// manifest's count, and shard counts that do not sum to num_samples.
class SplitReader {
 public:
  static Result<std::unique_ptr<SplitReader>> Open(const std::string& root, const Manifest& m,
                                                   const std::string& split,
                                                   const ShardFiles& files = ShardFiles::Local());
  const std::string& split() const { return split_; }
  uint64_t size() const { return num_samples_; }
  uint32_t num_classes() const { return num_classes_; }
  const std::vector<std::unique_ptr<ShardReader>>& shards() const { return shards_; }

  class ReadTxn {
   public:
    // The record's bytes, pointing into the map (valid while this txn lives).
    // Errors name the split, shard and index.
    Result<std::span<const uint8_t>> Get(uint64_t index);
    // ShardReader::ReadTxn::Copy, with the same context as Get.
    Result<std::span<const uint8_t>> CopyOf(uint64_t index, std::vector<uint8_t>* out);
    // Get (or CopyOf into *copy, when given) + DecodeRecord (bounds, label <
    // classes, CRCs); the view points into the map or into *copy.
    Result<RecordView> Read(uint64_t index, const RecordLimits& limits = {},
                            std::vector<uint8_t>* copy = nullptr);
    // DecodeRecord of record `index`'s bytes read elsewhere (a window read
    // into memory), with Read's checks and context.
    Result<RecordView> Decode(uint64_t index, std::span<const uint8_t> bytes,
                              const RecordLimits& limits = {}) const;
    // Where record `index` lies (its shard's descriptor, byte offset, size),
    // found as CopyOf finds it; errors name the split, shard and index.
    Result<ShardReader::ReadTxn::Extent> Locate(uint64_t index);
    // Asks the kernel to start reading these records' pages now
    // (posix_fadvise WILLNEED: asynchronous, many requests in flight) so that
    // reading them later does not wait on the disk. Records that lie within
    // `merge_gap` bytes of each other in a shard's file become one request
    // (a run of consecutive indices: one sequential read). Finding a record
    // reads only LMDB's tree pages; a record that cannot be found is skipped
    // (its read reports it). Returns the bytes asked for.
    uint64_t WillNeed(std::span<const uint64_t> sorted_indices, uint64_t merge_gap = 64 << 10);
    // Hints to the CPU for a record read soon through the map, in two steps
    // a few records apart: first where it lies (PrefetchLocation), then its
    // bytes (PrefetchRecord, which finds it as Get does). On a split much
    // bigger than the CPU's caches each is a memory access the current
    // record's work then overlaps. Nothing is reported: a record that cannot
    // be found is left for its read to report.
    void PrefetchLocation(uint64_t index);
    void PrefetchRecord(uint64_t index);

   private:
    friend class SplitReader;
    explicit ReadTxn(const SplitReader* r);
    Result<ShardReader::ReadTxn*> TxnFor(uint64_t index);  // begun on first use
    const SplitReader* reader_;
    std::vector<ShardReader::ReadTxn> txns_;  // one per shard, begun lazily
  };
  ReadTxn BeginRead() const { return ReadTxn(this); }

  // Which shard holds `index` (index < size()).
  size_t ShardOf(uint64_t index) const;
  std::string Where(uint64_t index) const;  // "split 'train', shard train/shard-00000, index 17"

 private:
  SplitReader() = default;
  std::string root_, split_;
  uint64_t num_samples_ = 0;
  uint32_t num_classes_ = 0;
  std::vector<std::unique_ptr<ShardReader>> shards_;
};

}  // namespace nl
