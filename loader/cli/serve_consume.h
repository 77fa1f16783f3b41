// `loader serve` (the loader service for one rank) and `loader consume`
// (a command-line consumer of its ring).
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "loader/cli/serve_options.h"

namespace nl {

// Its options: AddServeOptions (serve_options.h).
CLI::App* AddServe(CLI::App* app, ServeFlags* flags);
int RunServe(const ServeFlags& flags);

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
