#include "formats/shard.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "base/file_util.h"
#include "formats/crc32c.h"
#include "formats/shard_map_registry.h"
#include "formats/shard_tree_check.h"

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

ShardReader::~ShardReader() {
  env_.reset();  // unmaps; only then may the slot be reused
  shard_internal::UnregisterMap(map_slot_);
}

namespace {

// data.mdb's size, once it is known to be at least as long as the manifest
// says. Pages past the end of the file would be mapped but not backed
// (touching them raises SIGBUS), so this comes before LMDB reads any page.
Result<uint64_t> CheckDataSize(const ShardFile& file, const ShardInfo& info,
                               const std::string& what) {
  Result<uint64_t> size = file.Size();
  if (!size.ok()) return size.status().WithContext(what + ": reading its size");
  if (*size == 0) {
    return Status::Corruption(what + ": data.mdb is empty (0 bytes): the shard is truncated");
  }
  if (*size < info.bytes) {
    return Status::Corruption(what + ": data.mdb is " + std::to_string(*size) +
                              " bytes but the manifest says " + std::to_string(info.bytes) +
                              ": the shard is truncated");
  }
  return *size;
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
                                                       const ShardInfo& info,
                                                       const ShardFiles& files) {
  NL_ASSIGN_OR_RETURN(std::unique_ptr<ShardFile> file, files.Open(root, info));
  const std::string data = file->dir() + "/data.mdb";
  const std::string what = "cannot open shard " + info.path + " (" + data + ")";
  NL_ASSIGN_OR_RETURN(const uint64_t size, CheckDataSize(*file, info, what));
  // The meta pages before LMDB reads them (the file LMDB maps is checked
  // through the seam's descriptor's inode; the tree check reads through it).
  Result<std::unique_ptr<TreeCheck>> opened = TreeCheck::Open(file.get(), size);
  if (!opened.ok()) return opened.status().WithContext(what);
  std::unique_ptr<TreeCheck> check = std::move(*opened);
  std::unique_ptr<ShardReader> r(new ShardReader());
  r->info_ = info;
  NL_ASSIGN_OR_RETURN(r->env_, OpenReadOnlyEnv(file->dir(), size, file->fd(), what));
  MDB_env* env = r->env_.get();
  NL_RETURN_IF_ERROR(CheckLastPage(env, size, what));
  // The first record's path: FirstKeyInMap's cursor reads it.
  if (Status first = check->CheckFirstPath(); !first.ok()) return first.WithContext(what);
  r->map_slot_ = shard_internal::RegisterMap(data, info.path + " (" + data + ")");
  MDB_txn* t = nullptr;
  NL_RETURN_IF_ERROR(LmdbStatus(mdb_txn_begin(env, nullptr, MDB_RDONLY, &t), what));
  LmdbTxn txn(t);
  NL_RETURN_IF_ERROR(LmdbStatus(mdb_dbi_open(t, nullptr, 0, &r->dbi_), what));
  NL_ASSIGN_OR_RETURN(r->entries_, CountRecords(t, r->dbi_, size, what));
  // Where LMDB mapped the file (LMDB does not say: me_mapaddr is only set for
  // MDB_FIXEDMAP), as found for the SIGBUS handler in /proc/self/maps.
  if (r->map_slot_ >= 0) {
    r->map_ = shard_internal::MapBegin(r->map_slot_);
  }
  r->file_bytes_ = size;
  // Unconfirmed by LMDB's first key, the bounds are not checked (the tree
  // check still holds) and the tree check keeps reading with pread.
  if (r->map_ != nullptr && r->entries_ > 0 && !FirstKeyInMap(t, r->dbi_, r->map_, size)) {
    r->map_ = nullptr;
  }
  check->SetMap(r->map_);
  r->check_ = std::move(check);
  r->file_ = std::move(file);
  return r;
}

Status ShardReader::CheckWholeTree() const { return check_->Whole(); }

Result<ShardReader::ReadTxn> ShardReader::BeginRead() const {
  // LMDB reads its meta pages through its map as a transaction begins, and
  // so do reads through the map: on a file cut short since it was opened,
  // each would be a SIGBUS.
  Result<uint64_t> now = file_->Size();
  if (!now.ok()) return now.status().WithContext("reading data.mdb's size");
  if (*now < file_bytes_) {
    return Status::Corruption("data.mdb is now " + std::to_string(*now) + " bytes, " +
                              std::to_string(file_bytes_) +
                              " when the shard was opened: it was truncated while open");
  }
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
  const ShardFile& file = check_->file();
  size_t got = 0;
  while (got < where.size) {
    Result<size_t> r = file.ReadSome(where.offset + got, out->data() + got, where.size - got);
    if (!r.ok()) {
      return r.status().WithContext("reading data.mdb at byte " +
                                    std::to_string(where.offset + got));
    }
    if (*r == 0) {
      return Status::Corruption("data.mdb ends at byte " + std::to_string(where.offset + got) +
                                ", inside this record (bytes " + std::to_string(where.offset) +
                                ".." + std::to_string(where.offset + where.size) +
                                "): the shard is truncated");
    }
    got += *r;
  }
  return std::span<const uint8_t>(out->data(), where.size);
}

Result<ShardReader::ReadTxn::Extent> ShardReader::ReadTxn::Locate(uint64_t index) const {
  unsigned char key[8];
  EncodeKey(index, key);
  TreeCheck::Value where;
  NL_RETURN_IF_ERROR(check_->Path(key, sizeof key, &where));
  if (!where.found) return Status::Corruption("record missing");
  return Extent{check_->file().fd(), where.offset, where.size, &check_->file()};
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
                                                       const std::string& split,
                                                       const ShardFiles& files) {
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
    NL_ASSIGN_OR_RETURN(auto shard, ShardReader::Open(root, info, files));
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
