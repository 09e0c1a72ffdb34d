// Graceful shutdown of a real server process: SIGTERM drains in-flight
// streams (or cuts them at the drain deadline), a second signal forces the
// stop, the health service turns NOT_SERVING, and the process exits 0.
#include <signal.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "lib/base/subprocess.h"
#include "lib/rpc/channel.h"
#include "lib/rpc/deadline.h"
#include "rpctest/echo.grpc.pb.h"

namespace swaserve::rpc {
namespace {

class GracefulShutdownTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto dir = base::MakeTempDir("rpc_graceful_shutdown");
    ASSERT_TRUE(dir.ok()) << dir.status();
    dir_ = *dir;
  }

  void TearDown() override {
    if (client_.joinable()) client_.join();
    server_.reset();  // SIGTERM + SIGKILL fallback if a test bailed out
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }

  // Starts rpc_test_server and waits until it serves.
  void StartServer(int drain_ms, int lame_duck_ms = 0) {
    const std::string port_file = dir_ + "/port";
    base::SubprocessOptions options;
    options.argv = {SWASERVE_RPC_TEST_SERVER,
                    absl::StrCat("--port_file=", port_file),
                    absl::StrCat("--drain_ms=", drain_ms),
                    absl::StrCat("--lame_duck_ms=", lame_duck_ms)};
    options.log_path = dir_ + "/server.log";
    options.stop_grace = absl::Seconds(2);
    auto server = base::Subprocess::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    const absl::Time give_up = absl::Now() + absl::Seconds(10);
    while (!std::filesystem::exists(port_file) && absl::Now() < give_up &&
           server_->Running()) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    std::ifstream in(port_file);
    ASSERT_TRUE(in >> port_) << "no port file; log:\n" << server_->ReadLog();
    channel_ = *CreateChannel(absl::StrCat("127.0.0.1:", port_));
    stub_ = rpctest::Echo::NewStub(channel_);
    ASSERT_EQ(*CheckHealth(channel_, "", absl::Seconds(5)),
              HealthStatus::kServing);
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
        if (response.index() != received_) ordered_ = false;
        ++received_;
        if (!flowing_.HasBeenNotified()) flowing_.Notify();
      }
      status_ = reader->Finish();
    });
    ASSERT_TRUE(flowing_.WaitForNotificationWithTimeout(absl::Seconds(5)));
  }

  std::string dir_;
  std::unique_ptr<base::Subprocess> server_;
  int port_ = 0;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<rpctest::Echo::Stub> stub_;
  std::thread client_;
  std::atomic<int> received_{0};
  std::atomic<bool> ordered_{true};
  absl::Notification flowing_;
  grpc::Status status_;
};

TEST_F(GracefulShutdownTest, SigtermDrainsInFlightStreamThenExitsZero) {
  StartServer(/*drain_ms=*/10000);
  StartStream(/*count=*/10, /*interval_ms=*/100);  // ~1 s
  const absl::Time sigterm = absl::Now();
  ASSERT_TRUE(server_->Signal(SIGTERM).ok());

  client_.join();
  EXPECT_TRUE(status_.ok()) << status_.error_message();
  EXPECT_EQ(received_.load(), 10);
  EXPECT_TRUE(ordered_.load());

  const absl::StatusOr<int> code = server_->Wait(absl::Seconds(10));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0) << server_->ReadLog();
  // Done when the stream was, far before the 10 s drain deadline.
  EXPECT_LT(absl::Now() - sigterm, absl::Seconds(5));
  const std::string log = server_->ReadLog();
  EXPECT_TRUE(absl::StrContains(log, "shutting down on signal 15")) << log;
  EXPECT_TRUE(absl::StrContains(log, "1 calls served, 0 cancelled")) << log;
  // Nothing listens any more.
  EXPECT_EQ(CheckHealth(channel_, "", absl::Seconds(2)).status().code(),
            absl::StatusCode::kUnavailable);
}

TEST_F(GracefulShutdownTest, StreamLongerThanDrainIsCutAtTheDeadline) {
  StartServer(/*drain_ms=*/500);
  StartStream(/*count=*/1000, /*interval_ms=*/20);  // ~20 s
  const absl::Time sigterm = absl::Now();
  ASSERT_TRUE(server_->Signal(SIGTERM).ok());
  const absl::StatusOr<int> code = server_->Wait(absl::Seconds(10));
  const absl::Duration took = absl::Now() - sigterm;
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0) << server_->ReadLog();
  EXPECT_GE(took, absl::Milliseconds(450));
  EXPECT_LT(took, absl::Seconds(5));
  client_.join();
  EXPECT_FALSE(status_.ok());
  EXPECT_GT(received_.load(), 0);
  EXPECT_LT(received_.load(), 1000);
  EXPECT_TRUE(absl::StrContains(server_->ReadLog(), "1 cancelled"))
      << server_->ReadLog();
}

TEST_F(GracefulShutdownTest, SecondSignalForcesTheStop) {
  StartServer(/*drain_ms=*/60000);
  StartStream(/*count=*/1000, /*interval_ms=*/20);
  ASSERT_TRUE(server_->Signal(SIGTERM).ok());
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_TRUE(server_->Running());  // still draining
  const absl::Time second = absl::Now();
  ASSERT_TRUE(server_->Signal(SIGINT).ok());
  const absl::StatusOr<int> code = server_->Wait(absl::Seconds(10));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0) << server_->ReadLog();
  EXPECT_LT(absl::Now() - second, absl::Seconds(5));
  client_.join();
  EXPECT_FALSE(status_.ok());
}

TEST_F(GracefulShutdownTest, LameDuckReportsNotServingBeforeClosing) {
  StartServer(/*drain_ms=*/2000, /*lame_duck_ms=*/1500);
  ASSERT_TRUE(server_->Signal(SIGTERM).ok());
  absl::StatusOr<HealthStatus> health;
  const absl::Time give_up = absl::Now() + absl::Seconds(1);
  do {
    health = CheckHealth(channel_, "", absl::Seconds(1));
  } while ((!health.ok() || *health != HealthStatus::kNotServing) &&
           absl::Now() < give_up);
  ASSERT_TRUE(health.ok()) << health.status();
  EXPECT_EQ(*health, HealthStatus::kNotServing);
  // Still accepting calls during the lame duck.
  grpc::ClientContext context;
  SetTimeout(context, absl::Seconds(2));
  rpctest::EchoRequest request;
  request.set_message("late");
  rpctest::EchoResponse response;
  EXPECT_TRUE(stub_->Unary(&context, request, &response).ok());
  const absl::StatusOr<int> code = server_->Wait(absl::Seconds(10));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0) << server_->ReadLog();
}

}  // namespace
}  // namespace swaserve::rpc
