#include "formats/shard.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>

#include "base/fd.h"
#include "base/file_util.h"
#include "base/memory.h"
#include "formats/crc32c.h"

namespace nl {
namespace {

// Writers start with a modest map and grow it between transactions as the
// shard grows (a fixed huge reservation fails under an address-space limit,
// ulimit -v); readers map only the file's size.
constexpr uint64_t kInitialMapSize = uint64_t{64} << 20;
// Kept free beyond the estimate: branch pages copied on write, the free list.
constexpr uint64_t kMapSlack = uint64_t{4} << 20;
// Small transactions let LMDB recycle its dirty pages instead of allocating
// (and faulting in) fresh ones for every record.
constexpr uint64_t kTxnBytes = 4ull << 20;

std::string HexChecksum(uint32_t crc) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "crc32c:%08x", crc);
  return buf;
}

uint32_t ExtendChecksum(uint32_t crc, uint64_t index, std::span<const uint8_t> value) {
  unsigned char key[8];
  EncodeKey(index, key);
  crc = Crc32c(crc, key, 8);
  return Crc32c(crc, value.data(), value.size());
}

}  // namespace

Result<std::unique_ptr<ShardWriter>> ShardWriter::Create(const std::string& root,
                                                         const std::string& rel_path,
                                                         uint64_t first_index) {
  const std::string dir = root + "/" + rel_path;
  if (::mkdir(dir.c_str(), 0700) != 0)
    return Status::FromErrno("cannot create shard " + dir, errno);
  std::unique_ptr<ShardWriter> w(new ShardWriter());
  w->root_ = root;
  w->rel_path_ = rel_path;
  w->first_index_ = first_index;
  MDB_env* env = nullptr;
  NL_RETURN_IF_ERROR(LmdbStatus(mdb_env_create(&env), "mdb_env_create"));
  w->env_.reset(env);
  NL_RETURN_IF_ERROR(LmdbStatus(mdb_env_set_mapsize(env, kInitialMapSize), "mdb_env_set_mapsize"));
  w->map_size_ = kInitialMapSize;
  // One writer, no readers while packing: no lock file needed.
  const int rc = mdb_env_open(env, dir.c_str(), MDB_NOLOCK | MDB_NOSYNC, 0600);
  if (rc == ENOMEM) {
    const std::string limit = AddressSpaceLimitNote();
    return Status::ResourceExhausted(
        "cannot open shard " + dir + " with a map of " + std::to_string(kInitialMapSize >> 20) +
        " MiB" + (limit.empty() ? "" : " (" + limit + ")") + ": " + mdb_strerror(rc));
  }
  NL_RETURN_IF_ERROR(LmdbWriteStatus(rc, "cannot open shard " + dir, dir + "/data.mdb"));
  MDB_stat st;
  NL_RETURN_IF_ERROR(LmdbStatus(mdb_env_stat(env, &st), "mdb_env_stat " + dir));
  w->page_size_ = st.ms_psize;
  NL_RETURN_IF_ERROR(w->BeginTxn());
  return w;
}

Status ShardWriter::CommitTxn() {
  const std::string dir = root_ + "/" + rel_path_;
  NL_RETURN_IF_ERROR(
      LmdbWriteStatus(txn_.Commit(), "cannot commit shard " + dir, dir + "/data.mdb"));
  MDB_envinfo info;
  NL_RETURN_IF_ERROR(LmdbStatus(mdb_env_info(env_.get(), &info), "mdb_env_info " + dir));
  used_ = (uint64_t{info.me_last_pgno} + 1) * page_size_;
  txn_need_ = 0;
  return Status::Ok();
}

Status ShardWriter::Reserve(uint64_t need) {
  if (used_ + txn_need_ + need + kMapSlack <= map_size_) return Status::Ok();
  // The map can only change between transactions.
  NL_RETURN_IF_ERROR(CommitTxn());
  // Room for this record and a few more whole transactions; the map at
  // least doubles, so a shard of N bytes remaps about log2(N / 64 MiB) times.
  const uint64_t want = used_ + need + 4 * kTxnBytes + kMapSlack;
  if (want > map_size_) {
    const uint64_t grown =
        std::max(map_size_ * 2, (want + (1 << 20) - 1) & ~uint64_t{(1 << 20) - 1});
    const std::string dir = root_ + "/" + rel_path_;
    const int rc = mdb_env_set_mapsize(env_.get(), grown);
    if (rc != MDB_SUCCESS) {
      const std::string limit = AddressSpaceLimitNote();
      const std::string what = "cannot grow the LMDB map of shard " + dir + " from " +
                               std::to_string(map_size_ >> 20) + " MiB to " +
                               std::to_string(grown >> 20) + " MiB" +
                               (limit.empty() ? "" : " (" + limit + ")");
      if (rc == ENOMEM) return Status::ResourceExhausted(what + ": " + mdb_strerror(rc));
      return LmdbStatus(rc, what);
    }
    map_size_ = grown;
  }
  return BeginTxn();
}

Status ShardWriter::BeginTxn() {
  MDB_txn* t = nullptr;
  NL_RETURN_IF_ERROR(
      LmdbStatus(mdb_txn_begin(env_.get(), nullptr, 0, &t), "mdb_txn_begin " + rel_path_));
  txn_ = LmdbTxn(t);
  NL_RETURN_IF_ERROR(LmdbStatus(mdb_dbi_open(t, nullptr, 0, &dbi_), "mdb_dbi_open " + rel_path_));
  txn_bytes_ = 0;
  return Status::Ok();
}

