#include "base/file_util.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <filesystem>
#include <thread>
#include <utility>

#include "base/fd.h"

namespace nl {

namespace fs = std::filesystem;

namespace {

const char* FileKind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// Opens a regular file for reading; anything else (a FIFO, a device, a
// directory, a socket) is refused without blocking on it (O_NONBLOCK: a
// FIFO's open would wait for a writer forever). *st: its stat.
Result<Fd> OpenRegularForReading(const std::string& path, struct stat* st) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (!fd.valid()) return Status::FromErrno("cannot open " + path, errno);
  if (::fstat(fd.get(), st) != 0) return Status::FromErrno("cannot stat " + path, errno);
  if (!S_ISREG(st->st_mode)) {
    return Status::IOError("cannot read " + path + ": it is " + FileKind(st->st_mode) +
                           ", not a regular file");
  }
  return fd;
}

}  // namespace

Status ReadFileInto(const std::string& path, std::vector<uint8_t>* out, uint64_t max_bytes) {
  struct stat st {};
  NL_ASSIGN_OR_RETURN(const Fd fd, OpenRegularForReading(path, &st));
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    return Status::IOError("cannot read " + path + ": it is " + std::to_string(st.st_size) +
                           " bytes, more than the " + std::to_string(max_bytes) +
                           " this reader takes");
  }
  const size_t start = out->size();
  const size_t size = static_cast<size_t>(st.st_size);
  out->resize(start + size);
  size_t got = 0;
  // Read what the size says (in one call for a small file: that matters when
  // packing many); a file that shrinks meanwhile gives what it has.
  while (got < size) {
    ssize_t n = ::read(fd.get(), out->data() + start + got, size - got);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int e = errno;
      out->resize(start);
      return Status::FromErrno("cannot read " + path, e);
    }
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  out->resize(start + got);
  return Status::Ok();
}

Result<std::vector<uint8_t>> ReadFileBytes(const std::string& path, uint64_t max_bytes) {
  std::vector<uint8_t> out;
  NL_RETURN_IF_ERROR(ReadFileInto(path, &out, max_bytes));
  return out;
}

Result<std::string> ReadFileToString(const std::string& path, uint64_t max_bytes) {
  NL_ASSIGN_OR_RETURN(std::vector<uint8_t> b, ReadFileBytes(path, max_bytes));
  return std::string(b.begin(), b.end());
}

Status WriteFile(const std::string& path, const void* data, size_t n) {
  Fd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
  if (!fd.valid()) return Status::FromErrno("cannot create " + path, errno);
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd.get(), p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno("cannot write " + path, errno);
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  // The close's result matters after a write (NFS reports errors there).
  if (::close(fd.Release()) != 0) return Status::FromErrno("cannot close " + path, errno);
  return Status::Ok();
}

Status CreatePrivateFile(const std::string& path) {
  const Fd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | O_NONBLOCK, 0600));
  if (!fd.valid()) return Status::FromErrno("cannot create " + path, errno);
  return Status::Ok();
}

Status FsyncDir(const std::string& dir) {
  const Fd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid()) return Status::FromErrno("cannot open directory " + dir, errno);
  if (::fsync(fd.get()) != 0) return Status::FromErrno("cannot fsync " + dir, errno);
  return Status::Ok();
}

std::string TemporaryPath(const std::string& path) {
  return path + ".tmp-" + std::to_string(::getpid());
}

std::string TemporaryBaseName(const std::string& name) {
  const size_t at = name.rfind(".tmp-");
  if (at == std::string::npos || at == 0 || at + 5 >= name.size()) return "";
  if (name.find_first_not_of("0123456789", at + 5) != std::string::npos) return "";
  return name.substr(0, at);
}

std::vector<std::string> RemoveStaleTemporaries(
    const std::string& dir,
    const std::function<bool(const std::string& path, const std::string& base)>& is_stale) {
  std::vector<std::string> removed;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    const std::string base = TemporaryBaseName(name);
    if (base.empty()) continue;
    const std::string full = (fs::path(dir) / name).string();
    if (!is_stale(full, base)) continue;
    if (RemoveAll(full).ok()) removed.push_back(full);
  }
  return removed;
}

