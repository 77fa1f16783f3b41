// Which samples a rank reads, batch by batch: PyTorch DistributedSampler
// semantics (contract 2 of the architecture).
//
// Per epoch: one permutation of [0, N) from seed + epoch, shared by all ranks
// (or index order with shuffle off); padded by repeating from its start to a
// multiple of the world size W (or, with drop_last, trimmed to one); rank r
// takes positions r, r+W, r+2W, ... Every rank gets the same number of
// samples and batches; the last partial batch is kept or dropped
// (drop_last_batch). Batch (epoch, b) is a pure function of the config, so a
// run can start at any (epoch, batch).
//
// The permutation is our own (Fisher-Yates over SplitMix64), not
// torch.randperm's: the structure is DistributedSampler's, the order is not
// bit-for-bit PyTorch's.
//
// Two orders (SampleOrder):
// - random: the above; each rank's reads land anywhere in the split.
// - blocks: for data bigger than memory, read in runs. The split is cut into
//   blocks of `block_samples` consecutive indices; each epoch the blocks are
//   shuffled (seed + epoch) and laid end to end, padded or trimmed as above,
//   and rank r takes the r-th contiguous share of that sequence, so it reads
//   whole blocks, each front to back. Its share is then shuffled within
//   windows of `window_blocks` blocks' positions (the loader holds a window's
//   blocks in memory), so a batch mixes samples of that many blocks. Every
//   sample once per epoch over all ranks (with padding or drop_last as
//   above), the same counts per rank, and a pure function of the config and
//   (epoch, batch), like random.
#pragma once

#include <cstdint>
#include <vector>

#include "base/status.h"

namespace nl {

enum class SampleOrder { kRandom, kBlocks };
const char* SampleOrderName(SampleOrder o);  // "random", "blocks"

struct SamplerConfig {
  uint64_t dataset_size = 0;
  int rank = 0;
  int world = 1;
  uint64_t seed = 0;
  bool shuffle = true;
  bool drop_last = false;  // trim instead of pad to a multiple of the world size
  uint32_t batch_size = 1;
  bool drop_last_batch = false;  // drop this rank's last partial batch
  SampleOrder order = SampleOrder::kRandom;
  uint64_t block_samples = 1;  // blocks: consecutive indices per block, 1 or more
  uint64_t window_blocks = 1;  // blocks: blocks per shuffle window, 1 or more
};

// The sampler's arithmetic, as torch's DistributedSampler: samples per rank
// ceil(N / W), or floor(N / W) with drop_last; batches per epoch
// ceil(per_rank / B), or floor with drop_last_batch. Every rank has the same
// numbers. 0 for a world or batch size of 0 (Create refuses those, and a
// config with no batch).
uint64_t SamplesPerRank(const SamplerConfig& c);
uint64_t BatchesPerEpoch(const SamplerConfig& c);

class DistributedSampler {
 public:
  static Result<DistributedSampler> Create(const SamplerConfig& c);

  const SamplerConfig& config() const { return c_; }
  uint64_t samples_per_rank() const { return per_rank_; }
  uint64_t batches_per_epoch() const { return batches_; }
  // Samples in batch b (the last may be short unless drop_last_batch).
  uint32_t BatchLength(uint64_t b) const;

  // This rank's samples for an epoch, in order (samples_per_rank() of them).
  std::vector<uint64_t> EpochIndices(uint64_t epoch) const;
  // The whole epoch's order before padding and sharing out (N entries):
  // random, a permutation; blocks, the shuffled blocks end to end.
  std::vector<uint64_t> Permutation(uint64_t epoch) const;

 private:
  // Positions of this rank's share one shuffle window spans (blocks order).
  uint64_t window_samples() const;

  SamplerConfig c_;
  uint64_t per_rank_ = 0, batches_ = 0;
};

}  // namespace nl
