#include "base/memory.h"

#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>
#include <string_view>

#include "base/parse_number.h"

namespace nl {
namespace {

// A kernel file (/proc, cgroupfs): its size reads as 0 or 4096 whatever it
// holds, so it is read to its end, at most `max` bytes.
std::optional<std::string> ReadKernelFile(const std::string& path, size_t max = 1 << 20) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::string s(max, '\0');
  in.read(s.data(), static_cast<std::streamsize>(max));
  s.resize(static_cast<size_t>(in.gcount()));
  return s;
}

// The number a one-line cgroup file holds; nothing for "max", a missing or
// unreadable file, or text that is not a number.
std::optional<uint64_t> ReadLimit(const std::string& path) {
  std::optional<std::string> text = ReadKernelFile(path, 4096);
  if (!text) return std::nullopt;
  std::string s = *text;
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  if (s.empty() || s == "max") return std::nullopt;
  Result<uint64_t> v = ParseUint(s, path, 0, UINT64_MAX);
  if (!v.ok()) return std::nullopt;
  return *v;
}

void Consider(MemoryLimit* m, std::optional<uint64_t> bytes, const std::string& source) {
  if (bytes && *bytes > 0 && (m->bytes == 0 || *bytes < m->bytes)) {
    m->bytes = *bytes;
    m->source = source;
  }
}

}  // namespace

MemoryLimit MemoryAvailableToProcess(const std::string& proc, const std::string& cgroup_root) {
  MemoryLimit m;
  if (std::optional<std::string> info = ReadKernelFile(proc + "/meminfo")) {
    std::istringstream in(*info);
    std::string key;
    uint64_t kb = 0;
    std::string unit;
    while (in >> key >> kb >> unit) {
      if (key == "MemTotal:") {
        Consider(&m, kb * 1024, "this machine's memory");
        break;
      }
    }
  }
  std::optional<std::string> groups = ReadKernelFile(proc + "/self/cgroup");
  if (!groups) return m;
  // Lines "ID:CONTROLLERS:PATH": v1's memory controller names "memory";
  // v2's single hierarchy has ID 0 and no controllers.
  std::istringstream in(*groups);
  std::string line;
  while (std::getline(in, line)) {
    const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    std::string path = line.substr(b + 1);
    // Never climb out of the root; a path must start at it (the walk up the
    // tree below ends at "").
    if (path.find("..") != std::string::npos || path.empty() || path[0] != '/') continue;
    if (path == "/") path.clear();
    bool v1_memory = false;
    for (std::string_view c : SplitText(controllers, ',')) v1_memory |= c == "memory";
    if (v1_memory) {
      const std::string file = cgroup_root + "/memory" + path + "/memory.limit_in_bytes";
      // v1 writes "no limit" as a huge number (PAGE_COUNTER_MAX pages).
      std::optional<uint64_t> v = ReadLimit(file);
      if (v && *v < (uint64_t{1} << 60)) {
        Consider(&m, v, "cgroup v1 memory.limit_in_bytes of " + (path.empty() ? "/" : path));
      }
    } else if (line.rfind("0::", 0) == 0) {
      // The cgroup and each ancestor: the tightest limit holds. (v2 alone is
      // mounted at the root; beside v1, at its "unified" directory.)
      for (const std::string& root : {cgroup_root, cgroup_root + "/unified"}) {
        for (std::string p = path;; p = p.substr(0, p.rfind('/'))) {
          Consider(&m, ReadLimit(root + p + "/memory.max"),
                   "cgroup v2 memory.max of " + (p.empty() ? "/" : p));
          if (p.empty()) break;
        }
      }
    }
  }
  return m;
}

std::string FormatBytes(uint64_t bytes) {
  static const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double v = static_cast<double>(bytes) / 1024;
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  if (v == static_cast<double>(static_cast<uint64_t>(v))) {
    std::snprintf(buf, sizeof buf, "%.0f %s", v, kUnits[u]);
  } else {
    std::snprintf(buf, sizeof buf, "%.1f %s", v, kUnits[u]);
  }
  return buf;
}

}  // namespace nl
