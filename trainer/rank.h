// One DDP rank: its loader (a `loader serve` it starts, or the pipeline in
// process), c10d (Gloo on CPU, NCCL on GPU), the model, the training loop with
// its per-step timings, evaluation, checkpoints and, on rank 0, the reports.
// Exceptions are the error mechanism here (LibTorch throws); RunRank catches
// them and returns the process's exit code after printing one line naming
// the rank and the cause.
#pragma once

#include "trainer/options.h"

namespace nl::trainer {

int RunRank(const Options& options, const Placement& placement);

}  // namespace nl::trainer
