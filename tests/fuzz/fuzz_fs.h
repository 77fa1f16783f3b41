// Scratch directories for the fuzz targets that read the file system.
#pragma once

#include <ftw.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <string>

namespace nl_fuzz {

inline int RemoveOne(const char* path, const struct stat*, int, struct FTW*) {
  std::remove(path);
  return 0;
}

// Removes `dir` and everything in it (links are removed, not followed).
inline void RemoveTree(const std::string& dir) {
  nftw(dir.c_str(), RemoveOne, 16, FTW_DEPTH | FTW_PHYS);
}

// A fresh empty directory for this input, under one made per process.
inline std::string FreshDir() {
  static std::string base = [] {
    char tmpl[] = "/tmp/nl-fuzz-XXXXXX";
    const char* d = mkdtemp(tmpl);
    if (!d) __builtin_trap();
    return std::string(d);
  }();
  const std::string dir = base + "/in";
  RemoveTree(dir);
  if (mkdir(dir.c_str(), 0700) != 0) __builtin_trap();
  return dir;
}

inline void WriteFile(const std::string& path, const void* data, size_t n) {
  if (FILE* f = std::fopen(path.c_str(), "wb")) {
    if (n) std::fwrite(data, 1, n, f);
    std::fclose(f);
  }
}

}  // namespace nl_fuzz
