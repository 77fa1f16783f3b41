#include "trainer/rank.h"

#include <dirent.h>
#include <fcntl.h>
#include <netdb.h>
#include <sched.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/torch.h>
#if NL_TRAINER_CUDA
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <thread>

#include "base/file_util.h"
#include "formats/manifest.h"
#include "loader/pipeline/pipeline.h"
#include "loader/plan/affinity.h"
#include "loader/plan/cpu_list.h"
#include "loader/plan/job_plan.h"
#include "base/child_process.h"
#include "loader/ring/client.h"
#include "loader/ring/ring_socket.h"
#include "loader/staging/staging.h"
#include "trainer/diagnostics.h"
#include "trainer/models.h"
#include "trainer/preflight.h"
#include "trainer/progress.h"

namespace nl::trainer {
namespace {

using Clock = std::chrono::steady_clock;
namespace F = torch::nn::functional;

struct RankError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void Check(const Status& s, const std::string& what) {
  if (!s.ok()) throw RankError(what + ": " + s.ToString());
}
template <typename T>
T Take(Result<T> r, const std::string& what) {
  if (!r.ok()) throw RankError(what + ": " + r.status().ToString());
  return std::move(*r);
}

// Our launcher relays a rank's stderr through a pipe and says whether its own is a terminal.
bool StderrIsTerminal() {
  const char* v = std::getenv("NL_TRAINER_TTY");
  return v ? std::string(v) == "1" : isatty(2) != 0;
}

double Ms(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

std::string DirOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

std::string SelfDir() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? DirOf(std::string(buf, static_cast<size_t>(n))) : ".";
}

// The temporary file being written, removed by the handler of SIGTERM,
// SIGINT and SIGHUP before the signal ends the process (unlink is
// async-signal-safe): a job stopped mid-save leaves no half file behind.
char g_temp_path[4096];
std::atomic<bool> g_temp_active{false};

extern "C" void OnTerminatingSignal(int sig) {
  if (g_temp_active.load()) unlink(g_temp_path);
  signal(sig, SIG_DFL);
  raise(sig);
}

void InstallSignalHandlers() {
  struct sigaction sa {};
  sa.sa_handler = OnTerminatingSignal;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) {
    struct sigaction old {};
    sigaction(sig, nullptr, &old);
    if (old.sa_handler == SIG_IGN) continue;  // nohup: an ignored signal stays ignored
    sigaction(sig, &sa, nullptr);
  }
}

class TempFileGuard {
 public:
  explicit TempFileGuard(const std::string& path) {
    std::snprintf(g_temp_path, sizeof g_temp_path, "%s", path.c_str());
    g_temp_active.store(true);
  }
  ~TempFileGuard() { g_temp_active.store(false); }
  TempFileGuard(const TempFileGuard&) = delete;
  TempFileGuard& operator=(const TempFileGuard&) = delete;
};

// A rename over `path` must not replace a device or FIFO (a chart or
// checkpoint name that is one, made after the job's checks).
void CheckRenameTarget(const std::string& path) {
  struct stat st {};
  if (lstat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode) && !S_ISLNK(st.st_mode)) {
    throw RankError("will not replace " + path + ": it is not a regular file (a device, FIFO, socket or directory)");
  }
}

