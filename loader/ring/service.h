// The loader service for one rank (`loader serve`): a pipeline writing
// straight into the ring's slots, serving one consumer for as long as it
// asks (or --epochs), restarting where a seek points it.
//
// Exit paths, each with one line on the log:
// - the consumer detaches (says goodbye): Ok;
// - the consumer vanishes (killed): Unavailable, noticed within ~0.1 s;
// - *stop turns true (SIGINT/SIGTERM): Aborted, the consumer is told why;
// - the pipeline fails (bad record, unreadable shard): its error, written
//   into the ring's error text first so the consumer reports the cause.
#pragma once

#include <atomic>
#include <functional>
#include <string>

#include "base/status.h"
#include "loader/pipeline/pipeline.h"

namespace nl {

struct ServiceConfig {
  PipelineConfig pipeline;  // data, split, rank, world, batch, threads, transforms,
                            // start_epoch/start_batch, epochs (0: until stopped);
                            // prefetch = ring slots; buffers is set here
  std::string job_id;
  double attach_timeout_s = -1;   // < 0: wait for a consumer as long as it takes
  double stall_warning_s = 60;    // warn when the consumer holds every slot this long
  double delay_per_batch_ms = 0;  // testing: sleep this long before each batch (a slow loader)
  const std::atomic<int>* stop_signal = nullptr;  // nonzero: stop (the signal number)
  std::function<void(const std::string&)> log;    // one line each; stderr when empty
  std::function<void()> on_listening;             // called once the socket is bound
};

struct ServiceReport {
  uint64_t batches = 0, images = 0;
  int consumer_pid = 0;
  bool detached = false;
  double seconds = 0;
};

Status RunService(const ServiceConfig& config, ServiceReport* report);

}  // namespace nl
