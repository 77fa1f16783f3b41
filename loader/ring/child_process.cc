#include "loader/ring/child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
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

namespace {

// The environment with `extra` ("NAME=value") put in place of same-named entries.
std::vector<std::string> MergedEnvironment(const std::vector<std::string>& extra) {
  std::vector<std::string> env;
  for (char** e = environ; e && *e; ++e) {
    const std::string entry(*e);
    bool replaced = false;
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
                                         int stderr_fd) {
  if (args.empty()) return Status::InvalidArgument("ChildProcess::Start: no program");
  // Everything the child needs is built before fork: after it, in a process
  // that may have threads, the child only makes async-signal-safe calls.
  std::vector<std::string> argv_s = args, env_s = MergedEnvironment(extra_env);
  std::vector<char*> argv = Pointers(argv_s), envp = Pointers(env_s);
  int report[2];  // the exec's errno comes back here; a close-on-exec pipe
  if (pipe2(report, O_CLOEXEC) != 0) {
    return Status::FromErrno("cannot make a pipe to start " + args[0], errno);
  }
  ring::Fd report_read(report[0]), report_write(report[1]);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) return Status::FromErrno("cannot fork to start " + args[0], errno);
  if (pid == 0) {
    int err = 0;
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) err = errno;
    if (err == 0 && getppid() != parent) _exit(127);  // the parent died before the prctl
    if (err == 0 && stdout_fd >= 0 && dup2(stdout_fd, 1) < 0) err = errno;
    if (err == 0 && stderr_fd >= 0 && dup2(stderr_fd, 2) < 0) err = errno;
    if (err == 0) {
      execve(argv[0], argv.data(), envp.data());
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
  if (n > 0) {  // the exec failed: the child has exited (reaped by child's destructor)
    return Status::FromErrno("cannot run " + args[0], err);
  }
  return child;
}

ChildProcess::~ChildProcess() { Kill(); }

ChildProcess::ChildProcess(ChildProcess&& o) noexcept
    : pid_(std::exchange(o.pid_, -1)), exit_(o.exit_) {}

ChildProcess& ChildProcess::operator=(ChildProcess&& o) noexcept {
  if (this != &o) {
    Kill();
    pid_ = std::exchange(o.pid_, -1);
    exit_ = o.exit_;
  }
  return *this;
}

void ChildProcess::Kill() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  while (wait4(pid_, &exit_.status, 0, &exit_.usage) < 0 && errno == EINTR) {
  }
  pid_ = -1;
}

bool ChildProcess::Exited(ChildExit* e) {
  if (pid_ > 0) {
    ChildExit got;
    const pid_t r = wait4(pid_, &got.status, WNOHANG, &got.usage);
    if (r == 0 || (r < 0 && errno == EINTR)) return false;
    exit_ = got;  // (r < 0: not ours to wait for any more)
    pid_ = -1;
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
    pid_ = -1;
    exit_ = e;
    return e;
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

Result<ring::Fd> MakeLogFd(const char* name) {
  const int fd = memfd_create(name, MFD_CLOEXEC);
  if (fd < 0) return Status::FromErrno(std::string("cannot make a memory file for ") + name, errno);
  return ring::Fd(fd);
}

}  // namespace nl::proc
