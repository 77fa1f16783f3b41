#include "trainer/serve_args.h"

#include <unistd.h>

#include "loader/cli/serve_options.h"
#include "trainer/preflight.h"
#include "trainer/proc_info.h"
#include "trainer/rank_error.h"

namespace nl::trainer {

std::string LoaderBinary(const Options& o) {
  const std::string bin = o.loader_bin.empty() ? SelfDir() + "/loader" : o.loader_bin;
  if (access(bin.c_str(), X_OK) != 0) {
    throw RankError("no loader executable at " + bin +
                    " (build the `loader` target, or give --loader-bin)");
  }
  return bin;
}

PipelineConfig TrainPipeline(const Options& o, const Placement& p, uint64_t start_epoch,
                             uint64_t start_batch, int ring_size) {
  PipelineConfig c;
  c.data_dir = o.data;
  c.split = "train";
  c.rank = p.rank;
  c.world = p.world;
  c.batch_size = o.batch_size;
  c.prefetch = o.prefetch;
  c.order = o.order;
  c.io_memory = o.io_memory;
  c.seed = o.seed;
  c.start_epoch = start_epoch;
  c.start_batch = start_batch;
  c.epochs = static_cast<uint64_t>(o.epochs) - start_epoch;
  c.transform = o.transform;
  c.transform.image_size = ring_size;
  c.transform.seed = o.seed;
  return c;
}

std::vector<std::string> ServeArgs(const Options& o, const Placement& p, const std::string& bin,
                                   const PipelineConfig& train, bool delay) {
  ServeRequest r;
  r.service.pipeline = train;
  r.service.job_id = p.job_id;
  r.service.attach_timeout_s = 120;
  r.service.delay_per_batch_ms = delay ? o.delay_ms : 0;
  r.local_rank = p.local_rank;
  r.local_world = p.local_world;
  r.threads = o.loader_threads;
  r.plan = PlanRequest(o, p.local_world);
  return ServeArgv(bin, r);
}

}  // namespace nl::trainer