// Writes `bytes` to path atomically (a temporary beside it, then rename).
void WriteAtomically(const std::string& path, const std::string& bytes) {
  CheckRenameTarget(path);
  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  TempFileGuard guard(tmp);
  {
    if (nl::Status s = nl::CreatePrivateFile(tmp); !s.ok()) throw RankError(s.message());
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    f.flush();
    if (!f) {
      const int err = errno;
      std::remove(tmp.c_str());
      throw RankError("cannot write " + tmp + ": " + std::strerror(err));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw RankError("cannot rename " + tmp + " to " + path + ": " + std::strerror(errno));
  }
}

// ---------------------------------------------------------------------------
// Where batches come from.

struct Batch {
  torch::Tensor x;  // float32 [n, 3, S, S] on the device, normalised
  torch::Tensor y;  // int64 [n] on the device
  uint64_t epoch = 0, batch = 0;
  uint32_t size = 0;
};

class BatchSource {
 public:
  virtual ~BatchSource() = default;
  // Waits for the next batch; data_ms gets the wait.
  virtual Batch Next(double* data_ms) = 0;
  // The loader threads' process (for where they ran), 0: this one.
  virtual pid_t loader_pid() const = 0;
  // Stops the loader; the CPU seconds it spent (a service: its process's
  // user + system time; in process: the workers' read, decode and transform time).
  virtual double Finish() = 0;
};

struct Geometry {
  int ring_size = 224;   // side of the images the loader makes
  int model_size = 224;  // side the model sees
  torch::Device device = torch::kCPU;
};

torch::Tensor Normalize(torch::Tensor x, const Geometry& g) {
  if (g.ring_size != g.model_size) {
    x = F::interpolate(x, F::InterpolateFuncOptions()
                              .size(std::vector<int64_t>{g.model_size, g.model_size})
                              .mode(torch::kBilinear)
                              .align_corners(false));
  }
  static const float mean[3] = {0.485f, 0.456f, 0.406f}, stdv[3] = {0.229f, 0.224f, 0.225f};
  auto m = torch::tensor({mean[0] * 255, mean[1] * 255, mean[2] * 255}).view({1, 3, 1, 1});
  auto s = torch::tensor({stdv[0] * 255, stdv[1] * 255, stdv[2] * 255}).view({1, 3, 1, 1});
  return (x - m.to(g.device)) / s.to(g.device);
}

Batch FromHost(const void* pixels, const int64_t* labels, uint32_t n, const Geometry& g) {
  Batch b;
  auto u8 = torch::from_blob(const_cast<void*>(pixels), {n, 3, g.ring_size, g.ring_size},
                             torch::TensorOptions().dtype(torch::kUInt8));
  b.x = Normalize(u8.to(g.device, torch::kFloat32), g);
  b.y = torch::from_blob(const_cast<int64_t*>(labels), {n}, torch::TensorOptions().dtype(torch::kInt64))
            .to(g.device, /*non_blocking=*/false, /*copy=*/true);
  b.size = n;
  return b;
}

// What a loader service's log says about its end: its error lines when it
// has any (not its routine plan and progress lines), else its last lines.
std::string ServeLogSummary(int fd) {
  std::vector<std::string> errors = proc::LinesWith(fd, "error");
  if (errors.empty()) return proc::TailOf(fd, 3);
  if (errors.size() > 3) errors.erase(errors.begin(), errors.end() - 3);
  std::string out;
  for (const std::string& l : errors) out += (out.empty() ? "" : " | ") + l;
  return out;
}

std::string WithTail(const std::string& s, const std::string& tail) {
  return tail.empty() ? s : s + ": " + tail;
}

// A `loader serve` child and the ring it fills.
class ServiceSource : public BatchSource {
 public:
  // spawn_cpus: the cpus the service may plan on (the process's, not the
  // rank's own bound core, which a child would otherwise inherit); null: as is.
  ServiceSource(const std::vector<std::string>& args, const std::string& job, int rank,
                double timeout_s, const Geometry& g, double attach_limit_s, const cpu_set_t* spawn_cpus)
      : timeout_s_(timeout_s), g_(g) {
    log_ = Take(proc::MakeLogFd("loader-serve"), "cannot make a log for its loader service");
    cpu_set_t bound;
    const bool swap = spawn_cpus && sched_getaffinity(0, sizeof bound, &bound) == 0 &&
                      sched_setaffinity(0, sizeof *spawn_cpus, spawn_cpus) == 0;
    Result<proc::ChildProcess> started = proc::ChildProcess::Start(args, {}, log_.get(), log_.get());
    if (swap) sched_setaffinity(0, sizeof bound, &bound);
    serve_ = Take(std::move(started), "cannot start its loader service");
    pid_ = serve_.pid();
    const auto start = Clock::now();
    while (true) {
      proc::ChildExit e;
      if (serve_.Exited(&e)) {
        throw RankError(WithTail("its loader service (" + args[0] + " serve, pid " + std::to_string(pid_) +
                                     ") ended (" + e.Describe() + ") before the rank attached",
                                 ServeLogSummary(log_.get())));
      }
      Result<std::unique_ptr<RingClient>> c = RingClient::Attach(job, rank, 0.5);
      if (c.ok()) {
        client_ = std::move(*c);
        break;
      }
      if (c.status().code() != StatusCode::kDeadlineExceeded &&
          c.status().code() != StatusCode::kNotFound &&
          c.status().code() != StatusCode::kUnavailable) {
        Check(c.status(), "cannot attach to its loader service");
      }
      if (std::chrono::duration<double>(Clock::now() - start).count() > attach_limit_s) {
        char secs[32];
        std::snprintf(secs, sizeof secs, "%g", attach_limit_s);
        throw RankError(WithTail("its loader service (pid " + std::to_string(pid_) +
                                     ") did not open its ring within " + secs + " s (--timeout); it is " +
                                     ring::ProcessState(pid_),
                                 ServeLogSummary(log_.get())));
      }
    }
    StagingOptions so;
    so.cpu = !g.device.is_cuda();
    if (g.device.is_cuda()) so.device = g.device.index();
    stager_ = Take(Stager::Create(client_.get(), so), "cannot stage its ring");
  }

  ~ServiceSource() override { Finish(); }

  double Finish() override {
    stager_.reset();
    client_.reset();  // detaches: the service exits by itself
    if (serve_.pid() > 0) {
      Result<proc::ChildExit> e = serve_.WaitFor(10.0, "loader serve");
      if (e.ok()) {
        cpu_s_ = static_cast<double>(e->usage.ru_utime.tv_sec + e->usage.ru_stime.tv_sec) +
                 1e-6 * static_cast<double>(e->usage.ru_utime.tv_usec + e->usage.ru_stime.tv_usec);
      }
    }
    return cpu_s_;
  }

  Batch Next(double* data_ms) override {
    const auto t0 = Clock::now();
    Result<StagedBatch> r = stager_->Next(timeout_s_);
    *data_ms = Ms(t0, Clock::now());
    if (!r.ok()) {
      // A service that vanished: let it be reaped, then say how it ended.
      proc::ChildExit e;
      bool exited = serve_.Exited(&e);
      if (!exited && r.status().code() == StatusCode::kUnavailable) {
        const auto until = Clock::now() + std::chrono::seconds(2);
        while (!(exited = serve_.Exited(&e)) && Clock::now() < until) {
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
      }
      if (exited && WIFSIGNALED(e.status)) {
        // What it said before it died (its SIGBUS handler names the shard cut under it).
        throw RankError(WithTail("its loader service (pid " + std::to_string(pid_) + ") was " +
                                     e.Describe() + " while the rank waited for a batch",
                                 ServeLogSummary(log_.get())));
      }
      throw RankError("its loader service (pid " + std::to_string(pid_) + ")" +
                      (exited ? " (" + e.Describe() + ")" : "") + ": " + r.status().ToString());
    }
    const StagedBatch& s = *r;
    Batch b;
#if NL_TRAINER_CUDA
    if (s.on_device) {
      auto stream = c10::cuda::getCurrentCUDAStream(g_.device.index()).stream();
      cudaStreamWaitEvent(stream, static_cast<cudaEvent_t>(s.ready_event), 0);
      auto u8 = torch::from_blob(s.device_pixels, {s.host.size, 3, g_.ring_size, g_.ring_size},
                                 torch::TensorOptions().dtype(torch::kUInt8).device(g_.device));
      b.x = Normalize(u8.to(torch::kFloat32), g_);
      b.y = torch::from_blob(s.device_labels, {s.host.size},
                             torch::TensorOptions().dtype(torch::kInt64).device(g_.device))
                .clone();
      b.size = s.host.size;
      Check(stager_->Release(s, stream), "releasing a staged batch");
    } else
#endif
    {
      b = FromHost(s.host.pixels, s.host.labels, s.host.size, g_);
      Check(stager_->Release(s), "releasing a ring slot");
    }
    b.epoch = s.host.epoch;
    b.batch = s.host.batch;
    return b;
  }
  pid_t loader_pid() const override { return pid_; }

 private:
  double timeout_s_;
  Geometry g_;
  Fd log_;
  proc::ChildProcess serve_;
  pid_t pid_ = 0;
  double cpu_s_ = 0;
  std::unique_ptr<RingClient> client_;
  std::unique_ptr<Stager> stager_;
};

// The pipeline in this process (--loader inprocess).
class InprocessSource : public BatchSource {
 public:
  InprocessSource(const PipelineConfig& c, const Geometry& g, double delay_ms)
      : g_(g), delay_ms_(delay_ms) {
    pipeline_ = Take(Pipeline::Open(c), "cannot open its loader pipeline");
  }
  Batch Next(double* data_ms) override {
    const auto t0 = Clock::now();
    if (delay_ms_ > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(delay_ms_));
    Result<BatchView> v = pipeline_->Next();
    *data_ms = Ms(t0, Clock::now());
    if (!v.ok()) throw RankError("its loader pipeline: " + v.status().ToString());
    Batch b = FromHost(v->pixels, v->labels, v->size, g_);
    b.epoch = v->epoch;
    b.batch = v->batch;
    Check(pipeline_->Release(*v), "releasing a batch");
    return b;
  }
  pid_t loader_pid() const override { return 0; }
  double Finish() override {
    if (pipeline_) {
      const PipelineStats st = pipeline_->Stats();
      cpu_s_ = st.read_s + st.decode_s + st.transform_s;
      pipeline_.reset();
    }
    return cpu_s_;
  }

 private:
  Geometry g_;
  double delay_ms_;
  double cpu_s_ = 0;
  std::unique_ptr<Pipeline> pipeline_;
};

// The NUMA nodes on which a process's loader threads (named ldr-*) last ran.
uint64_t LoaderNodes(pid_t pid, const Topology& topo) {
  const std::string dir = "/proc/" + (pid > 0 ? std::to_string(pid) : std::string("self")) + "/task";
  DIR* d = opendir(dir.c_str());
  if (!d) return 0;
  uint64_t bits = 0;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream f(dir + "/" + e->d_name + "/stat");
    std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    const size_t open = s.find('('), close = s.rfind(')');
    if (open == std::string::npos || close == std::string::npos) continue;
    if (s.compare(open + 1, 4, "ldr-") != 0) continue;
    // Fields after the command: state is field 3; "processor" is field 39.
    std::istringstream rest(s.substr(close + 2));
    std::string field;
    int cpu = -1;
    for (int i = 3; i <= 39 && (rest >> field); ++i) {
      if (i == 39) cpu = std::atoi(field.c_str());
    }
    for (const NumaNode& n : topo.numa_nodes()) {
      if (n.os_index >= 0 && n.os_index < 64 &&
          std::find(n.pus.begin(), n.pus.end(), cpu) != n.pus.end()) {
        bits |= uint64_t{1} << n.os_index;
      }
    }
  }
  closedir(d);
  return bits;
}

// ---------------------------------------------------------------------------
// Collectives.

// Where each rank is, published to the store about once a second, so that a
// rank that gives up waiting in a collective can say which peer it waited
// for and what that peer was doing (or that it went silent: stopped, hung).
enum class Phase : int { kStarting, kData, kCompute, kComm, kEval, kCheckpoint, kDone };

const char* PhaseName(int p) {
  switch (static_cast<Phase>(p)) {
    case Phase::kStarting:
      return "starting";
    case Phase::kData:
      return "waiting for data from its loader";
    case Phase::kCompute:
      return "computing";
    case Phase::kComm:
      return "in a collective";
    case Phase::kEval:
      return "evaluating";
    case Phase::kCheckpoint:
      return "writing a checkpoint";
    case Phase::kDone:
      return "done";
  }
  return "unknown";
}

int64_t WallMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

struct StoreAddress {
  std::string host, prefix;
  int port = 0;
};

c10::intrusive_ptr<c10d::Store> ConnectStore(const StoreAddress& a, std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions so;
  so.port = static_cast<uint16_t>(a.port);
  so.isServer = false;
  so.waitWorkers = false;
  so.timeout = timeout;
  return c10::make_intrusive<c10d::PrefixStore>(a.prefix, c10::make_intrusive<c10d::TCPStore>(a.host, so));
}

class Heartbeat {
 public:
  Heartbeat(StoreAddress a, int rank, int world) : a_(std::move(a)), rank_(rank), world_(world) {
    thread_ = std::thread([this] { Loop(); });
  }
  ~Heartbeat() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void Set(Phase p, int64_t step) {
    step_.store(step);
    if (phase_.exchange(static_cast<int>(p)) != static_cast<int>(p)) since_.store(WallMs());
  }

  // The other ranks' last heartbeats, in words: who is behind or silent.
  // PeersNow with a deadline: the store lives in rank 0's process, which may
  // be the one that is stopped (a store call would then block for good).
  // *behind (if given) says whether some rank was silent or stuck outside a
  // collective (the text then names it).
  std::string Peers(bool* behind = nullptr) const {
    struct Answer {
      std::string text;
      bool behind = false;
    };
    auto result = std::make_shared<std::promise<Answer>>();
    std::future<Answer> f = result->get_future();
    if (behind) *behind = false;
    // The thread gets copies, not `this`: after a timeout it outlives the
    // Heartbeat (the rank unwinds while the store call still blocks).
    std::thread([a = a_, rank = rank_, world = world_, result] {
      Answer an;
      try {
        an.text = PeersNow(a, rank, world, &an.behind);
      } catch (...) {
        an.text = "the rendezvous store (hosted by rank 0) failed to answer";
      }
      result->set_value(an);
    }).detach();  // left behind only when rank 0's store hangs; this process is about to end
    if (f.wait_for(std::chrono::seconds(5)) != std::future_status::ready) {
      return "the rendezvous store (hosted by rank 0) does not answer within 5 s: rank 0 is stopped or hung";
    }
    Answer an = f.get();
    if (behind) *behind = an.behind;
    return an.text;
  }
  int rank() const { return rank_; }

 private:
  static std::string PeersNow(const StoreAddress& a, int self, int world, bool* behind) {
    c10::intrusive_ptr<c10d::Store> st;
    try {
      st = ConnectStore(a, std::chrono::milliseconds(3000));
    } catch (const std::exception&) {
      return "the rendezvous store (hosted by rank 0) does not answer: rank 0 is stopped, hung or gone";
    }
    const int64_t now = WallMs();
    std::string silent, waiting, others;
    try {
      for (int r = 0; r < world; ++r) {
        if (r == self) continue;
        const std::string key = "hb/" + std::to_string(r);
        if (!st->check({key})) {
          silent += (silent.empty() ? "" : "; ") + ("rank " + std::to_string(r) + " never sent one");
          continue;
        }
        const std::vector<uint8_t> v = st->get(key);
        long long step = 0, since = 0, at = 0;
        int phase = 0;
        if (std::sscanf(std::string(v.begin(), v.end()).c_str(), "%lld %d %lld %lld", &step, &phase, &since,
                        &at) != 4) {
          continue;
        }
        char buf[256];
        if (now - at > 3000) {
          std::snprintf(buf, sizeof buf, "rank %d silent for %.1f s (last: step %lld, %s)", r,
                        1e-3 * static_cast<double>(now - at), step, PhaseName(phase));
          silent += (silent.empty() ? "" : "; ") + std::string(buf);
        } else if (phase != static_cast<int>(Phase::kComm) && now - since > 2000) {
          std::snprintf(buf, sizeof buf, "rank %d %s for %.1f s (step %lld)", r, PhaseName(phase),
                        1e-3 * static_cast<double>(now - since), step);
          waiting += (waiting.empty() ? "" : "; ") + std::string(buf);
        }
      }
    } catch (const std::exception&) {
      return "the rendezvous store (hosted by rank 0) stopped answering: rank 0 is stopped, hung or gone";
    }
    *behind = !silent.empty() || !waiting.empty();
    if (!silent.empty()) return "no heartbeat from the rank it waits for: " + silent + (waiting.empty() ? "" : "; " + waiting);
    if (!waiting.empty()) return "the rank it waits for: " + waiting;
    return "every other rank still sends heartbeats and none is stuck outside a collective";
  }

  void Loop() {
    c10::intrusive_ptr<c10d::Store> st;
    std::unique_lock<std::mutex> l(mu_);
    while (!stop_) {
      l.unlock();
      try {
        if (!st) st = ConnectStore(a_, std::chrono::milliseconds(5000));
        const std::string v = std::to_string(step_.load()) + " " + std::to_string(phase_.load()) + " " +
                              std::to_string(since_.load()) + " " + std::to_string(WallMs());
        st->set("hb/" + std::to_string(rank_), std::vector<uint8_t>(v.begin(), v.end()));
      } catch (const std::exception&) {
        st.reset();  // the store is gone or slow: try again next time
      }
      l.lock();
      cv_.wait_for(l, std::chrono::seconds(1), [this] { return stop_; });
    }
  }

  StoreAddress a_;
  int rank_, world_;
  std::atomic<int64_t> step_{0}, since_{WallMs()};
  std::atomic<int> phase_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

class Comm {
 public:
  Comm(c10::intrusive_ptr<c10d::ProcessGroup> pg, int world, std::chrono::milliseconds timeout,
       const Heartbeat* hb)
      : pg_(std::move(pg)), world_(world), timeout_(timeout), hb_(hb) {}

  // Waits for a collective; a failure names the collective and, for a
  // timeout, the peer it waited for (from the heartbeats). Every such
  // message says "in a collective": the launcher counts it as an echo.
  void Wait(const c10::intrusive_ptr<c10d::Work>& w, const std::string& what) {
    try {
      w->wait(timeout_);
    } catch (const c10::Error& e) {
      Fail(e.what_without_backtrace(), what);
    } catch (const std::exception& e) {
      Fail(e.what(), what);
    }
  }
  void AllReduceSum(torch::Tensor& t, const std::string& what) {
    std::vector<torch::Tensor> v{t};
    Wait(pg_->allreduce(v), what);
  }
  void Broadcast(torch::Tensor& t, const std::string& what) {
    std::vector<torch::Tensor> v{t};
    c10d::BroadcastOptions o;
    o.rootRank = 0;
    Wait(pg_->broadcast(v, o), what);
  }
  // Broadcasts tensors from rank 0, flattened per dtype (one collective each).
  void BroadcastCoalesced(const std::vector<torch::Tensor>& ts, const std::string& what) {
    std::map<int, std::vector<torch::Tensor>> by_type;
    for (const auto& t : ts) by_type[static_cast<int>(t.scalar_type())].push_back(t);
    for (auto& [type, group] : by_type) {
      std::vector<torch::Tensor> flat;
      for (auto& t : group) flat.push_back(t.detach().reshape({-1}));
      torch::Tensor all = torch::cat(flat);
      Broadcast(all, what);
      int64_t off = 0;
      for (auto& t : group) {
        torch::NoGradGuard ng;
        t.copy_(all.narrow(0, off, t.numel()).view_as(t));
        off += t.numel();
      }
    }
  }
  int world() const { return world_; }
  c10d::ProcessGroup& pg() { return *pg_; }

 private:
  [[noreturn]] void Fail(std::string cause, const std::string& what) {
    const size_t nl = cause.find('\n');
    if (nl != std::string::npos) cause.erase(nl);
    const bool timeout = cause.find("imed out") != std::string::npos ||
                         cause.find("imeout") != std::string::npos;
    if (timeout) {
      char secs[32];
      std::snprintf(secs, sizeof secs, "%g", std::chrono::duration<double>(timeout_).count());
      throw RankError("waited " + std::string(secs) + " s (--timeout) in a collective (" + what +
                      ") for a peer that did not come: " +
                      (hb_ ? hb_->Peers() : std::string("no heartbeats to tell which")) + " [" + cause + "]");
    }
    // The peer is gone. Rank 0 hosts the store, so it can still read the
    // heartbeats at once: a peer that gave up waiting for its data (and
    // closed the connection first) is named, not only "connection closed".
    // (Another rank would wait for a store that may be gone with rank 0.)
    std::string last;
    if (hb_ && hb_->rank() == 0) {
      bool behind = false;
      const std::string peers = hb_->Peers(&behind);
      if (behind) last = "; before that, " + peers;
    }
    throw RankError("lost a peer in a collective (" + what + "): " + cause + last);
  }

  c10::intrusive_ptr<c10d::ProcessGroup> pg_;
  int world_;
  std::chrono::milliseconds timeout_;
  const Heartbeat* hb_;
};

// Gradient averaging in buckets of about 25 MB (reverse parameter order, as
// DDP fills them during backward), one all-reduce per bucket.
class GradReducer {
 public:
  GradReducer(const std::vector<torch::Tensor>& params, int64_t bucket_bytes) {
    std::vector<torch::Tensor> bucket;
    int64_t bytes = 0;
    for (auto it = params.rbegin(); it != params.rend(); ++it) {
      const int64_t b = it->numel() * static_cast<int64_t>(it->element_size());
      if (!bucket.empty() && bytes + b > bucket_bytes) {
        buckets_.push_back(bucket);
        bucket.clear();
        bytes = 0;
      }
      bucket.push_back(*it);
      bytes += b;
    }
    if (!bucket.empty()) buckets_.push_back(bucket);
  }
  size_t buckets() const { return buckets_.size(); }

  void Reduce(Comm& comm, const std::string& what) {
    if (comm.world() == 1) return;
    std::vector<torch::Tensor> flats;
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    for (auto& bucket : buckets_) {
      std::vector<torch::Tensor> parts;
      for (auto& p : bucket) {
        if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
        parts.push_back(p.grad().reshape({-1}));
      }
      flats.push_back(torch::cat(parts));
      std::vector<torch::Tensor> v{flats.back()};
      works.push_back(comm.pg().allreduce(v));
    }
    for (size_t i = 0; i < works.size(); ++i) {
      comm.Wait(works[i], what);
      flats[i].div_(comm.world());
      int64_t off = 0;
      for (auto& p : buckets_[i]) {
        p.mutable_grad().copy_(flats[i].narrow(0, off, p.numel()).view_as(p));
        off += p.numel();
      }
    }
  }

 private:
  std::vector<std::vector<torch::Tensor>> buckets_;
};

// ---------------------------------------------------------------------------
// Timings of a window of steps.

struct Window {
  std::vector<double> data, compute, comm, step;
  double loss_sum = 0;
  int64_t images = 0;
  void Add(double d, double c, double m, double s, double loss, int64_t n) {
    data.push_back(d);
    compute.push_back(c);
    comm.push_back(m);
    step.push_back(s);
    loss_sum += loss;
    images += n;
  }
  void Clear() { *this = Window(); }
  int64_t steps() const { return static_cast<int64_t>(step.size()); }
};

constexpr int kFields = 12;

// Every rank's window, gathered (an all-reduce of a [world, kFields] table).
std::vector<RankTiming> Gather(Comm& comm, int rank, const Window& w, uint64_t ran_on) {
  torch::Tensor t = torch::zeros({comm.world(), kFields}, torch::kFloat64);
  const Summary d = Summarize(w.data), c = Summarize(w.compute), m = Summarize(w.comm),
                s = Summarize(w.step);
  double step_sum = 0;
  for (double x : w.step) step_sum += x;
  const double row[kFields] = {d.mean, d.p95, c.mean, c.p95, m.mean, m.p95, s.mean, s.p95,
                               step_sum > 0 ? 1000.0 * static_cast<double>(w.images) / step_sum : 0,
                               w.steps() ? w.loss_sum / static_cast<double>(w.steps()) : 0,
                               static_cast<double>(w.steps()), static_cast<double>(ran_on)};
  for (int k = 0; k < kFields; ++k) t[rank][k] = row[k];
  comm.AllReduceSum(t, "the gathering of the timing report");
  auto a = t.accessor<double, 2>();
  std::vector<RankTiming> out;
  for (int r = 0; r < comm.world(); ++r) {
    RankTiming x;
    x.rank = r;
    x.data_ms = {a[r][0], a[r][1]};
    x.compute_ms = {a[r][2], a[r][3]};
    x.comm_ms = {a[r][4], a[r][5]};
    x.step_ms = {a[r][6], a[r][7]};
    x.images_per_s = a[r][8];
    x.loss = a[r][9];
    x.steps = static_cast<int64_t>(a[r][10]);
    x.ran_on_nodes = static_cast<uint64_t>(a[r][11]);
    out.push_back(x);
  }
  return out;
}

double LearningRate(const Options& o, int64_t step, int64_t total, int64_t warmup) {
  if (warmup > 0 && step < warmup) return o.lr * static_cast<double>(step + 1) / static_cast<double>(warmup);
  const double span = static_cast<double>(std::max<int64_t>(1, total - warmup));
  const double t = std::min(1.0, static_cast<double>(step - warmup) / span);
  return o.lr * 0.5 * (1.0 + std::cos(M_PI * t));
}

uint64_t ParamHash(Net& model) {
  uint64_t h = 1469598103934665603ull;
  for (const auto& p : model.parameters()) {
    torch::Tensor c = p.detach().to(torch::kCPU).contiguous();
    const auto* bytes = static_cast<const unsigned char*>(c.data_ptr());
    const size_t n = static_cast<size_t>(c.numel()) * c.element_size();
    for (size_t i = 0; i < n; ++i) h = (h ^ bytes[i]) * 1099511628211ull;
  }
  return h;
}

struct Checkpoint {
  int64_t epoch = 0, batch = 0, step = 0, seed = 0, world = 0, batch_size = 0;
  // What it fits: the model and the data set it was trained on.
  std::string model;
  int64_t classes = 0, train_samples = 0;
};

void SaveCheckpoint(const std::string& path, Net& model, torch::optim::SGD& opt, const Checkpoint& c) {
  torch::serialize::OutputArchive a, m, o;
  model.save(m);
  opt.save(o);
  a.write("model", m);
  a.write("optimizer", o);
  a.write("epoch", torch::tensor(c.epoch));
  a.write("batch", torch::tensor(c.batch));
  a.write("step", torch::tensor(c.step));
  a.write("seed", torch::tensor(c.seed));
  a.write("world", torch::tensor(c.world));
  a.write("batch_size", torch::tensor(c.batch_size));
  a.write("model_name", c10::IValue(c.model));
  a.write("num_classes", torch::tensor(c.classes));
  a.write("train_samples", torch::tensor(c.train_samples));
  CheckRenameTarget(path);
  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  TempFileGuard guard(tmp);
  // Serialised in memory, then written here: LibTorch's file writer throws
  // from its destructor on a short write (a full disk), which aborts.
  std::ostringstream buf;
  a.save_to(buf);
  const std::string bytes = buf.str();
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) throw RankError("cannot create the checkpoint " + tmp + ": " + std::strerror(errno));
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t w = write(fd, bytes.data() + done, bytes.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const int err = w < 0 ? errno : ENOSPC;
      close(fd);
      std::remove(tmp.c_str());
      throw RankError("cannot write the checkpoint " + tmp + ": " + std::strerror(err));
    }
    done += static_cast<size_t>(w);
  }
  if (fsync(fd) != 0 || close(fd) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    throw RankError("cannot write the checkpoint " + tmp + ": " + std::strerror(err));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw RankError("cannot rename " + tmp + " to " + path + ": " + std::strerror(errno));
  }
}

