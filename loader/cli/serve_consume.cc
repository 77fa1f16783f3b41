#include "loader/cli/serve_consume.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "base/child_process.h"
#include "base/file_util.h"
#include "base/parse_number.h"
#include "base/worker_pool.h"
#include "loader/plan/affinity.h"
#include "loader/ring/client.h"

namespace nl {
namespace {

std::atomic<int> g_signal{0};

extern "C" void OnStopSignal(int sig) { g_signal.store(sig); }

// SIGINT and SIGTERM set g_signal; the loops look at it (no work in the handler).
void InstallStopHandlers() {
  struct sigaction sa{};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
}

// The failure channel of a parent that started us (the trainer's rank), or -1.
int g_failure_fd = -1;

int Fail(const std::string& who, const Status& s) {
  std::fprintf(stderr, "%s: error: %s\n", who.c_str(), s.ToString().c_str());
  proc::WriteFailureReport(g_failure_fd, proc::FailureKind::kOwn, s.ToString());
  return 1;
}

// A flag's text, else the environment variable's, else the default; parsed.
Result<int64_t> FromFlagOrEnv(const std::string& flag_text, const char* flag, const char* env,
                              int64_t def, int64_t min, int64_t max) {
  if (!flag_text.empty()) return ParseInt(flag_text, flag, min, max);
  if (const char* v = std::getenv(env); v != nullptr && *v != '\0') {
    return ParseInt(v, std::string("the environment variable ") + env, min, max);
  }
  return def;
}

}  // namespace

CLI::App* AddServe(CLI::App* app, ServeArgs* a) {
  auto* s = app->add_subcommand(
      "serve", "Run the loader service for one rank: fill its shared-memory ring with batches");
  a->service.pipeline.epochs = 0;
  AddPipelineOptions(s, &a->service.pipeline, &a->pflags);
  AddTransformOptions(s, &a->service.pipeline.transform, &a->tflags);
  s->add_option("--job-id", a->service.job_id,
                "Job id shared with the consumer (printable ASCII, no '/', at most 64 bytes)")
      ->required();
  s->add_option("--rank", a->rank, "Global rank (default: $RANK, else 0)");
  s->add_option("--world-size", a->world, "World size (default: $WORLD_SIZE, else 1)");
  s->add_option("--local-rank", a->local_rank, "Local rank (default: $LOCAL_RANK, else 0)");
  s->add_option("--local-world-size", a->local_world,
                "Ranks on this node, for the binding plan (default: $LOCAL_WORLD_SIZE, else one "
                "per visible GPU)");
  s->add_option("--epochs", a->service.pipeline.epochs,
                "Epochs to serve, then end the stream (0: as long as the consumer asks)")
      ->check(CLI::Range(uint64_t{0}, uint64_t{1} << 32))
      ->capture_default_str();
  s->add_option("--start-epoch", a->service.pipeline.start_epoch, "First epoch")
      ->check(CLI::Range(uint64_t{0}, uint64_t{1} << 32));
  s->add_option("--start-batch", a->service.pipeline.start_batch, "First batch of that epoch")
      ->check(CLI::Range(uint64_t{0}, uint64_t{1} << 40));
  s->add_option("--threads", a->threads,
                "Loader threads (default: the plan's loader cores for this rank)")
      ->check(CLI::Range(1u, WorkerPool::kMaxThreads));
  s->add_option("--attach-timeout", a->service.attach_timeout_s,
                "Seconds to wait for a consumer (default: no limit)")
      ->check(CLI::Range(0.0, 1e7));
  s->add_option("--stall-warning", a->service.stall_warning_s,
                "Warn when the consumer holds every slot this many seconds")
      ->check(CLI::Range(0.0, 1e7))
      ->capture_default_str();
  s->add_option("--simulate-delay-ms", a->service.delay_per_batch_ms,
                "Testing: sleep this long before each batch (a slow loader, to see the "
                "trainer's straggler diagnosis)")
      ->check(CLI::Range(0.0, 1e6));
  s->add_option("--gpus", a->plan.gpus, "GPU index of each local rank, e.g. 0,2");
  s->add_option("--numa-node", a->plan.numa_node, "NUMA node of each local rank, e.g. 0,0,1,1");
  s->add_option("--cpu-affinity", a->plan.cpu_affinity,
                "One cpu list per local rank: \"0-9,44-53;10-21,54-65\"");
  s->add_option("--trainer-cores", a->plan.trainer_cores, "Cores reserved for each trainer rank")
      ->check(CLI::Range(1, kMaxCpuIndex))
      ->capture_default_str();
  s->add_flag("--allow-shared-cores", a->plan.allow_shared_cores,
              "Let ranks share cores when a node has too few");
  s->add_flag("--ignore-gpus", a->plan.ignore_gpus, "Plan as if no GPU were visible");
  s->add_flag("--no-bind", a->plan.no_bind, "Bind nothing");
  return s;
}

int RunServe(ServeArgs& a) {
  const std::string tool = "loader serve";
  g_failure_fd = proc::TakeFailureFd(std::getenv(proc::kFailureFdVariable));
  PipelineConfig& pc = a.service.pipeline;
  Status st = FinishPipelineOptions(a.pflags, &pc);
  if (st.ok()) st = FinishTransformOptions(a.tflags, &pc.transform);
  if (!st.ok()) return Fail(tool, st);
  auto rank = FromFlagOrEnv(a.rank, "--rank", "RANK", 0, 0, 1 << 20);
  auto world = FromFlagOrEnv(a.world, "--world-size", "WORLD_SIZE", 1, 1, 1 << 20);
  auto local = FromFlagOrEnv(a.local_rank, "--local-rank", "LOCAL_RANK", 0, 0, kMaxLocalRanks - 1);
  auto local_world = FromFlagOrEnv(a.local_world, "--local-world-size", "LOCAL_WORLD_SIZE", 0, 0,
                                   kMaxLocalRanks);
  for (const auto* r : {&rank, &world, &local, &local_world}) {
    if (!r->ok()) return Fail(tool, r->status());
  }
  if (*rank >= *world) {
    return Fail(tool, Status::InvalidArgument("rank " + std::to_string(*rank) +
                                              " is not below the world size " +
                                              std::to_string(*world)));
  }
  if (*local_world != 0 && *local >= *local_world) {
    return Fail(tool, Status::InvalidArgument("local rank " + std::to_string(*local) +
                                              " is not below the local world size " +
                                              std::to_string(*local_world)));
  }
  pc.rank = static_cast<int>(*rank);
  pc.world = static_cast<int>(*world);
  a.plan.nproc = static_cast<int>(*local_world);
  if (const char* cvd = std::getenv("CUDA_VISIBLE_DEVICES")) a.plan.cuda_visible_devices = cvd;
  Result<JobPlan> job = MakeJobPlan(a.plan);
  if (!job.ok()) return Fail(tool, job.status());
  for (const std::string& note : job->notes) std::fprintf(stderr, "%s: %s\n", tool.c_str(), note.c_str());
  if (*local >= static_cast<int64_t>(job->plan.ranks.size())) {
    return Fail(tool, Status::InvalidArgument(
                          "local rank " + std::to_string(*local) + " but the plan has " +
                          std::to_string(job->plan.ranks.size()) +
                          " local ranks (set --local-world-size or $LOCAL_WORLD_SIZE)"));
  }
  const RankPlan& mine = job->plan.ranks[*local];
  pc.threads = a.threads ? a.threads
                         : std::max<uint32_t>(1, static_cast<uint32_t>(mine.loader_cpus.size()));
  if (job->plan.binds) {
    // The service's own threads (socket watcher, slot forwarding) stay on the
    // loader's cores too; the workers bind themselves as they start.
    const BindReport self = BindThisThread(job->topology, mine.loader_cpus, mine.mem_node);
    std::fprintf(stderr, "%s\n", AffinityLine(pc.rank, mine, self).c_str());
    const int r = pc.rank;
    pc.thread_start = LoaderThreadStartHook(job->topology, mine, r, nullptr);
  }
  InstallStopHandlers();
  a.service.stop_signal = &g_signal;
  a.service.on_listening = [&] {
    std::fprintf(stderr,
                 "%s: job %s, rank %d of %d: %u loader threads, %u slots of batch %u; waiting "
                 "for a consumer (loader consume --job-id %s --rank %d)\n",
                 tool.c_str(), a.service.job_id.c_str(), pc.rank, pc.world, pc.threads,
                 pc.prefetch, pc.batch_size, a.service.job_id.c_str(), pc.rank);
  };
  ServiceReport report;
  st = RunService(a.service, &report);
  if (st.code() == StatusCode::kAborted && g_signal.load() != 0) {
    std::fprintf(stderr, "%s: %s; served %llu batches\n", tool.c_str(), st.message().c_str(),
                 static_cast<unsigned long long>(report.batches));
    return 128 + g_signal.load();
  }
  if (!st.ok()) return Fail(tool, st);
  std::fprintf(stderr, "%s: the consumer (pid %d) detached; %llu batches (%llu images) were published\n",
               tool.c_str(), report.consumer_pid, static_cast<unsigned long long>(report.batches),
               static_cast<unsigned long long>(report.images));
  return 0;
}

CLI::App* AddConsume(CLI::App* app, ConsumeArgs* a) {
  auto* c = app->add_subcommand(
      "consume", "Attach to a rank's loader service, read and check batches, report throughput");
  c->add_option("--job-id", a->job_id, "Job id of the loader serve")->required();
  c->add_option("--rank", a->rank, "Rank (default: $RANK, else 0)");
  c->add_option("--batches", a->batches, "Batches to read (default: until the producer's end)")
      ->check(CLI::Range(uint64_t{0}, uint64_t{1} << 40));
  c->add_option("--timeout", a->timeout_s,
                "Seconds to wait for a batch before reporting the producer stuck")
      ->check(CLI::Range(0.0, 1e7))
      ->capture_default_str();
  c->add_option("--attach-timeout", a->attach_timeout_s,
                "Seconds to wait for the producer to appear")
      ->check(CLI::Range(0.0, 1e7))
      ->capture_default_str();
  c->add_option("--start-epoch", a->start_epoch, "Ask for batches from this epoch on")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 32));
  c->add_option("--start-batch", a->start_batch, "... and this batch of it (with --start-epoch)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  c->add_option("--dump", a->dump,
                "Write each batch's pixels, labels and indices (int64 LE), in order, to FILE");
  c->add_flag("--json", a->json, "Print one JSON object");
  return c;
}

