// The pipeline's insides, shared by its files and by nothing else:
// pipeline.cc (Open, the consumer's Next and Release), pipeline_worker.cc
// (the workers that fill the batches, their read-ahead and the stager's
// windows) and read_plan.cc (the ReadPlan).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "base/memory.h"
#include "base/mutex.h"
#include "base/status.h"
#include "base/worker_pool.h"
#include "formats/manifest.h"
#include "formats/shard.h"
#include "loader/pipeline/pipeline.h"
#include "loader/pipeline/sampler.h"
#include "loader/pipeline/window_stager.h"

namespace nl {

class SamplePath;

// read_plan.cc: the bytes of a split's shards, and the memory a pipeline
// with config c plans with.
uint64_t SplitBytes(const SplitInfo& split);
MemoryLimit MemoryFor(const PipelineConfig& c);

struct Pipeline::Impl {
  using Clock = std::chrono::steady_clock;
  // Buffer i's batch, as the workers claim its samples (no lock).
  struct Slot {
    std::atomic<uint64_t> seq{UINT64_MAX};  // the batch this buffer is assigned to
    std::atomic<uint32_t> remaining{0};     // samples still to write
  };
  // Buffer i's batch, as the consumer sees it (under mu).
  struct SlotState {
    bool ready = false;
    bool delivered = false;          // handed out by Next(), not yet released
    uint32_t error_at = UINT32_MAX;  // first failing sample
    Status error;
  };
  struct alignas(64) WorkerStats {
    std::atomic<uint64_t> read_ns{0}, decode_ns{0}, transform_ns{0}, images{0}, skipped{0};
  };
  struct Worker;  // one worker's own state (pipeline_worker.cc)

  // Set at Open, read-only afterwards.
  PipelineConfig c;
  Manifest manifest;
  std::unique_ptr<SplitReader> reader;
  ReadPlan plan;
  std::optional<DistributedSampler> sampler;
  std::unique_ptr<HeapBuffers> own_buffers;
  const BufferSource* buffers = nullptr;
  size_t sample_bytes = 0;
  uint64_t bpe = 0, total = 0;
  uint32_t depth = 0;
  std::unique_ptr<Slot[]> slots;
  uint64_t windows_per_epoch = 1;
  uint64_t processed_per_epoch = 0;  // positions of an epoch's list that batches take
  std::vector<std::unique_ptr<WorkerStats>> wstats;
  Clock::time_point start = Clock::now();

  // The consumer and the workers.
  Mutex mu;
  CondVar work_cv, ready_cv;
  std::atomic<bool> stop{false};
  std::vector<SlotState> slot_states NL_GUARDED_BY(mu);  // slots[i]'s
  uint64_t next_deliver NL_GUARDED_BY(mu) = 0;
  uint32_t held NL_GUARDED_BY(mu) = 0;  // delivered, not released
  Status failure NL_GUARDED_BY(mu);
  std::atomic<uint64_t> next_sample{0};
  double wait_s NL_GUARDED_BY(mu) = 0, ready_sum NL_GUARDED_BY(mu) = 0;
  uint64_t delivered NL_GUARDED_BY(mu) = 0;
  bool in_next NL_GUARDED_BY(mu) = false;  // a consumer is inside Next()

  Mutex epoch_mu;
  std::map<uint64_t, std::shared_ptr<const std::vector<uint64_t>>> epoch_lists
      NL_GUARDED_BY(epoch_mu);

  // Read-ahead (plan.ahead_samples > 0): positions of the rank's list in
  // windows of that many; a worker starting a sample of window G makes sure
  // windows G and G + 1 (counted over the run) were asked for.
  Mutex ahead_mu;                       // one worker asks at a time
  std::atomic<uint64_t> ahead_next{0};  // the first window not yet asked for
  std::atomic<uint64_t> ahead_bytes{0};
  std::optional<SplitReader::ReadTxn> ahead_txn NL_GUARDED_BY(ahead_mu);
  // Blocks order (plan.staged): windows read into memory on a thread of its
  // own instead; window w of the run as AskWindow counts them.
  std::unique_ptr<WindowStager> stager;

  std::unique_ptr<WorkerPool> pool;

  std::pair<uint64_t, uint64_t> EpochBatch(uint64_t g) const {
    const uint64_t pos = c.start_batch + g;
    return {c.start_epoch + pos / bpe, pos % bpe};
  }
  uint32_t LengthOf(uint64_t g) const { return sampler->BatchLength(EpochBatch(g).second); }

  // pipeline.cc
  // Points slot g % depth at batch g (or at nothing past the end).
  void Assign(uint64_t g) NL_REQUIRES(mu);

  // pipeline_worker.cc
  // A worker's loop: claims positions in turn and writes their samples.
  Status RunWorker(int id);
  // A worker's failure (an exception, a thread that could not start) stops
  // the run; Next() returns it.
  void Fail(const Status& st) NL_EXCLUDES(mu);
  // The run's window w for the stager: its positions that batches take
  // (from the run's first one on) and their records.
  WindowStager::Window StagerWindow(uint64_t w);

 private:
  std::shared_ptr<const std::vector<uint64_t>> EpochList(uint64_t epoch) NL_EXCLUDES(epoch_mu);
  bool WaitForSlot(uint64_t g) NL_EXCLUDES(mu);
  void FillSample(Worker& w, uint64_t g, uint32_t j);
  void PrefetchSoon(Worker& w, uint64_t epoch, uint64_t p);
  Status LoadWithReplacements(Worker& w, uint64_t epoch, uint64_t pos, uint64_t window,
                              const BatchBuffer& buf, uint32_t j, uint64_t attempts);
  void FinishSample(uint64_t g, uint32_t j, const Status& err, uint64_t attempts)
      NL_EXCLUDES(mu);
  void AskWindow(uint64_t w) NL_REQUIRES(ahead_mu);
  void ReadAhead(uint64_t epoch, uint64_t pos) NL_EXCLUDES(ahead_mu);
  Status LoadSample(SamplePath& path, WorkerStats& ws, uint64_t epoch, uint64_t index, uint8_t* dst,
                    int64_t* label, std::span<const uint8_t> staged);
  void WriteMeta(uint64_t g);
};

}  // namespace nl
