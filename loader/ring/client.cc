#include "loader/ring/client.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <chrono>
#include <cstdio>
#include <optional>
#include <thread>
#include <vector>

#include "base/child_process.h"
#include "base/mutex.h"
#include "loader/ring/ring_lock.h"
#include "loader/ring/ring_socket.h"

namespace nl {

using namespace ring;  // NOLINT: this file is the ring

namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string Seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f s", s);
  return buf;
}

}  // namespace

struct RingClient::Impl {
  RingInfo info;
  std::string who;  // "loader serve for job J, rank R (pid P)"
  Fd conn;
  void* base = MAP_FAILED;
  size_t bytes = 0;
  Header* h = nullptr;
  Geometry g;  // our copy, checked once: offsets never come from shared memory again

  std::atomic<bool> in_next{false};
  std::atomic<bool> said_goodbye{false};  // Goodbye(): the ring is ours to read, not to use
  Mutex mu;  // guards the fields below (Release may come from another thread)
  // Per slot: position + 1 while we hold it, else 0. Written under `mu`;
  // atomic so that Next() reads it while holding the ring's lock without
  // taking `mu` (Release takes `mu`, then the ring's lock: no inversion).
  // (So not NL_GUARDED_BY: its reads need no lock.)
  std::unique_ptr<std::atomic<uint64_t>[]> taken;
  uint32_t held NL_GUARDED_BY(mu) = 0;
  uint64_t sequence NL_GUARDED_BY(mu) = 0;
  uint64_t generation NL_GUARDED_BY(mu) = 0;  // the request our batches must answer
  bool have_next NL_GUARDED_BY(mu) = false;   // whether next_epoch/next_batch are known
  uint64_t next_epoch NL_GUARDED_BY(mu) = 0, next_batch NL_GUARDED_BY(mu) = 0;

  ~Impl() {
    if (conn.valid() && !said_goodbye) (void)SendMessage(conn.get(), MakeMessage(MessageKind::kDetach, ""));
    if (base != MAP_FAILED) ::munmap(base, bytes);
  }

  Status Closed() const {
    return Status::FailedPrecondition("this client of " + who + " has said goodbye (closed)");
  }

  SlotHeader* Slot(uint32_t i) const {
    return reinterpret_cast<SlotHeader*>(static_cast<char*>(base) + g.slots_offset +
                                         uint64_t{i} * g.slot_bytes);
  }

  // The producer is gone: its error text if it left one, else what we know.
  Status Gone() const {
    std::string text(h->error, strnlen(h->error, kErrorBytes));
    const std::string now = proc::ProcessState(info.producer_pid);
    if (text.rfind("stopped by ", 0) == 0) return Status::Unavailable(who + " was " + text);
    if (!text.empty()) {
      return Status::Unavailable(who + " failed: " + text);
    }
    return Status::Unavailable(who + " is gone: it closed the connection without a word " +
                               "(killed, e.g. kill -9 or the OOM killer, or crashed); " +
                               "the process is now " + now);
  }

  uint64_t attached_ns = 0;

  // "Sent nothing for N s" counts from the producer's last batch (or our
  // attach), so a caller that waits in short slices still reports the truth.
  Status Stuck() const {
    uint64_t last = attached_ns;
    std::string doing = "it holds the ring's lock";
    RingLock lock = TryLockFor(h->control, kSliceMs);
    if (lock.owns()) {
      const Control& c = h->control;
      last = std::max(last, c.last_publish_ns);
      doing = std::string("last seen ") + ActivityName(static_cast<Activity>(c.activity));
      if (c.activity == static_cast<uint32_t>(Activity::kFilling)) {
        doing += " (epoch " + std::to_string(c.activity_epoch) + ", batch " +
                 std::to_string(c.activity_batch) + ")";
      }
      if (c.activity_since_ns != 0) {
        doing += ", for " + Seconds((MonotonicNs() - c.activity_since_ns) * 1e-9);
      }
    }
    const double waited = (MonotonicNs() - last) * 1e-9;
    return Status::DeadlineExceeded(who + " is alive but has sent nothing for " +
                                    Seconds(waited) + "; it is " +
                                    proc::ProcessState(info.producer_pid) + "; " + doing);
  }

