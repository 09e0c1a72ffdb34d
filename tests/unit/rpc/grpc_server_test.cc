#include "lib/rpc/grpc_server.h"

#include <grpcpp/client_context.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "lib/base/subprocess.h"
#include "lib/rpc/channel.h"
#include "lib/rpc/deadline.h"
#include "lib/rpc/status_conversion.h"
#include "rpctest/echo.grpc.pb.h"
#include "tests/unit/rpc/echo_service.h"

namespace swaserve::rpc {
namespace {

using rpctest::Echo;
using rpctest::EchoRequest;
using rpctest::EchoResponse;
using rpctest::EchoService;

struct StreamResult {
  std::vector<int> indices;
  grpc::Status status;
};

// Reads a whole Stream call (blocking; test thread, not a reactor).
StreamResult ReadStream(Echo::Stub& stub, const EchoRequest& request,
                        absl::Duration timeout,
                        absl::Notification* first_message = nullptr) {
  grpc::ClientContext context;
  SetTimeout(context, timeout);
  StreamResult result;
  auto reader = stub.Stream(&context, request);
  EchoResponse response;
  while (reader->Read(&response)) {
    result.indices.push_back(response.index());
    if (first_message != nullptr && !first_message->HasBeenNotified()) {
      first_message->Notify();
    }
  }
  result.status = reader->Finish();
  return result;
}

EchoRequest StreamRequest(int count, int interval_ms) {
  EchoRequest request;
  request.set_message("tick");
  request.set_count(count);
  request.set_interval_ms(interval_ms);
  return request;
}

grpc::Status CallUnary(Echo::Stub& stub, const EchoRequest& request,
                       EchoResponse* response, absl::Duration timeout) {
  grpc::ClientContext context;
  SetTimeout(context, timeout);
  return stub.Unary(&context, request, response);
}

class GrpcServerTest : public ::testing::Test {
 protected:
  void Start(GrpcServerOptions options = {}) {
    options.services = {&service_};
    options.name = "test";
    auto server = GrpcServer::Create(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    auto channel = CreateChannel(server_->address());
    ASSERT_TRUE(channel.ok()) << channel.status();
    channel_ = *channel;
    stub_ = Echo::NewStub(channel_);
  }

  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown(absl::ZeroDuration());
    EXPECT_TRUE(service_.WaitForIdle(absl::Seconds(5)));
  }

  // A fresh client with its own connection (not sharing the test's).
  std::unique_ptr<Echo::Stub> FreshStub() {
    ChannelOptions options;
    options.use_local_subchannel_pool = true;
    return Echo::NewStub(*CreateChannel(server_->address(), options));
  }

