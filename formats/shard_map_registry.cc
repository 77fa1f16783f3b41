#include "formats/shard_map_registry.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "base/mutex.h"

namespace nl::shard_internal {
namespace {

// ---- naming the shard when a mapped page vanishes (SIGBUS) ----
//
// A shard truncated while it is mapped makes the next access to a page past
// the new end raise SIGBUS. The handler cannot recover, but it names the
// shard: it looks the faulting address up among the open readers' maps,
// writes one line with write(2) (async-signal-safe), and re-raises with the
// previous disposition.
struct MappedShard {
  std::atomic<uintptr_t> begin{0};  // 0: free slot
  uintptr_t end = 0;
  char name[480] = {};
};
constexpr size_t kMaxMappedShards = 4096;
MappedShard g_mapped[kMaxMappedShards];
// Serialises registration. The slots are not NL_GUARDED_BY it: the SIGBUS
// handler reads them without a lock (their `begin` is atomic, published last).
Mutex g_mapped_mu;
struct sigaction g_previous_sigbus;

void WriteAll(const char* s, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(STDERR_FILENO, s, n);
    if (w <= 0) return;
    s += w;
    n -= static_cast<size_t>(w);
  }
}

void OnSigbus(int sig, siginfo_t* si, void*) {
  const uintptr_t addr = reinterpret_cast<uintptr_t>(si->si_addr);
  for (auto& m : g_mapped) {
    const uintptr_t b = m.begin.load(std::memory_order_acquire);
    if (b != 0 && addr >= b && addr < m.end) {
      static const char kHead[] = "numa-loader: SIGBUS reading shard ";
      static const char kTail[] =
          ": its data.mdb is shorter than its map (truncated or replaced while open)\n";
      WriteAll(kHead, sizeof kHead - 1);
      WriteAll(m.name, ::strnlen(m.name, sizeof m.name));
      WriteAll(kTail, sizeof kTail - 1);
      break;
    }
  }
  // Back to the previous disposition. Returning re-runs the faulting access,
  // which then ends the process (or reaches the previous handler) as it
  // would have without this one; a SIGBUS sent by kill is raised again.
  ::sigaction(SIGBUS, &g_previous_sigbus, nullptr);
  if (si->si_code <= 0) ::raise(sig);
}

void InstallSigbusHandler() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa {};
    sa.sa_sigaction = OnSigbus;
    sa.sa_flags = SA_SIGINFO | SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGBUS, &sa, &g_previous_sigbus);
  });
}

}  // namespace

int RegisterMap(const std::string& data_path, const std::string& name) {
  struct stat st {};
  if (::stat(data_path.c_str(), &st) != 0) return -1;
  InstallSigbusHandler();
  MutexLock lock(&g_mapped_mu);
  auto taken = [](uintptr_t b) {
    for (const auto& m : g_mapped)
      if (m.begin.load(std::memory_order_relaxed) == b) return true;
    return false;
  };
  // Prefer a range whose device matches too; some file systems (overlays)
  // show another device in /proc/self/maps than stat does.
  uintptr_t begin = 0, end = 0, inode_begin = 0, inode_end = 0;
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    unsigned long long b = 0, e = 0, off = 0, inode = 0;
    unsigned dev_major = 0, dev_minor = 0;
    char perms[8];
    if (std::sscanf(line.c_str(), "%llx-%llx %7s %llx %x:%x %llu", &b, &e, perms, &off, &dev_major,
                    &dev_minor, &inode) != 7) {
      continue;
    }
    // LMDB maps the file from its start, at least its whole length.
    if (inode != st.st_ino || off != 0 || e - b < static_cast<unsigned long long>(st.st_size) ||
        taken(b)) {
      continue;
    }
    if (dev_major == major(st.st_dev) && dev_minor == minor(st.st_dev)) {
      begin = static_cast<uintptr_t>(b);
      end = static_cast<uintptr_t>(e);
      break;
    }
    if (inode_begin == 0) {
      inode_begin = static_cast<uintptr_t>(b);
      inode_end = static_cast<uintptr_t>(e);
    }
  }
  if (begin == 0) {
    begin = inode_begin;
    end = inode_end;
  }
  if (begin == 0) return -1;
  for (size_t i = 0; i < kMaxMappedShards; ++i) {
    MappedShard& m = g_mapped[i];
    if (m.begin.load(std::memory_order_relaxed) != 0) continue;
    m.end = end;
    const size_t n = std::min(name.size(), sizeof m.name - 1);
    std::memcpy(m.name, name.data(), n);
    m.name[n] = '\0';
    m.begin.store(begin, std::memory_order_release);
    return static_cast<int>(i);
  }
  return -1;
}

const uint8_t* MapBegin(int slot) {
  return reinterpret_cast<const uint8_t*>(g_mapped[slot].begin.load(std::memory_order_acquire));
}

void UnregisterMap(int slot) {
  if (slot < 0) return;
  MutexLock lock(&g_mapped_mu);
  g_mapped[slot].begin.store(0, std::memory_order_release);
}

}  // namespace nl::shard_internal
