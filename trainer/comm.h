// The rank's collectives over its process group, each named for its error
// message: a timeout or a lost peer is a RankError of kind kEcho (the
// failure is another rank's; the heartbeats name which); anything else kOwn.
// For the rank's one thread.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "trainer/diagnostics.h"
#include "trainer/timing.h"

namespace nl::trainer {

class Heartbeat;

class Comm {
 public:
  // hb (may be null): whom to ask which peer a collective waited for.
  Comm(c10::intrusive_ptr<c10d::ProcessGroup> pg, int world, std::chrono::milliseconds timeout,
       const Heartbeat* hb);

  // Waits for a collective started elsewhere (GradReducer's buckets).
  void Wait(const c10::intrusive_ptr<c10d::Work>& w, const std::string& what);
  c10::intrusive_ptr<c10d::Work> StartAllReduceSum(std::vector<at::Tensor>& tensors);
  void AllReduceSum(at::Tensor& t, const std::string& what);
  void Broadcast(at::Tensor& t, const std::string& what);  // from rank 0
  // Broadcasts tensors from rank 0, flattened per dtype (one collective each).
  void BroadcastCoalesced(const std::vector<at::Tensor>& ts, const std::string& what);
  int world() const { return world_; }
  std::string backend_name() const { return pg_->getBackendName(); }

 private:
  [[noreturn]] void Fail(const std::exception& e, const std::string& what) const;

  c10::intrusive_ptr<c10d::ProcessGroup> pg_;
  int world_;
  std::chrono::milliseconds timeout_;
  const Heartbeat* hb_;
};

// Every rank's window, gathered (an all-reduce of a [world, kTimingFields] table).
std::vector<RankTiming> GatherTimings(Comm& comm, int rank, const Window& w, uint64_t ran_on);

}  // namespace nl::trainer
