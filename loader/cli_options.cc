#include "loader/cli_options.h"

#include <sstream>

namespace nl {

void AddTransformOptions(CLI::App* app, TransformConfig* c, TransformFlags* f) {
  app->add_option("--image-size", c->image_size, "Output side in pixels")->capture_default_str();
  app->add_option("--resize", f->resize,
                  "squash (to SxS) or shorter-crop (shorter side S, centre crop)")
      ->capture_default_str();
  app->add_option("--pad-crop", c->pad_crop,
                  "Train: zero-pad P pixels, then random crop (before resize)");
  app->add_flag("--random-resized-crop", f->rrc,
                "Train: torchvision RandomResizedCrop(scale 0.08-1, ratio 3/4-4/3)");
  app->add_flag("--no-flip", f->no_flip, "Train: no random horizontal flip");
  app->add_option("--layout", f->layout, "nchw or nhwc")->capture_default_str();
  app->add_flag("--normalize", c->normalize, "float32 (x/255 - mean) / std instead of uint8");
  app->add_option("--mean", f->mean, "Normalisation mean, e.g. 0.485,0.456,0.406");
  app->add_option("--std", f->std, "Normalisation std, e.g. 0.229,0.224,0.225");
}

namespace {
Status ParseTriple(const std::string& s, const char* what, std::array<float, 3>* out) {
  if (s.empty()) return Status::Ok();
  std::istringstream in(s);
  std::string tok;
  int i = 0;
  while (std::getline(in, tok, ',')) {
    if (i == 3) return Status::InvalidArgument(std::string(what) + " takes 3 values");
    try {
      (*out)[i++] = std::stof(tok);
    } catch (...) {
      return Status::InvalidArgument(std::string("bad ") + what + " value '" + tok + "'");
    }
  }
  if (i != 3) return Status::InvalidArgument(std::string(what) + " takes 3 values");
  return Status::Ok();
}
}  // namespace

Status FinishTransformOptions(const TransformFlags& f, TransformConfig* c) {
  NL_ASSIGN_OR_RETURN(c->resize, ParseResizeMode(f.resize));
  NL_ASSIGN_OR_RETURN(c->layout, ParseLayout(f.layout));
  c->random_resized_crop = f.rrc;
  c->flip = !f.no_flip;
  if (c->image_size < 1 || c->image_size > 8192)
    return Status::InvalidArgument("--image-size must be 1..8192");
  if (c->pad_crop < 0 || c->pad_crop > 1024)
    return Status::InvalidArgument("--pad-crop must be 0..1024");
  NL_RETURN_IF_ERROR(ParseTriple(f.mean, "--mean", &c->mean));
  NL_RETURN_IF_ERROR(ParseTriple(f.std, "--std", &c->std));
  for (float s : c->std)
    if (s == 0) return Status::InvalidArgument("--std values must not be 0");
  return Status::Ok();
}

void AddPipelineOptions(CLI::App* app, PipelineConfig* c, PipelineFlags* f) {
  app->add_option("--data", c->data_dir, "Shard set directory (pack_tool output)")->required();
  app->add_option("--split", c->split, "Split")->capture_default_str();
  app->add_option("--batch-size", c->batch_size, "Samples per batch")->capture_default_str();
  app->add_option("--prefetch", c->prefetch, "Batches in flight")->capture_default_str();
  app->add_option("--seed", c->seed, "Shuffle and augmentation seed")->capture_default_str();
  app->add_flag("--no-shuffle", f->no_shuffle, "Index order instead of a per-epoch permutation");
  app->add_flag("--drop-last", c->drop_last,
                "Trim the dataset to a multiple of the world size instead of padding");
  app->add_flag("--drop-last-batch", c->drop_last_batch, "Drop each epoch's last partial batch");
  app->add_option("--on-bad-record", f->on_bad_record,
                  "error (stop, naming the record) or skip (replace and count)")
      ->capture_default_str();
}

Status FinishPipelineOptions(const PipelineFlags& f, PipelineConfig* c) {
  c->shuffle = !f.no_shuffle;
  NL_ASSIGN_OR_RETURN(c->on_bad_record, ParseOnBadRecord(f.on_bad_record));
  if (c->batch_size == 0) return Status::InvalidArgument("--batch-size must be at least 1");
  return Status::Ok();
}

}  // namespace nl
