// Gradient averaging the way DDP does it: the parameters are grouped in
// buckets of about bucket_bytes (the first one 1 MiB at most; reverse
// registration order, the order backward produces them), each bucket is one persistent flat buffer and every
// parameter's .grad is a view of it (no per-step concatenation or copy back).
//
// Overlapped (the default): a post hook on each parameter's gradient
// accumulator counts the bucket's gradients in; when a bucket is whole, and
// every bucket before it has been launched, its all-reduce starts, while
// backward goes on computing the next. Finish (after backward) launches what
// is left (a bucket holding a parameter that got no gradient: its zeros), and
// waits. After-backward: every bucket is launched by Finish, in the same
// order; kept to measure what the overlap gains.
//
// Buckets are launched in index order on every rank, so the collectives
// match. After Finish every rank's gradients are the mean of the ranks'. A
// failure is Comm's (RankError). Hooks may run on autograd's device threads;
// the state they touch is under a mutex.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>

#include "base/mutex.h"
#include "trainer/comm.h"

namespace nl::trainer {

enum class ReduceMode { kOverlap, kAfterBackward };

struct ReduceTimes {
  double exposed_ms = 0;    // from backward's end until every bucket had arrived
  // From the first bucket's launch until the last one had arrived, as the
  // works' futures tell it: with Gloo, when the sum is done; with NCCL, whose
  // futures complete once the collective is queued on its stream, a lower
  // bound (the step's comm wait, taken after a stream sync, is exact there).
  double allreduce_ms = 0;
};

struct Arrivals;

class GradReducer {
 public:
  static constexpr int64_t kFirstBucketBytes = 1 << 20;  // the first bucket's cap (when bucket_bytes is more)
  // params: the model's; those with requires_grad are reduced, and their
  // .grad become views (IsView's index counts only those).
  GradReducer(const std::vector<at::Tensor>& params, int64_t bucket_bytes, Comm* comm, ReduceMode mode);
  ~GradReducer();
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  size_t buckets() const { return buckets_.size(); }
  // Before forward: zeroes the gradients (one fill per bucket; an
  // optimizer's zero_grad would detach_ the views, which LibTorch refuses)
  // and every bucket waits for its gradients again.
  void Begin() NL_EXCLUDES(mu_);
  // After backward (what names the collectives in an error). A parameter
  // that got no gradient holds its bucket, and every later one, until here.
  ReduceTimes Finish(const std::string& what) NL_EXCLUDES(mu_);
  // Whether parameter i's .grad is still a view of its bucket (tests).
  bool IsView(size_t i) const;
  // Buckets launched so far this step (tests: how many started in backward).
  size_t launched() NL_EXCLUDES(mu_);

 private:
  using Clock = std::chrono::steady_clock;
  // Fixed at construction.
  struct Bucket {
    at::Tensor buffer;
    std::vector<size_t> params;
  };
  // A bucket's step: counted down by the hooks (on autograd's threads),
  // launched by the hook that completes it or by Finish.
  struct BucketState {
    size_t pending = 0;
    c10::intrusive_ptr<c10d::Work> work;
    Clock::time_point launched{};
  };
  void Ready(size_t param) NL_EXCLUDES(mu_);
  void Launch(size_t bucket) NL_REQUIRES(mu_);
  at::Tensor ViewOf(size_t param) const;
  void Repoint(size_t param);

  std::vector<at::Tensor> params_;
  std::vector<size_t> bucket_of_, offset_of_;
  std::vector<Bucket> buckets_;
  Comm* comm_;
  ReduceMode mode_;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::vector<uintptr_t> hook_keys_;
  Mutex mu_;
  std::vector<BucketState> state_ NL_GUARDED_BY(mu_);  // buckets_[i]'s
  size_t next_ NL_GUARDED_BY(mu_) = 0;  // the first bucket not launched
  std::shared_ptr<Arrivals> arrivals_;
};

}  // namespace nl::trainer
