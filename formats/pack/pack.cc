#include "formats/pack/pack.h"

#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <set>
#include <thread>

#include "base/file_util.h"
#include "base/mutex.h"
#include "formats/pack/imagefolder_source.h"
#include "formats/record.h"
#include "formats/resize.h"
#include "formats/shard.h"
#include "base/worker_pool.h"

namespace nl {

namespace fs = std::filesystem;

Result<PackEncoding> ParsePackEncoding(const std::string& s) {
  if (s == "keep") return PackEncoding::kKeep;
  if (s == "raw") return PackEncoding::kRaw;
  if (s == "png") return PackEncoding::kPng;
  if (s == "jpeg") return PackEncoding::kJpeg;
  return Status::InvalidArgument("unknown encoding '" + s + "' (use keep, raw, png or jpeg)");
}

uint32_t DefaultThreads() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

namespace {

struct Slot {
  Status status;
  std::vector<uint8_t> record;
  uint32_t width = 0, height = 0;
  uint32_t original_width = 0, original_height = 0;  // before --max-side
  Encoding encoding = Encoding::kRaw;
  uint32_t label = 0;
};

// Per-worker buffers, reused for every sample.
struct Scratch {
  SourceSample sample;
  Image decoded;
  Image resized;
};

Status MakeRecord(const SampleSource& source, uint64_t i, const PackOptions& o, Scratch* sc,
                  Slot* slot) {
  NL_RETURN_IF_ERROR(source.Load(i, &sc->sample));
  SourceSample& s = sc->sample;
  const Image* img = &s.image;
  std::span<const uint8_t> payload;
  Encoding enc = Encoding::kRaw;
  std::vector<uint8_t> encoded;  // a re-encoded payload
  if (!s.decoded) {
    // Validate by decoding once, whatever is stored.
    Status st = DecodeImageInto(s.file_bytes, o.limits, &sc->decoded);
    if (!st.ok()) return st.WithContext(source.Describe(i));
    img = &sc->decoded;
  } else if (uint64_t{img->width} * img->height > o.limits.max_pixels) {
    return Status::ResourceExhausted(source.Describe(i) + ": image exceeds the pixel limit");
  }
  slot->original_width = img->width;
  slot->original_height = img->height;
  const auto [fit_w, fit_h] = MaxSideSize(img->width, img->height, o.max_side);
  const bool resized = fit_w != img->width || fit_h != img->height;
  if (resized) {
    ResizeImage(*img, fit_w, fit_h, &sc->resized);
    img = &sc->resized;
  }
  const bool kept_png = !s.decoded && DetectImageFormat(s.file_bytes) == ImageFormat::kPng;
  PackEncoding how = o.encoding;
  if (how == PackEncoding::kKeep && (resized || s.decoded)) {
    // The file's bytes are not the image stored: re-encoded in its own
    // format (decoded sources, CIFAR, have none: raw).
    how = s.decoded ? PackEncoding::kRaw : kept_png ? PackEncoding::kPng : PackEncoding::kJpeg;
  }
  if (how == PackEncoding::kKeep && !s.decoded) {
    enc = kept_png ? Encoding::kPng : Encoding::kJpeg;
    payload = s.file_bytes;
  } else if (how == PackEncoding::kPng) {
    NL_ASSIGN_OR_RETURN(encoded, EncodePng(*img, o.png_level));
    enc = Encoding::kPng;
    payload = encoded;
  } else if (how == PackEncoding::kJpeg) {
    JpegEncodeOptions jo;
    jo.quality = o.jpeg_quality;
    NL_ASSIGN_OR_RETURN(encoded, EncodeJpeg(img->pixels, img->width, img->height, 3, jo));
    enc = Encoding::kJpeg;
    payload = encoded;
  } else {
    enc = Encoding::kRaw;
    payload = img->pixels;
  }
  if (enc == Encoding::kJpeg && o.jpeg_restarts) {
    // A file the rewrite cannot encode (DC values a restart cannot code,
    // in a file damaged or crafted so) is stored as it is: it decodes, and
    // the restarts only speed its crops up.
    Result<std::vector<uint8_t>> with = AddJpegRowRestarts(payload, o.limits);
    if (with.ok()) {
      encoded = std::move(*with);
      payload = encoded;
    }
  }
  RecordHeader h;
  h.label = s.label;
  h.encoding = enc;
  h.width = img->width;
  h.height = img->height;
  EncodeRecord(h, payload, &slot->record);
  slot->width = img->width;
  slot->height = img->height;
  slot->encoding = enc;
  slot->label = s.label;
  return Status::Ok();
}

bool Cancelled(const PackOptions& o) {
  return o.cancel && o.cancel->load(std::memory_order_relaxed);
}

std::string ShardName(const std::string& split, uint32_t k) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "/shard-%05u", k);
  return split + buf;
}

