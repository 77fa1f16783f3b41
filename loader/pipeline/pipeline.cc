#include "loader/pipeline/pipeline.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>

#include "base/memory.h"
#include "base/worker_pool.h"
#include "formats/manifest.h"
#include "formats/shard.h"
#include "loader/pipeline/sample_path.h"
#include "loader/pipeline/window_stager.h"

namespace nl {

namespace {
using Clock = std::chrono::steady_clock;
size_t RoundUp(size_t n, size_t a) { return (n + a - 1) / a * a; }
// Epoch index lists kept: batches in flight usually span the current epoch,
// the one before (slow workers) and the next (prefetch across the boundary);
// with more batches in flight than an epoch has, an evicted list is simply
// computed again.
constexpr size_t kCachedEpochs = 3;
// With --on-bad-record skip, a bad sample is replaced by the next one of the
// rank's list; this many bad replacements in a row mean a broken split, and
// the run stops instead of decoding the whole list first.
constexpr uint64_t kMaxReplacements = 64;
}  // namespace

Result<std::unique_ptr<HeapBuffers>> HeapBuffers::Create(size_t count, uint32_t batch_size,
                                                         size_t sample_bytes) {
  std::unique_ptr<HeapBuffers> hb(new HeapBuffers());
  const size_t pixels = RoundUp(batch_size * sample_bytes, 4096);
  const size_t meta = RoundUp(batch_size * sizeof(int64_t), 64);
  hb->bytes_ = pixels + 2 * meta + RoundUp(sizeof(BatchMeta), 64);
  // Huge pages where the kernel offers them (fewer TLB misses while workers
  // write 150 KB per sample); 2 MiB alignment lets it use them.
  constexpr size_t kHuge = size_t{2} << 20;
  const size_t align = hb->bytes_ >= kHuge ? kHuge : 4096;
  const size_t size = RoundUp(hb->bytes_, align);
  for (size_t i = 0; i < count; ++i) {
    // Not touched here: the workers' first writes place the pages.
    void* p = std::aligned_alloc(align, size);
    if (!p) {
      return Status::ResourceExhausted(
          "cannot allocate batch buffer " + std::to_string(i + 1) + " of " + std::to_string(count) +
          " (" + std::to_string(size) +
          " bytes each; lower --prefetch, --batch-size or --image-size)");
    }
    if (align == kHuge) (void)madvise(p, size, MADV_HUGEPAGE);
    auto* base = static_cast<uint8_t*>(p);
    hb->memory_.emplace_back(p);
    hb->buffers_.push_back({base, reinterpret_cast<int64_t*>(base + pixels),
                            reinterpret_cast<int64_t*>(base + pixels + meta),
                            reinterpret_cast<BatchMeta*>(base + pixels + 2 * meta)});
  }
  return hb;
}

Result<OrderChoice> ParseOrder(const std::string& s) {
  if (s == "auto") return OrderChoice::kAuto;
  if (s == "random") return OrderChoice::kRandom;
  if (s == "blocks") return OrderChoice::kBlocks;
  return Status::InvalidArgument("unknown --order '" + s + "' (use random, blocks or auto)");
}

const char* OrderChoiceName(OrderChoice o) {
  switch (o) {
    case OrderChoice::kRandom:
      return "random";
    case OrderChoice::kBlocks:
      return "blocks";
    case OrderChoice::kAuto:
      break;
  }
  return "auto";
}

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
      why = "--order random";
      break;
    case OrderChoice::kBlocks:
      p.order = SampleOrder::kBlocks;
      why = "--order blocks";
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
  p.summary += ahead ? "; read-ahead " + FormatBytes(p.io_memory) + " (--io-memory)"
                     : std::string("; no read-ahead") +
                           (p.io_memory == 0 ? " (--io-memory 0)" : " (the split fits in memory)");
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

namespace {
uint64_t SplitBytes(const SplitInfo& split) {
  uint64_t bytes = 0;
  for (const ShardInfo& sh : split.shards) bytes += sh.bytes;
  return bytes;
}

MemoryLimit MemoryFor(const PipelineConfig& c) {
  return c.memory_bytes ? MemoryLimit{*c.memory_bytes, "PipelineConfig::memory_bytes"} : MemoryAvailableToProcess();
}
}  // namespace

Result<ReadPlan> PlanReadingFor(const PipelineConfig& c, const Manifest& m) {
  const SplitInfo* split = m.FindSplit(c.split);
  if (!split) return Status::NotFound("the shard set has no split '" + c.split + "'");
  const MemoryLimit mem = MemoryFor(c);
  return PlanReading(c, split->num_samples, SplitBytes(*split), mem.bytes, mem.source);
}

Result<OnBadRecord> ParseOnBadRecord(const std::string& s) {
  if (s == "error") return OnBadRecord::kError;
  if (s == "skip") return OnBadRecord::kSkip;
  return Status::InvalidArgument("unknown --on-bad-record '" + s + "' (use error or skip)");
}

struct Pipeline::Impl {
  struct Slot {
    std::atomic<uint64_t> seq{UINT64_MAX};  // the batch this buffer is assigned to
    std::atomic<uint32_t> remaining{0};     // samples still to write
    bool ready = false;                     // guarded by mu
    bool delivered = false;                 // guarded by mu: handed out by Next(), not yet released
    uint32_t error_at = UINT32_MAX;         // guarded by mu: first failing sample
    Status error;                           // guarded by mu
  };
  struct alignas(64) WorkerStats {
    std::atomic<uint64_t> read_ns{0}, decode_ns{0}, transform_ns{0}, images{0}, skipped{0};
  };

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

