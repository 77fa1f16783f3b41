#include "base/child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <thread>
#include <utility>

extern "C" char** environ;

namespace nl::proc {

std::string ChildExit::Describe() const {
  if (WIFSIGNALED(status)) return "killed by signal " + std::to_string(WTERMSIG(status));
  if (WIFEXITED(status)) return "exit status " + std::to_string(WEXITSTATUS(status));
  return "wait status " + std::to_string(status);
}

bool ChildExit::Succeeded() const { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }

const char* FailureKindName(FailureKind k) {
  switch (k) {
    case FailureKind::kOwn:
      return "own";
    case FailureKind::kEcho:
      return "echo";
    case FailureKind::kNone:
      break;
  }
  return "none";
}

namespace {
constexpr const char kReportTag[] = "nl-failure 1 ";
constexpr size_t kMaxReportMessage = 2048;
}  // namespace

int TakeFailureFd(const char* value) {
  if (value == nullptr || *value == '\0') return -1;
  int fd = 0;
  for (const char* c = value; *c; ++c) {
    if (*c < '0' || *c > '9' || fd > 1000000) return -1;
    fd = fd * 10 + (*c - '0');
  }
  const int flags = fcntl(fd, F_GETFD);
  if (flags < 0) return -1;
  fcntl(fd, F_SETFD, flags | FD_CLOEXEC);
  return fd;
}

void WriteFailureReport(int fd, FailureKind kind, const std::string& message) {
  if (fd < 0 || kind == FailureKind::kNone) return;
  std::string line = kReportTag;
  line += FailureKindName(kind);
  line += ' ';
  for (char c : message.substr(0, kMaxReportMessage)) line += (c == '\n' || c == '\r') ? ' ' : c;
  line += '\n';
  ssize_t w;
  do {
    w = write(fd, line.data(), line.size());  // under PIPE_BUF: one atomic write
  } while (w < 0 && errno == EINTR);
}

FailureReport ParseFailureReport(const std::string& bytes) {
  FailureReport r;
  const size_t at = bytes.rfind(kReportTag);  // the last report counts
  if (at == std::string::npos || (at > 0 && bytes[at - 1] != '\n')) return r;
  const size_t end = bytes.find('\n', at);
  if (end == std::string::npos) return r;  // cut short: not a report
  const std::string body = bytes.substr(at + sizeof kReportTag - 1, end - at - (sizeof kReportTag - 1));
  const size_t sp = body.find(' ');
  const std::string kind = body.substr(0, sp);
  if (kind == "own") {
    r.kind = FailureKind::kOwn;
  } else if (kind == "echo") {
    r.kind = FailureKind::kEcho;
  } else {
    return r;
  }
  r.message = sp == std::string::npos ? "" : body.substr(sp + 1);
  return r;
}

namespace {

// The environment with `extra` ("NAME=value") put in place of same-named
// entries, less a failure channel of ours (a child has its own, or none).
std::vector<std::string> MergedEnvironment(const std::vector<std::string>& extra) {
  std::vector<std::string> env;
  const std::string channel = std::string(kFailureFdVariable) + "=";
  for (char** e = environ; e && *e; ++e) {
    const std::string entry(*e);
    bool replaced = entry.rfind(channel, 0) == 0;
    for (const std::string& x : extra) {
      const size_t eq = x.find('=');
      if (eq != std::string::npos && entry.compare(0, eq + 1, x, 0, eq + 1) == 0) replaced = true;
    }
    if (!replaced) env.push_back(entry);
  }
  env.insert(env.end(), extra.begin(), extra.end());
  return env;
}

std::vector<char*> Pointers(std::vector<std::string>& v) {
  std::vector<char*> p;
  for (std::string& s : v) p.push_back(s.data());
  p.push_back(nullptr);
  return p;
}

}  // namespace

Result<ChildProcess> ChildProcess::Start(const std::vector<std::string>& args,
                                         const std::vector<std::string>& extra_env, int stdout_fd,
                                         int stderr_fd, bool failure_channel) {
  if (args.empty()) return Status::InvalidArgument("ChildProcess::Start: no program");
  Fd failure_read, failure_write;
  if (failure_channel) {
    int f[2];
    if (pipe2(f, O_CLOEXEC | O_NONBLOCK) != 0) {
      return Status::FromErrno("cannot make a pipe to start " + args[0], errno);
    }
    failure_read = Fd(f[0]);
    failure_write = Fd(f[1]);
  }
  // Everything the child needs is built before fork: after it, in a process
  // that may have threads, the child only makes async-signal-safe calls.
  std::vector<std::string> argv_s = args, env_s = MergedEnvironment(extra_env);
  if (failure_channel) {
    env_s.push_back(std::string(kFailureFdVariable) + "=" + std::to_string(failure_write.get()));
  }
  std::vector<char*> argv = Pointers(argv_s), envp = Pointers(env_s);
  Launch l;
  l.what = args[0];
  l.argv = argv.data();
  l.envp = envp.data();
  l.stdout_fd = stdout_fd;
  l.stderr_fd = stderr_fd;
  l.channel_fd = failure_write.get();
  NL_ASSIGN_OR_RETURN(ChildProcess child, Spawn(l));
  child.failure_read_ = std::move(failure_read);
  return child;
}

Result<ChildProcess> ChildProcess::Fork(const std::string& what, const std::function<int()>& body,
                                        int stdout_fd, int stderr_fd) {
  Launch l;
  l.what = what;
  l.body = &body;
  l.stdout_fd = stdout_fd;
  l.stderr_fd = stderr_fd;
  return Spawn(l);
}

// The one fork of the project. The child: the parent-death signal (and a
// check that the parent did not die before it was set), its stdout and
// stderr, the failure channel kept across exec; then the program, or the
// body (whose return is its exit status). An error in the setup or the
// exec comes back through a close-on-exec pipe as the child's errno.
Result<ChildProcess> ChildProcess::Spawn(const Launch& l) {
  int report[2];
  if (pipe2(report, O_CLOEXEC) != 0) return Status::FromErrno("cannot make a pipe to start " + l.what, errno);
  Fd report_read(report[0]), report_write(report[1]);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) return Status::FromErrno("cannot fork to start " + l.what, errno);
  if (pid == 0) {
    int err = 0;
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) err = errno;
    if (err == 0 && getppid() != parent) _exit(127);  // the parent died before the prctl
    if (err == 0 && l.stdout_fd >= 0 && dup2(l.stdout_fd, 1) < 0) err = errno;
    if (err == 0 && l.stderr_fd >= 0 && dup2(l.stderr_fd, 2) < 0) err = errno;
    if (err == 0 && l.channel_fd >= 0 && fcntl(l.channel_fd, F_SETFD, 0) != 0) err = errno;  // kept across exec
    if (err == 0 && l.body) {
      report_write.Reset();  // set up: the parent reads no errno
      try {
        _exit((*l.body)());
      } catch (...) {  // never unwind into the parent's code in the child
        _exit(126);
      }
    }
    if (err == 0) {
      execve(l.argv[0], l.argv, l.envp);
      err = errno;
    }
    ssize_t ignored = write(report[1], &err, sizeof err);
    (void)ignored;
    _exit(127);
  }
  ChildProcess child(pid);
  report_write.Reset();
  int err = 0;
  ssize_t n;
  do {
    n = read(report_read.get(), &err, sizeof err);
  } while (n < 0 && errno == EINTR);
  if (n > 0) {  // the setup or the exec failed: the child has exited (reaped by child's destructor)
    return Status::FromErrno((l.body ? "cannot start " : "cannot run ") + l.what, err);
  }
  return child;
}

