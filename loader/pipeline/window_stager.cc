#include "loader/pipeline/window_stager.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <string>

#include "base/thread.h"
#include "base/worker_pool.h"

namespace nl {
namespace {
constexpr uint64_t kAlign = 4096;      // O_DIRECT's offsets, sizes and memory
// Records this close share one read: the gap's bytes are read into memory
// too, so only a leaf page or two between a block's records.
constexpr uint64_t kMergeGap = 8 << 10;
// Reads in flight while a window is read (the stager's thread and helpers).
constexpr size_t kReadThreads = 4;
struct Where {
  uint64_t index;
  int fd;  // the shard's: records of one shard share it
  const ShardFile* file;
  uint64_t offset, size;
};
}  // namespace

WindowStager::WindowStager(const SplitReader& reader, bool direct, uint64_t window_bytes,
                           uint64_t first_window, std::function<Window(uint64_t)> window_of)
    : want_direct_(direct),
      window_bytes_(window_bytes),
      window_of_(std::move(window_of)),
      txn_(reader.BeginRead()),
      first_(first_window) {
  Result<Thread> t = Thread::Start("loader reader", [this] {
    Run();
    return Status::Ok();
  });
  if (t.ok()) {
    thread_ = std::move(*t);
  } else {
    Stop();  // no thread to be had: the workers read every record themselves (Find returns at once)
  }
}

void WindowStager::Stop() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.NotifyAll();
}

WindowStager::~WindowStager() {
  Stop();
  (void)thread_.Join();  // (Run keeps no error: a failed window leaves its records to the workers)
  for (Records& r : records_) std::free(r.memory);
}

uint64_t WindowStager::staged_bytes() const {
  MutexLock lock(&mu_);
  return staged_;
}

bool WindowStager::direct() const {
  MutexLock lock(&mu_);
  return used_direct_;
}

int WindowStager::DirectFor(const ShardFile* file) {
  if (!want_direct_) return -1;
  MutexLock lock(&fd_mu_);
  for (auto& [f, twin] : direct_fds_) {
    if (f == file) return twin.fd.valid() && !twin.failed ? twin.fd.get() : -1;
  }
  // The shard file's O_DIRECT twin (ShardFile::OpenDirect); none where
  // refused. Closed only with the stager: a helper may be reading through it.
  Result<Fd> direct = file->OpenDirect();
  Twin twin{direct.ok() ? std::move(*direct) : Fd(), false};
  const int use = twin.fd.valid() ? twin.fd.get() : -1;
  direct_fds_.emplace_back(file, std::move(twin));
  return use;
}

uint64_t WindowStager::ReadRun(const ShardFile& file, uint8_t* out, uint64_t offset,
                               uint64_t size) {
  int direct = DirectFor(&file);
  uint64_t got = 0;
  while (got < size) {
    if (direct < 0) {
      Result<size_t> n = file.ReadSome(offset + got, out + got, size - got);
      if (!n.ok() || *n == 0) break;  // an error or the file's end: what was not read is not staged
      got += *n;
      continue;
    }
    const ssize_t n = ::pread(direct, out + got, size - got, static_cast<off_t>(offset + got));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EINVAL) {
      // This file system took O_DIRECT at open but not for reads: plain
      // reads of this shard from now on.
      MutexLock lock(&fd_mu_);
      for (auto& [f, twin] : direct_fds_) {
        if (f == &file) twin.failed = true;
      }
      direct = -1;
      continue;
    }
    if (n <= 0) break;  // as above
    got += static_cast<uint64_t>(n);
    // A direct read that stops off a page boundary met the file's end (its
    // size is no multiple of 4 KiB): another would be refused.
    if (got % kAlign != 0) break;
  }
  if (direct >= 0 && got > 0) {
    MutexLock lock(&mu_);
    used_direct_ = true;
  }
  return got;
}

void WindowStager::Run() {
  try {
    RunWindows();
  } catch (const std::exception&) {
    // Out of memory or threads: the workers read every record themselves
    // from now on (Find returns at once), as without the stager.
    Stop();
  }
}

void WindowStager::RunWindows() {
  NameThisThread("loader reader");
  for (uint64_t w = first_;; ++w) {
    const size_t i = w % 2;
    {
      MutexLock lock(&mu_);
      while (!(stop_ || slots_[i].window == UINT64_MAX ||
               (slots_[i].ready && slots_[i].pending == 0))) {
        cv_.Wait(&mu_);
      }
      if (stop_) return;
      slots_[i].window = w;
      slots_[i].ready = false;
      slots_[i].pending = 0;
    }
    Window win = window_of_(w);
    const bool end = win.end;
    {
      MutexLock lock(&mu_);
      slots_[i].pending = win.positions;
    }
    Stage(std::move(win), &records_[i]);
    {
      MutexLock lock(&mu_);
      slots_[i].ready = true;
    }
    cv_.NotifyAll();
    if (end) return;
  }
}