std::string ShapeText(const torch::Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "]";
}

// Loads a checkpoint after checking it fits `expect` (model, classes, data
// set size, ranks and batch size: the sample order and the tensors' shapes
// depend on them); every tensor's shape is checked after the load too.
Checkpoint LoadCheckpoint(const std::string& path, Net& model, torch::optim::SGD& opt, const Checkpoint& expect) {
  torch::serialize::InputArchive a, m, o;
  Checkpoint c;
  auto get = [&](const char* k) {
    torch::Tensor t;
    if (!a.try_read(k, t) || t.numel() != 1) {
      throw RankError("cannot resume from " + path + ": it has no " + k +
                      " (not a checkpoint of this trainer, or one from an older version)");
    }
    return t.item<int64_t>();
  };
  try {
    a.load_from(path);
    c.epoch = get("epoch");
    c.batch = get("batch");
    c.step = get("step");
    c.seed = get("seed");
    c.world = get("world");
    c.batch_size = get("batch_size");
    c.classes = get("num_classes");
    c.train_samples = get("train_samples");
    c10::IValue name;
    if (!a.try_read("model_name", name) || !name.isString()) {
      throw RankError("cannot resume from " + path + ": it has no model name (not a checkpoint of this "
                      "trainer, or one from an older version)");
    }
    c.model = name.toStringRef();
  } catch (const c10::Error& e) {
    throw RankError("cannot resume from " + path + ": " + e.what_without_backtrace());
  }
  const std::string from = "the checkpoint " + path + " was written for ";
  if (c.model != expect.model) {
    throw RankError(from + "--model " + c.model + "; this run has --model " + expect.model);
  }
  if (c.classes != expect.classes || c.train_samples != expect.train_samples) {
    throw RankError(from + "a data set of " + std::to_string(c.classes) + " classes and " +
                    std::to_string(c.train_samples) + " training samples; --data has " +
                    std::to_string(expect.classes) + " and " + std::to_string(expect.train_samples) +
                    " (resume on the data set it was trained on)");
  }
  if (c.world != expect.world || c.batch_size != expect.batch_size) {
    throw RankError(from + std::to_string(c.world) + " ranks of batch " + std::to_string(c.batch_size) +
                    "; this run has " + std::to_string(expect.world) + " of " +
                    std::to_string(expect.batch_size) +
                    " (the sample order would differ): resume with the same ranks and batch size");
  }
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
  for (const auto& p : model.named_parameters()) shapes.push_back({p.key(), p.value().sizes().vec()});
  for (const auto& b : model.named_buffers()) shapes.push_back({b.key(), b.value().sizes().vec()});
  try {
    a.read("model", m);
    model.load(m);
    a.read("optimizer", o);
    opt.load(o);
  } catch (const c10::Error& e) {
    throw RankError("cannot resume from " + path + ": " + e.what_without_backtrace());
  }
  size_t i = 0;
  auto check = [&](const std::string& key, const torch::Tensor& t) {
    if (i < shapes.size() && shapes[i].first == key && t.sizes().vec() != shapes[i].second) {
      throw RankError("cannot resume from " + path + ": its " + key + " is " + ShapeText(t) +
                      ", which does not fit this model");
    }
    ++i;
  };
  for (const auto& p : model.named_parameters()) check(p.key(), p.value());
  for (const auto& b : model.named_buffers()) check(b.key(), b.value());
  return c;
}