// Samples per shard when PackOptions::shards is 0.
constexpr uint64_t kSamplesPerShard = 100'000;
// Workers take blocks of this many consecutive samples, so that threads wake
// once per block, not once per sample.
constexpr uint64_t kBlockSamples = 16;
// The window of slots between workers and writer, in blocks: at least this
// many, and this many per worker.
constexpr uint64_t kMinWindowBlocks = 16;
constexpr uint64_t kWindowBlocksPerWorker = 4;
// The progress callback hears of every this many samples (and of the last).
constexpr uint64_t kProgressEvery = 512;

// The hand-off between decode workers and the one writer: a ring of slots
// for samples [written, written + window). Workers claim blocks of samples
// in order and publish each block when all of it is made; the writer takes
// slots in index order. Stop() wakes everyone and ends the hand-off.
class SlotWindow {
 public:
  SlotWindow(uint64_t samples, uint32_t workers)
      : n_(samples),
        window_(kBlockSamples *
                std::max<uint64_t>(kMinWindowBlocks, uint64_t{workers} * kWindowBlocksPerWorker)),
        slots_(window_),
        ready_(window_, false) {}

  // Worker: the next block [*first, *end), once it fits in the window. False
  // when every block is taken or the hand-off was stopped.
  bool ClaimBlock(uint64_t* first, uint64_t* end) {
    *first = next_block_.fetch_add(1) * kBlockSamples;
    if (*first >= n_) return false;
    *end = std::min(n_, *first + kBlockSamples);
    MutexLock lock(&mu_);
    while (!(stop_ || *end <= written_ + window_)) block_free_.Wait(&mu_);
    return !stop_;
  }
  // The slot of sample i (a worker fills it between ClaimBlock and Publish).
  Slot& slot(uint64_t i) { return slots_[i % window_]; }
  // Worker: the block's samples are made; results[k] is sample first + k's.
  void Publish(uint64_t first, uint64_t end, std::vector<Status>* results) {
    {
      MutexLock lock(&mu_);
      for (uint64_t i = first; i < end; ++i) {
        slot(i).status = std::move((*results)[i - first]);
        ready_[i % window_] = true;
      }
    }
    block_ready_.NotifyAll();
  }

  // Writer: sample i's slot once it is made; nullptr when stopped.
  const Slot* WaitFor(uint64_t i) {
    MutexLock lock(&mu_);
    while (!(stop_ || ready_[i % window_])) block_ready_.Wait(&mu_);
    return stop_ ? nullptr : &slot(i);
  }
  // Writer: sample i is written; its slot is free again.
  void Release(uint64_t i) {
    {
      MutexLock lock(&mu_);
      ready_[i % window_] = false;
      slot(i).status = Status::Ok();
      ++written_;
    }
    if ((i + 1) % kBlockSamples == 0) block_free_.NotifyAll();
  }

  void Stop() {
    {
      MutexLock lock(&mu_);
      stop_ = true;
    }
    block_free_.NotifyAll();
    block_ready_.NotifyAll();
  }

