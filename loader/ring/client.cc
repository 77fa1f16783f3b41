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
#include <mutex>
#include <thread>
#include <vector>

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
  std::mutex mu;  // guards the fields below (Release may come from another thread)
  // Per slot: position + 1 while we hold it, else 0. Written under `mu`;
  // atomic so that Next() reads it while holding the ring's lock without
  // taking `mu` (Release takes `mu`, then the ring's lock: no inversion).
  std::unique_ptr<std::atomic<uint64_t>[]> taken;
  uint32_t held = 0;
  uint64_t sequence = 0;
  uint64_t generation = 0;  // the request our batches must answer
  bool have_next = false;   // whether next_epoch/next_batch are known
  uint64_t next_epoch = 0, next_batch = 0;

  ~Impl() {
    if (conn.valid()) (void)SendMessage(conn.get(), MakeMessage(MessageKind::kDetach, ""));
    if (base != MAP_FAILED) ::munmap(base, bytes);
  }

  SlotHeader* Slot(uint32_t i) const {
    return reinterpret_cast<SlotHeader*>(static_cast<char*>(base) + g.slots_offset +
                                         uint64_t{i} * g.slot_bytes);
  }

  // The producer is gone: its error text if it left one, else what we know.
  Status Gone() const {
    std::string text(h->error, strnlen(h->error, kErrorBytes));
    const std::string now = ProcessState(info.producer_pid);
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
                                    ProcessState(info.producer_pid) + "; " + doing);
  }
};

RingClient::RingClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RingClient::~RingClient() = default;

