#include "lib/base/signals.h"

#include <signal.h>
#include <unistd.h>

#include "gtest/gtest.h"

namespace swaserve::base {
namespace {

void (*Disposition())(int) {
  struct sigaction current {};
  EXPECT_EQ(sigaction(SIGPIPE, nullptr, &current), 0);
  return current.sa_handler;
}

void SetDisposition(void (*handler)(int)) {
  struct sigaction action {};
  action.sa_handler = handler;
  sigemptyset(&action.sa_mask);
  ASSERT_EQ(sigaction(SIGPIPE, &action, nullptr), 0);
}

void CountingHandler(int) {}

TEST(IgnoreSigpipeIfDefaultTest, DefaultBecomesIgnored) {
  SetDisposition(SIG_DFL);
  IgnoreSigpipeIfDefault();
  EXPECT_EQ(Disposition(), SIG_IGN);
  IgnoreSigpipeIfDefault();  // idempotent
  EXPECT_EQ(Disposition(), SIG_IGN);
  // A write to a closed pipe now fails instead of killing the process.
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  close(fds[0]);
  EXPECT_EQ(write(fds[1], "x", 1), -1);
  close(fds[1]);
  SetDisposition(SIG_DFL);
}

TEST(IgnoreSigpipeIfDefaultTest, InstalledHandlerIsKept) {
  SetDisposition(CountingHandler);
  IgnoreSigpipeIfDefault();
  EXPECT_EQ(Disposition(), &CountingHandler);
  SetDisposition(SIG_DFL);
}

}  // namespace
}  // namespace swaserve::base
