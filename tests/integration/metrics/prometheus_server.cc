#include "tests/integration/metrics/prometheus_server.h"

#include <httplib.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

namespace swaserve::metrics::testing {
namespace {

bool OnPath(const std::string& program) {
  const char* path = std::getenv("PATH");
  if (path == nullptr) return false;
  for (const absl::string_view dir : absl::StrSplit(path, ':')) {
    if (access((std::string(dir) + "/" + program).c_str(), X_OK) == 0) return true;
  }
  return false;
}

}  // namespace

absl::StatusOr<std::unique_ptr<PrometheusServer>> PrometheusServer::Start(
    const std::string& config_yaml, absl::Duration ready_timeout) {
  if (!OnPath("prometheus")) {
    return absl::InvalidArgumentError(
        "prometheus not found on PATH: install it (Debian: apt-get install prometheus)");
  }
  auto p = std::unique_ptr<PrometheusServer>(new PrometheusServer());
  absl::StatusOr<std::string> dir = base::MakeTempDir("swaserve-prom");
  if (!dir.ok()) return dir.status();
  p->dir_ = *dir;
  const std::string config_path = p->dir_ + "/prometheus.yml";
  {
    std::ofstream config(config_path);
    config << config_yaml;
    if (!config.good()) return absl::InternalError("cannot write " + config_path);
  }
  absl::StatusOr<int> port = base::PickFreePort();
  if (!port.ok()) return port.status();
  p->port_ = *port;
  base::SubprocessOptions options;
  options.argv = {"prometheus", "--config.file=" + config_path,
                  "--storage.tsdb.path=" + p->dir_ + "/data",
                  absl::StrCat("--web.listen-address=127.0.0.1:", p->port_), "--log.level=warn"};
  options.log_path = p->dir_ + "/prometheus.log";
  absl::StatusOr<std::unique_ptr<base::Subprocess>> process = base::Subprocess::Start(options);
  if (!process.ok()) return process.status();
  p->process_ = *std::move(process);
  const absl::Time deadline = absl::Now() + ready_timeout;
  httplib::Client client("127.0.0.1", p->port_);
  client.set_connection_timeout(1);
  while (true) {
    if (!p->process_->Running()) {
      return absl::UnavailableError("prometheus exited:\n" + p->process_->ReadLog());
    }
    httplib::Result res = client.Get("/-/ready");
    if (res && res->status == 200) break;
    if (absl::Now() > deadline) {
      return absl::UnavailableError(absl::StrCat("prometheus not ready after ", absl::FormatDuration(ready_timeout),
                                                 ":\n", p->process_->ReadLog()));
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
  return p;
}

PrometheusServer::~PrometheusServer() {
  if (process_ != nullptr) (void)process_->Stop();
  if (!dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
}

nlohmann::json PrometheusServer::Get(const std::string& path) {
  httplib::Client client("127.0.0.1", port_);
  client.set_read_timeout(10);
  httplib::Result res = client.Get(path);
  if (!res || res->status != 200) return nullptr;
  nlohmann::json body = nlohmann::json::parse(res->body, nullptr, false);
  if (body.is_discarded() || body.value("status", "") != "success") return nullptr;
  return body["data"];
}

nlohmann::json PrometheusServer::Query(const std::string& promql) {
  httplib::Client client("127.0.0.1", port_);
  client.set_read_timeout(10);
  httplib::Result res =
      client.Get("/api/v1/query", httplib::Params{{"query", promql}}, httplib::Headers{});
  if (!res || res->status != 200) return nullptr;
  nlohmann::json body = nlohmann::json::parse(res->body, nullptr, false);
  if (body.is_discarded() || body.value("status", "") != "success") return nullptr;
  return body["data"]["result"];
}

}  // namespace swaserve::metrics::testing
