#include "formats/shard_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "base/file_util.h"

namespace nl {
namespace {

// What the system said, without context (the caller adds the file and offset).
Status ErrnoStatus(int err) {
  return err == ENOENT ? Status::NotFound(std::strerror(err)) : Status::IOError(std::strerror(err));
}

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

class LocalShardFile final : public ShardFile {
 public:
  LocalShardFile(std::string dir, Fd fd) : dir_(std::move(dir)), fd_(std::move(fd)) {}
  const std::string& dir() const override { return dir_; }
  int fd() const override { return fd_.get(); }

  Result<uint64_t> Size() const override {
    struct stat st {};
    if (::fstat(fd_.get(), &st) != 0) return ErrnoStatus(errno);
    return static_cast<uint64_t>(st.st_size);
  }

  Result<size_t> ReadSome(uint64_t offset, uint8_t* out, size_t n) const override {
    for (;;) {
      const ssize_t r = ::pread(fd_.get(), out, n, static_cast<off_t>(offset));
      if (r >= 0) return static_cast<size_t>(r);
      if (errno != EINTR) return ErrnoStatus(errno);
    }
  }

  // A second open file description of the same file (not the path: the file
  // read is the one the reader checked).
  Result<Fd> OpenDirect() const override {
    const std::string self = "/proc/self/fd/" + std::to_string(fd_.get());
    Fd direct(::open(self.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC));
    if (!direct.valid()) return ErrnoStatus(errno);
    return direct;
  }

 private:
  const std::string dir_;
  const Fd fd_;
};

class LocalShardFiles final : public ShardFiles {
 public:
  Result<std::unique_ptr<ShardFile>> Open(const std::string& root,
                                          const ShardInfo& info) const override {
    return OpenLocalShardFile(info.path, root + "/" + info.path, root);
  }
};

}  // namespace

const ShardFiles& ShardFiles::Local() {
  static const LocalShardFiles local;
  return local;
}

Result<std::unique_ptr<ShardFile>> OpenLocalShardFile(const std::string& name,
                                                      const std::string& dir,
                                                      const std::string& within) {
  const std::string data = dir + "/data.mdb";
  const std::string what = "cannot open shard " + name + " (" + data + ")";
  struct stat st {};
  if (::stat(data.c_str(), &st) != 0) return Status::FromErrno(what, errno);
  if (!S_ISREG(st.st_mode)) return Status::Corruption(what + ": data.mdb is not a regular file");
  if (!within.empty()) NL_RETURN_IF_ERROR(CheckWithinShardSet(within, data, what));
  // O_NONBLOCK: a FIFO swapped in since the stat would block the open.
  Fd fd(::open(data.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (!fd.valid()) return Status::FromErrno(what, errno);
  return std::unique_ptr<ShardFile>(new LocalShardFile(dir, std::move(fd)));
}

}  // namespace nl
