// What a job checks before it trains, once in the launcher (so a bad flag is
// one error, not one per rank) and again in each rank (torchrun starts ranks
// without our launcher): the data set fits the options, the outputs can be
// written and do not overwrite each other or the data, and no other job
// writes the same outputs (an exclusive lock held for the job's life).
//
//   NL_RETURN_IF_ERROR(CheckData(options, manifest));
//   NL_RETURN_IF_ERROR(CheckOutputs(options));
//   NL_ASSIGN_OR_RETURN(OutputLock lock, LockOutputs(options));  // held until destroyed
#pragma once

#include <unistd.h>

#include <string>
#include <utility>
#include <vector>

#include "formats/manifest.h"
#include "base/fd.h"
#include "base/status.h"
#include "loader/plan/job_plan.h"
#include "trainer/options.h"

namespace nl::trainer {

// The binding plan request for `local_world` ranks on this node, from the flags.
JobPlanRequest PlanRequest(const Options& o, int local_world);

// The shard set has a train split of at least 2 classes, the --eval-split
// asked for ("none" for no evaluation), and for --resize-on device one square
// image shape.
Status CheckData(const Options& o, const Manifest& m);

// --out is made (0700) and writable; --params-out and --metrics-out are
// files in writable directories; no two outputs (the checkpoint
// <out>/checkpoint.pt, the metrics, the parameters) are one file; none lies
// inside the shard set.
Status CheckOutputs(const Options& o);

// Exclusive write locks (POSIX record locks: the kernel drops them when the
// process dies, kill -9 included) on <out>/.trainer.lock and the
// --metrics-out file. A second job on the same outputs fails, naming the
// process that holds them. Locks are per process: the launcher holds them for
// its ranks.
class OutputLock {
 public:
  OutputLock() = default;
  OutputLock(OutputLock&& other) noexcept
      : fds_(std::exchange(other.fds_, {})), remove_(std::exchange(other.remove_, {})) {}
  OutputLock& operator=(OutputLock&& other) noexcept {
    if (this != &other) {
      Release();
      fds_ = std::exchange(other.fds_, {});
      remove_ = std::exchange(other.remove_, {});
    }
    return *this;
  }
  ~OutputLock() { Release(); }
  // `remove`: a lock file of our own (--out's .trainer.lock), removed while
  // still locked when the job ends (a locker that then finds the name gone or
  // another file under it locks again); "" for a file that is an output.
  void Add(Fd fd, std::string remove = "") {
    fds_.push_back(std::move(fd));
    remove_.push_back(std::move(remove));
  }

 private:
  void Release() {
    for (size_t i = 0; i < fds_.size(); ++i) {
      if (!remove_[i].empty()) unlink(remove_[i].c_str());
      fds_[i].Reset();
    }
    fds_.clear();
    remove_.clear();
  }
  std::vector<Fd> fds_;  // each holds its record lock until closed
  std::vector<std::string> remove_;
};
Result<OutputLock> LockOutputs(const Options& o);

// `path` with its directory resolved (symbolic links, "..") and its last
// component kept: two names of one file compare equal. "" if the directory
// does not exist.
std::string CanonicalTarget(const std::string& path);

}  // namespace nl::trainer
