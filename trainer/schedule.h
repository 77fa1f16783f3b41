// The training schedule: batches an epoch, steps, warmup and the learning
// rate at each step (linear warmup, then cosine to zero). Pure functions of
// the options, the training split's size and the world size.
#pragma once

#include <cstdint>

#include "trainer/options.h"

namespace nl::trainer {

struct Schedule {
  uint64_t batches_per_epoch = 0;  // the sampler's, the same on every rank
  int64_t schedule_steps = 0;      // --epochs of them: the learning rate's span
  int64_t total_steps = 0;         // what this run trains (--max-steps stops early)
  int64_t warmup = 0;
};

// --max-steps only stops early, so a run cut short and resumed follows the
// same schedule as one run straight.
Schedule MakeSchedule(const Options& o, uint64_t train_samples, int world);

double LearningRate(const Options& o, int64_t step, int64_t total, int64_t warmup);

}  // namespace nl::trainer
