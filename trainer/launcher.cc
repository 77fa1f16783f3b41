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
#include "loader/ring/ring_socket.h"

namespace nl::trainer {
namespace {

std::atomic<int> g_signal{0};
extern "C" void OnSignal(int sig) { g_signal.store(sig); }

std::string SelfExe() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "/proc/self/exe";
  return std::string(buf, static_cast<size_t>(n));
}

// One rank's stderr, relayed line by line (its last line kept: the cause).
struct RankChild {
  int rank = 0;
  proc::ChildProcess process;
  int err_fd = -1;  // read end of its stderr pipe
  std::string partial, last_line;
  bool done = false;
  proc::ChildExit exit;
};

void Drain(RankChild* c, bool flush) {
  if (c->err_fd < 0) return;
  char buf[8192];
  while (true) {
    const ssize_t n = read(c->err_fd, buf, sizeof buf);
    if (n > 0) {  // passed through as it comes (rank 0's progress bar redraws with '\r')
      std::fwrite(buf, 1, static_cast<size_t>(n), stderr);
      c->partial.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n == 0) {  // every writer closed it (the rank and its loader service)
      close(c->err_fd);
      c->err_fd = -1;
      flush = true;
    }
    break;  // EAGAIN or closed
  }
  auto keep = [c](std::string line) {
    const size_t cr = line.rfind('\r');
    if (cr != std::string::npos) line.erase(0, cr + 1);
    if (!line.empty()) c->last_line = line;
  };
  size_t nl;
  while ((nl = c->partial.find('\n')) != std::string::npos) {
    keep(c->partial.substr(0, nl));
    c->partial.erase(0, nl + 1);
  }
  if (flush && !c->partial.empty()) {
    keep(c->partial);
    std::fputc('\n', stderr);
    c->partial.clear();
  }
  if (c->partial.size() > 65536) c->partial.erase(0, c->partial.size() - 4096);
  std::fflush(stderr);
}

// Relays every rank's output and reaps those that ended; true while any runs.
bool RelayAndReap(std::vector<RankChild>& children) {
  bool running = false;
  for (RankChild& c : children) {
    Drain(&c, false);
    if (!c.done && c.process.Exited(&c.exit)) {
      c.done = true;
      Drain(&c, true);
    }
    running = running || !c.done;
  }
  return running;
}

std::string RankList(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) s += i + 1 == ranks.size() ? " and " : ", ";
    s += std::to_string(ranks[i]);
  }
  return s;
}

// A rank's failure that is only the echo of another's: it lost a peer in a
// collective (Gloo or NCCL says the connection closed or was reset), gave up
// waiting for one there or at the rendezvous, or lost the store rank 0 hosts.
bool IsEcho(const RankChild& c) {
  if (!WIFEXITED(c.exit.status)) return false;
  for (const char* s : {"Connection closed by peer", "Connection reset by peer", "gloo/transport",
                        "NCCL communicator was aborted", "Broken pipe", "in a collective",
                        "at the rendezvous", "cannot reach the rendezvous store"}) {
    if (c.last_line.find(s) != std::string::npos) return true;
  }
  return false;
}

// Among the failed ranks: one killed by a signal, else one that did not
// merely echo another's failure, else the first to fail.
int PrimaryFailure(const std::vector<RankChild>& children, int first) {
  for (size_t i = 0; i < children.size(); ++i) {
    const RankChild& c = children[i];
    if (c.done && WIFSIGNALED(c.exit.status)) return static_cast<int>(i);
  }
  if (!IsEcho(children[static_cast<size_t>(first)])) return first;
  for (size_t i = 0; i < children.size(); ++i) {
    const RankChild& c = children[i];
    if (c.done && !c.exit.Succeeded() && !IsEcho(c)) return static_cast<int>(i);
  }
  return first;
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

}  // namespace

std::string MakeJobId(const Options& o, int launcher_pid) {
  return "trainer-" + std::to_string(o.master_port) + "-" + std::to_string(launcher_pid);
}

