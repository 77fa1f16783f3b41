// `loader serve` (the loader service for one rank) and `loader consume`
// (a command-line consumer of its ring).
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "loader/cli/cli_options.h"
#include "loader/plan/job_plan.h"
#include "loader/ring/service.h"

namespace nl {

struct ServeArgs {
  ServiceConfig service;
  PipelineFlags pflags;
  TransformFlags tflags;
  JobPlanRequest plan;
  std::string rank, world, local_rank, local_world;  // flag texts (default: torchrun's variables)
  uint32_t threads = 0;                              // 0: the plan's loader cores
};
CLI::App* AddServe(CLI::App* app, ServeArgs* a);
int RunServe(ServeArgs& a);

struct ConsumeArgs {
  std::string job_id, rank, dump;
  uint64_t batches = 0;  // 0: until the producer's end
  double timeout_s = 60, attach_timeout_s = 30;
  int64_t start_epoch = -1, start_batch = 0;
  bool json = false;
};
CLI::App* AddConsume(CLI::App* app, ConsumeArgs* a);
int RunConsume(const ConsumeArgs& a);

}  // namespace nl