  std::mutex mu;
  std::condition_variable work_cv, ready_cv;
  std::atomic<bool> stop{false};
  uint64_t next_deliver = 0;  // guarded by mu
  uint32_t held = 0;          // guarded by mu: delivered, not released
  Status failure;             // guarded by mu
  std::atomic<uint64_t> next_sample{0};

  std::mutex epoch_mu;
  std::map<uint64_t, std::shared_ptr<const std::vector<uint64_t>>> epoch_lists;

  // Read-ahead (plan.ahead_samples > 0): positions of the rank's list in
  // windows of that many; a worker starting a sample of window G makes sure
  // windows G and G + 1 (counted over the run) were asked for.
  std::mutex ahead_mu;                  // one worker asks at a time
  std::atomic<uint64_t> ahead_next{0};  // the first window not yet asked for
  std::atomic<uint64_t> ahead_bytes{0};
  uint64_t windows_per_epoch = 1;
  std::optional<SplitReader::ReadTxn> ahead_txn;  // guarded by ahead_mu
  // Blocks order (plan.staged): windows read into memory on a thread of its
  // own instead; window w of the run as AskWindow counts them.
  std::unique_ptr<WindowStager> stager;
  uint64_t processed_per_epoch = 0;  // positions of an epoch's list that batches take

  // The run's window w for the stager: its positions that batches take
  // (from the run's first one on) and their records.
  WindowStager::Window StagerWindow(uint64_t w) {
    WindowStager::Window win;
    const uint64_t e = w / windows_per_epoch;
    if (c.epochs && e >= c.epochs) {
      win.end = true;
      return win;
    }
    const uint64_t first = (w % windows_per_epoch) * plan.ahead_samples;
    const uint64_t lo = std::max(first, e == 0 ? c.start_batch * c.batch_size : 0);
    const uint64_t hi = std::min(first + plan.ahead_samples, processed_per_epoch);
    if (lo >= hi) return win;
    std::shared_ptr<const std::vector<uint64_t>> list = EpochList(c.start_epoch + e);
    win.indices.assign(list->begin() + lo, list->begin() + hi);
    win.positions = hi - lo;
    return win;
  }

  std::vector<std::unique_ptr<WorkerStats>> wstats;
  double wait_s = 0, ready_sum = 0;  // guarded by mu
  uint64_t delivered = 0;            // guarded by mu
  Clock::time_point start = Clock::now();
  bool in_next = false;  // guarded by mu: a consumer is inside Next()
  std::unique_ptr<WorkerPool> pool;

  std::pair<uint64_t, uint64_t> EpochBatch(uint64_t g) const {
    const uint64_t pos = c.start_batch + g;
    return {c.start_epoch + pos / bpe, pos % bpe};
  }
  uint32_t LengthOf(uint64_t g) const { return sampler->BatchLength(EpochBatch(g).second); }

