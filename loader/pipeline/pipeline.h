// A rank's loader: reads its share of a shard set, decodes, transforms and
// fills whole batches on a pool of threads, delivered strictly in order.
//
//   PipelineConfig c;  c.data_dir = "/data/c100";  c.batch_size = 64;  c.threads = 8;
//   c.thread_start = LoaderThreadStartHook(topo, plan.ranks[r], r, nullptr);
//   NL_ASSIGN_OR_RETURN(auto p, Pipeline::Open(c));
//   while (true) {
//     Result<BatchView> b = p->Next();          // OutOfRange at the end of the run
//     if (!b.ok()) break;
//     Train(b->pixels, b->labels, b->size);
//     NL_RETURN_IF_ERROR(p->Release(*b));       // the buffer goes back to the pool
//   }
//
// At most `prefetch` batches are in flight (back-pressure when the consumer
// is slow). Each sample is read by key from the shard set (opened once per
// process, one LMDB read transaction per worker), decoded and transformed by
// the worker that writes it straight into its batch buffer (SamplePath).
//
// The consumer's contract:
// - One consumer thread at a time calls Next() and Release() (they may be
//   different threads, one after the other, e.g. a training loop handing
//   over); Next() entered while another Next() is in progress returns
//   FailedPrecondition instead of handing the same batch out twice.
// - Batch g (0, 1, ... over the run, BatchView::sequence) is written into
//   buffer g % prefetch of the BufferSource, and only after batch
//   g - prefetch has been released. A BufferSource must therefore give at
//   least `prefetch` buffers, each at a fixed address for the pipeline's
//   life, and must outlive the pipeline. Each buffer's meta block receives
//   the batch's sequence, epoch, batch number and size before Next()
//   delivers it (what a ring slot carries).
// - A BatchView's pointers are valid until that batch is released; after
//   Release() the workers may overwrite them at once. Releasing a batch that
//   is not out (twice, never delivered, a stale view) is an InvalidArgument
//   error and changes nothing. Batches may be released in any order, but
//   batch g is delivered only after batch g - prefetch was released (it
//   reuses that buffer): Next() then returns FailedPrecondition naming the
//   batch to release, rather than waiting for its own caller.
// - Buffers come from a BufferSource: heap memory by default (first touched
//   by the bound workers, so its pages land on their NUMA node: each
//   worker's start hook runs before it writes any buffer page), or the
//   caller's (the shared-memory ring).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "formats/image.h"
#include "formats/manifest.h"
#include "formats/shard_files.h"
#include "loader/pipeline/sampler.h"
#include "loader/pipeline/transforms.h"

namespace nl {

// What a batch is, written beside its pixels (a ring slot carries it across
// processes, so it is plain data).
struct BatchMeta {
  uint64_t sequence = 0;  // 0, 1, ... over the run
  uint64_t epoch = 0, batch = 0;
  uint32_t size = 0;  // samples in this batch
  uint32_t reserved = 0;
};

// Where one batch lives: fixed addresses for the whole run.
struct BatchBuffer {
  uint8_t* pixels = nullptr;   // batch_size * sample_bytes
  int64_t* labels = nullptr;   // batch_size
  int64_t* indices = nullptr;  // batch_size
  BatchMeta* meta = nullptr;   // written by the pipeline before delivery; may be null
};

class BufferSource {
 public:
  virtual ~BufferSource() = default;
  virtual size_t count() const = 0;
  virtual BatchBuffer buffer(size_t i) const = 0;
};

// `count` heap buffers, allocated once and never written here (so the first
// writer, a bound worker, places their pages).
class HeapBuffers : public BufferSource {
 public:
  static Result<std::unique_ptr<HeapBuffers>> Create(size_t count, uint32_t batch_size,
                                                     size_t sample_bytes);
  size_t count() const override { return buffers_.size(); }
  BatchBuffer buffer(size_t i) const override { return buffers_[i]; }
  size_t bytes_per_buffer() const { return bytes_; }

