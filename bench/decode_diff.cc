// decode_diff: how far --decode fast and auto are from exact, by output
// size, on a packed set (bench/make_photo_folder.py's photographs: see
// bench/decode_diff.sh and docs/DECODE.md). For the train transform
// (RandomResizedCrop + flip) and the eval one (Resize S + CenterCrop S),
// at each --sizes S, every sample i < --samples of the split (epoch 0) is
// loaded through the sample path exact, fast, and auto at each --ratios
// (auto_min_ratio; the default marked), and each sample's bytes are
// compared with exact's: the mean |difference| in levels over every byte
// of every sample, the largest single difference, the share of samples
// decoded at a scale below 8/8, and the decode + transform time a sample
// (the configurations take turns sample by sample), and the share of
// samples whose own mean is over 2 levels. Then every scaled decode of a
// sample (fast's and auto's, each scale once), by how many times the
// output size its scaled crop is: the ratio auto's rule bounds. --check-auto L: exit 1 unless auto
// at the default ratio is within L levels (mean) of exact at every size and transform.
//
//   decode_diff --data DIR [--split train] [--samples 400]
//               [--sizes 32,48,64,96,128,160,224] [--ratios 1,1.5,2,3,4]
//               [--transforms train,eval] [--check-auto 2]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "base/parse_number.h"
#include "loader/cli/option_table.h"
#include "formats/manifest.h"
#include "formats/shard.h"
#include "loader/pipeline/sample_path.h"
#include "loader/pipeline/transforms.h"

namespace {

template <typename T>
using Result = nl::Result<T>;

struct Args {
  std::string data, split = "train";
  uint64_t samples = 400;
  std::string sizes = "32,48,64,96,128,160,224", ratios = "1,1.5,2,3,4", transforms = "train,eval";
  double check_auto = -1;
};

// One way of decoding, against exact, summed over samples.
struct Tally {
  std::string name;
  nl::TransformConfig config;
  double sum = 0;
  uint64_t bytes = 0, samples = 0, scaled = 0, ns = 0, over2 = 0;
  int max = 0;
  double Mean() const { return bytes ? sum / static_cast<double>(bytes) : 0; }
};

// Scaled decodes by their scaled crop's size over the output's (its
// smaller axis): what auto_min_ratio bounds.
struct RatioBucket {
  double lo, hi;
  double sum = 0;
  uint64_t bytes = 0, samples = 0, over2 = 0;
  int max = 0;
};

nl::TransformConfig Transform(const std::string& t, int size) {
  nl::TransformConfig c;
  c.image_size = size;
  c.layout = nl::Layout::kNHWC;
  if (t == "train") {
    c.train = true;
    c.random_resized_crop = true;
  } else {
    c.resize = nl::ResizeMode::kShorterCrop;
  }
  return c;
}

std::string Ratio(double r) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", r);
  return b;
}

Result<std::vector<std::string>> ParseTransforms(const std::string& text) {
  std::vector<std::string> transforms;
  for (std::string_view t : nl::SplitText(text, ',')) {
    if (t != "train" && t != "eval") {
      return nl::Status::InvalidArgument("--transforms takes train and eval, not '" +
                                         std::string(t) + "'");
    }
    transforms.emplace_back(t);
  }
  return transforms;
}

// The images' sizes of the split's first n samples, for the geometry (each sample's crop).
Result<std::vector<std::pair<int, int>>> ReadShapes(const nl::SplitReader& reader, uint64_t n) {
  std::vector<std::pair<int, int>> shape(n);
  nl::SplitReader::ReadTxn txn = reader.BeginRead();
  for (uint64_t i = 0; i < n; ++i) {
    NL_ASSIGN_OR_RETURN(nl::RecordView r, txn.Read(i, nl::RecordLimits{}));
    shape[i] = {static_cast<int>(r.header.width), static_cast<int>(r.header.height)};
  }
  return shape;
}

// exact first, then fast, then auto at each ratio.
std::vector<Tally> TalliesFor(const std::string& t, int size, const std::vector<double>& ratios) {
  std::vector<Tally> tallies;
  tallies.push_back({"exact", Transform(t, size)});
  tallies.push_back({"fast", tallies[0].config});
  tallies.back().config.decode = nl::DecodeMode::kFast;
  for (const double r : ratios) {
    tallies.push_back(
        {"auto " + Ratio(r) + (r == nl::kAutoMinRatio ? " (default)" : ""), tallies[0].config});
    tallies.back().config.decode = nl::DecodeMode::kAuto;
    tallies.back().config.auto_min_ratio = r;
  }
  return tallies;
}