ChildProcess::~ChildProcess() { Kill(); }

ChildProcess::ChildProcess(ChildProcess&& o) noexcept
    : pid_(std::exchange(o.pid_, -1)), exit_(o.exit_), failure_read_(std::move(o.failure_read_)) {}

ChildProcess& ChildProcess::operator=(ChildProcess&& o) noexcept {
  if (this != &o) {
    Kill();
    pid_ = std::exchange(o.pid_, -1);
    exit_ = o.exit_;
    failure_read_ = std::move(o.failure_read_);
  }
  return *this;
}

void ChildProcess::Reaped() {
  pid_ = -1;
  if (!failure_read_.valid()) return;
  std::string bytes;
  char buf[4096];
  while (bytes.size() < 65536) {  // non-blocking: what the child wrote before it ended
    const ssize_t n = read(failure_read_.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    bytes.append(buf, static_cast<size_t>(n));
  }
  failure_read_.Reset();
  exit_.failure = ParseFailureReport(bytes);
}

void ChildProcess::Kill() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  while (wait4(pid_, &exit_.status, 0, &exit_.usage) < 0 && errno == EINTR) {
  }
  Reaped();
}

bool ChildProcess::Exited(ChildExit* e) {
  if (pid_ > 0) {
    ChildExit got;
    const pid_t r = wait4(pid_, &got.status, WNOHANG, &got.usage);
    if (r == 0 || (r < 0 && errno == EINTR)) return false;
    exit_ = got;  // (r < 0: not ours to wait for any more)
    Reaped();
  }
  if (e) *e = exit_;
  return true;
}

