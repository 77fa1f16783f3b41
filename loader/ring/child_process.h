// A helper process that must not outlive the process that started it
// (loader_bench runs `loader serve` and, for --consumer python, the Python
// consumer through one; the trainer its ranks and each rank its `loader serve`).
//
//   NL_ASSIGN_OR_RETURN(ChildProcess serve, ChildProcess::Start(args, {}, log_fd, log_fd));
//   ...                                  // any early return kills and reaps it
//   NL_ASSIGN_OR_RETURN(ChildExit e, serve.WaitFor(10.0));
//
// The child gets PR_SET_PDEATHSIG(SIGKILL) before its exec, so the kernel
// kills it when the starting thread dies (kill -9 included); the object's
// destructor kills (SIGKILL) and reaps a child not yet waited for. Start,
// the waits and the destructor are for the one thread that started it.
#pragma once

#include <sys/resource.h>
#include <sys/types.h>

#include <string>
#include <vector>

#include "formats/status.h"
#include "loader/ring/ring_socket.h"  // ring::Fd, an owned descriptor

namespace nl::proc {

struct ChildExit {
  int status = 0;  // as waitpid's
  rusage usage{};  // the child's own resources (its CPU time)
  // "exit status 3", "killed by signal 9".
  std::string Describe() const;
  bool Succeeded() const;
};

class ChildProcess {
 public:
  // Runs args[0] (a path) with args, the environment plus `extra_env`
  // ("NAME=value", replacing a variable of that name), stdout and stderr on
  // the given descriptors (-1: inherited). An exec failure is an error here,
  // with the path and errno.
  static Result<ChildProcess> Start(const std::vector<std::string>& args,
                                    const std::vector<std::string>& extra_env, int stdout_fd,
                                    int stderr_fd);
  ChildProcess() = default;
  ~ChildProcess();
  ChildProcess(ChildProcess&& o) noexcept;
  ChildProcess& operator=(ChildProcess&& o) noexcept;
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  // Whether it has exited; then *e is filled (on this and every later call).
  bool Exited(ChildExit* e);
  // Waits up to timeout_s (< 0: no limit); past it the child is killed and
  // reaped, and the result is DeadlineExceeded naming `what`.
  Result<ChildExit> WaitFor(double timeout_s, const std::string& what);
  // SIGKILL and reap (nothing when already reaped).
  void Kill();

 private:
  explicit ChildProcess(pid_t pid) : pid_(pid) {}
  pid_t pid_ = -1;  // -1 once reaped
  ChildExit exit_;  // once reaped
};

// The last `max_lines` lines of what a descriptor (a memfd or file the child
// wrote) holds, read from offset 0; "" when empty.
std::string TailOf(int fd, int max_lines);
// Every line of it that contains `needle`.
std::vector<std::string> LinesWith(int fd, const std::string& needle);
// A descriptor for a child's output: an anonymous memory file (nothing on disk).
Result<ring::Fd> MakeLogFd(const char* name);

}  // namespace nl::proc
