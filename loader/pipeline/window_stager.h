// Reads a rank's list, a window at a time, into memory ahead of the workers
// (blocks order): one thread that waits on the disk so the workers do not.
//
// A window is a stretch of positions of the rank's list (ReadPlan's
// ahead_samples); its records, sorted by where they lie, become one read per
// run of neighbouring records (a block: a few consecutive records, one
// request). Two windows are held at a time, the one the workers read and
// the next: the next is read while the current is worked on, and a window's
// memory is reused only after each of its positions was done (Done).
//
// The reads go through each shard's ShardFile (formats/shard_files.h). With
// `direct`, they bypass the page cache (O_DIRECT, through a descriptor of
// its own on each shard, ShardFile::OpenDirect): a split bigger than memory is read
// once, with no page cache to fill, charge to the cgroup and reclaim again;
// where the file system refuses O_DIRECT, plain reads. Only a fast path: a
// record the stager did not read (one past where a read stopped short, a
// record it could not locate, past the window's memory, a position outside
// the window, every record once the stager failed) is read the usual way
// by the worker, whose read then reports what is wrong with it, as it would
// without the stager.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "base/fd.h"
#include "base/mutex.h"
#include "base/status.h"
#include "base/thread.h"
#include "formats/shard.h"

namespace nl {

class WindowStager {
 public:
  struct Window {
    std::vector<uint64_t> indices;  // the window's records (any order, repeats allowed)
    uint64_t positions = 0;         // positions the workers will call Done for
    bool end = false;               // past the run's last window: the stager stops
  };
  // `window_of(w)`: window w of the run (w = first_window, first_window + 1,
  // ...). Called on the stager's thread.
  // `window_bytes`: the memory a window may take (two are held); records
  // beyond it are left to the workers.
  WindowStager(const SplitReader& reader, bool direct, uint64_t window_bytes,
               uint64_t first_window, std::function<Window(uint64_t w)> window_of);
  ~WindowStager();  // Stop(), then joins the thread (a read in progress finishes)
  // From now on Find returns at once (empty where the window is not read):
  // a worker waiting for a window goes on. The thread stops after its read.
  void Stop() NL_EXCLUDES(mu_);
  WindowStager(const WindowStager&) = delete;
  WindowStager& operator=(const WindowStager&) = delete;

  // Record `index` of window `w`, waiting until the window is read; empty
  // when the stager did not read it (the worker reads it itself). Valid
  // until this caller's Done(w).
  std::span<const uint8_t> Find(uint64_t w, uint64_t index) NL_EXCLUDES(mu_);
  // Find without waiting: empty where window `w` is not read yet. For a
  // prefetch hint only (the bytes may be reused once the caller's window is
  // done, so they are not to be read after that).
  std::span<const uint8_t> Peek(uint64_t w, uint64_t index) NL_EXCLUDES(mu_);
  // One position of window `w` is done (its sample written or failed).
  void Done(uint64_t w) NL_EXCLUDES(mu_);

  uint64_t staged_bytes() const NL_EXCLUDES(mu_);  // read into memory so far, over the run
  bool direct() const NL_EXCLUDES(mu_);            // O_DIRECT used for at least one read

 private:
  struct Entry {
    uint64_t index;
    uint64_t at;    // byte offset in the slot's memory
    uint64_t size;  // 0: not read
  };
  // Which window a slot holds (slots_[w % 2] holds window w).
  struct Slot {
    uint64_t window = UINT64_MAX;  // UINT64_MAX: free
    bool ready = false;
    uint64_t pending = 0;  // positions not yet done
  };
  // A slot's records. Written by the stager's thread, without the lock,
  // while the slot is not ready (no one else reads them then); read, under
  // mu_, once it is, until its window is done. The analysis cannot state
  // that hand-off (the lock is not what protects them), so no annotation.
  struct Records {
    std::vector<Entry> entries;  // sorted by index
    uint8_t* memory = nullptr;
    size_t capacity = 0;
  };
  void Run();  // RunWindows; an exception stops the stager (the workers read)
  void RunWindows() NL_EXCLUDES(mu_);
  std::span<const uint8_t> Lookup(uint64_t w, uint64_t index) const NL_REQUIRES(mu_);
  void Stage(Window win, Records* out) NL_EXCLUDES(mu_);  // runs without the lock held
  // Its O_DIRECT twin's descriptor, or -1 (plain reads).
  int DirectFor(const ShardFile* file) NL_EXCLUDES(fd_mu_);
  // Reads [offset, offset + size) of a shard into out; returns the bytes read
  // (fewer on an error or at the file's end).
  uint64_t ReadRun(const ShardFile& file, uint8_t* out, uint64_t offset, uint64_t size)
      NL_EXCLUDES(mu_, fd_mu_);

  const bool want_direct_;
  const uint64_t window_bytes_;
  std::function<Window(uint64_t)> window_of_;
  SplitReader::ReadTxn txn_;  // the stager thread's own

  mutable Mutex mu_;
  CondVar cv_;
  bool stop_ NL_GUARDED_BY(mu_) = false;
  const uint64_t first_;  // the run's first window
  Slot slots_[2] NL_GUARDED_BY(mu_);
  Records records_[2];  // slots_[i]'s
  uint64_t staged_ NL_GUARDED_BY(mu_) = 0;
  bool used_direct_ NL_GUARDED_BY(mu_) = false;
  struct Twin {
    Fd fd;
    bool failed = false;  // its reads were refused: plain reads instead
  };
  Mutex fd_mu_;
  // Shard file -> its O_DIRECT twin.
  std::vector<std::pair<const ShardFile*, Twin>> direct_fds_ NL_GUARDED_BY(fd_mu_);
  Thread thread_;  // base's: the stager's own reader thread
};

}  // namespace nl
