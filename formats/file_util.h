// Small file helpers shared by formats/ and the tools, errors as Status.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "formats/status.h"

namespace nl {

Result<std::string> ReadFileToString(const std::string& path);
Result<std::vector<uint8_t>> ReadFileBytes(const std::string& path);
// Appends the file's bytes to *out (reusing its capacity).
Status ReadFileInto(const std::string& path, std::vector<uint8_t>* out);
Status WriteFile(const std::string& path, const void* data, size_t n);
// Writes to "<path>.tmp-<pid>", fsyncs, renames over path, fsyncs the directory.
Status WriteFileAtomically(const std::string& path, const std::string& contents);
Status FsyncDir(const std::string& dir);
// Creates dir (and parents); ok if it already exists.
Status MakeDirs(const std::string& dir);
// Recursive delete; ok if missing.
Status RemoveAll(const std::string& path);
Result<uint64_t> FileSize(const std::string& path);
bool PathExists(const std::string& path);

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