// The rank's binding as the table shows it (exchanged through the store).
nlohmann::json BindingJson(const RankBinding& b) {
  return {{"rank", b.rank},          {"host", b.host},
          {"loader_cpus", b.loader_cpus}, {"loader_node", b.loader_node},
          {"planned_node", b.planned_node}, {"gpu", b.gpu},
          {"gpu_node", b.gpu_node},  {"loader_threads", b.loader_threads},
          {"misbound", b.misbound},  {"simulated_delay_ms", b.simulated_delay_ms}};
}
RankBinding BindingFrom(const nlohmann::json& j) {
  RankBinding b;
  b.rank = j.at("rank");
  b.host = j.at("host");
  b.loader_cpus = j.at("loader_cpus");
  b.loader_node = j.at("loader_node");
  b.planned_node = j.at("planned_node");
  b.gpu = j.at("gpu");
  b.gpu_node = j.at("gpu_node");
  b.loader_threads = j.at("loader_threads");
  b.misbound = j.at("misbound");
  b.simulated_delay_ms = j.at("simulated_delay_ms");
  return b;
}

// ---------------------------------------------------------------------------

class Rank {
 public:
  Rank(const Options& o, const Placement& p) : o_(o), p_(p) {}
  int Run();

 private:
  void Log(const std::string& s) const {
    std::fprintf(stderr, "[rank %d] %s\n", p_.rank, s.c_str());
    std::fflush(stderr);
  }
  void Say(const std::string& s) const {  // rank 0's report lines
    std::printf("%s\n", s.c_str());
    std::fflush(stdout);
  }
  void Plan();
  PipelineConfig InprocessConfig(const std::string& split) const;
  void StartLoader(uint64_t start_epoch, uint64_t start_batch);
  void Rendezvous();
  void Join(const std::string& where, const char* secs);
  void CreateProcessGroup();
  void Report(int64_t epoch, int64_t step, const Window& w, bool epoch_end, int* straggler);
  std::pair<double, double> Evaluate();
  void WriteMetrics(const std::string& lines);
  void RemoveStaleTemporaries() const;