 private:
  const uint64_t n_, window_;
  // A slot's sample: its worker's from ClaimBlock to Publish, the writer's
  // (read without the lock) from WaitFor to Release. ready_, under mu_,
  // hands it over; the analysis cannot state that, so no annotation.
  std::vector<Slot> slots_;
  std::atomic<uint64_t> next_block_{0};
  Mutex mu_;
  CondVar block_ready_, block_free_;
  std::vector<bool> ready_ NL_GUARDED_BY(mu_);  // slots_[i] published, not yet released
  uint64_t written_ NL_GUARDED_BY(mu_) = 0;
  bool stop_ NL_GUARDED_BY(mu_) = false;
};

// The decode workers, on a WorkerPool, filling a SlotWindow. A worker's
// error (an exception: bad samples are results, not errors) stops the
// window, so the writer does not wait for a slot no one will fill.
// Destruction stops and joins them.
class DecodeWorkers {
 public:
  static Result<std::unique_ptr<DecodeWorkers>> Start(const SampleSource& source,
                                                      const PackOptions& o, uint32_t threads) {
    std::unique_ptr<DecodeWorkers> d(new DecodeWorkers(source.size(), threads));
    DecodeWorkers* raw = d.get();
    WorkerPool::Options po;
    po.threads = threads;
    po.name = "pack worker";
    po.on_error = [raw](const Status&) { raw->window_.Stop(); };
    NL_ASSIGN_OR_RETURN(
        d->pool_, WorkerPool::Start(po, [raw, &source, &o](int) { return raw->Work(source, o); }));
    return d;
  }
  ~DecodeWorkers() { (void)StopAndJoin(); }

  // Sample i's slot, once made; nullptr when the workers stopped.
  const Slot* WaitFor(uint64_t i) { return window_.WaitFor(i); }
  void Release(uint64_t i) { window_.Release(i); }
  // Stops the workers and returns the first error any of them had.
  Status StopAndJoin() {
    window_.Stop();
    return pool_ ? pool_->Join() : Status::Ok();
  }

 private:
  DecodeWorkers(uint64_t samples, uint32_t threads) : window_(samples, threads) {}

  Status Work(const SampleSource& source, const PackOptions& o) {
    Scratch scratch;
    std::vector<Status> results(kBlockSamples);
    uint64_t first = 0, end = 0;
    while (window_.ClaimBlock(&first, &end)) {
      for (uint64_t i = first; i < end; ++i) {
        results[i - first] = MakeRecord(source, i, o, &scratch, &window_.slot(i));
      }
      window_.Publish(first, end, &results);
    }
    return Status::Ok();
  }

  SlotWindow window_;
  std::unique_ptr<WorkerPool> pool_;
};

// The writer's side of a split: shards rotated over the index range, records
// appended in index order, and what the manifest says of the split.
class SplitBuilder {
 public:
  SplitBuilder(const SampleSource& source, const std::string& root, const std::string& split,
               uint32_t num_shards, uint32_t max_side)
      : source_(source), root_(root), split_(split), n_(source.size()), num_shards_(num_shards) {
    info_.num_samples = 0;
    info_.max_side = max_side;
  }

  // Sample i's slot, made: appends its record, or notes it skipped.
  Status Add(uint64_t i, const Slot& slot, bool skip_bad) {
    NL_RETURN_IF_ERROR(RotateShardAt(i));
    if (!slot.status.ok()) {
      if (!skip_bad) return slot.status;
      info_.skipped.push_back({source_.Describe(i), slot.status.ToString()});
      return Status::Ok();
    }
    NL_RETURN_IF_ERROR(shard_->Put(info_.num_samples, slot.record));
    encodings_.insert(slot.encoding);
    if (info_.max_side > 0) original_sizes_.push_back({slot.original_width, slot.original_height});
    if (info_.num_samples == 0) {
      shape_w_ = slot.width;
      shape_h_ = slot.height;
    } else if (slot.width != shape_w_ || slot.height != shape_h_) {
      same_shape_ = false;
    }
    bytes_ += slot.record.size();
    ++info_.num_samples;
    return Status::Ok();
  }
  uint64_t bytes() const { return bytes_; }