Result<ChildExit> ChildProcess::WaitFor(double timeout_s, const std::string& what) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  ChildExit e;
  if (timeout_s < 0) {
    if (pid_ <= 0) return exit_;
    while (wait4(pid_, &e.status, 0, &e.usage) < 0) {
      if (errno != EINTR) {
        const int err = errno;
        pid_ = -1;
        return Status::FromErrno("waiting for " + what, err);
      }
    }
    exit_ = e;
    Reaped();
    return exit_;
  }
  while (!Exited(&e)) {
    if (std::chrono::duration<double>(Clock::now() - start).count() >= timeout_s) {
      const pid_t pid = pid_;
      Kill();
      return Status::DeadlineExceeded(what + " (pid " + std::to_string(pid) + ") had not exited " +
                                      std::to_string(timeout_s) +
                                      " s after its work was done: killed");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return e;
}

std::string ProcessState(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!in || !std::getline(in, line)) return "gone";
  const size_t close = line.rfind(')');
  if (close == std::string::npos || close + 2 >= line.size()) return "unknown";
  switch (line[close + 2]) {
    case 'T':
    case 't':
      return "stopped (SIGSTOP, Ctrl-Z or a debugger)";
    case 'Z':
      return "a zombie (it exited; its parent has not reaped it)";
    case 'D':
      return "in uninterruptible sleep (waiting on storage)";
    case 'R':
      return "running";
    default:
      return "alive";
  }
}


namespace {
std::string ReadAll(int fd) {
  std::string all;
  char buf[8192];
  off_t at = 0;
  while (true) {
    const ssize_t n = pread(fd, buf, sizeof buf, at);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    all.append(buf, static_cast<size_t>(n));
    at += n;
  }
  return all;
}

std::vector<std::string> Lines(const std::string& s) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at < s.size()) {
    size_t nl = s.find('\n', at);
    if (nl == std::string::npos) nl = s.size();
    if (nl > at) out.push_back(s.substr(at, nl - at));
    at = nl + 1;
  }
  return out;
}
}  // namespace

std::string TailOf(int fd, int max_lines) {
  const std::vector<std::string> lines = Lines(ReadAll(fd));
  std::string out;
  const size_t from = lines.size() > static_cast<size_t>(max_lines) ? lines.size() - max_lines : 0;
  for (size_t i = from; i < lines.size(); ++i) out += (out.empty() ? "" : " | ") + lines[i];
  return out;
}

std::vector<std::string> LinesWith(int fd, const std::string& needle) {
  std::vector<std::string> out;
  for (std::string& l : Lines(ReadAll(fd)))
    if (l.find(needle) != std::string::npos) out.push_back(std::move(l));
  return out;
}

Result<Fd> MakeLogFd(const char* name) {
  const int fd = memfd_create(name, MFD_CLOEXEC);
  if (fd < 0) return Status::FromErrno(std::string("cannot make a memory file for ") + name, errno);
  return Fd(fd);
}

}  // namespace nl::proc
