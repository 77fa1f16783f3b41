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
  const std::string text = FlagText(s.ToString());
  std::fprintf(stderr, "%s: error: %s\n", who.c_str(), text.c_str());
  proc::WriteFailureReport(g_failure_fd, proc::FailureKind::kOwn, text);
  return 1;
}

}  // namespace

CLI::App* AddServe(CLI::App* app, ServeFlags* flags) {
  auto* s = app->add_subcommand(
      "serve", "Run the loader service for one rank: fill its shared-memory ring with batches");
  AddServeOptions(s, flags);
  // The options above as JSON, then exit: what the Python package builds its
  // keywords, defaults and checks from. (A callback, so the required
  // options need not be given.)
  s->add_flag_callback(
      "--options-json",
      [s] {
        std::printf("%s\n", OptionsJson(*s).c_str());
        throw CLI::Success();
      },
      "Print these options (flag, kind, default, range, help) as JSON and exit");
  return s;
}

namespace {

// The job plan the serve's rank is part of (its notes printed).
Result<JobPlan> PlanServe(const std::string& tool, ServeRequest* r) {
  r->plan.nproc = r->local_world;
  if (const char* cvd = std::getenv("CUDA_VISIBLE_DEVICES")) r->plan.cuda_visible_devices = cvd;
  NL_ASSIGN_OR_RETURN(JobPlan job, MakeJobPlan(r->plan));
  for (const std::string& note : job.notes) {
    std::fprintf(stderr, "%s: %s\n", tool.c_str(), FlagText(note).c_str());
  }
  if (r->local_rank >= static_cast<int64_t>(job.plan.ranks.size())) {
    return Status::InvalidArgument("local rank " + std::to_string(r->local_rank) +
                                   " but the plan has " + std::to_string(job.plan.ranks.size()) +
                                   " local ranks (set --local-world-size or $LOCAL_WORLD_SIZE)");
  }
  return job;
}

// The rank's loader threads and, when the plan binds, this thread and the
// workers' start hook bound to its cores (`job` must outlive the service).
void PlaceServe(const JobPlan& job, ServeRequest* r) {
  PipelineConfig& pc = r->service.pipeline;
  const RankPlan& mine = job.plan.ranks[r->local_rank];
  pc.threads = r->threads ? r->threads
                          : std::max<uint32_t>(1, static_cast<uint32_t>(mine.loader_cpus.size()));
  if (job.plan.binds) {
    // The service's own threads (socket watcher, slot forwarding) stay on the
    // loader's cores too; the workers bind themselves as they start.
    const BindReport self = BindThisThread(job.topology, mine.loader_cpus, mine.mem_node);
    std::fprintf(stderr, "%s\n", AffinityLine(pc.rank, mine, self).c_str());
    pc.thread_start = LoaderThreadStartHook(job.topology, mine, pc.rank, nullptr);
  }
}

}  // namespace

int RunServe(const ServeFlags& flags) {
  const std::string tool = "loader serve";
  g_failure_fd = proc::TakeFailureFd(std::getenv(proc::kFailureFdVariable));
  Result<ServeRequest> request = FinishServeOptions(flags, &ProcessEnv);
  if (!request.ok()) return Fail(tool, request.status());
  const Result<JobPlan> job = PlanServe(tool, &*request);
  if (!job.ok()) return Fail(tool, job.status());
  PlaceServe(*job, &*request);
  ServiceConfig& service = request->service;
  const PipelineConfig& pc = service.pipeline;
  InstallStopHandlers();
  service.stop_signal = &g_signal;
  // The service's lines name options by their fields: written as flags here.
  service.log = [](const std::string& line) { std::fprintf(stderr, "%s\n", FlagText(line).c_str()); };
  service.on_listening = [&] {
    std::fprintf(stderr,
                 "%s: job %s, rank %d of %d: %u loader threads, %u slots of batch %u; waiting "
                 "for a consumer (loader consume --job-id %s --rank %d)\n",
                 tool.c_str(), service.job_id.c_str(), pc.rank, pc.world, pc.threads,
                 pc.prefetch, pc.batch_size, service.job_id.c_str(), pc.rank);
  };
  ServiceReport report;
  const Status st = RunService(service, &report);
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
  Add(c, opt::kJobId, &a->job_id);
  Add(c, opt::kRank, &a->rank);
  c->add_option("--batches", a->batches, "Batches to read (default: until the producer's end)")
      ->check(CLI::Range(uint64_t{0}, uint64_t{1} << 40));
  Add(c, opt::kTimeout, &a->timeout_s);
  Add(c, opt::kAttachTimeout, &a->attach_timeout_s);
  Add(c, opt::kStartEpoch, &a->start_epoch)->description("Ask for batches from this epoch on");
  Add(c, opt::kStartBatch, &a->start_batch)->description("... and this batch of it (with --start-epoch)");
  c->add_option("--dump", a->dump,
                "Write each batch's pixels, labels and indices (int64 LE), in order, to FILE");
  Add(c, opt::kJson, &a->json);
  return c;
}

namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// What a consumer has seen so far.
struct ConsumeState {
  uint64_t batches = 0, images = 0;
  double in_calls_s = 0;  // in Next and Release, less Next's waits for the producer
  bool have_prev = false;
  uint64_t prev_seq = 0, prev_epoch = 0, prev_batch = 0, first_epoch = 0, first_batch = 0;
  std::set<uint64_t> epochs;
  int rc = 0;
  std::string end_note;
};

// The next batch, in short waits so Ctrl-C is answered at once; the stuck
// report comes after --timeout (it counts from the producer's last batch).
Result<RingBatch> NextBatch(RingClient& c, double timeout_s, ConsumeState* s) {
  Result<RingBatch> b = Status::DeadlineExceeded("");
  const auto wait0 = Clock::now();
  while (g_signal.load() == 0) {
    const auto n0 = Clock::now();
    b = c.Next(0.2);
    const double call_s = SecondsSince(n0);
    s->in_calls_s += b.ok() ? std::max(0.0, call_s - b->wait_s) : 0.0;
    if (b.ok() || b.status().code() != StatusCode::kDeadlineExceeded) break;
    if (SecondsSince(wait0) >= timeout_s) break;
  }
  return b;
}

// What is wrong with a batch's metadata ("" when nothing): what a consumer relies on.
std::string CheckBatch(const RingBatch& b, const RingInfo& info, const ConsumeState& s,
                       bool seeked) {
  std::string wrong;
  if (s.have_prev && b.sequence != s.prev_seq + 1) wrong = "sequence does not follow";
  if (s.have_prev && !seeked) {
    const bool next_in_epoch = b.epoch == s.prev_epoch && b.batch == s.prev_batch + 1;
    const bool next_epoch = b.epoch == s.prev_epoch + 1 && b.batch == 0 &&
                            s.prev_batch + 1 == info.batches_per_epoch;
    if (!next_in_epoch && !next_epoch) wrong = "position does not follow the previous batch";
  }
  if (b.batch >= info.batches_per_epoch) wrong = "batch number past the epoch";
  if (b.size == 0 || b.size > info.geometry.batch_size) wrong = "size out of range";
  if (b.size != info.geometry.batch_size && b.batch + 1 != info.batches_per_epoch) {
    wrong = "a short batch that is not the epoch's last";
  }
  for (uint32_t i = 0; i < b.size && wrong.empty(); ++i) {
    if (b.labels[i] < 0) wrong = "negative label";
    if (b.indices[i] < 0) wrong = "negative sample index";
  }
  return wrong;
}

void Count(const RingBatch& b, ConsumeState* s) {
  if (!s->have_prev) {
    s->first_epoch = b.epoch;
    s->first_batch = b.batch;
  }
  s->have_prev = true;
  s->prev_seq = b.sequence;
  s->prev_epoch = b.epoch;
  s->prev_batch = b.batch;
  s->epochs.insert(b.epoch);
  ++s->batches;
  s->images += b.size;
}

void Dump(const RingBatch& b, uint64_t sample_bytes, std::ofstream* dump) {
  if (!dump->is_open()) return;
  dump->write(static_cast<const char*>(b.pixels), static_cast<std::streamsize>(b.size * sample_bytes));
  dump->write(reinterpret_cast<const char*>(b.labels), static_cast<std::streamsize>(b.size * 8));
  dump->write(reinterpret_cast<const char*>(b.indices), static_cast<std::streamsize>(b.size * 8));
}

// Reads, checks and releases batches until --batches, the producer's end,
// a signal or an error (s->rc, s->end_note).
void ConsumeBatches(const ConsumeArgs& a, const std::string& tool, RingClient& c,
                    std::ofstream* dump, ConsumeState* s) {
  const RingInfo& info = c.info();
  while (a.batches == 0 || s->batches < a.batches) {
    Result<RingBatch> b = NextBatch(c, a.timeout_s, s);
    if (g_signal.load() != 0) {
      s->end_note = std::string("stopped by ") + (g_signal.load() == SIGINT ? "SIGINT" : "SIGTERM");
      s->rc = 128 + g_signal.load();
      return;
    }
    if (!b.ok()) {
      if (b.status().code() == StatusCode::kOutOfRange) {
        s->end_note = "the producer's last epoch is out";
        return;
      }
      std::fprintf(stderr, "%s: error: %s\n", tool.c_str(), FlagText(b.status().ToString()).c_str());
      s->rc = b.status().code() == StatusCode::kDeadlineExceeded ? 2 : 1;
      return;
    }
    const std::string wrong = CheckBatch(*b, info, *s, a.start_epoch >= 0);
    if (!wrong.empty()) {
      std::fprintf(stderr,
                   "%s: error: batch %llu (epoch %llu, batch %llu, %u samples): %s (previous: "
                   "epoch %llu, batch %llu)\n",
                   tool.c_str(), static_cast<unsigned long long>(b->sequence),
                   static_cast<unsigned long long>(b->epoch),
                   static_cast<unsigned long long>(b->batch), b->size, wrong.c_str(),
                   static_cast<unsigned long long>(s->prev_epoch),
                   static_cast<unsigned long long>(s->prev_batch));
      s->rc = 1;
      return;
    }
    Count(*b, s);
    Dump(*b, info.geometry.sample_bytes, dump);
    const auto r0 = Clock::now();
    const Status rs = c.Release(*b);
    s->in_calls_s += SecondsSince(r0);
    if (!rs.ok()) {
      std::fprintf(stderr, "%s: error: %s\n", tool.c_str(), FlagText(rs.ToString()).c_str());
      s->rc = 1;
      return;
    }
  }
}