  // After the last sample: finishes the last shard and sums the split up.
  Result<SplitInfo> Finish() {
    NL_ASSIGN_OR_RETURN(ShardInfo last, shard_->Finish());
    info_.shards.push_back(std::move(last));
    if (info_.num_samples == 0) {
      return Status::InvalidArgument("split '" + split_ + "': every sample was bad (" +
                                     std::to_string(info_.skipped.size()) + " skipped)");
    }
    if (encodings_.size() > 1) {
      info_.encoding = "mixed";
    } else {
      info_.encoding = std::string(EncodingName(*encodings_.begin()));
    }
    if (same_shape_) info_.shape = std::array<uint32_t, 3>{shape_h_, shape_w_, 3};
    if (info_.max_side > 0) info_.original_sizes = EncodeOriginalSizes(original_sizes_);
    return std::move(info_);
  }

 private:
  // Where the next shard's range begins at sample i: finishes the current
  // shard and starts the next.
  Status RotateShardAt(uint64_t i) {
    if (i != shard_end_) return Status::Ok();
    if (shard_) {
      NL_ASSIGN_OR_RETURN(ShardInfo done, shard_->Finish());
      info_.shards.push_back(std::move(done));
    }
    NL_ASSIGN_OR_RETURN(shard_,
                        ShardWriter::Create(root_, ShardName(split_, shard_k_), info_.num_samples));
    ++shard_k_;
    shard_end_ = n_ * shard_k_ / num_shards_;
    return Status::Ok();
  }

  const SampleSource& source_;
  const std::string& root_;
  const std::string& split_;
  const uint64_t n_;
  const uint32_t num_shards_;
  SplitInfo info_;
  std::unique_ptr<ShardWriter> shard_;
  uint32_t shard_k_ = 0;
  uint64_t shard_end_ = 0;  // source index where the current shard's range ends
  std::set<Encoding> encodings_;
  bool same_shape_ = true;
  uint32_t shape_w_ = 0, shape_h_ = 0;
  uint64_t bytes_ = 0;
  std::vector<std::array<uint32_t, 2>> original_sizes_;  // with max_side
};

// Reports progress every kProgressEvery samples and at the end.
class ProgressReporter {
 public:
  ProgressReporter(const PackOptions& o, const std::string& split, uint64_t total)
      : callback_(o.progress), progress_{split, 0, total, 0, 0} {}
  void Done(uint64_t done, uint64_t bytes) {
    if (!callback_ || (done % kProgressEvery != 0 && done != progress_.total)) return;
    progress_.done = done;
    progress_.bytes = bytes;
    progress_.seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    callback_(progress_);
  }

 private:
  const std::function<void(const PackProgress&)>& callback_;
  PackProgress progress_;
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

// The writer loop: takes the workers' slots in index order into `out`. A
// worker's failure ends the loop with that worker's error.
Status WriteInIndexOrder(const SampleSource& source, const std::string& split, const PackOptions& o,
                         DecodeWorkers* workers, SplitBuilder* out) {
  const uint64_t n = source.size();
  ProgressReporter progress(o, split, n);
  for (uint64_t i = 0; i < n; ++i) {
    if (Cancelled(o)) return Status::Aborted("pack of split '" + split + "' interrupted");
    const Slot* slot = workers->WaitFor(i);
    if (!slot) {
      const Status st = workers->StopAndJoin();
      if (!st.ok()) return st.WithContext("pack of split '" + split + "'");
      return Status::Internal("pack of split '" + split + "': the workers stopped early");
    }
    NL_RETURN_IF_ERROR(out->Add(i, *slot, o.skip_bad));
    workers->Release(i);
    progress.Done(i + 1, out->bytes());
  }
  return Status::Ok();
}

}  // namespace

