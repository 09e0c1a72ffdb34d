// The local cluster the API end-to-end tests share: the demo model
// (models/demo, served as "demo") on one prefill and one decode worker
// (p1, d1) behind router r1, healthy when returned. `router_flags` are added
// to the router's.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tests/integration/router/local_cluster.h"

namespace swaserve::e2e {

inline absl::StatusOr<std::unique_ptr<testing::LocalCluster>> StartDemoCluster(
    const std::string& model_dir, std::vector<std::string> router_flags = {}) {
  router_flags.insert(router_flags.begin(), "--model_name=demo");
  absl::StatusOr<std::unique_ptr<testing::LocalCluster>> c =
      testing::LocalCluster::Create({.cli_bin = SWASERVE_CLI_BIN,
                                     .worker_bin = SWASERVE_WORKER_BIN,
                                     .router_bin = SWASERVE_ROUTER_BIN,
                                     .worker_flags = {"--model_name=demo"},
                                     .router_flags = std::move(router_flags),
                                     .model_dir = model_dir});
  if (!c.ok()) return c.status();
  for (auto [role, id] : {std::pair{"prefill", "p1"}, {"decode", "d1"}}) {
    if (absl::StatusOr<testing::LocalProcess*> w = (*c)->StartWorker(role, id); !w.ok()) {
      return w.status();
    }
  }
  if (absl::StatusOr<testing::LocalProcess*> r = (*c)->StartRouter("r1"); !r.ok()) {
    return r.status();
  }
  if (absl::Status s = (*c)->WaitHealthy("r1", absl::Seconds(60)); !s.ok()) return s;
  return c;
}

}  // namespace swaserve::e2e
