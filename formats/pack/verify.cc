#include "formats/pack/verify.h"

#include <algorithm>
#include <atomic>
#include <cstdio>

#include "formats/crc32c.h"
#include "base/file_util.h"
#include "base/mutex.h"
#include "formats/pack/pack.h"
#include "formats/record.h"
#include "formats/resize.h"
#include "formats/shard.h"
#include "base/worker_pool.h"

namespace nl {
namespace {

class Reporter {
 public:
  explicit Reporter(VerifyReport* r, size_t max) : r_(r), max_(max) {}
  void Add(std::string where, std::string what) {
    MutexLock lock(&mu_);
    if (r_->problems.size() < max_) r_->problems.push_back({std::move(where), std::move(what)});
  }

 private:
  Mutex mu_;
  VerifyReport* r_ NL_PT_GUARDED_BY(mu_);
  size_t max_;
};

std::string At(const ShardInfo& s, uint64_t index) {
  return s.path + " index " + std::to_string(index);
}

// Checks one record fully: header, CRCs, label, and that the payload decodes
// to the size the header states.
Status CheckRecord(std::span<const uint8_t> value, uint32_t num_classes, uint64_t max_pixels,
                   bool quick, Image* scratch, RecordHeader* header) {
  RecordLimits limits;
  limits.num_classes = num_classes;
  limits.max_pixels = max_pixels;
  NL_ASSIGN_OR_RETURN(RecordView rec, DecodeRecord(value, limits));
  *header = rec.header;
  if (quick || rec.header.encoding == Encoding::kRaw) return Status::Ok();  // (raw: its length is checked)
  DecodeLimits dl;
  dl.max_pixels = max_pixels;
  return DecodeRecordImage(rec, dl, scratch);
}

// Step 1: data.mdb's size against the manifest. False when there is no file.
bool CheckShardSize(const std::string& root, const ShardInfo& sh, const ShardFiles& files,
                    Reporter* rep) {
  Result<std::unique_ptr<ShardFile>> file = files.Open(root, sh);
  if (!file.ok()) {
    rep->Add(sh.path, file.status().ToString());
    return false;
  }
  Result<uint64_t> size = (*file)->Size();
  if (!size.ok()) {
    rep->Add(sh.path, size.status().WithContext("cannot read the size of " + (*file)->dir() +
                                                "/data.mdb").ToString());
    return false;
  }
  if (*size != sh.bytes) {
    rep->Add(sh.path, "data.mdb is " + std::to_string(*size) + " bytes, manifest says " +
                          std::to_string(sh.bytes));
  }
  return true;
}

struct StoredRecord {
  uint64_t index;
  std::span<const uint8_t> value;  // valid while the walk's ReadTxn lives
};

struct Walk {
  uint64_t count = 0;  // entries, well-formed keys or not
  std::vector<StoredRecord> records;
};

// Step 2 (one thread, key order): keys in sequence, the record count and the
// checksum; returns the records for step 3, pointing into `txn`.
Walk WalkKeys(const ShardInfo& sh, const ShardReader::ReadTxn& txn, Reporter* rep) {
  uint32_t crc = 0;
  uint64_t expect = sh.first_index;
  Walk w;
  Status walk = txn.ForEach([&](const ShardReader::Entry& e) {
    ++w.count;
    if (e.key_size != 8) {
      rep->Add(sh.path, "key of " + std::to_string(e.key_size) + " bytes (expected 8)");
      return Status::Ok();
    }
    if (e.index != expect) {
      rep->Add(At(sh, e.index), "unexpected key (expected index " + std::to_string(expect) + ")");
    }
    expect = e.index + 1;
    unsigned char key[8];
    EncodeKey(e.index, key);
    crc = Crc32c(crc, key, 8);
    crc = Crc32c(crc, e.value.data(), e.value.size());
    w.records.push_back({e.index, e.value});
    return Status::Ok();
  });
  if (!walk.ok()) rep->Add(sh.path, walk.ToString());
  if (w.count != sh.count) {
    rep->Add(sh.path, "holds " + std::to_string(w.count) + " records, manifest says " +
                          std::to_string(sh.count));
  }
  char hex[32];
  std::snprintf(hex, sizeof hex, "crc32c:%08x", crc);
  if (sh.checksum != hex) {
    rep->Add(sh.path,
             std::string("checksum ") + hex + " does not match the manifest's " + sh.checksum);
  }
  return w;
}

// A split packed with --max-side: its limit and every sample's original size.
struct MaxSide {
  uint32_t n = 0;
  std::vector<std::array<uint32_t, 2>> original;
};

// That a record's size is what --max-side makes of its original size.
Status CheckMaxSide(const RecordHeader& h, uint64_t index, const MaxSide& ms) {
  if (index >= ms.original.size()) return Status::Ok();  // (reported as an unexpected key)
  const auto [ow, oh] = ms.original[index];
  const auto [w, h2] = MaxSideSize(ow, oh, ms.n);
  if (h.width == w && h.height == h2) return Status::Ok();
  return Status::Corruption("image is " + std::to_string(h.width) + "x" + std::to_string(h.height) +
                            " but `max_side` " + std::to_string(ms.n) + " of its original " +
                            std::to_string(ow) + "x" + std::to_string(oh) + " (manifest) gives " +
                            std::to_string(w) + "x" + std::to_string(h2));
}

// Step 3: every record's header and CRCs; without --quick, decodes too. The
// records are shared out on a WorkerPool; their problems are reported in
// index order, whatever the thread count.
void CheckRecords(const ShardInfo& sh, const std::vector<StoredRecord>& records,
                  uint32_t num_classes, const VerifyOptions& o, const MaxSide& ms, Reporter* rep,
                  std::atomic<uint64_t>* decoded) {
  std::vector<Status> results(records.size());
  std::atomic<size_t> next{0};
  WorkerPool::Options po;
  po.name = "verify worker";
  const uint32_t threads = o.quick ? 1 : (o.threads ? o.threads : DefaultThreads());
  po.threads = static_cast<uint32_t>(std::clamp<uint64_t>(
      std::min<uint64_t>(threads, records.size()), 1, WorkerPool::kMaxThreads));
  auto body = [&](int) {
    Image scratch;
    RecordHeader header;
    for (size_t i; (i = next.fetch_add(1)) < records.size();) {
      results[i] = CheckRecord(records[i].value, num_classes, o.max_pixels, o.quick, &scratch, &header);
      if (!o.quick) ++*decoded;
      if (results[i].ok() && ms.n > 0) results[i] = CheckMaxSide(header, records[i].index, ms);
    }
    return Status::Ok();
  };
  Result<std::unique_ptr<WorkerPool>> pool = WorkerPool::Start(po, body);
  Status pool_status = pool.ok() ? (*pool)->Join() : pool.status();
  for (size_t i = 0; i < records.size(); ++i) {
    if (!results[i].ok()) rep->Add(At(sh, records[i].index), results[i].ToString());
  }
  if (!pool_status.ok()) rep->Add(sh.path, pool_status.ToString());
}

void VerifyShard(const std::string& root, const ShardInfo& sh, uint32_t num_classes,
                 const VerifyOptions& o, const MaxSide& ms, Reporter* rep,
                 std::atomic<uint64_t>* checked, std::atomic<uint64_t>* decoded) {
  const ShardFiles& files = o.files != nullptr ? *o.files : ShardFiles::Local();
  if (!CheckShardSize(root, sh, files, rep)) return;
  Result<std::unique_ptr<ShardReader>> reader = ShardReader::Open(root, sh, files);
  if (!reader.ok()) {
    rep->Add(sh.path, reader.status().ToString());
    return;
  }
  // One read transaction for both steps: step 3 reads the values step 2 saw.
  Result<ShardReader::ReadTxn> txn = (*reader)->BeginRead();
  if (!txn.ok()) {
    rep->Add(sh.path, txn.status().WithContext(sh.path).ToString());
    return;
  }
  const Walk walk = WalkKeys(sh, *txn, rep);
  *checked += walk.count;
  CheckRecords(sh, walk.records, num_classes, o, ms, rep, decoded);
}

}  // namespace

VerifyReport VerifyShardSet(const std::string& root, const VerifyOptions& o) {
  VerifyReport report;
  Reporter rep(&report, o.max_problems);
  Result<Manifest> m = LoadManifest(root);
  if (!m.ok()) {
    rep.Add(root + "/" + kManifestFileName, m.status().ToString());
    return report;
  }
  const uint32_t num_classes = static_cast<uint32_t>(m->classes.size());
  std::atomic<uint64_t> checked{0}, decoded{0};
  for (const auto& [split, info] : m->splits) {
    MaxSide ms;
    if (info.max_side > 0) {
      Result<std::vector<std::array<uint32_t, 2>>> sizes = OriginalSizes(info);
      if (sizes.ok()) {
        ms = {info.max_side, std::move(*sizes)};
      } else {
        rep.Add(root + "/" + kManifestFileName + " split '" + split + "'", sizes.status().ToString());
      }
    }
    for (const ShardInfo& sh : info.shards) {
      VerifyShard(root, sh, num_classes, o, ms, &rep, &checked, &decoded);
    }
  }
  report.records_checked = checked;
  report.images_decoded = decoded;
  return report;
}

Result<DecodedSample> ReadSample(const std::string& root, const std::string& split, uint64_t index,
                                 uint64_t max_pixels, const ShardFiles& files) {
  NL_ASSIGN_OR_RETURN(Manifest m, LoadManifest(root));
  NL_ASSIGN_OR_RETURN(auto reader, SplitReader::Open(root, m, split, files));
  auto txn = reader->BeginRead();
  RecordLimits limits;
  limits.max_pixels = max_pixels;
  NL_ASSIGN_OR_RETURN(RecordView rec, txn.Read(index, limits));
  DecodedSample out;
  out.label = rec.header.label;
  DecodeLimits dl;
  dl.max_pixels = limits.max_pixels;
  if (Status st = DecodeRecordImage(rec, dl, &out.image); !st.ok()) return st.WithContext(reader->Where(index));
  return out;
}

}  // namespace nl