Result<SplitInfo> PackSplit(const SampleSource& source, const std::string& root,
                            const std::string& split, const PackOptions& o) {
  const uint64_t n = source.size();
  if (n == 0) return Status::InvalidArgument("split '" + split + "' has no samples");
  const uint64_t want_shards = o.shards ? o.shards : (n + kSamplesPerShard - 1) / kSamplesPerShard;
  const uint32_t num_shards = static_cast<uint32_t>(std::min<uint64_t>(want_shards, n));
  const uint32_t threads =
      std::min<uint32_t>(o.threads ? o.threads : DefaultThreads(), WorkerPool::kMaxThreads);
  NL_RETURN_IF_ERROR(MakeDirs(root + "/" + split));

  NL_ASSIGN_OR_RETURN(std::unique_ptr<DecodeWorkers> workers,
                      DecodeWorkers::Start(source, o, threads));
  SplitBuilder builder(source, root, split, num_shards, o.max_side);
  NL_RETURN_IF_ERROR(WriteInIndexOrder(source, split, o, workers.get(), &builder));
  if (Status st = workers->StopAndJoin(); !st.ok()) {
    return st.WithContext("pack of split '" + split + "'");
  }
  NL_ASSIGN_OR_RETURN(SplitInfo info, builder.Finish());
  info.jpeg_restarts = o.jpeg_restarts && (info.encoding == "jpeg" || info.encoding == "mixed");
  return info;
}

std::string PackLockPath(const std::string& out) { return out + ".pack-lock"; }

namespace {

constexpr char kTempLockName[] = "/.pack-lock";

std::string ParentOf(const std::string& path) {
  std::string p = fs::path(path).parent_path().string();
  return p.empty() ? "." : p;
}

std::string NameOf(const std::string& path) { return fs::path(path).filename().string(); }

// A temporary directory and the lock that marks it as in use. The directory
// goes first on destruction (members are destroyed in reverse order).
struct LockedTemp {
  FileLock lock;
  TempDir dir;
  const std::string& path() const { return dir.path(); }
};

// Whether the temporary directory at `path` is one no running pack holds:
// its lock file inside can be taken. The pid in its name only makes names
// unique; it says nothing about liveness, since the pack may run in another
// PID namespace or on another machine. (A pack that holds the lock holds it
// for its life, so the lock may be let go before the directory is removed.)
bool Unheld(const std::string& path) {
  std::error_code ec;
  if (!fs::is_directory(fs::symlink_status(path, ec))) return false;
  Result<std::optional<FileLock>> lock = FileLock::TryAcquire(path + kTempLockName);
  return lock.ok() && lock->has_value();  // in use (or cannot tell): keep it
}

// Removes the temporaries of `target` (TemporaryPath(target)) that no
// running pack holds.
void RemoveStaleTemporariesOf(const std::string& target) {
  (void)RemoveStaleTemporaries(
      ParentOf(target), [name = NameOf(target)](const std::string& path, const std::string& base) {
        return base == name && Unheld(path);
      });
}

// Removes the per-split temporaries inside the shard set `out`
// (TemporaryPath(out + "/." + split), any split) that no running pack holds.
void RemoveStaleSplitTemporaries(const std::string& out) {
  (void)RemoveStaleTemporaries(out, [](const std::string& path, const std::string& base) {
    return base.size() > 1 && base[0] == '.' && Unheld(path);
  });
}

// Removes directories "<prefix><pid>" (or "<prefix><name>-<pid>") in `dir`
// moved aside by a pack that did not finish (the caller holds OUT's lock).
void RemoveMovedAside(const std::string& dir, const std::string& prefix) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    const std::string tail = name.substr(prefix.size());
    const auto dash = tail.find_last_of('-');
    const std::string pid_s = dash == std::string::npos ? tail : tail.substr(dash + 1);
    if (pid_s.empty() || pid_s.find_first_not_of("0123456789") != std::string::npos) continue;
    if (Unheld(e.path().string())) (void)RemoveAll(e.path().string());
  }
}

// Creates `path` (which must not be in use) and takes its lock.
Result<LockedTemp> MakeLockedTemp(const std::string& path) {
  if (PathExists(path)) {
    return Status::AlreadyExists("temporary " + path +
                                 " is in use by another pack (its lock file is held)");
  }
  NL_RETURN_IF_ERROR(MakeDirs(path));
  LockedTemp t;
  t.dir = TempDir(path);
  NL_ASSIGN_OR_RETURN(std::optional<FileLock> lock, FileLock::TryAcquire(path + kTempLockName));
  if (!lock) return Status::Internal("cannot lock the new temporary " + path);
  t.lock = std::move(*lock);
  return t;
}

