#include "loader/pipeline/sampler.h"

#include <gtest/gtest.h>

#include <map>
#include <set>

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

}  // namespace
}  // namespace nl