Status WriteFileAtomically(const std::string& path, const std::string& contents) {
  struct stat target {};
  if (::lstat(path.c_str(), &target) == 0 && !S_ISREG(target.st_mode) && !S_ISLNK(target.st_mode)) {
    return Status::InvalidArgument("will not replace " + path +
                                   ": it is not a regular file (a device, FIFO, socket or directory)");
  }
  const std::string tmp = TemporaryPath(path);
  Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
  if (!fd.valid()) return Status::FromErrno("cannot create " + tmp, errno);
  // A file replaced keeps its mode (one its owner opened to others stays
  // so); a new one is its user's only.
  struct stat old {};
  if (::stat(path.c_str(), &old) == 0 && S_ISREG(old.st_mode)) ::fchmod(fd.get(), old.st_mode & 07777);
  const char* p = contents.data();
  size_t n = contents.size();
  while (n > 0) {
    ssize_t w = ::write(fd.get(), p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) {
      const int e = errno;
      fd.Reset();
      ::unlink(tmp.c_str());
      return Status::FromErrno("cannot write " + path + " (as " + tmp + ")", e);
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  const int sync_rc = ::fsync(fd.get());
  int flush_err = errno;
  const int close_rc = ::close(fd.Release());  // closed even when fsync failed
  if (sync_rc == 0) flush_err = errno;
  if (sync_rc != 0 || close_rc != 0) {
    ::unlink(tmp.c_str());
    return Status::FromErrno("cannot flush " + path + " (as " + tmp + ")", flush_err);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int e = errno;
    ::unlink(tmp.c_str());
    return Status::FromErrno("cannot rename " + tmp + " to " + path, e);
  }
  const std::string dir = fs::path(path).parent_path().string();
  return FsyncDir(dir.empty() ? "." : dir);
}

Status MakeDirs(const std::string& dir) {
  if (dir.empty()) return Status::IOError("cannot create directory: the path is empty");
  // The missing components, each made 0700 (std::filesystem would make them
  // 0777 less the umask); existing ones are left as they are and never
  // mkdir'ed (on autofs a mkdir of a mount point not yet mounted fails).
  struct stat st {};
  if (::stat(dir.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) return Status::Ok();
    return Status::FromErrno("cannot create directory " + dir, ENOTDIR);
  }
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = dir.find('/', pos + 1);
    const std::string prefix = dir.substr(0, pos);
    if (prefix.empty() || prefix.back() == '/') continue;
    if (::stat(prefix.c_str(), &st) == 0) {
      if (S_ISDIR(st.st_mode)) continue;
      return Status::FromErrno("cannot create directory " + dir + " (at " + prefix + ")", ENOTDIR);
    }
    if (::mkdir(prefix.c_str(), 0700) == 0) continue;
    const int e = errno;
    if (e == EEXIST && ::stat(prefix.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) continue;  // a race
    return Status::FromErrno("cannot create directory " + dir + " (at " + prefix + ")", e);
  }
  return Status::Ok();
}

Status RemoveAll(const std::string& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
  if (ec) return Status::IOError("cannot remove " + path + ": " + ec.message());
  return Status::Ok();
}

Result<uint64_t> FileSize(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return Status::FromErrno("cannot stat " + path, errno);
  return static_cast<uint64_t>(st.st_size);
}

bool PathExists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

Result<std::string> CanonicalPath(const std::string& path) {
  std::error_code ec;
  fs::path p = fs::weakly_canonical(fs::absolute(path, ec), ec);
  if (ec) return Status::IOError("cannot resolve " + path + ": " + ec.message());
  return p.lexically_normal().string();
}

bool PathIsWithin(const std::string& inner, const std::string& outer) {
  std::string o = outer;
  while (o.size() > 1 && o.back() == '/') o.pop_back();
  if (inner.compare(0, o.size(), o) != 0) return false;
  return inner.size() == o.size() || o == "/" || inner[o.size()] == '/';
}

Status FileLock::TryOnce(bool* busy) {
  *busy = false;
  Fd fd(::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  if (!fd.valid()) return Status::FromErrno("cannot open lock file " + path_, errno);
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    const int e = errno;
    if (e == EWOULDBLOCK || e == EINTR) {
      *busy = true;
      return Status::Ok();
    }
    return Status::FromErrno("cannot lock " + path_, e);
  }
  // The previous holder may have unlinked the file between our open and
  // flock: then we hold a lock no one else will see. Try again.
  struct stat held {};
  struct stat now {};
  if (::fstat(fd.get(), &held) != 0 || ::stat(path_.c_str(), &now) != 0 ||
      held.st_dev != now.st_dev || held.st_ino != now.st_ino) {
    return Status::Ok();  // neither busy nor held: try again
  }
  fd_ = fd.Release();
  return Status::Ok();
}

Result<FileLock> FileLock::Acquire(const std::string& path, const std::function<void()>& on_wait,
                                   const std::atomic<bool>* cancel) {
  FileLock l;
  l.path_ = path;
  bool told = false;
  while (true) {
    bool busy = false;
    NL_RETURN_IF_ERROR(l.TryOnce(&busy));
    if (l.fd_ >= 0) return l;
    if (!busy) continue;  // the file was replaced under us
    if (!told && on_wait) on_wait();
    told = true;
    if (cancel && cancel->load(std::memory_order_relaxed)) {
      return Status::Aborted("interrupted while waiting for the lock " + path);
    }
    // Polled rather than a blocking flock so that cancellation is seen.
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

Result<std::optional<FileLock>> FileLock::TryAcquire(const std::string& path) {
  FileLock l;
  l.path_ = path;
  while (true) {
    bool busy = false;
    NL_RETURN_IF_ERROR(l.TryOnce(&busy));
    if (l.fd_ >= 0) return std::optional<FileLock>(std::move(l));
    if (busy) return std::optional<FileLock>();
  }
}

FileLock& FileLock::operator=(FileLock&& o) noexcept {
  if (this != &o) {
    Release();
    path_ = std::move(o.path_);
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

void FileLock::Release() {
  const Fd held(std::exchange(fd_, -1));  // closed (unlocked) on return
  if (!held.valid()) return;
  ::unlink(path_.c_str());  // while still locked: see TryOnce
}

Result<FileBytes> FileBytes::Map(const std::string& path) {
  struct stat st {};
  NL_ASSIGN_OR_RETURN(const Fd fd, OpenRegularForReading(path, &st));
  FileBytes b;
  if (st.st_size > 0) {
    void* p = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ,
                     MAP_PRIVATE | MAP_POPULATE, fd.get(), 0);
    if (p == MAP_FAILED) return Status::FromErrno("cannot map " + path, errno);
    b.map_ = static_cast<const uint8_t*>(p);
    b.map_size_ = static_cast<size_t>(st.st_size);
  }
  return b;
}

FileBytes FileBytes::Own(std::vector<uint8_t> bytes) {
  FileBytes b;
  b.owned_ = std::move(bytes);
  return b;
}

FileBytes& FileBytes::operator=(FileBytes&& o) noexcept {
  if (this != &o) {
    if (map_) ::munmap(const_cast<uint8_t*>(map_), map_size_);
    map_ = o.map_;
    map_size_ = o.map_size_;
    owned_ = std::move(o.owned_);
    o.map_ = nullptr;
    o.map_size_ = 0;
  }
  return *this;
}

FileBytes::~FileBytes() {
  if (map_) ::munmap(const_cast<uint8_t*>(map_), map_size_);
}

TempDir& TempDir::operator=(TempDir&& o) noexcept {
  if (this != &o) {
    if (!path_.empty()) (void)RemoveAll(path_);
    path_ = std::move(o.path_);
    o.path_.clear();
  }
  return *this;
}

TempDir::~TempDir() {
  if (!path_.empty()) (void)RemoveAll(path_);
}

}  // namespace nl
