#include "formats/lmdb_env.h"

#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

#include <cerrno>
#include <filesystem>

namespace nl {

Status LmdbStatus(int rc, const std::string& what) { return LmdbStatus(rc).WithContext(what); }

Status LmdbStatus(int rc) {
  if (rc == MDB_SUCCESS) return Status::Ok();
  std::string msg = mdb_strerror(rc);
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

Status LmdbWriteStatus(int rc, const std::string& what, const std::string& file) {
  if (rc != EIO && rc != ENOSPC && rc != EFBIG) return LmdbStatus(rc, what);
  struct stat st {};
  const bool have_size = ::stat(file.c_str(), &st) == 0;
  struct rlimit fsize {};
  if (::getrlimit(RLIMIT_FSIZE, &fsize) == 0 && fsize.rlim_cur != RLIM_INFINITY &&
      (rc == EFBIG || (have_size && static_cast<uint64_t>(st.st_size) + (1u << 20) >=
                                        static_cast<uint64_t>(fsize.rlim_cur)))) {
    return Status::IOError(what + ": File too large: " + file +
                           " reached the file-size limit (ulimit -f) of " +
                           std::to_string(static_cast<uint64_t>(fsize.rlim_cur)) + " bytes");
  }
  std::string dir = std::filesystem::path(file).parent_path().string();
  struct statvfs vfs {};
  if (rc == ENOSPC || (::statvfs(dir.empty() ? "." : dir.c_str(), &vfs) == 0 &&
                       static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize < (uint64_t{1} << 20))) {
    std::string free_note;
    if (::statvfs(dir.empty() ? "." : dir.c_str(), &vfs) == 0) {
      free_note = " (" + std::to_string(static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize) +
                  " bytes free)";
    }
    return Status::IOError(what + ": no space left on device writing " + file + free_note);
  }
  return LmdbStatus(rc, what);
}

std::string AddressSpaceLimitNote() {
  struct rlimit as {};
  if (::getrlimit(RLIMIT_AS, &as) != 0 || as.rlim_cur == RLIM_INFINITY) return "";
  return "the address-space limit (ulimit -v) is " +
         std::to_string(static_cast<uint64_t>(as.rlim_cur) >> 20) + " MiB";
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
