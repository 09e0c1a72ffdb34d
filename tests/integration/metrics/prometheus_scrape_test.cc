// End to end: this test process serves /metrics with MetricsHttpServer, a
// real `prometheus` (started on a free loopback port with a temporary config
// and TSDB) scrapes it every second, and the test reads the values back
// through Prometheus' query API — proving the exposition is what Prometheus
// ingests, label escaping included.
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "lib/metrics/http_server.h"
#include "lib/metrics/registry.h"
#include "tests/integration/metrics/prometheus_server.h"

namespace swaserve::metrics {
namespace {

constexpr absl::Duration kScrapeTimeout = absl::Seconds(40);

TEST(PrometheusScrapeTest, PrometheusReadsBackCountersHistogramsAndLabels) {
  Registry registry;
  CounterFamily* requests =
      *registry.AddCounter("swaserve_it_requests_total",
                           "Requests, for the integration test.", {"path"});
  const std::string tricky_path = "a\"b\\c\nd";
  requests->WithLabels({tricky_path}).Increment(4242);
  HistogramFamily* latency = *registry.AddHistogram(
      "swaserve_it_latency_seconds", "Latency.", {}, {0.1, 1});
  for (double v : {0.05, 0.5, 5.0}) latency->WithLabels().Observe(v);
  ASSERT_TRUE(registry
                  .AddCallbackGauge("swaserve_it_pool_pages", "Pages.",
                                    [] { return 77.0; })
                  .ok());

  MetricsHttpServerOptions server_options;
  server_options.host = "127.0.0.1";
  server_options.registry = &registry;
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> server =
      MetricsHttpServer::Create(server_options);
  ASSERT_TRUE(server.ok()) << server.status();

  absl::StatusOr<std::unique_ptr<testing::PrometheusServer>> prom = testing::PrometheusServer::Start(
      absl::StrCat("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
                   "  evaluation_interval: 1s\nscrape_configs:\n"
                   "  - job_name: swaserve_metrics_it\n    static_configs:\n"
                   "      - targets: ['127.0.0.1:", (*server)->port(), "']\n"));
  ASSERT_TRUE(prom.ok()) << prom.status();
  testing::PrometheusServer& prometheus = **prom;
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + kScrapeTimeout;
  nlohmann::json result;
  while (true) {
    result = prometheus.Query("swaserve_it_requests_total");
    if (result.is_array() && !result.empty()) break;
    ASSERT_LT(absl::Now(), deadline)
        << "prometheus never returned swaserve_it_requests_total";
    ASSERT_TRUE(prometheus.Running()) << prometheus.ReadLog();
    absl::SleepFor(absl::Milliseconds(500));
  }
  std::cerr << "first scrape visible after " << (absl::Now() - start) << "\n";

  ASSERT_EQ(result.size(), 1u) << result.dump();
  EXPECT_EQ(result[0]["value"][1], "4242") << result.dump();
  EXPECT_EQ(result[0]["metric"]["path"], tricky_path) << result.dump();
  EXPECT_EQ(result[0]["metric"]["job"], "swaserve_metrics_it");

  // The same scrape carried the other families.
  nlohmann::json count = prometheus.Query("swaserve_it_latency_seconds_count");
  ASSERT_TRUE(count.is_array() && count.size() == 1u) << count.dump();
  EXPECT_EQ(count[0]["value"][1], "3");
  nlohmann::json le1 =
      prometheus.Query("swaserve_it_latency_seconds_bucket{le=\"1\"}");
  ASSERT_TRUE(le1.is_array() && le1.size() == 1u) << le1.dump();
  EXPECT_EQ(le1[0]["value"][1], "2");
  nlohmann::json pages = prometheus.Query("swaserve_it_pool_pages");
  ASSERT_TRUE(pages.is_array() && pages.size() == 1u) << pages.dump();
  EXPECT_EQ(pages[0]["value"][1], "77");
  nlohmann::json up = prometheus.Query("up{job=\"swaserve_metrics_it\"}");
  ASSERT_TRUE(up.is_array() && up.size() == 1u) << up.dump();
  EXPECT_EQ(up[0]["value"][1], "1");
}

}  // namespace
}  // namespace swaserve::metrics