  // Tells the producer why we refuse its ring, and hangs up.
  Status Refuse(const std::string& why) {
    (void)SendMessage(conn.get(), MakeMessage(MessageKind::kRefused, why));
    conn.Reset();
    return Status::FailedPrecondition("refused " + who + ": " + why);
  }

  // The producer's first message: its segment's descriptor, checked to be
  // of our version and sealed against shrinking. Waits up to left_s.
  Result<Fd> ReceiveSegment(double left_s) {
    Message hello;
    Fd segment;
    const Status got = ReceiveMessage(conn.get(), static_cast<int>(left_s * 1000), &hello, &segment);
    if (!got.ok()) {
      return Status(got.code(), who + " did not hand over its ring: " + got.message());
    }
    if (hello.kind == static_cast<uint32_t>(MessageKind::kRefused)) {
      conn.Reset();
      return Status::FailedPrecondition(who + " refused this consumer: " + hello.text);
    }
    if (hello.kind != static_cast<uint32_t>(MessageKind::kSegment) || !segment.valid()) {
      return Refuse("its first message carries no ring segment");
    }
    if (hello.version != kVersion) {
      return Refuse("it speaks ring version " + std::to_string(hello.version) + ", we speak " +
                    std::to_string(kVersion));
    }
    const int seals = ::fcntl(segment.get(), F_GET_SEALS);
    if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) {
      return Refuse("its segment is not sealed against shrinking (it could be cut under us)");
    }
    return segment;
  }

  // Maps the segment and copies its header's fixed part into *copy (from
  // here on only the copy is used), checked against the socket's peer and
  // what we asked for. (Header holds the process-shared mutex: not movable.)
  Status MapSegment(const Fd& segment, const PeerCred& peer, const std::string& job_id, int rank,
                    Header* out) {
    struct stat st {};
    if (::fstat(segment.get(), &st) != 0) return Status::FromErrno("fstat of the ring segment", errno);
    const uint64_t size = static_cast<uint64_t>(st.st_size);
    if (size < sizeof(Header) || size > kMaxSegmentBytes) {
      return Refuse("its segment has " + std::to_string(size) + " bytes");
    }
    bytes = size;
    base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, segment.get(), 0);
    if (base == MAP_FAILED) return Status::FromErrno("mapping the ring segment", errno);
    h = static_cast<Header*>(base);
    Header& copy = *out;
    std::memcpy(static_cast<void*>(&copy), h, offsetof(Header, control));
    const Status geometry = CheckGeometry(copy, size);
    if (!geometry.ok()) return Refuse(geometry.message());
    if (copy.producer_uid != peer.uid || copy.producer_pid != peer.pid) {
      return Refuse("its segment names pid " + std::to_string(copy.producer_pid) + " / uid " +
                    std::to_string(copy.producer_uid) + ", but the socket's peer is pid " +
                    std::to_string(peer.pid) + " / uid " + std::to_string(peer.uid));
    }
    if (std::string(copy.job_id) != job_id || copy.rank != rank) {
      return Refuse("its segment is for job " + std::string(copy.job_id) + ", rank " +
                    std::to_string(copy.rank));
    }
    if (copy.batches_per_epoch == 0) return Refuse("its segment says an epoch has no batches");
    return Status::Ok();
  }

  // Takes the checked header as ours and tells the producer who we are.
  Status Adopt(const Header& copy, int producer_pid) {
    g = copy.geometry;
    info.geometry = copy.geometry;
    info.producer_pid = producer_pid;
    info.batches_per_epoch = copy.batches_per_epoch;
    info.epochs = copy.epochs;
    taken.reset(new std::atomic<uint64_t>[g.slot_count]());
    attached_ns = MonotonicNs();
    uint64_t request_id = 0;
    {
      RingLock lock = TryLockFor(h->control, 1000);
      if (!lock.owns()) return Refuse("its ring's lock stayed held for 1 s");
      h->consumer_pid = ::getpid();
      request_id = h->control.request_id;
    }
    MutexLock local(&mu);  // (no one else has this client yet; the analysis asks for it)
    generation = request_id;
    if (generation == 0) {  // no seek yet: the producer starts where it was told
      have_next = true;
      next_epoch = copy.first_epoch;
      next_batch = copy.first_batch;
    }
    return Status::Ok();
  }

  // Under the ring's lock, one look at the consumer's position: the batch,
  // an error, or nothing yet (after waiting one slice for a publish).
  // Batches published before our seek are dropped on the way.
  std::optional<Result<RingBatch>> TakeOrWait(RingLock& lock, uint64_t want_generation,
                                              bool peer_closed, double* waited_s) {
    Control& c = h->control;
    while (true) {
      const uint64_t pos = c.consumed;
      const uint32_t slot = static_cast<uint32_t>(pos % g.slot_count);
      SlotHeader* s = Slot(slot);
      const uint64_t holding = taken[slot].load();
      if (holding != 0) {  // our own batch occupies the slot the next one needs
        return Status::FailedPrecondition(
            "the next batch goes into the slot of a batch this consumer still holds (ring "
            "position " + std::to_string(holding - 1) + "): release it first");
      }
      if (s->state != static_cast<uint32_t>(SlotState::kReady) || s->position != pos) break;
      ++c.consumed;
      if (s->generation != want_generation) {  // published before our seek: drop it
        s->state = static_cast<uint32_t>(SlotState::kFree);
        Wake(c.on_free, c.producer_waiting);
        continue;
      }
      s->state = static_cast<uint32_t>(SlotState::kTaken);
      const BatchMeta meta = s->meta;
      lock.unlock();
      return Deliver(slot, pos, meta, *waited_s);
    }
    const auto state = static_cast<ProducerState>(c.state);
    if (state == ProducerState::kError || state == ProducerState::kStopped) return Gone();
    if (state == ProducerState::kEnd && c.serving_request == want_generation) {
      return Status::OutOfRange(who + " has served its last epoch");
    }
    if (peer_closed) return Gone();
    const auto w0 = Clock::now();
    SleepUntilWoken(lock, c.on_publish, c.consumer_waiting, kSliceMs);
    *waited_s += Since(w0);
    return std::nullopt;
  }

  // The batch in `slot` (taken), as the caller sees it; its size checked.
  Result<RingBatch> Deliver(uint32_t slot, uint64_t pos, const BatchMeta& meta, double waited_s)
      NL_EXCLUDES(mu) {
    if (meta.size == 0 || meta.size > g.batch_size) {
      return Status::Corruption(who + " published a batch of " + std::to_string(meta.size) +
                                " samples into a ring of " + std::to_string(g.batch_size));
    }
    char* slot_base = reinterpret_cast<char*>(Slot(slot));
    RingBatch b;
    b.pixels = slot_base + g.pixels_offset;
    b.labels = reinterpret_cast<const int64_t*>(slot_base + g.labels_offset);
    b.indices = reinterpret_cast<const int64_t*>(slot_base + g.indices_offset);
    b.size = meta.size;
    b.slot = slot;
    b.epoch = meta.epoch;
    b.batch = meta.batch;
    b.position = pos;
    b.wait_s = waited_s;
    MutexLock local(&mu);
    b.sequence = sequence++;
    taken[slot] = pos + 1;
    ++held;
    have_next = true;
    next_epoch = meta.epoch + (meta.batch + 1 >= info.batches_per_epoch ? 1 : 0);
    next_batch = (meta.batch + 1) % info.batches_per_epoch;
    return b;
  }
};