  Options o_;
  Placement p_;
  JobPlan job_;
  RankPlan mine_, loader_plan_;
  Geometry g_;
  Manifest manifest_;
  uint64_t train_samples_ = 0;
  std::unique_ptr<BatchSource> source_;
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::ProcessGroup> pg_;
  std::unique_ptr<Comm> comm_;
  std::chrono::milliseconds timeout_{300000};
  std::vector<RankBinding> bindings_;
  std::vector<int> previous_stragglers_;
  std::shared_ptr<Net> model_;
  std::FILE* metrics_ = nullptr;
  uint64_t bpe_ = 0;
  cpu_set_t process_cpus_;  // before the rank bound itself: where its loader service may plan
  bool have_process_cpus_ = false;
  OutputLock lock_;  // rank 0 outside our launcher (which holds it otherwise)
  StoreAddress store_address_;
  std::unique_ptr<Heartbeat> hb_;
  Checkpoint Describe(int64_t epoch, int64_t batch, int64_t step) const {
    Checkpoint c;
    c.epoch = epoch;
    c.batch = batch;
    c.step = step;
    c.seed = static_cast<int64_t>(o_.seed);
    c.world = p_.world;
    c.batch_size = o_.batch_size;
    c.model = o_.model;
    c.classes = static_cast<int64_t>(manifest_.classes.size());
    c.train_samples = static_cast<int64_t>(train_samples_);
    return c;
  }
  void SetPhase(Phase ph, int64_t step) {
    if (hb_) hb_->Set(ph, step);
  }
  void Save(const Checkpoint& c) {
    SetPhase(Phase::kCheckpoint, c.step);
    SaveCheckpoint(o_.out + "/checkpoint.pt", *model_, *opt_, c);
  }
  torch::optim::SGD* opt_ = nullptr;
};

void Rank::Plan() {
  JobPlanRequest rq = PlanRequest(o_, p_.local_world);
  job_ = Take(MakeJobPlan(rq), "cannot plan the binding");
  if (p_.local_rank >= static_cast<int>(job_.plan.ranks.size())) {
    throw RankError("the plan has " + std::to_string(job_.plan.ranks.size()) +
                    " local ranks; this is local rank " + std::to_string(p_.local_rank));
  }
  mine_ = job_.plan.ranks[static_cast<size_t>(p_.local_rank)];
  loader_plan_ = mine_;
  if (o_.misbind_rank == p_.rank) {
    if (!job_.plan.binds) throw RankError("--misbind-rank needs a binding plan (not --no-bind)");
    int wrong = -1;
    for (const NumaNode& n : job_.topology.numa_nodes()) {
      if (n.os_index != mine_.numa_node && !n.pus.empty()) {
        wrong = n.os_index;
        break;
      }
    }
    if (wrong < 0) {
      throw RankError("--misbind-rank " + std::to_string(p_.rank) + ": this machine has " +
                      std::to_string(job_.topology.numa_nodes().size()) +
                      " NUMA node(s) with cpus, so there is no wrong node to bind to");
    }
    std::string nodes;
    for (size_t i = 0; i < job_.plan.ranks.size(); ++i) {
      const int n = static_cast<int>(i) == p_.local_rank ? wrong : job_.plan.ranks[i].numa_node;
      nodes += (i ? "," : "") + std::to_string(std::max(0, n));
    }
    rq.numa_node = nodes;
    rq.allow_shared_cores = true;
    JobPlan bad = Take(MakeJobPlan(rq), "cannot plan the misbinding");
    loader_plan_ = bad.plan.ranks[static_cast<size_t>(p_.local_rank)];
    o_.numa_node = nodes;
    o_.allow_shared_cores = true;
  }
  have_process_cpus_ = sched_getaffinity(0, sizeof process_cpus_, &process_cpus_) == 0;
  if (job_.plan.binds && !mine_.trainer_cpus.empty()) {
    const BindReport r = BindThisThread(job_.topology, mine_.trainer_cpus, mine_.mem_node);
    (void)r;
  }
  int threads = o_.threads;
  if (threads <= 0) {
    threads = job_.plan.binds && !mine_.trainer_cpus.empty()
                  ? static_cast<int>(mine_.trainer_cpus.size())
                  : std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / p_.local_world);
  }
  torch::set_num_threads(threads);
}

PipelineConfig Rank::InprocessConfig(const std::string& split) const {
  PipelineConfig c;
  c.data_dir = o_.data;
  c.split = split;
  c.rank = p_.rank;
  c.world = p_.world;
  c.batch_size = o_.batch_size;
  c.threads = o_.loader_threads ? o_.loader_threads
                                : static_cast<uint32_t>(std::max<size_t>(1, loader_plan_.loader_cpus.size()));
  c.transform.image_size = g_.ring_size;
  if (job_.plan.binds) c.thread_start = LoaderThreadStartHook(job_.topology, loader_plan_, p_.rank, nullptr);
  return c;
}

void Rank::StartLoader(uint64_t start_epoch, uint64_t start_batch) {
  const bool delay = o_.simulate_slow_rank == p_.rank && o_.delay_ms > 0;
  if (o_.loader == "inprocess") {
    PipelineConfig c = InprocessConfig("train");
    c.prefetch = o_.prefetch;
    c.seed = o_.seed;
    c.start_epoch = start_epoch;
    c.start_batch = start_batch;
    c.epochs = static_cast<uint64_t>(o_.epochs) - start_epoch;
    c.transform.train = o_.augment;
    c.transform.pad_crop = o_.augment ? 4 : 0;
    c.transform.seed = o_.seed;
    source_ = std::make_unique<InprocessSource>(c, g_, delay ? o_.delay_ms : 0);
    return;
  }
  const std::string bin = o_.loader_bin.empty() ? SelfDir() + "/loader" : o_.loader_bin;
  if (access(bin.c_str(), X_OK) != 0) {
    throw RankError("no loader executable at " + bin +
                    " (build the `loader` target, or give --loader-bin)");
  }
  std::vector<std::string> a = {bin, "serve", "--data", o_.data, "--split", "train",
                                "--batch-size", std::to_string(o_.batch_size),
                                "--prefetch", std::to_string(o_.prefetch),
                                "--seed", std::to_string(o_.seed),
                                "--job-id", p_.job_id,
                                "--rank", std::to_string(p_.rank),
                                "--world-size", std::to_string(p_.world),
                                "--local-rank", std::to_string(p_.local_rank),
                                "--local-world-size", std::to_string(p_.local_world),
                                "--epochs", std::to_string(o_.epochs - static_cast<int>(start_epoch)),
                                "--start-epoch", std::to_string(start_epoch),
                                "--start-batch", std::to_string(start_batch),
                                "--image-size", std::to_string(g_.ring_size),
                                "--trainer-cores", std::to_string(o_.trainer_cores),
                                "--attach-timeout", "120"};
  if (o_.augment) {
    for (const char* x : {"--augment", "--pad-crop", "4"}) a.push_back(x);
  }
  if (o_.loader_threads) {
    a.push_back("--threads");
    a.push_back(std::to_string(o_.loader_threads));
  }
  auto flag = [&](const char* name, const std::string& v) {
    if (!v.empty()) {
      a.push_back(name);
      a.push_back(v);
    }
  };
  flag("--gpus", o_.gpus);
  flag("--numa-node", o_.numa_node);
  flag("--cpu-affinity", o_.cpu_affinity);
  if (o_.allow_shared_cores) a.push_back("--allow-shared-cores");
  if (o_.ignore_gpus) a.push_back("--ignore-gpus");
  if (o_.no_bind) a.push_back("--no-bind");
  if (delay) {
    a.push_back("--simulate-delay-ms");
    a.push_back(std::to_string(o_.delay_ms));
  }
  source_ = std::make_unique<ServiceSource>(a, p_.job_id, p_.rank, o_.timeout_s, g_, o_.timeout_s,
                                            have_process_cpus_ ? &process_cpus_ : nullptr);
}

