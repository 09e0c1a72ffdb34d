#include "lib/rpc/termination_signal.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "lib/rpc/channel.h"
#include "lib/rpc/deadline.h"
#include "lib/rpc/grpc_server.h"
#include "rpctest/echo.grpc.pb.h"
#include "tests/unit/rpc/echo_service.h"

namespace swaserve::rpc {
namespace {

// As TerminationSignal requires, SIGTERM/SIGINT are blocked before any thread
// exists (static initialization precedes main and gtest), so every thread of
// this test binary, gRPC's included, inherits the blocked mask and a
// process-directed kill() can only be taken by the watcher's sigwait.
const bool kSignalsBlocked = [] {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  return pthread_sigmask(SIG_BLOCK, &set, nullptr) == 0;
}();

TEST(TerminationSignalTest, SignalsWereBlockedBeforeThreads) {
  ASSERT_TRUE(kSignalsBlocked);
}

TEST(TerminationSignalTest, OnlyOneInstanceAtATime) {
  auto first = TerminationSignal::Create();
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(TerminationSignal::Create().status().code(),
            absl::StatusCode::kFailedPrecondition);
  first->reset();
  EXPECT_TRUE(TerminationSignal::Create().ok());
}

TEST(TerminationSignalTest, CreateAndDestroyRepeatedly) {
  for (int i = 0; i < 20; ++i) {
    auto signal = TerminationSignal::Create();
    ASSERT_TRUE(signal.ok()) << signal.status();
  }
}

TEST(TerminationSignalTest, WaitForTimesOutWithoutSignal) {
  auto signal = *TerminationSignal::Create();
  EXPECT_FALSE(signal->WaitFor(absl::Milliseconds(50)).has_value());
  EXPECT_EQ(signal->count(), 0);
}

TEST(TerminationSignalTest, TriggerWakesWait) {
  auto signal = *TerminationSignal::Create();
  std::thread trigger([&] {
    absl::SleepFor(absl::Milliseconds(20));
    signal->Trigger(SIGINT);
  });
  EXPECT_EQ(signal->Wait(), SIGINT);
  trigger.join();
  EXPECT_EQ(signal->count(), 1);
}

TEST(TerminationSignalTest, RealSigtermAndSigintAreDelivered) {
  auto signal = *TerminationSignal::Create();
  std::vector<int> seen;
  absl::Mutex mu;
  signal->OnSignal([&](int signo, int count) {
    absl::MutexLock lock(&mu);
    seen.push_back(signo);
    EXPECT_EQ(count, static_cast<int>(seen.size()));
  });
  ASSERT_EQ(kill(getpid(), SIGTERM), 0);
  EXPECT_EQ(signal->WaitFor(absl::Seconds(5)), SIGTERM);
  ASSERT_EQ(kill(getpid(), SIGINT), 0);
  const absl::Time give_up = absl::Now() + absl::Seconds(5);
  // count() rises before the callback runs: wait for the callback itself.
  auto callbacks = [&] {
    absl::MutexLock lock(&mu);
    return seen.size();
  };
  while (callbacks() < 2 && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ(signal->count(), 2);
  signal->OnSignal(nullptr);
  absl::MutexLock lock(&mu);
  EXPECT_EQ(seen, (std::vector<int>{SIGTERM, SIGINT}));
  // Wait keeps reporting the first signal.
  EXPECT_EQ(signal->Wait(), SIGTERM);
}

// A thread that has the signals unblocked (as one started by a shared
// library's constructor before main(): OpenBLAS's pool) takes a SIGTERM
// aimed at it; the process must not die of it: the handler forwards it to
// the watcher.
TEST(TerminationSignalTest, ASignalTakenByAnUnblockedThreadReachesTheWatcher) {
  auto signal = *TerminationSignal::Create();
  absl::Notification unblocked, done;
  std::thread early([&] {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    ASSERT_EQ(pthread_sigmask(SIG_UNBLOCK, &set, nullptr), 0);
    unblocked.Notify();
    done.WaitForNotification();
  });
  unblocked.WaitForNotification();
  ASSERT_EQ(pthread_kill(early.native_handle(), SIGTERM), 0);
  EXPECT_EQ(signal->WaitFor(absl::Seconds(5)), SIGTERM);
  done.Notify();
  early.join();
}

class ServeUntilTerminatedTest : public ::testing::Test {
 protected:
  void Start(absl::Duration drain) {
    auto signal = TerminationSignal::Create();
    ASSERT_TRUE(signal.ok()) << signal.status();
    signal_ = *std::move(signal);
    GrpcServerOptions options;
    options.services = {&service_};
    options.drain_deadline = drain;
    auto server = GrpcServer::Create(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    stub_ = rpctest::Echo::NewStub(*CreateChannel(server_->address()));
    serve_ = std::thread(
        [this] { served_signal_ = ServeUntilTerminated(*server_, *signal_); });
  }

  // Starts a paced stream on a client thread; returns once it is flowing.
  void StartStream(int count, int interval_ms) {
    client_ = std::thread([this, count, interval_ms] {
      grpc::ClientContext context;
      SetTimeout(context, absl::Seconds(30));
      rpctest::EchoRequest request;
      request.set_count(count);
      request.set_interval_ms(interval_ms);
      auto reader = stub_->Stream(&context, request);
      rpctest::EchoResponse response;
      while (reader->Read(&response)) {
        ++received_;
        if (!flowing_.HasBeenNotified()) flowing_.Notify();
      }
      status_ = reader->Finish();
    });
    ASSERT_TRUE(flowing_.WaitForNotificationWithTimeout(absl::Seconds(5)));
  }

  void TearDown() override {
    if (client_.joinable()) client_.join();
    if (serve_.joinable()) {
      signal_->Trigger(SIGTERM);
      serve_.join();
    }
  }

  rpctest::EchoService service_;
  std::unique_ptr<TerminationSignal> signal_;
  std::unique_ptr<GrpcServer> server_;
  std::unique_ptr<rpctest::Echo::Stub> stub_;
  std::thread serve_;
  std::thread client_;
  int served_signal_ = 0;
  std::atomic<int> received_{0};
  absl::Notification flowing_;
  grpc::Status status_;
};

TEST_F(ServeUntilTerminatedTest, SigtermDrainsInFlightStream) {
  Start(absl::Seconds(10));
  StartStream(10, 40);
  const absl::Time start = absl::Now();
  ASSERT_EQ(kill(getpid(), SIGTERM), 0);
  serve_.join();
  client_.join();
  EXPECT_EQ(served_signal_, SIGTERM);
  EXPECT_TRUE(status_.ok()) << status_.error_message();
  EXPECT_EQ(received_.load(), 10);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_TRUE(server_->WaitFor(absl::ZeroDuration()));
}

TEST_F(ServeUntilTerminatedTest, SecondSignalCancelsTheDrain) {
  Start(absl::Seconds(60));
  StartStream(1000, 20);
  const absl::Time start = absl::Now();
  ASSERT_EQ(kill(getpid(), SIGINT), 0);
  while (!server_->draining()) absl::SleepFor(absl::Milliseconds(1));
  absl::SleepFor(absl::Milliseconds(100));
  ASSERT_EQ(kill(getpid(), SIGINT), 0);
  serve_.join();
  client_.join();
  EXPECT_EQ(served_signal_, SIGINT);
  EXPECT_FALSE(status_.ok());
  EXPECT_LT(received_.load(), 1000);
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_EQ(service_.active(), 0);
}

}  // namespace
}  // namespace swaserve::rpc
