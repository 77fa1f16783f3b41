// Small file helpers shared by formats/ and the tools, errors as Status.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"

namespace nl {

// The largest file the readers below take unless told otherwise: an image at
// Pillow's pixel limit stored uncompressed is about 540 MB.
inline constexpr uint64_t kMaxReadBytes = uint64_t{2} << 30;

// Read a whole regular file. Anything else (a FIFO, a device, a directory,
// a socket) is refused without blocking on it, and so is a file larger than
// max_bytes (an error naming the file and both sizes), before any buffer of
// that size is allocated.
Result<std::string> ReadFileToString(const std::string& path, uint64_t max_bytes = kMaxReadBytes);
Result<std::vector<uint8_t>> ReadFileBytes(const std::string& path,
                                           uint64_t max_bytes = kMaxReadBytes);
// Appends the file's bytes to *out (reusing its capacity).
Status ReadFileInto(const std::string& path, std::vector<uint8_t>* out,
                    uint64_t max_bytes = kMaxReadBytes);
// Creates (or truncates) path with mode 0600: what the tools write is their
// user's only (share it with chmod).
Status WriteFile(const std::string& path, const void* data, size_t n);
// Creates path, if missing, empty with mode 0600, so that a stream opened on
// it afterwards (std::ofstream, fopen: 0666 less the umask) writes a file
// that is its user's only. An existing file is left as it is.
Status CreatePrivateFile(const std::string& path);
// The one atomic writer of the project (checkpoints, metrics, charts,
// manifests, previews, exports): writes TemporaryPath(path) (mode 0600, or
// the mode of the file it replaces), fsyncs it, renames it over path, fsyncs
// the directory. A path that is something other than a regular file or a
// link (a device, FIFO, socket or directory) is refused, not replaced. On
// failure the temporary is removed and the error names path and errno.
Status WriteFileAtomically(const std::string& path, const std::string& contents);
// The one temporary naming: "<path>.tmp-<pid>" (files and directories alike).
// The pid only makes the name unique; it says nothing of liveness.
std::string TemporaryPath(const std::string& path);
// For a name of that form, the name it stands in for ("a.pt.tmp-12" ->
// "a.pt"); "" for any other name.
std::string TemporaryBaseName(const std::string& name);
// Removes, in dir, every temporary (by the naming above) for which
// is_stale(its full path, the base name it stands in for) is true, files and
// directories alike; returns the full paths removed. The caller decides what
// stale means (a lock no one holds; outputs it holds locked itself).
std::vector<std::string> RemoveStaleTemporaries(
    const std::string& dir,
    const std::function<bool(const std::string& path, const std::string& base)>& is_stale);
Status FsyncDir(const std::string& dir);
// Creates dir (and parents) with mode 0700; ok if it already exists.
Status MakeDirs(const std::string& dir);
// Recursive delete; ok if missing.
Status RemoveAll(const std::string& path);
Result<uint64_t> FileSize(const std::string& path);
bool PathExists(const std::string& path);

// Canonical absolute form of `path` with symlinks resolved, also for a path
// that does not exist yet (its longest existing prefix is resolved).
Result<std::string> CanonicalPath(const std::string& path);
// True when `inner` is `outer` or lies below it (both canonical, compared by
// whole components).
bool PathIsWithin(const std::string& inner, const std::string& outer);

// An exclusive flock(2) on a lock file, held until destruction. Locks belong
// to an open file description, so two holders in one process (threads) also
// exclude each other, and a lock dies with its process wherever that process
// runs (no pid is involved). The holder unlinks the file when it lets go;
// a taker re-checks after locking that the file it locked is still the one at
// the path, so unlinking never lets two holders in at once. Move-only.
class FileLock {
 public:
  FileLock() = default;
  // Creates `path` if needed and locks it. When another holder has it: calls
  // on_wait once (may be empty), then waits until it is free; fails with
  // Aborted when *cancel (may be null) becomes true meanwhile.
  static Result<FileLock> Acquire(const std::string& path, const std::function<void()>& on_wait,
                                  const std::atomic<bool>* cancel);
  // Locks `path` only if no one holds it now: nullopt when someone does.
  static Result<std::optional<FileLock>> TryAcquire(const std::string& path);
  FileLock(FileLock&& o) noexcept : path_(std::move(o.path_)), fd_(o.fd_) { o.fd_ = -1; }
  FileLock& operator=(FileLock&& o) noexcept;
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  ~FileLock() { Release(); }
  // Unlinks the file and drops the lock (no-op when not held).
  void Release();
  const std::string& path() const { return path_; }

 private:
  // One attempt: on success fd_ holds the lock; else *busy says whether
  // another holder has it (false: the file was replaced, try again).
  Status TryOnce(bool* busy);
  std::string path_;
  int fd_ = -1;
};

// A file's bytes: mapped read-only (no copy) when read from a file, or owned
// (e.g. decompressed from an archive). Move-only.
class FileBytes {
 public:
  FileBytes() = default;
  // mmap(PROT_READ, MAP_PRIVATE | MAP_POPULATE). An empty file gives an empty buffer.
  static Result<FileBytes> Map(const std::string& path);
  static FileBytes Own(std::vector<uint8_t> bytes);
  FileBytes(FileBytes&& o) noexcept { *this = std::move(o); }
  FileBytes& operator=(FileBytes&& o) noexcept;
  FileBytes(const FileBytes&) = delete;
  FileBytes& operator=(const FileBytes&) = delete;
  ~FileBytes();
  const uint8_t* data() const { return map_ ? map_ : owned_.data(); }
  size_t size() const { return map_ ? map_size_ : owned_.size(); }
  std::span<const uint8_t> span() const { return {data(), size()}; }

 private:
  const uint8_t* map_ = nullptr;
  size_t map_size_ = 0;
  std::vector<uint8_t> owned_;
};

// Owns a directory that is removed on destruction unless Release()d.
class TempDir {
 public:
  TempDir() = default;
  explicit TempDir(std::string path) : path_(std::move(path)) {}
  TempDir(TempDir&& o) noexcept : path_(std::move(o.path_)) { o.path_.clear(); }
  TempDir& operator=(TempDir&& o) noexcept;
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir();
  const std::string& path() const { return path_; }
  void Release() { path_.clear(); }

 private:
  std::string path_;
};

}  // namespace nl
