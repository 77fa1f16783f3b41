// Every option the loader's command lines share, defined once here: its
// flag, kind, range or choices and help. `loader` (topo, preview, serve,
// consume), `loader_bench`, the trainer and the benches add an option with
// Add(app, opt::kBatchSize, &target), so the same flag cannot mean two
// things or take two ranges; a command may narrow a range with its own
// ->check() (the trainer's --epochs is at least 1), never widen it.
//
//   CLI::App app;  uint32_t batch = 64;
//   Add(&app, opt::kBatchSize, &batch);          // range 1..2^20, its help
//   Push(&argv, opt::kBatchSize, batch);         // back to {"--batch-size", "64"}
//
// The libraries below the command lines (loader/plan, loader/pipeline,
// formats) know no flags: their messages name an option by its field in
// backquotes ("`batch_size` must be at least 1"), and a command line prints
// them through FlagText, which writes each known field as its flag
// ("--batch-size must be at least 1"). `loader serve --options-json` prints
// the serve's part of this table, which the Python package reads instead of
// keeping a copy (tests/options_check.py holds the tree to one definition
// per flag).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace nl {

enum class OptionKind {
  kFlag,    // on or off
  kInt,     // a whole number in [min, max]
  kReal,    // a number in [lo, hi]
  kText,    // any text
  kChoice,  // one of `choices`
  kBytes,   // a byte count with K, M, G, T suffixes, at most max
  kInts,    // a comma-separated list of whole numbers, each in [min, max]
  kReals,   // a comma-separated list of numbers, each in [lo, hi]
};

struct OptionDef {
  std::string_view flag = {};  // "--batch-size"
  std::string_view set = {};   // pipeline, transform, service, plan, output
  OptionKind kind = OptionKind::kText;
  std::string_view help = {};
  int64_t min = 0;   // kInt, kInts
  uint64_t max = 0;  // kInt, kInts, kBytes
  double lo = 0, hi = 0;     // kReal, kReals
  std::string_view choices = {};  // kChoice: "random|blocks|auto"
  bool required = false;
  // Shown with a default in --help and --options-json; false where leaving
  // the option out lets the program choose (--threads, --pad-crop).
  bool shows_default = true;

  // The library's field and the Python keyword: "batch_size".
  std::string Field() const;
  std::vector<std::string> Choices() const;
};

