// loader_bench: loader throughput per rank. Runs R ranks as R processes on
// this machine, each with its loader pool bound per the binding plan,
// consuming as fast as possible or at a simulated compute rate (--step-ms),
// and prints a per-rank table (or --json).
//
// --mode service: each rank process starts a real `loader serve` for its
// rank (the same options, threads and cores) and consumes its ring, in C++
// (RingClient) or, with --consumer python, through `python3 -m
// numa_loader.consume`; the rows add the consumer's per-batch cost (time in
// Next+Release less the time spent waiting for the producer). --mode both
// runs inprocess, then service, and prints the ratio of their throughputs.
#include <fcntl.h>
#include <link.h>
#include <poll.h>
#include <sys/resource.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>
#include <thread>

#include "base/child_process.h"
#include "base/fd.h"
#include "base/parse_number.h"
#include "base/worker_pool.h"
#include "loader/cli/cli_options.h"
#include "loader/cli/serve_options.h"
#include "loader/pipeline/pipeline.h"
#include "loader/plan/affinity.h"
#include "loader/plan/binding.h"
#include "loader/plan/gpu_order.h"
#include "loader/plan/job_plan.h"
#include "loader/plan/topology.h"
#include "loader/ring/client.h"

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
  uint64_t max_batches = 0;  // 0: every batch of --epochs
  bool json_out = false;
  nl::PipelineConfig pipeline;
  nl::PipelineFlags pflags;
  nl::TransformFlags tflags;
  std::string mode = "inprocess";  // inprocess, service or both
  std::string child_mode;          // a rank process: the mode it runs
  std::string consumer = "cpp";    // service: cpp (RingClient) or python
  std::string loader_path;         // --loader; empty: `loader` beside this program
};

// The p-th percentile (0..100) of sorted values, 0 for none.
double Percentile(const std::vector<double>& sorted, int p) {
  if (sorted.empty()) return 0;
  return sorted[std::min(sorted.size() - 1, sorted.size() * static_cast<size_t>(p) / 100)];
}

double Mean(const std::vector<double>& v) {
  double sum = 0;
  for (double x : v) sum += x;
  return v.empty() ? 0 : sum / static_cast<double>(v.size());
}

double CpuSecondsOf(const rusage& u) {
  return u.ru_utime.tv_sec + u.ru_utime.tv_usec * 1e-6 + u.ru_stime.tv_sec +
         u.ru_stime.tv_usec * 1e-6;
}

double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return CpuSecondsOf(u);
}

// A "Key:   1234 kB" line of /proc/self/status in MiB, when it is one.
std::optional<double> StatusMib(std::string_view line, std::string_view key) {
  if (line.substr(0, key.size()) != key) return std::nullopt;
  std::string_view v = line.substr(key.size());
  while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
  if (v.size() >= 3 && v.substr(v.size() - 3) == " kB") v.remove_suffix(3);
  const nl::Result<double> kib = nl::ParseDouble(v, key, 0, 1e18);
  if (!kib.ok()) return std::nullopt;
  return *kib / 1024;
}

// RssAnon / RssFile from /proc/self/status, in MiB.
std::pair<double, double> Rss() {
  std::ifstream f("/proc/self/status");
  std::string line;
  double anon = 0, file = 0;
  while (std::getline(f, line)) {
    if (auto v = StatusMib(line, "RssAnon:")) anon = *v;
    if (auto v = StatusMib(line, "RssFile:")) file = *v;
  }
  return {anon, file};
}

// A rank's loader threads: --threads-per-rank, else its plan's loader cpus.
uint32_t RankThreads(const Args& a, const nl::RankPlan& plan) {
  return a.threads ? a.threads
                   : std::max<uint32_t>(1, static_cast<uint32_t>(plan.loader_cpus.size()));
}

// Binds this (the consumer's) thread to the rank's trainer cpus and gives
// the pipeline's workers the start hook that binds them to its loader cpus.
nl::BindReport BindRank(const nl::Topology& topo, const nl::RankPlan& plan, int rank,
                        nl::PipelineConfig* c) {
  const nl::BindReport trainer = nl::BindThisThread(topo, plan.trainer_cpus, plan.mem_node);
  std::fprintf(stderr, "%s\n", nl::AffinityLine(rank, plan, trainer).c_str());
  c->thread_start =
      nl::LoaderThreadStartHook(topo, plan, rank, [rank](int w, const nl::BindReport& br) {
        if (br.cpu != nl::BindState::kApplied ||
            (br.mem != nl::BindState::kApplied && br.mem != nl::BindState::kNotRequested)) {
          std::fprintf(
              stderr, "[Affinity][Rank %d] loader worker %d: cpu_binding=%s mem_binding=%s %s %s\n",
              rank, w, std::string(nl::BindStateName(br.cpu)).c_str(),
              std::string(nl::BindStateName(br.mem)).c_str(), br.cpu_detail.c_str(),
              br.mem_detail.c_str());
        }
      });
  return trainer;
}

// What an in-process consumer saw: each batch's wait in Next (ms), and the indices when recorded.
struct Loaded {
  std::vector<double> waits;
  uint64_t images = 0;
  uint64_t warmup_images = 0;  // in the first `warmup` batches
  size_t warmup = 1;            // batches of the warm-up
  Clock::time_point warm;       // when the warm-up's last batch arrived
  std::map<uint64_t, std::vector<int64_t>> epoch_indices;
};

// Every batch of the run, --step-ms between Next and Release; the error's text, or "".
std::string LoadAll(const Args& a, nl::Pipeline& p, Loaded* out) {
  while (true) {
    const auto w0 = Clock::now();
    nl::Result<nl::BatchView> b = p.Next();
    if (!b.ok()) {
      return b.status().code() == nl::StatusCode::kOutOfRange ? "" : b.status().ToString();
    }
    const auto w1 = Clock::now();
    out->waits.push_back(std::chrono::duration<double, std::milli>(w1 - w0).count());
    out->images += b->size;
    if (out->waits.size() == out->warmup) {
      out->warm = w1;
      out->warmup_images = out->images;
    }
    if (!a.record_indices.empty()) {
      auto& v = out->epoch_indices[b->epoch];
      v.insert(v.end(), b->indices, b->indices + b->size);
    }
    if (a.step_ms > 0)
      std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(a.step_ms));
    if (nl::Status rs = p.Release(*b); !rs.ok()) return rs.ToString();
    if (a.max_batches && out->waits.size() >= a.max_batches) return "";
  }
}

