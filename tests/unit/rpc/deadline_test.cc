#include "lib/rpc/deadline.h"

#include <memory>
#include <thread>

#include "gtest/gtest.h"
#include "lib/rpc/channel.h"
#include "lib/rpc/grpc_server.h"
#include "rpctest/echo.grpc.pb.h"
#include "tests/unit/rpc/echo_service.h"

namespace swaserve::rpc {
namespace {

using rpctest::Echo;
using rpctest::EchoRequest;
using rpctest::EchoResponse;
using rpctest::EchoService;
using rpctest::ToUnixMicrosOrZero;

// A deadline crosses the wire as a relative grpc-timeout, computed from
// gRPC's cached clock and rounded up to the header's unit, so the receiver's
// deadline can land a few ms after the sender's.
constexpr absl::Duration kWireRounding = absl::Milliseconds(25);

absl::Time FromMicros(int64_t us) { return absl::FromUnixMicros(us); }

TEST(DeadlineTest, ClientContextHelpers) {
  auto none = MakeClientContext(absl::InfiniteDuration());
  EXPECT_EQ(ClientDeadline(*none), absl::InfiniteFuture());

  const absl::Time before = absl::Now();
  auto ctx = MakeClientContext(absl::Seconds(3));
  const absl::Time deadline = ClientDeadline(*ctx);
  EXPECT_GE(deadline, before + absl::Seconds(3) - absl::Milliseconds(1));
  EXPECT_LE(deadline, absl::Now() + absl::Seconds(3) + absl::Milliseconds(1));

  grpc::ClientContext negative;
  SetTimeout(negative, absl::Seconds(-5));  // clamps to "now"
  EXPECT_LE(ClientDeadline(negative), absl::Now());
}

// Two Echo servers: A relays to B with a child context.
class DeadlinePropagationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    GrpcServerOptions options;
    options.services = {&service_b_};
    options.name = "b";
    auto b = GrpcServer::Create(options);
    ASSERT_TRUE(b.ok()) << b.status();
    server_b_ = *std::move(b);
    service_a_.SetRelayTarget(*CreateChannel(server_b_->address()));
    options.services = {&service_a_};
    options.name = "a";
    auto a = GrpcServer::Create(options);
    ASSERT_TRUE(a.ok()) << a.status();
    server_a_ = *std::move(a);
    stub_a_ = Echo::NewStub(*CreateChannel(server_a_->address()));
  }

  void TearDown() override {
    server_a_->Shutdown(absl::ZeroDuration());
    server_b_->Shutdown(absl::ZeroDuration());
  }

  grpc::Status Relay(const EchoRequest& request, EchoResponse* response,
                     absl::Duration timeout) {
    grpc::ClientContext context;
    SetTimeout(context, timeout);
    client_deadline_ = ClientDeadline(context);
    return stub_a_->Relay(&context, request, response);
  }

  EchoService service_a_;
  EchoService service_b_;
  std::unique_ptr<GrpcServer> server_b_;
  std::unique_ptr<GrpcServer> server_a_;
  std::unique_ptr<Echo::Stub> stub_a_;
  absl::Time client_deadline_;
};

TEST_F(DeadlinePropagationTest, IncomingDeadlineMatchesClientDeadline) {
  EchoRequest request;
  request.set_message("direct");
  EchoResponse response;
  auto stub_b = Echo::NewStub(*CreateChannel(server_b_->address()));
  grpc::ClientContext context;
  SetTimeout(context, absl::Seconds(7));
  ASSERT_TRUE(stub_b->Unary(&context, request, &response).ok());
  const absl::Time seen = FromMicros(response.deadline_unix_us());
  EXPECT_LE(seen, ClientDeadline(context) + kWireRounding);
  EXPECT_GE(seen, ClientDeadline(context) - absl::Seconds(1));
}

TEST_F(DeadlinePropagationTest, NoDeadlineStaysInfinite) {
  EchoRequest request;
  EchoResponse response;
  const grpc::Status status =
      Relay(request, &response, absl::InfiniteDuration());
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.deadline_unix_us(), 0);
  EXPECT_EQ(response.downstream_deadline_unix_us(), 0);
}

