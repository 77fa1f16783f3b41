// Gradient averaging in buckets of about bucket_bytes (reverse parameter
// order, as DDP fills them during backward), one all-reduce per bucket, all
// started before the first is waited for. After Reduce every rank holds the
// mean of the ranks' gradients. A failure is Comm's (RankError).
#pragma once

#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "trainer/comm.h"

namespace nl::trainer {

class GradReducer {
 public:
  GradReducer(const std::vector<at::Tensor>& params, int64_t bucket_bytes);
  size_t buckets() const { return buckets_.size(); }
  // A parameter without a gradient gets zeros (so every rank sends the same sizes).
  void Reduce(Comm& comm, const std::string& what);

 private:
  std::vector<std::vector<at::Tensor>> buckets_;
};

}  // namespace nl::trainer
