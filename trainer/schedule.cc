#include "trainer/schedule.h"

#include "loader/pipeline/sampler.h"
#include "trainer/serve_args.h"

#include <algorithm>
#include <cmath>

namespace nl::trainer {

Schedule MakeSchedule(const Options& o, uint64_t train_samples, int world) {
  Schedule s;
  Placement p;
  p.world = world;
  const PipelineConfig train = TrainPipeline(o, p, 0, 0, o.transform.image_size);
  s.batches_per_epoch = BatchesPerEpoch(SamplerConfigFor(train, train_samples));
  s.schedule_steps = o.epochs * static_cast<int64_t>(s.batches_per_epoch);
  s.total_steps = o.max_steps > 0 ? std::min<int64_t>(o.max_steps, s.schedule_steps) : s.schedule_steps;
  s.warmup = o.warmup_steps >= 0 ? o.warmup_steps : std::min<int64_t>(500, s.schedule_steps / 10);
  return s;
}

double LearningRate(const Options& o, int64_t step, int64_t total, int64_t warmup) {
  if (warmup > 0 && step < warmup) return o.lr * static_cast<double>(step + 1) / static_cast<double>(warmup);
  const double span = static_cast<double>(std::max<int64_t>(1, total - warmup));
  const double t = std::min(1.0, static_cast<double>(step - warmup) / span);
  return o.lr * 0.5 * (1.0 + std::cos(M_PI * t));
}

}  // namespace nl::trainer