// Where a rank ran: its threads, loader cpus, node and the consumer's binding.
void AddPlacement(json* r, bool binds, const nl::RankPlan& plan, const nl::BindReport& trainer,
                  uint32_t threads) {
  (*r)["threads"] = threads;
  (*r)["loader_cpus"] = binds ? nl::FormatCpuList(plan.loader_cpus) : std::string();
  (*r)["numa_node"] = binds ? plan.numa_node : -1;
  (*r)["cpu_binding"] = binds ? std::string(nl::BindStateName(trainer.cpu)) : "off";
}

void AddEpochIndices(json* r, int rank, const std::map<uint64_t, std::vector<int64_t>>& indices) {
  json e = json::array();
  for (const auto& [epoch, v] : indices)
    e.push_back({{"rank", rank}, {"epoch", epoch}, {"indices", v}});
  (*r)["epoch_indices"] = e;
}

json RunRank(const Args& a, const nl::Topology& topo, const nl::RankPlan& plan, bool binds,
             int rank) {
  json r;
  r["rank"] = rank;
  nl::PipelineConfig c = a.pipeline;
  c.rank = rank;
  c.world = a.ranks;
  c.threads = RankThreads(a, plan);
  nl::BindReport trainer;
  if (binds) trainer = BindRank(topo, plan, rank, &c);
  // Timed from before Open: the workers start filling batches inside it.
  const auto t0 = Clock::now();
  const double cpu0 = CpuSeconds();
  nl::Result<std::unique_ptr<nl::Pipeline>> p = nl::Pipeline::Open(c);
  if (!p.ok()) {
    r["error"] = nl::FlagText(p.status().ToString());
    return r;
  }
  std::fprintf(stderr, "loader_bench: rank %d: %s\n", rank, nl::FlagText((*p)->read_plan().summary).c_str());
  Loaded got;
  got.warmup = std::max<size_t>(1, c.prefetch);
  const double open_s = std::chrono::duration<double>(Clock::now() - t0).count();
  if (const std::string error = LoadAll(a, **p, &got); !error.empty()) r["error"] = nl::FlagText(error);
  const auto t1 = Clock::now();
  const double secs = std::chrono::duration<double>(t1 - t0).count();
  const double cpu = CpuSeconds() - cpu0;
  const nl::PipelineStats st = (*p)->Stats();
  const auto [anon, file] = Rss();
  std::vector<double> sorted = got.waits;
  std::sort(sorted.begin(), sorted.end());
  const double bytes = static_cast<double>(got.images) * (*p)->sample_bytes();
  r["images"] = got.images;
  r["batches"] = got.waits.size();
  r["seconds"] = secs;
  r["images_per_s"] = secs > 0 ? got.images / secs : 0;
  r["mb_per_s"] = secs > 0 ? bytes / secs / 1e6 : 0;
  // Start-up, and the rate after the warm-up: the first batch of each
  // buffer is slower (its pages are faulted in on first write; 40 ms more a
  // batch on this VM). steady_images_per_s counts the images after the
  // warm-up's last batch arrived, as the Python baselines start their clocks
  // after their first batch.
  r["open_s"] = open_s;
  if (!got.waits.empty()) {
    r["first_batch_s"] = got.waits.front() / 1e3 + open_s;
  }
  r["warmup_batches"] = got.warmup;
  if (got.waits.size() > got.warmup) {
    const double after = std::chrono::duration<double>(t1 - got.warm).count();
    r["steady_images_per_s"] =
        after > 0 ? static_cast<double>(got.images - got.warmup_images) / after : 0;
  }
  r["wait_ms_mean"] = Mean(got.waits);
  r["wait_ms_p95"] = Percentile(sorted, 95);
  r["cpu_us_per_image"] = got.images ? cpu / got.images * 1e6 : 0;
  r["cores_used"] = secs > 0 ? cpu / secs : 0;
  AddPlacement(&r, binds, plan, trainer, c.threads);
  r["skipped"] = st.skipped;
  r["stage_s"] = {{"read", st.read_s}, {"decode", st.decode_s}, {"transform", st.transform_s}};
  r["prefetch_ready_mean"] = st.mean_ready;
  r["order"] = nl::SampleOrderName((*p)->read_plan().order);
  r["read_ahead_mib"] = static_cast<double>(st.ahead_bytes) / (1 << 20);
  r["rss_anon_mib"] = anon;
  r["rss_file_mib"] = file;
  r["buffers_mib"] =
      static_cast<double>(c.prefetch) * c.batch_size * (*p)->sample_bytes() / (1 << 20);
  if (!a.record_indices.empty()) AddEpochIndices(&r, rank, got.epoch_indices);
  return r;
}

// ---- --mode service: one `loader serve` per rank, consumed through its ring ----

// Seconds the consumer waits for its serve to appear, and for a batch.
constexpr double kAttachLimitS = 60;
constexpr double kBatchTimeoutS = 60;
// Seconds a serve (or the Python consumer) may take to exit once its stream is done.
constexpr double kExitLimitS = 10;

// This program's path (from /proc/self/exe).
nl::Result<std::string> SelfPath() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return nl::Status::FromErrno("cannot read /proc/self/exe", errno);
  return std::string(buf, static_cast<size_t>(n));
}

// The directory this program lies in.
std::string ProgramDir() {
  const nl::Result<std::string> self = SelfPath();
  if (!self.ok()) return ".";
  const size_t slash = self->rfind('/');
  return slash == std::string::npos ? "." : self->substr(0, slash);
}

