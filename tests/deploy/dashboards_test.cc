// Every Grafana panel's PromQL (deploy/grafana/dashboards/*.json) and every
// recording rule (deploy/prometheus/rules/swaserve.rules.yml) returns data
// from a real Prometheus scraping a real local cluster (redis, a prefill and
// a decode worker, a router) after traffic: no panel or rule names a metric
// that does not exist. Label "deploy".
#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "lib/base/subprocess.h"
#include "tests/integration/metrics/prometheus_server.h"
#include "lib/rpc/channel.h"
#include "swaserve/v1/encoder.grpc.pb.h"
#include "tests/integration/router/local_cluster.h"
#include "tests/unit/media/media_test_util.h"

namespace swaserve {
namespace {

using nlohmann::json;

TEST(Dashboards, EveryPanelAndRecordingRuleReturnsData) {
  auto cluster = testing::LocalCluster::Create({.cli_bin = SWASERVE_CLI_BIN,
                                                .worker_bin = SWASERVE_WORKER_BIN,
                                                .router_bin = SWASERVE_ROUTER_BIN,
                                                .worker_flags = {"--model_name=tiny"},
                                                .model_flags = {"--vision"},
                                                .encoder_bin = SWASERVE_ENCODER_BIN});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  testing::LocalCluster& c = **cluster;
  // With a file L3, so that the tier panels' L3 series exist.
  auto p1 = c.StartWorker("prefill", "p1", {"--kv.l3=file:" + c.dir() + "/l3"});
  ASSERT_TRUE(p1.ok()) << p1.status();
  auto d1 = c.StartWorker("decode", "d1");
  ASSERT_TRUE(d1.ok()) << d1.status();
  auto e1 = c.StartEncoder("e1");
  ASSERT_TRUE(e1.ok()) << e1.status();
  auto r1 = c.StartRouter("r1");
  ASSERT_TRUE(r1.ok()) << r1.status();
  ASSERT_TRUE(c.WaitHealthy("r1", absl::Seconds(60)).ok());

  // Scraped every second under the jobs deploy/prometheus/prometheus.yml
  // gives the pods, with the recording rules evaluated every second.
  const std::string config = absl::StrCat(
      "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n",
      "rule_files:\n  - ", SWASERVE_SOURCE_DIR, "/deploy/prometheus/rules/swaserve.rules.yml\n",
      "scrape_configs:\n",
      "  - job_name: swaserve-router\n    static_configs:\n      - targets: ['127.0.0.1:",
      (*r1)->http_port, "']\n",
      "  - job_name: swaserve-prefill\n    static_configs:\n      - targets: ['127.0.0.1:",
      (*p1)->http_port, "']\n",
      "  - job_name: swaserve-decode\n    static_configs:\n      - targets: ['127.0.0.1:",
      (*d1)->http_port, "']\n",
      "  - job_name: swaserve-encoder\n    static_configs:\n      - targets: ['127.0.0.1:",
      (*e1)->http_port, "']\n");
  auto prom = metrics::testing::PrometheusServer::Start(config);
  ASSERT_TRUE(prom.ok()) << prom.status();
  metrics::testing::PrometheusServer& prometheus = **prom;
  // Every target scraped once before the traffic, so that rates see it.
  for (const absl::Time until = absl::Now() + absl::Seconds(30);;) {
    const json up = prometheus.Query("count(up == 1) == 4 and count(swaserve_router_prompt_tokens_total) > 0");
    if (up.is_array() && !up.empty()) break;
    ASSERT_LT(absl::Now(), until) << "targets not scraped:\n" << prometheus.ReadLog();
    absl::SleepFor(absl::Milliseconds(250));
  }
  absl::SleepFor(absl::Seconds(1));

  // Traffic: prompts sharing a prefix (cache hits), several tokens each.
  const std::string shared(600, 'a');
  for (int i = 0; i < 8; ++i) {
    json req = {{"model", "tiny"},
                {"prompt", shared + " request " + std::to_string(i % 4)},
                {"max_tokens", 8},
                {"temperature", 0}};
    auto r = c.Http("r1", "POST", "/v1/completions", req.dump());
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->status, 200) << r->body;
  }
  // Encoder traffic straight to the encoder (its own metrics): two images, one
  // of them twice (a cache hit), over gRPC.
  {
    auto ch = rpc::CreateChannel(absl::StrCat("127.0.0.1:", (*e1)->grpc_port));
    ASSERT_TRUE(ch.ok());
    auto stub = v1::Encoder::NewStub(*ch);
    for (int seed : {1, 2, 1}) {
      v1::EncodeRequest req;
      v1::MultimodalItem* item = req.add_items();
      item->set_modality(v1::MODALITY_IMAGE);
      const std::vector<uint8_t> png =
          media::testing::EncodePng(media::testing::MakePattern(64, 48, seed));
      item->set_data(std::string(png.begin(), png.end()));
      v1::EncodeResponse resp;
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
      const grpc::Status s = stub->Encode(&ctx, req, &resp);
      ASSERT_TRUE(s.ok()) << s.error_message();
    }
  }
  // Until the scrapes after the traffic are in and the rules have run.
  const absl::Time deadline = absl::Now() + absl::Seconds(40);
  while (true) {
    json hit = prometheus.Query("swaserve:prefix_hit_rate:ratio_5m > 0");
    json ttft = prometheus.Query("sum(swaserve_router_ttft_seconds_count) >= 8");
    json enc = prometheus.Query("sum(swaserve_encoder_cache_lookups_total) >= 3");
    if (hit.is_array() && !hit.empty() && ttft.is_array() && !ttft.empty() && enc.is_array() &&
        !enc.empty()) {
      break;
    }
    ASSERT_LT(absl::Now(), deadline)
        << "no scraped traffic: hit rate " << prometheus.Query("swaserve:prefix_hit_rate:ratio_5m").dump()
        << ", cached " << prometheus.Query("swaserve_router_cached_tokens_total").dump()
        << ", ttft count " << prometheus.Query("swaserve_router_ttft_seconds_count").dump() << "\n"
        << prometheus.ReadLog();
    absl::SleepFor(absl::Milliseconds(500));
  }
  absl::SleepFor(absl::Seconds(2));

