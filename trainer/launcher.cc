#include "trainer/launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "base/child_process.h"
#include "base/clock.h"
#include "base/fd.h"
#include "loader/ring/ring_socket.h"

namespace nl::trainer {
namespace {

std::atomic<int> g_signal{0};
extern "C" void OnSignal(int sig) { g_signal.store(sig); }

// SIGINT, SIGTERM and (unless ignored, as under nohup) SIGHUP stop the job.
void InstallLauncherSignals() {
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  struct sigaction hup {};
  sigaction(SIGHUP, nullptr, &hup);
  if (hup.sa_handler != SIG_IGN) sigaction(SIGHUP, &sa, nullptr);  // the terminal went away: as SIGTERM
  signal(SIGPIPE, SIG_IGN);
}

std::string SelfExe() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "/proc/self/exe";
  return std::string(buf, static_cast<size_t>(n));
}

// One rank: its process, its stderr relayed line by line, what it became.
struct RankChild {
  RankOutcome out;
  proc::ChildProcess process;
  Fd err;  // read end of its stderr pipe
  std::string partial;
};

// Keeps the last complete line (after any '\r' redraw) as the rank's last words.
void KeepLine(RankOutcome* o, std::string line) {
  const size_t cr = line.rfind('\r');
  if (cr != std::string::npos) line.erase(0, cr + 1);
  if (!line.empty()) o->last_line = line;
}

void Drain(RankChild* c, bool flush) {
  if (!c->err.valid()) return;
  char buf[8192];
  while (true) {
    const ssize_t n = read(c->err.get(), buf, sizeof buf);
    if (n > 0) {  // passed through as it comes (rank 0's progress bar redraws with '\r')
      std::fwrite(buf, 1, static_cast<size_t>(n), stderr);
      c->partial.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n == 0) {  // every writer closed it (the rank and its loader service)
      c->err.Reset();
      flush = true;
    }
    break;  // EAGAIN or closed
  }
  size_t nl;
  while ((nl = c->partial.find('\n')) != std::string::npos) {
    KeepLine(&c->out, c->partial.substr(0, nl));
    c->partial.erase(0, nl + 1);
  }
  if (flush && !c->partial.empty()) {
    KeepLine(&c->out, c->partial);
    std::fputc('\n', stderr);
    c->partial.clear();
  }
  if (c->partial.size() > 65536) c->partial.erase(0, c->partial.size() - 4096);
  std::fflush(stderr);
}

// Relays a rank's output and reaps it if it ended; true when it ended now.
bool RelayAndReap(RankChild* c) {
  Drain(c, false);
  if (c->out.done || !c->process.Exited(&c->out.exit)) return false;
  c->out.done = true;
  Drain(c, true);
  return true;
}

// Relays every rank's output and reaps those that ended; true while any runs.
bool RelayAndReapAll(std::vector<RankChild>& children) {
  bool running = false;
  for (RankChild& c : children) {
    RelayAndReap(&c);
    running = running || !c.out.done;
  }
  return running;
}

std::vector<RankOutcome> Outcomes(const std::vector<RankChild>& children) {
  std::vector<RankOutcome> v;
  for (const RankChild& c : children) v.push_back(c.out);
  return v;
}

// The variables a rank reads, as torchrun sets them.
std::vector<std::string> RankEnvironment(const Options& o, int local, int rank, const std::string& job) {
  return {"RANK=" + std::to_string(rank),
          "WORLD_SIZE=" + std::to_string(o.nproc_per_node * o.nnodes),
          "LOCAL_RANK=" + std::to_string(local),
          "LOCAL_WORLD_SIZE=" + std::to_string(o.nproc_per_node),
          "GROUP_RANK=" + std::to_string(o.node_rank),
          "MASTER_ADDR=" + o.master_addr,
          "MASTER_PORT=" + std::to_string(o.master_port),
          "NL_TRAINER_JOB_ID=" + job,
          "NL_TRAINER_LAUNCHED=1",
          std::string("NL_TRAINER_TTY=") + (isatty(2) ? "1" : "0")};
}

// Starts the node's ranks, each with a stderr pipe and a failure channel.
// On an error the ranks already started are left to the caller to stop.
Status StartRanks(const Options& o, const std::vector<std::string>& argv, const std::string& job,
                  std::vector<RankChild>* children) {
  std::vector<std::string> args = argv;
  args[0] = SelfExe();
  for (int i = 0; i < o.nproc_per_node; ++i) {
    RankChild& c = (*children)[static_cast<size_t>(i)];
    c.out.rank = o.node_rank * o.nproc_per_node + i;
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) return Status::FromErrno("cannot make a pipe", errno);
    c.err = Fd(p[0]);
    Fd write_end(p[1]);
    fcntl(p[0], F_SETFL, O_NONBLOCK);
    Result<proc::ChildProcess> started = proc::ChildProcess::Start(
        args, RankEnvironment(o, i, c.out.rank, job), -1, write_end.get(), /*failure_channel=*/true);
    if (!started.ok()) {
      return Status::Internal("cannot start rank " + std::to_string(c.out.rank) + ": " +
                              started.status().ToString());
    }
    c.process = std::move(*started);
  }
  return Status::Ok();
}