namespace opt {

using K = OptionKind;

// The pipeline: the data and the sample order.
inline constexpr OptionDef kData{.flag = "--data", .set = "pipeline", .kind = K::kText,
                                 .help = "Shard set directory (pack_tool output)", .required = true};
inline constexpr OptionDef kSplit{.flag = "--split", .set = "pipeline", .kind = K::kText, .help = "Split"};
inline constexpr OptionDef kBatchSize{.flag = "--batch-size", .set = "pipeline", .kind = K::kInt,
                                      .help = "Samples per batch (per rank)", .min = 1, .max = 1u << 20};
inline constexpr OptionDef kPrefetch{
    .flag = "--prefetch", .set = "pipeline", .kind = K::kInt,
    .help = "Batches in flight (the ring's slots; their buffers must fit in half the machine's memory)",
    .min = 1, .max = 1024};
inline constexpr OptionDef kSeed{.flag = "--seed", .set = "pipeline", .kind = K::kInt,
                                 .help = "Seed of the sample order and augmentation (the trainer's: and "
                                         "of the initial weights)",
                                 .min = 0, .max = UINT64_MAX};
inline constexpr OptionDef kNoShuffle{.flag = "--no-shuffle", .set = "pipeline", .kind = K::kFlag,
                                      .help = "Index order instead of a per-epoch permutation"};
inline constexpr OptionDef kDropLast{.flag = "--drop-last", .set = "pipeline", .kind = K::kFlag,
                                     .help = "Trim the dataset to a multiple of the world size instead of padding"};
inline constexpr OptionDef kDropLastBatch{.flag = "--drop-last-batch", .set = "pipeline", .kind = K::kFlag,
                                          .help = "Drop each epoch's last partial batch"};
inline constexpr OptionDef kOnBadRecord{.flag = "--on-bad-record", .set = "pipeline", .kind = K::kChoice,
                                        .help = "error (stop, naming the record) or skip (replace and count)",
                                        .choices = "error|skip"};
inline constexpr OptionDef kOrder{
    .flag = "--order", .set = "pipeline", .kind = K::kChoice,
    .help = "random (a permutation each epoch), blocks (shuffled runs of consecutive records, mixed in "
            "memory: for data bigger than memory) or auto (random when the split fits in half the "
            "memory this process may use, else blocks)",
    .choices = "random|blocks|auto"};
inline constexpr OptionDef kIoMemory{
    .flag = "--io-memory", .set = "pipeline", .kind = K::kBytes,
    .help = "Bytes of records to read ahead (K, M, G suffixes; 0: none; blocks order on a split that "
            "does not fit holds them in its memory, at most half of it); default: an eighth of the "
            "memory this process may use, 4M..1G",
    .max = uint64_t{1} << 40, .shows_default = false};
inline constexpr OptionDef kEpochs{.flag = "--epochs", .set = "pipeline", .kind = K::kInt,
                                   .help = "Epochs (loader serve: then end the stream; 0 there: as long "
                                           "as the consumer asks)",
                                   .min = 0, .max = uint64_t{1} << 32};
inline constexpr OptionDef kStartEpoch{.flag = "--start-epoch", .set = "pipeline", .kind = K::kInt,
                                       .help = "First epoch", .min = 0, .max = uint64_t{1} << 32,
                                       .shows_default = false};
inline constexpr OptionDef kStartBatch{.flag = "--start-batch", .set = "pipeline", .kind = K::kInt,
                                       .help = "First batch of that epoch", .min = 0,
                                       .max = uint64_t{1} << 40, .shows_default = false};

// The transform.
inline constexpr OptionDef kImageSize{.flag = "--image-size", .set = "transform", .kind = K::kInt,
                                      .help = "Output side in pixels", .min = 1, .max = 8192};
inline constexpr OptionDef kResize{.flag = "--resize", .set = "transform", .kind = K::kChoice,
                                   .help = "squash (to SxS) or shorter-crop (shorter side S, centre crop)",
                                   .choices = "squash|shorter-crop"};
inline constexpr OptionDef kResizeSize{
    .flag = "--resize-size", .set = "transform", .kind = K::kInt,
    .help = "With shorter-crop: the shorter side becomes R, then the centre SxS is kept (torchvision "
            "Resize(R) + CenterCrop(S); ImageNet's eval: 256 for 224); default: --image-size",
    .min = 1, .max = 8192, .shows_default = false};
inline constexpr OptionDef kAugment{.flag = "--augment", .set = "transform", .kind = K::kFlag,
                                    .help = "The train transform (random crop, flip) instead of eval "
                                            "(resize only)"};
inline constexpr OptionDef kPadCrop{.flag = "--pad-crop", .set = "transform", .kind = K::kInt,
                                    .help = "Train: zero-pad P pixels, then random crop (before resize)",
                                    .min = 0, .max = 1024, .shows_default = false};
inline constexpr OptionDef kRandomResizedCrop{
    .flag = "--random-resized-crop", .set = "transform", .kind = K::kFlag,
    .help = "Train: torchvision RandomResizedCrop(scale 0.08-1, ratio 3/4-4/3)"};
inline constexpr OptionDef kNoFlip{.flag = "--no-flip", .set = "transform", .kind = K::kFlag,
                                   .help = "Train: no random horizontal flip"};
inline constexpr OptionDef kDecode{
    .flag = "--decode", .set = "transform", .kind = K::kChoice,
    .help = "JPEG decode: exact (only the crop's region, the pixels of a full decode), fast (that "
            "region scaled down in the DCT domain by 1/2, 1/4 or 1/8 as far as the crop stays at "
            "least the output size, chroma by replication; not bit-exact; about 2 levels off exact on "
            "average at 32-64 px, 0.4 at 224) or auto (eval: exact; train: per sample, fast where its "
            "scale keeps the crop at least twice the output size, else exact: within 2 levels of exact "
            "at every size, docs/DECODE.md)",
    .choices = "auto|exact|fast"};
inline constexpr OptionDef kLayout{.flag = "--layout", .set = "transform", .kind = K::kChoice,
                                   .help = "nchw or nhwc", .choices = "nchw|nhwc"};
inline constexpr OptionDef kNormalize{.flag = "--normalize", .set = "transform", .kind = K::kFlag,
                                      .help = "float32 (x/255 - mean) / std instead of uint8"};
inline constexpr OptionDef kMean{.flag = "--mean", .set = "transform", .kind = K::kReals,
                                 .help = "Normalisation mean, e.g. 0.485,0.456,0.406", .lo = -1e6, .hi = 1e6,
                                 .shows_default = false};
inline constexpr OptionDef kStd{.flag = "--std", .set = "transform", .kind = K::kReals,
                                .help = "Normalisation std, e.g. 0.229,0.224,0.225", .lo = -1e6, .hi = 1e6,
                                .shows_default = false};

// A loader service and its consumer.
inline constexpr OptionDef kJobId{.flag = "--job-id", .set = "service", .kind = K::kText,
                                  .help = "Job id shared by the loader serve and its consumer (printable "
                                          "ASCII, no '/', at most 64 bytes)",
                                  .required = true};
inline constexpr OptionDef kRank{.flag = "--rank", .set = "service", .kind = K::kInt,
                                 .help = "Global rank (default: $RANK, else 0)", .min = 0, .max = 1u << 20,
                                 .shows_default = false};
inline constexpr OptionDef kWorldSize{.flag = "--world-size", .set = "service", .kind = K::kInt,
                                      .help = "World size (default: $WORLD_SIZE, else 1)", .min = 1,
                                      .max = 1u << 20, .shows_default = false};
inline constexpr OptionDef kLocalRank{.flag = "--local-rank", .set = "service", .kind = K::kInt,
                                      .help = "Local rank (default: $LOCAL_RANK, else 0)", .min = 0,
                                      .max = 1023, .shows_default = false};
inline constexpr OptionDef kLocalWorldSize{
    .flag = "--local-world-size", .set = "service", .kind = K::kInt,
    .help = "Ranks on this node, for the binding plan (default: $LOCAL_WORLD_SIZE, else one per visible GPU)",
    .min = 0, .max = 1024, .shows_default = false};
inline constexpr OptionDef kThreads{.flag = "--threads", .set = "service", .kind = K::kInt,
                                    .help = "Loader threads (default: the plan's loader cores for this rank)",
                                    .min = 1, .max = 1024, .shows_default = false};
inline constexpr OptionDef kAttachTimeout{
    .flag = "--attach-timeout", .set = "service", .kind = K::kReal,
    .help = "Seconds to wait for the other side of the ring (loader serve: for a consumer, default no "
            "limit; consume: for the producer to appear)",
    .lo = 0, .hi = 1e7};
inline constexpr OptionDef kStallWarning{.flag = "--stall-warning", .set = "service", .kind = K::kReal,
                                         .help = "Warn when the consumer holds every slot this many seconds",
                                         .lo = 0, .hi = 1e7};
inline constexpr OptionDef kSimulateDelayMs{
    .flag = "--simulate-delay-ms", .set = "service", .kind = K::kReal,
    .help = "Testing: sleep this long before each batch (a slow loader, to see the trainer's "
            "straggler diagnosis)",
    .lo = 0, .hi = 1e6, .shows_default = false};
inline constexpr OptionDef kTimeout{.flag = "--timeout", .set = "service", .kind = K::kReal,
                                    .help = "Seconds to wait for a batch (the trainer's: or a collective) "
                                            "before reporting the producer or peer stuck",
                                    .lo = 0, .hi = 1e7};
inline constexpr OptionDef kLoaderBin{.flag = "--loader-bin", .set = "service", .kind = K::kText,
                                      .help = "The `loader` executable (default: the one beside this program)",
                                      .shows_default = false};

// The binding plan.
inline constexpr OptionDef kTopology{.flag = "--topology", .set = "plan", .kind = K::kText,
                                     .help = "Plan for the machine an hwloc XML file describes instead of "
                                             "this one (binding then reports not_supported)",
                                     .shows_default = false};
inline constexpr OptionDef kNprocPerNode{.flag = "--nproc-per-node", .set = "plan", .kind = K::kInt,
                                         .help = "Ranks on this node (topo's default: one per visible GPU, at "
                                                 "least 1)",
                                         .min = 1, .max = 1024};
inline constexpr OptionDef kGpus{.flag = "--gpus", .set = "plan", .kind = K::kInts,
                                 .help = "GPU index of each local rank, e.g. 0,2 (default: rank i uses GPU i)",
                                 .min = 0, .max = 1023, .shows_default = false};
inline constexpr OptionDef kNumaNode{.flag = "--numa-node", .set = "plan", .kind = K::kInts,
                                     .help = "NUMA node of each local rank (or one for all), e.g. 0,0,1,1",
                                     .min = 0, .max = 65535, .shows_default = false};
inline constexpr OptionDef kCpuAffinity{.flag = "--cpu-affinity", .set = "plan", .kind = K::kText,
                                        .help = "One cpu list per local rank: \"0-9,44-53;10-21,54-65\"",
                                        .shows_default = false};
inline constexpr OptionDef kTrainerCores{.flag = "--trainer-cores", .set = "plan", .kind = K::kInt,
                                         .help = "Cores reserved for each trainer rank", .min = 1, .max = 65535};
inline constexpr OptionDef kAllowSharedCores{.flag = "--allow-shared-cores", .set = "plan", .kind = K::kFlag,
                                             .help = "Let ranks share cores when a node has too few"};
inline constexpr OptionDef kIgnoreGpus{.flag = "--ignore-gpus", .set = "plan", .kind = K::kFlag,
                                       .help = "Plan as if no GPU were visible (ranks round-robin over NUMA nodes)"};
inline constexpr OptionDef kNoBind{.flag = "--no-bind", .set = "plan", .kind = K::kFlag, .help = "Bind nothing"};

// What a command writes.
inline constexpr OptionDef kJson{.flag = "--json", .set = "output", .kind = K::kFlag,
                                 .help = "Print one JSON object"};
inline constexpr OptionDef kOut{.flag = "--out", .set = "output", .kind = K::kText,
                                .help = "Directory this command writes to (preview: <index>.png; trainer: "
                                        "checkpoints and charts)",
                                .shows_default = false};

}  // namespace opt

