// How a pipeline reads its split (ReadPlan): the order, its blocks and
// windows, and how far ahead it reads, from the config, the split's size and
// the memory this process may use.
#include <algorithm>
#include <string>

#include "base/memory.h"
#include "formats/manifest.h"
#include "loader/pipeline/pipeline.h"
#include "loader/pipeline/pipeline_impl.h"

namespace nl {

ReadPlan PlanReading(const PipelineConfig& c, uint64_t samples, uint64_t split_bytes,
                     uint64_t memory_bytes, const std::string& memory_source) {
  constexpr uint64_t kMiB = uint64_t{1} << 20;
  ReadPlan p;
  const bool known = memory_bytes > 0;
  const bool fits = !known || split_bytes <= memory_bytes / 2;
  p.io_memory = c.io_memory
                    ? *c.io_memory
                    : (known ? std::clamp(memory_bytes / 8, std::min(4 * kMiB, memory_bytes / 2),
                                          1024 * kMiB)
                             : 256 * kMiB);
  const std::string sizes = "the split's " + FormatBytes(split_bytes) +
                            (fits ? " fits" : " does not fit") + " in half of the " +
                            FormatBytes(memory_bytes) + " this process may use (" + memory_source +
                            ")";
  std::string why;
  switch (c.order) {
    case OrderChoice::kRandom:
      p.order = SampleOrder::kRandom;
      why = "`order` random";
      break;
    case OrderChoice::kBlocks:
      p.order = SampleOrder::kBlocks;
      why = "`order` blocks";
      break;
    case OrderChoice::kAuto:
      p.order = fits ? SampleOrder::kRandom : SampleOrder::kBlocks;
      why = known ? "auto: " + sizes : "auto: this process's memory is unknown";
      break;
  }
  const uint64_t mean = std::max<uint64_t>(1, samples ? split_bytes / samples : 1);
  const uint64_t window = std::max<uint64_t>(1, p.io_memory / 2 / mean);  // samples a window holds
  if (p.order == SampleOrder::kBlocks) {
    // A batch mixes the blocks of its window: kWindowBlocks of them, taken
    // from the whole split. A rank reads only its share of the epoch's
    // blocks, so the blocks are sized from the smaller of the window and
    // that share: with many ranks (or a large --io-memory) a window wider
    // than a rank's share would otherwise hold a few huge blocks, a few
    // classes of a class-sorted split.
    // A window wider than the share shuffles the whole share, as one of the
    // share's size does: the window is capped there, so that the plan says
    // what shapes the sequence (two memories that both hold a whole share
    // give one sequence) and reads ahead no more than the share.
    const uint64_t share = std::max<uint64_t>(1, SamplesPerRank(SamplerConfigFor(c, samples)));
    p.block_samples = std::max<uint64_t>(1, std::min(window, share) / kWindowBlocks);
    const uint64_t share_blocks = share / p.block_samples + (share % p.block_samples != 0 ? 1 : 0);
    p.window_blocks = std::max<uint64_t>(1, std::min(window / p.block_samples, share_blocks));
  }
  // Read ahead where the disk is read: a split bigger than memory, or blocks.
  const bool ahead = p.io_memory > 0 && (!fits || p.order == SampleOrder::kBlocks);
  if (ahead)
    p.ahead_samples = p.order == SampleOrder::kBlocks ? p.block_samples * p.window_blocks : window;
  p.pread_records = ahead || !fits;
  // In memory, blocks order reads the page cache with pread (the reader
  // thread's copy of a window would only add one: 100,000 against 177,000
  // img/s for a 3.8 GB split in the page cache, one thread).
  p.staged = ahead && p.order == SampleOrder::kBlocks && !fits;
  p.direct = p.staged;
  p.summary = std::string("order ") + SampleOrderName(p.order) + " (" + why + ")";
  if (p.order == SampleOrder::kBlocks) {
    p.summary += "; blocks of " + std::to_string(p.block_samples) + " samples (" +
                 FormatBytes(p.block_samples * mean) + "), " + std::to_string(p.window_blocks) +
                 " a window";
  }
  p.summary += ahead ? "; read-ahead " + FormatBytes(p.io_memory) + " (`io_memory`)"
                     : std::string("; no read-ahead") +
                           (p.io_memory == 0 ? " (`io_memory` 0)" : " (the split fits in memory)");
  if (p.staged) {
    p.summary += p.direct ? ", a window at a time by a reader thread, past the page cache (O_DIRECT)"
                          : ", a window at a time by a reader thread";
  }
  return p;
}

std::string SequenceOf(const ReadPlan& p) {
  if (p.order == SampleOrder::kRandom) return "random";
  return "blocks of " + std::to_string(p.block_samples) + " samples, " + std::to_string(p.window_blocks) +
         " a window";
}

uint64_t SplitBytes(const SplitInfo& split) {
  uint64_t bytes = 0;
  for (const ShardInfo& sh : split.shards) bytes += sh.bytes;
  return bytes;
}

MemoryLimit MemoryFor(const PipelineConfig& c) {
  return c.memory_bytes ? MemoryLimit{*c.memory_bytes, "PipelineConfig::memory_bytes"} : MemoryAvailableToProcess();
}

Result<ReadPlan> PlanReadingFor(const PipelineConfig& c, const Manifest& m) {
  const SplitInfo* split = m.FindSplit(c.split);
  if (!split) return Status::NotFound("the shard set has no split '" + c.split + "'");
  const MemoryLimit mem = MemoryFor(c);
  return PlanReading(c, split->num_samples, SplitBytes(*split), mem.bytes, mem.source);
}

}  // namespace nl
