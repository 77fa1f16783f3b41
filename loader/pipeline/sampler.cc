#include "loader/pipeline/sampler.h"

#include <numeric>

#include "loader/pipeline/random.h"

namespace nl {

uint64_t SamplesPerRank(const SamplerConfig& c) {
  if (c.world < 1) return 0;
  const uint64_t n = c.dataset_size, w = static_cast<uint64_t>(c.world);
  // As torch: ceil(N / W) with padding; floor(N / W) when dropping the tail.
  return c.drop_last ? n / w : n / w + (n % w != 0 ? 1 : 0);
}

uint64_t BatchesPerEpoch(const SamplerConfig& c) {
  if (c.batch_size == 0) return 0;
  const uint64_t per_rank = SamplesPerRank(c);
  return per_rank / c.batch_size + (!c.drop_last_batch && per_rank % c.batch_size != 0 ? 1 : 0);
}

Result<DistributedSampler> DistributedSampler::Create(const SamplerConfig& c) {
  if (c.world < 1 || c.rank < 0 || c.rank >= c.world) {
    return Status::InvalidArgument("rank " + std::to_string(c.rank) + " is not in a world of " +
                                   std::to_string(c.world));
  }
  if (c.batch_size == 0) return Status::InvalidArgument("batch size must be at least 1");
  if (c.dataset_size == 0) return Status::InvalidArgument("the dataset is empty");
  const uint64_t n = c.dataset_size, w = static_cast<uint64_t>(c.world);
  if (c.drop_last && n < w) {
    return Status::InvalidArgument("drop_last with " + std::to_string(n) + " samples for " +
                                   std::to_string(w) + " ranks leaves nothing");
  }
  DistributedSampler s;
  s.c_ = c;
  s.per_rank_ = SamplesPerRank(c);
  s.batches_ = BatchesPerEpoch(c);
  if (s.batches_ == 0) {
    return Status::InvalidArgument("each rank has " + std::to_string(s.per_rank_) +
                                   " samples, fewer than one batch of " +
                                   std::to_string(c.batch_size) + " (drop_last_batch)");
  }
  return s;
}

uint32_t DistributedSampler::BatchLength(uint64_t b) const {
  const uint64_t start = b * c_.batch_size;
  if (start >= per_rank_) return 0;
  return static_cast<uint32_t>(std::min<uint64_t>(c_.batch_size, per_rank_ - start));
}

std::vector<uint64_t> DistributedSampler::Permutation(uint64_t epoch) const {
  std::vector<uint64_t> p(c_.dataset_size);
  std::iota(p.begin(), p.end(), uint64_t{0});
  if (c_.shuffle) {
    Rng rng(c_.seed + epoch, 0x5A4D504C4552ull);  // same on every rank
    for (uint64_t i = p.size() - 1; i > 0; --i) std::swap(p[i], p[rng.Below(i + 1)]);
  }
  return p;
}

std::vector<uint64_t> DistributedSampler::EpochIndices(uint64_t epoch) const {
  const std::vector<uint64_t> p = Permutation(epoch);
  const uint64_t w = static_cast<uint64_t>(c_.world), n = p.size();
  std::vector<uint64_t> out;
  out.reserve(per_rank_);
  for (uint64_t k = 0; k < per_rank_; ++k) {
    const uint64_t pos = static_cast<uint64_t>(c_.rank) + k * w;  // position in the padded list
    out.push_back(p[pos % n]);  // padding repeats the list from its start
  }
  return out;
}

}  // namespace nl
