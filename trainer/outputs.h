// Rank 0's files in --out and beside --metrics-out: written through the one
// atomic writer (base/file_util.h), and the temporaries a killed job left
// removed at the next start.
#pragma once

#include <string>
#include <vector>

namespace nl::trainer {

// Writes bytes to path atomically (WriteFileAtomically, its temporary
// removed by a terminating signal too). Throws RankError with the writer's
// message; with `what` ("the checkpoint"), the message names it: "cannot
// write the checkpoint <path> (as <temporary>): No space left on device".
void WriteAtomically(const std::string& path, const std::string& bytes, const std::string& what = "");

// "cannot write X: ..." -> "cannot write <what> X: ..." (any "cannot <verb> "
// opening); other messages unchanged.
std::string NameInMessage(const std::string& message, const std::string& what);

// Whether a temporary standing in for `base` is one of the rank's outputs
// (checkpoint.pt, timing-epoch-*.svg).
bool IsRankOutput(const std::string& base);

// Removes the temporaries of the rank's outputs in dir (none when dir is
// ""); the full paths removed. Only while the outputs are locked: none can
// then belong to a running job.
std::vector<std::string> RemoveStaleOutputTemporaries(const std::string& dir);

}  // namespace nl::trainer
