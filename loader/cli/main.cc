// loader: the loader's command line. `loader topo` shows the machine's
// GPU/NUMA/CPU map and the binding plan; `loader preview` writes the exact
// images a batch holds; `loader serve` and `loader consume` are the two
// ends of a rank's shared-memory ring.
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>

#include "base/file_util.h"
#include "formats/manifest.h"
#include "base/parse_number.h"
#include "formats/shard.h"
#include "loader/cli/cli_options.h"
#include "loader/cli/option_table.h"
#include "loader/cli/serve_consume.h"
#include "loader/pipeline/sample_path.h"
#include "loader/plan/binding.h"
#include "loader/plan/gpu_order.h"
#include "loader/plan/job_plan.h"
#include "loader/plan/topology.h"

namespace {

int Fail(const nl::Status& s) {
  std::fprintf(stderr, "loader: error: %s\n", nl::FlagText(s.ToString()).c_str());
  return 1;
}

std::string Gib(uint64_t b) {
  if (b == 0) return "?";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GiB", static_cast<double>(b) / (1ull << 30));
  return buf;
}

struct TopoArgs {
  nl::JobPlanRequest rq;
  bool json = false;
};

void PrintMap(const nl::Topology& t, const std::vector<nl::VisibleGpu>& gpus,
              const std::string& gpu_note) {
  std::printf("machine: %s\n", t.source().c_str());
  std::printf("allowed cpus: %s\n", nl::FormatCpuList(t.allowed_pus()).c_str());
  std::printf("\nNUMA node  cores  cpus                          memory      GPUs\n");
  for (const nl::NumaNode& n : t.numa_nodes()) {
    std::string g;
    for (const auto& v : gpus)
      if (v.gpu.numa_node == n.os_index)
        g += (g.empty() ? "" : " ") + ("GPU" + std::to_string(v.index));
    std::printf("%-10d %-6zu %-29s %-11s %s\n", n.os_index, n.cores.size(),
                nl::FormatCpuList(n.pus).c_str(), Gib(n.memory_bytes).c_str(),
                g.empty() ? "-" : g.c_str());
  }
  std::printf("\nGPU   PCI bus id     NUMA node  CPU affinity\n");
  if (gpus.empty())
    std::printf("(none visible%s)\n", gpu_note.empty() ? "" : (": " + gpu_note).c_str());
  for (const auto& v : gpus) {
    const nl::NumaNode* n = t.FindNode(v.gpu.numa_node);
    std::printf("GPU%-3d%-15s%-11s%s\n", v.index, v.gpu.pci_bus_id.c_str(),
                v.gpu.numa_node >= 0 ? std::to_string(v.gpu.numa_node).c_str() : "?",
                n ? nl::FormatCpuList(n->pus).c_str() : "?");
  }
}

nlohmann::json ToJson(const nl::Topology& t, const std::vector<nl::VisibleGpu>& gpus,
                      const nl::BindingPlan& plan) {
  using nlohmann::json;
  json j;
  j["source"] = t.source();
  j["allowed_cpus"] = t.allowed_pus();
  j["numa_nodes"] = json::array();
  for (const nl::NumaNode& n : t.numa_nodes()) {
    json cores = json::array();
    for (const nl::Core& c : n.cores) cores.push_back(c.pus);
    j["numa_nodes"].push_back({{"os_index", n.os_index},
                               {"cpus", n.pus},
                               {"cores", cores},
                               {"memory_bytes", n.memory_bytes}});
  }
  j["gpus"] = json::array();
  for (const auto& v : gpus) {
    j["gpus"].push_back(
        {{"index", v.index}, {"pci", v.gpu.pci_bus_id}, {"numa_node", v.gpu.numa_node}});
  }
  j["binds"] = plan.binds;
  j["ranks"] = json::array();
  for (const nl::RankPlan& r : plan.ranks) {
    j["ranks"].push_back({{"local_rank", r.local_rank},
                          {"gpu", r.gpu},
                          {"pci", r.pci_bus_id},
                          {"numa_node", r.numa_node},
                          {"trainer_cpus", r.trainer_cpus},
                          {"loader_cpus", r.loader_cpus},
                          {"mem_node", r.mem_node},
                          {"shares_cores", r.shares_cores},
                          {"reason", nl::FlagText(r.reason)}});
  }
  return j;
}

int Topo(TopoArgs a) {
  if (const char* cvd = std::getenv("CUDA_VISIBLE_DEVICES")) a.rq.cuda_visible_devices = cvd;
  nl::Result<nl::JobPlan> job = nl::MakeJobPlan(a.rq);
  if (!job.ok()) return Fail(job.status());
  if (a.json) {
    nlohmann::json j = ToJson(job->topology, job->gpus, job->plan);
    for (const std::string& note : job->notes) j["notes"].push_back(nl::FlagText(note));
    j["gpu_note"] = job->gpu_note;  // why no GPU was found through CUDA ("" when one was)
    std::cout << j.dump() << "\n";
    return 0;
  }
  PrintMap(job->topology, job->gpus, job->gpu_note);
  const size_t n = job->plan.ranks.size();
  std::printf("\nbinding plan for %zu local rank%s:\n", n, n == 1 ? "" : "s");
  for (const nl::RankPlan& r : job->plan.ranks) {
    std::printf("%s\n    because: %s\n", nl::PlanLine(r.local_rank, r).c_str(), nl::FlagText(r.reason).c_str());
  }
  for (const std::string& note : job->notes) std::printf("note: %s\n", nl::FlagText(note).c_str());
  return 0;
}

// What one preview may write (its contact sheet is one image).
constexpr uint32_t kMaxPreviewSamples = 1024;

struct PreviewArgs {
  std::string data, split = "train", indices, out, grid;
  uint64_t epoch = 0, seed = 0, batch = 0;
  uint32_t batch_size = 16;
  nl::TransformConfig transform;
  nl::TransformFlags flags;
};

// The samples a preview shows: --indices, or batch --batch of epoch --epoch.
nl::Result<std::vector<uint64_t>> PreviewIndices(const PreviewArgs& a, uint64_t split_size) {
  std::vector<uint64_t> indices;
  if (!a.indices.empty()) {
    NL_ASSIGN_OR_RETURN(
        std::vector<int64_t> l,
        nl::ParseIntList(a.indices, "--indices", 0, static_cast<int64_t>(split_size) - 1));
    if (l.size() > kMaxPreviewSamples) {
      return nl::Status::InvalidArgument("--indices lists " + std::to_string(l.size()) +
                                         " samples; preview writes at most " +
                                         std::to_string(kMaxPreviewSamples));
    }
    indices.assign(l.begin(), l.end());
    return indices;
  }
  if (a.grid.empty()) {
    return nl::Status::InvalidArgument("give --indices, or --grid for a whole batch");
  }
  nl::PipelineConfig pc;  // one rank, shuffled, every batch kept: as a loader's defaults
  pc.world = 1;
  pc.seed = a.seed;
  pc.batch_size = a.batch_size;
  NL_ASSIGN_OR_RETURN(nl::DistributedSampler sampler,
                      nl::DistributedSampler::Create(nl::SamplerConfigFor(pc, split_size)));
  if (a.batch >= sampler.batches_per_epoch()) {
    return nl::Status::InvalidArgument("--batch " + std::to_string(a.batch) + " is past the " +
                                       std::to_string(sampler.batches_per_epoch()) +
                                       " batches of an epoch");
  }
  const std::vector<uint64_t> list = sampler.EpochIndices(a.epoch);
  for (uint32_t j = 0; j < sampler.BatchLength(a.batch); ++j) {
    indices.push_back(list[a.batch * a.batch_size + j]);
  }
  return indices;
}

// A contact sheet: the samples side by side, with a white gap.
class ContactSheet {
 public:
  static constexpr uint64_t kMaxBytes = uint64_t{256} << 20;
  static constexpr int kGap = 2;

