#include "formats/verify.h"

#include <atomic>
#include <cstdio>
#include <mutex>
#include <thread>

#include "formats/crc32c.h"
#include "formats/file_util.h"
#include "formats/pack.h"
#include "formats/record.h"
#include "formats/shard.h"

namespace nl {
namespace {

class Reporter {
 public:
  explicit Reporter(VerifyReport* r, size_t max) : r_(r), max_(max) {}
  void Add(std::string where, std::string what) {
    std::lock_guard lock(mu_);
    if (r_->problems.size() < max_) r_->problems.push_back({std::move(where), std::move(what)});
  }

 private:
  std::mutex mu_;
  VerifyReport* r_;
  size_t max_;
};

std::string At(const ShardInfo& s, uint64_t index) {
  return s.path + " index " + std::to_string(index);
}

// Checks one record fully: header, CRCs, label, and that the payload decodes
// to the size the header states.
Status CheckRecord(std::span<const uint8_t> value, uint32_t num_classes, uint64_t max_pixels,
                   Image* scratch) {
  RecordLimits limits;
  limits.num_classes = num_classes;
  limits.max_pixels = max_pixels;
  NL_ASSIGN_OR_RETURN(RecordView rec, DecodeRecord(value, limits));
  if (rec.header.encoding == Encoding::kRaw) return Status::Ok();
  DecodeLimits dl;
  dl.max_pixels = max_pixels;
  NL_RETURN_IF_ERROR(DecodeImageInto(rec.payload, dl, scratch));
  return CheckDecodedShape(rec.header, *scratch);
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
    for (const ShardInfo& sh : info.shards) {
      Result<uint64_t> size = FileSize(root + "/" + sh.path + "/data.mdb");
      if (!size.ok()) {
        rep.Add(sh.path, size.status().ToString());
        continue;
      }
      if (*size != sh.bytes) {
        rep.Add(sh.path, "data.mdb is " + std::to_string(*size) + " bytes, manifest says " +
                             std::to_string(sh.bytes));
      }
      Result<std::unique_ptr<ShardReader>> reader = ShardReader::Open(root, sh);
      if (!reader.ok()) {
        rep.Add(sh.path, reader.status().ToString());
        continue;
      }
      // Pass 1 (single thread, cursor order): keys, count, checksum, and the
      // values to decode.
      uint32_t crc = 0;
      uint64_t expect = sh.first_index, count = 0;
      std::vector<std::pair<uint64_t, std::span<const uint8_t>>> values;
      MDB_txn* t = nullptr;
      // Keep one read txn open so the value views stay valid for pass 2.
      Status st = LmdbStatus(mdb_txn_begin((*reader)->env(), nullptr, MDB_RDONLY, &t), sh.path);
      LmdbTxn txn(t);
      if (st.ok()) {
        MDB_cursor* c = nullptr;
        st = LmdbStatus(mdb_cursor_open(t, (*reader)->dbi(), &c), sh.path);
        if (st.ok()) {
          MDB_val k, v;
          int rc = mdb_cursor_get(c, &k, &v, MDB_FIRST);
          while (rc == MDB_SUCCESS) {
            if (k.mv_size != 8) {
              rep.Add(sh.path, "key of " + std::to_string(k.mv_size) + " bytes (expected 8)");
            } else {
              const uint64_t index = DecodeKey(static_cast<const unsigned char*>(k.mv_data));
              if (index != expect) {
                rep.Add(At(sh, index),
                        "unexpected key (expected index " + std::to_string(expect) + ")");
              }
              expect = index + 1;
              crc = Crc32c(crc, k.mv_data, 8);
              crc = Crc32c(crc, v.mv_data, v.mv_size);
              values.emplace_back(index, std::span<const uint8_t>(
                                             static_cast<const uint8_t*>(v.mv_data), v.mv_size));
            }
            ++count;
            rc = mdb_cursor_get(c, &k, &v, MDB_NEXT);
          }
          if (rc != MDB_NOTFOUND) rep.Add(sh.path, LmdbStatus(rc, "cursor").ToString());
          mdb_cursor_close(c);
        }
      }
      if (!st.ok()) {
        rep.Add(sh.path, st.ToString());
        continue;
      }
      if (count != sh.count) {
        rep.Add(sh.path, "holds " + std::to_string(count) + " records, manifest says " +
                             std::to_string(sh.count));
      }
      char hex[32];
      std::snprintf(hex, sizeof hex, "crc32c:%08x", crc);
      if (sh.checksum != hex) {
        rep.Add(sh.path,
                std::string("checksum ") + hex + " does not match the manifest's " + sh.checksum);
      }
      checked += count;
      // Pass 2: every record's header and CRC; without --quick, decode too.
      const uint32_t threads = o.quick ? 1 : (o.threads ? o.threads : DefaultThreads());
      std::atomic<size_t> next{0};
      auto work = [&] {
        Image scratch;
        for (size_t i; (i = next.fetch_add(1)) < values.size();) {
          const auto& [index, value] = values[i];
          Status rs;
          if (o.quick) {
            RecordLimits limits;
            limits.num_classes = num_classes;
            limits.max_pixels = o.max_pixels;
            rs = DecodeRecord(value, limits).status();
          } else {
            rs = CheckRecord(value, num_classes, o.max_pixels, &scratch);
            ++decoded;
          }
          if (!rs.ok()) rep.Add(At(sh, index), rs.ToString());
        }
      };
      std::vector<std::jthread> pool;
      for (uint32_t i = 1; i < threads; ++i) pool.emplace_back(work);
      work();
    }
  }
  report.records_checked = checked;
  report.images_decoded = decoded;
  return report;
}

Result<DecodedSample> ReadSample(const std::string& root, const std::string& split, uint64_t index,
                                 uint64_t max_pixels) {
  NL_ASSIGN_OR_RETURN(Manifest m, LoadManifest(root));
  NL_ASSIGN_OR_RETURN(auto reader, SplitReader::Open(root, m, split));
  auto txn = reader->BeginRead();
  RecordLimits limits;
  limits.max_pixels = max_pixels;
  NL_ASSIGN_OR_RETURN(RecordView rec, txn.Read(index, limits));
  DecodedSample out;
  out.label = rec.header.label;
  if (rec.header.encoding == Encoding::kRaw) {
    out.image.width = rec.header.width;
    out.image.height = rec.header.height;
    out.image.pixels.assign(rec.payload.begin(), rec.payload.end());
  } else {
    DecodeLimits dl;
    dl.max_pixels = limits.max_pixels;
    Status st = DecodeImageInto(rec.payload, dl, &out.image);
    if (st.ok()) st = CheckDecodedShape(rec.header, out.image);
    if (!st.ok()) return st.WithContext(reader->Where(index));
  }
  return out;
}

}  // namespace nl
