#include "formats/shard_tree_check.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>

#include "base/memory.h"
#include "formats/lmdb_env.h"

namespace nl {
namespace {

// Layout of LMDB 0.9 on a 64-bit machine (lmdb.h, mdb.c): a 16-byte page
// header {pgno u64, pad u16, flags u16, lower u16, upper u16}, then u16 node
// offsets; a node {lo u16, hi u16, flags u16, ksize u16, key, data}; the meta
// page's MDB_meta at byte 16: magic u32, version u32, address u64, mapsize
// u64, then the free and main databases' MDB_db (48 bytes each; the free
// one's first u32 is the page size), last page u64 at 136, txnid u64 at 144.
static_assert(sizeof(void*) == 8, "the LMDB layout below is that of a 64-bit build");
constexpr uint16_t kMaxDepth = 32;
constexpr uint16_t kBranch = 0x01, kLeaf = 0x02;
constexpr uint16_t kBigData = 0x01, kSubData = 0x02, kDupData = 0x04;

// Records located once: where each value lies, by index - base_, filled
// from a leaf the first time a search reads it (every record of the leaf
// that LMDB's search routes there), so that later reads of them need no
// tree page: on a split of millions of records each leaf read is a cache
// miss or more, and a disk read once evicted. 16 bytes a record, in
// anonymous pages touched only as they are filled, within the process's
// budget (ShardReader::LocatedBytes); none for a shard of more than
// kMaxLocated records or whose first key is not an 8-byte one.
constexpr uint64_t kMaxLocated = uint64_t{1} << 22;  // 64 MiB of Located a shard

// The process's budget for located records, and what the open shards hold of it.
std::atomic<uint64_t> g_located_reserved{0};
std::atomic<uint64_t> g_located_budget{0};  // 0: not yet set
uint64_t LocatedBudget() {
  uint64_t b = g_located_budget.load(std::memory_order_relaxed);
  if (b != 0) return b;
  const uint64_t have = MemoryAvailableToProcess().bytes;
  b = have != 0 ? have / 8 : uint64_t{256} << 20;
  uint64_t unset = 0;
  g_located_budget.compare_exchange_strong(unset, b, std::memory_order_relaxed);
  return g_located_budget.load(std::memory_order_relaxed);
}
bool ReserveLocated(uint64_t bytes) {
  const uint64_t budget = LocatedBudget();
  uint64_t cur = g_located_reserved.load(std::memory_order_relaxed);
  do {
    if (bytes > budget || cur > budget - bytes) return false;
  } while (!g_located_reserved.compare_exchange_weak(cur, cur + bytes, std::memory_order_relaxed));
  return true;
}

template <typename T>
T Get(const uint8_t* page, size_t off) {
  T v;
  std::memcpy(&v, page + off, sizeof v);
  return v;
}
Status Bad(const std::string& why) {
  return Status::Corruption("its LMDB tree is damaged: " + why);
}
// LMDB's default key order (mdb_cmp_memn): bytes, then the shorter first.
int CompareKeys(const uint8_t* a, size_t an, const uint8_t* b, size_t bn) {
  const int diff = std::memcmp(a, b, std::min(an, bn));
  if (diff != 0) return diff;
  return an < bn ? -1 : an > bn ? 1 : 0;
}
const uint8_t* NodeAt(const uint8_t* page, size_t i) {
  return page + Get<uint16_t>(page, 16 + 2 * i);
}
size_t Nodes(const uint8_t* page) { return (Get<uint16_t>(page, 12) - 16u) / 2; }
uint64_t ChildPgno(const uint8_t* page, size_t i) {
  const uint8_t* node = NodeAt(page, i);
  return Get<uint16_t>(node, 0) | (uint64_t{Get<uint16_t>(node, 2)} << 16) |
         (uint64_t{Get<uint16_t>(node, 4)} << 32);
}
// The child LMDB's search follows from a checked branch page: the last
// node from the second on whose key is at most `key`, else the first
// (mdb_page_search_root after mdb_node_search; keys are checked in order).
size_t ChildIndex(const uint8_t* page, const unsigned char* key, size_t key_size) {
  size_t lo = 1, hi = Nodes(page);  // the answer is in [lo - 1, hi - 1]
  while (lo < hi) {
    const size_t mid = lo + (hi - lo) / 2;
    const uint8_t* node = NodeAt(page, mid);
    if (CompareKeys(node + 8, Get<uint16_t>(node, 6), key, key_size) <= 0) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo - 1;
}

}  // namespace

uint64_t ShardReader::LocatedBytes() { return g_located_reserved.load(std::memory_order_relaxed); }
void ShardReader::SetLocatedBudget(uint64_t bytes) {
  g_located_budget.store(std::max<uint64_t>(bytes, 1), std::memory_order_relaxed);
}

Result<std::unique_ptr<ShardReader::TreeCheck>> ShardReader::TreeCheck::Open(const ShardFile* file,
                                                                             uint64_t file_bytes) {
  std::unique_ptr<TreeCheck> check(new TreeCheck(file, file_bytes));
  NL_RETURN_IF_ERROR(check->Meta());
  return check;
}

ShardReader::TreeCheck::~TreeCheck() {
  if (located_ == nullptr) return;
  munmap(located_, located_count_ * sizeof(Located));
  g_located_reserved.fetch_sub(located_count_ * sizeof(Located), std::memory_order_relaxed);
}

Status ShardReader::TreeCheck::CheckFirstPath() {
  NL_RETURN_IF_ERROR(Shape());
  return Path(nullptr, 0);
}

// The meta pages, before LMDB reads them (see Open).
Status ShardReader::TreeCheck::Meta() {
  uint8_t head[152];
  NL_RETURN_IF_ERROR(ReadAt(0, head, sizeof head, "its first meta page"));
  std::memcpy(&psize_, head + 40, 4);
  if (psize_ < 512 || psize_ > 32768 || (psize_ & (psize_ - 1)) != 0) {
    return Bad("its meta page gives a page size of " + std::to_string(psize_));
  }
  if (file_bytes_ < 2 * uint64_t{psize_}) {
    return Status::Corruption("data.mdb is " + std::to_string(file_bytes_) +
                              " bytes, shorter than its two " + std::to_string(psize_) +
                              "-byte meta pages: the shard is truncated");
  }
  pages_ = file_bytes_ / psize_;
  uint8_t metas[2][152];
  std::memcpy(metas[0], head, sizeof head);
  NL_RETURN_IF_ERROR(ReadAt(psize_, metas[1], sizeof metas[1], "its second meta page"));
  // LMDB reads the second meta page at the first one's page size, then
  // takes the page size of the newer one: both must be the same.
  uint32_t psize1;
  std::memcpy(&psize1, metas[1] + 40, 4);
  if (psize1 != psize_) {
    return Bad("its meta pages give page sizes " + std::to_string(psize_) + " and " +
               std::to_string(psize1));
  }
  uint64_t txn[2];
  for (int i = 0; i < 2; ++i) std::memcpy(&txn[i], metas[i] + 144, 8);
  const uint8_t* m = metas[txn[0] < txn[1] ? 1 : 0];
  std::memcpy(&depth_, m + 88 + 6, 2);
  std::memcpy(&root_, m + 88 + 40, 8);
  std::memcpy(&entries_, m + 88 + 32, 8);
  uint16_t main_flags;
  std::memcpy(&main_flags, m + 88 + 4, 2);
  if (main_flags != 0) {  // pack_tool writes plain keys and values: no DUPSORT, INTEGERKEY...
    return Bad("its main database has flags " + std::to_string(main_flags) + " (expected 0)");
  }
  return Status::Ok();
}

// The tree's shape as the meta page gives it, once the file is known to
// hold LMDB's pages.
Status ShardReader::TreeCheck::Shape() {
  if (root_ == kNoPage) {
    if (entries_ == 0) return Status::Ok();
    return Bad("its meta page counts " + std::to_string(entries_) + " records but has no tree");
  }
  // Each entry takes at least a node header and an 8-byte key in a page.
  if (entries_ > file_bytes_ / 16) {
    return Bad("its meta page counts " + std::to_string(entries_) + " records, more than its " +
               std::to_string(file_bytes_) + " bytes can hold");
  }
  if (depth_ == 0 || depth_ > kMaxDepth) return Bad("tree depth " + std::to_string(depth_));
  checked_ = std::make_unique<std::atomic<uint64_t>[]>((pages_ + 63) / 64);
  return Status::Ok();
}

Status ShardReader::TreeCheck::Path(const unsigned char* key, size_t key_size, Value* value) {
  if (root_ == kNoPage) return Status::Ok();
  const bool keyed = key != nullptr && key_size == 8;
  if (keyed && value != nullptr && Lookup(DecodeKey(key), value)) return Status::Ok();
  thread_local std::vector<uint8_t> buffer;
  buffer.resize(psize_);
  uint64_t pgno = root_;
  if (pgno < 2 || pgno >= pages_)
    return Bad("page " + std::to_string(pgno) + " is outside the file's pages");
  // The keys LMDB's search routes to this page: [lo, hi) (8-byte keys).
  Bounds bounds;
  bounds.known = keyed;
  for (uint16_t depth = depth_;; --depth) {
    const bool leaf = depth == 1;
    const uint8_t* page;
    if (Checked(pgno)) {
      if (map_ != nullptr) {
        page = map_ + pgno * psize_;
      } else {
        NL_RETURN_IF_ERROR(ReadAt(pgno * psize_, buffer.data(), psize_, "page"));
        page = buffer.data();
      }
      // Checked as a page of the other kind: reached at another depth.
      if (Get<uint16_t>(page, 10) != (leaf ? kLeaf : kBranch)) {
        NL_RETURN_IF_ERROR(CheckPage(page, pgno, leaf));
      }
    } else {
      NL_RETURN_IF_ERROR(ReadAt(pgno * psize_, buffer.data(), psize_, "page"));
      page = buffer.data();
      NL_RETURN_IF_ERROR(CheckPage(page, pgno, leaf));
      MarkChecked(pgno);
    }
    if (leaf) {
      if (key == nullptr) {
        FirstLeaf(page);
      } else if (bounds.known && value != nullptr) {  // a read that uses where values lie
        Locate(page, pgno, bounds);
      }
      if (value != nullptr && key != nullptr) *value = FindInLeaf(page, pgno, key, key_size);
      return Status::Ok();
    }
    const size_t child = key == nullptr ? 0 : ChildIndex(page, key, key_size);
    if (bounds.known) Narrow(page, child, &bounds);
    pgno = ChildPgno(page, child);
  }
}

Status ShardReader::TreeCheck::Whole() {
  MutexLock lock(&whole_mu_);
  if (!whole_done_) {
    whole_ = WalkAll();
    whole_done_ = true;
  }
  return whole_;
}

// The node with exactly `key` in a checked leaf page (keys in order).
ShardReader::TreeCheck::Value ShardReader::TreeCheck::FindInLeaf(const uint8_t* page, uint64_t pgno,
                                                                 const unsigned char* key,
                                                                 size_t key_size) const {
  size_t lo = 0, hi = Nodes(page);
  // Packed shards hold consecutive 8-byte big-endian indices: the key is
  // then as many nodes after the first as its index is after the first's.
  // One guess, checked like any probe, saves the binary search's cache misses.
  if (key_size == 8 && hi > 0 && Get<uint16_t>(NodeAt(page, 0), 6) == 8) {
    const uint64_t first = DecodeKey(NodeAt(page, 0) + 8), want = DecodeKey(key);
    if (want >= first && want - first < hi) {
      const uint8_t* node = NodeAt(page, want - first);
      if (CompareKeys(node + 8, Get<uint16_t>(node, 6), key, key_size) == 0) {
        lo = want - first;
        hi = lo + 1;
      }
    }
  }
  while (lo < hi) {
    const size_t mid = lo + (hi - lo) / 2;
    const uint8_t* node = NodeAt(page, mid);
    const uint16_t ksize = Get<uint16_t>(node, 6);
    const int c = CompareKeys(node + 8, ksize, key, key_size);
    if (c < 0) {
      lo = mid + 1;
    } else if (c > 0) {
      hi = mid;
    } else {
      return ValueOf(page, pgno, node);
    }
  }
  return Value{};
}

// Where the value of a node of a checked leaf lies in the file.
ShardReader::TreeCheck::Value ShardReader::TreeCheck::ValueOf(const uint8_t* page, uint64_t pgno,
                                                              const uint8_t* node) const {
  const uint16_t ksize = Get<uint16_t>(node, 6);
  Value v;
  v.found = true;
  v.size = Get<uint16_t>(node, 0) | (uint64_t{Get<uint16_t>(node, 2)} << 16);
  if (Get<uint16_t>(node, 4) & kBigData) {
    v.offset = Get<uint64_t>(node, 8 + ksize) * psize_ + 16;  // after the overflow page's header
  } else {
    v.offset = pgno * psize_ + static_cast<uint64_t>(node - page) + 8 + ksize;
  }
  return v;
}

bool ShardReader::TreeCheck::Lookup(uint64_t index, Value* value) const {
  if (located_ == nullptr || index - base_ >= located_count_) return false;
  Located& l = located_[index - base_];
  const uint64_t off = std::atomic_ref<uint64_t>(l.offset).load(std::memory_order_acquire);
  if (off == 0) return false;
  value->found = true;
  value->offset = off;
  value->size = std::atomic_ref<uint64_t>(l.size).load(std::memory_order_relaxed);
  return true;
}

// The keys the child at `child` of a checked branch page is searched
// for: from its own key (but the first's) to the next one's.
void ShardReader::TreeCheck::Narrow(const uint8_t* page, size_t child, Bounds* b) {
  auto key_of = [&](size_t i, uint64_t* k) {
    const uint8_t* node = NodeAt(page, i);
    if (Get<uint16_t>(node, 6) != 8) return false;
    *k = DecodeKey(node + 8);
    return true;
  };
  uint64_t k;
  if (child > 0) {
    if (!key_of(child, &k)) {
      b->known = false;
      return;
    }
    if (!b->has_lo || k > b->lo) b->lo = k;
    b->has_lo = true;
  }
  if (child + 1 < Nodes(page)) {
    if (!key_of(child + 1, &k)) {
      b->known = false;
      return;
    }
    if (!b->has_hi || k < b->hi) b->hi = k;
    b->has_hi = true;
  }
}

// At open, the first record's leaf: the first key, and room to locate
// records from it on.
void ShardReader::TreeCheck::FirstLeaf(const uint8_t* page) {
  if (located_ != nullptr || Nodes(page) == 0) return;
  const uint8_t* node = NodeAt(page, 0);
  if (Get<uint16_t>(node, 6) != 8 || entries_ == 0 || entries_ > kMaxLocated) return;
  const uint64_t bytes = entries_ * sizeof(Located);
  if (!ReserveLocated(bytes)) return;  // reads then search the tree each time
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    g_located_reserved.fetch_sub(bytes, std::memory_order_relaxed);
    return;
  }
  base_ = DecodeKey(node + 8);
  located_ = static_cast<Located*>(p);
  located_count_ = entries_;
}

// Every record of a checked leaf whose key LMDB's search routes to it.
void ShardReader::TreeCheck::Locate(const uint8_t* page, uint64_t pgno, const Bounds& b) {
  if (located_ == nullptr) return;
  const size_t n = Nodes(page);
  for (size_t i = 0; i < n; ++i) {
    const uint8_t* node = NodeAt(page, i);
    const uint16_t ksize = Get<uint16_t>(node, 6);
    if (ksize != 8) continue;
    const uint64_t k = DecodeKey(node + 8);
    if ((b.has_lo && k < b.lo) || (b.has_hi && k >= b.hi)) continue;
    if (k - base_ >= located_count_) continue;
    const Value v = ValueOf(page, pgno, node);
    Located& l = located_[k - base_];
    std::atomic_ref<uint64_t>(l.size).store(v.size, std::memory_order_relaxed);
    std::atomic_ref<uint64_t>(l.offset).store(v.offset, std::memory_order_release);
  }
}

Status ShardReader::TreeCheck::ReadAt(uint64_t off, uint8_t* out, size_t n,
                                      const std::string& what) const {
  size_t got = 0;
  while (got < n) {
    Result<size_t> r = file_->ReadSome(off + got, out + got, n - got);
    if (!r.ok())
      return r.status().WithContext("reading " + what + " at byte " + std::to_string(off));
    if (*r == 0)
      return Bad(what + " at byte " + std::to_string(off) + " lies past the end of the file");
    got += *r;
  }
  return Status::Ok();
}

// One page's own fields, all that LMDB trusts when it searches or reads
// it: its number and type, free-space bounds, each node's offset, key and
// value extent (overflow pages in the file), children among the file's
// pages, keys in order (nothing else makes LMDB's binary search and the
// check's take the same path).
Status ShardReader::TreeCheck::CheckPage(const uint8_t* page, uint64_t pgno, bool leaf) const {
  // Messages are built only on failure: this runs for every node of a page.
  auto at = [pgno] { return "page " + std::to_string(pgno); };
  if (Get<uint64_t>(page, 0) != pgno) {
    return Bad(at() + " says it is page " + std::to_string(Get<uint64_t>(page, 0)));
  }
  const uint16_t flags = Get<uint16_t>(page, 10), lower = Get<uint16_t>(page, 12),
                 upper = Get<uint16_t>(page, 14);
  if (flags != (leaf ? kLeaf : kBranch)) {
    return Bad(at() + " has flags " + std::to_string(flags) + ", expected a " +
               (leaf ? "leaf" : "branch") + " page");
  }
  if (lower < 16 || lower > upper || upper > psize_ || (lower - 16) % 2 != 0) {
    return Bad(at() + " has free-space bounds " + std::to_string(lower) + ".." +
               std::to_string(upper));
  }
  const size_t n = (lower - 16) / 2;
  if (n == 0) return Bad(at() + " is empty");
  const uint8_t* prev_key = nullptr;
  size_t prev_size = 0;
  for (size_t i = 0; i < n; ++i) {
    const size_t off = Get<uint16_t>(page, 16 + 2 * i);
    auto node = [&at, i] { return at() + " node " + std::to_string(i); };
    if (off < upper || off + 8 > psize_) return Bad(node() + " lies outside the page's nodes");
    const uint32_t lo = Get<uint16_t>(page, off), hi = Get<uint16_t>(page, off + 2);
    const uint16_t nflags = Get<uint16_t>(page, off + 4), ksize = Get<uint16_t>(page, off + 6);
    if (off + 8 + ksize > psize_) return Bad(node() + "'s key runs past the page");
    // A branch page's first key is never compared (it stands for all below the second).
    if (leaf || i > 0) {
      const uint8_t* key = page + off + 8;
      if (prev_key != nullptr && CompareKeys(prev_key, prev_size, key, ksize) >= 0) {
        return Bad(node() + "'s key is not after the key before it");
      }
      prev_key = key;
      prev_size = ksize;
    }
    if (leaf) {
      const size_t data = off + 8 + ksize;
      if (nflags & (kSubData | kDupData)) {
        return Bad(node() + " is a sub-database (flags " + std::to_string(nflags) + ")");
      }
      const uint64_t size = lo | (uint64_t{hi} << 16);
      if (nflags & kBigData) {
        if (data + 8 > psize_) return Bad(node() + "'s overflow page number runs past the page");
        uint64_t first;
        std::memcpy(&first, page + data, 8);
        const uint64_t span = (size + 16 + psize_ - 1) / psize_;
        if (first < 2 || first >= pages_ || span > pages_ - first) {
          return Bad(node() + "'s value (" + std::to_string(size) + " bytes at page " +
                     std::to_string(first) + ") lies outside the file");
        }
      } else if (data + size > psize_) {
        return Bad(node() + "'s value runs past the page");
      }
    } else {
      const uint64_t child = lo | (uint64_t{hi} << 16) | (uint64_t{nflags} << 32);
      if (child < 2 || child >= pages_) {
        return Bad(node() + "'s child, page " + std::to_string(child) +
                   ", is outside the file's pages");
      }
    }
  }
  return Status::Ok();
}

Status ShardReader::TreeCheck::WalkAll() {
  if (root_ == kNoPage) return Status::Ok();
  if (root_ < 2 || root_ >= pages_) {
    return Bad("page " + std::to_string(root_) + " is outside the file's pages");
  }
  std::vector<bool> visited(pages_, false);
  std::vector<std::vector<uint8_t>> buffers(depth_ + 1, std::vector<uint8_t>(psize_));
  uint64_t found = 0;
  NL_RETURN_IF_ERROR(Walk(root_, depth_, visited, buffers, &found));
  if (found != entries_) {
    return Bad("its tree holds " + std::to_string(found) + " records, its meta page says " +
               std::to_string(entries_));
  }
  return Status::Ok();
}

Status ShardReader::TreeCheck::Walk(uint64_t pgno, uint16_t depth, std::vector<bool>& visited,
                                    std::vector<std::vector<uint8_t>>& buffers, uint64_t* found) {
  // A page reached twice: a cycle, or two parents (each page of a B-tree
  // has one). Without this a crafted file could make the walk endless.
  if (visited[pgno]) return Bad("page " + std::to_string(pgno) + " is reached twice");
  visited[pgno] = true;
  uint8_t* page = buffers[depth].data();
  NL_RETURN_IF_ERROR(ReadAt(pgno * psize_, page, psize_, "page"));
  const bool leaf = depth == 1;
  NL_RETURN_IF_ERROR(CheckPage(page, pgno, leaf));
  MarkChecked(pgno);
  const size_t n = Nodes(page);
  if (leaf) {
    *found += n;
    if (*found > entries_) {
      return Bad("its tree holds more records than its meta page's " + std::to_string(entries_));
    }
    return Status::Ok();
  }
  for (size_t i = 0; i < n; ++i) {
    NL_RETURN_IF_ERROR(
        Walk(ChildPgno(page, i), static_cast<uint16_t>(depth - 1), visited, buffers, found));
  }
  return Status::Ok();
}

}  // namespace nl