RingClient::RingClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RingClient::~RingClient() = default;

namespace {

// Connects to the producer's socket, retrying every 50 ms until timeout_s
// (< 0: no limit) has passed since `start`.
Result<Fd> ConnectToProducer(const std::string& job_id, int rank, const std::string& where,
                             double timeout_s, Clock::time_point start) {
  NL_ASSIGN_OR_RETURN(const std::string name, SocketName(job_id, rank));
  while (true) {
    auto conn = ConnectAbstract(name);
    if (conn.ok()) return std::move(*conn);
    if (conn.status().code() != StatusCode::kNotFound) return conn.status().WithContext(where);
    if (timeout_s >= 0 && Since(start) >= timeout_s) {
      return Status::NotFound("no loader serve for " + where + " appeared within " +
                              Seconds(timeout_s) + " (start `loader serve --job-id " + job_id +
                              " --rank " + std::to_string(rank) + " ...` as this user)");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace

Result<std::unique_ptr<RingClient>> RingClient::Attach(const std::string& job_id, int rank,
                                                       double timeout_s) {
  auto impl = std::make_unique<Impl>();
  Impl& m = *impl;
  const std::string where = "job " + job_id + ", rank " + std::to_string(rank);
  const auto start = Clock::now();
  NL_ASSIGN_OR_RETURN(m.conn, ConnectToProducer(job_id, rank, where, timeout_s, start));
  NL_ASSIGN_OR_RETURN(const PeerCred peer, GetPeerCred(m.conn.get()));
  m.who = "loader serve for " + where + " (pid " + std::to_string(peer.pid) + ")";
  if (peer.uid != ::geteuid()) {
    return m.Refuse("it runs as uid " + std::to_string(peer.uid) + ", and this consumer as uid " +
                    std::to_string(::geteuid()) + "; only a producer of our own uid is trusted");
  }
  // At least 1 s for the hello; at most an hour (and never NaN): the
  // milliseconds must fit an int.
  double left = timeout_s < 0 ? 30.0 : std::max(1.0, timeout_s - Since(start));
  if (!(left <= 3600.0)) left = 3600.0;
  NL_ASSIGN_OR_RETURN(const Fd segment, m.ReceiveSegment(left));
  Header copy;
  NL_RETURN_IF_ERROR(m.MapSegment(segment, peer, job_id, rank, &copy));
  m.info.job_id = job_id;
  m.info.rank = rank;
  NL_RETURN_IF_ERROR(m.Adopt(copy, peer.pid));
  return std::unique_ptr<RingClient>(new RingClient(std::move(impl)));
}

const RingInfo& RingClient::info() const { return impl_->info; }

void RingClient::Goodbye() {
  Impl& m = *impl_;
  MutexLock local(&m.mu);
  if (m.said_goodbye.exchange(true)) return;
  if (m.conn.valid()) (void)SendMessage(m.conn.get(), MakeMessage(MessageKind::kDetach, ""));
  // The connection stays open (a Next waiting in another thread may still
  // look at it); the destructor closes it without a second goodbye.
}

Result<RingBatch> RingClient::Next(double timeout_s) {
  Impl& m = *impl_;
  if (m.said_goodbye) return m.Closed();
  if (m.in_next.exchange(true)) {
    return Status::FailedPrecondition("Next() called while another Next() is waiting");
  }
  struct Leave {
    std::atomic<bool>* flag;
    ~Leave() { flag->store(false); }
  } leave{&m.in_next};
  uint64_t generation;
  {
    MutexLock local(&m.mu);
    if (m.held >= m.g.slot_count) {
      return Status::FailedPrecondition("all " + std::to_string(m.g.slot_count) +
                                        " slots of the ring are held: release a batch first");
    }
    generation = m.generation;
  }
  const auto start = Clock::now();
  bool peer_closed = false;
  double waited_s = 0;
  while (true) {
    {
      RingLock lock = TryLockFor(m.h->control, kSliceMs);
      if (lock.owns()) {
        std::optional<Result<RingBatch>> got = m.TakeOrWait(lock, generation, peer_closed, &waited_s);
        if (got.has_value()) return std::move(*got);
      } else if (peer_closed) {
        return m.Gone();  // it died holding the lock: nothing in the ring can be trusted
      }
    }
    // One more look at the ring after the peer closed: batches it published
    // before it went are delivered, then its death is reported.
    if (!peer_closed && PeerClosed(m.conn.get())) {
      peer_closed = true;
      continue;
    }
    if (timeout_s >= 0 && Since(start) >= timeout_s) return m.Stuck();
  }
}

Status RingClient::Release(const RingBatch& b) {
  Impl& m = *impl_;
  MutexLock local(&m.mu);
  if (m.said_goodbye) return m.Closed();
  if (b.slot >= m.g.slot_count || m.taken[b.slot] == 0 || m.taken[b.slot] != b.position + 1) {
    return Status::InvalidArgument("release of batch " + std::to_string(b.sequence) +
                                   ", which is not held (released twice, or never delivered)");
  }
  // A producer stopped while holding the lock (SIGSTOP) is waited for; only
  // a closed connection means it is gone.
  while (true) {
    RingLock lock = TryLockFor(m.h->control, kSliceMs);
    if (lock.owns()) {
      m.Slot(b.slot)->state = static_cast<uint32_t>(SlotState::kFree);
      Wake(m.h->control.on_free, m.h->control.producer_waiting);
      m.taken[b.slot] = 0;
      --m.held;
      return Status::Ok();
    }
    if (PeerClosed(m.conn.get())) break;
  }
  // The producer is gone (or stuck holding the lock): the slot is ours to drop.
  m.taken[b.slot] = 0;
  --m.held;
  return m.Gone();
}

Status RingClient::Seek(uint64_t epoch, uint64_t batch) {
  Impl& m = *impl_;
  MutexLock local(&m.mu);
  if (m.said_goodbye) return m.Closed();
  if (m.held != 0) {
    return Status::FailedPrecondition("seek with " + std::to_string(m.held) +
                                      " batches held: release them first");
  }
  if (batch >= m.info.batches_per_epoch) {
    return Status::InvalidArgument("batch " + std::to_string(batch) + " is past the " +
                                   std::to_string(m.info.batches_per_epoch) +
                                   " batches of an epoch");
  }
  if (m.info.epochs != 0) {
    // The producer serves epochs [first_epoch, first_epoch + epochs).
    const uint64_t first_epoch = m.h->first_epoch;
    if (epoch < first_epoch || epoch - first_epoch >= m.info.epochs) {
      return Status::InvalidArgument("epoch " + std::to_string(epoch) + " is outside the " +
                                     std::to_string(m.info.epochs) + " epochs " + m.who +
                                     " serves (from epoch " + std::to_string(first_epoch) + ")");
    }
  }
  if (m.have_next && m.next_epoch == epoch && m.next_batch == batch) return Status::Ok();
  while (true) {
    RingLock lock = TryLockFor(m.h->control, kSliceMs);
    if (lock.owns()) {
      Control& c = m.h->control;
      c.request_id += 1;
      c.request_epoch = epoch;
      c.request_batch = batch;
      m.generation = c.request_id;
      m.have_next = true;
      m.next_epoch = epoch;
      m.next_batch = batch;
      Wake(c.on_free, c.producer_waiting);
      return Status::Ok();
    }
    if (PeerClosed(m.conn.get())) break;
  }
  return m.Gone();
}

uint32_t RingClient::held() const {
  MutexLock local(&impl_->mu);
  return impl_->held;
}

void* RingClient::ring_base() const { return impl_->base; }
uint64_t RingClient::ring_bytes() const { return impl_->bytes; }

}  // namespace nl
