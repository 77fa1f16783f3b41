// The command line of a rank's `loader serve` child (part of the batch
// source): which executable, and the one function that turns the trainer's
// options into its flags.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "trainer/options.h"

namespace nl::trainer {

// --loader-bin, else `loader` beside this executable; throws RankError when
// it is not executable.
std::string LoaderBinary(const Options& o);

// bin serve --data ... for rank p, starting at (start_epoch, start_batch),
// images of ring_size; with --simulate-delay-ms when `delay` (this rank is the
// simulated slow one).
std::vector<std::string> ServeArgs(const Options& o, const Placement& p, const std::string& bin,
                                   uint64_t start_epoch, uint64_t start_batch, int ring_size,
                                   bool delay);

}  // namespace nl::trainer
