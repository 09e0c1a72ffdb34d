#include "lib/base/subprocess.h"

#include <signal.h>
#include <sys/resource.h>

#include <algorithm>
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "absl/strings/str_cat.h"

namespace swaserve::base {
namespace {

using ::testing::HasSubstr;

TEST(RunCommand, CapturesOutputAndExitCode) {
  std::string out;
  absl::StatusOr<int> code = RunCommand({"sh", "-c", "echo hi; echo err >&2; exit 3"}, &out);
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 3);
  EXPECT_THAT(out, HasSubstr("hi"));
  EXPECT_THAT(out, HasSubstr("err"));
}

TEST(RunCommand, FeedsLargeStdinWhileReadingLargeStdout) {
  std::string input(4 << 20, 'x');  // larger than any pipe buffer
  std::string out;
  absl::StatusOr<int> code = RunCommand({"cat"}, &out, absl::Seconds(30), input);
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0);
  EXPECT_EQ(out.size(), input.size());
}

TEST(RunCommand, ChildIgnoringStdinDoesNotKillUs) {
  std::string input(1 << 20, 'y');
  absl::StatusOr<int> code = RunCommand({"true"}, nullptr, absl::Seconds(10), input);
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0);
}

TEST(RunCommand, TimesOutAndKills) {
  absl::StatusOr<int> code = RunCommand({"sleep", "30"}, nullptr, absl::Milliseconds(200));
  EXPECT_EQ(code.status().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST(RunCommand, MissingProgramIsNotFound) {
  absl::StatusOr<int> code = RunCommand({"/no/such/program"}, nullptr);
  EXPECT_EQ(code.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(code.status().message(), HasSubstr("/no/such/program"));
}

TEST(Subprocess, StartWaitAndLog) {
  std::string dir = *MakeTempDir("subprocess-test");
  SubprocessOptions opts;
  opts.argv = {"sh", "-c", "echo \"$GREETING from $(pwd)\"; exit 7"};
  opts.env = {"GREETING=hello"};
  opts.log_path = dir + "/log.txt";
  opts.working_dir = "/";
  auto proc = Subprocess::Start(opts);
  ASSERT_TRUE(proc.ok()) << proc.status();
  absl::StatusOr<int> code = (*proc)->Wait(absl::Seconds(10));
  ASSERT_TRUE(code.ok());
  EXPECT_EQ(*code, 7);
  EXPECT_FALSE((*proc)->Running());
  EXPECT_THAT((*proc)->ReadLog(), HasSubstr("hello from /"));
}

// The child runs at the parent's nice value plus the increment (at most
// 19), and so do threads it starts: `nice` prints its own.
TEST(Subprocess, NiceIncrementLowersTheChildsPriority) {
  std::string dir = *MakeTempDir("subprocess-nice");
  const int parent = getpriority(PRIO_PROCESS, 0);
  for (int inc : {0, 7}) {
    SubprocessOptions opts;
    opts.argv = {"nice"};
    opts.log_path = dir + "/nice.txt";
    opts.nice_increment = inc;
    auto proc = Subprocess::Start(opts);
    ASSERT_TRUE(proc.ok()) << proc.status();
    absl::StatusOr<int> code = (*proc)->Wait(absl::Seconds(10));
    ASSERT_TRUE(code.ok());
    EXPECT_EQ(*code, 0);
    EXPECT_EQ((*proc)->ReadLog(), absl::StrCat(std::min(19, parent + inc), "\n")) << inc;
  }
}

TEST(Subprocess, StopEscalatesToSigkill) {
  SubprocessOptions opts;
  // Ignores SIGTERM: Stop must fall back to SIGKILL after the grace period.
  opts.argv = {"sh", "-c", "trap '' TERM; while true; do sleep 0.05; done"};
  opts.stop_grace = absl::Milliseconds(300);
  auto proc = Subprocess::Start(opts);
  ASSERT_TRUE(proc.ok());
  absl::SleepFor(absl::Milliseconds(100));
  absl::Time start = absl::Now();
  absl::StatusOr<int> code = (*proc)->Stop();
  ASSERT_TRUE(code.ok());
  EXPECT_EQ(*code, 128 + SIGKILL);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST(Subprocess, WaitTimesOutWhileRunningAndDestructorReaps) {
  SubprocessOptions opts;
  opts.argv = {"sleep", "30"};
  pid_t pid;
  {
    auto proc = Subprocess::Start(opts);
    ASSERT_TRUE(proc.ok());
    pid = (*proc)->pid();
    EXPECT_EQ((*proc)->Wait(absl::Milliseconds(50)).status().code(),
              absl::StatusCode::kDeadlineExceeded);
    EXPECT_TRUE((*proc)->Running());
  }
  EXPECT_NE(kill(pid, 0), 0);  // reaped: no such process
}

TEST(Subprocess, MissingProgramFailsToStart) {
  SubprocessOptions opts;
  opts.argv = {"swaserve-no-such-binary"};
  auto proc = Subprocess::Start(opts);
  EXPECT_EQ(proc.status().code(), absl::StatusCode::kNotFound);
}

TEST(Ports, PickFreePortAndWaitForIt) {
  absl::StatusOr<int> port = PickFreePort();
  ASSERT_TRUE(port.ok());
  EXPECT_GT(*port, 0);
  // Nothing listens yet: times out.
  EXPECT_EQ(WaitForTcpPort("127.0.0.1", *port, absl::Milliseconds(100)).code(),
            absl::StatusCode::kDeadlineExceeded);
  SubprocessOptions opts;
  opts.argv = {"python3", "-c",
               "import socket,time\n"
               "s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
               "s.bind(('127.0.0.1'," + std::to_string(*port) + ")); s.listen(); time.sleep(30)"};
  auto proc = Subprocess::Start(opts);
  ASSERT_TRUE(proc.ok());
  EXPECT_TRUE(WaitForTcpPort("127.0.0.1", *port, absl::Seconds(10)).ok());
  EXPECT_FALSE(WaitForTcpPort("not-an-ip", *port, absl::Seconds(1)).ok());
}

}  // namespace
}  // namespace swaserve::base