  std::shared_ptr<const std::vector<uint64_t>> EpochList(uint64_t epoch) {
    std::lock_guard lock(epoch_mu);
    auto it = epoch_lists.find(epoch);
    if (it != epoch_lists.end()) return it->second;
    auto list = std::make_shared<const std::vector<uint64_t>>(sampler->EpochIndices(epoch));
    epoch_lists[epoch] = list;
    while (epoch_lists.size() > kCachedEpochs) epoch_lists.erase(epoch_lists.begin());
    return list;
  }

  // Must hold mu. Points slot g % depth at batch g (or at nothing past the end).
  void Assign(uint64_t g) {
    Slot& s = slots[g % depth];
    s.ready = false;
    s.delivered = false;
    s.error_at = UINT32_MAX;
    s.error = Status::Ok();
    if (total && g >= total) {
      s.seq.store(UINT64_MAX, std::memory_order_release);
      return;
    }
    s.remaining.store(LengthOf(g), std::memory_order_relaxed);
    s.seq.store(g, std::memory_order_release);
  }

  // Asks for window `w` of the run (window w % windows_per_epoch of epoch
  // start_epoch + w / windows_per_epoch): its records, in index order, so
  // that runs of consecutive records become single requests.
  void AskWindow(uint64_t w) {
    const uint64_t epoch = c.start_epoch + w / windows_per_epoch;
    const uint64_t first = (w % windows_per_epoch) * plan.ahead_samples;
    std::shared_ptr<const std::vector<uint64_t>> list = EpochList(epoch);
    if (first >= list->size()) return;
    const uint64_t end = std::min<uint64_t>(list->size(), first + plan.ahead_samples);
    std::vector<uint64_t> idx(list->begin() + first, list->begin() + end);
    std::sort(idx.begin(), idx.end());
    idx.erase(std::unique(idx.begin(), idx.end()), idx.end());
    if (!ahead_txn) ahead_txn.emplace(reader->BeginRead());
    ahead_bytes.fetch_add(ahead_txn->WillNeed(idx), std::memory_order_relaxed);
  }

  // Called before a worker reads position `pos` of epoch `epoch`'s list.
  void ReadAhead(uint64_t epoch, uint64_t pos) {
    const uint64_t want =
        (epoch - c.start_epoch) * windows_per_epoch + pos / plan.ahead_samples + 2;
    if (ahead_next.load(std::memory_order_acquire) >= want) return;
    std::unique_lock lock(ahead_mu, std::try_to_lock);
    if (!lock.owns_lock()) return;  // another worker is asking; the next sample checks again
    uint64_t w = ahead_next.load(std::memory_order_relaxed);
    // Windows already passed (a resumed run, a slow start) are not asked for.
    w = std::max(w, want - 2);
    for (; w < want && !stop.load(std::memory_order_relaxed); ++w) AskWindow(w);
    ahead_next.store(w, std::memory_order_release);
  }

  // One sample into its slot; the time of each step goes to this worker's stats.
  Status LoadSample(SamplePath& path, WorkerStats& ws, uint64_t epoch, uint64_t index, uint8_t* dst,
                    int64_t* label, std::span<const uint8_t> staged) {
    SampleTimes t;
    NL_RETURN_IF_ERROR(path.Load(epoch, index, dst, label, &t, staged));
    ws.read_ns.fetch_add(t.read_ns, std::memory_order_relaxed);
    ws.decode_ns.fetch_add(t.decode_ns, std::memory_order_relaxed);
    ws.transform_ns.fetch_add(t.transform_ns, std::memory_order_relaxed);
    return Status::Ok();
  }

  // A worker's failure (an exception, a thread that could not start) stops
  // the run; Next() returns it.
  void Fail(const Status& st) {
    {
      std::lock_guard lock(mu);
      if (failure.ok()) failure = st;
      stop = true;
    }
    if (stager) stager->Stop();
    work_cv.notify_all();
    ready_cv.notify_all();
  }

  // The last worker to finish batch g describes it in its buffer.
  void WriteMeta(uint64_t g) {
    BatchMeta* meta = buffers->buffer(g % depth).meta;
    if (!meta) return;
    const auto [epoch, b] = EpochBatch(g);
    *meta = BatchMeta{g, epoch, b, LengthOf(g), 0};
  }

