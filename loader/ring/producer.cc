#include "loader/ring/producer.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <iostream>
#include <new>
#include <thread>

#include "base/child_process.h"
#include "base/mutex.h"
#include "loader/ring/ring_lock.h"
#include "loader/ring/ring_socket.h"

namespace nl {

using namespace ring;  // NOLINT: this file is the ring

struct RingProducer::Impl {
  RingSpec spec;
  std::string name, who;  // socket name; "loader serve for job J, rank R (pid P)"
  Fd memfd, listener, conn;
  void* base = MAP_FAILED;
  size_t bytes = 0;
  Header* h = nullptr;
  int consumer_pid = 0;
  Mutex gone_mu;  // ConsumerGone() may be called from several threads
  bool gone NL_GUARDED_BY(gone_mu) = false, detached NL_GUARDED_BY(gone_mu) = false;
  std::string refusal NL_GUARDED_BY(gone_mu);  // what a refusing consumer said

  ~Impl() {
    // The header's mutex and semaphores are not destroyed: the consumer may
    // still use them (its mapping outlives us), and a destroy would race a
    // killed peer's state. They are plain memory in the segment, which goes
    // with the last mapping.
    if (base != MAP_FAILED) ::munmap(base, bytes);
  }
  void Log(const std::string& line) const {
    if (spec.log) {
      spec.log(line);
    } else {
      std::cerr << line << "\n";
    }
  }
  Control& c() const { return h->control; }
  // Locks the ring; false only once the consumer is gone (it may have died
  // holding the lock). A consumer that is merely stopped holding it (SIGSTOP,
  // a debugger) is waited for: it is not gone. Before a consumer is
  // attached nobody else can hold it; 2 s is then more than enough.
  bool Lock(RingLock* lock) const {
    for (int i = 0;; ++i) {
      *lock = TryLockFor(c(), kSliceMs);
      if (lock->owns()) return true;
      if (conn.valid() ? PeerClosed(conn.get()) : i >= 2000 / kSliceMs) return false;
    }
  }
};

RingProducer::RingProducer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RingProducer::~RingProducer() = default;

Result<std::unique_ptr<RingProducer>> RingProducer::Create(const RingSpec& spec) {
  auto impl = std::make_unique<Impl>();
  Impl& m = *impl;
  m.spec = spec;
  NL_ASSIGN_OR_RETURN(m.name, SocketName(spec.job_id, spec.rank));
  m.who = "loader serve for job " + spec.job_id + ", rank " + std::to_string(spec.rank) +
          " (pid " + std::to_string(::getpid()) + ")";
  // The name first: a second producer for the same rank fails before it
  // allocates anything.
  auto listener = ListenAbstract(m.name);
  if (!listener.ok()) {
    return listener.status().WithContext("job " + spec.job_id + ", rank " +
                                         std::to_string(spec.rank));
  }
  m.listener = std::move(*listener);

  const Geometry& g = spec.geometry;
  const std::string memfd_name = "numa_loader:" + spec.job_id + "/" + std::to_string(spec.rank);
  m.memfd = Fd(::memfd_create(memfd_name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!m.memfd.valid()) return Status::FromErrno("memfd_create for the ring", errno);
  // The segment's inode is the user's only (memfd_create makes it 0777; it
  // is reached through the socket, whose peer's uid is checked, or through
  // /proc/<pid>/fd, which the mode then also closes).
  if (::fchmod(m.memfd.get(), 0600) != 0) return Status::FromErrno("fchmod of the ring", errno);
  if (::ftruncate(m.memfd.get(), static_cast<off_t>(g.total_bytes)) != 0) {
    return Status::FromErrno("sizing the ring to " + std::to_string(g.total_bytes) + " bytes",
                             errno);
  }
  // Sealed: neither side can shrink it under the other (no SIGBUS) or grow it.
  if (::fcntl(m.memfd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return Status::FromErrno("sealing the ring segment", errno);
  }
  m.bytes = g.total_bytes;
  m.base = ::mmap(nullptr, m.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, m.memfd.get(), 0);
  if (m.base == MAP_FAILED) {
    return Status::FromErrno("mapping the ring (" + std::to_string(m.bytes) + " bytes)", errno);
  }
  // Only the header and each slot's first page are touched here: the pixel
  // pages are placed by the bound workers that first write them.
  m.h = new (m.base) Header();
  Header& h = *m.h;
  h.magic = kMagic;
  h.version = kVersion;
  h.header_bytes = sizeof(Header);
  h.geometry = g;
  h.producer_pid = ::getpid();
  h.producer_uid = ::geteuid();
  h.rank = spec.rank;
  h.batches_per_epoch = spec.batches_per_epoch;
  h.epochs = spec.epochs;
  h.first_epoch = spec.first_epoch;
  h.first_batch = spec.first_batch;
  std::strncpy(h.job_id, spec.job_id.c_str(), kJobIdMax);
  h.control.state = static_cast<uint32_t>(ProducerState::kStarting);
  for (uint32_t i = 0; i < g.slot_count; ++i) new (SlotAt(m.h, i)) SlotHeader();
  return std::unique_ptr<RingProducer>(new RingProducer(std::move(impl)));
}

Status RingProducer::WaitForConsumer(double timeout_s, const std::atomic<bool>* stop) {
  Impl& m = *impl_;
  SetActivity(Activity::kWaitingForConsumer);
  const auto start = std::chrono::steady_clock::now();
  while (true) {
    if (stop != nullptr && stop->load()) return Status::Aborted("stopped while waiting for a consumer");
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (timeout_s >= 0 && waited > timeout_s) {
      return Status::DeadlineExceeded("no consumer attached to " + m.who + " within " +
                                      std::to_string(timeout_s) + " s");
    }
    pollfd p{m.listener.get(), POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    auto conn = Accept(m.listener.get());
    if (!conn.ok()) continue;
    auto cred = GetPeerCred(conn->get());
    if (!cred.ok()) continue;
    if (cred->uid != ::geteuid()) {
      const std::string why = m.who + " runs as uid " + std::to_string(::geteuid()) +
                              "; a consumer of uid " + std::to_string(cred->uid) +
                              " may not attach to it";
      (void)SendMessage(conn->get(), MakeMessage(MessageKind::kRefused, why));
      m.Log("refused a consumer: pid " + std::to_string(cred->pid) + " runs as uid " +
            std::to_string(cred->uid) + ", not " + std::to_string(::geteuid()));
      continue;
    }
    Message hello = MakeMessage(MessageKind::kSegment, "");
    hello.version = kVersion;
    hello.segment_bytes = m.bytes;
    const Status sent = SendMessage(conn->get(), hello, m.memfd.get());
    if (!sent.ok()) {
      m.Log("a consumer (pid " + std::to_string(cred->pid) + ") left before taking the ring: " +
            sent.message());
      continue;
    }
    m.conn = std::move(*conn);
    m.consumer_pid = cred->pid;
    RingLock lock;
    if (m.Lock(&lock)) {
      m.c().state = static_cast<uint32_t>(ProducerState::kRunning);
    }
    return Status::Ok();
  }
}

int RingProducer::consumer_pid() const { return impl_->consumer_pid; }
Header* RingProducer::header() const { return impl_->h; }
uint32_t RingProducer::slot_count() const { return impl_->h->geometry.slot_count; }

BatchBuffer RingProducer::slot_buffer(uint32_t slot) const {
  Header* h = impl_->h;
  const Geometry& g = h->geometry;
  char* s = SlotBase(h, slot);
  BatchBuffer b;
  b.pixels = reinterpret_cast<uint8_t*>(s + g.pixels_offset);
  b.labels = reinterpret_cast<int64_t*>(s + g.labels_offset);
  b.indices = reinterpret_cast<int64_t*>(s + g.indices_offset);
  b.meta = &SlotAt(h, slot)->meta;
  return b;
}

uint64_t RingProducer::published() const {
  RingLock lock;
  if (!impl_->Lock(&lock)) return 0;
  return impl_->c().published;
}

uint32_t RingProducer::next_slot() const {
  return static_cast<uint32_t>(published() % slot_count());
}

Status RingProducer::WaitForFreeSlot(double timeout_s, const std::atomic<bool>* stop) {
  Impl& m = *impl_;
  const auto start = std::chrono::steady_clock::now();
  while (true) {
    if (stop != nullptr && stop->load()) return Status::Aborted("stopped");
    if (ConsumerGone()) return Status::Unavailable("the consumer is gone");
    {
      RingLock lock = TryLockFor(m.c(), kSliceMs);
      if (lock.owns()) {
        const uint32_t slot = static_cast<uint32_t>(m.c().published % slot_count());
        if (SlotAt(m.h, slot)->state == static_cast<uint32_t>(SlotState::kFree)) {
          return Status::Ok();
        }
        SleepUntilWoken(lock, m.c().on_free, m.c().producer_waiting, kSliceMs);
      }
    }
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (timeout_s >= 0 && waited > timeout_s) {
      return Status::DeadlineExceeded(
          "the consumer (pid " + std::to_string(m.consumer_pid) + ") is " +
          proc::ProcessState(m.consumer_pid) + " but has held every slot for " +
          std::to_string(static_cast<int>(waited)) + " s without releasing one");
    }
  }
}

Status RingProducer::Publish(const BatchMeta& meta, uint64_t generation) {
  Impl& m = *impl_;
  RingLock lock;
  if (!m.Lock(&lock)) return Status::Unavailable("could not lock the ring: the consumer is gone");
  Control& c = m.c();
  const uint32_t slot = static_cast<uint32_t>(c.published % slot_count());
  SlotHeader* s = SlotAt(m.h, slot);
  if (s->state != static_cast<uint32_t>(SlotState::kFree)) {
    return Status::Internal("publishing into slot " + std::to_string(slot) +
                            ", which the consumer has not freed");
  }
  s->meta = meta;
  s->generation = generation;
  s->position = c.published;
  s->state = static_cast<uint32_t>(SlotState::kReady);
  ++c.published;
  c.last_publish_ns = MonotonicNs();
  Wake(c.on_publish, c.consumer_waiting);
  return Status::Ok();
}

RingProducer::Request RingProducer::request() const {
  RingLock lock;
  if (!impl_->Lock(&lock)) return {};
  const Control& c = impl_->c();
  return {c.request_id, c.request_epoch, c.request_batch};
}

Status RingProducer::Reclaim(uint64_t id, double timeout_s, const std::atomic<bool>* stop) {
  Impl& m = *impl_;
  const auto start = std::chrono::steady_clock::now();
  while (true) {
    if (stop != nullptr && stop->load()) return Status::Aborted("stopped");
    if (ConsumerGone()) return Status::Unavailable("the consumer is gone");
    {
      RingLock lock = TryLockFor(m.c(), kSliceMs);
      if (lock.owns()) {
        bool taken = false;
        for (uint32_t i = 0; i < slot_count(); ++i) {
          taken |= SlotAt(m.h, i)->state == static_cast<uint32_t>(SlotState::kTaken);
        }
        if (!taken) {
          for (uint32_t i = 0; i < slot_count(); ++i) {
            SlotAt(m.h, i)->state = static_cast<uint32_t>(SlotState::kFree);
          }
          m.c().consumed = m.c().published;
          m.c().serving_request = id;
          // Running again in the same step: a consumer must never see the
          // new request served while the state still says the old run ended.
          // A stop or an error stays (its text is what the consumer reports).
          if (m.c().state == static_cast<uint32_t>(ProducerState::kEnd)) {
            m.c().state = static_cast<uint32_t>(ProducerState::kRunning);
            std::memset(m.h->error, 0, kErrorBytes);
          }
          return Status::Ok();
        }
        SleepUntilWoken(lock, m.c().on_free, m.c().producer_waiting, kSliceMs);
      }
    }
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (timeout_s >= 0 && waited > timeout_s) {
      return Status::DeadlineExceeded("the consumer asked for a new position but still holds a slot");
    }
  }
}

void RingProducer::WaitForConsumerEvent(double timeout_s) {
  RingLock lock = TryLockFor(impl_->c(), kSliceMs);
  if (!lock.owns()) return;
  SleepUntilWoken(lock, impl_->c().on_free, impl_->c().producer_waiting,
                  static_cast<int>(timeout_s * 1000));
}

bool RingProducer::IsFree(uint64_t position) const {
  RingLock lock;
  if (!impl_->Lock(&lock)) return false;
  const SlotHeader* s = SlotAt(impl_->h, static_cast<uint32_t>(position % slot_count()));
  return s->position != position || s->state == static_cast<uint32_t>(SlotState::kFree);
}

void RingProducer::SetActivity(Activity a, uint64_t epoch, uint64_t batch) {
  RingLock lock;
  if (!impl_->Lock(&lock)) return;
  Control& c = impl_->c();
  if (c.activity != static_cast<uint32_t>(a) || c.activity_epoch != epoch ||
      c.activity_batch != batch) {
    c.activity = static_cast<uint32_t>(a);
    c.activity_since_ns = MonotonicNs();
    c.activity_epoch = epoch;
    c.activity_batch = batch;
  }
}

void RingProducer::Finish(ProducerState state, const std::string& error) {
  Impl& m = *impl_;
  RingLock lock;
  const bool locked = m.Lock(&lock);
  const auto now = static_cast<ProducerState>(m.c().state);
  // A stop or an error is final: a later end (or a second error) must not
  // overwrite the text the consumer will report.
  if (now == ProducerState::kStopped || now == ProducerState::kError) return;
  // The text goes in even without the lock: the consumer reads it once the
  // connection closes, and nothing else writes it.
  std::memset(m.h->error, 0, kErrorBytes);
  std::strncpy(m.h->error, error.c_str(), kErrorBytes - 1);
  if (locked) {
    m.c().state = static_cast<uint32_t>(state);
    if (state == ProducerState::kEnd) {
      m.c().activity = static_cast<uint32_t>(Activity::kEnded);
      m.c().activity_since_ns = MonotonicNs();
    }
    Wake(m.c().on_publish, m.c().consumer_waiting);
  }
}

bool RingProducer::ConsumerGone(bool* detached) {
  Impl& m = *impl_;
  MutexLock gone_lock(&m.gone_mu);
  if (!m.gone && m.conn.valid()) {
    pollfd p{m.conn.get(), POLLIN | POLLRDHUP, 0};
    if (::poll(&p, 1, 0) > 0) {
      if (p.revents & POLLIN) {
        Message msg;
        Fd ignored;
        const Status st = ReceiveMessage(m.conn.get(), 0, &msg, &ignored);
        if (st.ok() && msg.kind == static_cast<uint32_t>(MessageKind::kDetach)) {
          m.gone = m.detached = true;
        } else if (st.ok() && msg.kind == static_cast<uint32_t>(MessageKind::kRefused)) {
          m.gone = true;
          m.refusal = msg.text;
          m.Log("the consumer (pid " + std::to_string(m.consumer_pid) +
                ") refused the ring: " + msg.text);
        } else if (!st.ok()) {
          m.gone = true;
        }
      } else if (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) {
        m.gone = true;
      }
    }
  }
  if (detached != nullptr) *detached = m.detached;
  return m.gone;
}

int RingProducer::connection_fd() const { return impl_->conn.get(); }
std::string RingProducer::refusal() const {
  MutexLock gone_lock(&impl_->gone_mu);
  return impl_->refusal;
}
int RingProducer::listen_fd() const { return impl_->listener.get(); }

void RingProducer::RefuseOne() {
  Impl& m = *impl_;
  auto conn = Accept(m.listener.get());
  if (!conn.ok()) return;
  auto cred = GetPeerCred(conn->get());
  const std::string why = "job " + m.spec.job_id + ", rank " + std::to_string(m.spec.rank) +
                          " already has a consumer (pid " + std::to_string(m.consumer_pid) +
                          "); one consumer per rank";
  (void)SendMessage(conn->get(), MakeMessage(MessageKind::kRefused, why));
  if (cred.ok()) {
    m.Log("refused a second consumer (pid " + std::to_string(cred->pid) + "): " + why);
  }
}

}  // namespace nl
