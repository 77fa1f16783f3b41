#include "formats/lmdb_env.h"

#include <cerrno>

namespace nl {

Status LmdbStatus(int rc, const std::string& what) {
  if (rc == MDB_SUCCESS) return Status::Ok();
  std::string msg = what + ": " + mdb_strerror(rc);
  switch (rc) {
    case MDB_NOTFOUND:
      return Status::NotFound(msg);
    case MDB_CORRUPTED:
    case MDB_PAGE_NOTFOUND:
    case MDB_INVALID:
    case MDB_VERSION_MISMATCH:
    case MDB_BAD_TXN:
      return Status::Corruption(msg);
    case MDB_MAP_FULL:
      return Status::ResourceExhausted(msg);
    case ENOENT:
      return Status::NotFound(msg);
    default:
      return Status::IOError(msg);
  }
}

void EncodeKey(uint64_t index, unsigned char out[8]) {
  for (int i = 7; i >= 0; --i) {
    out[i] = static_cast<unsigned char>(index & 0xFF);
    index >>= 8;
  }
}

uint64_t DecodeKey(const unsigned char in[8]) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | in[i];
  return v;
}

}  // namespace nl
