// A real `prometheus` for tests: started on a free loopback port with a
// temporary config and TSDB, waited for until ready, stopped (its log printed
// on request) when destroyed. Debian's package (apt-get install prometheus);
// CI has it.
//
// Not thread-safe; one per test.
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "lib/base/subprocess.h"

namespace swaserve::metrics::testing {

class PrometheusServer {
 public:
  // `config_yaml` is the whole prometheus.yml. InvalidArgument when
  // prometheus is not on PATH; Unavailable when it is not ready in time.
  static absl::StatusOr<std::unique_ptr<PrometheusServer>> Start(
      const std::string& config_yaml, absl::Duration ready_timeout = absl::Seconds(30));
  ~PrometheusServer();

  int port() const { return port_; }
  bool Running() { return process_->Running(); }
  std::string ReadLog() { return process_->ReadLog(); }

  // An instant query: "data.result", or null when Prometheus did not answer
  // with success.
  nlohmann::json Query(const std::string& promql);
  // GET `path` (e.g. /api/v1/rules): the parsed body, or null.
  nlohmann::json Get(const std::string& path);

 private:
  PrometheusServer() = default;
  std::string dir_;
  int port_ = 0;
  std::unique_ptr<base::Subprocess> process_;
};

}  // namespace swaserve::metrics::testing