std::string Normalize(std::string p) {
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p;
}

std::string Absolute(const std::string& p) {
  std::error_code ec;
  auto a = fs::absolute(p, ec);
  return ec ? p : a.lexically_normal().string();
}

// Moves the finished temporary `tmp` to `out`, replacing an existing `out`.
// The caller holds OUT's lock, so no other pack looks at the temporaries.
Status CommitNewOut(LockedTemp* tmp, const std::string& out) {
  const std::string pid = std::to_string(::getpid());
  const std::string old = out + ".old-" + pid;
  const bool replace = PathExists(out);
  tmp->lock.Release();  // removes the lock file, which must not end up in OUT
  if (replace && ::rename(out.c_str(), old.c_str()) != 0) {
    return Status::FromErrno("cannot move aside " + out, errno);
  }
  if (::rename(tmp->path().c_str(), out.c_str()) != 0) {
    const int e = errno;
    if (replace) (void)::rename(old.c_str(), out.c_str());
    return Status::FromErrno("cannot rename " + tmp->path() + " to " + out, e);
  }
  tmp->dir.Release();
  NL_RETURN_IF_ERROR(FsyncDir(ParentOf(out)));
  if (replace) NL_RETURN_IF_ERROR(RemoveAll(old));
  return Status::Ok();
}

Result<LockedTemp> MakeTempBeside(const std::string& out) {
  RemoveStaleTemporariesOf(out);
  RemoveMovedAside(ParentOf(out), NameOf(out) + ".old-");
  return MakeLockedTemp(TemporaryPath(out));
}

// Takes OUT's lock (creating OUT's parent directory if needed), waiting for
// another pack that holds it.
Result<FileLock> LockOut(const std::string& out, const PackOptions& o) {
  NL_RETURN_IF_ERROR(MakeDirs(ParentOf(out)));
  const std::string path = PackLockPath(out);
  auto on_wait = [&] {
    if (o.on_wait) o.on_wait(path);
  };
  return FileLock::Acquire(path, on_wait, o.cancel);
}

// Refuses OUT inside SRC and SRC inside OUT (so that --force can never
// delete the source, and a new OUT never becomes part of the source).
Status CheckNotNested(const std::string& src, const std::string& out) {
  NL_ASSIGN_OR_RETURN(std::string csrc, CanonicalPath(src));
  NL_ASSIGN_OR_RETURN(std::string cout, CanonicalPath(out));
  if (PathIsWithin(cout, csrc)) {
    return Status::InvalidArgument("OUT " + out + " is inside SRC " + src + " (" + cout +
                                   " is within " + csrc + "): choose an OUT outside the source");
  }
  if (PathIsWithin(csrc, cout)) {
    return Status::InvalidArgument("SRC " + src + " is inside OUT " + out + " (" + csrc +
                                   " is within " + cout + "): choose an OUT outside the source");
  }
  return Status::Ok();
}

// OUT exists and is not a shard set: replace it only when asked by name.
Status CheckNonShardSetReplaceable(const std::string& out, const Status& why,
                                   const PackOptions& o) {
  if (o.replace_non_shard_set) return Status::Ok();
  return Status::AlreadyExists(out + " already exists and is not a shard set (" + why.message() +
                               "); " + (o.force ? "`force` replaces only shard sets; " : "") +
                               "use `replace_non_shard_set` to delete it and pack into its place");
}

using Clock = std::chrono::steady_clock;

void Tally(const std::string& split, const SplitInfo& s, PackSummary* sum) {
  sum->splits_written.push_back(split);
  sum->samples += s.num_samples;
  sum->skipped += s.skipped.size();
  sum->bytes += s.total_bytes();
}

}  // namespace

