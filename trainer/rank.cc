#include "trainer/rank.h"

#include <dirent.h>
#include <fcntl.h>
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
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <thread>

#include "formats/manifest.h"
#include "loader/pipeline/pipeline.h"
#include "loader/plan/affinity.h"
#include "loader/plan/cpu_list.h"
#include "loader/plan/job_plan.h"
#include "loader/ring/child_process.h"
#include "loader/ring/client.h"
#include "loader/staging/staging.h"
#include "trainer/diagnostics.h"
#include "trainer/models.h"
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

// Writes `bytes` to path atomically (a temporary beside it, then rename).
void WriteAtomically(const std::string& path, const std::string& bytes) {
  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    f.flush();
    if (!f) throw RankError("cannot write " + tmp);
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

// A `loader serve` child and the ring it fills.
class ServiceSource : public BatchSource {
 public:
  ServiceSource(const std::vector<std::string>& args, const std::string& job, int rank,
                double timeout_s, const Geometry& g, double attach_limit_s)
      : timeout_s_(timeout_s), g_(g) {
    log_ = Take(proc::MakeLogFd("loader-serve"), "cannot make a log for its loader service");
    serve_ = Take(proc::ChildProcess::Start(args, {}, log_.get(), log_.get()),
                  "cannot start its loader service");
    const auto start = Clock::now();
    while (true) {
      proc::ChildExit e;
      if (serve_.Exited(&e)) {
        throw RankError("its loader service (" + args[0] + " serve) ended (" + e.Describe() +
                        ") before the rank attached: " + proc::TailOf(log_.get(), 3));
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
        throw RankError("its loader service (pid " + std::to_string(serve_.pid()) +
                        ") did not open its ring within " + std::to_string(int(attach_limit_s)) +
                        " s: " + proc::TailOf(log_.get(), 3));
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
      proc::ChildExit e;
      std::string how = serve_.Exited(&e) ? " (" + e.Describe() + ")" : "";
      throw RankError("its loader service (pid " + std::to_string(serve_.pid() > 0 ? serve_.pid() : pid_) +
                      ")" + how + ": " + r.status().ToString());
    }
    pid_ = serve_.pid();
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
  pid_t loader_pid() const override { return serve_.pid() > 0 ? serve_.pid() : pid_; }

 private:
  double timeout_s_;
  Geometry g_;
  ring::Fd log_;
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

class Comm {
 public:
  Comm(c10::intrusive_ptr<c10d::ProcessGroup> pg, int world, std::chrono::milliseconds timeout)
      : pg_(std::move(pg)), world_(world), timeout_(timeout) {}

  void AllReduceSum(torch::Tensor& t) {
    std::vector<torch::Tensor> v{t};
    pg_->allreduce(v)->wait(timeout_);
  }
  void Broadcast(torch::Tensor& t) {
    std::vector<torch::Tensor> v{t};
    c10d::BroadcastOptions o;
    o.rootRank = 0;
    pg_->broadcast(v, o)->wait(timeout_);
  }
  // Broadcasts tensors from rank 0, flattened per dtype (one collective each).
  void BroadcastCoalesced(const std::vector<torch::Tensor>& ts) {
    std::map<int, std::vector<torch::Tensor>> by_type;
    for (const auto& t : ts) by_type[static_cast<int>(t.scalar_type())].push_back(t);
    for (auto& [type, group] : by_type) {
      std::vector<torch::Tensor> flat;
      for (auto& t : group) flat.push_back(t.detach().reshape({-1}));
      torch::Tensor all = torch::cat(flat);
      Broadcast(all);
      int64_t off = 0;
      for (auto& t : group) {
        torch::NoGradGuard ng;
        t.copy_(all.narrow(0, off, t.numel()).view_as(t));
        off += t.numel();
      }
    }
  }
  int world() const { return world_; }

 private:
  c10::intrusive_ptr<c10d::ProcessGroup> pg_;
  int world_;
  std::chrono::milliseconds timeout_;
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

  void Reduce(Comm& comm, c10d::ProcessGroup& pg, std::chrono::milliseconds timeout) {
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
      works.push_back(pg.allreduce(v));
    }
    for (size_t i = 0; i < works.size(); ++i) {
      works[i]->wait(timeout);
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
  comm.AllReduceSum(t);
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
  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  a.save_to(tmp);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw RankError("cannot rename " + tmp + " to " + path + ": " + std::strerror(errno));
  }
}

Checkpoint LoadCheckpoint(const std::string& path, Net& model, torch::optim::SGD& opt) {
  torch::serialize::InputArchive a, m, o;
  try {
    a.load_from(path);
    a.read("model", m);
    model.load(m);
    a.read("optimizer", o);
    opt.load(o);
  } catch (const c10::Error& e) {
    throw RankError("cannot resume from " + path + ": " + e.what_without_backtrace());
  }
  Checkpoint c;
  auto get = [&](const char* k) {
    torch::Tensor t;
    a.read(k, t);
    return t.item<int64_t>();
  };
  c.epoch = get("epoch");
  c.batch = get("batch");
  c.step = get("step");
  c.seed = get("seed");
  c.world = get("world");
  c.batch_size = get("batch_size");
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
  void Report(int64_t epoch, int64_t step, const Window& w, bool epoch_end, int* straggler);
  std::pair<double, double> Evaluate();
  void WriteMetrics(const std::string& lines);

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
};

void Rank::Plan() {
  JobPlanRequest rq;
  rq.nproc = p_.local_world;
  rq.gpus = o_.gpus;
  rq.numa_node = o_.numa_node;
  rq.cpu_affinity = o_.cpu_affinity;
  rq.trainer_cores = o_.trainer_cores;
  rq.allow_shared_cores = o_.allow_shared_cores;
  rq.ignore_gpus = o_.ignore_gpus;
  rq.no_bind = o_.no_bind;
  if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES")) rq.cuda_visible_devices = v;
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
  source_ = std::make_unique<ServiceSource>(a, p_.job_id, p_.rank, o_.timeout_s, g_, 120.0);
}

void Rank::Rendezvous() {
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
                                : "cannot reach the rendezvous store at " + p_.master_addr + ":" +
                                      std::to_string(p_.master_port) + ": " + e.what());
  }
  store_ = c10::make_intrusive<c10d::PrefixStore>("nl_trainer", tcp);
#if NL_TRAINER_CUDA
  if (g_.device.is_cuda()) {
    auto opts = c10d::ProcessGroupNCCL::Options::create();
    opts->timeout = timeout_;
    pg_ = c10::make_intrusive<c10d::ProcessGroupNCCL>(store_, p_.rank, p_.world, opts);
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
    pg_ = c10::make_intrusive<c10d::ProcessGroupGloo>(store_, p_.rank, p_.world, opts);
  }
  comm_ = std::make_unique<Comm>(pg_, p_.world, timeout_);
}

void Rank::WriteMetrics(const std::string& lines) {
  if (!metrics_) return;
  std::fputs(lines.c_str(), metrics_);
  std::fflush(metrics_);
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
  comm_->AllReduceSum(t);
  const double total = t[2].item<double>();
  return {total > 0 ? t[0].item<double>() / total : 0, total > 0 ? t[1].item<double>() / total : 0};
}

int Rank::Run() {
  timeout_ = std::chrono::milliseconds(static_cast<int64_t>(o_.timeout_s * 1000));
  manifest_ = Take(LoadManifest(o_.data), "cannot read the shard set");
  const SplitInfo* train = manifest_.FindSplit("train");
  if (!train) throw RankError(o_.data + " has no train split");
  train_samples_ = train->num_samples;
  const int64_t classes = static_cast<int64_t>(manifest_.classes.size());
  if (classes < 2) throw RankError(o_.data + " has " + std::to_string(classes) + " class(es)");

  // Rank 0's outputs first: a path it cannot write fails the job before any
  // rank starts its loader or waits in the rendezvous.
  if (p_.rank == 0) {
    if (!o_.out.empty()) {
      struct stat st {};
      if (mkdir(o_.out.c_str(), 0700) != 0 && errno != EEXIST) {
        throw RankError("cannot make --out " + o_.out + ": " + std::strerror(errno));
      }
      if (stat(o_.out.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || access(o_.out.c_str(), W_OK) != 0) {
        throw RankError("--out " + o_.out + " is not a writable directory");
      }
    }
    if (!o_.params_out.empty()) {  // written at the end: fail now, not after the run
      const std::string dir = DirOf(o_.params_out);
      struct stat st {};
      if (stat(o_.params_out.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
        throw RankError("--params-out " + o_.params_out + " is a directory");
      }
      if (access(dir.c_str(), W_OK) != 0) {
        throw RankError("--params-out " + o_.params_out + ": cannot write in " + dir + ": " +
                        std::strerror(errno));
      }
    }
    if (!o_.metrics_out.empty()) {
      metrics_ = std::fopen(o_.metrics_out.c_str(), o_.resume.empty() ? "w" : "a");
      if (!metrics_) throw RankError("cannot write --metrics-out " + o_.metrics_out + ": " + std::strerror(errno));
    }
  }
  Plan();
  g_.model_size = o_.image_size;
  g_.ring_size = o_.image_size;
  if (o_.resize_on == "device") {
    if (!train->shape || (*train->shape)[0] != (*train->shape)[1]) {
      throw RankError("--resize-on device needs a train split of one square image shape (CIFAR's "
                      "32x32); " + o_.data + " has none");
    }
    g_.ring_size = static_cast<int>((*train->shape)[0]);
  }
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
  Checkpoint at;
  if (!o_.resume.empty()) {
    at = LoadCheckpoint(o_.resume, *model_, opt);
    if (at.world != p_.world || at.batch_size != static_cast<int64_t>(o_.batch_size)) {
      throw RankError("the checkpoint " + o_.resume + " was written by " + std::to_string(at.world) +
                      " ranks of batch " + std::to_string(at.batch_size) + "; this run has " +
                      std::to_string(p_.world) + " of " + std::to_string(o_.batch_size) +
                      " (the sample order would differ): resume with the same ranks and batch size");
    }
    if (at.epoch >= o_.epochs) {
      throw RankError("the checkpoint " + o_.resume + " is at epoch " + std::to_string(at.epoch) +
                      ", batch " + std::to_string(at.batch) + ": --epochs " + std::to_string(o_.epochs) +
                      " leaves nothing to train (give more epochs)");
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
    comm_->BroadcastCoalesced(state);
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
      Batch batch = source_->Next(&data_ms);
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
      reducer.Reduce(*comm_, *pg_, timeout_);
      if (!buffers.empty() && p_.world > 1) comm_->BroadcastCoalesced(buffers);
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
        comm_->AllReduceSum(h);
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
        Checkpoint c{epoch, b + 1, step, static_cast<int64_t>(o_.seed), p_.world, o_.batch_size};
        if (c.batch == static_cast<int64_t>(bpe_)) c = {epoch + 1, 0, step, c.seed, c.world, c.batch_size};
        SaveCheckpoint(o_.out + "/checkpoint.pt", *model_, opt, c);
      }
    }
    if (bar) bar->Finish(loss_n ? loss_sum / static_cast<double>(loss_n) : 0);
    const double epoch_s = std::chrono::duration<double>(Clock::now() - epoch_start).count();
    int straggler = -1;
    Report(epoch, step, whole, true, &straggler);
    const auto [top1, top5] = Evaluate();
    torch::Tensor agg = torch::tensor({loss_sum, static_cast<double>(loss_n), static_cast<double>(images)},
                                      torch::kFloat64);
    comm_->AllReduceSum(agg);
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
        Checkpoint c{b == static_cast<int64_t>(bpe_) ? epoch + 1 : epoch,
                     b == static_cast<int64_t>(bpe_) ? 0 : b, step, static_cast<int64_t>(o_.seed),
                     p_.world, o_.batch_size};
        SaveCheckpoint(o_.out + "/checkpoint.pt", *model_, opt, c);
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
  comm_->AllReduceSum(done);
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
