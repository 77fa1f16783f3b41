#include "base/memory.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "base/file_util.h"
#include "tests/support/test_util.h"

namespace nl {
namespace {

// A fake /proc and /sys/fs/cgroup: meminfo, the process's cgroup lines and
// the limit files named relative to the cgroup root.
struct FakeSystem {
  testing::ScratchDir dir;
  std::string proc() const { return dir / "proc"; }
  std::string cgroup() const { return dir / "cgroup"; }
  void Write(const std::string& rel, const std::string& text) const {
    const std::string path = dir / rel;
    std::filesystem::create_directories(std::filesystem::path(path).parent_path());
    testing::WriteText(path, text);
  }
  FakeSystem(uint64_t total_kb, const std::string& cgroup_lines) {
    Write("proc/meminfo",
          "MemTotal:       " + std::to_string(total_kb) + " kB\nMemFree:         1000 kB\n");
    Write("proc/self/cgroup", cgroup_lines);
  }
};

TEST(Memory, TheMachinesMemoryWithoutALimit) {
  FakeSystem f(24 * 1024 * 1024, "4:memory:/job\n0::/\n");
  f.Write("cgroup/memory/job/memory.limit_in_bytes", "9223372036854771712\n");  // v1's "none"
  MemoryLimit m = MemoryAvailableToProcess(f.proc(), f.cgroup());
  EXPECT_EQ(m.bytes, uint64_t{24} << 30);
  EXPECT_EQ(m.source, "this machine's memory");
}

TEST(Memory, ACgroupV1LimitBelowTheMachines) {
  FakeSystem f(24 * 1024 * 1024, "9:pids:/\n4:memory:/job/rank0\n");
  f.Write("cgroup/memory/job/rank0/memory.limit_in_bytes", "1073741824\n");
  MemoryLimit m = MemoryAvailableToProcess(f.proc(), f.cgroup());
  EXPECT_EQ(m.bytes, uint64_t{1} << 30);
  EXPECT_EQ(m.source, "cgroup v1 memory.limit_in_bytes of /job/rank0");
}

TEST(Memory, TheTightestCgroupV2LimitOfTheGroupAndItsAncestors) {
  FakeSystem f(24 * 1024 * 1024, "0::/a/b/c\n");
  f.Write("cgroup/a/memory.max", "2147483648\n");
  f.Write("cgroup/a/b/memory.max", "max\n");
  f.Write("cgroup/a/b/c/memory.max", "4294967296\n");
  MemoryLimit m = MemoryAvailableToProcess(f.proc(), f.cgroup());
  EXPECT_EQ(m.bytes, uint64_t{2} << 30);
  EXPECT_EQ(m.source, "cgroup v2 memory.max of /a");
  // Beside v1 (a hybrid machine), v2 lives under "unified".
  FakeSystem h(24 * 1024 * 1024, "4:memory:/\n0::/job\n");
  h.Write("cgroup/unified/job/memory.max", "536870912\n");
  EXPECT_EQ(MemoryAvailableToProcess(h.proc(), h.cgroup()).bytes, uint64_t{512} << 20);
}

TEST(Memory, DamagedOrMissingFilesAreNoLimit) {
  FakeSystem f(8 * 1024 * 1024, "garbage\n4:memory:/../../etc\n0::/x\n");
  f.Write("cgroup/x/memory.max", "lots\n");
  MemoryLimit m = MemoryAvailableToProcess(f.proc(), f.cgroup());
  EXPECT_EQ(m.bytes, uint64_t{8} << 30);
  testing::ScratchDir empty;
  EXPECT_EQ(MemoryAvailableToProcess(empty / "proc", empty / "cgroup").bytes, 0u);
}

// A cgroup path without a leading '/' (not what the kernel writes, but a
// file this reads) ends the walk up the tree instead of looping on it.
TEST(Memory, ACgroupPathWithoutASlashEnds) {
  FakeSystem f(8 * 1024 * 1024, "0::job\n");
  f.Write("cgroup/job/memory.max", "1073741824\n");
  MemoryLimit m = MemoryAvailableToProcess(f.proc(), f.cgroup());
  EXPECT_EQ(m.bytes, uint64_t{8} << 30);
}

TEST(Memory, ThisProcessHasSomeMemory) {
  MemoryLimit m = MemoryAvailableToProcess();
  EXPECT_GT(m.bytes, 0u);
  EXPECT_FALSE(m.source.empty());
}

TEST(Memory, FormatBytes) {
  EXPECT_EQ(FormatBytes(17), "17 B");
  EXPECT_EQ(FormatBytes(4096), "4 KiB");
  EXPECT_EQ(FormatBytes(uint64_t{3} << 29), "1.5 GiB");
  EXPECT_EQ(FormatBytes(uint64_t{512} << 20), "512 MiB");
}

}  // namespace
}  // namespace nl
