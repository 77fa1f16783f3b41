// loader_bench: loader throughput per rank. Runs R ranks as R processes on
// this machine, each with its loader pool bound per the binding plan,
// consuming as fast as possible or at a simulated compute rate (--step-ms),
// and prints a per-rank table (or --json).
#include <poll.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>

#include "formats/worker_pool.h"
#include "loader/cli/cli_options.h"
#include "loader/pipeline/pipeline.h"
#include "loader/plan/affinity.h"
#include "loader/plan/binding.h"
#include "loader/plan/gpu_order.h"
#include "loader/plan/job_plan.h"
#include "loader/plan/topology.h"

extern "C" char** environ;

namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

struct Args {
  int ranks = 1;
  int child_rank = -1;  // set in the rank processes this program spawns
  long parent_pid = 0;  // in a rank process: the loader_bench that spawned it
  std::vector<std::string> argv;
  uint32_t threads = 0;  // per rank; 0: the plan's loader cpus
  std::string bind = "on", record_indices;
  nl::JobPlanRequest plan;
  double step_ms = 0;
  bool json_out = false;
  nl::PipelineConfig pipeline;
  nl::PipelineFlags pflags;
  nl::TransformFlags tflags;
};

double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_utime.tv_usec * 1e-6 + u.ru_stime.tv_sec +
         u.ru_stime.tv_usec * 1e-6;
}

// RssAnon / RssFile from /proc/self/status, in MiB.
std::pair<double, double> Rss() {
  std::ifstream f("/proc/self/status");
  std::string line;
  double anon = 0, file = 0;
  while (std::getline(f, line)) {
    if (line.rfind("RssAnon:", 0) == 0) anon = std::stod(line.substr(8)) / 1024;
    if (line.rfind("RssFile:", 0) == 0) file = std::stod(line.substr(8)) / 1024;
  }
  return {anon, file};
}

json RunRank(const Args& a, const nl::Topology& topo, const nl::RankPlan& plan, bool binds,
             int rank) {
  json r;
  r["rank"] = rank;
  nl::PipelineConfig c = a.pipeline;
  c.rank = rank;
  c.world = a.ranks;
  c.threads =
      a.threads ? a.threads : std::max<uint32_t>(1, static_cast<uint32_t>(plan.loader_cpus.size()));
  nl::BindReport trainer;
  if (binds) {
    trainer = nl::BindThisThread(topo, plan.trainer_cpus, plan.mem_node);
    std::fprintf(stderr, "%s\n", nl::AffinityLine(rank, plan, trainer).c_str());
    c.thread_start =
        nl::LoaderThreadStartHook(topo, plan, rank, [rank](int w, const nl::BindReport& br) {
          if (br.cpu != nl::BindState::kApplied ||
              (br.mem != nl::BindState::kApplied && br.mem != nl::BindState::kNotRequested)) {
            std::fprintf(
                stderr,
                "[Affinity][Rank %d] loader worker %d: cpu_binding=%s mem_binding=%s %s %s\n", rank,
                w, std::string(nl::BindStateName(br.cpu)).c_str(),
                std::string(nl::BindStateName(br.mem)).c_str(), br.cpu_detail.c_str(),
                br.mem_detail.c_str());
          }
        });
  }
  // Timed from before Open: the workers start filling batches inside it.
  const auto t0 = Clock::now();
  const double cpu0 = CpuSeconds();
  nl::Result<std::unique_ptr<nl::Pipeline>> p = nl::Pipeline::Open(c);
  if (!p.ok()) {
    r["error"] = p.status().ToString();
    return r;
  }
  std::vector<double> waits;
  uint64_t images = 0;
  std::map<uint64_t, std::vector<int64_t>> epoch_indices;
  while (true) {
    const auto w0 = Clock::now();
    nl::Result<nl::BatchView> b = (*p)->Next();
    if (!b.ok()) {
      if (b.status().code() != nl::StatusCode::kOutOfRange) r["error"] = b.status().ToString();
      break;
    }
    waits.push_back(std::chrono::duration<double, std::milli>(Clock::now() - w0).count());
    images += b->size;
    if (!a.record_indices.empty()) {
      auto& v = epoch_indices[b->epoch];
      v.insert(v.end(), b->indices, b->indices + b->size);
    }
    if (a.step_ms > 0)
      std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(a.step_ms));
    if (nl::Status rs = (*p)->Release(*b); !rs.ok()) {
      r["error"] = rs.ToString();
      break;
    }
  }
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  const double cpu = CpuSeconds() - cpu0;
  const nl::PipelineStats st = (*p)->Stats();
  const auto [anon, file] = Rss();
  std::vector<double> sorted = waits;
  std::sort(sorted.begin(), sorted.end());
  double mean = 0;
  for (double w : waits) mean += w;
  mean = waits.empty() ? 0 : mean / waits.size();
  const double bytes = static_cast<double>(images) * (*p)->sample_bytes();
  r["images"] = images;
  r["batches"] = waits.size();
  r["seconds"] = secs;
  r["images_per_s"] = secs > 0 ? images / secs : 0;
  r["mb_per_s"] = secs > 0 ? bytes / secs / 1e6 : 0;
  r["wait_ms_mean"] = mean;
  r["wait_ms_p95"] =
      sorted.empty() ? 0 : sorted[std::min(sorted.size() - 1, sorted.size() * 95 / 100)];
  r["cpu_us_per_image"] = images ? cpu / images * 1e6 : 0;
  r["cores_used"] = secs > 0 ? cpu / secs : 0;
  r["threads"] = c.threads;
  r["loader_cpus"] = binds ? nl::FormatCpuList(plan.loader_cpus) : std::string();
  r["numa_node"] = binds ? plan.numa_node : -1;
  r["cpu_binding"] = binds ? std::string(nl::BindStateName(trainer.cpu)) : "off";
  r["skipped"] = st.skipped;
  r["stage_s"] = {{"read", st.read_s}, {"decode", st.decode_s}, {"transform", st.transform_s}};
  r["prefetch_ready_mean"] = st.mean_ready;
  r["rss_anon_mib"] = anon;
  r["rss_file_mib"] = file;
  r["buffers_mib"] =
      static_cast<double>(c.prefetch) * c.batch_size * (*p)->sample_bytes() / (1 << 20);
  if (!a.record_indices.empty()) {
    json e = json::array();
    for (auto& [epoch, v] : epoch_indices)
      e.push_back({{"rank", rank}, {"epoch", epoch}, {"indices", v}});
    r["epoch_indices"] = e;
  }
  return r;
}