// Every definition above, in order.
const std::vector<const OptionDef*>& AllOptions();
// The definition of a flag ("--batch-size"), or nullptr.
const OptionDef* FindOption(std::string_view flag);

// The help line's validator of a definition (range, choices), for Add.
CLI::Validator OptionCheck(const OptionDef& d);

// Adds the option to `app`, bound to `target` (a number, a string, a bool
// for flags). The caller may narrow it further with ->check().
template <class T>
CLI::Option* Add(CLI::App* app, const OptionDef& d, T* target) {
  CLI::Option* o;
  if constexpr (std::is_same_v<T, bool>) {
    o = app->add_flag(std::string(d.flag), *target, std::string(d.help));
  } else {
    o = app->add_option(std::string(d.flag), *target, std::string(d.help));
    if (d.kind != OptionKind::kText && d.kind != OptionKind::kBytes) o->check(OptionCheck(d));
    if (d.shows_default) o->capture_default_str();
  }
  if (d.required) o->required();
  return o;
}

// A library's text with each `field` of the table written as its flag.
std::string FlagText(std::string_view text);

// The option back to argv: {flag, value} (a flag alone when on, nothing
// when off).
void Push(std::vector<std::string>* argv, const OptionDef& d, const std::string& value);
void Push(std::vector<std::string>* argv, const OptionDef& d, const char* value);
void Push(std::vector<std::string>* argv, const OptionDef& d, bool on);
void Push(std::vector<std::string>* argv, const OptionDef& d, uint64_t value);
void Push(std::vector<std::string>* argv, const OptionDef& d, int64_t value);
void Push(std::vector<std::string>* argv, const OptionDef& d, uint32_t value);
void Push(std::vector<std::string>* argv, const OptionDef& d, int value);
void Push(std::vector<std::string>* argv, const OptionDef& d, double value);

// The options of `app` (a subcommand) that the table defines, as JSON text:
// [{"field", "flag", "set", "kind", "default", "min", "max", "choices",
// "help", "required"}, ...] in --help's order; "default" is null where the
// option shows none.
std::string OptionsJson(const CLI::App& app);

}  // namespace nl