// Sample i as decoded by tallies[k] (out[k]) against exact's (out[0]),
// added to its tally and, for each scale below 8/8 once, to the bucket of
// its scaled crop's ratio to the output.
void Compare(uint64_t i, std::pair<int, int> shape, const std::vector<std::vector<uint8_t>>& out,
             const std::vector<nl::SampleTransform>& alone, std::vector<Tally>* tallies,
             std::vector<RatioBucket>* buckets) {
  const size_t bytes = out[0].size();
  bool bucketed[9] = {};  // the scales of this sample counted in a bucket
  for (size_t k = 1; k < tallies->size(); ++k) {
    Tally& y = (*tallies)[k];
    double sum = 0;
    int max = 0;
    for (size_t b = 0; b < bytes; ++b) {
      const int d = std::abs(int{out[k][b]} - int{out[0][b]});
      sum += d;
      max = std::max(max, d);
    }
    const bool over2 = sum > 2.0 * static_cast<double>(bytes);
    y.sum += sum;
    y.bytes += bytes;
    y.max = std::max(y.max, max);
    y.over2 += over2;
    const nl::SampleGeometry g = alone[k].Geometry(shape.first, shape.second, 0, i);
    const int scale = alone[k].ChooseDecode(g).scale_eighths;
    y.scaled += scale < 8;
    if (scale == 8 || bucketed[scale]) continue;
    bucketed[scale] = true;
    const double ratio = std::min(static_cast<double>(g.crop_w) * scale / (8.0 * g.full_w),
                                  static_cast<double>(g.crop_h) * scale / (8.0 * g.full_h));
    for (RatioBucket& rb : *buckets) {
      if (ratio >= rb.lo && ratio < rb.hi) {
        rb.sum += sum;
        rb.bytes += bytes;
        rb.max = std::max(rb.max, max);
        rb.over2 += over2;
        ++rb.samples;
      }
    }
  }
}

// One transform at one size: every way of decoding over the first n
// samples (taking turns sample by sample), into tallies and buckets.
Result<std::vector<Tally>> Measure(const nl::SplitReader& reader,
                                   const std::vector<std::pair<int, int>>& shape,
                                   const std::string& t, int size,
                                   const std::vector<double>& ratios,
                                   std::vector<RatioBucket>* buckets) {
  std::vector<Tally> tallies = TalliesFor(t, size, ratios);
  std::vector<std::unique_ptr<nl::SamplePath>> paths;
  std::vector<nl::SampleTransform> alone;
  for (const Tally& k : tallies) {
    paths.push_back(std::make_unique<nl::SamplePath>(reader, k.config, nl::DecodeLimits{}));
    alone.emplace_back(k.config);
  }
  std::vector<std::vector<uint8_t>> out(tallies.size(),
                                        std::vector<uint8_t>(paths[0]->sample_bytes()));
  for (uint64_t i = 0; i < shape.size(); ++i) {
    for (size_t k = 0; k < tallies.size(); ++k) {
      int64_t label;
      nl::SampleTimes times;
      NL_RETURN_IF_ERROR(paths[k]->Load(0, i, out[k].data(), &label, &times));
      tallies[k].ns += times.decode_ns + times.transform_ns;
    }
    Compare(i, shape[i], out, alone, &tallies, buckets);
  }
  for (Tally& y : tallies) y.samples = shape.size();
  return tallies;
}

// Prints a size's rows; false when auto at the default ratio is further
// from exact than --check-auto allows.
bool PrintTallies(const Args& a, const std::string& t, int64_t size,
                  const std::vector<Tally>& tallies) {
  bool ok = true;
  for (const Tally& y : tallies) {
    const double n = static_cast<double>(y.samples);
    std::printf("| %s | %llu | %s | %.2f | %d | %.1f%% | %.0f%% | %.0f |\n",
                t == "train" ? "RandomResizedCrop + flip" : "Resize S + CenterCrop S",
                static_cast<unsigned long long>(size), y.name.c_str(), y.Mean(), y.max,
                100.0 * static_cast<double>(y.over2) / n, 100.0 * static_cast<double>(y.scaled) / n,
                static_cast<double>(y.ns) / 1e3 / n);
    if (a.check_auto >= 0 && y.config.decode == nl::DecodeMode::kAuto &&
        y.config.auto_min_ratio == nl::kAutoMinRatio && y.Mean() > a.check_auto) {
      std::fprintf(stderr,
                   "decode_diff: auto is %.2f levels from exact (over %g) for %s at %llu px\n",
                   y.Mean(), a.check_auto, t.c_str(), static_cast<unsigned long long>(size));
      ok = false;
    }
  }
  return ok;
}