void PrintConsumed(const ConsumeArgs& a, int64_t rank, int producer_pid, const ConsumeState& s,
                   double secs) {
  // Time inside Next/Release per batch, less the time Next spent waiting for
  // the producer: what the ring itself costs the consumer.
  const double per_batch_us = s.batches ? s.in_calls_s / s.batches * 1e6 : 0;
  if (a.json) {
    nlohmann::json j;
    j["job_id"] = a.job_id;
    j["rank"] = rank;
    j["batches"] = s.batches;
    j["images"] = s.images;
    j["seconds"] = secs;
    j["images_per_s"] = secs > 0 ? s.images / secs : 0;
    j["batches_per_s"] = secs > 0 ? s.batches / secs : 0;
    j["per_batch_us"] = per_batch_us;
    j["first_epoch"] = s.first_epoch;
    j["first_batch"] = s.first_batch;
    j["last_epoch"] = s.prev_epoch;
    j["last_batch"] = s.prev_batch;
    j["epochs"] = std::vector<uint64_t>(s.epochs.begin(), s.epochs.end());
    j["producer_pid"] = producer_pid;
    if (!s.end_note.empty()) j["end"] = s.end_note;
    std::printf("%s\n", j.dump().c_str());
    return;
  }
  std::printf(
      "consumed %llu batches (%llu images) of job %s, rank %lld in %.2f s: %.0f images/s, "
      "%.1f batches/s; the ring cost %.1f us per batch%s%s\n",
      static_cast<unsigned long long>(s.batches), static_cast<unsigned long long>(s.images),
      a.job_id.c_str(), static_cast<long long>(rank), secs, secs > 0 ? s.images / secs : 0.0,
      secs > 0 ? s.batches / secs : 0.0, per_batch_us, s.end_note.empty() ? "" : "; ",
      s.end_note.c_str());
}

Status OpenDump(const std::string& path, std::ofstream* dump) {
  if (path.empty()) return Status::Ok();
  NL_RETURN_IF_ERROR(CreatePrivateFile(path));
  dump->open(path, std::ios::binary | std::ios::trunc);
  if (!*dump) return Status::FromErrno("opening --dump " + path, errno);
  return Status::Ok();
}

}  // namespace

int RunConsume(const ConsumeArgs& a) {
  const std::string tool = "loader consume";
  auto rank = FlagOrEnv(a.rank, opt::kRank, "RANK", 0, &ProcessEnv);
  if (!rank.ok()) return Fail(tool, rank.status());
  if (a.start_batch != 0 && a.start_epoch < 0) {
    return Fail(tool, Status::InvalidArgument("--start-batch needs --start-epoch"));
  }
  InstallStopHandlers();
  std::ofstream dump;
  if (Status s = OpenDump(a.dump, &dump); !s.ok()) return Fail(tool, s);
  auto client = RingClient::Attach(a.job_id, static_cast<int>(*rank), a.attach_timeout_s);
  if (!client.ok()) return Fail(tool, client.status());
  RingClient& c = **client;
  if (a.start_epoch >= 0) {
    const Status s = c.Seek(static_cast<uint64_t>(a.start_epoch), static_cast<uint64_t>(a.start_batch));
    if (!s.ok()) return Fail(tool, s);
  }
  ConsumeState state;
  const auto t0 = Clock::now();
  ConsumeBatches(a, tool, c, &dump, &state);
  const double secs = SecondsSince(t0);
  if (dump.is_open()) {
    dump.close();
    if (!dump) {
      std::fprintf(stderr, "%s: error: writing --dump %s failed\n", tool.c_str(), a.dump.c_str());
      state.rc = state.rc ? state.rc : 1;
    }
  }
  PrintConsumed(a, *rank, c.info().producer_pid, state, secs);
  return state.rc;
}

}  // namespace nl
