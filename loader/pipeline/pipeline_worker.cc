// The pipeline's workers: each claims positions of the run in turn, loads
// their samples (SamplePath) straight into the batch buffers, and marks a
// batch ready when its last sample is written; with the read-ahead (asked
// of the kernel) and the stager's windows they drive.
#include <algorithm>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "loader/pipeline/pipeline_impl.h"
#include "loader/pipeline/sample_path.h"

namespace nl {

namespace {
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

struct Pipeline::Impl::Worker {
  Worker(const Impl& m, int id)
      : path(*m.reader, m.c.transform, m.c.limits, m.plan.pread_records), stats(*m.wstats[id]) {}
  SamplePath path;
  WorkerStats& stats;
  // This worker's copy of the current epoch's list: the shared cache (and
  // its lock) is consulted only when the epoch changes. (Every epoch number
  // is valid, 2^64 - 1 too: no number stands for "none yet".)
  uint64_t list_epoch = 0;
  std::shared_ptr<const std::vector<uint64_t>> list;
};

Status Pipeline::Impl::RunWorker(int id) {
  Worker w(*this, id);
  const uint32_t bsz = c.batch_size;
  while (!stop.load(std::memory_order_relaxed)) {
    const uint64_t s = next_sample.fetch_add(1, std::memory_order_relaxed);
    const uint64_t g = s / bsz;
    const uint32_t j = static_cast<uint32_t>(s % bsz);
    if (total && g >= total) return Status::Ok();
    // Claims past the end of a short batch carry no work. They must not wait
    // for the slot: the batch may already be delivered and its slot reused.
    if (j >= LengthOf(g)) continue;
    if (!WaitForSlot(g)) return Status::Ok();
    FillSample(w, g, j);
  }
  return Status::Ok();
}

// Until slot g % depth is batch g's (its batch g - depth released); false
// when the run stopped first.
bool Pipeline::Impl::WaitForSlot(uint64_t g) {
  Slot& slot = slots[g % depth];
  if (slot.seq.load(std::memory_order_acquire) == g) return true;
  MutexLock lock(&mu);
  while (!(stop.load() || slot.seq.load(std::memory_order_acquire) == g)) work_cv.Wait(&mu);
  return !stop.load();
}

// Sample j of batch g into its place in the batch's buffer.
void Pipeline::Impl::FillSample(Worker& w, uint64_t g, uint32_t j) {
  const auto [epoch, b] = EpochBatch(g);
  if (w.list == nullptr || epoch != w.list_epoch) {
    w.list = EpochList(epoch);
    w.list_epoch = epoch;
  }
  const uint64_t pos = b * c.batch_size + j;  // in the epoch's list
  if (plan.ahead_samples && !stager) ReadAhead(epoch, pos);
  // The window this position lies in, for the stager.
  const uint64_t window =
      stager ? (epoch - c.start_epoch) * windows_per_epoch + pos / plan.ahead_samples : 0;
  const BatchBuffer buf = buffers->buffer(g % depth);
  const uint64_t attempts = std::min<uint64_t>(w.list->size(), kMaxReplacements + 1);
  PrefetchSoon(w, epoch, pos);
  const Status err = LoadWithReplacements(w, epoch, pos, window, buf, j, attempts);
  if (stager) stager->Done(window);
  FinishSample(g, j, err, attempts);
}

// Samples this worker is likely to take in two and eight turns (the
// workers take positions in turn), within this epoch's list: the
// record's bytes of the first, where the second lies (records read
// through the map, or in the reader thread's windows; a record read
// with pread lands in the worker's buffer, nothing to prefetch). On a split of
// 1,000,000 records in the page cache this took a core's read stage
// from ~2.5 s to ~1.0 s an epoch (the 50,000-record split's: ~1.4 s
// to ~0.65 s; docs/BENCHMARKS.md, "How cost grows").
void Pipeline::Impl::PrefetchSoon(Worker& w, uint64_t epoch, uint64_t p) {
  const std::vector<uint64_t>& list = *w.list;
  if (p + 8 * c.threads >= list.size()) return;
  const uint64_t soon = p + 2 * c.threads;
  if (stager) {
    const uint64_t win = (epoch - c.start_epoch) * windows_per_epoch + soon / plan.ahead_samples;
    SamplePath::Prefetch(stager->Peek(win, list[soon]));
  } else {
    w.path.Prefetch(list[soon], list[p + 8 * c.threads]);
  }
}

// The sample at position pos of the epoch's list into place j of buf; with
// --on-bad-record skip, a bad one is replaced by the next of the list, up to
// `attempts` samples. The last one's failure, or ok.
Status Pipeline::Impl::LoadWithReplacements(Worker& w, uint64_t epoch, uint64_t pos,
                                            uint64_t window, const BatchBuffer& buf, uint32_t j,
                                            uint64_t attempts) {
  const std::vector<uint64_t>& list = *w.list;
  uint8_t* dst = buf.pixels + j * sample_bytes;
  Status err;
  for (uint64_t attempt = 0; attempt < attempts; ++attempt) {
    const uint64_t index = list[(pos + attempt) % list.size()];
    int64_t label = 0;
    // A replacement (--on-bad-record skip) is read here: it may lie in
    // another window.
    const std::span<const uint8_t> staged =
        stager && attempt == 0 ? stager->Find(window, index) : std::span<const uint8_t>();
    Status st = LoadSample(w.path, w.stats, epoch, index, dst, &label, staged);
    if (st.ok()) {
      buf.labels[j] = label;
      buf.indices[j] = static_cast<int64_t>(index);
      w.stats.images.fetch_add(1, std::memory_order_relaxed);
      return Status::Ok();
    }
    err = st;
    if (c.on_bad_record == OnBadRecord::kError) break;
    w.stats.skipped.fetch_add(1, std::memory_order_relaxed);  // replaced by the next sample
  }
  return err;
}

// Sample j of batch g is done: its failure (the batch's first) is noted in
// the slot, and the batch's last sample makes it ready.
void Pipeline::Impl::FinishSample(uint64_t g, uint32_t j, const Status& err, uint64_t attempts) {
  if (!err.ok()) {
    MutexLock lock(&mu);
    SlotState& slot = slot_states[g % depth];
    if (j < slot.error_at) {
      slot.error_at = j;
      slot.error = c.on_bad_record == OnBadRecord::kSkip
                       ? err.WithContext(std::to_string(attempts) + " samples in a row of rank " +
                                         std::to_string(c.rank) + "'s list failed (the last one)")
                       : err;
    }
  }
  if (slots[g % depth].remaining.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    WriteMeta(g);
    {
      MutexLock lock(&mu);
      slot_states[g % depth].ready = true;
    }
    ready_cv.NotifyAll();
  }
}

void Pipeline::Impl::Fail(const Status& st) {
  {
    MutexLock lock(&mu);
    if (failure.ok()) failure = st;
    stop = true;
  }
  if (stager) stager->Stop();
  work_cv.NotifyAll();
  ready_cv.NotifyAll();
}

WindowStager::Window Pipeline::Impl::StagerWindow(uint64_t w) {
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

std::shared_ptr<const std::vector<uint64_t>> Pipeline::Impl::EpochList(uint64_t epoch) {
  MutexLock lock(&epoch_mu);
  auto it = epoch_lists.find(epoch);
  if (it != epoch_lists.end()) return it->second;
  auto list = std::make_shared<const std::vector<uint64_t>>(sampler->EpochIndices(epoch));
  epoch_lists[epoch] = list;
  while (epoch_lists.size() > kCachedEpochs) epoch_lists.erase(epoch_lists.begin());
  return list;
}

// Asks for window `w` of the run (window w % windows_per_epoch of epoch
// start_epoch + w / windows_per_epoch): its records, in index order, so
// that runs of consecutive records become single requests.
void Pipeline::Impl::AskWindow(uint64_t w) {
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
void Pipeline::Impl::ReadAhead(uint64_t epoch, uint64_t pos) {
  const uint64_t want = (epoch - c.start_epoch) * windows_per_epoch + pos / plan.ahead_samples + 2;
  if (ahead_next.load(std::memory_order_acquire) >= want) return;
  if (!ahead_mu.TryLock()) return;  // another worker is asking; the next sample checks again
  MutexLock lock(&ahead_mu, MutexLock::Adopt{});
  uint64_t w = ahead_next.load(std::memory_order_relaxed);
  // Windows already passed (a resumed run, a slow start) are not asked for.
  w = std::max(w, want - 2);
  for (; w < want && !stop.load(std::memory_order_relaxed); ++w) AskWindow(w);
  ahead_next.store(w, std::memory_order_release);
}

// One sample into its slot; the time of each step goes to this worker's stats.
Status Pipeline::Impl::LoadSample(SamplePath& path, WorkerStats& ws, uint64_t epoch, uint64_t index,
                                  uint8_t* dst, int64_t* label, std::span<const uint8_t> staged) {
  SampleTimes t;
  NL_RETURN_IF_ERROR(path.Load(epoch, index, dst, label, &t, staged));
  ws.read_ns.fetch_add(t.read_ns, std::memory_order_relaxed);
  ws.decode_ns.fetch_add(t.decode_ns, std::memory_order_relaxed);
  ws.transform_ns.fetch_add(t.transform_ns, std::memory_order_relaxed);
  return Status::Ok();
}

// The last worker to finish batch g describes it in its buffer.
void Pipeline::Impl::WriteMeta(uint64_t g) {
  BatchMeta* meta = buffers->buffer(g % depth).meta;
  if (!meta) return;
  const auto [epoch, b] = EpochBatch(g);
  *meta = BatchMeta{g, epoch, b, LengthOf(g), 0};
}

}  // namespace nl
