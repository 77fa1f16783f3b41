#include "loader/pipeline/pipeline.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "base/memory.h"
#include "base/worker_pool.h"
#include "formats/manifest.h"
#include "formats/shard.h"
#include "loader/pipeline/pipeline_impl.h"
#include "loader/pipeline/window_stager.h"

namespace nl {

namespace {
using Clock = Pipeline::Impl::Clock;
size_t RoundUp(size_t n, size_t a) { return (n + a - 1) / a * a; }
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
          " bytes each; lower `prefetch`, `batch_size` or `image_size`)");
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
  return Status::InvalidArgument("unknown `order` '" + s + "' (use random, blocks or auto)");
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

Result<OnBadRecord> ParseOnBadRecord(const std::string& s) {
  if (s == "error") return OnBadRecord::kError;
  if (s == "skip") return OnBadRecord::kSkip;
  return Status::InvalidArgument("unknown `on_bad_record` '" + s + "' (use error or skip)");
}

void Pipeline::Impl::Assign(uint64_t g) {
  Slot& s = slots[g % depth];
  slot_states[g % depth] = SlotState();
  if (total && g >= total) {
    s.seq.store(UINT64_MAX, std::memory_order_release);
    return;
  }
  s.remaining.store(LengthOf(g), std::memory_order_relaxed);
  s.seq.store(g, std::memory_order_release);
}

namespace {

Status CheckCounts(const PipelineConfig& c) {
  if (c.threads < 1 || c.threads > WorkerPool::kMaxThreads) {
    return Status::InvalidArgument("loader threads must be 1.." +
                                   std::to_string(WorkerPool::kMaxThreads) + " (asked for " +
                                   std::to_string(c.threads) + ")");
  }
  if (c.prefetch < 1 || c.prefetch > kMaxPrefetch) {
    return Status::InvalidArgument("`prefetch` must be 1.." + std::to_string(kMaxPrefetch) +
                                   " (asked for " + std::to_string(c.prefetch) + ")");
  }
  if (c.batch_size < 1) return Status::InvalidArgument("`batch_size` must be at least 1");
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
                "this machine's %.1f GiB: lower `prefetch`, `batch_size` or `image_size`",
                count, batch_size, sample_bytes, want / (1ull << 30), have / (1ull << 30));
  return Status::ResourceExhausted(msg);
}

Pipeline::Pipeline(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Pipeline::~Pipeline() {
  {
    MutexLock lock(&impl_->mu);
    impl_->stop = true;
  }
  impl_->work_cv.NotifyAll();
  impl_->ready_cv.NotifyAll();
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
        "`io_memory` " + FormatBytes(m.plan.io_memory) +
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
    MutexLock lock(&m.mu);
    m.slot_states.resize(m.depth);
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
  MutexLock lock(&m.mu);
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
    lock.Unlock();
    m.work_cv.NotifyAll();
    const Status workers = m.pool->Join();
    lock.Lock();
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
  Impl::SlotState& state = m.slot_states[g % m.depth];
  if (state.delivered) {  // batch g - prefetch still holds the buffer batch g goes into
    return Status::FailedPrecondition(
        "batch " + std::to_string(g) + " goes into the buffer of batch " +
        std::to_string(g - m.depth) + ", which the consumer still holds: Release() it first");
  }
  for (uint32_t i = 0; i < m.depth; ++i) {  // filled and waiting (not held by the consumer)
    m.ready_sum += m.slot_states[i].ready && !m.slot_states[i].delivered ? 1 : 0;
  }
  const auto t0 = Clock::now();
  m.in_next = true;
  while (!(m.stop.load() || (slot.seq.load(std::memory_order_acquire) == g && state.ready))) {
    m.ready_cv.Wait(&m.mu);
  }
  m.in_next = false;
  m.wait_s += std::chrono::duration<double>(Clock::now() - t0).count();
  if (!m.failure.ok()) return m.failure;
  if (m.stop.load() && !(slot.seq.load() == g && state.ready))
    return Status::Aborted("the loader was stopped");
  if (!state.error.ok()) {
    m.failure = state.error;
    m.stop = true;
    if (m.stager) m.stager->Stop();
    const Status failure = m.failure;
    lock.Unlock();
    m.work_cv.NotifyAll();
    return failure;
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
  state.delivered = true;
  ++m.next_deliver;
  ++m.held;
  ++m.delivered;
  return v;
}

Status Pipeline::Release(const BatchView& view) {
  Impl& m = *impl_;
  {
    MutexLock lock(&m.mu);
    // Only a batch that is out and not yet back frees its buffer: releasing
    // twice (or a stale view) must not hand the buffer to another batch while
    // workers may be writing it.
    Impl::Slot& slot = m.slots[view.sequence % m.depth];
    if (slot.seq.load(std::memory_order_relaxed) != view.sequence ||
        !m.slot_states[view.sequence % m.depth].delivered) {
      return Status::InvalidArgument("Release() of batch " + std::to_string(view.sequence) +
                                     ", which is not held (released twice, or never delivered)");
    }
    --m.held;
    m.Assign(view.sequence + m.depth);
  }
  m.work_cv.NotifyAll();
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
  MutexLock lock(&m.mu);
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