// Relays output until a rank fails, a signal arrives, or all succeed; the
// index of the first rank that failed, or -1.
int WatchUntilFirstFailure(std::vector<RankChild>& children) {
  while (true) {
    bool all_done = true;
    for (RankChild& c : children) {
      if (RelayAndReap(&c) && !c.out.exit.Succeeded()) return static_cast<int>(&c - &children[0]);
      all_done = all_done && c.out.done;
    }
    if (g_signal.load() != 0 || all_done) return -1;
    std::vector<pollfd> fds;
    for (RankChild& c : children) {
      if (c.err.valid()) fds.push_back({c.err.get(), POLLIN, 0});
    }
    if (fds.empty()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    } else {
      poll(fds.data(), fds.size(), 20);
    }
  }
}

// A failure often takes its peers down within moments (a collective whose
// peer vanished): let them end before the cause is named.
void LetFailuresSettle(std::vector<RankChild>& children) {
  const auto settle = Clock::now() + std::chrono::milliseconds(1500);
  while (Clock::now() < settle && RelayAndReapAll(children)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// Stops whatever still runs: SIGTERM (and SIGCONT: a stopped rank acts on
// SIGTERM only once continued), then SIGKILL after a grace period. Returns
// the ranks it stopped.
std::vector<int> StopRemaining(std::vector<RankChild>& children) {
  std::vector<int> stopped;
  for (RankChild& c : children) {
    if (!c.out.done && c.process.pid() > 0) {
      kill(c.process.pid(), SIGTERM);
      kill(c.process.pid(), SIGCONT);
      stopped.push_back(c.out.rank);
    }
  }
  const auto grace_end = Clock::now() + std::chrono::seconds(10);
  while (RelayAndReapAll(children)) {
    if (Clock::now() > grace_end) {
      for (RankChild& c : children) {
        if (!c.out.done) {
          c.process.Kill();
          c.process.Exited(&c.out.exit);
          c.out.done = true;
          Drain(&c, true);
        }
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return stopped;
}

const char* SignalName(int sig) {
  switch (sig) {
    case SIGINT:
      return "SIGINT";
    case SIGTERM:
      return "SIGTERM";
    case SIGHUP:
      return "SIGHUP";
    default:
      return "a signal";
  }
}

std::string RankList(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) s += i + 1 == ranks.size() ? " and " : ", ";
    s += std::to_string(ranks[i]);
  }
  return s;
}

std::string Plural(const std::vector<int>& v, const char* word) {
  return std::string(word) + (v.size() > 1 ? "s " : " ") + RankList(v);
}

// What a rank said of its failure, without the "trainer rank N: error: " prefix.
std::string Said(const RankOutcome& x) {
  const std::string prefix = "trainer rank " + std::to_string(x.rank) + ": ";
  std::string t = x.last_line.rfind(prefix, 0) == 0 ? x.last_line.substr(prefix.size()) : x.last_line;
  return t.rfind("error: ", 0) == 0 ? t.substr(7) : t;
}

}  // namespace

bool IsEcho(const RankOutcome& c) {
  return WIFEXITED(c.exit.status) && c.exit.failure.kind == proc::FailureKind::kEcho;
}

int PrimaryFailure(const std::vector<RankOutcome>& ranks, int first) {
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i].done && WIFSIGNALED(ranks[i].exit.status)) return static_cast<int>(i);
  }
  if (!IsEcho(ranks[static_cast<size_t>(first)])) return first;
  for (size_t i = 0; i < ranks.size(); ++i) {
    const RankOutcome& c = ranks[i];
    if (c.done && !c.exit.Succeeded() && !IsEcho(c)) return static_cast<int>(i);
  }
  return first;
}

