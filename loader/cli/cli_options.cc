#include "loader/cli/cli_options.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <cstdlib>

#include "base/parse_number.h"
#include "base/worker_pool.h"
#include "loader/cli/option_table.h"

namespace nl {

namespace {

void AddAugmentFlag(CLI::App* app, TransformFlags* f) {
  f->augment_default = f->augment;
  if (!f->augment) {
    Add(app, opt::kAugment, &f->augment);
    return;
  }
  // The trainer's default, which --no-augment turns off (the last one given wins).
  app->add_flag(std::string(opt::kAugment.flag) + ",!--no-augment", f->augment,
                "The train transform (the default here; --no-augment: eval, resize only). "
                "--augment alone: pad-crop " +
                    std::to_string(f->augment_pad_crop) +
                    " and random flip; with --random-resized-crop: that crop and flip, no "
                    "padding unless --pad-crop is given");
}

}  // namespace

void AddTransformOptions(CLI::App* app, TransformConfig* c, TransformFlags* f, unsigned sets) {
  if (sets & kTransformShape) {
    Add(app, opt::kImageSize, &c->image_size);
    Add(app, opt::kResize, &f->resize);
    Add(app, opt::kResizeSize, &c->resize_size);
    AddAugmentFlag(app, f);
    Add(app, opt::kPadCrop, &f->pad_crop)->each([f](const std::string&) { f->pad_crop_given = true; });
    Add(app, opt::kRandomResizedCrop, &f->rrc);
    Add(app, opt::kNoFlip, &f->no_flip);
    Add(app, opt::kDecode, &f->decode);
  }
  if (sets & kTransformOutput) {
    Add(app, opt::kLayout, &f->layout);
    Add(app, opt::kNormalize, &c->normalize);
    Add(app, opt::kMean, &f->mean);
    Add(app, opt::kStd, &f->std);
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
  Add(app, opt::kOrder, &f->order);
  Add(app, opt::kIoMemory, &f->io_memory);
}

Status FinishOrderOptions(const OrderFlags& f, OrderChoice* order,
                          std::optional<uint64_t>* io_memory) {
  NL_ASSIGN_OR_RETURN(*order, ParseOrder(f.order));
  io_memory->reset();
  if (!f.io_memory.empty()) {
    NL_ASSIGN_OR_RETURN(*io_memory, ParseByteSize(f.io_memory, opt::kIoMemory.flag, opt::kIoMemory.max));
  }
  return Status::Ok();
}

void AddPipelineOptions(CLI::App* app, PipelineConfig* c, PipelineFlags* f) {
  Add(app, opt::kData, &c->data_dir);
  Add(app, opt::kSplit, &c->split);
  Add(app, opt::kBatchSize, &c->batch_size);
  Add(app, opt::kPrefetch, &c->prefetch);
  Add(app, opt::kSeed, &c->seed);
  Add(app, opt::kNoShuffle, &f->no_shuffle);
  Add(app, opt::kDropLast, &c->drop_last);
  Add(app, opt::kDropLastBatch, &c->drop_last_batch);
  Add(app, opt::kOnBadRecord, &f->on_bad_record);
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
  if (sets & kPlanTopology) Add(app, opt::kTopology, &rq->topology_file);
  if (sets & kPlanPlacement) {
    Add(app, opt::kGpus, &rq->gpus);
    Add(app, opt::kNumaNode, &rq->numa_node);
    Add(app, opt::kCpuAffinity, &rq->cpu_affinity);
    Add(app, opt::kTrainerCores, &rq->trainer_cores);
  }
  if (sets & kPlanFallbacks) {
    Add(app, opt::kAllowSharedCores, &rq->allow_shared_cores);
    Add(app, opt::kIgnoreGpus, &rq->ignore_gpus);
  }
  if (sets & kPlanNoBind) Add(app, opt::kNoBind, &rq->no_bind);
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