  Status RunWorker(int id) {
    SamplePath path(*reader, c.transform, c.limits, plan.pread_records);
    WorkerStats& ws = *wstats[id];
    const uint32_t bsz = c.batch_size;
    // This worker's copy of the current epoch's list: the shared cache (and
    // its lock) is consulted only when the epoch changes. (Every epoch number
    // is valid, 2^64 - 1 too: no number stands for "none yet".)
    uint64_t list_epoch = 0;
    std::shared_ptr<const std::vector<uint64_t>> list;
    while (!stop.load(std::memory_order_relaxed)) {
      const uint64_t s = next_sample.fetch_add(1, std::memory_order_relaxed);
      const uint64_t g = s / bsz;
      const uint32_t j = static_cast<uint32_t>(s % bsz);
      if (total && g >= total) return Status::Ok();
      // Claims past the end of a short batch carry no work. They must not wait
      // for the slot: the batch may already be delivered and its slot reused.
      if (j >= LengthOf(g)) continue;
      Slot& slot = slots[g % depth];
      if (slot.seq.load(std::memory_order_acquire) != g) {
        std::unique_lock lock(mu);
        work_cv.wait(lock,
                     [&] { return stop.load() || slot.seq.load(std::memory_order_acquire) == g; });
        if (stop.load()) return Status::Ok();
      }
      const auto [epoch, b] = EpochBatch(g);
      if (list == nullptr || epoch != list_epoch) {
        list = EpochList(epoch);
        list_epoch = epoch;
      }
      if (plan.ahead_samples && !stager) ReadAhead(epoch, b * bsz + j);
      // The window this position lies in, for the stager.
      const uint64_t window =
          stager ? (epoch - c.start_epoch) * windows_per_epoch + (b * bsz + j) / plan.ahead_samples
                 : 0;
      const BatchBuffer buf = buffers->buffer(g % depth);
      uint8_t* dst = buf.pixels + j * sample_bytes;
      const uint64_t n = list->size();
      const uint64_t attempts = std::min<uint64_t>(n, kMaxReplacements + 1);
      // Samples this worker is likely to take in two and eight turns (the
      // workers take positions in turn), within this epoch's list: the
      // record's bytes of the first, where the second lies (records read
      // through the map, or in the reader thread's windows; a record read
      // with pread lands in the worker's buffer, nothing to prefetch). On a split of
      // 1,000,000 records in the page cache this took a core's read stage
      // from ~2.5 s to ~1.0 s an epoch (the 50,000-record split's: ~1.4 s
      // to ~0.65 s; docs/BENCHMARKS.md, "How cost grows").
      if (const uint64_t p = b * bsz + j; p + 8 * c.threads < n) {
        const uint64_t soon = p + 2 * c.threads;
        if (stager) {
          const uint64_t w = (epoch - c.start_epoch) * windows_per_epoch + soon / plan.ahead_samples;
          SamplePath::Prefetch(stager->Peek(w, (*list)[soon]));
        } else {
          path.Prefetch((*list)[soon], (*list)[p + 8 * c.threads]);
        }
      }
      Status err;
      for (uint64_t attempt = 0; attempt < attempts; ++attempt) {
        const uint64_t index = (*list)[(b * bsz + j + attempt) % n];
        int64_t label = 0;
        // A replacement (--on-bad-record skip) is read here: it may lie in
        // another window.
        const std::span<const uint8_t> staged =
            stager && attempt == 0 ? stager->Find(window, index) : std::span<const uint8_t>();
        Status st = LoadSample(path, ws, epoch, index, dst, &label, staged);
        if (st.ok()) {
          buf.labels[j] = label;
          buf.indices[j] = static_cast<int64_t>(index);
          ws.images.fetch_add(1, std::memory_order_relaxed);
          err = Status::Ok();
          break;
        }
        err = st;
        if (c.on_bad_record == OnBadRecord::kError) break;
        ws.skipped.fetch_add(1, std::memory_order_relaxed);  // replaced by the next sample
      }
      if (stager) stager->Done(window);
      if (!err.ok()) {
        std::lock_guard lock(mu);
        if (j < slot.error_at) {
          slot.error_at = j;
          slot.error =
              c.on_bad_record == OnBadRecord::kSkip
                  ? err.WithContext(std::to_string(attempts) + " samples in a row of rank " +
                                    std::to_string(c.rank) + "'s list failed (the last one)")
                  : err;
        }
      }
      if (slot.remaining.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        WriteMeta(g);
        {
          std::lock_guard lock(mu);
          slot.ready = true;
        }
        ready_cv.notify_all();
      }
    }
    return Status::Ok();
  }
};

namespace {

Status CheckCounts(const PipelineConfig& c) {
  if (c.threads < 1 || c.threads > WorkerPool::kMaxThreads) {
    return Status::InvalidArgument("loader threads must be 1.." +
                                   std::to_string(WorkerPool::kMaxThreads) + " (asked for " +
                                   std::to_string(c.threads) + ")");
  }
  if (c.prefetch < 1 || c.prefetch > kMaxPrefetch) {
    return Status::InvalidArgument("--prefetch must be 1.." + std::to_string(kMaxPrefetch) +
                                   " (asked for " + std::to_string(c.prefetch) + ")");
  }
  if (c.batch_size < 1) return Status::InvalidArgument("--batch-size must be at least 1");
  return Status::Ok();
}

// The batch buffers must fit in this machine's memory (checked before
// anything is allocated, so an absurd request is an error, not a swap storm).
}  // namespace

Status CheckBufferMemory(uint32_t count, uint32_t batch_size, size_t sample_bytes) {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return Status::Ok();
  const double want = static_cast<double>(count) * batch_size * sample_bytes;
  const double have = static_cast<double>(pages) * static_cast<double>(page);
  if (want <= have / 2) return Status::Ok();
  char msg[256];
  std::snprintf(msg, sizeof msg,
                "%u batch buffers of %u samples x %zu bytes need %.1f GiB, more than half of "
                "this machine's %.1f GiB: lower --prefetch, --batch-size or --image-size",
                count, batch_size, sample_bytes, want / (1ull << 30), have / (1ull << 30));
  return Status::ResourceExhausted(msg);
}

Pipeline::Pipeline(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Pipeline::~Pipeline() {
  {
    std::lock_guard lock(impl_->mu);
    impl_->stop = true;
  }
  impl_->work_cv.notify_all();
  impl_->ready_cv.notify_all();
  if (impl_->stager) impl_->stager->Stop();  // a worker waiting for a window goes on
  impl_->pool.reset();                        // joins
}

Result<std::unique_ptr<Pipeline>> Pipeline::Open(const PipelineConfig& config) {
  auto impl = std::make_unique<Impl>();
  Impl& m = *impl;
  m.c = config;
  m.c.transform.seed = config.seed;
  NL_RETURN_IF_ERROR(CheckCounts(config));
  NL_ASSIGN_OR_RETURN(m.manifest, LoadManifest(config.data_dir));
  NL_ASSIGN_OR_RETURN(m.reader, SplitReader::Open(config.data_dir, m.manifest, config.split,
                                                  config.shard_files != nullptr
                                                      ? *config.shard_files
                                                      : ShardFiles::Local()));
  const MemoryLimit mem = MemoryFor(config);
  m.plan = PlanReading(config, m.reader->size(), SplitBytes(*m.manifest.FindSplit(config.split)), mem.bytes,
                       mem.source);
  NL_ASSIGN_OR_RETURN(DistributedSampler sampler, DistributedSampler::Create(SamplerConfigFor(
                                                      config, m.reader->size(), m.plan)));
  m.sampler.emplace(sampler);
  if (m.plan.ahead_samples) {
    const uint64_t per = sampler.samples_per_rank();
    m.windows_per_epoch = std::max<uint64_t>(
        1, per / m.plan.ahead_samples + (per % m.plan.ahead_samples != 0 ? 1 : 0));
  }
  m.bpe = sampler.batches_per_epoch();
  if (m.plan.staged && mem.bytes > 0 && m.plan.io_memory > mem.bytes / 2) {
    return Status::ResourceExhausted(
        "--io-memory " + FormatBytes(m.plan.io_memory) +
        " is more than half of the " + FormatBytes(mem.bytes) + " this process may use (" +
        mem.source + "): blocks order holds that much of the split in its memory");
  }
  if (config.start_batch >= m.bpe) {
    return Status::InvalidArgument("start batch " + std::to_string(config.start_batch) +
                                   " is past the " + std::to_string(m.bpe) +
                                   " batches of an epoch");
  }
  if (config.epochs > UINT64_MAX / m.bpe) {
    return Status::InvalidArgument(std::to_string(config.epochs) + " epochs of " +
                                   std::to_string(m.bpe) + " batches overflow the batch count");
  }
  // Epoch numbers end at 2^64 - 1: a run never wraps to epoch 0. Without an
  // epoch count it ends after that epoch (where the batch count can hold
  // the run; else it is longer than any run lasts).
  const uint64_t last_epochs = UINT64_MAX - config.start_epoch;  // epochs after the first
  if (config.epochs && config.epochs - 1 > last_epochs) {
    return Status::InvalidArgument(std::to_string(config.epochs) + " epochs from epoch " +
                                   std::to_string(config.start_epoch) +
                                   " go past the last epoch number, 2^64 - 1");
  }
  const uint64_t epochs = config.epochs ? config.epochs
                          : last_epochs < UINT64_MAX / m.bpe ? last_epochs + 1
                                                              : 0;
  m.total = epochs ? epochs * m.bpe - config.start_batch : 0;
  m.sample_bytes = SampleTransform(m.c.transform).SampleBytes();
  m.depth = config.prefetch;
  if (!config.buffers) {
    NL_RETURN_IF_ERROR(CheckBufferMemory(m.depth, config.batch_size, m.sample_bytes));
  }
  if (config.buffers) {
    if (config.buffers->count() < m.depth) {
      return Status::InvalidArgument("the buffer source has " +
                                     std::to_string(config.buffers->count()) +
                                     " buffers for a prefetch of " + std::to_string(m.depth));
    }
    m.buffers = config.buffers;
  } else {
    NL_ASSIGN_OR_RETURN(m.own_buffers,
                        HeapBuffers::Create(m.depth, config.batch_size, m.sample_bytes));
    m.buffers = m.own_buffers.get();
  }
  m.slots.reset(new Impl::Slot[m.depth]);
  {
    std::lock_guard lock(m.mu);
    for (uint64_t g = 0; g < m.depth; ++g) m.Assign(g);
  }
  for (uint32_t i = 0; i < config.threads; ++i)
    m.wstats.push_back(std::make_unique<Impl::WorkerStats>());
  if (m.plan.staged && m.bpe > 0) {
    m.processed_per_epoch = (m.bpe - 1) * config.batch_size + sampler.BatchLength(m.bpe - 1);
    const uint64_t first = config.start_batch * config.batch_size / m.plan.ahead_samples;
    Impl* self = impl.get();
    m.stager = std::make_unique<WindowStager>(
        *m.reader, m.plan.direct, m.plan.io_memory / 2, first,
        [self](uint64_t w) { return self->StagerWindow(w); });
  }
  m.start = Clock::now();
  Impl* raw = impl.get();
  WorkerPool::Options po;
  po.threads = config.threads;
  po.name = "loader worker";
  po.on_start = config.thread_start;
  po.on_error = [raw](const Status& st) { raw->Fail(st); };
  NL_ASSIGN_OR_RETURN(m.pool, WorkerPool::Start(po, [raw](int w) { return raw->RunWorker(w); }));
  return std::unique_ptr<Pipeline>(new Pipeline(std::move(impl)));
}

Result<BatchView> Pipeline::Next() {
  Impl& m = *impl_;
  std::unique_lock lock(m.mu);
  if (m.in_next) {
    return Status::FailedPrecondition(
        "Next() called while another Next() is waiting: one consumer thread at a time");
  }
  if (!m.failure.ok()) return m.failure;
  if (m.total && m.next_deliver >= m.total) {
    // Every batch is out: the workers have nothing left to do. Join them, so
    // that a worker that failed late (e.g. its start hook threw after the
    // others had done all the work) is reported rather than lost. in_next
    // keeps a second consumer out meanwhile.
    m.in_next = true;
    m.stop = true;
    lock.unlock();
    m.work_cv.notify_all();
    const Status workers = m.pool->Join();
    lock.lock();
    m.in_next = false;
    if (!workers.ok()) return workers;
    return Status::OutOfRange("end of the run (" + std::to_string(m.total) + " batches)");
  }
  if (m.held >= m.depth) {
    return Status::FailedPrecondition(
        "all " + std::to_string(m.depth) +
        " batch buffers are held by the consumer: Release() one before Next()");
  }
  const uint64_t g = m.next_deliver;
  Impl::Slot& slot = m.slots[g % m.depth];
  if (slot.delivered) {  // batch g - prefetch still holds the buffer batch g goes into
    return Status::FailedPrecondition(
        "batch " + std::to_string(g) + " goes into the buffer of batch " +
        std::to_string(g - m.depth) + ", which the consumer still holds: Release() it first");
  }
  for (uint32_t i = 0; i < m.depth; ++i) {  // filled and waiting (not held by the consumer)
    m.ready_sum += m.slots[i].ready && !m.slots[i].delivered ? 1 : 0;
  }
  const auto t0 = Clock::now();
  m.in_next = true;
  m.ready_cv.wait(lock, [&] {
    return m.stop.load() || (slot.seq.load(std::memory_order_acquire) == g && slot.ready);
  });
  m.in_next = false;
  m.wait_s += std::chrono::duration<double>(Clock::now() - t0).count();
  if (!m.failure.ok()) return m.failure;
  if (m.stop.load() && !(slot.seq.load() == g && slot.ready))
    return Status::Aborted("the loader was stopped");
  if (!slot.error.ok()) {
    m.failure = slot.error;
    m.stop = true;
    if (m.stager) m.stager->Stop();
    lock.unlock();
    m.work_cv.notify_all();
    return m.failure;
  }
  const auto [epoch, b] = m.EpochBatch(g);
  const BatchBuffer buf = m.buffers->buffer(g % m.depth);
  BatchView v;
  v.sequence = g;
  v.epoch = epoch;
  v.batch = b;
  v.size = m.LengthOf(g);
  v.pixels = buf.pixels;
  v.labels = buf.labels;
  v.indices = buf.indices;
  v.buffer = g % m.depth;
  slot.delivered = true;
  ++m.next_deliver;
  ++m.held;
  ++m.delivered;
  return v;
}

Status Pipeline::Release(const BatchView& view) {
  Impl& m = *impl_;
  {
    std::lock_guard lock(m.mu);
    // Only a batch that is out and not yet back frees its buffer: releasing
    // twice (or a stale view) must not hand the buffer to another batch while
    // workers may be writing it.
    Impl::Slot& slot = m.slots[view.sequence % m.depth];
    if (slot.seq.load(std::memory_order_relaxed) != view.sequence || !slot.delivered) {
      return Status::InvalidArgument("Release() of batch " + std::to_string(view.sequence) +
                                     ", which is not held (released twice, or never delivered)");
    }
    --m.held;
    m.Assign(view.sequence + m.depth);
  }
  m.work_cv.notify_all();
  return Status::Ok();
}

PipelineStats Pipeline::Stats() const {
  Impl& m = *impl_;
  PipelineStats s;
  for (const auto& w : m.wstats) {
    s.images += w->images.load();
    s.skipped += w->skipped.load();
    s.read_s += w->read_ns.load() * 1e-9;
    s.decode_s += w->decode_ns.load() * 1e-9;
    s.transform_s += w->transform_ns.load() * 1e-9;
  }
  std::lock_guard lock(m.mu);
  s.batches = m.delivered;
  s.ahead_bytes = m.ahead_bytes.load(std::memory_order_relaxed) +
                  (m.stager ? m.stager->staged_bytes() : 0);
  s.wait_s = m.wait_s;
  s.mean_ready = m.delivered ? m.ready_sum / m.delivered : 0;
  s.consumer_waiting = m.in_next;
  s.elapsed_s = std::chrono::duration<double>(Clock::now() - m.start).count();
  return s;
}

const DistributedSampler& Pipeline::sampler() const { return *impl_->sampler; }
const ReadPlan& Pipeline::read_plan() const { return impl_->plan; }
size_t Pipeline::sample_bytes() const { return impl_->sample_bytes; }
uint64_t Pipeline::total_batches() const { return impl_->total; }

}  // namespace nl