// One process per rank, each a fresh exec of this program (nothing of this
// process's threads or libraries' state is inherited), its stdout a pipe.
struct RankProcesses {
  std::vector<pid_t> pids;
  std::vector<int> fds;  // read ends
};

// Stops and reaps the rank processes started so far (ours, by pid).
void StopRanks(RankProcesses* p) {
  for (pid_t pid : p->pids) kill(pid, SIGTERM);
  for (int fd : p->fds) close(fd);
  for (pid_t pid : p->pids) waitpid(pid, nullptr, 0);
  p->pids.clear();
  p->fds.clear();
}

nl::Result<RankProcesses> SpawnRanks(const Args& a) {
  RankProcesses procs;
  for (int r = 0; r < a.ranks; ++r) {
    int p[2];
    if (pipe(p) != 0) {
      const int e = errno;
      StopRanks(&procs);
      return nl::Status::FromErrno("cannot make a pipe for rank " + std::to_string(r), e);
    }
    std::vector<std::string> args = a.argv;
    args.push_back("--parent-pid");
    args.push_back(std::to_string(getpid()));
    args.push_back("--child-rank");
    args.push_back(std::to_string(r));
    std::vector<char*> cargs;
    for (auto& x : args) cargs.push_back(x.data());
    cargs.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, p[1], 1);
    posix_spawn_file_actions_addclose(&fa, p[0]);
    pid_t pid = 0;
    const int rc = posix_spawn(&pid, "/proc/self/exe", &fa, nullptr, cargs.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    close(p[1]);
    if (rc != 0) {
      close(p[0]);
      StopRanks(&procs);
      return nl::Status::FromErrno("cannot start rank " + std::to_string(r), rc);
    }
    procs.pids.push_back(pid);
    procs.fds.push_back(p[0]);
  }
  return procs;
}

