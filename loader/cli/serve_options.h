// `loader serve`'s command line both ways: the options it takes (added and
// checked here, once) and a request turned back into its argv, for the
// programs that start one per rank (loader_bench's service mode, the
// trainer's rank).
//
//   ServeRequest r;  r.service.pipeline = pc;  r.service.job_id = "job-7";
//   r.service.pipeline.rank = 3;  r.service.pipeline.world = 8;
//   r.local_rank = 3;  r.local_world = 4;  r.plan.no_bind = true;
//   NL_ASSIGN_OR_RETURN(proc::ChildProcess serve,
//                       proc::ChildProcess::Start(ServeArgv("/opt/bin/loader", r), {}, log, log));
//
// ServeArgv writes every value explicitly (nothing falls back to the child's
// environment), so what the serve runs with is exactly the request:
// FinishServeOptions(parse(ServeArgv(r))) gives r back (serve_options_test).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "loader/cli/cli_options.h"
#include "loader/cli/option_table.h"
#include "loader/plan/job_plan.h"
#include "loader/ring/service.h"

namespace nl {

// Everything a `loader serve` is told.
struct ServeRequest {
  // The pipeline (data, split, batches, seed, sampler, transform, epochs,
  // start; its rank and world are the global ones), the job id, the waits.
  // pipeline.threads is not passed: `threads` below is.
  ServiceConfig service;
  int local_rank = 0;
  int local_world = 0;   // ranks on this node; 0: one per visible GPU
  uint32_t threads = 0;  // loader threads; 0: the plan's loader cores for the rank
  // The binding options (topology_file, nproc and cuda_visible_devices are
  // not passed: the serve plans for its own machine, local_world ranks, and
  // reads CUDA_VISIBLE_DEVICES itself).
  JobPlanRequest plan;
};

// The serve's argv: {loader, "serve", options...}.
std::vector<std::string> ServeArgv(const std::string& loader, const ServeRequest& request);

// The serve's options as parsed, before FinishServeOptions checks them.
struct ServeFlags {
  ServeRequest request;
  PipelineFlags pipeline;
  TransformFlags transform;
  std::string rank, world, local_rank, local_world;  // flag texts (default: torchrun's variables)
};
// Adds `loader serve`'s options to its subcommand.
void AddServeOptions(CLI::App* serve, ServeFlags* flags);
// The request the flags describe; --rank, --world-size, --local-rank and
// --local-world-size default to $RANK, $WORLD_SIZE, $LOCAL_RANK and
// $LOCAL_WORLD_SIZE (read here, through `getenv`), else 0, 1, 0, 0.
using EnvLookup = const char* (*)(const char* name);
const char* ProcessEnv(const char* name);  // getenv: this process's environment
Result<ServeRequest> FinishServeOptions(const ServeFlags& flags, EnvLookup env);

// A flag's text, else the environment variable's, else `def`; parsed, and
// the error names the flag or the variable and quotes the text.
// The range is the option's.
Result<int64_t> FlagOrEnv(const std::string& flag_text, const OptionDef& option, const char* variable,
                          int64_t def, EnvLookup env);

}  // namespace nl
