// The launcher's verdict on a failed job, from what each rank became: the
// cause is chosen by the kind each rank reported (a value), never by the
// words of its last line.
#include "trainer/launcher.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <string>
#include <vector>

namespace nl::trainer {
namespace {

RankOutcome Exited(int rank, int code, proc::FailureKind kind, const std::string& last_line) {
  RankOutcome r;
  r.rank = rank;
  r.done = true;
  r.exit.status = code << 8;  // as waitpid's for exit(code)
  r.exit.failure.kind = kind;
  r.last_line = last_line;
  return r;
}

RankOutcome Killed(int rank, int sig) {
  RankOutcome r;
  r.rank = rank;
  r.done = true;
  r.exit.status = sig;  // as waitpid's for a death by signal
  return r;
}

RankOutcome Running(int rank) {
  RankOutcome r;
  r.rank = rank;
  return r;
}

using proc::FailureKind;

TEST(Launcher, AnEchoIsWhatTheRankReportedNotWhatItsMessageSays) {
  EXPECT_TRUE(IsEcho(Exited(0, 1, FailureKind::kEcho, "trainer rank 0: error: something reworded")));
  EXPECT_FALSE(IsEcho(Exited(0, 1, FailureKind::kOwn, "trainer rank 0: error: Connection closed by peer")));
  EXPECT_FALSE(IsEcho(Exited(0, 1, FailureKind::kNone, "in a collective, at the rendezvous")));
  EXPECT_FALSE(IsEcho(Killed(0, SIGKILL)));
}

TEST(Launcher, TheCauseIsARankKilledByASignalThenOneThatDidNotEcho) {
  // Rank 0 failed first, only echoing; rank 2 failed by itself.
  std::vector<RankOutcome> v = {Exited(0, 1, FailureKind::kEcho, "lost a peer"),
                                Exited(1, 1, FailureKind::kEcho, "lost a peer"),
                                Exited(2, 1, FailureKind::kOwn, "cannot read shard 3")};
  EXPECT_EQ(PrimaryFailure(v, 0), 2);
  v.push_back(Killed(3, SIGKILL));
  EXPECT_EQ(PrimaryFailure(v, 0), 3);
  // All echoes: the first to fail stays the one named.
  std::vector<RankOutcome> echoes = {Exited(0, 1, FailureKind::kEcho, "a"), Exited(1, 1, FailureKind::kEcho, "b")};
  EXPECT_EQ(PrimaryFailure(echoes, 1), 1);
}

TEST(Launcher, TheVerdictNamesTheCauseTheEchoesAndTheStopped) {
  std::vector<RankOutcome> v = {Exited(0, 1, FailureKind::kEcho, "trainer rank 0: error: lost a peer"),
                                Exited(1, 1, FailureKind::kOwn, "trainer rank 1: error: cannot read shard 3"),
                                Running(2)};
  EXPECT_EQ(FailureVerdict(v, 1, {}, "", {2}),
            "trainer: rank 1 failed (exit status 1: trainer rank 1: error: cannot read shard 3); rank 0 failed "
            "after it (see above); stopped rank 2");
}

TEST(Launcher, RanksThatFailAlikeGetOneMessage) {
  std::vector<RankOutcome> v = {Exited(0, 1, FailureKind::kOwn, "trainer rank 0: error: bad checkpoint"),
                                Exited(1, 1, FailureKind::kOwn, "trainer rank 1: error: bad checkpoint")};
  EXPECT_EQ(FailureVerdict(v, 0, {}, "", {}), "trainer: ranks 0 and 1 failed alike (exit status 1: bad checkpoint)");
}

TEST(Launcher, WhenOnlyEchoesFailedTheRanksStillRunningAreNamed) {
  std::vector<RankOutcome> v = {Exited(0, 1, FailureKind::kEcho, "trainer rank 0: error: waited 5 s in a collective"),
                                Running(1)};
  EXPECT_EQ(FailureVerdict(v, 0, {1}, "stopped (T)", {1}),
            "trainer: rank 1 made no progress (its process is stopped (T)): rank 0 gave up waiting for it "
            "(exit status 1: trainer rank 0: error: waited 5 s in a collective); stopped rank 1");
}

}  // namespace
}  // namespace nl::trainer
