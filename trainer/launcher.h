// The launcher: `trainer --nproc-per-node N` runs N copies of itself as the
// node's ranks, with torchrun's variables set, and watches them.
//
// If a rank fails (non-zero exit or a signal: its own error, its loader
// service's death, a kill -9), the launcher stops the others (SIGTERM, then
// SIGKILL after a grace period), and exits 1 with one line naming the rank,
// its pid and its cause. SIGINT/SIGTERM to the launcher stop every rank the
// same way (exit 128+signal). Ranks die with the launcher (PR_SET_PDEATHSIG),
// and each rank's loader service with its rank, so kill -9 of the launcher
// leaves nothing either. Shared memory is anonymous (memfd): nothing to clean.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "base/child_process.h"
#include "trainer/options.h"

namespace nl::trainer {

struct LaunchResult {
  int exit_code = 0;
  std::string message;  // empty on success
};

// argv: the trainer's own command line (passed on to the ranks unchanged).
// `log` gets the launcher's lines.
LaunchResult Launch(const Options& o, const std::vector<std::string>& argv,
                    const std::function<void(const std::string&)>& log);

// The job id the ranks of one launch share (printable, no '/').
std::string MakeJobId(const Options& o, int launcher_pid);

// What became of one rank, as the launcher saw it.
struct RankOutcome {
  int rank = 0;
  bool done = false;        // it has exited (else it still runs)
  proc::ChildExit exit;     // once done; exit.failure is what it reported
  std::string last_line;    // its last line on stderr (for the message)
};

// A rank's failure that only echoes another's: it said so on its failure
// channel (a peer lost in a collective, a collective or rendezvous timeout,
// the store gone). Never decided from the wording of its message.
bool IsEcho(const RankOutcome& r);
// Among the failed ranks: one killed by a signal, else one that did not
// merely echo another's failure, else `first` (the first to fail).
int PrimaryFailure(const std::vector<RankOutcome>& ranks, int first);
// The launcher's one line for a failed job: the cause (ranks[failed]), the
// ranks that made no progress (stalled, with the first one's process state),
// those that failed after it, and those it stopped.
std::string FailureVerdict(const std::vector<RankOutcome>& ranks, int failed, const std::vector<int>& stalled,
                           const std::string& stalled_state, const std::vector<int>& stopped);

}  // namespace nl::trainer
