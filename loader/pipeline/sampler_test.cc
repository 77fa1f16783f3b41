#include "loader/pipeline/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <string>

#include "loader/pipeline/pipeline.h"

namespace nl {
namespace {

DistributedSampler Make(uint64_t n, int rank, int world, bool drop_last = false, uint32_t batch = 4,
                        bool shuffle = true, uint64_t seed = 7) {
  SamplerConfig c;
  c.dataset_size = n;
  c.rank = rank;
  c.world = world;
  c.seed = seed;
  c.shuffle = shuffle;
  c.drop_last = drop_last;
  c.batch_size = batch;
  Result<DistributedSampler> s = DistributedSampler::Create(c);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return *s;
}

TEST(Sampler, EveryIndexOncePerEpochExceptDocumentedPadding) {
  const uint64_t n = 103;
  for (int world : {1, 2, 3, 4}) {
    for (uint64_t epoch = 0; epoch < 3; ++epoch) {
      SCOPED_TRACE("world " + std::to_string(world) + " epoch " + std::to_string(epoch));
      std::map<uint64_t, int> seen;
      uint64_t per_rank = 0;
      for (int r = 0; r < world; ++r) {
        DistributedSampler s = Make(n, r, world);
        if (r == 0) per_rank = s.samples_per_rank();
        EXPECT_EQ(s.samples_per_rank(), per_rank) << "ranks get different counts";
        for (uint64_t i : s.EpochIndices(epoch)) ++seen[i];
      }
      EXPECT_EQ(per_rank, (n + world - 1) / world);
      EXPECT_EQ(seen.size(), n) << "some index never seen";
      // Padding repeats the permutation's first (W*ceil(N/W) - N) entries once.
      const uint64_t padding = per_rank * world - n;
      std::vector<uint64_t> perm = Make(n, 0, world).Permutation(epoch);
      std::set<uint64_t> padded(perm.begin(), perm.begin() + padding);
      for (const auto& [index, times] : seen)
        EXPECT_EQ(times, padded.count(index) ? 2 : 1) << index;
      // drop_last: trimmed, each index at most once, N - N % W of them.
      std::map<uint64_t, int> trimmed;
      for (int r = 0; r < world; ++r)
        for (uint64_t i : Make(n, r, world, true).EpochIndices(epoch)) ++trimmed[i];
      EXPECT_EQ(trimmed.size(), n - n % world);
      for (const auto& [index, times] : trimmed) EXPECT_EQ(times, 1);
    }
  }
}

TEST(Sampler, RankTakesStridedPositions) {
  DistributedSampler s1 = Make(10, 1, 3);
  std::vector<uint64_t> perm = s1.Permutation(2);
  std::vector<uint64_t> want = {perm[1], perm[4], perm[7], perm[0]};  // position 10 wraps to 0
  EXPECT_EQ(s1.EpochIndices(2), want);
}

TEST(Sampler, EpochsDifferSameSeedSameOrder) {
  DistributedSampler a = Make(1000, 0, 2), b = Make(1000, 0, 2);
  EXPECT_EQ(a.EpochIndices(0), b.EpochIndices(0));
  EXPECT_NE(a.EpochIndices(0), a.EpochIndices(1));
  EXPECT_NE(a.EpochIndices(0), Make(1000, 0, 2, false, 4, true, 8).EpochIndices(0));
}

TEST(Sampler, NoShuffleKeepsIndexOrder) {
  DistributedSampler s = Make(7, 1, 2, false, 4, false);
  EXPECT_EQ(s.EpochIndices(5), (std::vector<uint64_t>{1, 3, 5, 0}));
}

TEST(Sampler, BatchesAndLastPartialBatch) {
  DistributedSampler s = Make(103, 0, 4, false, 10);  // 26 per rank
  EXPECT_EQ(s.batches_per_epoch(), 3u);
  EXPECT_EQ(s.BatchLength(2), 6u);
  SamplerConfig c = s.config();
  c.drop_last_batch = true;
  DistributedSampler d = *DistributedSampler::Create(c);
  EXPECT_EQ(d.batches_per_epoch(), 2u);
}

TEST(Sampler, BadConfigs) {
  SamplerConfig c;
  c.dataset_size = 10;
  c.rank = 2;
  c.world = 2;
  EXPECT_EQ(DistributedSampler::Create(c).status().message(), "rank 2 is not in a world of 2");
  c.rank = 0;
  c.batch_size = 0;
  Status zero = DistributedSampler::Create(c).status();
  EXPECT_EQ(zero.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(zero.message(), "batch size must be at least 1");
  c.batch_size = 20;
  c.drop_last_batch = true;
  Status short_rank = DistributedSampler::Create(c).status();
  EXPECT_EQ(short_rank.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(short_rank.message(),
            "each rank has 5 samples, fewer than one batch of 20 (drop_last_batch)");
}

SamplerConfig Blocks(uint64_t n, int world, uint64_t block, uint64_t window, uint32_t batch = 4) {
  SamplerConfig c;
  c.dataset_size = n;
  c.world = world;
  c.seed = 11;
  c.batch_size = batch;
  c.order = SampleOrder::kBlocks;
  c.block_samples = block;
  c.window_blocks = window;
  return c;
}

std::vector<uint64_t> RankIndices(SamplerConfig c, int rank, uint64_t epoch) {
  c.rank = rank;
  Result<DistributedSampler> s = DistributedSampler::Create(c);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? s->EpochIndices(epoch) : std::vector<uint64_t>{};
}

// Over sizes, world sizes, block and window sizes, padding and drop_last:
// every sample once per epoch (padding repeats the sequence's first ones,
// as random order does), every rank the same count.
TEST(SamplerBlocks, EverySampleOncePerEpochEqualCountsPerRank) {
  for (uint64_t n : {1u, 7u, 64u, 103u, 1000u}) {
    for (int world : {1, 2, 3, 8}) {
      for (uint64_t block : {1u, 5u, 16u, 2000u}) {
        for (uint64_t window : {1u, 3u, 64u}) {
          for (bool drop_last : {false, true}) {
            if (drop_last && n < static_cast<uint64_t>(world)) continue;
            SCOPED_TRACE(testing::Message() << "n " << n << " world " << world << " block " << block
                                            << " window " << window << " drop_last " << drop_last);
            SamplerConfig c = Blocks(n, world, block, window);
            c.drop_last = drop_last;
            const uint64_t per_rank = SamplesPerRank(c);
            std::vector<uint64_t> seq = DistributedSampler::Create(c)->Permutation(3);
            ASSERT_EQ(seq.size(), n);
            std::map<uint64_t, int> seen;
            for (int r = 0; r < world; ++r) {
              std::vector<uint64_t> got = RankIndices(c, r, 3);
              ASSERT_EQ(got.size(), per_rank);
              for (uint64_t i : got) ++seen[i];
            }
            const uint64_t total = per_rank * world;
            std::vector<uint64_t> position(n);
            for (uint64_t k = 0; k < n; ++k) position[seq[k]] = k;
            for (uint64_t i = 0; i < n; ++i) {
              // padding repeats the sequence from its start (more than once
              // when there are more ranks than samples)
              const uint64_t pos = position[i];
              const int want = pos < total ? static_cast<int>((total - 1 - pos) / n + 1) : 0;
              ASSERT_EQ(seen[i], want) << "index " << i;
            }
          }
        }
      }
    }
  }
}

// A rank reads whole blocks: the indices of each of its windows, sorted, are
// at most window_blocks runs (plus one at each end of its share, where a
// block may be split between two ranks).
TEST(SamplerBlocks, EachWindowIsAFewRunsOfConsecutiveIndices) {
  SamplerConfig c = Blocks(10000, 3, 50, 8);
  for (int r = 0; r < 3; ++r) {
    std::vector<uint64_t> got = RankIndices(c, r, 1);
    const uint64_t win = 50 * 8;
    for (size_t start = 0; start < got.size(); start += win) {
      std::vector<uint64_t> w(got.begin() + start, got.begin() + std::min(got.size(), start + win));
      std::sort(w.begin(), w.end());
      size_t runs = 1;
      for (size_t i = 1; i < w.size(); ++i) runs += w[i] != w[i - 1] + 1;
      EXPECT_LE(runs, 8u + 2u) << "rank " << r << " window at " << start;
    }
  }
}

TEST(SamplerBlocks, APureFunctionOfSeedAndEpoch) {
  SamplerConfig c = Blocks(5000, 2, 20, 16);
  EXPECT_EQ(RankIndices(c, 1, 4), RankIndices(c, 1, 4));
  EXPECT_NE(RankIndices(c, 1, 4), RankIndices(c, 1, 5));
  SamplerConfig other = c;
  other.seed = 12;
  EXPECT_NE(RankIndices(c, 1, 4), RankIndices(other, 1, 4));
  // The random order is untouched by the block fields.
  SamplerConfig random = c;
  random.order = SampleOrder::kRandom;
  SamplerConfig random2 = random;
  random2.block_samples = 1;
  random2.window_blocks = 1;
  EXPECT_EQ(RankIndices(random, 0, 2), RankIndices(random2, 0, 2));
  // Without shuffling: each rank's contiguous share, in index order.
  c.shuffle = false;
  std::vector<uint64_t> want(2500);
  for (uint64_t i = 0; i < 2500; ++i) want[i] = 2500 + i;
  EXPECT_EQ(RankIndices(c, 1, 0), want);
}

double MeanBatchEntropy(const std::vector<uint64_t>& indices, uint64_t per_class, size_t batch) {
  double sum = 0;
  size_t batches = 0;
  for (size_t start = 0; start + batch <= indices.size(); start += batch, ++batches) {
    std::map<uint64_t, int> count;
    for (size_t i = start; i < start + batch; ++i) ++count[indices[i] / per_class];
    for (const auto& [label, k] : count) {
      const double p = static_cast<double>(k) / batch;
      sum -= p * std::log2(p);
    }
  }
  return sum / batches;
}

// ImageFolder packs are class by class, so one block is one class. With
// enough blocks in a window, a batch of blocks order mixes labels as one of
// random order does: mean label entropy per batch >= 95% of random's, on a
// class-sorted split of 100 classes (the loader's default is 512 blocks a
// window; 256 here).
TEST(SamplerBlocks, BatchesOfAClassSortedSplitMixLabelsAsRandomOrderDoes) {
  const uint64_t classes = 100, per_class = 200, n = classes * per_class;
  SamplerConfig c = Blocks(n, 2, 16, 256, 64);
  SamplerConfig r = c;
  r.order = SampleOrder::kRandom;
  double blocks = 0, random = 0;
  for (int rank = 0; rank < 2; ++rank) {
    blocks += MeanBatchEntropy(RankIndices(c, rank, 0), per_class, 64);
    random += MeanBatchEntropy(RankIndices(r, rank, 0), per_class, 64);
  }
  const double ratio = blocks / random;
  std::printf("mean label entropy per batch of 64: blocks %.3f bits, random %.3f bits (%.1f%%)\n",
              blocks / 2, random / 2, 100 * ratio);
  EXPECT_GE(ratio, 0.95);
  // One block a window would not: each batch is then one or two classes.
  SamplerConfig one = c;
  one.window_blocks = 1;
  EXPECT_LT(MeanBatchEntropy(RankIndices(one, 0, 0), per_class, 64) / (random / 2), 0.5);
}

// The blocks the loader plans (PlanReading) mix labels for every split
// size, rank count, record size and --io-memory: mean label entropy per
// batch of a class-sorted split at least 97% of random order's, on every
// rank. Before the blocks were bounded by a rank's share, 3 ranks over
// 10,000 samples read blocks of thousands of samples and saw 4 to 6 of 10
// classes an epoch (about 60%).
TEST(SamplerBlocks, PlannedBlocksMixLabelsForAnySplitRanksAndMemory) {
  constexpr uint64_t kMiB = uint64_t{1} << 20;
  double worst = 2;
  std::string worst_at;
  for (uint64_t classes : {10, 100}) {
    for (uint64_t n : {1'000, 10'000, 100'000}) {
      for (uint64_t record : {200, 3'200}) {
        for (int world : {1, 2, 3, 4, 8}) {
          for (uint64_t io : {kMiB, 16 * kMiB, 256 * kMiB, 1024 * kMiB}) {
            PipelineConfig pc;
            pc.world = world;
            pc.batch_size = 64;
            pc.seed = 5;
            pc.order = OrderChoice::kBlocks;
            pc.io_memory = io;
            const ReadPlan plan = PlanReading(pc, n, n * record, 24 * 1024 * kMiB, "x");
            SamplerConfig b = SamplerConfigFor(pc, n, plan);
            SamplerConfig r = b;
            r.order = SampleOrder::kRandom;
            const uint64_t per_class = n / classes;
            // Summed over epochs (a rank of a small split has a batch or two;
            // a share of 100,000 has hundreds, and one epoch of it is the
            // test's cost under the sanitizers).
            const uint64_t epochs = n >= 100'000 ? 1 : 4;
            for (int rank = 0; rank < world; ++rank) {
              double blocks = 0, random = 0;
              for (uint64_t epoch = 0; epoch < epochs; ++epoch) {
                blocks += MeanBatchEntropy(RankIndices(b, rank, epoch), per_class, 64);
                random += MeanBatchEntropy(RankIndices(r, rank, epoch), per_class, 64);
              }
              const double ratio = blocks / random;
              if (ratio < worst) {
                worst = ratio;
                worst_at = std::to_string(classes) + " classes, " + std::to_string(n) +
                           " samples of " + std::to_string(record) + " B, rank " +
                           std::to_string(rank) + " of " + std::to_string(world) +
                           ", --io-memory " + std::to_string(io / kMiB) + "M: blocks of " +
                           std::to_string(plan.block_samples) + ", " +
                           std::to_string(plan.window_blocks) + " a window";
              }
            }
          }
        }
      }
    }
  }
  std::printf("worst mix of planned blocks against random order: %.1f%% (%s)\n", 100 * worst,
              worst_at.c_str());
  EXPECT_GE(worst, 0.97) << worst_at;
}

TEST(SamplerBlocks, EmptyBlocksOrWindowsAreRefused) {
  SamplerConfig c = Blocks(100, 1, 0, 4);
  EXPECT_EQ(DistributedSampler::Create(c).status().message(),
            "blocks and windows must hold at least one sample");
  c = Blocks(100, 1, 4, 0);
  EXPECT_FALSE(DistributedSampler::Create(c).ok());
}

}  // namespace
}  // namespace nl
