#include "loader/cli/cli_options.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <cstdlib>

#include "base/parse_number.h"
#include "base/worker_pool.h"

namespace nl {

namespace {

void AddAugmentFlag(CLI::App* app, TransformFlags* f) {
  f->augment_default = f->augment;
  if (!f->augment) {
    app->add_flag("--augment", f->augment,
                  "The train transform (random crop, flip) instead of eval (resize only)");
    return;
  }
  app->add_flag("--augment,!--no-augment", f->augment,
                "The train transform (the default here; --no-augment: eval, resize only). "
                "--augment alone: pad-crop " +
                    std::to_string(f->augment_pad_crop) +
                    " and random flip; with --random-resized-crop: that crop and flip, no "
                    "padding unless --pad-crop is given");
}

}  // namespace

void AddTransformOptions(CLI::App* app, TransformConfig* c, TransformFlags* f, unsigned sets) {
  if (sets & kTransformShape) {
    app->add_option("--image-size", c->image_size, "Output side in pixels")->capture_default_str();
    app->add_option("--resize", f->resize,
                    "squash (to SxS) or shorter-crop (shorter side S, centre crop)")
        ->capture_default_str();
    app->add_option("--resize-size", c->resize_size,
                    "With shorter-crop: the shorter side becomes R, then the centre SxS is kept (torchvision "
                    "Resize(R) + CenterCrop(S); ImageNet's eval: 256 for 224); default: --image-size");
    AddAugmentFlag(app, f);
    app->add_option("--pad-crop", f->pad_crop,
                    "Train: zero-pad P pixels, then random crop (before resize)")
        ->each([f](const std::string&) { f->pad_crop_given = true; });
    app->add_flag("--random-resized-crop", f->rrc,
                  "Train: torchvision RandomResizedCrop(scale 0.08-1, ratio 3/4-4/3)");
    app->add_flag("--no-flip", f->no_flip, "Train: no random horizontal flip");
    app->add_option(
           "--decode", f->decode,
           "JPEG decode: exact (only the crop's region, the pixels of a full decode), fast "
           "(that region scaled down in the DCT domain by 1/2, 1/4 or 1/8 as far as the crop "
           "stays at least the output size, chroma by replication; not bit-exact; about 2 levels "
           "off exact on average at 32-64 px, 0.4 at 224) or auto (eval: exact; train: per sample, fast where "
           "its scale keeps the crop at least twice the output size, else exact: within 2 levels "
           "of exact at every size, docs/DECODE.md)")
        ->capture_default_str();
  }
  if (sets & kTransformOutput) {
    app->add_option("--layout", f->layout, "nchw or nhwc")->capture_default_str();
    app->add_flag("--normalize", c->normalize, "float32 (x/255 - mean) / std instead of uint8");
    app->add_option("--mean", f->mean, "Normalisation mean, e.g. 0.485,0.456,0.406");
    app->add_option("--std", f->std, "Normalisation std, e.g. 0.229,0.224,0.225");
  }
}

namespace {
Status ParseTriple(const std::string& s, const char* what, std::array<float, 3>* out) {
  if (s.empty()) return Status::Ok();
  NL_ASSIGN_OR_RETURN(std::vector<double> v, ParseDoubleList(s, what, -1e6, 1e6));
  if (v.size() != 3) {
    return Status::InvalidArgument(std::string(what) + " takes 3 values, got " +
                                   std::to_string(v.size()) + " ('" + s + "')");
  }
  for (int i = 0; i < 3; ++i) (*out)[i] = static_cast<float>(v[i]);
  return Status::Ok();
}

Status FinishTrainTransform(const TransformFlags& f, TransformConfig* c) {
  c->train = f.augment;
  c->random_resized_crop = f.rrc;
  c->flip = !f.no_flip;
  c->pad_crop = f.pad_crop_given ? f.pad_crop : (f.augment && !f.rrc ? f.augment_pad_crop : 0);
  if (!f.augment && (f.pad_crop_given || f.rrc || f.no_flip)) {
    return Status::InvalidArgument(
        f.augment_default
            ? "--pad-crop, --random-resized-crop and --no-flip shape the train transform, "
              "which --no-augment turns off (the eval transform, resize only, is used): drop "
              "one or the other"
            : "--pad-crop, --random-resized-crop and --no-flip shape the train transform: add "
              "--augment (without it the eval transform, resize only, is used)");
  }
  if (c->pad_crop < 0 || c->pad_crop > 1024)
    return Status::InvalidArgument("--pad-crop must be 0..1024");
  return Status::Ok();
}
}  // namespace

Status FinishTransformOptions(const TransformFlags& f, TransformConfig* c) {
  NL_ASSIGN_OR_RETURN(c->resize, ParseResizeMode(f.resize));
  NL_ASSIGN_OR_RETURN(c->layout, ParseLayout(f.layout));
  NL_RETURN_IF_ERROR(FinishTrainTransform(f, c));
  Result<DecodeMode> m = ParseDecodeMode(f.decode);
  if (!m.ok())
    return Status::InvalidArgument("--decode takes auto, exact or fast, not '" + f.decode + "'");
  // auto: the eval transform is exact (Pillow's pixels); the train
  // transform's choice is made per sample (SampleTransform::ChooseDecode).
  c->decode = *m == DecodeMode::kAuto && !c->train ? DecodeMode::kExact : *m;
  if (c->image_size < 1 || c->image_size > 8192)
    return Status::InvalidArgument("--image-size must be 1..8192");
  if (c->resize_size != 0) {
    if (c->resize != ResizeMode::kShorterCrop) {
      return Status::InvalidArgument("--resize-size " + std::to_string(c->resize_size) +
                                     " needs --resize shorter-crop (squash resizes straight to --image-size)");
    }
    if (c->resize_size < c->image_size || c->resize_size > 8192) {
      return Status::InvalidArgument("--resize-size must be --image-size (" + std::to_string(c->image_size) +
                                     ") .. 8192, not " + std::to_string(c->resize_size));
    }
  }
  if (!c->normalize && (!f.mean.empty() || !f.std.empty())) {
    return Status::InvalidArgument("--mean and --std apply to --normalize: add it");
  }
  NL_RETURN_IF_ERROR(ParseTriple(f.mean, "--mean", &c->mean));
  NL_RETURN_IF_ERROR(ParseTriple(f.std, "--std", &c->std));
  for (float s : c->std) {
    if (!(std::fabs(s) >= 1e-6f)) {
      return Status::InvalidArgument("--std values must be at least 1e-6 in magnitude");
    }
  }
  return Status::Ok();
}

void AddOrderOptions(CLI::App* app, OrderFlags* f) {
  app->add_option("--order", f->order,
                  "random (a permutation each epoch), blocks (shuffled runs of consecutive "
                  "records, mixed in memory: for data bigger than memory) or auto (random when "
                  "the split fits in half the memory this process may use, else blocks)")
      ->capture_default_str();
  app->add_option("--io-memory", f->io_memory,
                  "Bytes of records to read ahead (K, M, G suffixes; 0: none; blocks order on "
                  "a split that does not fit holds them in its memory, at most half of it); "
                  "default: an eighth of the memory this process may use, 4M..1G");
}

Status FinishOrderOptions(const OrderFlags& f, OrderChoice* order,
                          std::optional<uint64_t>* io_memory) {
  NL_ASSIGN_OR_RETURN(*order, ParseOrder(f.order));
  io_memory->reset();
  if (!f.io_memory.empty()) {
    NL_ASSIGN_OR_RETURN(*io_memory, ParseByteSize(f.io_memory, "--io-memory", uint64_t{1} << 40));
  }
  return Status::Ok();
}

void AddPipelineOptions(CLI::App* app, PipelineConfig* c, PipelineFlags* f) {
  app->add_option("--data", c->data_dir, "Shard set directory (pack_tool output)")->required();
  app->add_option("--split", c->split, "Split")->capture_default_str();
  app->add_option("--batch-size", c->batch_size, "Samples per batch, at least 1")
      ->check(CLI::Range(1u, 1u << 20))
      ->capture_default_str();
  app->add_option("--prefetch", c->prefetch,
                  "Batches in flight, 1.." + std::to_string(kMaxPrefetch) +
                      " (their buffers must fit in half the machine's memory)")
      ->check(CLI::Range(1u, kMaxPrefetch))
      ->capture_default_str();
  app->add_option("--seed", c->seed, "Shuffle and augmentation seed, 0 or more")
      ->check(CLI::NonNegativeNumber)  // CLI11 would wrap -1 to 2^64 - 1
      ->capture_default_str();
  app->add_flag("--no-shuffle", f->no_shuffle, "Index order instead of a per-epoch permutation");
  app->add_flag("--drop-last", c->drop_last,
                "Trim the dataset to a multiple of the world size instead of padding");
  app->add_flag("--drop-last-batch", c->drop_last_batch, "Drop each epoch's last partial batch");
  app->add_option("--on-bad-record", f->on_bad_record,
                  "error (stop, naming the record) or skip (replace and count)")
      ->capture_default_str();
  AddOrderOptions(app, &f->order);
}

Status FinishPipelineOptions(const PipelineFlags& f, PipelineConfig* c) {
  c->shuffle = !f.no_shuffle;
  NL_ASSIGN_OR_RETURN(c->on_bad_record, ParseOnBadRecord(f.on_bad_record));
  NL_RETURN_IF_ERROR(FinishOrderOptions(f.order, &c->order, &c->io_memory));
  if (c->batch_size == 0) return Status::InvalidArgument("--batch-size must be at least 1");
  return Status::Ok();
}

void AddPlanOptions(CLI::App* app, JobPlanRequest* rq, unsigned sets) {
  if (sets & kPlanTopology) {
    app->add_option("--topology", rq->topology_file,
                    "Plan for the machine an hwloc XML file describes instead of this one "
                    "(binding then reports not_supported)");
  }
  if (sets & kPlanPlacement) {
    app->add_option("--gpus", rq->gpus,
                    "GPU index of each local rank, e.g. 0,2 (default: rank i uses GPU i)");
    app->add_option("--numa-node", rq->numa_node,
                    "NUMA node of each local rank (or one for all), e.g. 0,0,1,1");
    app->add_option("--cpu-affinity", rq->cpu_affinity,
                    "One cpu list per local rank: \"0-9,44-53;10-21,54-65\"");
    app->add_option("--trainer-cores", rq->trainer_cores, "Cores reserved for each trainer rank")
        ->check(CLI::Range(1, kMaxCpuIndex))
        ->capture_default_str();
  }
  if (sets & kPlanFallbacks) {
    app->add_flag("--allow-shared-cores", rq->allow_shared_cores,
                  "Let ranks share cores when a node has too few");
    app->add_flag("--ignore-gpus", rq->ignore_gpus,
                  "Plan as if no GPU were visible (ranks round-robin over NUMA nodes)");
  }
  if (sets & kPlanNoBind) app->add_flag("--no-bind", rq->no_bind, "Bind nothing");
}

std::string FormatNumber(double v) {
  char buf[40];
  for (int digits = 6; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, v);
    double back = 0;
    std::from_chars(buf, buf + std::strlen(buf), back);
    if (back == v) break;
  }
  return buf;
}

std::string FormatNumber(float v) {
  char buf[40];
  for (int digits = 6; digits <= 9; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, static_cast<double>(v));
    float back = 0;
    std::from_chars(buf, buf + std::strlen(buf), back);
    if (back == v) break;
  }
  return buf;
}

std::string ResizeModeName(ResizeMode m) {
  return m == ResizeMode::kShorterCrop ? "shorter-crop" : "squash";
}
std::string LayoutName(Layout l) { return l == Layout::kNHWC ? "nhwc" : "nchw"; }
std::string OnBadRecordName(OnBadRecord o) { return o == OnBadRecord::kSkip ? "skip" : "error"; }

}  // namespace nl
