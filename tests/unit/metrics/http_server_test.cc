#include "lib/metrics/http_server.h"

#include <httplib.h>

#include <string>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/base/subprocess.h"
#include "lib/metrics/exposition.h"
#include "lib/metrics/registry.h"

namespace swaserve::metrics {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<MetricsHttpServer> StartServer(
    MetricsHttpServerOptions options) {
  options.host = "127.0.0.1";
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> server =
      MetricsHttpServer::Create(options);
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

TEST(MetricsHttpServerTest, ServesMetrics) {
  Registry registry;
  CounterFamily* requests = *registry.AddCounter("swaserve_test_requests_total",
                                                 "Requests.", {"path"});
  requests->WithLabels({"a\"b"}).Increment(7);
  MetricsHttpServerOptions options;
  options.registry = &registry;
  std::unique_ptr<MetricsHttpServer> server = StartServer(options);
  ASSERT_NE(server, nullptr);
  EXPECT_GT(server->port(), 0);
  EXPECT_EQ(server->host(), "127.0.0.1");

  httplib::Client client("127.0.0.1", server->port());
  httplib::Result res = client.Get("/metrics");
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->get_header_value("Content-Type"),
            "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_EQ(res->body, registry.RenderText());
  EXPECT_THAT(res->body,
              HasSubstr("swaserve_test_requests_total{path=\"a\\\"b\"} 7\n"));

  // Scrapes see live values.
  requests->WithLabels({"a\"b"}).Increment();
  res = client.Get("/metrics");
  ASSERT_TRUE(res);
  EXPECT_THAT(res->body,
              HasSubstr("swaserve_test_requests_total{path=\"a\\\"b\"} 8\n"));

  res = client.Get("/nope");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 404);
}

TEST(MetricsHttpServerTest, HealthDefaultsToOk) {
  Registry registry;
  MetricsHttpServerOptions options;
  options.registry = &registry;
  std::unique_ptr<MetricsHttpServer> server = StartServer(options);
  ASSERT_NE(server, nullptr);
  httplib::Client client("127.0.0.1", server->port());
  httplib::Result res = client.Get("/health");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->body, "ok\n");
}

TEST(MetricsHttpServerTest, HealthReportsCallbackFailure) {
  Registry registry;
  std::atomic<bool> healthy{true};
  MetricsHttpServerOptions options;
  options.registry = &registry;
  options.health = [&healthy]() -> absl::Status {
    if (healthy.load()) return absl::OkStatus();
    return absl::UnavailableError("redis unreachable");
  };
  std::unique_ptr<MetricsHttpServer> server = StartServer(options);
  ASSERT_NE(server, nullptr);
  httplib::Client client("127.0.0.1", server->port());
  httplib::Result res = client.Get("/health");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  healthy = false;
  res = client.Get("/health");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 503);
  EXPECT_THAT(res->body, HasSubstr("redis unreachable"));
}

TEST(MetricsHttpServerTest, DefaultRegistryIsServedWhenNoneGiven) {
  ASSERT_TRUE(DefaultRegistry()
                  .AddGauge("swaserve_http_server_test_gauge", "Test gauge.")
                  .ok());
  std::unique_ptr<MetricsHttpServer> server =
      StartServer(MetricsHttpServerOptions{});
  ASSERT_NE(server, nullptr);
  httplib::Client client("127.0.0.1", server->port());
  httplib::Result res = client.Get("/metrics");
  ASSERT_TRUE(res);
  EXPECT_THAT(res->body, HasSubstr("swaserve_http_server_test_gauge 0\n"));
}

TEST(MetricsHttpServerTest, FixedPortAndBindConflict) {
  absl::StatusOr<int> port = base::PickFreePort();
  ASSERT_TRUE(port.ok()) << port.status();
  Registry registry;
  MetricsHttpServerOptions options;
  options.registry = &registry;
  options.port = *port;
  std::unique_ptr<MetricsHttpServer> server = StartServer(options);
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(server->port(), *port);

  options.host = "127.0.0.1";
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> second =
      MetricsHttpServer::Create(options);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
}

TEST(MetricsHttpServerTest, RejectsBadOptions) {
  MetricsHttpServerOptions options;
  options.port = 70000;
  EXPECT_EQ(MetricsHttpServer::Create(options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.port = 0;
  options.num_threads = 0;
  EXPECT_EQ(MetricsHttpServer::Create(options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(MetricsHttpServerTest, StopIsIdempotentAndClosesThePort) {
  Registry registry;
  MetricsHttpServerOptions options;
  options.registry = &registry;
  std::unique_ptr<MetricsHttpServer> server = StartServer(options);
  ASSERT_NE(server, nullptr);
  const int port = server->port();
  server->Stop();
  server->Stop();
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(1);
  EXPECT_FALSE(client.Get("/metrics"));
  server.reset();  // destructor after Stop() is fine
}

TEST(MetricsHttpServerTest, StopRightAfterCreate) {
  Registry registry;
  for (int i = 0; i < 20; ++i) {
    MetricsHttpServerOptions options;
    options.registry = &registry;
    std::unique_ptr<MetricsHttpServer> server = StartServer(options);
    ASSERT_NE(server, nullptr);
  }
}

}  // namespace
}  // namespace swaserve::metrics
