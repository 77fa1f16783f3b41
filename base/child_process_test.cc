// The spawner: what a child reports on its failure channel reaches its
// parent as a value, only its own children's channels reach a process, and
// Fork runs a body in a child that runs no program.
#include "base/child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

namespace nl::proc {
namespace {

ChildExit RunShell(const std::string& script, bool channel) {
  Result<ChildProcess> c = ChildProcess::Start({"/bin/sh", "-c", script}, {}, -1, -1, channel);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  Result<ChildExit> e = c->WaitFor(30.0, "the test's shell");
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return *e;
}

TEST(FailureChannel, AReportedEchoReachesTheParentWithItsMessage) {
  const ChildExit e = RunShell(
      R"(printf 'nl-failure 1 echo lost a peer in a collective (allreduce)\n' >&"$NL_FAILURE_FD"; exit 1)", true);
  EXPECT_EQ(WEXITSTATUS(e.status), 1);
  EXPECT_EQ(e.failure.kind, FailureKind::kEcho);
  EXPECT_EQ(e.failure.message, "lost a peer in a collective (allreduce)");
}

TEST(FailureChannel, WriteFailureReportIsWhatTheParentReads) {
  // The child is this test binary's own writer, run through a shell pipe:
  // WriteFailureReport's line parsed back gives the same kind and message.
  int p[2];
  ASSERT_EQ(pipe(p), 0);
  WriteFailureReport(p[1], FailureKind::kOwn, "cannot read shard 3:\nbad checksum");
  close(p[1]);
  char buf[4096];
  const ssize_t n = read(p[0], buf, sizeof buf);
  close(p[0]);
  ASSERT_GT(n, 0);
  const FailureReport r = ParseFailureReport(std::string(buf, static_cast<size_t>(n)));
  EXPECT_EQ(r.kind, FailureKind::kOwn);
  EXPECT_EQ(r.message, "cannot read shard 3: bad checksum");  // one line
}

TEST(FailureChannel, NothingReportedIsKindNoneWhateverTheChildPrints) {
  // Its stderr says what an echo would say: the parent does not read words.
  const ChildExit e = RunShell("echo 'Connection closed by peer' >&2; exit 1", true);
  EXPECT_EQ(e.failure.kind, FailureKind::kNone);
  const ChildExit killed = RunShell("kill -9 $$", true);
  EXPECT_TRUE(WIFSIGNALED(killed.status));
  EXPECT_EQ(killed.failure.kind, FailureKind::kNone);
}

TEST(FailureChannel, AChildWithoutAChannelDoesNotSeeOurs) {
  // A rank (started with a channel) starts its loader service without one:
  // the variable it inherited is not passed on.
  setenv(kFailureFdVariable, "2", 1);
  const ChildExit e2 = RunShell(R"(test -z "$NL_FAILURE_FD")", false);
  unsetenv(kFailureFdVariable);
  EXPECT_TRUE(e2.Succeeded()) << "a child started without a channel inherited NL_FAILURE_FD";
}

TEST(FailureChannel, MalformedOrCutReportsAreNone) {
  EXPECT_EQ(ParseFailureReport("").kind, FailureKind::kNone);
  EXPECT_EQ(ParseFailureReport("nl-failure 1 echo cut short").kind, FailureKind::kNone);  // no newline
  EXPECT_EQ(ParseFailureReport("nl-failure 1 maybe x\n").kind, FailureKind::kNone);
  EXPECT_EQ(ParseFailureReport("nl-failure 2 echo x\n").kind, FailureKind::kNone);
  EXPECT_EQ(ParseFailureReport("xnl-failure 1 echo x\n").kind, FailureKind::kNone);
  const FailureReport last = ParseFailureReport("nl-failure 1 echo first\nnl-failure 1 own second\n");
  EXPECT_EQ(last.kind, FailureKind::kOwn);  // the last report counts
  EXPECT_EQ(last.message, "second");
}

TEST(FailureChannel, TakeFailureFdAcceptsOnlyAnOpenDescriptorNumber) {
  EXPECT_EQ(TakeFailureFd(nullptr), -1);
  EXPECT_EQ(TakeFailureFd(""), -1);
  EXPECT_EQ(TakeFailureFd("-1"), -1);
  EXPECT_EQ(TakeFailureFd("3x"), -1);
  EXPECT_EQ(TakeFailureFd("99999999999999999999"), -1);
  EXPECT_EQ(TakeFailureFd("1000000"), -1);  // not open
  int p[2];
  ASSERT_EQ(pipe(p), 0);
  const int fd = TakeFailureFd(std::to_string(p[1]).c_str());
  EXPECT_EQ(fd, p[1]);
  EXPECT_NE(fcntl(fd, F_GETFD) & FD_CLOEXEC, 0) << "a grandchild would inherit the channel";
  close(p[0]);
  close(p[1]);
}

}  // namespace
}  // namespace nl::proc

namespace nl::proc {
namespace {

// Fork: a child that runs no program; its body's return is its exit status,
// its stderr goes where it is told, and a crash is a signal, not ours.
TEST(ChildProcessFork, TheBodysReturnIsTheExitAndItsOutputGoesWhereTold) {
  int p[2];
  ASSERT_EQ(pipe2(p, O_CLOEXEC), 0);
  const std::function<int()> body = [] {
    dprintf(2, "from the child\n");
    return 7;
  };
  Result<ChildProcess> c = ChildProcess::Fork("a test body", body, -1, p[1]);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  close(p[1]);
  Result<ChildExit> e = c->WaitFor(30.0, "a test body");
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(e->Describe(), "exit status 7");
  char buf[64] = {0};
  EXPECT_EQ(read(p[0], buf, sizeof buf - 1), 15);
  EXPECT_STREQ(buf, "from the child\n");
  close(p[0]);

  const std::function<int()> crash = [] {
    raise(SIGABRT);
    return 0;
  };
  Result<ChildProcess> d = ChildProcess::Fork("a crashing body", crash, -1, -1);
  ASSERT_TRUE(d.ok());
  Result<ChildExit> f = d->WaitFor(30.0, "a crashing body");
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->Describe(), "killed by signal 6");
}

// The same watchdog as a program's: a hung body is killed at the deadline.
TEST(ChildProcessFork, AHungBodyIsKilled) {
  const std::function<int()> hang = [] {
    pause();
    return 0;
  };
  Result<ChildProcess> c = ChildProcess::Fork("a hung body", hang, -1, -1);
  ASSERT_TRUE(c.ok());
  Result<ChildExit> e = c->WaitFor(0.2, "a hung body");
  EXPECT_EQ(e.status().code(), StatusCode::kDeadlineExceeded);
}

}  // namespace
}  // namespace nl::proc