Result<std::unique_ptr<RingClient>> RingClient::Attach(const std::string& job_id, int rank,
                                                       double timeout_s) {
  NL_ASSIGN_OR_RETURN(const std::string name, SocketName(job_id, rank));
  auto impl = std::make_unique<Impl>();
  Impl& m = *impl;
  const std::string where = "job " + job_id + ", rank " + std::to_string(rank);
  const auto start = Clock::now();
  while (true) {
    auto conn = ConnectAbstract(name);
    if (conn.ok()) {
      m.conn = std::move(*conn);
      break;
    }
    if (conn.status().code() != StatusCode::kNotFound) return conn.status().WithContext(where);
    if (timeout_s >= 0 && Since(start) >= timeout_s) {
      return Status::NotFound("no loader serve for " + where + " appeared within " +
                              Seconds(timeout_s) + " (start `loader serve --job-id " + job_id +
                              " --rank " + std::to_string(rank) + " ...` as this user)");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  NL_ASSIGN_OR_RETURN(const PeerCred peer, GetPeerCred(m.conn.get()));
  m.who = "loader serve for " + where + " (pid " + std::to_string(peer.pid) + ")";
  auto refuse = [&](const std::string& why) {
    (void)SendMessage(m.conn.get(), MakeMessage(MessageKind::kRefused, why));
    m.conn.Reset();
    return Status::FailedPrecondition("refused " + m.who + ": " + why);
  };
  if (peer.uid != ::geteuid()) {
    return refuse("it runs as uid " + std::to_string(peer.uid) + ", and this consumer as uid " +
                  std::to_string(::geteuid()) + "; only a producer of our own uid is trusted");
  }
  Message hello;
  Fd segment;
  // At least 1 s for the hello; at most an hour (and never NaN): the
  // milliseconds must fit an int.
  double left = timeout_s < 0 ? 30.0 : std::max(1.0, timeout_s - Since(start));
  if (!(left <= 3600.0)) left = 3600.0;
  const Status got = ReceiveMessage(m.conn.get(), static_cast<int>(left * 1000), &hello, &segment);
  if (!got.ok()) {
    return Status(got.code(), m.who + " did not hand over its ring: " + got.message());
  }
  if (hello.kind == static_cast<uint32_t>(MessageKind::kRefused)) {
    m.conn.Reset();
    return Status::FailedPrecondition(m.who + " refused this consumer: " + hello.text);
  }
  if (hello.kind != static_cast<uint32_t>(MessageKind::kSegment) || !segment.valid()) {
    return refuse("its first message carries no ring segment");
  }
  if (hello.version != kVersion) {
    return refuse("it speaks ring version " + std::to_string(hello.version) + ", we speak " +
                  std::to_string(kVersion));
  }
  struct stat st{};
  if (::fstat(segment.get(), &st) != 0) return Status::FromErrno("fstat of the ring segment", errno);
  const int seals = ::fcntl(segment.get(), F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) {
    return refuse("its segment is not sealed against shrinking (it could be cut under us)");
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < sizeof(Header) || size > kMaxSegmentBytes) {
    return refuse("its segment has " + std::to_string(size) + " bytes");
  }
  m.bytes = size;
  m.base = ::mmap(nullptr, m.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, segment.get(), 0);
  if (m.base == MAP_FAILED) return Status::FromErrno("mapping the ring segment", errno);
  m.h = static_cast<Header*>(m.base);
  // One copy of the header's fixed part: checked, then only the copy is used.
  Header copy;
  std::memcpy(static_cast<void*>(&copy), m.h, offsetof(Header, control));
  const Status geometry = CheckGeometry(copy, size);
  if (!geometry.ok()) return refuse(geometry.message());
  if (copy.producer_uid != peer.uid || copy.producer_pid != peer.pid) {
    return refuse("its segment names pid " + std::to_string(copy.producer_pid) + " / uid " +
                  std::to_string(copy.producer_uid) + ", but the socket's peer is pid " +
                  std::to_string(peer.pid) + " / uid " + std::to_string(peer.uid));
  }
  if (std::string(copy.job_id) != job_id || copy.rank != rank) {
    return refuse("its segment is for job " + std::string(copy.job_id) + ", rank " +
                  std::to_string(copy.rank));
  }
  if (copy.batches_per_epoch == 0) return refuse("its segment says an epoch has no batches");
  m.g = copy.geometry;
  m.info.geometry = copy.geometry;
  m.info.job_id = job_id;
  m.info.rank = rank;
  m.info.producer_pid = peer.pid;
  m.info.batches_per_epoch = copy.batches_per_epoch;
  m.info.epochs = copy.epochs;
  m.taken.reset(new std::atomic<uint64_t>[m.g.slot_count]());
  m.attached_ns = MonotonicNs();
  {
    RingLock lock = TryLockFor(m.h->control, 1000);
    if (!lock.owns()) return refuse("its ring's lock stayed held for 1 s");
    m.h->consumer_pid = ::getpid();
    m.generation = m.h->control.request_id;
    if (m.generation == 0) {  // no seek yet: the producer starts where it was told
      m.have_next = true;
      m.next_epoch = copy.first_epoch;
      m.next_batch = copy.first_batch;
    }
  }
  return std::unique_ptr<RingClient>(new RingClient(std::move(impl)));
}

const RingInfo& RingClient::info() const { return impl_->info; }

Result<RingBatch> RingClient::Next(double timeout_s) {
  Impl& m = *impl_;
  if (m.in_next.exchange(true)) {
    return Status::FailedPrecondition("Next() called while another Next() is waiting");
  }
  struct Leave {
    std::atomic<bool>* flag;
    ~Leave() { flag->store(false); }
  } leave{&m.in_next};
  uint64_t generation;
  {
    std::lock_guard local(m.mu);
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
        Control& c = m.h->control;
        const uint64_t pos = c.consumed;
        const uint32_t slot = static_cast<uint32_t>(pos % m.g.slot_count);
        SlotHeader* s = m.Slot(slot);
        const uint64_t holding = m.taken[slot].load();
        if (holding != 0) {  // our own batch occupies the slot the next one needs
          return Status::FailedPrecondition(
              "the next batch goes into the slot of a batch this consumer still holds (ring "
              "position " + std::to_string(holding - 1) + "): release it first");
        }
        if (s->state == static_cast<uint32_t>(SlotState::kReady) && s->position == pos) {
          ++c.consumed;
          if (s->generation != generation) {  // published before our seek: drop it
            s->state = static_cast<uint32_t>(SlotState::kFree);
            Wake(c.on_free, c.producer_waiting);
            continue;
          }
          s->state = static_cast<uint32_t>(SlotState::kTaken);
          const BatchMeta meta = s->meta;
          lock.unlock();
          if (meta.size == 0 || meta.size > m.g.batch_size) {
            return Status::Corruption(m.who + " published a batch of " +
                                      std::to_string(meta.size) + " samples into a ring of " +
                                      std::to_string(m.g.batch_size));
          }
          char* base = reinterpret_cast<char*>(s);
          RingBatch b;
          b.pixels = base + m.g.pixels_offset;
          b.labels = reinterpret_cast<const int64_t*>(base + m.g.labels_offset);
          b.indices = reinterpret_cast<const int64_t*>(base + m.g.indices_offset);
          b.size = meta.size;
          b.slot = slot;
          b.epoch = meta.epoch;
          b.batch = meta.batch;
          b.position = pos;
          b.wait_s = waited_s;
          std::lock_guard local(m.mu);
          b.sequence = m.sequence++;
          m.taken[slot] = pos + 1;
          ++m.held;
          m.have_next = true;
          m.next_epoch = meta.epoch + (meta.batch + 1 >= m.info.batches_per_epoch ? 1 : 0);
          m.next_batch = (meta.batch + 1) % m.info.batches_per_epoch;
          return b;
        }
        const auto state = static_cast<ProducerState>(c.state);
        if (state == ProducerState::kError || state == ProducerState::kStopped) {
          return m.Gone();
        }
        if (state == ProducerState::kEnd && c.serving_request == generation) {
          return Status::OutOfRange(m.who + " has served its last epoch");
        }
        if (peer_closed) return m.Gone();
        const auto w0 = Clock::now();
        SleepUntilWoken(lock, c.on_publish, c.consumer_waiting, kSliceMs);
        waited_s += Since(w0);
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
  std::lock_guard local(m.mu);
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
  std::lock_guard local(m.mu);
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
  std::lock_guard local(impl_->mu);
  return impl_->held;
}

void* RingClient::ring_base() const { return impl_->base; }
uint64_t RingClient::ring_bytes() const { return impl_->bytes; }

}  // namespace nl