Result<PackSummary> PackCifar100(const std::string& src, const std::string& out_in,
                                 CifarLabel label, const PackOptions& o_in) {
  const auto t0 = Clock::now();
  const std::string out = Normalize(out_in);
  NL_RETURN_IF_ERROR(CheckNotNested(src, out));
  NL_ASSIGN_OR_RETURN(FileLock out_lock, LockOut(out, o_in));
  // Checked under the lock: another pack may have created OUT meanwhile.
  if (PathExists(out)) {
    if (!o_in.force && !o_in.replace_non_shard_set) {
      return Status::AlreadyExists(out + " already exists (use `force` to replace it)");
    }
    Result<Manifest> existing = LoadManifest(out);
    if (!existing.ok())
      NL_RETURN_IF_ERROR(CheckNonShardSetReplaceable(out, existing.status(), o_in));
  }
  PackOptions o = o_in;
  if (o.encoding == PackEncoding::kKeep) o.encoding = PackEncoding::kRaw;
  NL_ASSIGN_OR_RETURN(CifarFiles files, ReadCifar100(src));
  const auto& classes = label == CifarLabel::kFine ? files.fine_names : files.coarse_names;
  NL_ASSIGN_OR_RETURN(LockedTemp tmp, MakeTempBeside(out));

  PackSummary sum;
  Manifest& m = sum.manifest;
  m.source_kind = "cifar100";
  m.source_path = Absolute(src);
  m.label_kind = label == CifarLabel::kFine ? "fine" : "coarse";
  m.classes = classes;
  const std::pair<const char*, std::span<const uint8_t>> splits[] = {{"train", files.train.span()},
                                                                     {"test", files.test.span()}};
  for (const auto& [name, bin] : splits) {
    NL_ASSIGN_OR_RETURN(auto source,
                        CifarSplitSource::Create(bin, src + "/" + name + ".bin", &classes, label));
    NL_ASSIGN_OR_RETURN(SplitInfo info, PackSplit(*source, tmp.path(), name, o));
    info.source = m.source_path + "/" + name + ".bin";
    Tally(name, info, &sum);
    m.splits[name] = std::move(info);
  }
  NL_RETURN_IF_ERROR(SaveManifest(tmp.path(), m));
  NL_RETURN_IF_ERROR(CommitNewOut(&tmp, out));
  sum.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return sum;
}

