// The command-line options the tools share, spelled once: `loader` (topo,
// preview, serve), `loader_bench` and `trainer` add them from here, so their
// names, defaults, help texts and checks cannot drift apart.
//
//   CLI::App app;  PipelineConfig pc;  PipelineFlags pf;  TransformFlags tf;
//   AddPipelineOptions(&app, &pc, &pf);
//   AddTransformOptions(&app, &pc.transform, &tf);
//   CLI11_PARSE(app, argc, argv);
//   NL_RETURN_IF_ERROR(FinishPipelineOptions(pf, &pc));
//   NL_RETURN_IF_ERROR(FinishTransformOptions(tf, &pc.transform));
//
// Options go straight into the config where CLI11 can check them; the rest
// are parsed from the *Flags texts by the Finish* step, whose errors name
// the flag.
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>

#include "loader/pipeline/pipeline.h"
#include "loader/pipeline/transforms.h"
#include "loader/plan/job_plan.h"

namespace nl {

// The transform options. Set `augment` (and `augment_pad_crop`) before
// AddTransformOptions to make the train transform a command's default, as
// the trainer's: its flag is then `--augment` / `--no-augment`.
struct TransformFlags {
  std::string resize = "squash", layout = "nchw", mean, std;
  std::string decode = "auto";  // auto: exact for eval, chosen per sample for train
  bool augment = false, rrc = false, no_flip = false;
  int pad_crop = 0;
  bool pad_crop_given = false;  // set by the parse when --pad-crop is given
  // The pad-crop that --augment implies when neither --pad-crop nor
  // --random-resized-crop is given (the trainer: 4; elsewhere 0).
  int augment_pad_crop = 0;
  bool augment_default = false;  // recorded by AddTransformOptions
};
enum TransformOptionSet : unsigned {
  kTransformShape =
      1,  // --image-size --resize --augment --pad-crop --random-resized-crop --no-flip --decode
  kTransformOutput = 2,  // --layout --normalize --mean --std
  kTransformAll = 3,
};
void AddTransformOptions(CLI::App* app, TransformConfig* config, TransformFlags* flags,
                         unsigned sets = kTransformAll);
Status FinishTransformOptions(const TransformFlags& flags, TransformConfig* config);

// Pipeline options (--data, --split, --batch-size, --prefetch, --seed, ...).
// --order and --io-memory (the read order and read-ahead budget), shared by
// the pipeline's options and the trainer's.
struct OrderFlags {
  std::string order = "auto";
  std::string io_memory;  // empty: the default
};
void AddOrderOptions(CLI::App* app, OrderFlags* flags);
Status FinishOrderOptions(const OrderFlags& flags, OrderChoice* order,
                          std::optional<uint64_t>* io_memory);

struct PipelineFlags {
  std::string on_bad_record = "error";
  bool no_shuffle = false;
  OrderFlags order;
};
void AddPipelineOptions(CLI::App* app, PipelineConfig* config, PipelineFlags* flags);
Status FinishPipelineOptions(const PipelineFlags& flags, PipelineConfig* config);

// The binding plan's options, into a JobPlanRequest (MakeJobPlan checks them
// and its errors name the flag). Each command takes the sets it can honour.
enum PlanOptionSet : unsigned {
  kPlanTopology = 1,   // --topology FILE
  kPlanPlacement = 2,  // --gpus --numa-node --cpu-affinity --trainer-cores
  kPlanFallbacks = 4,  // --allow-shared-cores --ignore-gpus
  kPlanNoBind = 8,     // --no-bind
};
void AddPlanOptions(CLI::App* app, JobPlanRequest* request, unsigned sets);

// Numbers as the options above write them back: the shortest text that
// parses to the same value.
std::string FormatNumber(double v);
std::string FormatNumber(float v);
std::string ResizeModeName(ResizeMode m);
std::string LayoutName(Layout l);
std::string OnBadRecordName(OnBadRecord o);

}  // namespace nl