  static nl::Result<ContactSheet> Make(size_t samples, int side) {
    ContactSheet g;
    g.side_ = side;
    g.cols_ = static_cast<int>(std::ceil(std::sqrt(static_cast<double>(samples))));
    const int rows = (static_cast<int>(samples) + g.cols_ - 1) / g.cols_;
    const uint64_t w = uint64_t(g.cols_) * (side + kGap) + kGap;
    const uint64_t h = uint64_t(rows) * (side + kGap) + kGap;
    if (w * h * 3 > kMaxBytes) {
      return nl::Status::InvalidArgument(
          "a grid of " + std::to_string(samples) + " samples at " + std::to_string(side) + "x" +
          std::to_string(side) + " would be " + std::to_string(w) + "x" + std::to_string(h) +
          " pixels, over the " + std::to_string(kMaxBytes >> 20) +
          " MiB a preview writes: fewer samples or a smaller --image-size");
    }
    g.image_.width = static_cast<uint32_t>(w);
    g.image_.height = static_cast<uint32_t>(h);
    g.image_.pixels.assign(w * h * 3, 255);
    return g;
  }
  // Sample k (side x side, RGB) into its cell.
  void Place(size_t k, const uint8_t* rgb) {
    const size_t gx = kGap + (k % cols_) * (side_ + kGap), gy = kGap + (k / cols_) * (side_ + kGap);
    for (int y = 0; y < side_; ++y) {
      std::memcpy(&image_.pixels[((gy + y) * image_.width + gx) * 3], rgb + size_t(y) * side_ * 3,
                  size_t(side_) * 3);
    }
  }
  const nl::Image& image() const { return image_; }