 private:
  HeapBuffers() = default;
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  std::vector<std::unique_ptr<void, Free>> memory_;
  std::vector<BatchBuffer> buffers_;
  size_t bytes_ = 0;
};

// Batches in flight one pipeline may be asked for.
inline constexpr uint32_t kMaxPrefetch = 1024;

// ResourceExhausted when `count` buffers of a batch would take more than half
// of this machine's memory (the pipeline's own buffers, a service's ring).
Status CheckBufferMemory(uint32_t count, uint32_t batch_size, size_t sample_bytes);

enum class OnBadRecord { kError, kSkip };
Result<OnBadRecord> ParseOnBadRecord(const std::string& s);

// --order: random (DistributedSampler's permutation), blocks (runs of
// consecutive records, for data bigger than memory; sampler.h), or auto:
// random when the split fits in half the memory this process may use
// (cgroup limits included), blocks otherwise.
enum class OrderChoice { kAuto, kRandom, kBlocks };
Result<OrderChoice> ParseOrder(const std::string& s);
const char* OrderChoiceName(OrderChoice o);
// Blocks a shuffle window holds: enough that a batch of a class-sorted split
// mixes labels as random order's does (sampler_test measures it).
inline constexpr uint64_t kWindowBlocks = 512;

struct PipelineConfig {
  std::string data_dir;
  std::string split = "train";
  int rank = 0, world = 1;
  uint32_t batch_size = 64;
  uint32_t threads = 1;   // 1..WorkerPool::kMaxThreads
  uint32_t prefetch = 4;  // batches in flight, 1..kMaxPrefetch; also the number of buffers
  uint64_t seed = 0;
  bool shuffle = true;
  bool drop_last = false;        // sampler: trim instead of pad
  bool drop_last_batch = false;  // drop each epoch's last partial batch
  uint64_t start_epoch = 0, start_batch = 0;
  uint64_t epochs = 1;  // 0: until stopped
  OrderChoice order = OrderChoice::kAuto;
  // Bytes of records the loader may read ahead (two windows of the order:
  // asked of the kernel, or, in blocks order on a split that does not fit,
  // read into the loader's memory); unset: an eighth of the memory this
  // process may use, 4 MiB (at most half of it) to 1 GiB; 0: no read-ahead.
  // Read into memory, more than half of the memory this process may use is
  // refused.
  std::optional<uint64_t> io_memory;
  // The memory this process may use, which the order and the read-ahead are
  // planned with; unset: MemoryAvailableToProcess() (the machine's, or a
  // cgroup's limit). An application sharing the memory with others (or a
  // test making a small split "not fit") sets it lower.
  std::optional<uint64_t> memory_bytes;
  TransformConfig transform;
  OnBadRecord on_bad_record = OnBadRecord::kError;
  DecodeLimits limits;
  // Called first on each worker thread with its index (binding, naming),
  // before the worker touches any buffer. An exception from it stops the
  // pipeline with an error (Next() returns it).
  std::function<void(int worker)> thread_start;
  // Optional: where batches live (at least `prefetch` buffers). Not owned.
  const BufferSource* buffers = nullptr;
  // Optional: where the split's shard files come from (ShardFiles::Local()
  // when null). Not owned; used by Open only.
  const ShardFiles* shard_files = nullptr;
};

// How a pipeline reads its split: the order, its blocks and windows, and
// how far it reads ahead; decided once at open from the config, the split's
// size and the memory this process may use.
struct ReadPlan {
  SampleOrder order = SampleOrder::kRandom;
  uint64_t block_samples = 1, window_blocks = 1;
  // Read ahead this many positions of the rank's list at a time (the current
  // window and the next are asked for); 0: no read-ahead.
  uint64_t ahead_samples = 0;
  uint64_t io_memory = 0;  // bytes two windows of records take, about
  // Records read with pread (SplitReader::ReadTxn::CopyOf) rather than
  // through the map where the split is read from disk (read-ahead on): a
  // mapped page evicted and read again is a page fault each time. A split
  // in memory stays mapped: one fault per 64 KiB of it per process (the
  // kernel maps the pages around a fault), then none, where pread costs a
  // system call per record every epoch.
  bool pread_records = false;
  // Blocks order on a split that does not fit in memory reads ahead by
  // reading each window into memory on a reader thread of its own
  // (WindowStager), a request per block, bypassing the page cache (`direct`).
  bool staged = false, direct = false;
  std::string summary;  // one line: which order and why
};
ReadPlan PlanReading(const PipelineConfig& c, uint64_t samples, uint64_t split_bytes,
                     uint64_t memory_bytes, const std::string& memory_source);
// The plan Pipeline::Open makes for c on the shard set of manifest m (its
// split's size, and the memory this process may use): for a caller that
// must know the order before a pipeline opens (a resume's check).
Result<ReadPlan> PlanReadingFor(const PipelineConfig& c, const Manifest& m);
// What of a plan shapes an epoch's sequence of samples (with the sampler's
// config): "random", or "blocks of K samples, W a window". A run resumed
// with another gives another sequence (samples trained twice, others never).
// (The window is capped at a rank's share, so the same sequence reads the
// same here whatever memory planned it.)
std::string SequenceOf(const ReadPlan& p);

// The sampler a pipeline with this config uses, over a split of
// `dataset_size` samples: the one place a SamplerConfig is made from a
// PipelineConfig (the pipeline, the service, preview, the trainer's batch
// count: BatchesPerEpoch(SamplerConfigFor(c, n)); the counts do not depend
// on the order).
inline SamplerConfig SamplerConfigFor(const PipelineConfig& c, uint64_t dataset_size,
                                      const ReadPlan& plan = {}) {
  SamplerConfig s;
  s.dataset_size = dataset_size;
  s.rank = c.rank;
  s.world = c.world;
  s.seed = c.seed;
  s.shuffle = c.shuffle;
  s.drop_last = c.drop_last;
  s.batch_size = c.batch_size;
  s.drop_last_batch = c.drop_last_batch;
  s.order = plan.order;
  s.block_samples = plan.block_samples;
  s.window_blocks = plan.window_blocks;
  return s;
}

struct BatchView {
  uint64_t sequence = 0;  // 0, 1, ... over the run
  uint64_t epoch = 0, batch = 0;
  uint32_t size = 0;  // samples in this batch
  uint8_t* pixels = nullptr;
  const int64_t* labels = nullptr;
  const int64_t* indices = nullptr;
  size_t buffer = 0;  // which buffer of the source
};

struct PipelineStats {
  uint64_t images = 0, batches = 0, skipped = 0;
  double read_s = 0, decode_s = 0, transform_s = 0;  // summed over workers
  double wait_s = 0;                                 // consumer time blocked in Next()
  double elapsed_s = 0;
  uint64_t ahead_bytes = 0;       // asked of the kernel to read ahead
  double mean_ready = 0;          // batches ready when Next() was called
  bool consumer_waiting = false;  // a Next() call is waiting for its batch now
  double images_per_s() const { return elapsed_s > 0 ? images / elapsed_s : 0; }
};

class Pipeline {
 public:
  static Result<std::unique_ptr<Pipeline>> Open(const PipelineConfig& config);
  ~Pipeline();  // stops the workers (batches in flight are dropped) and joins them
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  // The next batch, in order. OutOfRange at the end of the run; a bad record
  // (default mode) or a worker's failure is an error naming what and where,
  // after which the pipeline is stopped. FailedPrecondition when another
  // Next() is in progress or every buffer is held; see the contract above.
  Result<BatchView> Next();
  // Gives a delivered batch's buffer back (see the contract above).
  Status Release(const BatchView& view);

  PipelineStats Stats() const;
  const DistributedSampler& sampler() const;
  const ReadPlan& read_plan() const;
  size_t sample_bytes() const;
  uint64_t total_batches() const;  // in this run; 0: unbounded

  struct Impl;

 private:
  explicit Pipeline(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace nl
