// Command-line options shared by `loader` and `loader_bench`.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "loader/pipeline/pipeline.h"
#include "loader/pipeline/transforms.h"

namespace nl {

// The transform options (--image-size, --resize, --pad-crop, ...). Parsed
// strings go to *raw; Finish() turns them into the config.
struct TransformFlags {
  std::string resize = "squash", layout = "nchw", mean, std;
  bool augment = false, rrc = false, no_flip = false;
};
void AddTransformOptions(CLI::App* app, TransformConfig* config, TransformFlags* flags);
Status FinishTransformOptions(const TransformFlags& flags, TransformConfig* config);

// Pipeline options (--data, --split, --batch-size, --threads, --prefetch, --seed, ...).
struct PipelineFlags {
  std::string on_bad_record = "error";
  bool no_shuffle = false;
};
void AddPipelineOptions(CLI::App* app, PipelineConfig* config, PipelineFlags* flags);
Status FinishPipelineOptions(const PipelineFlags& flags, PipelineConfig* config);

}  // namespace nl