// Reads every rank's output to its end (all at once, so no rank blocks on a full pipe).
std::vector<std::string> ReadOutputs(const std::vector<int>& fds) {
  std::vector<std::string> outs(fds.size());
  std::vector<bool> open(fds.size(), true);
  size_t left = fds.size();
  while (left > 0) {
    std::vector<pollfd> pf;
    std::vector<size_t> which;
    for (size_t r = 0; r < fds.size(); ++r) {
      if (!open[r]) continue;
      pf.push_back({fds[r], POLLIN, 0});
      which.push_back(r);
    }
    if (poll(pf.data(), pf.size(), -1) < 0) continue;
    for (size_t k = 0; k < pf.size(); ++k) {
      if (!(pf[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buf[65536];
      const ssize_t n = read(fds[which[k]], buf, sizeof buf);
      if (n > 0) {
        outs[which[k]].append(buf, static_cast<size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        open[which[k]] = false;
        close(fds[which[k]]);
        --left;
      }
    }
  }
  return outs;
}

json MalformedRow(int rank, const char* field) {
  return {{"rank", rank},
          {"error", std::string("rank process printed a result without a valid '") + field + "'"}};
}

// Waits for each rank process and turns its output into its row.
json RankResult(int rank, pid_t pid, const std::string& out) {
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || out.empty()) {
    const std::string how = WIFSIGNALED(status)
                                ? "killed by signal " + std::to_string(WTERMSIG(status))
                                : "exit status " + std::to_string(WEXITSTATUS(status));
    return {{"rank", rank}, {"error", "rank process ended abnormally (" + how + ")"}};
  }
  json j = json::parse(out, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return {{"rank", rank}, {"error", "rank process printed no JSON result"}};
  }
  if (!j.contains("error")) {  // a row the table and the totals can read, or an error row
    for (const char* k : {"numa_node", "threads"}) {
      if (!j.contains(k) || !j[k].is_number_integer()) return MalformedRow(rank, k);
    }
    if (!j.contains("loader_cpus") || !j["loader_cpus"].is_string())
      return MalformedRow(rank, "loader_cpus");
    for (const char* k : {"images_per_s", "mb_per_s", "wait_ms_mean", "wait_ms_p95",
                          "cpu_us_per_image", "cores_used", "rss_anon_mib", "seconds"}) {
      if (!j.contains(k) || !j[k].is_number()) return MalformedRow(rank, k);
    }
  } else if (!j["error"].is_string()) {
    return MalformedRow(rank, "error");
  }
  j["rank"] = rank;
  return j;
}

// --record-indices FILE: JSON lines; every write and the close are checked.
class IndexFile {
 public:
  static nl::Result<std::unique_ptr<IndexFile>> Open(const std::string& path) {
    FILE* f = std::fopen(path.c_str(), "w");
    if (!f) return nl::Status::FromErrno("--record-indices: cannot open " + path, errno);
    return std::unique_ptr<IndexFile>(new IndexFile(path, f));
  }
  ~IndexFile() {
    if (f_) std::fclose(f_);
  }
  IndexFile(const IndexFile&) = delete;
  IndexFile& operator=(const IndexFile&) = delete;
  void WriteLine(const std::string& line) {
    if (errno_ != 0) return;
    if (std::fwrite(line.data(), 1, line.size(), f_) != line.size() || std::fputc('\n', f_) == EOF)
      errno_ = errno ? errno : EIO;
  }
  nl::Status Close() {
    if (std::fflush(f_) != 0 && errno_ == 0) errno_ = errno ? errno : EIO;
    if (std::fclose(f_) != 0 && errno_ == 0) errno_ = errno ? errno : EIO;
    f_ = nullptr;
    if (errno_ != 0)
      return nl::Status::FromErrno("--record-indices: cannot write " + path_, errno_);
    return nl::Status::Ok();
  }

 private:
  IndexFile(std::string path, FILE* f) : path_(std::move(path)), f_(f) {}
  std::string path_;
  FILE* f_;
  int errno_ = 0;
};

// Rates from runs this short say more about start-up than about loading.
constexpr double kShortRunS = 0.5;
// The longest --step-ms (about 17 minutes per batch).
constexpr double kMaxStepMs = 1e6;

json Gather(const Args& a, const RankProcesses& procs, const std::vector<std::string>& outs,
            IndexFile* rec) {
  json all;
  all["ranks"] = json::array();
  double total = 0, shortest = 1e300;
  for (int r = 0; r < a.ranks; ++r) {
    json j = RankResult(r, procs.pids[r], outs[r]);
    if (j.contains("epoch_indices")) {
      if (rec && j["epoch_indices"].is_array())
        for (const auto& e : j["epoch_indices"]) rec->WriteLine(e.dump());
      j.erase("epoch_indices");
    }
    if (!j.contains("error")) {
      total += j.value("images_per_s", 0.0);
      shortest = std::min(shortest, j.value("seconds", 0.0));
    }
    all["ranks"].push_back(j);
  }
  all["total_images_per_s"] = total;
  all["shortest_rank_s"] = shortest < 1e300 ? shortest : 0.0;
  all["short_run"] = shortest < kShortRunS;
  all["image_size"] = a.pipeline.transform.image_size;
  all["batch_size"] = a.pipeline.batch_size;
  return all;
}

void PrintTable(const Args& a, const json& all) {
  std::printf("%-4s %-6s %-14s %-4s %10s %9s %9s %9s %10s %6s %9s\n", "rank", "node", "loader cpus",
              "thr", "images/s", "MB/s", "wait ms", "wait p95", "cpu us/img", "cores", "anon MiB");
  for (const auto& j : all["ranks"]) {
    if (j.contains("error")) {
      std::printf("%-4d error: %s\n", j.value("rank", -1), j.value("error", std::string()).c_str());
      continue;
    }
    std::printf(
        "%-4d %-6d %-14s %-4d %10.0f %9.1f %9.3f %9.3f %10.1f %6.2f %9.1f\n", j.value("rank", -1),
        j.value("numa_node", -1), j.value("loader_cpus", std::string()).c_str(),
        j.value("threads", 0), j.value("images_per_s", 0.0), j.value("mb_per_s", 0.0),
        j.value("wait_ms_mean", 0.0), j.value("wait_ms_p95", 0.0), j.value("cpu_us_per_image", 0.0),
        j.value("cores_used", 0.0), j.value("rss_anon_mib", 0.0));
  }
  std::printf("total %.0f images/s (%d rank%s, %dx%d, batch %u)\n",
              all["total_images_per_s"].get<double>(), a.ranks, a.ranks == 1 ? "" : "s",
              a.pipeline.transform.image_size, a.pipeline.transform.image_size,
              a.pipeline.batch_size);
  if (all["short_run"].get<bool>()) {
    std::printf(
        "note: a rank ran for only %.3f s: these rates are dominated by start-up; measure "
        "longer (more --epochs, a larger split, fewer --ranks)\n",
        all["shortest_rank_s"].get<double>());
  }
}

// The batch buffers of all ranks together (each rank checks its own) must fit
// in half of this machine's memory.
nl::Status CheckJobBufferMemory(const Args& a) {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return nl::Status::Ok();
  const size_t sample = nl::SampleTransform(a.pipeline.transform).SampleBytes();
  const double want =
      static_cast<double>(a.ranks) * a.pipeline.prefetch * a.pipeline.batch_size * sample;
  const double have = static_cast<double>(pages) * static_cast<double>(page);
  if (want <= have / 2) return nl::Status::Ok();
  char msg[320];
  std::snprintf(msg, sizeof msg,
                "%d ranks x %u batch buffers x %u samples x %zu bytes need %.1f GiB, more than "
                "half of this machine's %.1f GiB: lower --ranks, --prefetch, --batch-size or "
                "--image-size",
                a.ranks, static_cast<unsigned>(a.pipeline.prefetch), a.pipeline.batch_size, sample,
                want / (1ull << 30), have / (1ull << 30));
  return nl::Status::ResourceExhausted(msg);
}

// A rank process must not outlive the loader_bench that spawned it (killed,
// it can no longer read the result): the kernel kills the rank when its
// parent dies. False when the parent is already gone.
bool DieWithParent(long parent_pid) {
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) return true;  // best effort
  return parent_pid == 0 || getppid() == static_cast<pid_t>(parent_pid);
}

int Fail(const nl::Status& st) {
  std::fprintf(stderr, "loader_bench: error: %s\n", st.ToString().c_str());
  return 1;
}

int Run(Args a) {
  nl::Status st = nl::FinishPipelineOptions(a.pflags, &a.pipeline);
  if (st.ok()) st = nl::FinishTransformOptions(a.tflags, &a.pipeline.transform);
  if (!st.ok()) return Fail(st);
  if (!std::isfinite(a.step_ms) || a.step_ms < 0 || a.step_ms > kMaxStepMs) {
    char msg[160];
    std::snprintf(msg, sizeof msg, "--step-ms must be a number of ms in 0..%.0f (got %g)",
                  kMaxStepMs, a.step_ms);
    return Fail(nl::Status::InvalidArgument(msg));
  }
  // The same plan in the parent and in every rank process. --bind off plans
  // as --bind on does (so both run the same loader threads) and binds nothing.
  a.plan.nproc = a.ranks;
  a.plan.no_bind = false;
  const bool binds = a.bind == "on";
  if (const char* cvd = std::getenv("CUDA_VISIBLE_DEVICES")) a.plan.cuda_visible_devices = cvd;
  nl::Result<nl::JobPlan> job = nl::MakeJobPlan(a.plan);
  if (!job.ok()) return Fail(job.status());
  if (a.child_rank >= 0) {  // a rank process: run, print the result as JSON
    if (a.child_rank >= a.ranks) return 2;
    if (!DieWithParent(a.parent_pid)) return 1;
    const nl::RankPlan& mine = job->plan.ranks[a.child_rank];
    std::cout << RunRank(a, job->topology, mine, binds, a.child_rank).dump() << std::endl;
    return 0;
  }
  for (const std::string& note : job->notes)
    std::fprintf(stderr, "loader_bench: %s\n", note.c_str());
  if (!binds) std::fprintf(stderr, "loader_bench: --bind off: no rank is bound\n");
  if (!job->gpu_note.empty())
    std::fprintf(stderr, "loader_bench: note: no GPU found through CUDA: %s\n",
                 job->gpu_note.c_str());
  st = CheckJobBufferMemory(a);
  if (!st.ok()) return Fail(st);
  std::unique_ptr<IndexFile> rec;
  if (!a.record_indices.empty()) {  // opened before any rank runs: a bad path costs nothing
    nl::Result<std::unique_ptr<IndexFile>> f = IndexFile::Open(a.record_indices);
    if (!f.ok()) return Fail(f.status());
    rec = std::move(*f);
  }
  nl::Result<RankProcesses> procs = SpawnRanks(a);
  if (!procs.ok()) return Fail(procs.status());
  const json all = Gather(a, *procs, ReadOutputs(procs->fds), rec.get());
  int rc = 0;
  for (const auto& j : all["ranks"]) rc = j.contains("error") ? 1 : rc;
  if (a.json_out) {
    std::cout << all.dump() << "\n";
  } else {
    PrintTable(a, all);
  }
  if (rec) {
    st = rec->Close();
    if (!st.ok()) return Fail(st);
  }
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"loader_bench: loader throughput per rank"};
  Args a;
  a.pipeline.epochs = 1;
  app.add_option("--ranks", a.ranks,
                 "Ranks, one process each: 1.." + std::to_string(nl::kMaxLocalRanks) +
                     " (more than the allowed cores needs --allow-shared-cores)")
      ->check(CLI::Range(1, nl::kMaxLocalRanks))
      ->capture_default_str();
  app.add_option("--threads-per-rank", a.threads,
                 "Loader threads per rank, 1.." + std::to_string(nl::WorkerPool::kMaxThreads) +
                     " (default: the plan's loader cores)")
      ->check(CLI::Range(1u, nl::WorkerPool::kMaxThreads));
  app.add_option("--epochs", a.pipeline.epochs, "Epochs to load, at least 1")
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 32))
      ->capture_default_str();
  app.add_option("--bind", a.bind, "on: bind per the plan; off: no binding")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  app.add_option("--topology", a.plan.topology_file,
                 "Plan from an hwloc XML file (binding then reports not_supported)");
  app.add_flag("--allow-shared-cores", a.plan.allow_shared_cores,
               "Let ranks share cores when there are fewer allowed cores than ranks");
  app.add_flag("--ignore-gpus", a.plan.ignore_gpus,
               "Plan as if no GPU were visible (e.g. more ranks than GPUs)");
  app.add_option("--step-ms", a.step_ms,
                 "Simulated compute per batch, in ms, 0..1000000 (0: consume as fast as possible)");
  app.add_option("--record-indices", a.record_indices,
                 "Write {rank, epoch, indices} JSON lines to FILE");
  app.add_flag("--json", a.json_out, "Print JSON");
  nl::AddPipelineOptions(&app, &a.pipeline, &a.pflags);
  nl::AddTransformOptions(&app, &a.pipeline.transform, &a.tflags);
  app.add_option("--parent-pid", a.parent_pid, "internal: the spawning loader_bench")->group("");
  app.add_option("--child-rank", a.child_rank, "internal: run one rank and print its JSON")
      ->group("");
  CLI11_PARSE(app, argc, argv);
  a.argv.assign(argv, argv + argc);
  return Run(a);
}
