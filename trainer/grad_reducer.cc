#include "trainer/grad_reducer.h"

namespace nl::trainer {

GradReducer::GradReducer(const std::vector<at::Tensor>& params, int64_t bucket_bytes) {
  std::vector<at::Tensor> bucket;
  int64_t bytes = 0;
  for (auto it = params.rbegin(); it != params.rend(); ++it) {
    const int64_t b = it->numel() * static_cast<int64_t>(it->element_size());
    if (!bucket.empty() && bytes + b > bucket_bytes) {
      buckets_.push_back(bucket);
      bucket.clear();
      bytes = 0;
    }
    bucket.push_back(*it);
    bytes += b;
  }
  if (!bucket.empty()) buckets_.push_back(bucket);
}

void GradReducer::Reduce(Comm& comm, const std::string& what) {
  if (comm.world() == 1) return;
  std::vector<at::Tensor> flats;
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  for (auto& bucket : buckets_) {
    std::vector<at::Tensor> parts;
    for (auto& p : bucket) {
      if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
      parts.push_back(p.grad().reshape({-1}));
    }
    flats.push_back(at::cat(parts));
    std::vector<at::Tensor> v{flats.back()};
    works.push_back(comm.StartAllReduceSum(v));
  }
  for (size_t i = 0; i < works.size(); ++i) {
    comm.Wait(works[i], what);
    flats[i].div_(comm.world());
    int64_t off = 0;
    for (auto& p : buckets_[i]) {
      p.mutable_grad().copy_(flats[i].narrow(0, off, p.numel()).view_as(p));
      off += p.numel();
    }
  }
}

}  // namespace nl::trainer
