// The spawner's failure channel: what a child reports there reaches its
// parent as a value, and only its own children's channels reach a process.
#include "base/child_process.h"

#include <fcntl.h>
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
