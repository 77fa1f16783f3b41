#include "tests/support/fault_shard_files.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>

namespace nl::testing {

struct FaultShardFiles::State {
  mutable std::mutex mu;
  ShardFaults faults;
  uint64_t reads = 0, short_reads = 0;

  // The faults for shard `name` now (none when another shard is the faulty one).
  ShardFaults For(const std::string& name) const {
    std::lock_guard lock(mu);
    if (!faults.shard.empty() && faults.shard != name) return ShardFaults{.direct_errno = 0};
    return faults;
  }
};

namespace {

// As base's FromErrno without the context: callers add theirs.
Status ErrnoStatus(int err) {
  return err == ENOENT ? Status::NotFound(std::strerror(err)) : Status::IOError(std::strerror(err));
}

class FaultShardFile final : public ShardFile {
 public:
  FaultShardFile(std::unique_ptr<ShardFile> local, std::string name,
                 std::shared_ptr<FaultShardFiles::State> state)
      : local_(std::move(local)), name_(std::move(name)), state_(std::move(state)) {}
  const std::string& dir() const override { return local_->dir(); }
  int fd() const override { return local_->fd(); }

  Result<uint64_t> Size() const override {
    const ShardFaults f = state_->For(name_);
    if (f.size_errno != 0) return ErrnoStatus(f.size_errno);
    NL_ASSIGN_OR_RETURN(uint64_t size, local_->Size());
    return std::min(size, f.shrink_to);
  }

  Result<size_t> ReadSome(uint64_t offset, uint8_t* out, size_t n) const override {
    const ShardFaults f = state_->For(name_);
    {
      std::lock_guard lock(state_->mu);
      ++state_->reads;
    }
    if (f.read_errno != 0 && offset + n > f.read_error_from) return ErrnoStatus(f.read_errno);
    if (offset >= f.shrink_to) return size_t{0};
    size_t want = static_cast<size_t>(std::min<uint64_t>(n, f.shrink_to - offset));
    if (f.max_read > 0 && want > f.max_read) {
      want = f.max_read;
      std::lock_guard lock(state_->mu);
      ++state_->short_reads;
    }
    return local_->ReadSome(offset, out, want);
  }

  Result<Fd> OpenDirect() const override {
    const ShardFaults f = state_->For(name_);
    if (f.direct_errno != 0) return ErrnoStatus(f.direct_errno);
    return local_->OpenDirect();
  }

 private:
  const std::unique_ptr<ShardFile> local_;
  const std::string name_;
  const std::shared_ptr<FaultShardFiles::State> state_;
};

}  // namespace

FaultShardFiles::FaultShardFiles(ShardFaults faults) : state_(std::make_shared<State>()) {
  state_->faults = std::move(faults);
}

void FaultShardFiles::Set(ShardFaults faults) {
  std::lock_guard lock(state_->mu);
  state_->faults = std::move(faults);
}

Result<std::unique_ptr<ShardFile>> FaultShardFiles::Open(const std::string& root,
                                                         const ShardInfo& info) const {
  const ShardFaults f = state_->For(info.path);
  if (f.open_errno != 0) {
    return Status::FromErrno(
        "cannot open shard " + info.path + " (" + root + "/" + info.path + "/data.mdb)",
        f.open_errno);
  }
  NL_ASSIGN_OR_RETURN(std::unique_ptr<ShardFile> local, ShardFiles::Local().Open(root, info));
  return std::unique_ptr<ShardFile>(new FaultShardFile(std::move(local), info.path, state_));
}

uint64_t FaultShardFiles::reads() const {
  std::lock_guard lock(state_->mu);
  return state_->reads;
}

uint64_t FaultShardFiles::short_reads() const {
  std::lock_guard lock(state_->mu);
  return state_->short_reads;
}

}  // namespace nl::testing