// The `loader` binary: --loader, else the one beside this program.
nl::Result<std::string> LoaderPath(const Args& a) {
  const std::string path = a.loader_path.empty() ? ProgramDir() + "/loader" : a.loader_path;
  if (access(path.c_str(), X_OK) != 0) {
    return nl::Status::FromErrno(
        "--mode " + a.mode + " runs `loader serve` from " + path +
            ", which is not an executable file (build the `loader` target, or give --loader PATH)",
        errno);
  }
  return path;
}

// <build>/python, where the build lays out the numa_loader package (this
// program is <build>/bin/loader_bench).
nl::Result<std::string> PythonPackageParent() {
  const std::string bin = ProgramDir();
  const size_t slash = bin.rfind('/');
  const std::string dir =
      (slash == std::string::npos ? std::string(".") : bin.substr(0, slash)) + "/python";
  const std::string module = dir + "/numa_loader/consume.py";
  if (access(module.c_str(), R_OK) != 0) {
    return nl::Status::NotFound(
        "--consumer python runs /usr/bin/python3 -m numa_loader.consume with PYTHONPATH=" + dir +
        ", but there is no " + module +
        " (the numa_loader package is built there by the numa_loader_py target, once the "
        "Python client is part of this tree)");
  }
  return dir;
}

// One job id per loader_bench run (its pid): each rank serves and attaches as its rank.
std::string ServiceJobId(long parent_pid) { return "loader_bench-" + std::to_string(parent_pid); }

std::string JoinPlans(const nl::BindingPlan& plan,
                      const std::function<std::string(const nl::RankPlan&)>& f, const char* sep) {
  std::string out;
  for (const nl::RankPlan& r : plan.ranks) out += (out.empty() ? "" : sep) + f(r);
  return out;
}

// What `loader serve` for one rank is told: this run's data, pipeline and
// transform options, its epochs and threads, and its plan: every local
// rank's cpus (trainer and loader, which serve splits the same way, with the
// same --trainer-cores) and NUMA node, or --no-bind.
nl::ServeRequest ServeRequestFor(const Args& a, const nl::JobPlan& job, bool binds, int rank,
                                 uint32_t threads) {
  nl::ServeRequest r;
  r.service.pipeline = a.pipeline;
  r.service.pipeline.rank = rank;
  r.service.pipeline.world = a.ranks;
  r.service.job_id = ServiceJobId(a.parent_pid);
  r.service.attach_timeout_s = kAttachLimitS;
  r.local_rank = rank;
  r.local_world = a.ranks;
  r.threads = threads;
  r.plan.trainer_cores = a.plan.trainer_cores;
  r.plan.allow_shared_cores = a.plan.allow_shared_cores;
  r.plan.ignore_gpus = a.plan.ignore_gpus;
  r.plan.no_bind = !binds;
  if (binds) {
    r.plan.cpu_affinity = JoinPlans(
        job.plan,
        [](const nl::RankPlan& p) {
          nl::CpuList all = p.trainer_cpus;
          all.insert(all.end(), p.loader_cpus.begin(), p.loader_cpus.end());
          std::sort(all.begin(), all.end());
          all.erase(std::unique(all.begin(), all.end()), all.end());
          return nl::FormatCpuList(all);
        },
        ";");
    r.plan.numa_node = JoinPlans(
        job.plan, [](const nl::RankPlan& p) { return std::to_string(p.numa_node); }, ",");
  }
  return r;
}

// What a consumer saw: every batch's time in Next (ms, waits included) and
// its cost (us: Next+Release less the wait), and the indices when recorded.
struct Consumed {
  uint64_t images = 0, batches = 0;
  std::vector<double> next_ms, cost_us;
  std::map<uint64_t, std::vector<int64_t>> epoch_indices;
  double python_cost_us = -1;  // --consumer python: its own mean
  double python_cpu_s = 0;     // and its process's CPU time
  uint64_t sample_bytes = 0;
  // From the attach (the serve opens its pipeline then, as inprocess opens
  // its own) to the stream's end; and the attach's time since the start.
  double stream_s = 0;
  Clock::time_point attached;
};

// The serve's exit or, when it is still running, how it ended the stream;
// with its log's last lines.
std::string ServeContext(nl::proc::ChildProcess* serve, int log_fd) {
  nl::proc::ChildExit e;
  const std::string state = serve->Exited(&e) ? "loader serve ended (" + e.Describe() + ")"
                                              : "loader serve still running";
  const std::string tail = nl::proc::TailOf(log_fd, 3);
  return state + (tail.empty() ? "" : "; its log: " + tail);
}

// Attaches to the rank's serve, retrying while it starts (it must bind its
// socket first); a serve that exits before that is an error with its log.
nl::Result<std::unique_ptr<nl::RingClient>> AttachToServe(const std::string& job_id, int rank,
                                                          nl::proc::ChildProcess* serve,
                                                          int log_fd) {
  const auto start = Clock::now();
  while (true) {
    nl::Result<std::unique_ptr<nl::RingClient>> c = nl::RingClient::Attach(job_id, rank, 0.1);
    if (c.ok() || c.status().code() != nl::StatusCode::kNotFound) return c;
    nl::proc::ChildExit e;
    if (serve->Exited(&e)) {
      const std::string tail = nl::proc::TailOf(log_fd, 3);
      return nl::Status::Unavailable("loader serve for rank " + std::to_string(rank) + " ended (" +
                                     e.Describe() + ") before the consumer attached" +
                                     (tail.empty() ? "" : ": " + tail));
    }
    if (std::chrono::duration<double>(Clock::now() - start).count() >= kAttachLimitS) {
      return c.status().WithContext("rank " + std::to_string(rank) + " after " +
                                    std::to_string(kAttachLimitS) + " s");
    }
  }
}

