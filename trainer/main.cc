// trainer: LibTorch DDP image classification fed by the loader service.
//
//   trainer --data OUT --nproc-per-node 4 [--nnodes 2 --node-rank K --master-addr A]
//           [--model resnet18] [--epochs 1] [--batch-size 64] [--image-size 224] ...
//
// Without RANK/WORLD_SIZE/LOCAL_RANK in the environment it is the launcher
// (trainer/launcher.h) and runs --nproc-per-node copies of itself; with them
// (set by that launcher, by torchrun, or by a Slurm wrapper) it is one rank.
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "base/child_process.h"
#include "base/parse_number.h"
#include "formats/manifest.h"
#include "loader/cli/cli_options.h"
#include "loader/cli/option_table.h"
#include "loader/plan/job_plan.h"
#include "trainer/launcher.h"
#include "trainer/options.h"
#include "trainer/preflight.h"
#include "trainer/rank.h"

namespace {

using nl::trainer::Options;
using nl::trainer::Placement;

// What the command line holds before it becomes Options: the options shared
// with the loader (cli_options.h) parse into these.
struct SharedOptions {
  nl::TransformFlags transform;
  nl::OrderFlags order;
};

void AddLaunchOptions(CLI::App& app, Options& o) {
  nl::Add(&app, nl::opt::kData, &o.data);
  nl::Add(&app, nl::opt::kNprocPerNode, &o.nproc_per_node)->description("Ranks on this node");
  app.add_option("--nnodes", o.nnodes, "Nodes in the job")->check(CLI::Range(1, 65536))->capture_default_str();
  app.add_option("--node-rank", o.node_rank, "This node's index, 0..nnodes-1")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  app.add_option("--master-addr", o.master_addr, "Address of node 0 (the rendezvous store)")
      ->capture_default_str();
  app.add_option("--master-port", o.master_port, "Port of the rendezvous store")
      ->check(CLI::Range(1, 65535))
      ->capture_default_str();
}

void AddLoaderOptions(CLI::App& app, Options& o, SharedOptions& shared) {
  app.add_option("--loader", o.loader, "service (a `loader serve` per rank) or inprocess")
      ->check(CLI::IsMember({"service", "inprocess"}))
      ->capture_default_str();
  nl::Add(&app, nl::opt::kLoaderBin, &o.loader_bin);
  app.add_option("--loader-threads", o.loader_threads, "Loader threads per rank (default: the plan's loader cores)")
      ->check(CLI::Range(1u, 1024u));
  nl::Add(&app, nl::opt::kPrefetch, &o.prefetch);
  app.add_option("--resize-on", o.resize_on,
                 "loader (the loader resizes to --image-size) or device (the ring carries the source "
                 "size; the rank resizes bilinearly after the copy)")
      ->check(CLI::IsMember({"loader", "device"}))
      ->capture_default_str();
  // The train split's transform, as the loader takes it; here the train
  // transform is the default, and --augment alone means pad-crop 4 and flip.
  shared.transform.augment = true;
  shared.transform.augment_pad_crop = 4;
  nl::AddTransformOptions(&app, &o.transform, &shared.transform, nl::kTransformShape);
  nl::AddOrderOptions(&app, &shared.order);
  app.get_option("--image-size")->description("Side of the images the model sees")->check(CLI::Range(8, 4096));
  app.add_option("--eval-split", o.eval_split, "Split evaluated each epoch")->capture_default_str();
  app.add_option("--eval-transform", o.eval_transform,
                 "squash (resize to SxS) or center-crop (ImageNet's: the shorter side to S/0.875, 256 for 224, "
                 "then the centre SxS)")
      ->check(CLI::IsMember({"squash", "center-crop"}))
      ->capture_default_str();
  nl::AddPlanOptions(&app, &o.plan, nl::kPlanPlacement | nl::kPlanFallbacks | nl::kPlanNoBind);
}

void AddTrainingOptions(CLI::App& app, Options& o) {
  app.add_option("--model", o.model, "resnet18, resnet50 (torchvision's) or smallcnn (no batch norm)")
      ->check(CLI::IsMember({"resnet18", "resnet50", "smallcnn"}))
      ->capture_default_str();
  app.add_option("--device", o.device, "auto, cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  nl::Add(&app, nl::opt::kEpochs, &o.epochs)->check(CLI::Range(1, 1000000));
  nl::Add(&app, nl::opt::kBatchSize, &o.batch_size)->check(CLI::Range(1u, 65536u));
  app.add_option("--lr", o.lr, "Peak learning rate")->check(CLI::Range(0.0, 100.0))->capture_default_str();
  app.add_option("--momentum", o.momentum, "SGD momentum")->check(CLI::Range(0.0, 1.0))->capture_default_str();
  app.add_option("--weight-decay", o.weight_decay, "SGD weight decay")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  app.add_option("--label-smoothing", o.label_smoothing, "Label smoothing, 0..1")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  app.add_option("--warmup-steps", o.warmup_steps,
                 "Linear warm-up steps before the cosine decay (default: a tenth of the run, at most 500)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  app.add_option("--max-steps", o.max_steps, "Stop after this many steps (0: whole epochs)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  nl::Add(&app, nl::opt::kSeed, &o.seed)
      ->check(CLI::Range(uint64_t{0}, uint64_t{INT64_MAX}));  // a checkpoint stores it as int64
  nl::Add(&app, nl::opt::kOut, &o.out);
  app.add_option("--checkpoint-every", o.checkpoint_every, "Also checkpoint every N steps (with --out)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  app.add_option("--resume", o.resume, "Continue from this checkpoint at its (epoch, batch)")
      ->check(CLI::ExistingFile);
  app.add_flag("--resume-changes", o.resume_changes,
               "Resume although --epochs, --image-size or the schedule (--lr, --warmup-steps, "
               "--momentum, --weight-decay, --label-smoothing) differ from the checkpoint's run (it says what "
               "changed)");
  app.add_option("--threads", o.threads, "LibTorch threads per rank (default: the rank's trainer cores)")
      ->check(CLI::Range(1, 1024));
  app.add_option("--reduce", o.reduce,
                 "When the gradients' all-reduce runs: overlap (each bucket as soon as backward has filled "
                 "it, as PyTorch's DDP) or after-backward (all buckets once backward is done; for comparison)")
      ->check(CLI::IsMember({"overlap", "after-backward"}))
      ->capture_default_str();
}

void AddDiagnosticOptions(CLI::App& app, Options& o) {
  app.add_option("--report-every", o.report_every, "Per-rank table every N steps (0: only at epoch end)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40))
      ->capture_default_str();
  app.add_option("--metrics-out", o.metrics_out, "JSON lines: one per report per rank, one per epoch");
  app.add_option("--simulate-slow-rank", o.simulate_slow_rank, "Testing: slow this rank (its loader, or its compute)")
      ->check(CLI::Range(0, 1 << 20));
  app.add_option("--delay-ms", o.delay_ms, "... by this many ms per batch")->check(CLI::Range(0.0, 1e6));
  app.add_option("--slow-phase", o.slow_phase, "... in its loader (data) or in each step's compute")
      ->check(CLI::IsMember({"data", "compute"}))
      ->capture_default_str();
  app.add_option("--misbind-rank", o.misbind_rank, "Testing: bind this rank's loader to a wrong NUMA node")
      ->check(CLI::Range(0, 1 << 20));
  app.add_flag("--check-sync", o.check_sync, "Check after every step that all ranks hold the same parameters");
  app.add_option("--params-out", o.params_out, "Rank 0 writes its final parameters here (float32, flat)");
  nl::Add(&app, nl::opt::kTimeout, &o.timeout_s)->check(CLI::Range(1.0, 86400.0));
}

void AddOptions(CLI::App& app, Options& o, SharedOptions& shared) {
  // A flag given twice: the last one counts (as a script adding to a base command line expects).
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  AddLaunchOptions(app, o);
  AddLoaderOptions(app, o, shared);
  AddTrainingOptions(app, o);
  AddDiagnosticOptions(app, o);
}

// The shared options, checked, into Options ("" or the error).
std::string FinishSharedOptions(const SharedOptions& shared, Options& o) {
  if (nl::Status st = nl::FinishTransformOptions(shared.transform, &o.transform); !st.ok()) {
    return st.message();
  }
  if (nl::Status st = nl::FinishOrderOptions(shared.order, &o.order, &o.io_memory); !st.ok()) {
    return st.message();
  }
  return "";
}

// Checks between options ("" or the error).
std::string CheckOptions(const Options& o) {
  // CLI11's range checks let NaN through (every comparison with it is false).
  for (const auto& [name, v] : {std::pair<const char*, double>{"--lr", o.lr},
                                {"--momentum", o.momentum},
                                {"--weight-decay", o.weight_decay},
                                {"--label-smoothing", o.label_smoothing},
                                {"--delay-ms", o.delay_ms},
                                {"--timeout", o.timeout_s}}) {
    if (!std::isfinite(v)) return std::string(name) + " must be a finite number";
  }
  if (o.node_rank >= o.nnodes) {
    return "--node-rank " + std::to_string(o.node_rank) + " is not below --nnodes " +
           std::to_string(o.nnodes);
  }
  if (o.delay_ms > 0 && o.simulate_slow_rank < 0) return "--delay-ms needs --simulate-slow-rank";
  if (o.simulate_slow_rank >= 0 && o.delay_ms <= 0) return "--simulate-slow-rank needs --delay-ms > 0";
  if (o.checkpoint_every > 0 && o.out.empty()) return "--checkpoint-every needs --out";
  if (o.resume_changes && o.resume.empty()) return "--resume-changes needs --resume";
  if (o.slow_phase != "data" && o.simulate_slow_rank < 0) return "--slow-phase needs --simulate-slow-rank";
  if (!o.resume.empty()) {  // a FIFO or device would block or never end
    struct stat st {};
    if (stat(o.resume.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
      return "--resume " + o.resume + " is not a regular file (a checkpoint.pt from --out)";
    }
    // Said here, before any rank starts, rather than by each rank's LibTorch.
    if (access(o.resume.c_str(), R_OK) != 0) {
      const int err = errno;
      char mode[8];
      std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
      return "--resume " + o.resume + " cannot be read: " + std::strerror(err) + " (mode " + mode + ", owner uid " +
             std::to_string(st.st_uid) + "; this trainer runs as uid " + std::to_string(geteuid()) + ")";
    }
  }
  return "";
}

// The testing options that name a rank must name one of the `world`.
std::string CheckRanksNamed(const Options& o, int world) {
  if (o.simulate_slow_rank >= world) {
    return "--simulate-slow-rank " + std::to_string(o.simulate_slow_rank) + " is not a rank of " +
           std::to_string(world);
  }
  if (o.misbind_rank >= world) {
    return "--misbind-rank " + std::to_string(o.misbind_rank) + " is not a rank of " +
           std::to_string(world);
  }
  return "";
}

// An integer environment variable in [lo, hi]: false when unset; a bad value
// is an error naming it and its text.
bool EnvInt(const char* name, int lo, int hi, int* out, std::string* err) {
  const char* v = std::getenv(name);
  if (!v) return false;
  const nl::Result<int64_t> x = nl::ParseInt(v, name, lo, hi);
  if (!x.ok()) {
    *err = std::string(name) + "=" + v + " is not an integer in [" + std::to_string(lo) + ", " +
           std::to_string(hi) + "]";
    return true;
  }
  *out = static_cast<int>(*x);
  return true;
}

std::string SafeJobId(std::string s) {
  for (char& c : s) {
    if (c == '/' || c < 0x21 || c > 0x7e) c = '_';
  }
  return s.substr(0, 64);
}

// The rank's place from the launcher's variables (RANK, WORLD_SIZE and
// LOCAL_RANK already read): local world, rendezvous, job id ("" or the error).
std::string PlaceRank(const Options& o, Placement& p) {
  std::string err;
  p.local_world = o.nproc_per_node;
  if (EnvInt("LOCAL_WORLD_SIZE", 1, 1 << 20, &p.local_world, &err) && !err.empty()) return err;
  if (p.local_rank >= p.local_world) {
    return "LOCAL_RANK=" + std::to_string(p.local_rank) + " is not below LOCAL_WORLD_SIZE=" +
           std::to_string(p.local_world);
  }
  const char* addr = std::getenv("MASTER_ADDR");
  p.master_addr = addr && *addr ? addr : o.master_addr;
  p.master_port = o.master_port;
  if (EnvInt("MASTER_PORT", 1, 65535, &p.master_port, &err) && !err.empty()) return err;
  const char* job = std::getenv("NL_TRAINER_JOB_ID");
  const char* run = std::getenv("TORCHELASTIC_RUN_ID");
  p.job_id = SafeJobId(job && *job ? job
                       : run && *run ? "torchrun-" + std::string(run) + "-" + std::to_string(p.master_port)
                                     : "trainer-" + std::to_string(p.master_port));
  const char* agent = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
  p.agent_store = agent && std::string(agent) == "True";
  p.launched_by_us = std::getenv("NL_TRAINER_LAUNCHED") != nullptr;
  return CheckRanksNamed(o, p.world);
}

int Fail(const std::string& m) {
  std::fprintf(stderr, "trainer: error: %s\n", nl::FlagText(m).c_str());
  return 2;
}

// One rank, as the launcher (ours or torchrun) started it.
int RunOneRank(const Options& o, int rank, int world, int local) {
  if (rank >= world) {
    return Fail("RANK=" + std::to_string(rank) + " is not below WORLD_SIZE=" + std::to_string(world));
  }
  Placement p;
  p.rank = rank;
  p.world = world;
  p.local_rank = local;
  if (const std::string err = PlaceRank(o, p); !err.empty()) return Fail(err);
  p.failure_fd = nl::proc::TakeFailureFd(std::getenv(nl::proc::kFailureFdVariable));
  return nl::trainer::RunRank(o, p);
}

// The launcher: checks the data, plan and outputs once (so a bad one is one
// error, not one per rank), then runs this node's ranks; the outputs stay
// locked until every rank has ended.
int Launch(const Options& o, const std::vector<std::string>& args) {
  if (const std::string err = CheckRanksNamed(o, o.nproc_per_node * o.nnodes); !err.empty()) {
    return Fail(err);
  }
  nl::Result<nl::Manifest> manifest = nl::LoadManifest(o.data);
  if (!manifest.ok()) return Fail("cannot read the shard set: " + manifest.status().ToString());
  nl::Status st = nl::trainer::CheckData(o, *manifest);
  if (!st.ok()) return Fail("cannot train on " + o.data + ": " + st.ToString());
  nl::Result<nl::JobPlan> plan = nl::MakeJobPlan(nl::trainer::PlanRequest(o, o.nproc_per_node));
  if (!plan.ok()) return Fail("cannot plan the binding: " + plan.status().ToString());
  nl::trainer::OutputLock lock;
  if (o.node_rank == 0) {  // rank 0, which writes them, runs on node 0
    st = nl::trainer::CheckOutputs(o);
    if (!st.ok()) return Fail("cannot write the outputs: " + st.ToString());
    nl::Result<nl::trainer::OutputLock> l = nl::trainer::LockOutputs(o);
    if (!l.ok()) return Fail(l.status().ToString());
    lock = std::move(*l);
  }
  const nl::trainer::LaunchResult r =
      nl::trainer::Launch(o, args, [](const std::string& s) { std::fprintf(stderr, "%s\n", s.c_str()); });
  if (!r.message.empty()) std::fprintf(stderr, "%s\n", r.message.c_str());
  return r.exit_code;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"LibTorch DDP trainer fed by the loader service", "trainer"};
  Options o;
  SharedOptions shared;
  AddOptions(app, o, shared);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (std::string err = FinishSharedOptions(shared, o); !err.empty()) return Fail(err);
  if (std::string err = CheckOptions(o); !err.empty()) return Fail(err);
  std::string err;
  int rank = -1, world = -1, local = -1;
  const bool has_rank = EnvInt("RANK", 0, 1 << 20, &rank, &err);
  const bool has_world = EnvInt("WORLD_SIZE", 1, 1 << 20, &world, &err) && err.empty();
  const bool has_local = EnvInt("LOCAL_RANK", 0, 1 << 20, &local, &err) && err.empty();
  if (!err.empty()) return Fail(err + " (set by the launcher: torchrun, or ours)");
  if (has_rank || has_world || has_local) {
    if (!(has_rank && has_world && has_local)) {
      return Fail("RANK, WORLD_SIZE and LOCAL_RANK must be set together (torchrun sets all three); "
                  "unset them to let trainer launch its own ranks");
    }
    return RunOneRank(o, rank, world, local);
  }
  return Launch(o, std::vector<std::string>(argv, argv + argc));
}