TEST_F(DeadlinePropagationTest, DownstreamDeadlineIsNoLaterThanUpstream) {
  EchoRequest request;
  request.set_message("relayed");
  EchoResponse response;
  const grpc::Status status = Relay(request, &response, absl::Seconds(5));
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.message(), "relayed");
  ASSERT_NE(response.deadline_unix_us(), 0);
  ASSERT_NE(response.downstream_deadline_unix_us(), 0);
  const absl::Time a_deadline = FromMicros(response.deadline_unix_us());
  const absl::Time b_deadline =
      FromMicros(response.downstream_deadline_unix_us());
  EXPECT_LE(a_deadline, client_deadline_ + kWireRounding);
  EXPECT_LE(b_deadline, a_deadline + kWireRounding);
  // Propagated, not replaced by something much shorter.
  EXPECT_GE(b_deadline, a_deadline - absl::Seconds(1));
}

TEST_F(DeadlinePropagationTest, MaxTimeoutCapsDownstreamDeadline) {
  EchoRequest request;
  request.set_relay_max_timeout_ms(500);
  EchoResponse response;
  const absl::Time start = absl::Now();
  const grpc::Status status = Relay(request, &response, absl::Seconds(60));
  ASSERT_TRUE(status.ok()) << status.error_message();
  const absl::Time b_deadline =
      FromMicros(response.downstream_deadline_unix_us());
  EXPECT_LE(b_deadline, absl::Now() + absl::Milliseconds(500) + kWireRounding);
  EXPECT_GE(b_deadline, start);
  EXPECT_GT(FromMicros(response.deadline_unix_us()), start + absl::Seconds(50));
}

TEST_F(DeadlinePropagationTest, CapExpiryFailsOnlyTheDownstreamLeg) {
  EchoRequest request;
  request.set_delay_ms(5000);             // B is slow...
  request.set_relay_max_timeout_ms(200);  // ...and A gives it 200 ms.
  EchoResponse response;
  const grpc::Status status = Relay(request, &response, absl::Seconds(30));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_TRUE(service_b_.WaitForCancelled(1, absl::Seconds(3)));
}

TEST_F(DeadlinePropagationTest, UpstreamDeadlineCancelsDownstreamCall) {
  EchoRequest request;
  request.set_delay_ms(10000);
  EchoResponse response;
  const absl::Time start = absl::Now();
  const grpc::Status status =
      Relay(request, &response, absl::Milliseconds(300));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  // B's reactor is cancelled well before its 10 s delay.
  EXPECT_TRUE(service_b_.WaitForCancelled(1, absl::Seconds(3)));
  EXPECT_TRUE(service_b_.WaitForIdle(absl::Seconds(3)));
  EXPECT_TRUE(service_a_.WaitForIdle(absl::Seconds(3)));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST_F(DeadlinePropagationTest, ClientCancellationPropagatesDownstream) {
  EchoRequest request;
  request.set_delay_ms(10000);
  EchoResponse response;
  grpc::ClientContext context;  // no deadline at all
  grpc::Status status;
  std::thread client(
      [&] { status = stub_a_->Relay(&context, request, &response); });
  const absl::Time give_up = absl::Now() + absl::Seconds(5);
  while (service_b_.started() == 0 && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_EQ(service_b_.started(), 1);
  context.TryCancel();
  client.join();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(service_b_.WaitForCancelled(1, absl::Seconds(3)));
  EXPECT_TRUE(service_b_.WaitForIdle(absl::Seconds(3)));
}

TEST_F(DeadlinePropagationTest, RemainingTimeOfIncomingCall) {
  auto stub_b = Echo::NewStub(*CreateChannel(server_b_->address()));
  EchoRequest request;
  EchoResponse response;
  {
    grpc::ClientContext context;
    SetTimeout(context, absl::Seconds(2));
    ASSERT_TRUE(stub_b->Unary(&context, request, &response).ok());
    const absl::Duration remaining = absl::Microseconds(response.remaining_us());
    EXPECT_GT(remaining, absl::Seconds(1));
    EXPECT_LE(remaining, absl::Seconds(2) + kWireRounding);
  }
  {
    grpc::ClientContext no_deadline;
    ASSERT_TRUE(stub_b->Unary(&no_deadline, request, &response).ok());
    EXPECT_EQ(response.remaining_us(), -1);
  }
}

}  // namespace
}  // namespace swaserve::rpc