Status ShardWriter::Put(uint64_t index, std::span<const uint8_t> value) {
  if (!env_) return Status::InvalidArgument("ShardWriter::Put after Finish");
  if (index != first_index_ + count_) {
    return Status::InvalidArgument("shard " + rel_path_ + ": index " + std::to_string(index) +
                                   " written out of order (expected " +
                                   std::to_string(first_index_ + count_) + ")");
  }
  // Worst case per record: a value over about half a page goes to overflow
  // pages of its own (plus a node in a leaf); a smaller one into leaf pages,
  // which appending leaves at least half full.
  const uint64_t page = page_size_;
  const uint64_t need = value.size() + 32 > page / 2
                            ? (value.size() + 16 + page - 1) / page * page + 64
                            : 2 * (value.size() + 24);
  NL_RETURN_IF_ERROR(Reserve(need));
  unsigned char key[8];
  EncodeKey(index, key);
  MDB_val k{8, key};
  MDB_val v{value.size(), const_cast<uint8_t*>(value.data())};
  if (const int rc = mdb_put(txn_.get(), dbi_, &k, &v, MDB_APPEND); rc != MDB_SUCCESS) {
    const std::string dir = root_ + "/" + rel_path_;
    const std::string what = "cannot write index " + std::to_string(index) + " to shard " + dir;
    if (rc == MDB_MAP_FULL) {
      return Status::ResourceExhausted(what + ": its LMDB map of " +
                                       std::to_string(map_size_ >> 20) + " MiB is full");
    }
    return LmdbWriteStatus(rc, what, dir + "/data.mdb");
  }
  crc_ = ExtendChecksum(crc_, index, value);
  ++count_;
  txn_bytes_ += value.size() + 8;
  txn_need_ += need;
  if (txn_bytes_ >= kTxnBytes) {
    NL_RETURN_IF_ERROR(CommitTxn());
    NL_RETURN_IF_ERROR(BeginTxn());
  }
  return Status::Ok();
}

Result<ShardInfo> ShardWriter::Finish() {
  if (!env_) return Status::InvalidArgument("ShardWriter::Finish called twice");
  const std::string dir = root_ + "/" + rel_path_;
  NL_RETURN_IF_ERROR(CommitTxn());
  NL_RETURN_IF_ERROR(
      LmdbWriteStatus(mdb_env_sync(env_.get(), 1), "cannot sync shard " + dir, dir + "/data.mdb"));
  env_.reset();
  ShardInfo info;
  info.path = rel_path_;
  info.first_index = first_index_;
  info.count = count_;
  NL_ASSIGN_OR_RETURN(info.bytes, FileSize(dir + "/data.mdb"));
  info.checksum = HexChecksum(crc_);
  return info;
}

namespace {

// ---- naming the shard when a mapped page vanishes (SIGBUS) ----
//
// A shard truncated while it is mapped makes the next access to a page past
// the new end raise SIGBUS. The handler cannot recover, but it names the
// shard: it looks the faulting address up among the open readers' maps,
// writes one line with write(2) (async-signal-safe), and re-raises with the
// previous disposition.
struct MappedShard {
  std::atomic<uintptr_t> begin{0};  // 0: free slot
  uintptr_t end = 0;
  char name[480] = {};
};
constexpr size_t kMaxMappedShards = 4096;
MappedShard g_mapped[kMaxMappedShards];
std::mutex g_mapped_mu;  // serialises registration; the handler only reads
struct sigaction g_previous_sigbus;

void WriteAll(const char* s, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(STDERR_FILENO, s, n);
    if (w <= 0) return;
    s += w;
    n -= static_cast<size_t>(w);
  }
}

void OnSigbus(int sig, siginfo_t* si, void*) {
  const uintptr_t addr = reinterpret_cast<uintptr_t>(si->si_addr);
  for (auto& m : g_mapped) {
    const uintptr_t b = m.begin.load(std::memory_order_acquire);
    if (b != 0 && addr >= b && addr < m.end) {
      static const char kHead[] = "numa-loader: SIGBUS reading shard ";
      static const char kTail[] =
          ": its data.mdb is shorter than its map (truncated or replaced while open)\n";
      WriteAll(kHead, sizeof kHead - 1);
      WriteAll(m.name, ::strnlen(m.name, sizeof m.name));
      WriteAll(kTail, sizeof kTail - 1);
      break;
    }
  }
  // Back to the previous disposition. Returning re-runs the faulting access,
  // which then ends the process (or reaches the previous handler) as it
  // would have without this one; a SIGBUS sent by kill is raised again.
  ::sigaction(SIGBUS, &g_previous_sigbus, nullptr);
  if (si->si_code <= 0) ::raise(sig);
}

void InstallSigbusHandler() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa {};
    sa.sa_sigaction = OnSigbus;
    sa.sa_flags = SA_SIGINFO | SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGBUS, &sa, &g_previous_sigbus);
  });
}

