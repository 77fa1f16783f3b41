// RAII owners for LMDB handles and the one place LMDB codes become Status.
#pragma once

#include <lmdb.h>

#include <memory>
#include <string>

#include "base/status.h"

namespace nl {

// "<what>: <mdb_strerror(rc)>", with ENOSPC/EIO as IOError, MDB_NOTFOUND as
// NotFound and MDB_CORRUPTED / MDB_PAGE_NOTFOUND / MDB_INVALID as Corruption.
Status LmdbStatus(int rc, const std::string& what);
// The same without context: mdb_strerror(rc) alone, for callers that add
// theirs with WithContext.
Status LmdbStatus(int rc);
// As LmdbStatus, for a failed write to `file` (an environment's data.mdb).
// LMDB reports a short write as EIO ("Input/output error"), which is what a
// full disk or the file-size limit usually gives; this names the real cause:
// "no space left on device" (with the file and the free bytes), or the
// file-size limit (ulimit -f) that was reached.
Status LmdbWriteStatus(int rc, const std::string& what, const std::string& file);
// The address-space limit (ulimit -v) in words when one is set, else "".
std::string AddressSpaceLimitNote();

struct LmdbEnvDeleter {
  void operator()(MDB_env* e) const { mdb_env_close(e); }
};
using LmdbEnv = std::unique_ptr<MDB_env, LmdbEnvDeleter>;

// Aborts the transaction unless Commit() succeeded.
class LmdbTxn {
 public:
  LmdbTxn() = default;
  explicit LmdbTxn(MDB_txn* t) : txn_(t) {}
  LmdbTxn(LmdbTxn&& o) noexcept : txn_(o.txn_) { o.txn_ = nullptr; }
  LmdbTxn& operator=(LmdbTxn&& o) noexcept {
    if (this != &o) {
      Abort();
      txn_ = o.txn_;
      o.txn_ = nullptr;
    }
    return *this;
  }
  ~LmdbTxn() { Abort(); }
  MDB_txn* get() const { return txn_; }
  int Commit() {
    int rc = mdb_txn_commit(txn_);
    txn_ = nullptr;  // freed whether or not the commit succeeded
    return rc;
  }
  void Abort() {
    if (txn_) mdb_txn_abort(txn_);
    txn_ = nullptr;
  }

 private:
  MDB_txn* txn_ = nullptr;
};

// Keys are the global sample index as 8-byte big-endian, so key order is index order.
void EncodeKey(uint64_t index, unsigned char out[8]);
uint64_t DecodeKey(const unsigned char in[8]);

}  // namespace nl
