#include "lib/rpc/channel.h"

#include <memory>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "lib/base/subprocess.h"
#include "lib/rpc/grpc_server.h"
#include "rpctest/echo.grpc.pb.h"
#include "tests/unit/rpc/echo_service.h"

namespace swaserve::rpc {
namespace {

TEST(ChannelTest, RejectsBadArguments) {
  EXPECT_EQ(CreateChannel("").status().code(),
            absl::StatusCode::kInvalidArgument);
  ChannelOptions options;
  options.keepalive_time = absl::ZeroDuration();
  EXPECT_EQ(CreateChannel("127.0.0.1:1", options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options = ChannelOptions();
  options.min_reconnect_backoff = absl::Seconds(10);
  options.max_reconnect_backoff = absl::Seconds(1);
  EXPECT_EQ(CreateChannel("127.0.0.1:1", options).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckHealth(nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ChannelTest, HealthStatusNames) {
  EXPECT_EQ(HealthStatusName(HealthStatus::kServing), "SERVING");
  EXPECT_EQ(HealthStatusName(HealthStatus::kNotServing), "NOT_SERVING");
  EXPECT_EQ(HealthStatusName(HealthStatus::kUnknown), "UNKNOWN");
  EXPECT_EQ(HealthStatusName(HealthStatus::kServiceUnknown), "SERVICE_UNKNOWN");
}

TEST(ChannelTest, NothingListeningIsUnavailableAndNeverConnects) {
  auto port = base::PickFreePort();
  ASSERT_TRUE(port.ok()) << port.status();
  auto channel = CreateChannel(absl::StrCat("127.0.0.1:", *port));
  ASSERT_TRUE(channel.ok());
  const absl::Time start = absl::Now();
  EXPECT_EQ(WaitForConnected(**channel, absl::Milliseconds(300)).code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  EXPECT_EQ(CheckHealth(*channel, "", absl::Seconds(2)).status().code(),
            absl::StatusCode::kUnavailable);
}

class ChannelServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    GrpcServerOptions options;
    options.services = {&service_};
    options.health_service_names = {"swaserve.rpctest.Echo"};
    auto server = GrpcServer::Create(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }
  void TearDown() override { server_->Shutdown(absl::ZeroDuration()); }

  rpctest::EchoService service_;
  std::unique_ptr<GrpcServer> server_;
};

TEST_F(ChannelServerTest, ConnectsAndCallsWithCustomOptions) {
  ChannelOptions options;
  options.keepalive_time = absl::Seconds(10);  // the server's minimum
  options.keepalive_timeout = absl::Seconds(5);
  options.load_balancing_policy = "round_robin";
  options.use_local_subchannel_pool = true;
  auto channel = CreateChannel(server_->address(), options);
  ASSERT_TRUE(channel.ok()) << channel.status();
  ASSERT_TRUE(WaitForConnected(**channel, absl::Seconds(5)).ok());
  auto stub = rpctest::Echo::NewStub(*channel);
  grpc::ClientContext context;
  rpctest::EchoRequest request;
  request.set_message("ping");
  rpctest::EchoResponse response;
  ASSERT_TRUE(stub->Unary(&context, request, &response).ok());
  EXPECT_EQ(response.message(), "ping");
}

TEST_F(ChannelServerTest, CheckHealthReadsServingStatus) {
  auto channel = *CreateChannel(server_->address());
  EXPECT_EQ(*CheckHealth(channel), HealthStatus::kServing);
  EXPECT_EQ(*CheckHealth(channel, "swaserve.rpctest.Echo"),
            HealthStatus::kServing);
  server_->SetServing("swaserve.rpctest.Echo", false);
  EXPECT_EQ(*CheckHealth(channel, "swaserve.rpctest.Echo"),
            HealthStatus::kNotServing);
  EXPECT_EQ(*CheckHealth(channel), HealthStatus::kServing);
  server_->SetServing(false);
  EXPECT_EQ(*CheckHealth(channel), HealthStatus::kNotServing);
  EXPECT_EQ(CheckHealth(channel, "no.such.Service").status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(ChannelServerTest, CheckHealthAfterShutdownIsUnavailable) {
  auto channel = *CreateChannel(server_->address());
  EXPECT_EQ(*CheckHealth(channel), HealthStatus::kServing);
  server_->Shutdown(absl::Seconds(1));
  EXPECT_EQ(CheckHealth(channel).status().code(),
            absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace swaserve::rpc