void Rank::Rendezvous() {
  const std::string where = p_.master_addr + ":" + std::to_string(p_.master_port);
  char secs[32];
  std::snprintf(secs, sizeof secs, "%g", o_.timeout_s);
  // A name that does not resolve fails now, not after --timeout of retries.
  {
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    const int rc = getaddrinfo(p_.master_addr.c_str(), nullptr, &hints, &res);
    if (rc != 0) {
      throw RankError("cannot resolve MASTER_ADDR " + p_.master_addr + " (--master-addr): " + gai_strerror(rc));
    }
    freeaddrinfo(res);
  }
  c10d::TCPStoreOptions so;
  so.port = static_cast<uint16_t>(p_.master_port);
  so.isServer = p_.rank == 0 && !p_.agent_store;
  so.numWorkers = p_.agent_store ? c10::nullopt : c10::optional<std::size_t>(p_.world);
  so.waitWorkers = false;
  so.timeout = timeout_;
  c10::intrusive_ptr<c10d::Store> tcp;
  try {
    tcp = c10::make_intrusive<c10d::TCPStore>(p_.master_addr, so);
  } catch (const std::exception& e) {
    throw RankError(so.isServer ? "cannot host the rendezvous store on port " +
                                      std::to_string(p_.master_port) +
                                      " (another job may be using it: pick another --master-port): " +
                                      e.what()
                                : "cannot reach the rendezvous store at " + where + " within " + secs +
                                      " s (rank 0 hosts it: is it running, with this MASTER_ADDR and "
                                      "MASTER_PORT?): " + e.what());
  }
  // torchrun's agent store outlives a restart of the workers: each attempt its own keys.
  const char* restart = std::getenv("TORCHELASTIC_RESTART_COUNT");
  store_address_ = {p_.master_addr, std::string("nl_trainer") + (restart && *restart ? std::string("/") + restart : ""),
                    p_.master_port};
  store_ = c10::make_intrusive<c10d::PrefixStore>(store_address_.prefix, tcp);

  // Everyone joins: one process per rank, all of one WORLD_SIZE, all there.
  try {
    Join(where, secs);
  } catch (const RankError&) {
    throw;
  } catch (const std::exception& e) {
    throw RankError("lost the rendezvous store at " + where + " during the rendezvous (rank 0 hosts it: it "
                    "has ended or stopped; its own error says why): " + e.what());
  }
  hb_ = std::make_unique<Heartbeat>(store_address_, p_.rank, p_.world);
  CreateProcessGroup();
}

// Each rank publishes its WORLD_SIZE under world/RANK; a rank is there once
// that key is. A rank other than 0 compares rank 0's WORLD_SIZE with its own
// before it publishes: rank 0 can only find a mismatch, and end the store with
// its exit, once the other rank has found it too, so both name it.
void Rank::Join(const std::string& where, const char* secs) {
  const std::string me = std::to_string(p_.rank);
  const std::string world = std::to_string(p_.world);
  if (store_->add("join/" + me, 1) > 1) {
    throw RankError("rank " + me + " joined the rendezvous at " + where +
                    " twice: two processes were started with RANK=" + me +
                    " (each needs its own), or that address is not this job's store");
  }
  auto world_of = [&](int r) {
    const std::vector<uint8_t> v = store_->get("world/" + std::to_string(r));
    return std::string(v.begin(), v.end());
  };
  auto wait_for = [&](const std::vector<int>& ranks) {
    std::vector<std::string> keys;
    for (int r : ranks) keys.push_back("world/" + std::to_string(r));
    try {
      store_->wait(keys, timeout_);
    } catch (const std::exception& e) {
      std::vector<int> missing;
      for (int r : ranks) {
        try {
          if (!store_->check({"world/" + std::to_string(r)})) missing.push_back(r);
        } catch (const std::exception&) {
          throw RankError("lost the rendezvous store at " + where + " (rank 0 hosts it: it is gone)");
        }
      }
      std::string list;
      for (size_t i = 0; i < missing.size(); ++i) {
        list += (i ? (i + 1 == missing.size() ? " and " : ", ") : "") + std::to_string(missing[i]);
      }
      throw RankError("waited " + std::string(secs) + " s at the rendezvous " + where + " for rank" +
                      (missing.size() > 1 ? "s " : " ") + list + " of " + world +
                      ": are they started, with the same MASTER_ADDR, MASTER_PORT and WORLD_SIZE?");
    }
  };
  std::string w0 = world;
  if (p_.rank != 0) {
    wait_for({0});
    w0 = world_of(0);
  }
  store_->set("world/" + me, std::vector<uint8_t>(world.begin(), world.end()));
  if (w0 != world) {
    throw RankError("this rank has WORLD_SIZE=" + world + " but rank 0 has WORLD_SIZE=" + w0 +
                    ": start every rank of a job with the same WORLD_SIZE");
  }
  std::vector<int> all;
  for (int r = 0; r < p_.world; ++r) all.push_back(r);
  wait_for(all);
  if (p_.rank == 0) {
    for (int r = 1; r < p_.world; ++r) {
      const std::string w = world_of(r);
      if (w != world) {
        throw RankError("rank " + std::to_string(r) + " has WORLD_SIZE=" + w + " but this rank (0) has " + world +
                        ": start every rank of a job with the same WORLD_SIZE");
      }
    }
  }
}

void Rank::CreateProcessGroup() {
  auto pg_store = c10::make_intrusive<c10d::PrefixStore>("pg", store_);
#if NL_TRAINER_CUDA
  if (g_.device.is_cuda()) {
    auto opts = c10d::ProcessGroupNCCL::Options::create();
    opts->timeout = timeout_;
    pg_ = c10::make_intrusive<c10d::ProcessGroupNCCL>(pg_store, p_.rank, p_.world, opts);
  } else
#endif
  {
    auto opts = c10d::ProcessGroupGloo::Options::create(timeout_);
    const bool loopback = p_.master_addr == "localhost" || p_.master_addr.rfind("127.", 0) == 0;
    if (std::getenv("GLOO_SOCKET_IFNAME")) {
      opts->devices.push_back(
          c10d::ProcessGroupGloo::createDeviceForInterface(std::getenv("GLOO_SOCKET_IFNAME")));
    } else if (loopback) {
      opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
    } else {
      opts->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    }
    pg_ = c10::make_intrusive<c10d::ProcessGroupGloo>(pg_store, p_.rank, p_.world, opts);
  }
  comm_ = std::make_unique<Comm>(pg_, p_.world, timeout_, hb_.get());
}

// Temporaries a killed job left in --out (kill -9 mid-save): with the
// outputs locked, none can belong to a running job.
void Rank::RemoveStaleTemporaries() const {
  if (o_.out.empty()) return;
  DIR* d = opendir(o_.out.c_str());
  if (!d) return;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    const size_t at = name.rfind(".tmp.");
    if (at == std::string::npos || at + 5 >= name.size()) continue;
    if (name.find_first_not_of("0123456789", at + 5) != std::string::npos) continue;
    const std::string base = name.substr(0, at);
    if (base == "checkpoint.pt" || (base.rfind("timing-epoch-", 0) == 0 && base.size() > 4 &&
                                    base.compare(base.size() - 4, 4, ".svg") == 0)) {
      if (unlinkat(dirfd(d), name.c_str(), 0) == 0) Log("removed " + o_.out + "/" + name + ", left by a job that was killed");
    }
  }
  closedir(d);
}

void Rank::WriteMetrics(const std::string& lines) {
  if (!metrics_) return;
  if (std::fputs(lines.c_str(), metrics_) < 0 || std::fflush(metrics_) != 0) {
    throw RankError("cannot write --metrics-out " + o_.metrics_out + ": " + std::strerror(errno));
  }
}

void Rank::Report(int64_t epoch, int64_t step, const Window& w, bool epoch_end, int* straggler) {
  const uint64_t ran = job_.plan.binds ? LoaderNodes(source_->loader_pid(), job_.topology) : 0;
  std::vector<RankTiming> t = Gather(*comm_, p_.rank, w, ran);
  if (p_.rank != 0) return;
  const Verdict v = Diagnose(t, bindings_, previous_stragglers_);
  if (epoch_end) previous_stragglers_.push_back(v.straggler);
  if (straggler) *straggler = v.straggler;
  if (!epoch_end && StderrIsTerminal()) {  // below the progress bar's line, not on it
    std::fputc('\n', stderr);
    std::fflush(stderr);
  }
  Say(std::string(epoch_end ? "== epoch " + std::to_string(epoch) + " (whole epoch)"
                            : "== epoch " + std::to_string(epoch) + ", step " + std::to_string(step)) +
      ": per-rank time per step (ms)");
  std::string table = FormatTable(t, bindings_);
  if (!table.empty() && table.back() == '\n') table.pop_back();
  Say(table);
  if (v.straggler >= 0) {
    Say("straggler: " + v.sentence);
    if (!v.waiting.empty()) Say("straggler: " + v.waiting);
  } else if (p_.world > 1) {
    Say("straggler: none (no rank's data wait stands out: the rule is more than 2x the others' "
        "median and over 10% of its step)");
  }
  WriteMetrics(ReportJsonLines(epoch, step, t));
  if (epoch_end) {
    std::string dir = !o_.metrics_out.empty() ? DirOf(o_.metrics_out) : o_.out;
    if (!dir.empty()) {
      const std::string path = dir + "/timing-epoch-" + std::to_string(epoch) + ".svg";
      WriteAtomically(path, ChartSvg("Epoch " + std::to_string(epoch) +
                                         ": where each rank's step time went",
                                     t, v.straggler));
      Say("chart: " + path);
    }
  }
}