// LMDB does not say where it mapped a read-only environment (mdb_env_info's
// me_mapaddr is the fixed address, null here), so the map is found in
// /proc/self/maps by the file's inode: the first such range not already
// registered. Returns the slot, or -1 when none is found or all slots are
// taken (the shard is then read without a name on SIGBUS; nothing else
// changes).
int RegisterMap(const std::string& data_path, const std::string& name) {
  struct stat st {};
  if (::stat(data_path.c_str(), &st) != 0) return -1;
  InstallSigbusHandler();
  std::lock_guard lock(g_mapped_mu);
  auto taken = [](uintptr_t b) {
    for (const auto& m : g_mapped)
      if (m.begin.load(std::memory_order_relaxed) == b) return true;
    return false;
  };
  // Prefer a range whose device matches too; some file systems (overlays)
  // show another device in /proc/self/maps than stat does.
  uintptr_t begin = 0, end = 0, inode_begin = 0, inode_end = 0;
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    unsigned long long b = 0, e = 0, off = 0, inode = 0;
    unsigned dev_major = 0, dev_minor = 0;
    char perms[8];
    if (std::sscanf(line.c_str(), "%llx-%llx %7s %llx %x:%x %llu", &b, &e, perms, &off, &dev_major,
                    &dev_minor, &inode) != 7) {
      continue;
    }
    // LMDB maps the file from its start, at least its whole length.
    if (inode != st.st_ino || off != 0 || e - b < static_cast<unsigned long long>(st.st_size) ||
        taken(b)) {
      continue;
    }
    if (dev_major == major(st.st_dev) && dev_minor == minor(st.st_dev)) {
      begin = static_cast<uintptr_t>(b);
      end = static_cast<uintptr_t>(e);
      break;
    }
    if (inode_begin == 0) {
      inode_begin = static_cast<uintptr_t>(b);
      inode_end = static_cast<uintptr_t>(e);
    }
  }
  if (begin == 0) {
    begin = inode_begin;
    end = inode_end;
  }
  if (begin == 0) return -1;
  for (size_t i = 0; i < kMaxMappedShards; ++i) {
    MappedShard& m = g_mapped[i];
    if (m.begin.load(std::memory_order_relaxed) != 0) continue;
    m.end = end;
    const size_t n = std::min(name.size(), sizeof m.name - 1);
    std::memcpy(m.name, name.data(), n);
    m.name[n] = '\0';
    m.begin.store(begin, std::memory_order_release);
    return static_cast<int>(i);
  }
  return -1;
}

void UnregisterMap(int slot) {
  if (slot < 0) return;
  std::lock_guard lock(g_mapped_mu);
  g_mapped[slot].begin.store(0, std::memory_order_release);
}

// LMDB trusts its pages: a damaged node offset or size in a branch or leaf
// page makes it read outside the page, the file or the map (SIGBUS,
// SIGSEGV) before any value reaches us, and it trusts the page size in the
// meta page too. So its meta pages are checked before LMDB opens a shard,
// and every tree page LMDB is about to read is checked first, with every
// such field, reading it with pread (never through a map) the first time:
// for a read by key, the pages from the root to the leaf that LMDB's own
// search will visit (the same choice at each branch page as LMDB's, which
// the check makes unambiguous by requiring each page's keys in order), each
// page checked once per reader; for a cursor over everything (verify,
// export), the whole tree, once. Opening costs the meta pages and one path,
// whatever the shard's size. Layout of LMDB 0.9 on a 64-bit machine
// (lmdb.h, mdb.c): a 16-byte page header {pgno u64, pad u16, flags u16,
// lower u16, upper u16}, then u16 node offsets; a node {lo u16, hi u16,
// flags u16, ksize u16, key, data}; the meta page's MDB_meta at byte 16:
// magic u32, version u32, address u64, mapsize u64, then the free and main
// databases' MDB_db (48 bytes each; the free one's first u32 is the page
// size), last page u64 at 136, txnid u64 at 144.
static_assert(sizeof(void*) == 8, "the LMDB layout below is that of a 64-bit build");

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

}  // namespace

class ShardReader::TreeCheck {
 public:
  TreeCheck(Fd fd, uint64_t file_bytes) : fd_(std::move(fd)), file_bytes_(file_bytes) {}
  ~TreeCheck() {
    if (located_ == nullptr) return;
    munmap(located_, located_count_ * sizeof(Located));
    g_located_reserved.fetch_sub(located_count_ * sizeof(Located), std::memory_order_relaxed);
  }
  TreeCheck(const TreeCheck&) = delete;
  TreeCheck& operator=(const TreeCheck&) = delete;

  int fd() const { return fd_.get(); }

