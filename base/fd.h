// Owned operating-system handles: a file descriptor, a directory stream and a
// stdio stream, each closed when its owner goes away. Move-only.
//
//   Fd fd(::open(path, O_RDONLY | O_CLOEXEC));
//   if (!fd.valid()) return Status::IoError(...);
//   ...                       // every return path closes it
//   int raw = fd.Release();   // hand it on; the Fd no longer closes it
#pragma once

#include <dirent.h>

#include <cstdio>
#include <memory>
#include <utility>

namespace nl {

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { Reset(); }
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      Reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  // Closes the descriptor held (if any); the Fd is then empty.
  void Reset();
  // Gives up ownership without closing: the caller closes what it returns.
  int Release() { return std::exchange(fd_, -1); }

 private:
  int fd_ = -1;
};

// A directory stream (opendir/fdopendir), closedir'd on destruction.
struct DirCloser {
  void operator()(DIR* d) const { ::closedir(d); }
};
using DirHandle = std::unique_ptr<DIR, DirCloser>;

// A stdio stream (fopen/fdopen), fclose'd on destruction. Where the write's
// success matters, call std::fclose(handle.release()) and check its result.
struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using FileHandle = std::unique_ptr<std::FILE, FileCloser>;

}  // namespace nl