  EchoService service_;  // Outlives server_.
  std::unique_ptr<GrpcServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<Echo::Stub> stub_;
};

TEST_F(GrpcServerTest, BindsPickedPortOnLoopback) {
  Start();
  EXPECT_GT(server_->port(), 0);
  EXPECT_EQ(server_->address(), absl::StrCat("127.0.0.1:", server_->port()));
  EXPECT_EQ(server_->local_target(), server_->address());
  EXPECT_TRUE(WaitForConnected(*channel_, absl::Seconds(5)).ok());
  EXPECT_FALSE(server_->shutting_down());
}

TEST_F(GrpcServerTest, WildcardAddressGivesLoopbackTarget) {
  GrpcServerOptions options;
  options.listen_address = "0.0.0.0:0";
  Start(options);
  EXPECT_EQ(server_->local_target(),
            absl::StrCat("127.0.0.1:", server_->port()));
  EchoResponse response;
  EchoRequest request;
  request.set_message("hi");
  auto stub = Echo::NewStub(*CreateChannel(server_->local_target()));
  EXPECT_TRUE(CallUnary(*stub, request, &response, absl::Seconds(5)).ok());
}

TEST_F(GrpcServerTest, TakenPortIsAnError) {
  Start();
  EchoService other_service;
  GrpcServerOptions options;
  options.listen_address = server_->address();
  options.services = {&other_service};
  auto second = GrpcServer::Create(options);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable)
      << second.status();
}

TEST_F(GrpcServerTest, BadOptionsAreRejected) {
  GrpcServerOptions options;
  options.listen_address = "no-port-here";
  EXPECT_EQ(GrpcServer::Create(options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.listen_address = "127.0.0.1:";
  EXPECT_EQ(GrpcServer::Create(options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.listen_address = "127.0.0.1:0";
  options.services = {nullptr};
  EXPECT_EQ(GrpcServer::Create(options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.services = {};
  options.drain_deadline = absl::Seconds(-1);
  EXPECT_EQ(GrpcServer::Create(options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(GrpcServerTest, UnaryRoundTrip) {
  Start();
  EchoRequest request;
  request.set_message("hello");
  EchoResponse response;
  const grpc::Status status =
      CallUnary(*stub_, request, &response, absl::Seconds(5));
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.message(), "hello");
  EXPECT_GT(response.deadline_unix_us(), 0);
  EXPECT_TRUE(service_.WaitForIdle(absl::Seconds(5)));
  EXPECT_EQ(service_.started(), 1);
  EXPECT_EQ(service_.cancelled(), 0);
}

TEST_F(GrpcServerTest, ErrorsCarryCodeMessageAndErrorDetail) {
  Start();
  EchoRequest request;
  request.set_message("overloaded");
  request.set_fail_code(static_cast<int>(absl::StatusCode::kResourceExhausted));
  EchoResponse response;
  const grpc::Status status =
      CallUnary(*stub_, request, &response, absl::Seconds(5));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(status.error_message(), "overloaded");
  const absl::Status converted = FromGrpcStatus(status);
  EXPECT_EQ(converted.code(), absl::StatusCode::kResourceExhausted);
  const auto detail = GetErrorDetail(converted);
  ASSERT_TRUE(detail.has_value());
  EXPECT_EQ(detail->code(), v1::ERROR_CODE_OVERLOADED);
  EXPECT_EQ(detail->worker_id(), "echo-worker");
  EXPECT_TRUE(detail->retryable());
}

TEST_F(GrpcServerTest, ServerStreamDeliversAllMessages) {
  Start();
  const StreamResult fast =
      ReadStream(*stub_, StreamRequest(50, 0), absl::Seconds(10));
  ASSERT_TRUE(fast.status.ok()) << fast.status.error_message();
  ASSERT_EQ(fast.indices.size(), 50u);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(fast.indices[i], i);

  const StreamResult paced =
      ReadStream(*stub_, StreamRequest(5, 10), absl::Seconds(10));
  ASSERT_TRUE(paced.status.ok()) << paced.status.error_message();
  EXPECT_EQ(paced.indices.size(), 5u);
  EXPECT_TRUE(service_.WaitForIdle(absl::Seconds(5)));
  EXPECT_EQ(service_.cancelled(), 0);
}

TEST_F(GrpcServerTest, ClientCancelMidStreamReachesOnCancelAndOnDone) {
  Start();
  grpc::ClientContext context;
  SetTimeout(context, absl::Seconds(30));
  auto reader = stub_->Stream(&context, StreamRequest(1000, 20));
  EchoResponse response;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(reader->Read(&response));
    EXPECT_EQ(response.index(), i);
  }
  context.TryCancel();
  while (reader->Read(&response)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  // The server saw the cancellation and its reactor's OnDone ran (the
  // reactor freed itself) long before the 20 s the stream would take.
  EXPECT_TRUE(service_.WaitForCancelled(1, absl::Seconds(5)));
  EXPECT_TRUE(service_.WaitForIdle(absl::Seconds(5)));
  EXPECT_EQ(service_.started(), 1);
  EXPECT_EQ(service_.done(), 1);
}

TEST_F(GrpcServerTest, ExpiredDeadlineReachesClientAndServer) {
  Start();
  EchoRequest request;
  request.set_delay_ms(5000);
  EchoResponse response;
  const absl::Time start = absl::Now();
  const grpc::Status status =
      CallUnary(*stub_, request, &response, absl::Milliseconds(200));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  // The server-side reactor is cancelled by the same deadline.
  EXPECT_TRUE(service_.WaitForCancelled(1, absl::Seconds(3)));
  EXPECT_TRUE(service_.WaitForIdle(absl::Seconds(3)));
}

TEST_F(GrpcServerTest, HealthCheckAnswersServingAndFollowsSetServing) {
  GrpcServerOptions options;
  options.health_service_names = {"swaserve.rpctest.Echo"};
  Start(options);
  auto health = grpc::health::v1::Health::NewStub(channel_);
  auto check = [&](const std::string& name) {
    grpc::ClientContext context;
    SetTimeout(context, absl::Seconds(5));
    grpc::health::v1::HealthCheckRequest request;
    request.set_service(name);
    grpc::health::v1::HealthCheckResponse response;
    const grpc::Status status = health->Check(&context, request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response.status();
  };
  using Response = grpc::health::v1::HealthCheckResponse;
  EXPECT_EQ(check(""), Response::SERVING);
  EXPECT_EQ(check("swaserve.rpctest.Echo"), Response::SERVING);

  server_->SetServing(false);
  EXPECT_EQ(check(""), Response::NOT_SERVING);
  EXPECT_EQ(check("swaserve.rpctest.Echo"), Response::NOT_SERVING);
  server_->SetServing(true);
  EXPECT_EQ(check(""), Response::SERVING);
  server_->SetServing("swaserve.rpctest.Echo", false);
  EXPECT_EQ(check(""), Response::SERVING);
  EXPECT_EQ(check("swaserve.rpctest.Echo"), Response::NOT_SERVING);

  // An unknown name is NOT_FOUND, as the protocol specifies.
  grpc::ClientContext context;
  grpc::health::v1::HealthCheckRequest request;
  request.set_service("no.such.Service");
  grpc::health::v1::HealthCheckResponse response;
  EXPECT_EQ(health->Check(&context, request, &response).error_code(),
            grpc::StatusCode::NOT_FOUND);
}

TEST_F(GrpcServerTest, NotServingAtStartUntilReady) {
  GrpcServerOptions options;
  options.serving_at_start = false;
  Start(options);
  EXPECT_EQ(*CheckHealth(channel_), HealthStatus::kNotServing);
  server_->SetServing(true);
  EXPECT_EQ(*CheckHealth(channel_), HealthStatus::kServing);
}

TEST_F(GrpcServerTest, NotServingDuringLameDuckWhileStillAcceptingCalls) {
  GrpcServerOptions options;
  options.lame_duck = absl::Seconds(20);
  std::atomic<int> drain_callbacks{0};
  options.on_drain_start = [&] { ++drain_callbacks; };
  Start(options);
  EXPECT_EQ(*CheckHealth(channel_), HealthStatus::kServing);

  std::thread shutdown([&] { server_->Shutdown(absl::Seconds(5)); });
  absl::StatusOr<HealthStatus> health;
  const absl::Time give_up = absl::Now() + absl::Seconds(5);
  do {
    health = CheckHealth(channel_);
  } while ((!health.ok() || *health != HealthStatus::kNotServing) &&
           absl::Now() < give_up);
  ASSERT_TRUE(health.ok()) << health.status();
  EXPECT_EQ(*health, HealthStatus::kNotServing);
  EXPECT_TRUE(server_->shutting_down());
  EXPECT_FALSE(server_->draining());
  // on_drain_start runs on the shutdown thread right AFTER health turned
  // NOT_SERVING (grpc_server.h), so a health check can see NOT_SERVING
  // first: wait for it (a flake seen once under load).
  while (drain_callbacks.load() == 0 && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ(drain_callbacks.load(), 1);
  // SetServing cannot bring a shutting-down server back.
  server_->SetServing(true);
  EXPECT_EQ(*CheckHealth(channel_), HealthStatus::kNotServing);
  // Lame duck: calls are still served.
  EchoRequest request;
  request.set_message("still here");
  EchoResponse response;
  EXPECT_TRUE(CallUnary(*stub_, request, &response, absl::Seconds(5)).ok());

  // CancelAllCalls cuts the 20 s lame duck short.
  const absl::Time cancel_time = absl::Now();
  server_->CancelAllCalls();
  shutdown.join();
  EXPECT_LT(absl::Now() - cancel_time, absl::Seconds(5));
  EXPECT_TRUE(server_->WaitFor(absl::ZeroDuration()));
  // Stopped: health checks are refused now.
  EXPECT_EQ(CheckHealth(channel_, "", absl::Seconds(2)).status().code(),
            absl::StatusCode::kUnavailable);
}

TEST_F(GrpcServerTest, ShutdownDrainsInFlightStreamAndRefusesNewCalls) {
  Start();
  absl::Notification first_message;
  StreamResult result;
  std::thread client([&] {
    result = ReadStream(*stub_, StreamRequest(10, 50), absl::Seconds(30),
                        &first_message);
  });
  ASSERT_TRUE(first_message.WaitForNotificationWithTimeout(absl::Seconds(5)));

  const absl::Time start = absl::Now();
  std::thread shutdown([&] { server_->Shutdown(absl::Seconds(10)); });
  while (!server_->draining()) absl::SleepFor(absl::Milliseconds(1));
  absl::SleepFor(absl::Milliseconds(50));  // let the listener close

  // New calls are refused while the stream drains, on the existing channel
  // and on a new connection alike.
  EchoRequest request;
  EchoResponse response;
  EXPECT_EQ(
      CallUnary(*stub_, request, &response, absl::Seconds(2)).error_code(),
      grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(CallUnary(*FreshStub(), request, &response, absl::Seconds(2))
                .error_code(),
            grpc::StatusCode::UNAVAILABLE);
  EXPECT_FALSE(server_->WaitFor(absl::ZeroDuration()));

  client.join();
  shutdown.join();
  ASSERT_TRUE(result.status.ok()) << result.status.error_message();
  ASSERT_EQ(result.indices.size(), 10u);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(result.indices[i], i);
  // Shutdown returned once the stream was done, not at the drain deadline.
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(service_.cancelled(), 0);
  EXPECT_EQ(service_.active(), 0);  // Shutdown waits for every OnDone.
}

TEST_F(GrpcServerTest, StreamLongerThanDrainDeadlineIsCancelledAtDeadline) {
  Start();
  absl::Notification first_message;
  StreamResult result;
  std::thread client([&] {
    result = ReadStream(*stub_, StreamRequest(1000, 20), absl::Seconds(30),
                        &first_message);
  });
  ASSERT_TRUE(first_message.WaitForNotificationWithTimeout(absl::Seconds(5)));

  const absl::Time start = absl::Now();
  server_->Shutdown(absl::Milliseconds(300));
  const absl::Duration took = absl::Now() - start;
  EXPECT_GE(took, absl::Milliseconds(290));
  EXPECT_LT(took, absl::Seconds(5));
  // Shutdown returned after the reactor saw OnCancel and OnDone.
  EXPECT_EQ(service_.cancelled(), 1);
  EXPECT_EQ(service_.active(), 0);

  client.join();
  EXPECT_FALSE(result.status.ok());
  EXPECT_GT(result.indices.size(), 0u);
  EXPECT_LT(result.indices.size(), 1000u);
}

TEST_F(GrpcServerTest, CancelAllCallsCutsDrainShort) {
  Start();
  absl::Notification first_message;
  StreamResult result;
  std::thread client([&] {
    result = ReadStream(*stub_, StreamRequest(1000, 20), absl::Seconds(30),
                        &first_message);
  });
  ASSERT_TRUE(first_message.WaitForNotificationWithTimeout(absl::Seconds(5)));
  const absl::Time start = absl::Now();
  std::thread shutdown([&] { server_->Shutdown(absl::Seconds(60)); });
  while (!server_->draining()) absl::SleepFor(absl::Milliseconds(1));
  absl::SleepFor(absl::Milliseconds(100));
  server_->CancelAllCalls();
  shutdown.join();
  client.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_FALSE(result.status.ok());
  EXPECT_EQ(service_.active(), 0);
}

// before_drain_deadline runs once, its margin before the drain deadline,
// while calls still drain: here it cancels them (a service would end them
// with its own answer), so Shutdown returns well before the deadline. Not
// called when the calls end before its time.
TEST_F(GrpcServerTest, BeforeDrainDeadlineRunsOnceItsMarginBeforeTheDeadline) {
  std::atomic<int> hooks{0};
  GrpcServerOptions options;
  options.before_drain_deadline_margin = absl::Seconds(2);
  absl::Duration left;
  options.before_drain_deadline = [&](absl::Duration d) {
    ++hooks;
    left = d;
    server_->CancelAllCalls();
  };
  Start(options);
  absl::Notification first_message;
  StreamResult result;
  std::thread client([&] {
    result = ReadStream(*stub_, StreamRequest(1000, 20), absl::Seconds(60), &first_message);
  });
  ASSERT_TRUE(first_message.WaitForNotificationWithTimeout(absl::Seconds(5)));
  const absl::Time start = absl::Now();
  server_->Shutdown(absl::Seconds(4));
  const absl::Duration took = absl::Now() - start;
  client.join();
  EXPECT_EQ(hooks.load(), 1);
  EXPECT_EQ(left, absl::Seconds(2));
  EXPECT_GE(took, absl::Milliseconds(1900));
  EXPECT_LT(took, absl::Milliseconds(3500)) << "ended at the deadline, not by the hook";
  EXPECT_FALSE(result.status.ok());
  EXPECT_EQ(service_.active(), 0);
}

TEST_F(GrpcServerTest, BeforeDrainDeadlineIsNotCalledWhenTheCallsEndFirst) {
  std::atomic<int> hooks{0};
  GrpcServerOptions options;
  options.before_drain_deadline_margin = absl::Seconds(1);
  options.before_drain_deadline = [&](absl::Duration) { ++hooks; };
  Start(options);
  absl::Notification first_message;
  StreamResult result;
  std::thread client([&] {
    result = ReadStream(*stub_, StreamRequest(10, 20), absl::Seconds(60), &first_message);
  });
  ASSERT_TRUE(first_message.WaitForNotificationWithTimeout(absl::Seconds(5)));
  server_->Shutdown(absl::Seconds(10));
  client.join();
  EXPECT_TRUE(result.status.ok()) << result.status.error_message();
  EXPECT_EQ(hooks.load(), 0);
}

TEST_F(GrpcServerTest, ShutdownIsIdempotentAndWaitReturns) {
  Start();
  std::thread waiter([&] { server_->Wait(); });
  std::thread first([&] { server_->Shutdown(absl::Seconds(1)); });
  std::thread second([&] { server_->Shutdown(absl::Seconds(1)); });
  first.join();
  second.join();
  waiter.join();
  server_->Shutdown();
  EXPECT_TRUE(server_->shutting_down());
  EXPECT_TRUE(server_->draining());
}

TEST_F(GrpcServerTest, DestructorCancelsInFlightCalls) {
  Start();
  absl::Notification first_message;
  StreamResult result;
  std::thread client([&] {
    result = ReadStream(*stub_, StreamRequest(1000, 20), absl::Seconds(30),
                        &first_message);
  });
  ASSERT_TRUE(first_message.WaitForNotificationWithTimeout(absl::Seconds(5)));
  const absl::Time start = absl::Now();
  server_.reset();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  client.join();
  EXPECT_FALSE(result.status.ok());
  EXPECT_EQ(service_.active(), 0);
}

TEST_F(GrpcServerTest, MaxReceiveMessageSizeIsEnforced) {
  GrpcServerOptions options;
  options.max_receive_message_bytes = 1024;
  Start(options);
  EchoRequest request;
  request.set_message(std::string(4096, 'x'));
  EchoResponse response;
  EXPECT_EQ(
      CallUnary(*stub_, request, &response, absl::Seconds(5)).error_code(),
      grpc::StatusCode::RESOURCE_EXHAUSTED);
  request.set_message("small");
  EXPECT_TRUE(CallUnary(*stub_, request, &response, absl::Seconds(5)).ok());
}

}  // namespace
}  // namespace swaserve::rpc
