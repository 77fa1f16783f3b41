// loader: the loader's command line. `loader topo` shows the machine's
// GPU/NUMA/CPU map and the binding plan (more subcommands come with the
// pipeline: serve, preview).
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <nlohmann/json.hpp>

#include "formats/file_util.h"
#include "formats/manifest.h"
#include "formats/parse_number.h"
#include "formats/shard.h"
#include "loader/cli/cli_options.h"
#include "loader/pipeline/sample_path.h"
#include "loader/plan/binding.h"
#include "loader/plan/gpu_order.h"
#include "loader/plan/job_plan.h"
#include "loader/plan/topology.h"

namespace {

int Fail(const nl::Status& s) {
  std::fprintf(stderr, "loader: error: %s\n", s.ToString().c_str());
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
                          {"reason", r.reason}});
  }
  return j;
}

int Topo(TopoArgs a) {
  if (const char* cvd = std::getenv("CUDA_VISIBLE_DEVICES")) a.rq.cuda_visible_devices = cvd;
  nl::Result<nl::JobPlan> job = nl::MakeJobPlan(a.rq);
  if (!job.ok()) return Fail(job.status());
  if (a.json) {
    nlohmann::json j = ToJson(job->topology, job->gpus, job->plan);
    j["notes"] = job->notes;
    j["gpu_note"] = job->gpu_note;  // why no GPU was found through CUDA ("" when one was)
    std::cout << j.dump() << "\n";
    return 0;
  }
  PrintMap(job->topology, job->gpus, job->gpu_note);
  const size_t n = job->plan.ranks.size();
  std::printf("\nbinding plan for %zu local rank%s:\n", n, n == 1 ? "" : "s");
  for (const nl::RankPlan& r : job->plan.ranks) {
    std::printf("%s\n    because: %s\n", nl::PlanLine(r.local_rank, r).c_str(), r.reason.c_str());
  }
  for (const std::string& note : job->notes) std::printf("note: %s\n", note.c_str());
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

// Writes each sample exactly as the model sees it (before normalisation).
int Preview(PreviewArgs a) {
  nl::Status st = nl::FinishTransformOptions(a.flags, &a.transform);
  if (!st.ok()) return Fail(st);
  a.transform.seed = a.seed;
  a.transform.layout = nl::Layout::kNHWC;
  a.transform.normalize = false;
  nl::Result<nl::Manifest> m = nl::LoadManifest(a.data);
  if (!m.ok()) return Fail(m.status());
  nl::Result<std::unique_ptr<nl::SplitReader>> reader = nl::SplitReader::Open(a.data, *m, a.split);
  if (!reader.ok()) return Fail(reader.status());
  std::vector<uint64_t> indices;
  if (!a.indices.empty()) {
    nl::Result<std::vector<int64_t>> l =
        nl::ParseIntList(a.indices, "--indices", 0, static_cast<int64_t>((*reader)->size()) - 1);
    if (!l.ok()) return Fail(l.status());
    if (l->size() > kMaxPreviewSamples) {
      return Fail(nl::Status::InvalidArgument("--indices lists " + std::to_string(l->size()) +
                                              " samples; preview writes at most " +
                                              std::to_string(kMaxPreviewSamples)));
    }
    indices.assign(l->begin(), l->end());
  } else {
    if (a.grid.empty())
      return Fail(nl::Status::InvalidArgument("give --indices, or --grid for a whole batch"));
    nl::SamplerConfig sc;
    sc.dataset_size = (*reader)->size();
    sc.seed = a.seed;
    sc.batch_size = a.batch_size;
    nl::Result<nl::DistributedSampler> s = nl::DistributedSampler::Create(sc);
    if (!s.ok()) return Fail(s.status());
    if (a.batch >= s->batches_per_epoch())
      return Fail(nl::Status::InvalidArgument("--batch is past the epoch"));
    const std::vector<uint64_t> list = s->EpochIndices(a.epoch);
    for (uint32_t j = 0; j < s->BatchLength(a.batch); ++j)
      indices.push_back(list[a.batch * a.batch_size + j]);
  }
  if (!a.out.empty()) {
    st = nl::MakeDirs(a.out);
    if (!st.ok()) return Fail(st);
  }
  nl::SamplePath sample_path(**reader, a.transform, nl::DecodeLimits{});
  const int s = a.transform.image_size;
  nl::Image sample;
  sample.width = sample.height = static_cast<uint32_t>(s);
  sample.pixels.resize(sample_path.sample_bytes());
  const int cols = static_cast<int>(std::ceil(std::sqrt(static_cast<double>(indices.size()))));
  const int rows = (static_cast<int>(indices.size()) + cols - 1) / cols, gap = 2;
  nl::Image grid;
  grid.width = static_cast<uint32_t>(cols * (s + gap) + gap);
  grid.height = static_cast<uint32_t>(rows * (s + gap) + gap);
  grid.pixels.assign(size_t{grid.width} * grid.height * 3, 255);
  for (size_t k = 0; k < indices.size(); ++k) {
    const uint64_t i = indices[k];
    int64_t label = 0;
    st = sample_path.Load(a.epoch, i, sample.pixels.data(), &label);
    if (!st.ok()) return Fail(st);
    if (!a.out.empty()) {
      nl::Result<std::vector<uint8_t>> png = nl::EncodePng(sample, 3);
      if (!png.ok()) return Fail(png.status());
      const std::string path = a.out + "/" + std::to_string(i) + ".png";
      st = nl::WriteFile(path, png->data(), png->size());
      if (!st.ok()) return Fail(st);
    }
    const int gx = gap + static_cast<int>(k % cols) * (s + gap),
              gy = gap + static_cast<int>(k / cols) * (s + gap);
    for (int y = 0; y < s; ++y) {
      std::memcpy(&grid.pixels[((size_t(gy) + y) * grid.width + gx) * 3],
                  &sample.pixels[size_t(y) * s * 3], size_t(s) * 3);
    }
  }
  if (!a.grid.empty()) {
    nl::Result<std::vector<uint8_t>> png = nl::EncodePng(grid, 3);
    if (!png.ok()) return Fail(png.status());
    st = nl::WriteFile(a.grid, png->data(), png->size());
    if (!st.ok()) return Fail(st);
  }
  std::printf("wrote %zu sample%s (%s, %dx%d)%s%s%s%s\n", indices.size(),
              indices.size() == 1 ? "" : "s",
              a.transform.train ? ("train transform, epoch " + std::to_string(a.epoch)).c_str()
                                : "eval transform",
              s, s, a.out.empty() ? "" : " to ", a.out.c_str(), a.grid.empty() ? "" : ", grid ",
              a.grid.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"loader: NUMA-aware image loading"};
  app.require_subcommand(1);
  TopoArgs t;
  auto* topo = app.add_subcommand("topo", "Show the GPU/NUMA/CPU map and the binding plan");
  topo->add_option("--topology", t.rq.topology_file, "An hwloc XML file instead of this machine");
  topo->add_option("--nproc-per-node", t.rq.nproc,
                   "Local ranks, 1.." + std::to_string(nl::kMaxLocalRanks) +
                       " (default: one per visible GPU, at least 1)")
      ->check(CLI::Range(1, nl::kMaxLocalRanks));
  topo->add_option("--gpus", t.rq.gpus,
                   "GPU index of each local rank, e.g. 0,2 (default: rank i uses GPU i)");
  topo->add_option("--trainer-cores", t.rq.trainer_cores, "Cores reserved for each trainer rank")
      ->check(CLI::Range(1, nl::kMaxCpuIndex))
      ->capture_default_str();
  topo->add_option("--cpu-affinity", t.rq.cpu_affinity,
                   "One cpu list per local rank: \"0-9,44-53;10-21,54-65\"");
  topo->add_option("--numa-node", t.rq.numa_node,
                   "NUMA node of each local rank (or one for all), e.g. 0,0,1,1");
  topo->add_flag("--allow-shared-cores", t.rq.allow_shared_cores,
                 "Let ranks share cores when a node has too few");
  topo->add_flag("--ignore-gpus", t.rq.ignore_gpus,
                 "Plan as if no GPU were visible (ranks round-robin over NUMA nodes)");
  topo->add_flag("--no-bind", t.rq.no_bind, "A plan that binds nothing");
  topo->add_flag("--json", t.json, "Print the map and plan as one JSON object");

  PreviewArgs pv;
  auto* preview = app.add_subcommand(
      "preview", "Write processed samples as PNG: exactly the pixels the model sees");
  preview->add_option("--data", pv.data, "Shard set directory")->required();
  preview->add_option("--split", pv.split, "Split")->capture_default_str();
  preview->add_option("--indices", pv.indices, "Sample indices, e.g. 0,5,9");
  preview->add_option("--out", pv.out, "Directory for <index>.png");
  preview->add_option("--grid", pv.grid,
                      "Also write a contact sheet (without --indices: a whole batch)");
  preview->add_option("--batch", pv.batch, "With --grid and no --indices: which batch of the epoch")
      ->capture_default_str();
  preview->add_option("--batch-size", pv.batch_size, "With --grid and no --indices: its size")
      ->check(CLI::Range(1u, kMaxPreviewSamples))
      ->capture_default_str();
  preview->add_option("--epoch", pv.epoch, "Epoch (augmentation and batch order depend on it)")
      ->capture_default_str();
  preview->add_option("--seed", pv.seed, "Seed")->capture_default_str();
  nl::AddTransformOptions(preview, &pv.transform, &pv.flags);

  CLI11_PARSE(app, argc, argv);
  if (topo->parsed()) return Topo(t);
  if (preview->parsed()) {
    if (pv.out.empty() && pv.grid.empty())
      return Fail(nl::Status::InvalidArgument("give --out DIR and/or --grid FILE.png"));
    return Preview(pv);
  }
  return 2;
}