int RunConsume(const ConsumeArgs& a) {
  using Clock = std::chrono::steady_clock;
  const std::string tool = "loader consume";
  auto rank = FromFlagOrEnv(a.rank, "--rank", "RANK", 0, 0, 1 << 20);
  if (!rank.ok()) return Fail(tool, rank.status());
  if (a.start_batch != 0 && a.start_epoch < 0) {
    return Fail(tool, Status::InvalidArgument("--start-batch needs --start-epoch"));
  }
  InstallStopHandlers();
  std::ofstream dump;
  if (!a.dump.empty()) {
    if (Status s = CreatePrivateFile(a.dump); !s.ok()) return Fail(tool, s);
    dump.open(a.dump, std::ios::binary | std::ios::trunc);
    if (!dump) return Fail(tool, Status::FromErrno("opening --dump " + a.dump, errno));
  }
  auto client = RingClient::Attach(a.job_id, static_cast<int>(*rank), a.attach_timeout_s);
  if (!client.ok()) return Fail(tool, client.status());
  RingClient& c = **client;
  const RingInfo& info = c.info();
  if (a.start_epoch >= 0) {
    const Status s = c.Seek(static_cast<uint64_t>(a.start_epoch), static_cast<uint64_t>(a.start_batch));
    if (!s.ok()) return Fail(tool, s);
  }
  const uint64_t sample_bytes = info.geometry.sample_bytes;
  uint64_t batches = 0, images = 0;
  double in_calls_s = 0;
  bool have_prev = false;
  uint64_t prev_seq = 0, prev_epoch = 0, prev_batch = 0, first_epoch = 0, first_batch = 0;
  std::set<uint64_t> epochs;
  const auto t0 = Clock::now();
  int rc = 0;
  std::string end_note;
  while (a.batches == 0 || batches < a.batches) {
    // Short waits, so Ctrl-C is answered at once; the stuck report comes
    // after --timeout (it counts from the producer's last batch).
    Result<RingBatch> b = Status::DeadlineExceeded("");
    const auto wait0 = Clock::now();
    while (true) {
      if (g_signal.load() != 0) break;
      const auto n0 = Clock::now();
      b = c.Next(0.2);
      const double call_s = std::chrono::duration<double>(Clock::now() - n0).count();
      in_calls_s += b.ok() ? std::max(0.0, call_s - b->wait_s) : 0.0;
      if (b.ok() || b.status().code() != StatusCode::kDeadlineExceeded) break;
      if (std::chrono::duration<double>(Clock::now() - wait0).count() >= a.timeout_s) break;
    }
    if (g_signal.load() != 0) {
      end_note = std::string("stopped by ") + (g_signal.load() == SIGINT ? "SIGINT" : "SIGTERM");
      rc = 128 + g_signal.load();
      break;
    }
    if (!b.ok()) {
      if (b.status().code() == StatusCode::kOutOfRange) {
        end_note = "the producer's last epoch is out";
        break;
      }
      std::fprintf(stderr, "%s: error: %s\n", tool.c_str(), b.status().ToString().c_str());
      rc = b.status().code() == StatusCode::kDeadlineExceeded ? 2 : 1;
      break;
    }
    // The metadata a consumer relies on.
    std::string wrong;
    if (have_prev && b->sequence != prev_seq + 1) wrong = "sequence does not follow";
    if (have_prev && a.start_epoch < 0) {
      const bool next_in_epoch = b->epoch == prev_epoch && b->batch == prev_batch + 1;
      const bool next_epoch = b->epoch == prev_epoch + 1 && b->batch == 0 &&
                              prev_batch + 1 == info.batches_per_epoch;
      if (!next_in_epoch && !next_epoch) wrong = "position does not follow the previous batch";
    }
    if (b->batch >= info.batches_per_epoch) wrong = "batch number past the epoch";
    if (b->size == 0 || b->size > info.geometry.batch_size) wrong = "size out of range";
    if (b->size != info.geometry.batch_size && b->batch + 1 != info.batches_per_epoch) {
      wrong = "a short batch that is not the epoch's last";
    }
    for (uint32_t i = 0; i < b->size && wrong.empty(); ++i) {
      if (b->labels[i] < 0) wrong = "negative label";
      if (b->indices[i] < 0) wrong = "negative sample index";
    }
    if (!wrong.empty()) {
      std::fprintf(stderr,
                   "%s: error: batch %llu (epoch %llu, batch %llu, %u samples): %s (previous: "
                   "epoch %llu, batch %llu)\n",
                   tool.c_str(), static_cast<unsigned long long>(b->sequence),
                   static_cast<unsigned long long>(b->epoch),
                   static_cast<unsigned long long>(b->batch), b->size, wrong.c_str(),
                   static_cast<unsigned long long>(prev_epoch),
                   static_cast<unsigned long long>(prev_batch));
      rc = 1;
      break;
    }
    if (!have_prev) {
      first_epoch = b->epoch;
      first_batch = b->batch;
    }
    have_prev = true;
    prev_seq = b->sequence;
    prev_epoch = b->epoch;
    prev_batch = b->batch;
    epochs.insert(b->epoch);
    ++batches;
    images += b->size;
    if (dump.is_open()) {
      dump.write(static_cast<const char*>(b->pixels), static_cast<std::streamsize>(b->size * sample_bytes));
      dump.write(reinterpret_cast<const char*>(b->labels), static_cast<std::streamsize>(b->size * 8));
      dump.write(reinterpret_cast<const char*>(b->indices), static_cast<std::streamsize>(b->size * 8));
    }
    const auto r0 = Clock::now();
    const Status rs = c.Release(*b);
    in_calls_s += std::chrono::duration<double>(Clock::now() - r0).count();
    if (!rs.ok()) {
      std::fprintf(stderr, "%s: error: %s\n", tool.c_str(), rs.ToString().c_str());
      rc = 1;
      break;
    }
  }
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  if (dump.is_open()) {
    dump.close();
    if (!dump) {
      std::fprintf(stderr, "%s: error: writing --dump %s failed\n", tool.c_str(), a.dump.c_str());
      rc = rc ? rc : 1;
    }
  }
  // Time inside Next/Release per batch, less the time Next spent waiting for
  // the producer: what the ring itself costs the consumer.
  const double per_batch_us = batches ? in_calls_s / batches * 1e6 : 0;
  if (a.json) {
    nlohmann::json j;
    j["job_id"] = a.job_id;
    j["rank"] = *rank;
    j["batches"] = batches;
    j["images"] = images;
    j["seconds"] = secs;
    j["images_per_s"] = secs > 0 ? images / secs : 0;
    j["batches_per_s"] = secs > 0 ? batches / secs : 0;
    j["per_batch_us"] = per_batch_us;
    j["first_epoch"] = first_epoch;
    j["first_batch"] = first_batch;
    j["last_epoch"] = prev_epoch;
    j["last_batch"] = prev_batch;
    j["epochs"] = std::vector<uint64_t>(epochs.begin(), epochs.end());
    j["producer_pid"] = info.producer_pid;
    if (!end_note.empty()) j["end"] = end_note;
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf(
        "consumed %llu batches (%llu images) of job %s, rank %lld in %.2f s: %.0f images/s, "
        "%.1f batches/s; the ring cost %.1f us per batch%s%s\n",
        static_cast<unsigned long long>(batches), static_cast<unsigned long long>(images),
        a.job_id.c_str(), static_cast<long long>(*rank), secs, secs > 0 ? images / secs : 0.0,
        secs > 0 ? batches / secs : 0.0, per_batch_us, end_note.empty() ? "" : "; ",
        end_note.c_str());
  }
  return rc;
}

}  // namespace nl
