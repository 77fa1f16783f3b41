// Private to formats/ (shard.cc): the check of a shard's LMDB pages before
// LMDB reads them, and the tree check's own search, which reads by key
// without LMDB (ShardReader::ReadTxn::Get, Copy, Locate).
//
// LMDB trusts its pages: a damaged node offset or size in a branch or leaf
// page makes it read outside the page, the file or the map (SIGBUS,
// SIGSEGV) before any value reaches us, and it trusts the page size in the
// meta page too. So its meta pages are checked before LMDB opens a shard
// (Open), and every tree page LMDB is about to read is checked first, with
// every such field, reading it with pread (never through a map) the first
// time: for a read by key, the pages from the root to the leaf that LMDB's
// own search will visit (Path: the same choice at each branch page as
// LMDB's, which the check makes unambiguous by requiring each page's keys
// in order), each page checked once per reader; for a cursor over
// everything (verify, export), the whole tree, once (Whole). Opening costs
// the meta pages and one path, whatever the shard's size.
//
// Errors say what is wrong with the file ("its LMDB tree is damaged: ...",
// "reading page at byte N: ..."); the reader adds which shard.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/mutex.h"
#include "base/status.h"
#include "formats/shard.h"

namespace nl {

class ShardReader::TreeCheck {
 public:
  // Reads and checks the meta pages of `file` (the reader's, which outlives
  // the check), `file_bytes` long, before LMDB reads them: LMDB takes the page size from the first
  // one unchecked (0 divides by zero; a small one reads past its buffers; a
  // huge one reads the second meta page past the file's end). Picks the
  // meta page LMDB will use, as LMDB does: the second when its transaction
  // id is higher, else the first.
  static Result<std::unique_ptr<TreeCheck>> Open(const ShardFile* file, uint64_t file_bytes);
  ~TreeCheck();
  TreeCheck(const TreeCheck&) = delete;
  TreeCheck& operator=(const TreeCheck&) = delete;

  // The file the pages are read through (the reader's data.mdb).
  const ShardFile& file() const { return *file_; }

  // Once the file is known to hold LMDB's pages: the tree's shape as the
  // meta page gives it, and the first record's path (the pages a cursor's
  // MDB_FIRST reads), which also sizes the located records.
  Status CheckFirstPath();

  // Once LMDB's map is known (and confirmed): pages already checked are
  // then read through it rather than with pread.
  void SetMap(const uint8_t* map) { map_ = map; }

  // Where a record's value lies in the file, as LMDB's mdb_get would find it.
  struct Value {
    bool found = false;
    uint64_t offset = 0;  // in data.mdb
    uint64_t size = 0;
  };
  // The pages LMDB's search for `key` visits (key == nullptr: the first
  // record's, as a cursor's MDB_FIRST), root to leaf, checked. With
  // `value`, also finds the key in the leaf (its pages checked, the value's
  // bytes lie in the file): the read that needs no LMDB call.
  Status Path(const unsigned char* key, size_t key_size, Value* value = nullptr);

  // Every page of the tree, once per reader (later calls give the first
  // answer): no page reached twice, and as many records as the meta page says.
  Status Whole();

  // Asks the CPU to load where record `index` lies (a hint; see
  // SplitReader::ReadTxn::PrefetchLocation).
  void PrefetchLocated(uint64_t index) const {
    if (located_ != nullptr && index - base_ < located_count_)
      __builtin_prefetch(&located_[index - base_], 0, 3);
  }

 private:
  // Records located once (see shard_tree_check.cc): 16 bytes each.
  struct Located {
    uint64_t offset;  // 0: not located yet (byte 0 is a meta page, never a value)
    uint64_t size;
  };
  // The keys LMDB's search routes to a page: [lo, hi) (8-byte keys).
  struct Bounds {
    bool known = false;  // false: some key on the way is not 8 bytes
    bool has_lo = false, has_hi = false;
    uint64_t lo = 0, hi = 0;  // [lo, hi)
  };
  static constexpr uint64_t kNoPage = ~uint64_t{0};

  TreeCheck(const ShardFile* file, uint64_t file_bytes) : file_(file), file_bytes_(file_bytes) {}
  Status Meta();
  Status Shape();
  Value FindInLeaf(const uint8_t* page, uint64_t pgno, const unsigned char* key,
                   size_t key_size) const;
  Value ValueOf(const uint8_t* page, uint64_t pgno, const uint8_t* node) const;
  bool Lookup(uint64_t index, Value* value) const;
  // The keys the child at `child` of a checked branch page is searched
  // for: from its own key (but the first's) to the next one's.
  static void Narrow(const uint8_t* page, size_t child, Bounds* b);
  void FirstLeaf(const uint8_t* page);
  void Locate(const uint8_t* page, uint64_t pgno, const Bounds& b);
  bool Checked(uint64_t pgno) const {
    return (checked_[pgno / 64].load(std::memory_order_acquire) >> (pgno % 64)) & 1;
  }
  void MarkChecked(uint64_t pgno) {
    checked_[pgno / 64].fetch_or(uint64_t{1} << (pgno % 64), std::memory_order_release);
  }
  Status ReadAt(uint64_t off, uint8_t* out, size_t n, const std::string& what) const;
  Status CheckPage(const uint8_t* page, uint64_t pgno, bool leaf) const;
  Status WalkAll();
  Status Walk(uint64_t pgno, uint16_t depth, std::vector<bool>& visited,
              std::vector<std::vector<uint8_t>>& buffers, uint64_t* found);

  const ShardFile* file_;
  uint64_t file_bytes_;
  uint32_t psize_ = 0;
  uint64_t pages_ = 0;
  uint16_t depth_ = 0;
  uint64_t root_ = kNoPage;
  uint64_t entries_ = 0;
  const uint8_t* map_ = nullptr;
  std::unique_ptr<std::atomic<uint64_t>[]> checked_;  // a bit a page
  Located* located_ = nullptr;                        // mmap'd, located_count_ of them
  uint64_t located_count_ = 0;
  uint64_t base_ = 0;  // the first record's key
  Mutex whole_mu_;
  bool whole_done_ NL_GUARDED_BY(whole_mu_) = false;
  Status whole_ NL_GUARDED_BY(whole_mu_);
};

}  // namespace nl
