// lib/transfer/process_identity.h: who a process is, and whether a peer on
// this host has exited — checked against real child processes.
#include "lib/transfer/process_identity.h"

#include <sys/wait.h>
#include <unistd.h>

#include "gtest/gtest.h"

namespace swaserve::transfer::internal {
namespace {

// A child that sleeps until killed; reaped (or not) by the test.
pid_t SpawnSleeper() {
  const pid_t pid = fork();
  if (pid == 0) {
    pause();
    _exit(0);
  }
  return pid;
}

wire::ProcessIdentity IdentityOf(pid_t pid, const wire::ProcessIdentity& self) {
  wire::ProcessIdentity id = self;
  id.pid = static_cast<uint64_t>(pid);
  char state = 0;
  EXPECT_TRUE(ReadProcStat(id.pid, &state, &id.start_time));
  return id;
}

TEST(ProcessIdentity, SelfIsKnownAndAlive) {
  const wire::ProcessIdentity self = SelfIdentity();
  EXPECT_NE(self.boot_id, 0u);
  EXPECT_NE(self.pid_namespace, 0u);
  EXPECT_EQ(self.pid, static_cast<uint64_t>(getpid()));
  EXPECT_NE(self.start_time, 0u);
  EXPECT_FALSE(ProcessGone(self, self));
  char state = 0;
  uint64_t start = 0;
  ASSERT_TRUE(ReadProcStat(self.pid, &state, &start));
  EXPECT_EQ(start, self.start_time);
  EXPECT_TRUE(state == 'R' || state == 'S') << state;
}

TEST(ProcessIdentity, LiveChildIsNotGoneReapedChildIs) {
  const wire::ProcessIdentity self = SelfIdentity();
  const pid_t pid = SpawnSleeper();
  ASSERT_GT(pid, 0);
  const wire::ProcessIdentity child = IdentityOf(pid, self);
  EXPECT_FALSE(ProcessGone(child, self));
  kill(pid, SIGKILL);
  ASSERT_EQ(waitpid(pid, nullptr, 0), pid);
  char state = 0;
  uint64_t start = 0;
  EXPECT_FALSE(ReadProcStat(child.pid, &state, &start));
  EXPECT_TRUE(ProcessGone(child, self));
}

TEST(ProcessIdentity, ZombieIsGone) {
  const wire::ProcessIdentity self = SelfIdentity();
  const pid_t pid = SpawnSleeper();
  ASSERT_GT(pid, 0);
  const wire::ProcessIdentity child = IdentityOf(pid, self);
  kill(pid, SIGKILL);
  // Not reaped yet: a zombie ('Z') until waitpid.
  siginfo_t info{};
  ASSERT_EQ(waitid(P_PID, pid, &info, WEXITED | WNOWAIT), 0);
  EXPECT_TRUE(ProcessGone(child, self));
  ASSERT_EQ(waitpid(pid, nullptr, 0), pid);
}

TEST(ProcessIdentity, ReusedPidIsGone) {
  const wire::ProcessIdentity self = SelfIdentity();
  wire::ProcessIdentity other = self;
  other.start_time = self.start_time + 1;  // our pid, another process
  EXPECT_TRUE(ProcessGone(other, self));
}

TEST(ProcessIdentity, UnknowableIsNeverGone) {
  const wire::ProcessIdentity self = SelfIdentity();
  wire::ProcessIdentity dead = self;
  dead.pid = 0x7ffffffe;  // no such process here
  ASSERT_TRUE(ProcessGone(dead, self));
  wire::ProcessIdentity other_host = dead;
  other_host.boot_id = self.boot_id + 1;
  EXPECT_FALSE(ProcessGone(other_host, self));
  wire::ProcessIdentity other_ns = dead;
  other_ns.pid_namespace = self.pid_namespace + 1;
  EXPECT_FALSE(ProcessGone(other_ns, self));
  wire::ProcessIdentity unknown = dead;
  unknown.boot_id = 0;
  EXPECT_FALSE(ProcessGone(unknown, self));
  EXPECT_FALSE(ProcessGone(wire::ProcessIdentity{}, self));
}

}  // namespace
}  // namespace swaserve::transfer::internal