 private:
  int side_ = 0, cols_ = 1;
  nl::Image image_;
};

nl::Status WritePng(const nl::Image& img, const std::string& path) {
  NL_ASSIGN_OR_RETURN(std::vector<uint8_t> png, nl::EncodePng(img, 3));
  return nl::WriteFileAtomically(path, std::string(png.begin(), png.end()));
}

// Preview writes the uint8 pixels the model sees, as PNG: the output-format
// flags of the loader do not apply to it, and are refused rather than ignored.
nl::Status CheckPreviewFlags(const PreviewArgs& a) {
  if (a.out.empty() && a.grid.empty()) {
    return nl::Status::InvalidArgument("give --out DIR and/or --grid FILE.png");
  }
  if (a.transform.normalize || !a.flags.mean.empty() || !a.flags.std.empty() ||
      a.flags.layout != "nchw") {
    return nl::Status::InvalidArgument(
        "preview writes the uint8 pixels as PNG: --normalize, --mean, --std and --layout do "
        "not apply to it");
  }
  return nl::Status::Ok();
}

// Writes each sample exactly as the model sees it (before normalisation).
nl::Status Preview(PreviewArgs a) {
  NL_RETURN_IF_ERROR(CheckPreviewFlags(a));
  NL_RETURN_IF_ERROR(nl::FinishTransformOptions(a.flags, &a.transform));
  a.transform.seed = a.seed;
  a.transform.layout = nl::Layout::kNHWC;
  NL_ASSIGN_OR_RETURN(nl::Manifest m, nl::LoadManifest(a.data));
  NL_ASSIGN_OR_RETURN(std::unique_ptr<nl::SplitReader> reader,
                      nl::SplitReader::Open(a.data, m, a.split));
  NL_ASSIGN_OR_RETURN(std::vector<uint64_t> indices, PreviewIndices(a, reader->size()));
  const int s = a.transform.image_size;
  std::optional<ContactSheet> grid;
  if (!a.grid.empty()) {
    NL_ASSIGN_OR_RETURN(grid, ContactSheet::Make(indices.size(), s));
  }
  if (!a.out.empty()) NL_RETURN_IF_ERROR(nl::MakeDirs(a.out));
  nl::SamplePath sample_path(*reader, a.transform, nl::DecodeLimits{});
  nl::Image sample;
  sample.width = sample.height = static_cast<uint32_t>(s);
  sample.pixels.resize(sample_path.sample_bytes());
  for (size_t k = 0; k < indices.size(); ++k) {
    int64_t label = 0;
    NL_RETURN_IF_ERROR(sample_path.Load(a.epoch, indices[k], sample.pixels.data(), &label));
    if (!a.out.empty()) {
      NL_RETURN_IF_ERROR(WritePng(sample, a.out + "/" + std::to_string(indices[k]) + ".png"));
    }
    if (grid) grid->Place(k, sample.pixels.data());
  }
  if (grid) NL_RETURN_IF_ERROR(WritePng(grid->image(), a.grid));
  std::printf("wrote %zu sample%s (%s, %dx%d)%s%s%s%s\n", indices.size(),
              indices.size() == 1 ? "" : "s",
              a.transform.train ? ("train transform, epoch " + std::to_string(a.epoch)).c_str()
                                : "eval transform",
              s, s, a.out.empty() ? "" : " to ", a.out.c_str(), a.grid.empty() ? "" : ", grid ",
              a.grid.c_str());
  return nl::Status::Ok();
}

CLI::App* AddTopo(CLI::App* app, TopoArgs* t) {
  auto* topo = app->add_subcommand("topo", "Show the GPU/NUMA/CPU map and the binding plan");
  nl::Add(topo, nl::opt::kNprocPerNode, &t->rq.nproc)->default_str("");
  nl::AddPlanOptions(topo, &t->rq,
                     nl::kPlanTopology | nl::kPlanPlacement | nl::kPlanFallbacks | nl::kPlanNoBind);
  nl::Add(topo, nl::opt::kJson, &t->json)->description("Print the map and plan as one JSON object");
  return topo;
}

CLI::App* AddPreview(CLI::App* app, PreviewArgs* pv) {
  auto* preview = app->add_subcommand(
      "preview", "Write processed samples as PNG: exactly the pixels the model sees");
  nl::Add(preview, nl::opt::kData, &pv->data);
  nl::Add(preview, nl::opt::kSplit, &pv->split);
  preview->add_option("--indices", pv->indices, "Sample indices, e.g. 0,5,9");
  nl::Add(preview, nl::opt::kOut, &pv->out);
  preview->add_option("--grid", pv->grid,
                      "Also write a contact sheet (without --indices: a whole batch)");
  preview->add_option("--batch", pv->batch, "With --grid and no --indices: which batch of the epoch")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  nl::Add(preview, nl::opt::kBatchSize, &pv->batch_size)
      ->check(CLI::Range(1u, kMaxPreviewSamples))
      ->description("With --grid and no --indices: its size");
  preview->add_option("--epoch", pv->epoch, "Epoch (augmentation and batch order depend on it)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  nl::Add(preview, nl::opt::kSeed, &pv->seed);
  nl::AddTransformOptions(preview, &pv->transform, &pv->flags);
  return preview;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"loader: NUMA-aware image loading"};
  app.require_subcommand(1);
  TopoArgs t;
  auto* topo = AddTopo(&app, &t);
  PreviewArgs pv;
  auto* preview = AddPreview(&app, &pv);
  nl::ServeFlags serve_flags;
  auto* serve = nl::AddServe(&app, &serve_flags);
  nl::ConsumeArgs consume_args;
  auto* consume = nl::AddConsume(&app, &consume_args);
  CLI11_PARSE(app, argc, argv);
  if (topo->parsed()) return Topo(t);
  if (serve->parsed()) return nl::RunServe(serve_flags);
  if (consume->parsed()) return nl::RunConsume(consume_args);
  if (preview->parsed()) {
    const nl::Status st = Preview(pv);
    return st.ok() ? 0 : Fail(st);
  }
  return 2;
}
