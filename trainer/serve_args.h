// What a rank's loader makes, and the command line of its `loader serve`
// child (part of the batch source): the train split's pipeline config, built
// once from the trainer's options, which both the in-process loader and the
// service run, and which the schedule counts its batches from.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loader/pipeline/pipeline.h"
#include "trainer/options.h"

namespace nl::trainer {

// --loader-bin, else `loader` beside this executable; throws RankError when
// it is not executable.
std::string LoaderBinary(const Options& o);

// The train split for rank p of p.world from (start_epoch, start_batch) to
// --epochs, images of ring_size, with the trainer's transform (--augment,
// --pad-crop, --random-resized-crop, ...) and seed. Threads and their start
// hook are the caller's (the rank's plan).
PipelineConfig TrainPipeline(const Options& o, const Placement& p, uint64_t start_epoch,
                             uint64_t start_batch, int ring_size);

// bin serve ... for rank p running `train` (through ServeArgv, the one
// function that turns a request into serve's flags); with
// --simulate-delay-ms when `delay` (this rank is the simulated slow one).
std::vector<std::string> ServeArgs(const Options& o, const Placement& p, const std::string& bin,
                                   const PipelineConfig& train, bool delay);

}  // namespace nl::trainer
