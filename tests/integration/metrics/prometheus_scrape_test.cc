// End to end: this test process serves /metrics with MetricsHttpServer, a
// real `prometheus` (started on a free loopback port with a temporary config
// and TSDB) scrapes it every second, and the test reads the values back
// through Prometheus' query API — proving the exposition is what Prometheus
// ingests, label escaping included.
#include <httplib.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "lib/base/subprocess.h"
#include "lib/metrics/http_server.h"
#include "lib/metrics/registry.h"

namespace swaserve::metrics {
namespace {

constexpr absl::Duration kReadyTimeout = absl::Seconds(30);
constexpr absl::Duration kScrapeTimeout = absl::Seconds(40);

bool OnPath(const std::string& program) {
  const char* path = std::getenv("PATH");
  if (path == nullptr) return false;
  for (const absl::string_view dir : absl::StrSplit(path, ':')) {
    const std::string candidate = std::string(dir) + "/" + program;
    if (access(candidate.c_str(), X_OK) == 0) return true;
  }
  return false;
}

// Runs an instant query; returns the parsed "data.result" array, or null
// when Prometheus did not answer successfully.
nlohmann::json Query(httplib::Client& client, const std::string& promql) {
  httplib::Result res = client.Get(
      "/api/v1/query", httplib::Params{{"query", promql}}, httplib::Headers{});
  if (!res || res->status != 200) return nullptr;
  nlohmann::json body = nlohmann::json::parse(res->body, nullptr, false);
  if (body.is_discarded() || body.value("status", "") != "success") {
    return nullptr;
  }
  return body["data"]["result"];
}

class PrometheusScrapeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!OnPath("prometheus")) {
      GTEST_FAIL() << "prometheus not found on PATH: install it (Debian: "
                      "apt-get install prometheus) — CI has it";
    }
    absl::StatusOr<std::string> dir = base::MakeTempDir("swaserve-prom");
    ASSERT_TRUE(dir.ok()) << dir.status();
    dir_ = *dir;
  }

  void TearDown() override {
    if (prometheus_ != nullptr) {
      absl::StatusOr<int> rc = prometheus_->Stop();
      EXPECT_TRUE(rc.ok()) << rc.status();
      if (HasFailure()) {
        std::cerr << "prometheus log:\n" << prometheus_->ReadLog() << "\n";
      }
      prometheus_.reset();
    }
    if (!dir_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(dir_, ec);
    }
  }

  // Starts prometheus scraping 127.0.0.1:target_port every second and waits
  // until it reports ready. Sets prometheus_port_.
  void StartPrometheus(int target_port) {
    const std::string config_path = dir_ + "/prometheus.yml";
    {
      std::ofstream config(config_path);
      config << "global:\n"
                "  scrape_interval: 1s\n"
                "  scrape_timeout: 1s\n"
                "  evaluation_interval: 1s\n"
                "scrape_configs:\n"
                "  - job_name: swaserve_metrics_it\n"
                "    static_configs:\n"
                "      - targets: ['127.0.0.1:"
             << target_port << "']\n";
      ASSERT_TRUE(config.good());
    }
    absl::StatusOr<int> port = base::PickFreePort();
    ASSERT_TRUE(port.ok()) << port.status();
    prometheus_port_ = *port;
    base::SubprocessOptions options;
    options.argv = {
        "prometheus", "--config.file=" + config_path,
        "--storage.tsdb.path=" + dir_ + "/data",
        absl::StrCat("--web.listen-address=127.0.0.1:", prometheus_port_),
        "--log.level=warn"};
    options.log_path = dir_ + "/prometheus.log";
    absl::StatusOr<std::unique_ptr<base::Subprocess>> process =
        base::Subprocess::Start(options);
    ASSERT_TRUE(process.ok()) << process.status();
    prometheus_ = *std::move(process);

    const absl::Time deadline = absl::Now() + kReadyTimeout;
    httplib::Client client("127.0.0.1", prometheus_port_);
    client.set_connection_timeout(1);
    while (true) {
      ASSERT_TRUE(prometheus_->Running()) << "prometheus exited:\n"
                                          << prometheus_->ReadLog();
      httplib::Result res = client.Get("/-/ready");
      if (res && res->status == 200) break;
      ASSERT_LT(absl::Now(), deadline)
          << "prometheus not ready after " << kReadyTimeout;
      absl::SleepFor(absl::Milliseconds(200));
    }
  }

  std::string dir_;
  int prometheus_port_ = 0;
  std::unique_ptr<base::Subprocess> prometheus_;
};

TEST_F(PrometheusScrapeTest, PrometheusReadsBackCountersHistogramsAndLabels) {
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

  ASSERT_NO_FATAL_FAILURE(StartPrometheus((*server)->port()));

  httplib::Client client("127.0.0.1", prometheus_port_);
  client.set_read_timeout(5);
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + kScrapeTimeout;
  nlohmann::json result;
  while (true) {
    result = Query(client, "swaserve_it_requests_total");
    if (result.is_array() && !result.empty()) break;
    ASSERT_LT(absl::Now(), deadline)
        << "prometheus never returned swaserve_it_requests_total";
    ASSERT_TRUE(prometheus_->Running()) << prometheus_->ReadLog();
    absl::SleepFor(absl::Milliseconds(500));
  }
  std::cerr << "first scrape visible after " << (absl::Now() - start) << "\n";

  ASSERT_EQ(result.size(), 1u) << result.dump();
  EXPECT_EQ(result[0]["value"][1], "4242") << result.dump();
  EXPECT_EQ(result[0]["metric"]["path"], tricky_path) << result.dump();
  EXPECT_EQ(result[0]["metric"]["job"], "swaserve_metrics_it");

  // The same scrape carried the other families.
  nlohmann::json count = Query(client, "swaserve_it_latency_seconds_count");
  ASSERT_TRUE(count.is_array() && count.size() == 1u) << count.dump();
  EXPECT_EQ(count[0]["value"][1], "3");
  nlohmann::json le1 =
      Query(client, "swaserve_it_latency_seconds_bucket{le=\"1\"}");
  ASSERT_TRUE(le1.is_array() && le1.size() == 1u) << le1.dump();
  EXPECT_EQ(le1[0]["value"][1], "2");
  nlohmann::json pages = Query(client, "swaserve_it_pool_pages");
  ASSERT_TRUE(pages.is_array() && pages.size() == 1u) << pages.dump();
  EXPECT_EQ(pages[0]["value"][1], "77");
  nlohmann::json up = Query(client, "up{job=\"swaserve_metrics_it\"}");
  ASSERT_TRUE(up.is_array() && up.size() == 1u) << up.dump();
  EXPECT_EQ(up[0]["value"][1], "1");
}

}  // namespace
}  // namespace swaserve::metrics