  // The meta pages, before LMDB reads them: LMDB takes the page size from
  // the first one unchecked (0 divides by zero; a small one reads past its
  // buffers; a huge one reads the second meta page past the file's end).
  // Picks the meta page LMDB will use, as LMDB does: the second when its
  // transaction id is higher, else the first.
  Status Meta() {
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
  Status Shape() {
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

  // Once LMDB's map is known (and confirmed): pages already checked are
  // then read through it rather than with pread.
  void SetMap(const uint8_t* map) { map_ = map; }

  // The pages LMDB's search for `key` visits (key == nullptr: the first
  // record's, as a cursor's MDB_FIRST), root to leaf.
  // Where a record's value lies in the file, as LMDB's mdb_get would find it.
  struct Value {
    bool found = false;
    uint64_t offset = 0;  // in data.mdb
    uint64_t size = 0;
  };

  // With `value`, also finds the key in the leaf (its pages checked, the
  // value's bytes lie in the file): the read that needs no LMDB call.
  Status Path(const unsigned char* key, size_t key_size, Value* value = nullptr) {
    if (root_ == kNoPage) return Status::Ok();
    const bool keyed = key != nullptr && key_size == 8;
    if (keyed && value != nullptr && Lookup(DecodeKey(key), value)) return Status::Ok();
    thread_local std::vector<uint8_t> buffer;
    buffer.resize(psize_);
    uint64_t pgno = root_;
    if (pgno < 2 || pgno >= pages_) return Bad("page " + std::to_string(pgno) + " is outside the file's pages");
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

  // Every page of the tree, once per reader (later calls give the first
  // answer): no page reached twice, and as many records as the meta page says.
  Status Whole() {
    std::lock_guard lock(whole_mu_);
    if (!whole_done_) {
      whole_ = WalkAll();
      whole_done_ = true;
    }
    return whole_;
  }

  uint32_t page_size() const { return psize_; }

  // Asks the CPU to load where record `index` lies (a hint; see
  // SplitReader::ReadTxn::PrefetchLocation).
  void PrefetchLocated(uint64_t index) const {
    if (located_ != nullptr && index - base_ < located_count_)
      __builtin_prefetch(&located_[index - base_], 0, 3);
  }

 private:
  static constexpr uint64_t kNoPage = ~uint64_t{0};
  static constexpr uint16_t kMaxDepth = 32;
  static constexpr uint16_t kBranch = 0x01, kLeaf = 0x02;
  static constexpr uint16_t kBigData = 0x01, kSubData = 0x02, kDupData = 0x04;

  template <typename T>
  static T Get(const uint8_t* page, size_t off) {
    T v;
    std::memcpy(&v, page + off, sizeof v);
    return v;
  }
  static Status Bad(const std::string& why) {
    return Status::Corruption("its LMDB tree is damaged: " + why);
  }
  // LMDB's default key order (mdb_cmp_memn): bytes, then the shorter first.
  static int CompareKeys(const uint8_t* a, size_t an, const uint8_t* b, size_t bn) {
    const int diff = std::memcmp(a, b, std::min(an, bn));
    if (diff != 0) return diff;
    return an < bn ? -1 : an > bn ? 1 : 0;
  }
  static const uint8_t* NodeAt(const uint8_t* page, size_t i) {
    return page + Get<uint16_t>(page, 16 + 2 * i);
  }
  static size_t Nodes(const uint8_t* page) { return (Get<uint16_t>(page, 12) - 16u) / 2; }
  static uint64_t ChildPgno(const uint8_t* page, size_t i) {
    const uint8_t* node = NodeAt(page, i);
    return Get<uint16_t>(node, 0) | (uint64_t{Get<uint16_t>(node, 2)} << 16) |
           (uint64_t{Get<uint16_t>(node, 4)} << 32);
  }
  // The child LMDB's search follows from a checked branch page: the last
  // node from the second on whose key is at most `key`, else the first
  // (mdb_page_search_root after mdb_node_search; keys are checked in order).
  static size_t ChildIndex(const uint8_t* page, const unsigned char* key, size_t key_size) {
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

  // The node with exactly `key` in a checked leaf page (keys in order).
  Value FindInLeaf(const uint8_t* page, uint64_t pgno, const unsigned char* key,
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
  Value ValueOf(const uint8_t* page, uint64_t pgno, const uint8_t* node) const {
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

  // Records located once: where each value lies, by index - base_, filled
  // from a leaf the first time a search reads it (every record of the leaf
  // that LMDB's search routes there), so that later reads of them need no
  // tree page: on a split of millions of records each leaf read is a cache
  // miss or more, and a disk read once evicted. 16 bytes a record, in
  // anonymous pages touched only as they are filled, within the process's
  // budget (ShardReader::LocatedBytes); none for a shard of more than
  // kMaxLocated records or whose first key is not an 8-byte one.
  struct Located {
    uint64_t offset;  // 0: not located yet (byte 0 is a meta page, never a value)
    uint64_t size;
  };
  static constexpr uint64_t kMaxLocated = uint64_t{1} << 22;  // 64 MiB of Located a shard
  struct Bounds {
    bool known = false;  // false: some key on the way is not 8 bytes
    bool has_lo = false, has_hi = false;
    uint64_t lo = 0, hi = 0;  // [lo, hi)
  };

  bool Lookup(uint64_t index, Value* value) const {
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
  static void Narrow(const uint8_t* page, size_t child, Bounds* b) {
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
  void FirstLeaf(const uint8_t* page) {
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
  void Locate(const uint8_t* page, uint64_t pgno, const Bounds& b) {
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

  bool Checked(uint64_t pgno) const {
    return (checked_[pgno / 64].load(std::memory_order_acquire) >> (pgno % 64)) & 1;
  }
  void MarkChecked(uint64_t pgno) {
    checked_[pgno / 64].fetch_or(uint64_t{1} << (pgno % 64), std::memory_order_release);
  }

  Status ReadAt(uint64_t off, uint8_t* out, size_t n, const std::string& what) const {
    size_t got = 0;
    while (got < n) {
      const ssize_t r = ::pread(fd_.get(), out + got, n - got, static_cast<off_t>(off + got));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0)
        return Status::FromErrno("reading " + what + " at byte " + std::to_string(off), errno);
      if (r == 0)
        return Bad(what + " at byte " + std::to_string(off) + " lies past the end of the file");
      got += static_cast<size_t>(r);
    }
    return Status::Ok();
  }

  // One page's own fields, all that LMDB trusts when it searches or reads
  // it: its number and type, free-space bounds, each node's offset, key and
  // value extent (overflow pages in the file), children among the file's
  // pages, keys in order (nothing else makes LMDB's binary search and the
  // check's take the same path).
  Status CheckPage(const uint8_t* page, uint64_t pgno, bool leaf) const {
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

  Status WalkAll() {
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

  Status Walk(uint64_t pgno, uint16_t depth, std::vector<bool>& visited,
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
        return Bad("its tree holds more records than its meta page's " +
                   std::to_string(entries_));
      }
      return Status::Ok();
    }
    for (size_t i = 0; i < n; ++i) {
      NL_RETURN_IF_ERROR(
          Walk(ChildPgno(page, i), static_cast<uint16_t>(depth - 1), visited, buffers, found));
    }
    return Status::Ok();
  }

  Fd fd_;
  uint64_t file_bytes_;
  uint32_t psize_ = 0;
  uint64_t pages_ = 0;
  uint16_t depth_ = 0;
  uint64_t root_ = kNoPage;
  uint64_t entries_ = 0;
  const uint8_t* map_ = nullptr;
  std::unique_ptr<std::atomic<uint64_t>[]> checked_;  // a bit a page
  Located* located_ = nullptr;  // mmap'd, located_count_ of them
  uint64_t located_count_ = 0;
  uint64_t base_ = 0;  // the first record's key
  std::mutex whole_mu_;
  bool whole_done_ = false;
  Status whole_;
};

ShardReader::~ShardReader() {
  env_.reset();  // unmaps; only then may the slot be reused
  UnregisterMap(map_slot_);
}

namespace {

// No path of the manifest leaves the shard set: its text was checked when
// the manifest was read; here, where it leads through symbolic links.
Status CheckWithinShardSet(const std::string& root, const std::string& data,
                           const std::string& what) {
  char* real_root = ::realpath(root.c_str(), nullptr);
  const int root_err = errno;
  char* real_data = ::realpath(data.c_str(), nullptr);
  const int data_err = errno;
  const std::string rr = real_root ? real_root : "", rd = real_data ? real_data : "";
  std::free(real_root);
  std::free(real_data);
  if (rr.empty()) return Status::FromErrno(what + ": cannot resolve " + root, root_err);
  if (rd.empty()) return Status::FromErrno(what + ": cannot resolve its path", data_err);
  if (!PathIsWithin(rd, rr)) {
    return Status::Corruption(what + ": it leads to " + rd + ", outside the shard set " + rr +
                              " (through a symbolic link); a shard set's files stay in its "
                              "directory");
  }
  return Status::Ok();
}

// data.mdb's size, once it is known to be a regular file inside the shard
// set and at least as long as the manifest says. Pages past the end of the
// file would be mapped but not backed (touching them raises SIGBUS), so
// this comes before LMDB reads any page.
Result<uint64_t> CheckDataFile(const std::string& root, const std::string& data,
                               const ShardInfo& info, const std::string& what) {
  struct stat fst {};
  if (::stat(data.c_str(), &fst) != 0) return Status::FromErrno(what, errno);
  if (!S_ISREG(fst.st_mode)) {
    return Status::Corruption(what + ": data.mdb is not a regular file");
  }
  const uint64_t size = static_cast<uint64_t>(fst.st_size);
  NL_RETURN_IF_ERROR(CheckWithinShardSet(root, data, what));
  if (size == 0) {
    return Status::Corruption(what + ": data.mdb is empty (0 bytes): the shard is truncated");
  }
  if (size < info.bytes) {
    return Status::Corruption(what + ": data.mdb is " + std::to_string(size) +
                              " bytes but the manifest says " + std::to_string(info.bytes) +
                              ": the shard is truncated");
  }
  return size;
}

// Opens the environment read-only, mapping just the file (LMDB rounds up to
// the pages in use), not the writer's reservation, so many shards fit in the
// address space, without the kernel's read-ahead on the map (MDB_NORDAHEAD:
// madvise MADV_RANDOM; a record read in random order would otherwise fault in
// ~128 KiB around it, evicting what was read before on a set bigger than
// memory; reading ahead is the loader's, by SplitReader::ReadTxn::WillNeed);
// and checks that the file LMDB opened is the one `checked`
// describes (not one swapped in meanwhile).
Result<LmdbEnv> OpenReadOnlyEnv(const std::string& dir, uint64_t size, int checked,
                                const std::string& what) {
  MDB_env* raw = nullptr;
  NL_RETURN_IF_ERROR(LmdbStatus(mdb_env_create(&raw), "mdb_env_create"));
  LmdbEnv env(raw);
  NL_RETURN_IF_ERROR(LmdbStatus(mdb_env_set_mapsize(raw, std::max<uint64_t>(size, 1 << 20)),
                                "mdb_env_set_mapsize"));
  NL_RETURN_IF_ERROR(LmdbStatus(
      mdb_env_open(raw, dir.c_str(), MDB_RDONLY | MDB_NOLOCK | MDB_NOTLS | MDB_NORDAHEAD, 0444),
      what));
  mdb_filehandle_t lfd;
  struct stat a{};
  struct stat b{};
  if (mdb_env_get_fd(raw, &lfd) == MDB_SUCCESS && ::fstat(lfd, &a) == 0 &&
      ::fstat(checked, &b) == 0 && (a.st_ino != b.st_ino || a.st_dev != b.st_dev)) {
    return Status::Corruption(what + ": data.mdb was replaced while it was being opened");
  }
  return env;
}

// mdb_env_open read only the two meta pages (checked before to be in the
// file: it fails on a shorter one). LMDB's own last page must be too.
Status CheckLastPage(MDB_env* env, uint64_t size, const std::string& what) {
  MDB_envinfo ei{};
  MDB_stat es{};
  NL_RETURN_IF_ERROR(LmdbStatus(mdb_env_info(env, &ei), what));
  NL_RETURN_IF_ERROR(LmdbStatus(mdb_env_stat(env, &es), what));
  const uint64_t needed = (uint64_t{ei.me_last_pgno} + 1) * es.ms_psize;
  if (size < needed) {
    return Status::Corruption(what + ": data.mdb is " + std::to_string(size) +
                              " bytes but its last page (" + std::to_string(ei.me_last_pgno) +
                              ", " + std::to_string(es.ms_psize) + "-byte pages) ends at byte " +
                              std::to_string(needed) + ": the shard is truncated");
  }
  return Status::Ok();
}

// The record count, from the meta page, unchecked by LMDB; readers size
// arrays by it (through the manifest's count, which must equal it). Each
// entry takes at least a node header and its 8-byte key in a page.
Result<uint64_t> CountRecords(MDB_txn* t, MDB_dbi dbi, uint64_t size, const std::string& what) {
  MDB_stat st{};
  NL_RETURN_IF_ERROR(LmdbStatus(mdb_stat(t, dbi, &st), what));
  if (st.ms_entries > size / 16) {
    return Status::Corruption(what + ": data.mdb claims " + std::to_string(st.ms_entries) +
                              " records, more than its " + std::to_string(size) +
                              " bytes can hold: the shard is damaged");
  }
  return uint64_t{st.ms_entries};
}

// Whether LMDB's own first key lies in [map, map + size): a range found
// wrongly (another file of the same inode number, on an overlay) would
// otherwise make every value look out of bounds.
bool FirstKeyInMap(MDB_txn* t, MDB_dbi dbi, const uint8_t* map, uint64_t size) {
  MDB_cursor* c = nullptr;
  MDB_val k, v;
  bool inside = false;
  if (mdb_cursor_open(t, dbi, &c) == MDB_SUCCESS) {
    if (mdb_cursor_get(c, &k, &v, MDB_FIRST) == MDB_SUCCESS) {
      const auto p = reinterpret_cast<uintptr_t>(k.mv_data), b = reinterpret_cast<uintptr_t>(map);
      inside = p >= b && p - b < size;
    }
    mdb_cursor_close(c);
  }
  return inside;
}

}  // namespace

Result<std::unique_ptr<ShardReader>> ShardReader::Open(const std::string& root,
                                                       const ShardInfo& info) {
  const std::string dir = root + "/" + info.path;
  const std::string data = dir + "/data.mdb";
  const std::string what = "cannot open shard " + info.path + " (" + data + ")";
  NL_ASSIGN_OR_RETURN(const uint64_t size, CheckDataFile(root, data, info, what));
  // The meta pages before LMDB reads them (the file LMDB maps is checked
  // through this descriptor's inode, which the tree check keeps reading).
  Fd fd(::open(data.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (!fd.valid()) return Status::FromErrno(what, errno);
  auto check = std::make_unique<TreeCheck>(std::move(fd), size);
  if (Status m = check->Meta(); !m.ok()) return Status::Corruption(what + ": " + m.message());
  std::unique_ptr<ShardReader> r(new ShardReader());
  r->info_ = info;
  NL_ASSIGN_OR_RETURN(r->env_, OpenReadOnlyEnv(dir, size, check->fd(), what));
  MDB_env* env = r->env_.get();
  NL_RETURN_IF_ERROR(CheckLastPage(env, size, what));
  // The first record's path: FirstKeyInMap's cursor reads it.
  Status first = check->Shape();
  if (first.ok()) first = check->Path(nullptr, 0);
  if (!first.ok()) return Status::Corruption(what + ": " + first.message());
  r->map_slot_ = RegisterMap(data, info.path + " (" + data + ")");
  MDB_txn* t = nullptr;
  NL_RETURN_IF_ERROR(LmdbStatus(mdb_txn_begin(env, nullptr, MDB_RDONLY, &t), what));
  LmdbTxn txn(t);
  NL_RETURN_IF_ERROR(LmdbStatus(mdb_dbi_open(t, nullptr, 0, &r->dbi_), what));
  NL_ASSIGN_OR_RETURN(r->entries_, CountRecords(t, r->dbi_, size, what));
  // Where LMDB mapped the file (LMDB does not say: me_mapaddr is only set for
  // MDB_FIXEDMAP), as found for the SIGBUS handler in /proc/self/maps.
  if (r->map_slot_ >= 0) {
    r->map_ = reinterpret_cast<const uint8_t*>(g_mapped[r->map_slot_].begin.load());
  }
  r->file_bytes_ = size;
  // Unconfirmed by LMDB's first key, the bounds are not checked (the tree
  // check still holds) and the tree check keeps reading with pread.
  if (r->map_ != nullptr && r->entries_ > 0 && !FirstKeyInMap(t, r->dbi_, r->map_, size)) {
    r->map_ = nullptr;
  }
  check->SetMap(r->map_);
  r->check_ = std::move(check);
  return r;
}

Status ShardReader::CheckWholeTree() const { return check_->Whole(); }

uint64_t ShardReader::LocatedBytes() { return g_located_reserved.load(std::memory_order_relaxed); }
void ShardReader::SetLocatedBudget(uint64_t bytes) {
  g_located_budget.store(std::max<uint64_t>(bytes, 1), std::memory_order_relaxed);
}

Result<ShardReader::ReadTxn> ShardReader::BeginRead() const {
  MDB_txn* t = nullptr;
  NL_RETURN_IF_ERROR(LmdbStatus(mdb_txn_begin(env_.get(), nullptr, MDB_RDONLY, &t)));
  return ReadTxn(LmdbTxn(t), dbi_, map_, file_bytes_, check_.get());
}

Status ShardReader::ReadTxn::CheckInFile(const MDB_val& v, const char* what) const {
  const auto* p = static_cast<const uint8_t*>(v.mv_data);
  const uint64_t off =
      static_cast<uint64_t>(reinterpret_cast<uintptr_t>(p) - reinterpret_cast<uintptr_t>(map_));
  if (map_ == nullptr) return Status::Ok();  // not found in /proc/self/maps: cannot tell
  if (p < map_ || off > file_bytes_ || v.mv_size > file_bytes_ - off) {
    return Status::Corruption(std::string("LMDB gives a ") + what + " of " +
                              std::to_string(v.mv_size) + " bytes that does not lie in data.mdb (" +
                              std::to_string(file_bytes_) + " bytes): the shard is damaged");
  }
  return Status::Ok();
}

Result<std::span<const uint8_t>> ShardReader::ReadTxn::Get(uint64_t index) const {
  unsigned char key[8];
  EncodeKey(index, key);
  if (map_ != nullptr) {
    // The tree check's own search of the checked pages finds the node
    // LMDB's mdb_get would (the same path; tested against it for every
    // record), or its record located before: no second search of the tree,
    // which on a split of millions of records is a cache miss or more a level.
    TreeCheck::Value where;
    NL_RETURN_IF_ERROR(check_->Path(key, sizeof key, &where));
    if (!where.found) return Status::Corruption("record missing");
    if (where.offset > file_bytes_ || where.size > file_bytes_ - where.offset) {
      return Status::Corruption("a value of " + std::to_string(where.size) + " bytes at byte " +
                                std::to_string(where.offset) + " does not lie in data.mdb (" +
                                std::to_string(file_bytes_) + " bytes): the shard is damaged");
    }
    return std::span<const uint8_t>(map_ + where.offset, where.size);
  }
  NL_RETURN_IF_ERROR(check_->Path(key, sizeof key));
  MDB_val k{8, key}, v;
  const int rc = mdb_get(txn_.get(), dbi_, &k, &v);
  if (rc == MDB_NOTFOUND) return Status::Corruption("record missing");
  NL_RETURN_IF_ERROR(LmdbStatus(rc));
  NL_RETURN_IF_ERROR(CheckInFile(v, "value"));
  return std::span<const uint8_t>(static_cast<const uint8_t*>(v.mv_data), v.mv_size);
}

Result<std::span<const uint8_t>> ShardReader::ReadTxn::Copy(uint64_t index,
                                                            std::vector<uint8_t>* out) const {
  unsigned char key[8];
  EncodeKey(index, key);
  TreeCheck::Value where;
  NL_RETURN_IF_ERROR(check_->Path(key, sizeof key, &where));
  if (!where.found) return Status::Corruption("record missing");
  if (out->size() < where.size) out->resize(where.size);
  size_t got = 0;
  while (got < where.size) {
    const ssize_t r = ::pread(check_->fd(), out->data() + got, where.size - got,
                              static_cast<off_t>(where.offset + got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      return Status::FromErrno("reading data.mdb at byte " + std::to_string(where.offset + got),
                               errno);
    }
    if (r == 0) {
      return Status::Corruption("data.mdb ends at byte " + std::to_string(where.offset + got) +
                                ", inside this record (bytes " + std::to_string(where.offset) +
                                ".." + std::to_string(where.offset + where.size) +
                                "): the shard is truncated");
    }
    got += static_cast<size_t>(r);
  }
  return std::span<const uint8_t>(out->data(), where.size);
}

Result<ShardReader::ReadTxn::Extent> ShardReader::ReadTxn::Locate(uint64_t index) const {
  unsigned char key[8];
  EncodeKey(index, key);
  TreeCheck::Value where;
  NL_RETURN_IF_ERROR(check_->Path(key, sizeof key, &where));
  if (!where.found) return Status::Corruption("record missing");
  return Extent{check_->fd(), where.offset, where.size};
}

Status ShardReader::ReadTxn::ForEach(const std::function<Status(const Entry&)>& fn) const {
  NL_RETURN_IF_ERROR(check_->Whole());
  MDB_cursor* c = nullptr;
  NL_RETURN_IF_ERROR(LmdbStatus(mdb_cursor_open(txn_.get(), dbi_, &c), "cursor"));
  std::unique_ptr<MDB_cursor, void (*)(MDB_cursor*)> cursor(c, mdb_cursor_close);
  MDB_val k, v;
  int rc = mdb_cursor_get(c, &k, &v, MDB_FIRST);
  while (rc == MDB_SUCCESS) {
    NL_RETURN_IF_ERROR(CheckInFile(k, "key"));
    NL_RETURN_IF_ERROR(CheckInFile(v, "value"));
    Entry e;
    e.key_size = k.mv_size;
    if (k.mv_size == 8) e.index = DecodeKey(static_cast<const unsigned char*>(k.mv_data));
    e.value = {static_cast<const uint8_t*>(v.mv_data), v.mv_size};
    NL_RETURN_IF_ERROR(fn(e));
    rc = mdb_cursor_get(c, &k, &v, MDB_NEXT);
  }
  if (rc != MDB_NOTFOUND) return LmdbStatus(rc, "cursor");
  return Status::Ok();
}

Result<std::unique_ptr<SplitReader>> SplitReader::Open(const std::string& root, const Manifest& m,
                                                       const std::string& split) {
  const SplitInfo* s = m.FindSplit(split);
  if (!s) {
    std::string have;
    for (const auto& [name, _] : m.splits) have += (have.empty() ? "" : ", ") + name;
    return Status::NotFound("shard set " + root + " has no split '" + split +
                            "' (it has: " + (have.empty() ? "none" : have) + ")");
  }
  std::unique_ptr<SplitReader> r(new SplitReader());
  r->root_ = root;
  r->split_ = split;
  r->num_samples_ = s->num_samples;
  r->num_classes_ = static_cast<uint32_t>(m.classes.size());
  // The manifest's counts size what readers allocate: they must agree with
  // what the shards hold before anything trusts them.
  uint64_t sum = 0;
  for (const ShardInfo& info : s->shards) {
    NL_ASSIGN_OR_RETURN(auto shard, ShardReader::Open(root, info));
    if (shard->entries() != info.count) {
      return Status::Corruption("split '" + split + "', shard " + info.path +
                                ": the manifest says " + std::to_string(info.count) +
                                " records but the shard holds " + std::to_string(shard->entries()));
    }
    if (info.first_index != sum) {
      return Status::Corruption("split '" + split + "', shard " + info.path + " starts at index " +
                                std::to_string(info.first_index) + ", expected " +
                                std::to_string(sum));
    }
    sum += info.count;
    r->shards_.push_back(std::move(shard));
  }
  if (sum != s->num_samples) {
    return Status::Corruption("split '" + split + "': num_samples is " +
                              std::to_string(s->num_samples) + " but its shards hold " +
                              std::to_string(sum) + " records");
  }
  return r;
}

size_t SplitReader::ShardOf(uint64_t index) const {
  auto it = std::upper_bound(shards_.begin(), shards_.end(), index,
                             [](uint64_t i, const auto& sh) { return i < sh->info().first_index; });
  return static_cast<size_t>(it - shards_.begin()) - 1;
}

std::string SplitReader::Where(uint64_t index) const {
  std::string w = "split '" + split_ + "'";
  if (index < num_samples_) w += ", shard " + shards_[ShardOf(index)]->info().path;
  return w + ", index " + std::to_string(index);
}

SplitReader::ReadTxn::ReadTxn(const SplitReader* r) : reader_(r), txns_(r->shards_.size()) {}

Result<ShardReader::ReadTxn*> SplitReader::ReadTxn::TxnFor(uint64_t index) {
  if (index >= reader_->num_samples_) {
    return Status::InvalidArgument("index " + std::to_string(index) + " out of range: split '" +
                                   reader_->split_ + "' has " +
                                   std::to_string(reader_->num_samples_) + " samples");
  }
  const size_t si = reader_->ShardOf(index);
  if (!txns_[si].active()) {
    Result<ShardReader::ReadTxn> t = reader_->shards_[si]->BeginRead();
    if (!t.ok()) return t.status().WithContext(reader_->Where(index));
    txns_[si] = std::move(*t);
  }
  return &txns_[si];
}

Result<std::span<const uint8_t>> SplitReader::ReadTxn::Get(uint64_t index) {
  NL_ASSIGN_OR_RETURN(ShardReader::ReadTxn * txn, TxnFor(index));
  Result<std::span<const uint8_t>> value = txn->Get(index);
  if (!value.ok()) return value.status().WithContext(reader_->Where(index));
  return value;
}

Result<std::span<const uint8_t>> SplitReader::ReadTxn::CopyOf(uint64_t index,
                                                              std::vector<uint8_t>* out) {
  NL_ASSIGN_OR_RETURN(ShardReader::ReadTxn * txn, TxnFor(index));
  Result<std::span<const uint8_t>> value = txn->Copy(index, out);
  if (!value.ok()) return value.status().WithContext(reader_->Where(index));
  return value;
}

void ShardReader::ReadTxn::PrefetchLocation(uint64_t index) const {
  check_->PrefetchLocated(index);
}

void SplitReader::ReadTxn::PrefetchLocation(uint64_t index) {
  Result<ShardReader::ReadTxn*> txn = TxnFor(index);
  if (txn.ok()) (*txn)->PrefetchLocation(index);
}

void SplitReader::ReadTxn::PrefetchRecord(uint64_t index) {
  Result<std::span<const uint8_t>> bytes = Get(index);
  if (!bytes.ok()) return;  // its read reports it
  const uint8_t* p = bytes->data();
  // The head of a big record is enough: reading it on, the CPU's own
  // prefetcher follows.
  const size_t n = std::min<size_t>(bytes->size(), 8 << 10);
  for (size_t off = 0; off < n; off += 64) __builtin_prefetch(p + off, 0, 3);
}

uint64_t SplitReader::ReadTxn::WillNeed(std::span<const uint64_t> sorted_indices,
                                        uint64_t merge_gap) {
  static const uint64_t kPage = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  uint64_t asked = 0;
  int fd = -1;
  uint64_t lo = 0, hi = 0;  // the run being gathered in fd: [lo, hi)
  auto flush = [&] {
    if (hi <= lo) return;
    const uint64_t a = lo & ~(kPage - 1);
    // Only a hint: an error changes nothing.
    (void)posix_fadvise(fd, static_cast<off_t>(a), static_cast<off_t>(hi - a), POSIX_FADV_WILLNEED);
    asked += hi - a;
    lo = hi = 0;
  };
  for (uint64_t index : sorted_indices) {
    Result<ShardReader::ReadTxn*> txn = TxnFor(index);
    if (!txn.ok()) continue;  // the read that needs it reports it
    Result<ShardReader::ReadTxn::Extent> e = (*txn)->Locate(index);
    if (!e.ok() || e->size == 0) continue;
    const uint64_t b = e->offset, end = b + e->size;
    if (hi > lo && e->fd == fd && b >= lo && b <= hi + merge_gap) {
      hi = std::max(hi, end);
    } else {
      flush();
      fd = e->fd;
      lo = b;
      hi = end;
    }
  }
  flush();
  return asked;
}

Result<RecordView> SplitReader::ReadTxn::Read(uint64_t index, const RecordLimits& limits,
                                              std::vector<uint8_t>* copy) {
  std::span<const uint8_t> bytes;
  if (copy == nullptr) {
    NL_ASSIGN_OR_RETURN(bytes, Get(index));
  } else {
    NL_ASSIGN_OR_RETURN(bytes, CopyOf(index, copy));
  }
  return Decode(index, bytes, limits);
}

Result<RecordView> SplitReader::ReadTxn::Decode(uint64_t index, std::span<const uint8_t> bytes,
                                                const RecordLimits& limits) const {
  RecordLimits l = limits;
  if (l.num_classes == 0) l.num_classes = reader_->num_classes_;
  Result<RecordView> r = DecodeRecord(bytes, l);
  if (!r.ok()) return r.status().WithContext(reader_->Where(index));
  return r;
}

Result<ShardReader::ReadTxn::Extent> SplitReader::ReadTxn::Locate(uint64_t index) {
  NL_ASSIGN_OR_RETURN(ShardReader::ReadTxn * txn, TxnFor(index));
  Result<ShardReader::ReadTxn::Extent> e = txn->Locate(index);
  if (!e.ok()) return e.status().WithContext(reader_->Where(index));
  return e;
}

}  // namespace nl