void WindowStager::Stage(Window win, Records* slot) {
  slot->entries.clear();  // read by others only once ready
  std::vector<uint64_t>& idx = win.indices;
  std::sort(idx.begin(), idx.end());
  idx.erase(std::unique(idx.begin(), idx.end()), idx.end());
  std::vector<Where> at;
  at.reserve(idx.size());
  for (uint64_t index : idx) {
    Result<ShardReader::ReadTxn::Extent> e = txn_.Locate(index);
    if (e.ok() && e->size > 0) at.push_back({index, e->fd, e->file, e->offset, e->size});
    // else: the worker's own read reports it
  }
  std::sort(at.begin(), at.end(), [](const Where& a, const Where& b) {
    return a.fd != b.fd ? a.fd < b.fd : a.offset < b.offset;
  });
  // Runs of neighbouring records: [lo, hi) of one file, aligned for O_DIRECT.
  struct Run {
    int fd;
    const ShardFile* file;
    uint64_t lo, hi, at;  // at: where in memory
    size_t first, last;   // at[first, last)
  };
  std::vector<Run> runs;
  uint64_t bytes = 0;
  for (size_t i = 0; i < at.size(); ++i) {
    const uint64_t lo = at[i].offset & ~(kAlign - 1);
    const uint64_t hi = (at[i].offset + at[i].size + kAlign - 1) & ~(kAlign - 1);
    const bool join =
        !runs.empty() && runs.back().fd == at[i].fd && lo <= runs.back().hi + kMergeGap;
    const uint64_t more = join ? std::max(runs.back().hi, hi) - runs.back().hi : hi - lo;
    // Within the window's memory: records past it (scattered records whose
    // pages hold more than their bytes, one huge record) are left to the
    // workers; the ones after it may still fit.
    if (bytes + more > window_bytes_) continue;
    if (join) {
      Run& r = runs.back();
      r.hi = std::max(r.hi, hi);
      r.last = i + 1;
    } else {
      runs.push_back({at[i].fd, at[i].file, lo, hi, bytes, i, i + 1});
    }
    bytes += more;
  }
  if (bytes > slot->capacity) {
    std::free(slot->memory);
    slot->memory = static_cast<uint8_t*>(std::aligned_alloc(kAlign, bytes));
    slot->capacity = slot->memory ? bytes : 0;
    if (!slot->memory) runs.clear();  // nothing staged: the workers read every record
  }
  // Several reads in flight (a disk serves one request at a time slowly):
  // this thread and kReadThreads - 1 helpers take the runs in turn.
  std::atomic<size_t> next_run{0};
  std::vector<std::vector<Entry>> found(kReadThreads);
  // (An exception out of it, out of memory, is the pool's to catch on a
  // helper, and Run's on this thread: the records are then the workers'.)
  auto read_runs = [&](size_t t) {
    try {
      found[t].reserve(at.size());
    } catch (const std::bad_alloc&) {
      return;  // its runs go to the other readers or, past them, to the workers
    }
    for (size_t k; (k = next_run.fetch_add(1)) < runs.size();) {
      const Run& r = runs[k];
      {
        MutexLock lock(&mu_);
        if (stop_) return;
      }
      const uint64_t got = ReadRun(*r.file, slot->memory + r.at, r.lo, r.hi - r.lo);
      for (size_t i = r.first; i < r.last; ++i) {
        const uint64_t off = at[i].offset - r.lo;
        if (off + at[i].size <= got) found[t].push_back({at[i].index, r.at + off, at[i].size});
      }
      MutexLock lock(&mu_);
      staged_ += got;
    }
  };
  // Helpers from base's pool (one per further read in flight); when their
  // threads cannot be had, fewer reads are in flight (this thread reads on).
  std::unique_ptr<WorkerPool> helpers;
  if (runs.size() > 1) {
    WorkerPool::Options o;
    o.threads = static_cast<uint32_t>(std::min(kReadThreads, runs.size()) - 1);
    o.name = "loader reader helper";
    o.on_start = [](int) { NameThisThread("loader reader"); };
    Result<std::unique_ptr<WorkerPool>> p = WorkerPool::Start(o, [&](int w) {
      read_runs(static_cast<size_t>(w) + 1);
      return Status::Ok();
    });
    if (p.ok()) helpers = std::move(*p);
  }
  read_runs(0);
  if (helpers) (void)helpers->Join();  // (read_runs reports nothing: a run it could not read is the workers')
  for (const auto& f : found) slot->entries.insert(slot->entries.end(), f.begin(), f.end());
  std::sort(slot->entries.begin(), slot->entries.end(),
            [](const Entry& a, const Entry& b) { return a.index < b.index; });
}

std::span<const uint8_t> WindowStager::Find(uint64_t w, uint64_t index) {
  MutexLock lock(&mu_);
  const Slot& slot = slots_[w % 2];
  // The window is (or will be) in its slot once the one before it there is
  // done; the stager never skips a window.
  while (!(stop_ || (slot.window == w && slot.ready))) cv_.Wait(&mu_);
  return Lookup(w, index);
}

std::span<const uint8_t> WindowStager::Peek(uint64_t w, uint64_t index) {
  MutexLock lock(&mu_);
  return Lookup(w, index);
}

std::span<const uint8_t> WindowStager::Lookup(uint64_t w, uint64_t index) const {
  const Slot& slot = slots_[w % 2];
  if (!(slot.window == w && slot.ready)) return {};
  const Records& r = records_[w % 2];
  auto it = std::lower_bound(r.entries.begin(), r.entries.end(), index,
                             [](const Entry& e, uint64_t i) { return e.index < i; });
  if (it == r.entries.end() || it->index != index) return {};
  return {r.memory + it->at, it->size};
}

void WindowStager::Done(uint64_t w) {
  bool freed = false;
  {
    MutexLock lock(&mu_);
    Slot& slot = slots_[w % 2];
    if (slot.window == w && slot.ready && slot.pending > 0) freed = --slot.pending == 0;
  }
  if (freed) cv_.NotifyAll();
}

}  // namespace nl