std::pair<double, double> Rank::Evaluate() {
  const SplitInfo* split = manifest_.FindSplit(o_.eval_split);
  if (!split) return {-1, -1};
  PipelineConfig c = InprocessConfig(o_.eval_split);
  c.prefetch = 2;
  c.shuffle = false;
  c.epochs = 1;
  c.transform.train = false;
  std::unique_ptr<Pipeline> pipe = Take(Pipeline::Open(c), "cannot open the " + o_.eval_split + " split");
  torch::NoGradGuard ng;
  model_->eval();
  const int64_t k = std::min<int64_t>(5, static_cast<int64_t>(manifest_.classes.size()));
  const uint64_t n = split->num_samples;
  double top1 = 0, top5 = 0, count = 0;
  uint64_t k_th = 0;  // this rank's sample counter (position rank + k*world)
  while (true) {
    Result<BatchView> v = pipe->Next();
    if (!v.ok()) {
      if (v.status().code() == StatusCode::kOutOfRange) break;
      Check(v.status(), "evaluating on " + o_.eval_split);
    }
    Batch b = FromHost(v->pixels, v->labels, v->size, g_);
    Check(pipe->Release(*v), "releasing an evaluation batch");
    torch::Tensor logits = model_->forward(b.x);
    torch::Tensor pred = std::get<1>(logits.topk(k, 1));
    torch::Tensor hit = pred.eq(b.y.unsqueeze(1)).to(torch::kCPU);
    auto h = hit.accessor<bool, 2>();
    for (uint32_t i = 0; i < b.size; ++i, ++k_th) {
      // Padding (positions past the split's end repeat samples): not counted.
      if (static_cast<uint64_t>(p_.rank) + k_th * static_cast<uint64_t>(p_.world) >= n) continue;
      bool any = false;
      for (int64_t j = 0; j < k; ++j) any = any || h[i][j];
      top1 += h[i][0] ? 1 : 0;
      top5 += any ? 1 : 0;
      count += 1;
    }
  }
  model_->train();
  torch::Tensor t = torch::tensor({top1, top5, count}, torch::kFloat64);
  comm_->AllReduceSum(t, "the evaluation's reduce");
  const double total = t[2].item<double>();
  return {total > 0 ? t[0].item<double>() / total : 0, total > 0 ? t[1].item<double>() / total : 0};
}