// The C++ consumer: every batch through RingClient, --step-ms between Next and Release.
nl::Status ConsumeCpp(const Args& a, int rank, nl::proc::ChildProcess* serve, int log_fd,
                      Consumed* out) {
  NL_ASSIGN_OR_RETURN(std::unique_ptr<nl::RingClient> client,
                      AttachToServe(ServiceJobId(a.parent_pid), rank, serve, log_fd));
  out->sample_bytes = client->info().geometry.sample_bytes;
  out->attached = Clock::now();
  // --max-batches: the client detaches after that many, and the serve exits.
  while (a.max_batches == 0 || out->batches < a.max_batches) {
    const auto n0 = Clock::now();
    nl::Result<nl::RingBatch> b = client->Next(kBatchTimeoutS);
    const double next_s = std::chrono::duration<double>(Clock::now() - n0).count();
    if (!b.ok()) {
      if (b.status().code() == nl::StatusCode::kOutOfRange) break;  // the last epoch is out
      return nl::Status(b.status().code(),
                        b.status().message() + " [" + ServeContext(serve, log_fd) + "]");
    }
    out->images += b->size;
    ++out->batches;
    out->next_ms.push_back(next_s * 1e3);
    if (!a.record_indices.empty()) {
      auto& v = out->epoch_indices[b->epoch];
      v.insert(v.end(), b->indices, b->indices + b->size);
    }
    if (a.step_ms > 0)
      std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(a.step_ms));
    const auto r0 = Clock::now();
    NL_RETURN_IF_ERROR(client->Release(*b));
    const double release_s = std::chrono::duration<double>(Clock::now() - r0).count();
    out->cost_us.push_back((std::max(0.0, next_s - b->wait_s) + release_s) * 1e6);
  }
  out->stream_s = std::chrono::duration<double>(Clock::now() - out->attached).count();
  return nl::Status::Ok();  // the client detaches as it goes: the serve then exits
}

// A loader_bench built with AddressSanitizer runs a Python consumer that loads
// the libnl_client.so of the same build, which needs the ASan runtime loaded
// before it (and libstdc++ with it, so that ASan's __cxa_throw interceptor
// finds the real one when a library such as libtorch throws). CPython leaves
// its memory to the OS at exit, so leak checks are off in that child.
std::vector<std::string> PythonChildEnvironment(const std::string& pythonpath) {
  std::vector<std::string> env = {"PYTHONPATH=" + pythonpath};
#if defined(__SANITIZE_ADDRESS__)
  std::string runtime;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        const char* name = info->dlpi_name;
        if (name && std::strstr(name, "/libasan.so")) {
          *static_cast<std::string*>(data) = name;
          return 1;
        }
        return 0;
      },
      &runtime);
  if (!runtime.empty()) env.push_back("LD_PRELOAD=" + runtime + ":libstdc++.so.6");
  const char* opts = std::getenv("ASAN_OPTIONS");
  env.push_back(std::string("ASAN_OPTIONS=") + (opts && *opts ? std::string(opts) + ":" : "") +
                "detect_leaks=0");
#endif
  return env;
}

