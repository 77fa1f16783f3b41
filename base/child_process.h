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

#include <functional>
#include <string>
#include <vector>

#include "base/status.h"
#include "base/fd.h"

namespace nl::proc {

// Why a process failed, as a value its parent reads: never worked out from
// the wording of its human message. A child started with a failure channel
// writes one line there before it exits with an error (WriteFailureReport);
// the parent finds it in ChildExit::failure.
enum class FailureKind : uint8_t {
  kNone,  // nothing reported: it succeeded, was killed, or failed before it could say
  kOwn,   // its own failure: bad data or options, a resource it lacked, a bug
  kEcho,  // only the consequence of another process's failure or stall: a peer
          // lost in a collective, a collective or rendezvous timeout, the
          // rendezvous store gone
};
const char* FailureKindName(FailureKind k);  // "none", "own", "echo"

struct FailureReport {
  FailureKind kind = FailureKind::kNone;
  std::string message;  // the child's own one-line account ("" when none)
};

// The variable that tells a child its channel's descriptor number.
inline constexpr const char* kFailureFdVariable = "NL_FAILURE_FD";

// Child side. The command line reads kFailureFdVariable and passes its value
// here: the descriptor, now close-on-exec (so grandchildren never write to
// it), or -1 when the value is absent or not an open descriptor.
int TakeFailureFd(const char* value);
// Writes "nl-failure 1 <kind> <message>" (newlines in the message become
// spaces; cut at 2 KiB) to fd; nothing when fd < 0. Best effort.
void WriteFailureReport(int fd, FailureKind kind, const std::string& message);
// Parent side (and tests): the report in what a channel held; kNone when it
// holds none, or only a malformed one.
FailureReport ParseFailureReport(const std::string& bytes);

struct ChildExit {
  int status = 0;  // as waitpid's
  rusage usage{};  // the child's own resources (its CPU time)
  FailureReport failure;  // from its failure channel, if it was given one
  // "exit status 3", "killed by signal 9".
  std::string Describe() const;
  bool Succeeded() const;
};

class ChildProcess {
 public:
  // Runs args[0] (a path) with args, the environment plus `extra_env`
  // ("NAME=value", replacing a variable of that name), stdout and stderr on
  // the given descriptors (-1: inherited). An exec failure is an error here,
  // with the path and errno. With failure_channel, the child gets a pipe's
  // write end named by kFailureFdVariable, and what it reports there is in
  // its ChildExit; without, that variable is removed from its environment.
  static Result<ChildProcess> Start(const std::vector<std::string>& args,
                                    const std::vector<std::string>& extra_env, int stdout_fd,
                                    int stderr_fd, bool failure_channel = false);
  // Runs body() in a child that runs no program (work that may crash, hang
  // or leak, kept out of this process: hwloc's discovery of the machine),
  // with the same parent-death signal and stdout and stderr on the given
  // descriptors (-1: inherited); body's return is the child's exit status.
  // The child is a fork of a process that may have threads: what body calls
  // must not need a lock another thread held at the fork (hwloc's discovery
  // allocates: a child stuck so is what the caller's watchdog is for). An
  // exception out of body ends the child with status 126. `what` names it in
  // errors.
  static Result<ChildProcess> Fork(const std::string& what, const std::function<int()>& body, int stdout_fd,
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
  // What Start and Fork hand the one fork: a program (argv, envp) or a body.
  struct Launch {
    std::string what;
    char* const* argv = nullptr;
    char* const* envp = nullptr;
    const std::function<int()>* body = nullptr;
    int stdout_fd = -1, stderr_fd = -1, channel_fd = -1;
  };
  static Result<ChildProcess> Spawn(const Launch& l);
  // Once reaped: the failure channel's report into exit_.
  void Reaped();
  pid_t pid_ = -1;  // -1 once reaped
  ChildExit exit_;  // once reaped
  Fd failure_read_;  // the failure channel's read end (none: invalid)
};

// The last `max_lines` lines of what a descriptor (a memfd or file the child
// wrote) holds, read from offset 0; "" when empty.
std::string TailOf(int fd, int max_lines);
// Every line of it that contains `needle`.
std::vector<std::string> LinesWith(int fd, const std::string& needle);
// A descriptor for a child's output: an anonymous memory file (nothing on disk).
Result<Fd> MakeLogFd(const char* name);

// What a process is doing, for a message about a peer that does not answer:
// "running", "stopped (SIGSTOP, Ctrl-Z or a debugger)", "a zombie (...)",
// "in uninterruptible sleep (...)", "alive", or "gone", from /proc/<pid>/stat.
std::string ProcessState(pid_t pid);

}  // namespace nl::proc
