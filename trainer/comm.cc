#include "trainer/comm.h"

#include <c10/core/GradMode.h>

#include <map>

#include "trainer/comm_failure.h"
#include "trainer/heartbeat.h"
#include "trainer/rank_error.h"

namespace nl::trainer {

Comm::Comm(c10::intrusive_ptr<c10d::ProcessGroup> pg, int world, std::chrono::milliseconds timeout,
           const Heartbeat* hb)
    : pg_(std::move(pg)), world_(world), timeout_(timeout), hb_(hb) {}

void Comm::Wait(const c10::intrusive_ptr<c10d::Work>& w, const std::string& what) {
  try {
    w->wait(timeout_);
  } catch (const std::exception& e) {
    Fail(e, what);
  }
}

c10::intrusive_ptr<c10d::Work> Comm::StartAllReduceSum(std::vector<at::Tensor>& tensors) {
  return pg_->allreduce(tensors);
}

void Comm::AllReduceSum(at::Tensor& t, const std::string& what) {
  std::vector<at::Tensor> v{t};
  Wait(pg_->allreduce(v), what);
}

void Comm::Broadcast(at::Tensor& t, const std::string& what) {
  std::vector<at::Tensor> v{t};
  c10d::BroadcastOptions o;
  o.rootRank = 0;
  Wait(pg_->broadcast(v, o), what);
}

void Comm::BroadcastCoalesced(const std::vector<at::Tensor>& ts, const std::string& what) {
  std::map<int, std::vector<at::Tensor>> by_type;
  for (const auto& t : ts) by_type[static_cast<int>(t.scalar_type())].push_back(t);
  for (auto& [type, group] : by_type) {
    std::vector<at::Tensor> flat;
    for (auto& t : group) flat.push_back(t.detach().reshape({-1}));
    at::Tensor all = at::cat(flat);
    Broadcast(all, what);
    int64_t off = 0;
    for (auto& t : group) {
      c10::NoGradGuard ng;
      t.copy_(all.narrow(0, off, t.numel()).view_as(t));
      off += t.numel();
    }
  }
}

void Comm::Fail(const std::exception& e, const std::string& what) const {
  std::string cause = FailureText(e);
  const size_t nl = cause.find('\n');
  if (nl != std::string::npos) cause.erase(nl);
  switch (ClassifyCommFailure(e)) {
    case CommFailure::kTimeout:
      throw CollectiveTimeout(what, std::chrono::duration<double>(timeout_).count(),
                              hb_ ? hb_->Peers() : std::string("no heartbeats to tell which"), cause);
    case CommFailure::kPeerLost: {
      // Rank 0 hosts the store, so it can still read the heartbeats at once:
      // a peer that gave up waiting for its data (and closed the connection
      // first) is named, not only "connection closed". (Another rank would
      // wait for a store that may be gone with rank 0.)
      std::string before;
      if (hb_ && hb_->rank() == 0) {
        bool behind = false;
        const std::string peers = hb_->Peers(&behind);
        if (behind) before = peers;
      }
      throw PeerLost(what, cause, before);
    }
    case CommFailure::kOther:
      break;
  }
  throw RankError("a collective (" + what + ") failed: " + cause);
}

std::vector<RankTiming> GatherTimings(Comm& comm, int rank, const Window& w, uint64_t ran_on) {
  at::Tensor t = at::zeros({comm.world(), kTimingFields}, at::kDouble);
  const TimingRow row = RowOf(w, ran_on);
  for (int k = 0; k < kTimingFields; ++k) t[rank][k] = row[static_cast<size_t>(k)];
  comm.AllReduceSum(t, "the gathering of the timing report");
  auto a = t.accessor<double, 2>();
  std::vector<RankTiming> out;
  for (int r = 0; r < comm.world(); ++r) {
    TimingRow got;
    for (int k = 0; k < kTimingFields; ++k) got[static_cast<size_t>(k)] = a[r][k];
    out.push_back(TimingOf(r, got));
  }
  return out;
}

}  // namespace nl::trainer
