#include "trainer/serve_args.h"

#include <unistd.h>

#include "trainer/proc_info.h"
#include "trainer/rank_error.h"

namespace nl::trainer {

std::string LoaderBinary(const Options& o) {
  const std::string bin = o.loader_bin.empty() ? SelfDir() + "/loader" : o.loader_bin;
  if (access(bin.c_str(), X_OK) != 0) {
    throw RankError("no loader executable at " + bin + " (build the `loader` target, or give --loader-bin)");
  }
  return bin;
}

std::vector<std::string> ServeArgs(const Options& o, const Placement& p, const std::string& bin,
                                   uint64_t start_epoch, uint64_t start_batch, int ring_size,
                                   bool delay) {
  std::vector<std::string> a = {bin, "serve", "--data", o.data, "--split", "train",
                                "--batch-size", std::to_string(o.batch_size),
                                "--prefetch", std::to_string(o.prefetch),
                                "--seed", std::to_string(o.seed),
                                "--job-id", p.job_id,
                                "--rank", std::to_string(p.rank),
                                "--world-size", std::to_string(p.world),
                                "--local-rank", std::to_string(p.local_rank),
                                "--local-world-size", std::to_string(p.local_world),
                                "--epochs", std::to_string(o.epochs - static_cast<int>(start_epoch)),
                                "--start-epoch", std::to_string(start_epoch),
                                "--start-batch", std::to_string(start_batch),
                                "--image-size", std::to_string(ring_size),
                                "--trainer-cores", std::to_string(o.trainer_cores),
                                "--attach-timeout", "120"};
  if (o.augment) {
    for (const char* x : {"--augment", "--pad-crop", "4"}) a.push_back(x);
  }
  if (o.loader_threads) {
    a.push_back("--threads");
    a.push_back(std::to_string(o.loader_threads));
  }
  auto flag = [&](const char* name, const std::string& v) {
    if (!v.empty()) {
      a.push_back(name);
      a.push_back(v);
    }
  };
  flag("--gpus", o.gpus);
  flag("--numa-node", o.numa_node);
  flag("--cpu-affinity", o.cpu_affinity);
  if (o.allow_shared_cores) a.push_back("--allow-shared-cores");
  if (o.ignore_gpus) a.push_back("--ignore-gpus");
  if (o.no_bind) a.push_back("--no-bind");
  if (delay) {
    a.push_back("--simulate-delay-ms");
    a.push_back(std::to_string(o.delay_ms));
  }
  return a;
}

}  // namespace nl::trainer