namespace {

// A new shard set OUT holding one ImageFolder split, built beside OUT.
Status PackNewImageFolderSet(const ImageFolderSource& source, const std::string& src,
                             const std::string& out, const std::string& split,
                             const PackOptions& o, PackSummary* sum) {
  NL_ASSIGN_OR_RETURN(LockedTemp tmp, MakeTempBeside(out));
  Manifest& m = sum->manifest;
  m.source_kind = "imagefolder";
  m.source_path = Absolute(src);
  m.label_kind = "class_dirs";
  m.classes = source.classes();
  NL_ASSIGN_OR_RETURN(SplitInfo info, PackSplit(source, tmp.path(), split, o));
  info.source = m.source_path;
  Tally(split, info, sum);
  m.splits[split] = std::move(info);
  NL_RETURN_IF_ERROR(SaveManifest(tmp.path(), m));
  return CommitNewOut(&tmp, out);
}

// Whether `split` of `source` may go into the existing shard set `m` at OUT.
Status CheckSplitFits(const Manifest& m, const ImageFolderSource& source, const std::string& src,
                      const std::string& out, const std::string& split, const PackOptions& o) {
  if (m.source_kind != "imagefolder") {
    return Status::InvalidArgument(out + " holds a " + m.source_kind +
                                   " shard set; an ImageFolder split cannot be added to it");
  }
  if (m.classes != source.classes()) {
    return Status::InvalidArgument(
        "classes of " + src + " (" + std::to_string(source.classes().size()) +
        ") differ from those of " + out + " (" + std::to_string(m.classes.size()) +
        "): a split must use the same class directories");
  }
  if (m.FindSplit(split) && !o.force && !o.replace_non_shard_set) {
    return Status::AlreadyExists("split '" + split + "' already exists in " + out +
                                 " (use `force` to replace it)");
  }
  return Status::Ok();
}

// Swaps the split built in `tmp` into OUT. Until the manifest is replaced,
// the old manifest still describes the set; on any failure the old split
// directory is put back, so nothing already written is lost.
Result<Manifest> SwapSplitIn(const LockedTemp& tmp, const std::string& out,
                             const std::string& split, const SplitInfo& info, const Manifest& m) {
  const std::string final_dir = out + "/" + split;
  const std::string old_dir = out + "/.old-" + split + "-" + std::to_string(::getpid());
  const bool had_dir = PathExists(final_dir);
  if (had_dir && ::rename(final_dir.c_str(), old_dir.c_str()) != 0) {
    return Status::FromErrno("cannot move aside " + final_dir, errno);
  }
  auto restore = [&] {
    if (had_dir) ::rename(old_dir.c_str(), final_dir.c_str());
  };
  const std::string built = tmp.path() + "/" + split;
  if (::rename(built.c_str(), final_dir.c_str()) != 0) {
    const int e = errno;
    restore();
    return Status::FromErrno("cannot rename " + built + " to " + final_dir, e);
  }
  Manifest updated = m;
  updated.splits[split] = info;
  if (Status st = SaveManifest(out, updated); !st.ok()) {  // the commit point
    (void)::rename(final_dir.c_str(), built.c_str());
    restore();
    return st;
  }
  if (had_dir) (void)RemoveAll(old_dir);
  return updated;
}

// Adds (or, with --force, replaces) one split of the existing shard set `m`
// at OUT, built in a temporary inside OUT.
Status AddImageFolderSplit(const ImageFolderSource& source, const std::string& src,
                           const std::string& out, const std::string& split, const PackOptions& o,
                           const Manifest& m, PackSummary* sum) {
  NL_RETURN_IF_ERROR(CheckSplitFits(m, source, src, out, split, o));
  RemoveStaleSplitTemporaries(out);
  RemoveMovedAside(out, ".old-");
  RemoveStaleTemporariesOf(out);  // from interrupted packs of a new OUT
  RemoveMovedAside(ParentOf(out), NameOf(out) + ".old-");
  NL_ASSIGN_OR_RETURN(LockedTemp tmp, MakeLockedTemp(TemporaryPath(out + "/." + split)));
  NL_ASSIGN_OR_RETURN(SplitInfo info, PackSplit(source, tmp.path(), split, o));
  info.source = Absolute(src);
  NL_ASSIGN_OR_RETURN(Manifest updated, SwapSplitIn(tmp, out, split, info, m));
  Tally(split, info, sum);
  sum->manifest = std::move(updated);
  return Status::Ok();
}

}  // namespace

Result<PackSummary> PackImageFolder(const std::string& src, const std::string& out_in,
                                    const std::string& split, const PackOptions& o) {
  const auto t0 = Clock::now();
  const std::string out = Normalize(out_in);
  if (split.empty() || split.find('/') != std::string::npos || split[0] == '.') {
    return Status::InvalidArgument("invalid split name '" + split + "'");
  }
  NL_RETURN_IF_ERROR(CheckNotNested(src, out));
  NL_ASSIGN_OR_RETURN(auto source, ImageFolderSource::Scan(src));

  // Everything about OUT is checked under its lock, held until the commit.
  NL_ASSIGN_OR_RETURN(FileLock out_lock, LockOut(out, o));
  Result<Manifest> existing = Status::NotFound("");
  if (PathExists(out)) {
    existing = LoadManifest(out);
    if (!existing.ok()) NL_RETURN_IF_ERROR(CheckNonShardSetReplaceable(out, existing.status(), o));
  }
  PackSummary sum;
  if (!existing.ok()) {  // a new OUT (or --replace-non-shard-set over something else)
    NL_RETURN_IF_ERROR(PackNewImageFolderSet(*source, src, out, split, o, &sum));
  } else {
    NL_RETURN_IF_ERROR(AddImageFolderSplit(*source, src, out, split, o, *existing, &sum));
  }
  sum.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return sum;
}

}  // namespace nl