// The Python consumer: `python3 -m numa_loader.consume --json`, its JSON
// read back. A serve that fails first ends it at once (not after its timeouts).
nl::Status ConsumePython(const Args& a, int rank, nl::proc::ChildProcess* serve, int log_fd,
                         Consumed* out) {
  NL_ASSIGN_OR_RETURN(std::string pythonpath, PythonPackageParent());
  NL_ASSIGN_OR_RETURN(nl::Fd py_out, nl::proc::MakeLogFd("numa_loader-consume-out"));
  NL_ASSIGN_OR_RETURN(nl::Fd py_err, nl::proc::MakeLogFd("numa_loader-consume-err"));
  // clang-format off
  const std::vector<std::string> cmd = {
      "/usr/bin/python3", "-m", "numa_loader.consume", "--json",
      "--job-id", ServiceJobId(a.parent_pid), "--rank", std::to_string(rank),
      "--timeout", std::to_string(static_cast<int>(kBatchTimeoutS)),
      "--attach-timeout", std::to_string(static_cast<int>(kAttachLimitS)),
      "--batches", std::to_string(a.max_batches)};  // 0: to the producer's end
  // clang-format on
  NL_ASSIGN_OR_RETURN(nl::proc::ChildProcess py,
                      nl::proc::ChildProcess::Start(cmd, PythonChildEnvironment(pythonpath),
                                                    py_out.get(), py_err.get()));
  nl::proc::ChildExit e;
  while (!py.Exited(&e)) {
    nl::proc::ChildExit se;
    if (serve->Exited(&se) && !se.Succeeded()) {
      return nl::Status::Unavailable(
          "loader serve for rank " + std::to_string(rank) + " ended (" + se.Describe() +
          ") while the Python consumer ran: " + nl::proc::TailOf(log_fd, 3));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const std::string where = "python3 -m numa_loader.consume (PYTHONPATH=" + pythonpath + ")";
  if (!e.Succeeded()) {
    return nl::Status::Internal(where + " ended (" + e.Describe() +
                                "): " + nl::proc::TailOf(py_err.get(), 3));
  }
  const std::string text = nl::proc::TailOf(py_out.get(), 1);
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  for (const char* k : {"per_batch_us", "images", "batches", "seconds"}) {
    if (j.is_discarded() || !j.is_object() || !j.contains(k) || !j[k].is_number()) {
      return nl::Status::Internal(where + " printed no '" + k + "' in its JSON: " + text);
    }
  }
  out->python_cost_us = j["per_batch_us"].get<double>();
  out->python_cpu_s = CpuSecondsOf(e.usage);
  out->images = j["images"].get<uint64_t>();
  out->batches = j["batches"].get<uint64_t>();
  out->stream_s = j["seconds"].get<double>();  // from its attach, as ConsumeCpp's
  out->attached = Clock::now() - std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(out->stream_s));
  return nl::Status::Ok();
}

// The consumer's own numbers: its waits and per-batch cost (the Python
// consumer reports its mean cost only).
void AddConsumerCost(json* r, const std::string& consumer, const Consumed& got) {
  if (consumer == "python") {
    (*r)["consumer_us_mean"] = got.python_cost_us;
    return;
  }
  std::vector<double> waits = got.next_ms, costs = got.cost_us;
  std::sort(waits.begin(), waits.end());
  std::sort(costs.begin(), costs.end());
  (*r)["wait_ms_mean"] = Mean(waits);
  (*r)["wait_ms_p95"] = Percentile(waits, 95);
  (*r)["consumer_us_mean"] = Mean(costs);
  (*r)["consumer_us_p99"] = Percentile(costs, 99);
}

// A service rank's rates: from the attach to the stream's end; its CPU time
// is the consumer's (and the Python consumer's) and the serve's.
void AddServiceRates(json* r, const Args& a, const Consumed& got, const nl::proc::ChildExit& served,
                     Clock::time_point t0, double cpu0) {
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  const double secs = got.stream_s;
  const double cpu = CpuSeconds() - cpu0 + CpuSecondsOf(served.usage) + got.python_cpu_s;
  const uint64_t sample_bytes =
      got.sample_bytes ? got.sample_bytes : nl::SampleTransform(a.pipeline.transform).SampleBytes();
  (*r)["images"] = got.images;
  (*r)["batches"] = got.batches;
  (*r)["seconds"] = secs;
  // The serve's start (exec, plan, ring) until the attach: not in the rates,
  // as inprocess's rates leave out its plan.
  (*r)["startup_s"] = std::chrono::duration<double>(got.attached - t0).count();
  (*r)["wall_s"] = wall;
  (*r)["images_per_s"] = secs > 0 ? got.images / secs : 0;
  (*r)["mb_per_s"] = secs > 0 ? static_cast<double>(got.images) * sample_bytes / secs / 1e6 : 0;
  (*r)["cpu_us_per_image"] = got.images ? cpu / got.images * 1e6 : 0;  // consumer(s) and serve
  (*r)["cores_used"] = wall > 0 ? cpu / wall : 0;
}

json RunServiceRank(const Args& a, const nl::JobPlan& job, const nl::RankPlan& plan, bool binds,
                    int rank) {
  json r;
  r["rank"] = rank;
  r["mode"] = "service";
  r["consumer"] = a.consumer;
  auto error = [&](const nl::Status& st) {
    r["error"] = nl::FlagText(st.ToString());
    return r;
  };
  const uint32_t threads = RankThreads(a, plan);
  nl::Result<std::string> loader = LoaderPath(a);
  if (!loader.ok()) return error(loader.status());
  nl::Result<nl::Fd> log = nl::proc::MakeLogFd("loader-serve-log");
  if (!log.ok()) return error(log.status());
  const auto t0 = Clock::now();
  const double cpu0 = CpuSeconds();
  nl::Result<nl::proc::ChildProcess> serve = nl::proc::ChildProcess::Start(
      nl::ServeArgv(*loader, ServeRequestFor(a, job, binds, rank, threads)), {}, log->get(),
      log->get());
  if (!serve.ok()) return error(serve.status());
  // The consumer on the trainer's cpus, as inprocess; bound after the serve
  // started, which must not inherit this binding (it binds per the plan).
  nl::BindReport trainer;
  if (binds) {
    trainer = nl::BindThisThread(job.topology, plan.trainer_cpus, plan.mem_node);
    std::fprintf(stderr, "%s\n", nl::AffinityLine(rank, plan, trainer).c_str());
  }
  Consumed got;
  nl::Status st = a.consumer == "python" ? ConsumePython(a, rank, &*serve, log->get(), &got)
                                         : ConsumeCpp(a, rank, &*serve, log->get(), &got);
  if (!st.ok()) {
    // The consumer has detached, so the serve ends by itself (a failed one
    // has reported and is exiting): it is waited for, not killed half-way
    // through its exit (a sanitizer's exit-time helper would be orphaned);
    // one still running after kExitLimitS is killed.
    (void)serve->WaitFor(kExitLimitS, "loader serve");
    return error(st);
  }
  nl::Result<nl::proc::ChildExit> served = serve->WaitFor(kExitLimitS, "loader serve");
  if (!served.ok()) return error(served.status());
  if (!served->Succeeded()) {
    return error(nl::Status::Internal("loader serve for rank " + std::to_string(rank) + " ended (" +
                                      served->Describe() +
                                      "): " + nl::proc::TailOf(log->get(), 3)));
  }
  for (const std::string& line : nl::proc::LinesWith(log->get(), "[Affinity]"))
    std::fprintf(stderr, "%s (loader serve)\n", line.c_str());
  AddServiceRates(&r, a, got, *served, t0, cpu0);
  AddConsumerCost(&r, a.consumer, got);
  AddPlacement(&r, binds, plan, trainer, threads);
  const auto [anon, file] = Rss();
  r["rss_anon_mib"] = anon;  // the consumer
  r["rss_file_mib"] = file;
  r["serve_max_rss_mib"] = served->usage.ru_maxrss / 1024.0;
  if (!a.record_indices.empty()) AddEpochIndices(&r, rank, got.epoch_indices);
  return r;
}

// One process per rank, each a fresh exec of this program (nothing of this
// process's threads or libraries' state is inherited), its stdout a pipe.
// Dropped before it is waited for, a rank is killed and reaped.
struct RankProcess {
  nl::proc::ChildProcess process;
  nl::Fd out;  // the read end of its stdout
};

nl::Result<std::vector<RankProcess>> SpawnRanks(const Args& a) {
  NL_ASSIGN_OR_RETURN(const std::string self, SelfPath());
  std::vector<RankProcess> procs;  // on an error, the ranks started so far are killed and reaped
  for (int r = 0; r < a.ranks; ++r) {
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) {
      return nl::Status::FromErrno("cannot make a pipe for rank " + std::to_string(r), errno);
    }
    nl::Fd read_end(p[0]), write_end(p[1]);
    std::vector<std::string> args = a.argv;
    args[0] = self;
    for (const std::string& x : {std::string("--parent-pid"), std::to_string(getpid()),
                                 std::string("--child-rank"), std::to_string(r)}) {
      args.push_back(x);
    }
    nl::Result<nl::proc::ChildProcess> child =
        nl::proc::ChildProcess::Start(args, {}, write_end.get(), -1);
    if (!child.ok()) return child.status().WithContext("cannot start rank " + std::to_string(r));
    procs.push_back({std::move(*child), std::move(read_end)});
  }
  return procs;
}

