#include "loader/pipeline/sampler.h"

#include <numeric>
#include <utility>

#include "loader/pipeline/random.h"

namespace nl {

const char* SampleOrderName(SampleOrder o) {
  return o == SampleOrder::kBlocks ? "blocks" : "random";
}

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
  if (c.block_samples == 0 || c.window_blocks == 0) {
    return Status::InvalidArgument("blocks and windows must hold at least one sample");
  }
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

namespace {
template <typename T>
void Shuffle(std::vector<T>* v, size_t begin, size_t end, Rng* rng) {
  for (size_t i = end - 1; i > begin; --i)
    std::swap((*v)[i], (*v)[begin + rng->Below(i - begin + 1)]);
}
}  // namespace

uint64_t DistributedSampler::window_samples() const {
  const uint64_t w = c_.block_samples * c_.window_blocks;
  return w / c_.window_blocks == c_.block_samples ? w : UINT64_MAX;  // (overflow: one window)
}

std::vector<uint64_t> DistributedSampler::Permutation(uint64_t epoch) const {
  const uint64_t n = c_.dataset_size;
  std::vector<uint64_t> p;
  p.reserve(n);
  if (c_.order == SampleOrder::kRandom) {
    p.resize(n);
    std::iota(p.begin(), p.end(), uint64_t{0});
    if (c_.shuffle && n > 1) {
      Rng rng(c_.seed + epoch, 0x5A4D504C4552ull);  // same on every rank
      Shuffle(&p, 0, p.size(), &rng);
    }
    return p;
  }
  const uint64_t k = c_.block_samples, blocks = n / k + (n % k != 0 ? 1 : 0);
  std::vector<uint64_t> order(blocks);
  std::iota(order.begin(), order.end(), uint64_t{0});
  if (c_.shuffle && blocks > 1) {
    Rng rng(c_.seed + epoch, 0x424C4F434B53ull);  // same on every rank
    Shuffle(&order, 0, order.size(), &rng);
  }
  for (uint64_t b : order) {
    const uint64_t end = b == blocks - 1 ? n : (b + 1) * k;
    for (uint64_t i = b * k; i < end; ++i) p.push_back(i);
  }
  return p;
}

std::vector<uint64_t> DistributedSampler::EpochIndices(uint64_t epoch) const {
  const std::vector<uint64_t> p = Permutation(epoch);
  const uint64_t w = static_cast<uint64_t>(c_.world), n = p.size();
  const uint64_t r = static_cast<uint64_t>(c_.rank);
  std::vector<uint64_t> out;
  out.reserve(per_rank_);
  if (c_.order == SampleOrder::kRandom) {
    for (uint64_t k = 0; k < per_rank_; ++k) {
      const uint64_t pos = r + k * w;  // position in the padded list
      out.push_back(p[pos % n]);       // padding repeats the list from its start
    }
    return out;
  }
  // blocks: the r-th contiguous share of the padded (or trimmed) sequence,
  // then each window of it shuffled on its own.
  for (uint64_t k = 0; k < per_rank_; ++k) out.push_back(p[(r * per_rank_ + k) % n]);
  if (c_.shuffle) {
    const uint64_t win = window_samples();
    for (uint64_t start = 0, i = 0; start < out.size(); start += win, ++i) {
      const uint64_t end = win >= out.size() - start ? out.size() : start + win;
      if (end - start < 2) continue;
      Rng rng(c_.seed + epoch, 0x57494E444F57ull ^ r, i);
      Shuffle(&out, start, end, &rng);
    }
  }
  return out;
}

}  // namespace nl