int Rank::Run() {
  timeout_ = std::chrono::milliseconds(static_cast<int64_t>(o_.timeout_s * 1000));
  manifest_ = Take(LoadManifest(o_.data), "cannot read the shard set");
  Check(CheckData(o_, manifest_), "cannot train on " + o_.data);
  const SplitInfo* train = manifest_.FindSplit("train");
  train_samples_ = train->num_samples;
  const int64_t classes = static_cast<int64_t>(manifest_.classes.size());

  // Rank 0's outputs first: a path it cannot write fails the job before any
  // rank starts its loader or waits in the rendezvous.
  if (p_.rank == 0) {
    Check(CheckOutputs(o_), "cannot write the outputs");
    // Our launcher holds the lock for the job; under torchrun rank 0 does.
    if (!p_.launched_by_us) lock_ = Take(LockOutputs(o_), "cannot lock the outputs");
    RemoveStaleTemporaries();
    if (!o_.metrics_out.empty()) {
      if (nl::Status s = nl::CreatePrivateFile(o_.metrics_out); !s.ok()) {
        throw RankError("cannot write --metrics-out: " + s.message());
      }
      metrics_ = std::fopen(o_.metrics_out.c_str(), o_.resume.empty() ? "w" : "a");
      if (!metrics_) throw RankError("cannot write --metrics-out " + o_.metrics_out + ": " + std::strerror(errno));
    }
  }
  Plan();
  g_.model_size = o_.image_size;
  g_.ring_size = o_.image_size;
  if (o_.resize_on == "device") g_.ring_size = static_cast<int>((*train->shape)[0]);
  bool cuda = false;
#if NL_TRAINER_CUDA
  cuda = o_.device != "cpu" && torch::cuda::is_available() && mine_.gpu >= 0;
#endif
  if (o_.device == "cuda" && !cuda) {
#if NL_TRAINER_CUDA
    throw RankError("--device cuda: no CUDA device for this rank (LibTorch sees none, or the plan "
                    "gives it no GPU)");
#else
    throw RankError("--device cuda: this trainer was built against a LibTorch without CUDA");
#endif
  }
  g_.device = cuda ? torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(mine_.gpu)) : torch::Device(torch::kCPU);

  torch::manual_seed(o_.seed);
  model_ = MakeModel(o_.model, classes);
  model_->to(g_.device);
  torch::optim::SGD opt(model_->parameters(), torch::optim::SGDOptions(o_.lr)
                                                  .momentum(o_.momentum)
                                                  .weight_decay(o_.weight_decay));
  opt_ = &opt;
  Checkpoint at;
  if (!o_.resume.empty()) {
    at = LoadCheckpoint(o_.resume, *model_, opt, Describe(0, 0, 0));
    if (at.epoch >= o_.epochs) {
      throw RankError("the checkpoint " + o_.resume + " is at epoch " + std::to_string(at.epoch) +
                      ", batch " + std::to_string(at.batch) + ": --epochs " + std::to_string(o_.epochs) +
                      " leaves nothing to train (give more epochs)");
    }
    if (o_.max_steps > 0 && o_.max_steps <= at.step) {
      throw RankError("the checkpoint " + o_.resume + " is at step " + std::to_string(at.step) +
                      ": --max-steps " + std::to_string(o_.max_steps) +
                      " leaves nothing to train (it counts from the start of the run: give more)");
    }
    if (static_cast<uint64_t>(at.seed) != o_.seed) {
      if (p_.rank == 0) Log("resuming with the checkpoint's seed " + std::to_string(at.seed));
      o_.seed = static_cast<uint64_t>(at.seed);
    }
  }

  // The loader first (it warms up during the rendezvous), then c10d.
  StartLoader(static_cast<uint64_t>(at.epoch), static_cast<uint64_t>(at.batch));
  Rendezvous();

  // Everyone starts from rank 0's parameters and buffers.
  {
    std::vector<torch::Tensor> state;
    for (auto& p : model_->parameters()) state.push_back(p);
    for (auto& b : model_->buffers()) state.push_back(b);
    comm_->BroadcastCoalesced(state, "the broadcast of rank 0's initial parameters");
  }
  std::vector<torch::Tensor> params = model_->parameters();
  std::vector<torch::Tensor> buffers = model_->buffers();
  GradReducer reducer(params, 25 * 1024 * 1024);

  // Bindings, exchanged once.
  {
    RankBinding b;
    b.rank = p_.rank;
    char host[256] = {0};
    gethostname(host, sizeof host - 1);
    b.host = host;
    b.loader_cpus = job_.plan.binds ? FormatCpuList(loader_plan_.loader_cpus) : "";
    b.loader_node = job_.plan.binds ? loader_plan_.numa_node : -1;
    b.planned_node = job_.plan.binds ? mine_.numa_node : -1;
    b.gpu = cuda ? mine_.gpu : -1;
    b.gpu_node = cuda ? mine_.numa_node : -1;
    b.loader_threads = static_cast<int>(
        o_.loader_threads ? o_.loader_threads : std::max<size_t>(1, loader_plan_.loader_cpus.size()));
    b.misbound = o_.misbind_rank == p_.rank;
    b.simulated_delay_ms = o_.simulate_slow_rank == p_.rank ? o_.delay_ms : 0;
    const std::string j = BindingJson(b).dump();
    store_->set("binding/" + std::to_string(p_.rank), std::vector<uint8_t>(j.begin(), j.end()));
    if (p_.rank == 0) {
      for (int r = 0; r < p_.world; ++r) {
        std::vector<uint8_t> v = store_->get("binding/" + std::to_string(r));
        bindings_.push_back(BindingFrom(nlohmann::json::parse(std::string(v.begin(), v.end()))));
      }
    }
  }

  // The sampler's batches per epoch (every rank has the same number).
  const uint64_t per_rank = (train_samples_ + static_cast<uint64_t>(p_.world) - 1) / static_cast<uint64_t>(p_.world);
  bpe_ = (per_rank + o_.batch_size - 1) / o_.batch_size;
  // The schedule spans --epochs; --max-steps only stops early (so a run cut
  // short and resumed follows the same schedule as one run straight).
  const int64_t schedule_steps = o_.epochs * static_cast<int64_t>(bpe_);
  const int64_t total_steps =
      o_.max_steps > 0 ? std::min<int64_t>(o_.max_steps, schedule_steps) : schedule_steps;
  const int64_t warmup = o_.warmup_steps >= 0 ? o_.warmup_steps : std::min<int64_t>(500, schedule_steps / 10);

  if (p_.rank == 0) {
    Say("trainer: " + o_.model + ", " + std::to_string(p_.world) + " rank(s) x batch " +
        std::to_string(o_.batch_size) + ", " + std::to_string(bpe_) + " steps an epoch, " +
        std::to_string(total_steps) + " steps in all, image " + std::to_string(g_.model_size) +
        (g_.ring_size != g_.model_size ? " (resized on the device from " + std::to_string(g_.ring_size) + ")" : "") +
        ", device " + g_.device.str() + ", loader " + o_.loader + ", " + std::to_string(reducer.buckets()) +
        " gradient bucket(s), backend " + pg_->getBackendName());
    Say("trainer: ring bytes per image " + std::to_string(3 * g_.ring_size * g_.ring_size));
  }

  int64_t step = at.step;
  int64_t images_all = 0;  // taken from the loader by this rank
  int64_t sync_checks = 0;
  bool stop = false;
  for (int64_t epoch = at.epoch; epoch < o_.epochs && !stop; ++epoch) {
    const int64_t first = epoch == at.epoch ? at.batch : 0;
    std::unique_ptr<Progress> bar;
    if (p_.rank == 0) {
      bar = std::make_unique<Progress>("Train Epoch " + std::to_string(epoch), static_cast<int64_t>(bpe_),
                                       StderrIsTerminal(), o_.report_every, stderr);
    }
    Window report, whole;
    double loss_sum = 0;
    int64_t loss_n = 0, images = 0;
    const auto epoch_start = Clock::now();
    int64_t b = first;
    for (; b < static_cast<int64_t>(bpe_); ++b) {
      if (o_.max_steps > 0 && step >= o_.max_steps) {
        stop = true;
        break;
      }
      const auto t0 = Clock::now();
      double data_ms = 0;
      SetPhase(Phase::kData, step + 1);
      Batch batch = source_->Next(&data_ms);
      SetPhase(Phase::kCompute, step + 1);
      if (static_cast<int64_t>(batch.epoch) != epoch || static_cast<int64_t>(batch.batch) != b) {
        throw RankError("the loader delivered epoch " + std::to_string(batch.epoch) + " batch " +
                        std::to_string(batch.batch) + " where epoch " + std::to_string(epoch) +
                        " batch " + std::to_string(b) + " was due");
      }
      const auto data_end = t0 + std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double, std::milli>(data_ms));
      for (auto& g : opt.param_groups()) {
        static_cast<torch::optim::SGDOptions&>(g.options()).lr(LearningRate(o_, step, schedule_steps, warmup));
      }
      opt.zero_grad();
      torch::Tensor logits = model_->forward(batch.x);
      torch::Tensor loss = F::cross_entropy(
          logits, batch.y, F::CrossEntropyFuncOptions().label_smoothing(o_.label_smoothing));
      loss.backward();
#if NL_TRAINER_CUDA
      if (cuda) torch::cuda::synchronize();
#endif
      const auto t2 = Clock::now();
      SetPhase(Phase::kComm, step + 1);
      reducer.Reduce(*comm_, "the gradient all-reduce of step " + std::to_string(step + 1));
      if (!buffers.empty() && p_.world > 1) {
        comm_->BroadcastCoalesced(buffers, "the buffer broadcast of step " + std::to_string(step + 1));
      }
      SetPhase(Phase::kCompute, step + 1);
#if NL_TRAINER_CUDA
      if (cuda) torch::cuda::synchronize();
#endif
      const auto t3 = Clock::now();
      opt.step();
      const double l = loss.item<double>();
      const auto t4 = Clock::now();
      ++step;
      if (!std::isfinite(l)) throw RankError("the loss is " + std::to_string(l) + " at step " + std::to_string(step));
      if (o_.check_sync && p_.world > 1) {
        torch::Tensor h = torch::zeros({p_.world}, torch::kInt64);
        h[p_.rank] = static_cast<int64_t>(ParamHash(*model_));
        comm_->AllReduceSum(h, "the parameter check of step " + std::to_string(step));
        for (int r = 1; r < p_.world; ++r) {
          if (h[r].item<int64_t>() != h[0].item<int64_t>()) {
            throw RankError("parameters differ between rank 0 and rank " + std::to_string(r) +
                            " after step " + std::to_string(step));
          }
        }
        ++sync_checks;
      }
      const double compute_ms = Ms(data_end, t2), comm_ms = Ms(t2, t3), step_ms = Ms(t0, t4);
      report.Add(data_ms, compute_ms, comm_ms, step_ms, l, batch.size);
      whole.Add(data_ms, compute_ms, comm_ms, step_ms, l, batch.size);
      loss_sum += l;
      ++loss_n;
      images += batch.size;
      images_all += batch.size;
      if (bar) bar->Update(b + 1, l);
      if (o_.report_every > 0 && step % o_.report_every == 0) {
        Report(epoch, step, report, false, nullptr);
        report.Clear();
      }
      if (o_.checkpoint_every > 0 && step % o_.checkpoint_every == 0 && p_.rank == 0 && !o_.out.empty()) {
        Save(b + 1 == static_cast<int64_t>(bpe_) ? Describe(epoch + 1, 0, step) : Describe(epoch, b + 1, step));
        SetPhase(Phase::kCompute, step);
      }
    }
    if (bar) bar->Finish(loss_n ? loss_sum / static_cast<double>(loss_n) : 0);
    const double epoch_s = std::chrono::duration<double>(Clock::now() - epoch_start).count();
    int straggler = -1;
    Report(epoch, step, whole, true, &straggler);
    SetPhase(Phase::kEval, step);
    const auto [top1, top5] = Evaluate();
    SetPhase(Phase::kComm, step);
    torch::Tensor agg = torch::tensor({loss_sum, static_cast<double>(loss_n), static_cast<double>(images)},
                                      torch::kFloat64);
    comm_->AllReduceSum(agg, "the epoch's loss reduce");
    if (p_.rank == 0) {
      EpochRecord e;
      e.epoch = epoch;
      e.train_loss = agg[1].item<double>() > 0 ? agg[0].item<double>() / agg[1].item<double>() : 0;
      e.test_top1 = top1;
      e.test_top5 = top5;
      e.evaluated = top1 >= 0;
      e.images_per_s = epoch_s > 0 ? agg[2].item<double>() / epoch_s : 0;
      e.straggler = straggler;
      e.steps = step;
      WriteMetrics(EpochJsonLine(e));
      char line[256];
      if (e.evaluated) {
        std::snprintf(line, sizeof line,
                      "epoch %lld: train loss %.4f, %s top-1 %.2f%%, top-5 %.2f%%, %.1f images/s",
                      static_cast<long long>(epoch), e.train_loss, o_.eval_split.c_str(), 100 * top1,
                      100 * top5, e.images_per_s);
      } else {
        const std::string why = o_.eval_split == "none" ? "not evaluated: --eval-split none"
                                                        : "no " + o_.eval_split + " split to evaluate";
        std::snprintf(line, sizeof line, "epoch %lld: train loss %.4f (%s), %.1f images/s",
                      static_cast<long long>(epoch), e.train_loss, why.c_str(), e.images_per_s);
      }
      Say(line);
      if (!o_.out.empty()) {
        Save(b == static_cast<int64_t>(bpe_) ? Describe(epoch + 1, 0, step) : Describe(epoch, b, step));
      }
    }
  }
  if (o_.check_sync && p_.rank == 0 && p_.world > 1) {
    Say("parameters identical on all ranks after every step (" + std::to_string(sync_checks) + " checks)");
  }
  if (p_.rank == 0 && !o_.params_out.empty()) {
    std::string bytes;
    for (auto& p : model_->parameters()) {
      torch::Tensor c = p.detach().to(torch::kCPU, torch::kFloat32).contiguous();
      bytes.append(static_cast<const char*>(c.data_ptr()), static_cast<size_t>(c.numel()) * 4);
    }
    WriteAtomically(o_.params_out, bytes);
  }
  // Everyone is done before anyone leaves (a rank still in a collective
  // would otherwise see its peer vanish).
  const double loader_cpu_s = source_->Finish();
  torch::Tensor done = torch::tensor({loader_cpu_s, static_cast<double>(images_all)}, torch::kFloat64);
  SetPhase(Phase::kComm, step);
  comm_->AllReduceSum(done, "the final reduce");
  SetPhase(Phase::kDone, step);
  source_.reset();
  if (p_.rank == 0 && done[1].item<double>() > 0) {
    char line[256];
    std::snprintf(line, sizeof line,
                  "trainer: loader CPU time %.1f us per image (%s, all ranks), ring bytes per image %d",
                  1e6 * done[0].item<double>() / done[1].item<double>(),
                  o_.loader == "service" ? "the loader services' processes" : "the pipelines' workers",
                  3 * g_.ring_size * g_.ring_size);
    Say(line);
  }
  if (metrics_) std::fclose(metrics_);
  if (p_.rank == 0) Say("trainer: done, " + std::to_string(step) + " steps");
  return 0;
}

}  // namespace

int RunRank(const Options& options, const Placement& placement) {
  InstallSignalHandlers();
  try {
    Rank r(options, placement);
    return r.Run();
  } catch (const RankError& e) {
    std::fprintf(stderr, "trainer rank %d: error: %s\n", placement.rank, e.what());
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "trainer rank %d: error: %s\n", placement.rank, e.what_without_backtrace());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "trainer rank %d: error: %s\n", placement.rank, e.what());
  }
  return 1;
}

}  // namespace nl::trainer