// Reads every rank's output to its end (all at once, so no rank blocks on a
// full pipe), closing each pipe at its end.
std::vector<std::string> ReadOutputs(std::vector<RankProcess>* procs) {
  std::vector<std::string> outs(procs->size());
  size_t left = procs->size();
  while (left > 0) {
    std::vector<pollfd> pf;
    std::vector<size_t> which;
    for (size_t r = 0; r < procs->size(); ++r) {
      if (!(*procs)[r].out.valid()) continue;
      pf.push_back({(*procs)[r].out.get(), POLLIN, 0});
      which.push_back(r);
    }
    if (poll(pf.data(), pf.size(), -1) < 0) continue;
    for (size_t k = 0; k < pf.size(); ++k) {
      if (!(pf[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      nl::Fd& fd = (*procs)[which[k]].out;
      char buf[65536];
      const ssize_t n = read(fd.get(), buf, sizeof buf);
      if (n > 0) {
        outs[which[k]].append(buf, static_cast<size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        fd.Reset();
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

// Waits for a rank process and turns its output into its row.
json RankResult(int rank, nl::proc::ChildProcess* process, const std::string& out) {
  const nl::Result<nl::proc::ChildExit> e = process->WaitFor(-1, "rank process");
  if (!e.ok()) return {{"rank", rank}, {"error", nl::FlagText(e.status().ToString())}};
  if (!e->Succeeded() || out.empty()) {
    return {{"rank", rank}, {"error", "rank process ended abnormally (" + e->Describe() + ")"}};
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
    std::vector<const char*> numbers = {"images_per_s", "mb_per_s",     "cpu_us_per_image",
                                        "cores_used",   "rss_anon_mib", "seconds"};
    const bool service = j.value("mode", std::string()) == "service";
    const bool python = j.value("consumer", std::string()) == "python";
    if (!python) numbers.insert(numbers.end(), {"wait_ms_mean", "wait_ms_p95"});
    if (service) numbers.push_back("consumer_us_mean");
    if (service && !python) numbers.push_back("consumer_us_p99");
    for (const char* k : numbers) {
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
    // Mode 0600: what the tools write is their user's only.
    nl::Fd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    if (!fd.valid()) return nl::Status::FromErrno("--record-indices: cannot open " + path, errno);
    nl::FileHandle f(::fdopen(fd.get(), "w"));
    if (!f) return nl::Status::FromErrno("--record-indices: cannot open " + path, errno);
    fd.Release();  // the stream owns it now
    return std::unique_ptr<IndexFile>(new IndexFile(path, std::move(f)));
  }
  IndexFile(const IndexFile&) = delete;
  IndexFile& operator=(const IndexFile&) = delete;
  void WriteLine(const std::string& line) {
    if (errno_ != 0) return;
    if (std::fwrite(line.data(), 1, line.size(), f_.get()) != line.size() ||
        std::fputc('\n', f_.get()) == EOF)
      errno_ = errno ? errno : EIO;
  }
  nl::Status Close() {
    if (std::fflush(f_.get()) != 0 && errno_ == 0) errno_ = errno ? errno : EIO;
    if (std::fclose(f_.release()) != 0 && errno_ == 0) errno_ = errno ? errno : EIO;
    if (errno_ != 0)
      return nl::Status::FromErrno("--record-indices: cannot write " + path_, errno_);
    return nl::Status::Ok();
  }

 private:
  IndexFile(std::string path, nl::FileHandle f) : path_(std::move(path)), f_(std::move(f)) {}
  std::string path_;
  nl::FileHandle f_;
  int errno_ = 0;
};

// Rates from runs this short say more about start-up than about loading.
constexpr double kShortRunS = 0.5;
// The longest --step-ms (about 17 minutes per batch).
constexpr double kMaxStepMs = 1e6;

json Gather(const Args& a, std::vector<RankProcess>* procs, const std::vector<std::string>& outs,
            IndexFile* rec) {
  json all;
  all["ranks"] = json::array();
  double total = 0, shortest = 1e300;
  for (int r = 0; r < a.ranks; ++r) {
    json j = RankResult(r, &(*procs)[r].process, outs[r]);
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

// A number of the row, or "-" when the row has none (the Python consumer's waits).
std::string Cell(const json& j, const char* key, const char* format) {
  if (!j.contains(key) || !j[key].is_number()) return "-";
  char buf[64];
  std::snprintf(buf, sizeof buf, format, j[key].get<double>());
  return buf;
}

void PrintTable(const Args& a, const json& all) {
  const bool service = all.value("mode", std::string()) == "service";
  std::printf("%-4s %-6s %-14s %-4s %10s %9s %9s %9s %10s %6s %9s", "rank", "node", "loader cpus",
              "thr", "images/s", "MB/s", "wait ms", "wait p95", "cpu us/img", "cores", "anon MiB");
  std::printf(service ? " %10s %10s\n" : "\n", "cost us", "cost p99");
  for (const auto& j : all["ranks"]) {
    if (j.contains("error")) {
      std::printf("%-4d error: %s\n", j.value("rank", -1), j.value("error", std::string()).c_str());
      continue;
    }
    std::printf("%-4d %-6d %-14s %-4d %10.0f %9.1f %9s %9s %10.1f %6.2f %9.1f", j.value("rank", -1),
                j.value("numa_node", -1), j.value("loader_cpus", std::string()).c_str(),
                j.value("threads", 0), j.value("images_per_s", 0.0), j.value("mb_per_s", 0.0),
                Cell(j, "wait_ms_mean", "%.3f").c_str(), Cell(j, "wait_ms_p95", "%.3f").c_str(),
                j.value("cpu_us_per_image", 0.0), j.value("cores_used", 0.0),
                j.value("rss_anon_mib", 0.0));
    if (service) {
      std::printf(" %10s %10s", Cell(j, "consumer_us_mean", "%.1f").c_str(),
                  Cell(j, "consumer_us_p99", "%.1f").c_str());
    }
    std::printf("\n");
    if (j.contains("steady_images_per_s") && j["steady_images_per_s"].is_number()) {
      std::printf("     after its first %d batches (one per buffer, the warm-up): %.0f images/s; open "
                  "%.3f s, first batch at %.3f s\n",
                  j.value("warmup_batches", 0), j.value("steady_images_per_s", 0.0), j.value("open_s", 0.0),
                  j.value("first_batch_s", 0.0));
    }
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

int Fail(const nl::Status& st) {
  std::fprintf(stderr, "loader_bench: error: %s\n", nl::FlagText(st.ToString()).c_str());
  return 1;
}

// The options that only some modes take, refused (not ignored) elsewhere.
nl::Status CheckModeOptions(const Args& a) {
  if (a.mode == "inprocess") {
    if (a.consumer != "cpp")
      return nl::Status::InvalidArgument("--consumer applies to --mode service or both");
    if (!a.loader_path.empty())
      return nl::Status::InvalidArgument("--loader applies to --mode service or both");
    return nl::Status::Ok();
  }
  if (!a.plan.topology_file.empty()) {
    return nl::Status::InvalidArgument(
        "--topology plans for a machine described in a file, but --mode " + a.mode +
        " runs loader serve on this one: use --mode inprocess with --topology");
  }
  if (a.mode == "both" && !a.record_indices.empty()) {
    return nl::Status::InvalidArgument(
        "--record-indices records one run: use it with --mode inprocess or --mode service");
  }
  if (a.consumer == "python" && a.step_ms > 0) {
    return nl::Status::InvalidArgument(
        "--step-ms simulates compute in the C++ consumer; the Python consumer reads as fast as "
        "it can: drop --step-ms or use --consumer cpp");
  }
  if (a.consumer == "python" && !a.record_indices.empty()) {
    return nl::Status::InvalidArgument("--record-indices needs the C++ consumer (--consumer cpp)");
  }
  NL_RETURN_IF_ERROR(LoaderPath(a).status());
  if (a.consumer == "python") NL_RETURN_IF_ERROR(PythonPackageParent().status());
  return nl::Status::Ok();
}

// Runs the ranks of one mode, a process each, and gathers their rows.
nl::Result<json> RunMode(const Args& a, const std::string& mode, IndexFile* rec) {
  Args m = a;
  m.argv.push_back("--child-mode");
  m.argv.push_back(mode);
  NL_ASSIGN_OR_RETURN(std::vector<RankProcess> procs, SpawnRanks(m));
  const std::vector<std::string> outs = ReadOutputs(&procs);
  json all = Gather(a, &procs, outs, rec);
  if (mode == "service") {
    all["mode"] = "service";
    all["consumer"] = a.consumer;
  }
  return all;
}

// --mode both: the service's throughput as a share of inprocess's, and each
// rank's consumer cost as a share of its batch's loading time (inprocess:
// its seconds per batch).
json Compare(const json& in, const json& sv) {
  json c;
  const double ti = in.value("total_images_per_s", 0.0), ts = sv.value("total_images_per_s", 0.0);
  c["service_vs_inprocess"] = ti > 0 ? ts / ti : 0.0;
  c["consumer_cost"] = json::array();
  for (size_t r = 0; r < in["ranks"].size() && r < sv["ranks"].size(); ++r) {
    const json &i = in["ranks"][r], &s = sv["ranks"][r];
    if (i.contains("error") || s.contains("error") || i.value("batches", 0) == 0) continue;
    const double batch_ms = i.value("seconds", 0.0) / i.value("batches", 1) * 1e3;
    const double cost_us = s.value("consumer_us_mean", 0.0);
    c["consumer_cost"].push_back(
        {{"rank", r},
         {"consumer", s.value("consumer", std::string())},
         {"per_batch_us", cost_us},
         {"inprocess_batch_ms", batch_ms},
         {"percent_of_batch", batch_ms > 0 ? cost_us / 10 / batch_ms : 0}});
  }
  return c;
}

void PrintComparison(const json& c) {
  std::printf("service/inprocess: %.3f of the in-process images/s (target >= 0.90)\n",
              c["service_vs_inprocess"].get<double>());
  for (const auto& r : c["consumer_cost"]) {
    std::printf(
        "rank %d: the %s consumer costs %.1f us per batch = %.3f%% of a batch's loading time "
        "(%.2f ms in-process) (target < 5%%)\n",
        r.value("rank", -1), r.value("consumer", std::string()).c_str(),
        r.value("per_batch_us", 0.0), r.value("percent_of_batch", 0.0),
        r.value("inprocess_batch_ms", 0.0));
  }
}

// The options, checked together once parsed.
nl::Status FinishOptions(Args* a) {
  NL_RETURN_IF_ERROR(nl::FinishPipelineOptions(a->pflags, &a->pipeline));
  NL_RETURN_IF_ERROR(nl::FinishTransformOptions(a->tflags, &a->pipeline.transform));
  if (!std::isfinite(a->step_ms) || a->step_ms < 0 || a->step_ms > kMaxStepMs) {
    char msg[160];
    std::snprintf(msg, sizeof msg, "--step-ms must be a number of ms in 0..%.0f (got %g)",
                  kMaxStepMs, a->step_ms);
    return nl::Status::InvalidArgument(msg);
  }
  return nl::Status::Ok();
}

// A rank process: runs its rank and prints its row as JSON.
int RunChild(const Args& a, const nl::JobPlan& job, bool binds) {
  if (a.child_rank >= a.ranks) return 2;
  const nl::RankPlan& mine = job.plan.ranks[a.child_rank];
  const json row = a.child_mode == "service" ? RunServiceRank(a, job, mine, binds, a.child_rank)
                                             : RunRank(a, job.topology, mine, binds, a.child_rank);
  std::cout << row.dump() << std::endl;
  return 0;
}

void PrintNotes(const nl::JobPlan& job, bool binds) {
  for (const std::string& note : job.notes)
    std::fprintf(stderr, "loader_bench: %s\n", nl::FlagText(note).c_str());
  if (!binds) std::fprintf(stderr, "loader_bench: --bind off: no rank is bound\n");
  if (!job.gpu_note.empty())
    std::fprintf(stderr, "loader_bench: note: no GPU found through CUDA: %s\n",
                 job.gpu_note.c_str());
}

// The runs' table or JSON (--mode both: the two and their comparison).
void Report(const Args& a, const std::vector<json>& runs) {
  if (a.mode != "both") {
    if (a.json_out) {
      std::cout << runs[0].dump() << "\n";
    } else {
      PrintTable(a, runs[0]);
    }
    return;
  }
  json both = Compare(runs[0], runs[1]);
  both["inprocess"] = runs[0];
  both["service"] = runs[1];
  if (a.json_out) {
    std::cout << both.dump() << "\n";
    return;
  }
  std::printf("in-process:\n");
  PrintTable(a, runs[0]);
  std::printf("service (%s consumer):\n", a.consumer.c_str());
  PrintTable(a, runs[1]);
  PrintComparison(both);
}

// Runs the ranks of each mode asked for (inprocess, then service) and reports them.
int RunModes(const Args& a) {
  std::unique_ptr<IndexFile> rec;
  if (!a.record_indices.empty()) {  // opened before any rank runs: a bad path costs nothing
    nl::Result<std::unique_ptr<IndexFile>> f = IndexFile::Open(a.record_indices);
    if (!f.ok()) return Fail(f.status());
    rec = std::move(*f);
  }
  std::vector<json> runs;  // inprocess, service or both in that order
  for (const char* mode : {"inprocess", "service"}) {
    if (a.mode != mode && a.mode != "both") continue;
    nl::Result<json> all = RunMode(a, mode, rec.get());
    if (!all.ok()) return Fail(all.status());
    runs.push_back(std::move(*all));
  }
  int rc = 0;
  for (const json& all : runs)
    for (const auto& j : all["ranks"]) rc = j.contains("error") ? 1 : rc;
  Report(a, runs);
  if (rec) {
    const nl::Status st = rec->Close();
    if (!st.ok()) return Fail(st);
  }
  return rc;
}

int Run(Args a) {
  nl::Status st = FinishOptions(&a);
  if (!st.ok()) return Fail(st);
  // The same plan in the parent and in every rank process. --bind off plans
  // as --bind on does (so both run the same loader threads) and binds nothing.
  a.plan.nproc = a.ranks;
  a.plan.no_bind = false;
  const bool binds = a.bind == "on";
  if (const char* cvd = std::getenv("CUDA_VISIBLE_DEVICES")) a.plan.cuda_visible_devices = cvd;
  nl::Result<nl::JobPlan> job = nl::MakeJobPlan(a.plan);
  if (!job.ok()) return Fail(job.status());
  if (a.child_rank >= 0) return RunChild(a, *job, binds);
  st = CheckModeOptions(a);
  if (!st.ok()) return Fail(st);
  PrintNotes(*job, binds);
  st = CheckJobBufferMemory(a);
  if (!st.ok()) return Fail(st);
  return RunModes(a);
}

void AddBenchOptions(CLI::App* app, Args* a) {
  app->add_option("--ranks", a->ranks,
                  "Ranks, one process each: 1.." + std::to_string(nl::kMaxLocalRanks) +
                      " (more than the allowed cores needs --allow-shared-cores)")
      ->check(CLI::Range(1, nl::kMaxLocalRanks))
      ->capture_default_str();
  app->add_option("--threads-per-rank", a->threads,
                  "Loader threads per rank, 1.." + std::to_string(nl::WorkerPool::kMaxThreads) +
                      " (default: the plan's loader cores)")
      ->check(CLI::Range(1u, nl::WorkerPool::kMaxThreads));
  nl::Add(app, nl::opt::kEpochs, &a->pipeline.epochs)->check(CLI::Range(uint64_t{1}, uint64_t{1} << 32));
  app->add_option("--bind", a->bind, "on: bind per the plan; off: no binding")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  app->add_option(
      "--step-ms", a->step_ms,
      "Simulated compute per batch, in ms, 0..1000000 (0: consume as fast as possible)");
  app->add_option("--max-batches", a->max_batches,
                  "Stop each rank after this many batches (a bounded run of a big split; "
                  "in-process mode)")
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 40));
  app->add_option("--record-indices", a->record_indices,
                  "Write {rank, epoch, indices} JSON lines to FILE");
  nl::Add(app, nl::opt::kJson, &a->json_out);
  app->add_option("--mode", a->mode,
                  "inprocess: the pipeline in each rank process; service: a `loader serve` per "
                  "rank, consumed through its ring; both: one, then the other, and their ratio")
      ->check(CLI::IsMember({"inprocess", "service", "both"}))
      ->capture_default_str();
  app->add_option("--consumer", a->consumer,
                  "service: cpp (RingClient in the rank process) or python (python3 -m "
                  "numa_loader.consume, PYTHONPATH=<build>/python)")
      ->check(CLI::IsMember({"cpp", "python"}))
      ->capture_default_str();
  nl::Add(app, nl::opt::kLoaderBin, &a->loader_path);
}

void AddInternalOptions(CLI::App* app, Args* a) {
  app->add_option("--parent-pid", a->parent_pid, "internal: the spawning loader_bench")->group("");
  app->add_option("--child-rank", a->child_rank, "internal: run one rank and print its JSON")
      ->group("");
  app->add_option("--child-mode", a->child_mode, "internal: the rank's mode")
      ->check(CLI::IsMember({"inprocess", "service"}))
      ->group("");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"loader_bench: loader throughput per rank"};
  Args a;
  a.pipeline.epochs = 1;
  AddBenchOptions(&app, &a);
  nl::AddPlanOptions(&app, &a.plan, nl::kPlanTopology | nl::kPlanPlacement | nl::kPlanFallbacks);
  nl::AddPipelineOptions(&app, &a.pipeline, &a.pflags);
  nl::AddTransformOptions(&app, &a.pipeline.transform, &a.tflags);
  AddInternalOptions(&app, &a);
  CLI11_PARSE(app, argc, argv);
  a.argv.assign(argv, argv + argc);
  return Run(a);
}