  int checked = 0;
  std::set<std::string> empty;
  for (const auto& entry :
       std::filesystem::directory_iterator(std::string(SWASERVE_SOURCE_DIR) + "/deploy/grafana/dashboards")) {
    std::ifstream in(entry.path());
    const json dashboard = json::parse(in);
    for (const json& panel : dashboard["panels"]) {
      for (const json& target : panel["targets"]) {
        // Grafana's $__rate_interval: at least 4 scrape intervals.
        const std::string expr =
            absl::StrReplaceAll(target["expr"].get<std::string>(), {{"$__rate_interval", "1m"}});
        const json result = prometheus.Query(expr);
        ++checked;
        EXPECT_TRUE(result.is_array()) << "query failed: " << expr;
        if (!result.is_array() || result.empty()) {
          empty.insert(absl::StrCat(panel["title"].get<std::string>(), ": ", expr));
        }
      }
    }
  }
  EXPECT_GE(checked, 25);
  for (const std::string& e : empty) ADD_FAILURE() << "panel returns no data: " << e;
  // Every recording rule evaluates without error and has data.
  const json rules = prometheus.Get("/api/v1/rules");
  ASSERT_TRUE(rules.is_object());
  int recording = 0;
  for (const json& group : rules["groups"]) {
    for (const json& rule : group["rules"]) {
      EXPECT_EQ(rule.value("health", ""), "ok") << rule.dump();
      if (rule["type"] != "recording") continue;
      ++recording;
      const json result = prometheus.Query(rule["name"].get<std::string>());
      EXPECT_TRUE(result.is_array() && !result.empty()) << "recording rule has no data: " << rule["name"];
    }
  }
  EXPECT_GE(recording, 10);
  std::cout << checked << " panel queries and " << recording << " recording rules returned data\n";

  // swaserve dashboard renders the same panels from this Prometheus: a PNG
  // per panel and every panel with series in the HTML legend.
  const std::string out = c.dir() + "/dashboard";
  std::string log;
  absl::StatusOr<int> rc = base::RunCommand(
      {SWASERVE_CLI_BIN, "dashboard", absl::StrCat("--prometheus=http://127.0.0.1:", prometheus.port()),
       "--out=" + out, "--range=3m", "--step=2s"},
      &log, absl::Seconds(120));
  ASSERT_TRUE(rc.ok()) << rc.status();
  ASSERT_EQ(*rc, 0) << log;
  std::ifstream in(out + "/index.html");
  std::stringstream html;
  html << in.rdbuf();
  const std::string page = html.str();
  int panels = 0, pngs = 0;
  for (const auto& entry :
       std::filesystem::directory_iterator(std::string(SWASERVE_SOURCE_DIR) + "/deploy/grafana/dashboards")) {
    std::ifstream d(entry.path());
    const json dashboard = json::parse(d);
    for (const json& panel : dashboard["panels"]) {
      ++panels;
      EXPECT_NE(page.find(panel["title"].get<std::string>()), std::string::npos) << panel["title"];
    }
  }
  for (const auto& entry : std::filesystem::directory_iterator(out)) {
    if (entry.path().extension() != ".png") continue;
    std::ifstream png(entry.path(), std::ios::binary);
    char sig[8] = {};
    png.read(sig, 8);
    EXPECT_EQ(std::string(sig, 8), std::string("\x89PNG\r\n\x1a\n", 8)) << entry.path();
    ++pngs;
  }
  EXPECT_EQ(pngs, panels);
  const size_t no_data = page.find("no data");
  EXPECT_EQ(no_data, std::string::npos)
      << "a rendered panel had no series: "
      << page.substr(no_data == std::string::npos ? 0 : std::max<size_t>(700, no_data) - 700, 700);
}

}  // namespace
}  // namespace swaserve