LaunchResult Launch(const Options& o, const std::vector<std::string>& argv,
                    const std::function<void(const std::string&)>& log) {
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  struct sigaction hup {};
  sigaction(SIGHUP, nullptr, &hup);
  if (hup.sa_handler != SIG_IGN) sigaction(SIGHUP, &sa, nullptr);  // the terminal went away: as SIGTERM (not under nohup)
  signal(SIGPIPE, SIG_IGN);

  const int world = o.nproc_per_node * o.nnodes;
  const std::string exe = SelfExe();
  const std::string job = MakeJobId(o, getpid());
  std::vector<RankChild> children(static_cast<size_t>(o.nproc_per_node));
  LaunchResult result;
  for (int i = 0; i < o.nproc_per_node; ++i) {
    RankChild& c = children[static_cast<size_t>(i)];
    c.rank = o.node_rank * o.nproc_per_node + i;
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) {
      return {1, std::string("trainer: cannot make a pipe: ") + std::strerror(errno)};
    }
    fcntl(p[0], F_SETFL, O_NONBLOCK);
    std::vector<std::string> args = argv;
    args[0] = exe;
    const std::vector<std::string> env = {
        "RANK=" + std::to_string(c.rank),
        "WORLD_SIZE=" + std::to_string(world),
        "LOCAL_RANK=" + std::to_string(i),
        "LOCAL_WORLD_SIZE=" + std::to_string(o.nproc_per_node),
        "GROUP_RANK=" + std::to_string(o.node_rank),
        "MASTER_ADDR=" + o.master_addr,
        "MASTER_PORT=" + std::to_string(o.master_port),
        "NL_TRAINER_JOB_ID=" + job,
        "NL_TRAINER_LAUNCHED=1",
        std::string("NL_TRAINER_TTY=") + (isatty(2) ? "1" : "0")};
    Result<proc::ChildProcess> started = proc::ChildProcess::Start(args, env, -1, p[1]);
    close(p[1]);
    c.err_fd = p[0];
    if (!started.ok()) {
      result = {1, "trainer: cannot start rank " + std::to_string(c.rank) + ": " +
                       started.status().ToString()};
      break;
    }
    c.process = std::move(*started);
  }
  if (result.exit_code == 0) {
    log("trainer: launched ranks " + std::to_string(children.front().rank) + ".." +
        std::to_string(children.back().rank) + " of " + std::to_string(world) + " (job " + job +
        ")");
  }

  // Watch: the first failure (or a signal to us) stops the rest.
  int failed = -1;
  using Clock = std::chrono::steady_clock;
  while (result.exit_code == 0) {
    bool all_done = true;
    for (RankChild& c : children) {
      Drain(&c, false);
      if (!c.done && c.process.Exited(&c.exit)) {
        c.done = true;
        Drain(&c, true);
        if (!c.exit.Succeeded() && failed < 0) failed = static_cast<int>(&c - &children[0]);
      }
      all_done = all_done && c.done;
    }
    if (failed >= 0 || g_signal.load() != 0 || all_done) break;
    std::vector<pollfd> fds;
    for (RankChild& c : children) {
      if (c.err_fd >= 0) fds.push_back({c.err_fd, POLLIN, 0});
    }
    if (fds.empty()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    } else {
      poll(fds.data(), fds.size(), 20);
    }
  }

  // A failure often takes its peers down within moments (a collective whose
  // peer vanished): let them end, then name the cause, not a consequence.
  if (failed >= 0 && g_signal.load() == 0) {
    const auto settle = Clock::now() + std::chrono::milliseconds(1500);
    while (Clock::now() < settle && RelayAndReap(children)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    failed = PrimaryFailure(children, failed);
  }
  // Every failure so far echoes another's, and some ranks still run: those
  // are the ones the others waited for (stopped, hung, or stuck on data).
  std::vector<int> stalled;
  std::string stalled_state;
  if (failed >= 0 && g_signal.load() == 0 && IsEcho(children[static_cast<size_t>(failed)])) {
    for (RankChild& c : children) {
      if (!c.done && c.process.pid() > 0) {
        stalled.push_back(c.rank);
        if (stalled_state.empty()) stalled_state = ring::ProcessState(c.process.pid());
      }
    }
  }

  // Stop whatever still runs: SIGTERM, then SIGKILL after a grace period.
  std::vector<int> stopped;
  for (RankChild& c : children) {
    if (!c.done && c.process.pid() > 0) {
      kill(c.process.pid(), SIGTERM);
      kill(c.process.pid(), SIGCONT);  // a stopped rank (SIGSTOP) acts on SIGTERM only once continued
      stopped.push_back(c.rank);
    }
  }
  const auto grace_end = Clock::now() + std::chrono::seconds(10);
  while (RelayAndReap(children)) {
    if (Clock::now() > grace_end) {
      for (RankChild& c : children) {
        if (!c.done) {
          c.process.Kill();
          c.process.Exited(&c.exit);
          c.done = true;
          Drain(&c, true);
        }
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (RankChild& c : children) {
    if (c.err_fd >= 0) close(c.err_fd);
  }
  if (result.exit_code != 0) return result;

  const std::string others =
      stopped.empty() ? "" : "; stopped rank" + std::string(stopped.size() > 1 ? "s " : " ") +
                                 RankList(stopped);
  if (g_signal.load() != 0 && failed < 0) {
    const int sig = g_signal.load();
    return {128 + sig, "trainer: stopped by " + std::string(SignalName(sig)) + others};
  }
  if (failed >= 0) {
    RankChild& c = children[static_cast<size_t>(failed)];
    std::string cause = c.exit.Describe();
    if (WIFEXITED(c.exit.status) && !c.last_line.empty()) cause += ": " + c.last_line;
    std::vector<int> echoes;  // ranks that failed after it, by themselves
    for (const RankChild& x : children) {
      if (&x != &c && x.done && !x.exit.Succeeded() &&
          std::find(stopped.begin(), stopped.end(), x.rank) == stopped.end()) {
        echoes.push_back(x.rank);
      }
    }
    // Every failed rank says the same (a bad checkpoint, say): one message.
    auto text = [](const RankChild& x) {
      const std::string prefix = "trainer rank " + std::to_string(x.rank) + ": ";
      std::string t = x.last_line.rfind(prefix, 0) == 0 ? x.last_line.substr(prefix.size()) : x.last_line;
      return t.rfind("error: ", 0) == 0 ? t.substr(7) : t;
    };
    bool same = !echoes.empty() && stalled.empty() && WIFEXITED(c.exit.status);
    for (const RankChild& x : children) {
      if (same && std::find(echoes.begin(), echoes.end(), x.rank) != echoes.end()) {
        same = x.exit.status == c.exit.status && text(x) == text(c);
      }
    }
    if (same) {
      std::vector<int> all = echoes;
      all.push_back(c.rank);
      std::sort(all.begin(), all.end());
      return {1, "trainer: ranks " + RankList(all) + " failed alike (" + c.exit.Describe() + ": " + text(c) +
                     ")" + others};
    }
    std::string also;
    if (!echoes.empty()) {
      also = "; rank" + std::string(echoes.size() > 1 ? "s " : " ") + RankList(echoes) + " failed after it (see above)";
    }
    if (!stalled.empty()) {
      return {1, "trainer: rank" + std::string(stalled.size() > 1 ? "s " : " ") + RankList(stalled) +
                     " made no progress (" + (stalled.size() > 1 ? "the first is " : "its process is ") +
                     stalled_state + "): rank " + std::to_string(c.rank) + " gave up waiting for " +
                     (stalled.size() > 1 ? "them" : "it") + " (" + cause + ")" + also + others};
    }
    return {1, "trainer: rank " + std::to_string(c.rank) + " failed (" + cause + ")" + also + others};
  }
  return {0, ""};
}

}  // namespace nl::trainer
