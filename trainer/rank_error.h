// The rank's one error type. Inside trainer/ LibTorch throws, so the rank
// does too: a RankError carries the one line RunRank prints and the kind it
// reports to its launcher (base/child_process.h): kEcho when the failure is
// only the consequence of another rank's failure or stall, kOwn otherwise.
//
//   Check(pipe->Release(*v), "releasing a batch");           // kOwn on error
//   auto p = Take(Pipeline::Open(c), "cannot open ...");     // kOwn on error
//   throw RankError::Echo("lost the rendezvous store ...");  // another's failure
#pragma once

#include <stdexcept>
#include <string>
#include <utility>

#include "base/child_process.h"
#include "base/status.h"

namespace nl::trainer {

class RankError : public std::runtime_error {
 public:
  // The rank's own failure (kOwn).
  explicit RankError(const std::string& message) : RankError(message, proc::FailureKind::kOwn) {}
  // Only the consequence of another rank's failure or stall (kEcho).
  static RankError Echo(const std::string& message) {
    return RankError(message, proc::FailureKind::kEcho);
  }
  proc::FailureKind kind() const { return kind_; }

 private:
  RankError(const std::string& message, proc::FailureKind kind)
      : std::runtime_error(message), kind_(kind) {}
  proc::FailureKind kind_;
};

// Throws RankError("<what>: <status>") (kOwn) when s is not ok.
void Check(const Status& s, const std::string& what);
template <typename T>
T Take(Result<T> r, const std::string& what) {
  if (!r.ok()) throw RankError(what + ": " + r.status().ToString());
  return std::move(*r);
}

// The echo families that need no process group to word (Comm and the
// rendezvous build theirs from these). timeout_s is --timeout.
RankError CollectiveTimeout(const std::string& what, double timeout_s, const std::string& peers,
                            const std::string& cause);
// `before`: what the heartbeats said of the peers ("" when nothing useful).
RankError PeerLost(const std::string& what, const std::string& cause, const std::string& before);
RankError RendezvousTimeout(const std::string& where, double timeout_s, const std::string& missing,
                            size_t missing_count, int world);
RankError StoreUnreachable(const std::string& where, double timeout_s, const std::string& cause);
// `when`: "" or " during the rendezvous" and the like; cause "": the store
// went away between two calls (no error of its own to quote).
RankError StoreLost(const std::string& where, const std::string& when, const std::string& cause);

// "%g" of a number of seconds, as the messages print --timeout.
std::string Seconds(double s);

}  // namespace nl::trainer
