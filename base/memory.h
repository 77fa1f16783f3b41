// How much memory this process may use: the machine's, or less where a
// memory cgroup (v1 or v2) limits it. The loader picks its read order and
// its read-ahead budget from it.
#pragma once

#include <cstdint>
#include <string>

namespace nl {

struct MemoryLimit {
  uint64_t bytes = 0;  // the smallest limit found; 0 when none could be read
  std::string source;  // "this machine's memory", "cgroup v2 memory.max of /job", ...
};

// The smaller of the machine's memory (/proc/meminfo MemTotal) and every
// memory limit of this process's cgroups: cgroup v1's memory.limit_in_bytes
// of its memory cgroup, cgroup v2's memory.max of its cgroup and each
// ancestor. Files are read under `proc` and `cgroup_root` (tests point them
// at trees of their own).
MemoryLimit MemoryAvailableToProcess(const std::string& proc = "/proc",
                                     const std::string& cgroup_root = "/sys/fs/cgroup");

// "1.5 GiB", "512 MiB", "4.0 KiB", "17 B".
std::string FormatBytes(uint64_t bytes);

}  // namespace nl