void PrintBuckets(const std::vector<std::string>& transforms,
                  std::map<std::string, std::vector<RatioBucket>>& by_ratio) {
  std::printf(
      "\nEvery scaled decode above (a sample at a scale below 8/8, once), by its scaled crop's "
      "size over\n"
      "the output's (the smaller of the two axes), all sizes:\n\n");
  std::printf("| transform | ratio | decodes | mean abs diff (levels) | max | over 2 levels |\n");
  std::printf("|---|---|---:|---:|---:|---:|\n");
  for (const std::string& t : transforms) {
    for (const RatioBucket& rb : by_ratio[t]) {
      std::printf(
          "| %s | %s to %s | %llu | %.2f | %d | %.1f%% |\n", t.c_str(), Ratio(rb.lo).c_str(),
          rb.hi > 1e8 ? "" : Ratio(rb.hi).c_str(), static_cast<unsigned long long>(rb.samples),
          rb.bytes ? rb.sum / static_cast<double>(rb.bytes) : 0.0, rb.max,
          rb.samples ? 100.0 * static_cast<double>(rb.over2) / static_cast<double>(rb.samples)
                     : 0.0);
    }
  }
}

nl::Status Run(const Args& a) {
  NL_ASSIGN_OR_RETURN(std::vector<int64_t> sizes, nl::ParseIntList(a.sizes, "--sizes", 1, 8192));
  NL_ASSIGN_OR_RETURN(std::vector<double> ratios, nl::ParseDoubleList(a.ratios, "--ratios", 1, 64));
  NL_ASSIGN_OR_RETURN(std::vector<std::string> transforms, ParseTransforms(a.transforms));
  NL_ASSIGN_OR_RETURN(nl::Manifest m, nl::LoadManifest(a.data));
  NL_ASSIGN_OR_RETURN(std::unique_ptr<nl::SplitReader> reader,
                      nl::SplitReader::Open(a.data, m, a.split));
  using Shapes = std::vector<std::pair<int, int>>;
  NL_ASSIGN_OR_RETURN(const Shapes shape,
                      ReadShapes(*reader, std::min<uint64_t>(a.samples, reader->size())));
  std::printf("%llu samples of %s, split %s, epoch 0\n\n",
              static_cast<unsigned long long>(shape.size()), a.data.c_str(), a.split.c_str());
  std::printf(
      "| transform | size | decode | mean abs diff (levels) | max | samples over 2 levels | "
      "decoded scaled | us/sample |\n");
  std::printf("|---|---:|---|---:|---:|---:|---:|---:|\n");
  bool auto_ok = true;
  std::map<std::string, std::vector<RatioBucket>> by_ratio;
  for (const std::string& t : transforms) {
    std::vector<RatioBucket>& buckets = by_ratio[t];
    buckets = {{1, 1.25}, {1.25, 1.5}, {1.5, 2}, {2, 2.5}, {2.5, 3}, {3, 4}, {4, 1e9}};
    for (const int64_t size : sizes) {
      NL_ASSIGN_OR_RETURN(const std::vector<Tally> tallies,
                          Measure(*reader, shape, t, static_cast<int>(size), ratios, &buckets));
      auto_ok &= PrintTallies(a, t, size, tallies);
    }
  }
  PrintBuckets(transforms, by_ratio);
  if (a.check_auto >= 0) {
    if (!auto_ok)
      return nl::Status::FailedPrecondition("auto is further from exact than --check-auto allows");
    std::printf("\nauto (ratio %g) within %g levels of exact at every size\n", nl::kAutoMinRatio,
                a.check_auto);
  }
  return nl::Status::Ok();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"How far --decode fast and auto are from exact, by output size"};
  Args a;
  nl::Add(&app, nl::opt::kData, &a.data);
  nl::Add(&app, nl::opt::kSplit, &a.split);
  app.add_option("--samples", a.samples, "Samples (the split's first)")->capture_default_str();
  app.add_option("--sizes", a.sizes, "Output sizes")->capture_default_str();
  app.add_option("--ratios", a.ratios, "auto_min_ratio values to measure")->capture_default_str();
  app.add_option("--transforms", a.transforms, "train and/or eval")->capture_default_str();
  app.add_option(
      "--check-auto", a.check_auto,
      "Exit 1 unless auto (the default ratio) is within this many levels of exact (mean)");
  CLI11_PARSE(app, argc, argv);
  const nl::Status st = Run(a);
  if (!st.ok()) {
    std::fprintf(stderr, "decode_diff: %s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}
