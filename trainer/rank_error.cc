#include "trainer/rank_error.h"

#include <cstdio>

namespace nl::trainer {

void Check(const Status& s, const std::string& what) {
  if (!s.ok()) throw RankError(what + ": " + s.ToString());
}

std::string Seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", s);
  return buf;
}

RankError CollectiveTimeout(const std::string& what, double timeout_s, const std::string& peers,
                            const std::string& cause) {
  return RankError::Echo("waited " + Seconds(timeout_s) + " s (--timeout) in a collective (" + what +
                         ") for a peer that did not come: " + peers + " [" + cause + "]");
}

RankError PeerLost(const std::string& what, const std::string& cause, const std::string& before) {
  return RankError::Echo("lost a peer in a collective (" + what + "): " + cause +
                         (before.empty() ? "" : "; before that, " + before));
}

RankError RendezvousTimeout(const std::string& where, double timeout_s, const std::string& missing,
                            size_t missing_count, int world) {
  return RankError::Echo("waited " + Seconds(timeout_s) + " s at the rendezvous " + where + " for rank" +
                         (missing_count > 1 ? "s " : " ") + missing + " of " + std::to_string(world) +
                         ": are they started, with the same MASTER_ADDR, MASTER_PORT and WORLD_SIZE?");
}

RankError StoreUnreachable(const std::string& where, double timeout_s, const std::string& cause) {
  return RankError::Echo("cannot reach the rendezvous store at " + where + " within " + Seconds(timeout_s) +
                         " s (rank 0 hosts it: is it running, with this MASTER_ADDR and MASTER_PORT?): " +
                         cause);
}

RankError StoreLost(const std::string& where, const std::string& when, const std::string& cause) {
  if (cause.empty()) {
    return RankError::Echo("lost the rendezvous store at " + where + when + " (rank 0 hosts it: it is gone)");
  }
  return RankError::Echo("lost the rendezvous store at " + where + when +
                         " (rank 0 hosts it: it has ended or stopped; its own error says why): " + cause);
}

}  // namespace nl::trainer
