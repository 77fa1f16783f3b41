// Where each rank is, published to the rendezvous store about once a second
// (key hb/<rank>: "step phase since_ms at_ms"), so that a rank that gives up
// waiting in a collective can say which peer it waited for and what that
// peer was doing, or that it went silent (stopped, hung).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <utility>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "base/mutex.h"
#include "base/thread.h"

namespace nl::trainer {

enum class Phase : int { kStarting, kData, kCompute, kComm, kEval, kCheckpoint, kDone };
const char* PhaseName(int p);  // "waiting for data from its loader", ...

// The job's store: rank 0's TCPStore, under the job's key prefix.
struct StoreAddress {
  std::string host, prefix;
  int port = 0;
};
// A client connection of its own (the heartbeat's thread and its questions
// do not share the rank's). Throws what c10d throws.
c10::intrusive_ptr<c10d::Store> ConnectStore(const StoreAddress& a, std::chrono::milliseconds timeout);

class Heartbeat {
 public:
  // Starts the publishing thread (nl-heartbeat); RankError when it cannot.
  Heartbeat(StoreAddress a, int rank, int world);
  ~Heartbeat();
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

  // From the rank's thread: what it does now.
  void Set(Phase p, int64_t step);

  // The other ranks' last heartbeats, in words: who is behind or silent.
  // Asked with a deadline (5 s): the store lives in rank 0's process, which
  // may be the one that is stopped (a store call would then block for good).
  // *behind (if given) says whether some rank was silent or stuck outside a
  // collective (the text then names it).
  std::string Peers(bool* behind = nullptr) const;
  int rank() const { return rank_; }

  // The longest time this process did not run (its heartbeat thread woke
  // more than kFrozenMs late: SIGSTOP, a debugger, swapping) since the last
  // call, and the step it was at; {0, 0} when none.
  static constexpr int64_t kFrozenMs = 1000;
  std::pair<int64_t, int64_t> TakeFrozen();

 private:
  static std::string PeersNow(const StoreAddress& a, int self, int world, bool* behind);
  void Loop() NL_EXCLUDES(mu_);

  StoreAddress a_;
  int rank_, world_;
  std::atomic<int64_t> step_{0}, since_;
  std::atomic<int> phase_{0};
  std::atomic<int64_t> frozen_ms_{0}, frozen_step_{0};
  Mutex mu_;
  CondVar cv_;
  bool stop_ NL_GUARDED_BY(mu_) = false;
  Thread thread_;
};

}  // namespace nl::trainer