std::string FailureVerdict(const std::vector<RankOutcome>& ranks, int failed, const std::vector<int>& stalled,
                           const std::string& stalled_state, const std::vector<int>& stopped) {
  const std::string others = stopped.empty() ? "" : "; stopped " + Plural(stopped, "rank");
  const RankOutcome& c = ranks[static_cast<size_t>(failed)];
  std::string cause = c.exit.Describe();
  if (WIFEXITED(c.exit.status) && !c.last_line.empty()) cause += ": " + c.last_line;
  std::vector<int> echoes;  // ranks that failed after it, by themselves
  for (const RankOutcome& x : ranks) {
    if (&x != &c && x.done && !x.exit.Succeeded() &&
        std::find(stopped.begin(), stopped.end(), x.rank) == stopped.end()) {
      echoes.push_back(x.rank);
    }
  }
  // Every failed rank says the same (a bad checkpoint, say): one message.
  bool same = !echoes.empty() && stalled.empty() && WIFEXITED(c.exit.status);
  for (const RankOutcome& x : ranks) {
    if (same && std::find(echoes.begin(), echoes.end(), x.rank) != echoes.end()) {
      same = x.exit.status == c.exit.status && Said(x) == Said(c);
    }
  }
  if (same) {
    std::vector<int> all = echoes;
    all.push_back(c.rank);
    std::sort(all.begin(), all.end());
    return "trainer: ranks " + RankList(all) + " failed alike (" + c.exit.Describe() + ": " + Said(c) + ")" +
           others;
  }
  const std::string also = echoes.empty() ? "" : "; " + Plural(echoes, "rank") + " failed after it (see above)";
  if (!stalled.empty()) {
    const bool many = stalled.size() > 1;
    return "trainer: " + Plural(stalled, "rank") + " made no progress (" +
           (many ? "the first is " : "its process is ") + stalled_state + "): rank " + std::to_string(c.rank) +
           " gave up waiting for " + (many ? "them" : "it") + " (" + cause + ")" + also + others;
  }
  return "trainer: rank " + std::to_string(c.rank) + " failed (" + cause + ")" + also + others;
}

std::string MakeJobId(const Options& o, int launcher_pid) {
  return "trainer-" + std::to_string(o.master_port) + "-" + std::to_string(launcher_pid);
}

LaunchResult Launch(const Options& o, const std::vector<std::string>& argv,
                    const std::function<void(const std::string&)>& log) {
  InstallLauncherSignals();
  const std::string job = MakeJobId(o, getpid());
  std::vector<RankChild> children(static_cast<size_t>(o.nproc_per_node));
  if (Status st = StartRanks(o, argv, job, &children); !st.ok()) {
    StopRemaining(children);
    return {1, "trainer: " + st.message()};
  }
  log("trainer: launched ranks " + std::to_string(children.front().out.rank) + ".." +
      std::to_string(children.back().out.rank) + " of " + std::to_string(o.nproc_per_node * o.nnodes) +
      " (job " + job + ")");

  int failed = WatchUntilFirstFailure(children);
  if (failed >= 0 && g_signal.load() == 0) {
    LetFailuresSettle(children);
    failed = PrimaryFailure(Outcomes(children), failed);
  }
  // Every failure so far echoes another's, and some ranks still run: those
  // are the ones the others waited for (stopped, hung, or stuck on data).
  std::vector<int> stalled;
  std::string stalled_state;
  if (failed >= 0 && g_signal.load() == 0 && IsEcho(children[static_cast<size_t>(failed)].out)) {
    for (RankChild& c : children) {
      if (c.out.done || c.process.pid() <= 0) continue;
      stalled.push_back(c.out.rank);
      if (stalled_state.empty()) stalled_state = proc::ProcessState(c.process.pid());
    }
  }
  const std::vector<int> stopped = StopRemaining(children);
  if (g_signal.load() != 0 && failed < 0) {
    const int sig = g_signal.load();
    return {128 + sig, "trainer: stopped by " + std::string(SignalName(sig)) +
                           (stopped.empty() ? "" : "; stopped " + Plural(stopped, "rank"))};
  }
  if (failed < 0) return {0, ""};
  return {1, FailureVerdict(Outcomes(children), failed, stalled, stalled_state, stopped)};
}

}  // namespace nl::trainer
