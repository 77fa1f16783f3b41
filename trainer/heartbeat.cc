#include "trainer/heartbeat.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <cstdio>
#include <future>
#include <memory>
#include <vector>

#include "trainer/rank_error.h"

namespace nl::trainer {
namespace {

int64_t WallMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void AppendTo(std::string* list, const std::string& item) { *list += (list->empty() ? "" : "; ") + item; }

}  // namespace

const char* PhaseName(int p) {
  switch (static_cast<Phase>(p)) {
    case Phase::kStarting:
      return "starting";
    case Phase::kData:
      return "waiting for data from its loader";
    case Phase::kCompute:
      return "computing";
    case Phase::kComm:
      return "in a collective";
    case Phase::kEval:
      return "evaluating";
    case Phase::kCheckpoint:
      return "writing a checkpoint";
    case Phase::kDone:
      return "done";
  }
  return "unknown";
}

c10::intrusive_ptr<c10d::Store> ConnectStore(const StoreAddress& a, std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions so;
  so.port = static_cast<uint16_t>(a.port);
  so.isServer = false;
  so.waitWorkers = false;
  so.timeout = timeout;
  return c10::make_intrusive<c10d::PrefixStore>(a.prefix, c10::make_intrusive<c10d::TCPStore>(a.host, so));
}

Heartbeat::Heartbeat(StoreAddress a, int rank, int world)
    : a_(std::move(a)), rank_(rank), world_(world), since_(WallMs()) {
  thread_ = Take(Thread::Start("nl-heartbeat",
                               [this]() -> Status {
                                 Loop();
                                 return Status::Ok();
                               }),
                 "cannot start its heartbeat");
}

Heartbeat::~Heartbeat() {
  {
    MutexLock l(&mu_);
    stop_ = true;
  }
  cv_.NotifyAll();
  (void)thread_.Join();  // Loop returns only Ok; a store error is retried there
}

void Heartbeat::Set(Phase p, int64_t step) {
  step_.store(step);
  if (phase_.exchange(static_cast<int>(p)) != static_cast<int>(p)) since_.store(WallMs());
}

std::string Heartbeat::Peers(bool* behind) const {
  struct Answer {
    std::string text;
    bool behind = false;
  };
  auto result = std::make_shared<std::promise<Answer>>();
  std::future<Answer> f = result->get_future();
  if (behind) *behind = false;
  // The thread gets copies, not `this`: after a timeout it outlives the
  // Heartbeat (the rank unwinds while the store call still blocks); it is
  // left behind only when rank 0's store hangs, and this process is about to end.
  const Status started = Thread::StartDetached("nl-peers", [a = a_, rank = rank_, world = world_, result]() -> Status {
    Answer an;
    try {
      an.text = PeersNow(a, rank, world, &an.behind);
    } catch (...) {
      an.text = "the rendezvous store (hosted by rank 0) failed to answer";
    }
    result->set_value(an);
    return Status::Ok();
  });
  if (!started.ok()) return "the heartbeats could not be read (" + started.ToString() + ")";
  if (f.wait_for(std::chrono::seconds(5)) != std::future_status::ready) {
    return "the rendezvous store (hosted by rank 0) does not answer within 5 s: rank 0 is stopped or hung";
  }
  Answer an = f.get();
  if (behind) *behind = an.behind;
  return an.text;
}

std::string Heartbeat::PeersNow(const StoreAddress& a, int self, int world, bool* behind) {
  c10::intrusive_ptr<c10d::Store> st;
  try {
    st = ConnectStore(a, std::chrono::milliseconds(3000));
  } catch (const std::exception&) {
    return "the rendezvous store (hosted by rank 0) does not answer: rank 0 is stopped, hung or gone";
  }
  const int64_t now = WallMs();
  std::string silent, waiting;
  try {
    for (int r = 0; r < world; ++r) {
      if (r == self) continue;
      const std::string key = "hb/" + std::to_string(r);
      if (!st->check({key})) {
        AppendTo(&silent, "rank " + std::to_string(r) + " never sent one");
        continue;
      }
      const std::vector<uint8_t> v = st->get(key);
      long long step = 0, since = 0, at = 0;
      int phase = 0;
      if (std::sscanf(std::string(v.begin(), v.end()).c_str(), "%lld %d %lld %lld", &step, &phase, &since, &at) !=
          4) {
        continue;
      }
      char buf[256];
      if (now - at > 3000) {
        std::snprintf(buf, sizeof buf, "rank %d silent for %.1f s (last: step %lld, %s)", r,
                      1e-3 * static_cast<double>(now - at), step, PhaseName(phase));
        AppendTo(&silent, buf);
      } else if (phase != static_cast<int>(Phase::kComm) && now - since > 2000) {
        std::snprintf(buf, sizeof buf, "rank %d %s for %.1f s (step %lld)", r, PhaseName(phase),
                      1e-3 * static_cast<double>(now - since), step);
        AppendTo(&waiting, buf);
      }
    }
  } catch (const std::exception&) {
    return "the rendezvous store (hosted by rank 0) stopped answering: rank 0 is stopped, hung or gone";
  }
  *behind = !silent.empty() || !waiting.empty();
  if (!silent.empty()) return "no heartbeat from the rank it waits for: " + silent + (waiting.empty() ? "" : "; " + waiting);
  if (!waiting.empty()) return "the rank it waits for: " + waiting;
  return "every other rank still sends heartbeats and none is stuck outside a collective";
}

void Heartbeat::Loop() {
  c10::intrusive_ptr<c10d::Store> st;
  MutexLock l(&mu_);
  while (!stop_) {
    l.Unlock();
    try {
      if (!st) st = ConnectStore(a_, std::chrono::milliseconds(5000));
      const std::string v = std::to_string(step_.load()) + " " + std::to_string(phase_.load()) + " " +
                            std::to_string(since_.load()) + " " + std::to_string(WallMs());
      st->set("hb/" + std::to_string(rank_), std::vector<uint8_t>(v.begin(), v.end()));
    } catch (const std::exception&) {
      st.reset();  // the store is gone or slow: try again next time
    }
    l.Lock();
    const auto before = std::chrono::steady_clock::now();
    const auto until = before + std::chrono::seconds(1);
    while (!stop_ && cv_.WaitUntil(&mu_, until)) {
    }
    if (stop_) break;
    const int64_t late = std::chrono::duration_cast<std::chrono::milliseconds>(
                             std::chrono::steady_clock::now() - before - std::chrono::seconds(1))
                             .count();
    if (late >= kFrozenMs && late > frozen_ms_.load()) {
      frozen_step_.store(step_.load());
      frozen_ms_.store(late);
    }
  }
}

std::pair<int64_t, int64_t> Heartbeat::TakeFrozen() {
  const int64_t step = frozen_step_.load();
  return {frozen_ms_.exchange(0), step};
}

}  // namespace nl::trainer
