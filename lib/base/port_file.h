// Port files: how a service started with port 0 tells whoever started it
// (swaserve up, tests, scripts) which ports it bound. One JSON object,
//   {"grpc_port": 40123, "metrics_port": 40124, "pid": 4242}
// written to `path.tmp` and renamed over `path`, so a reader that sees the
// file sees it whole.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace swaserve::base {

// Writes `ports` (name → port, in order) and this process's pid.
// Internal (naming the path) when the file cannot be written or renamed.
absl::Status WritePortFile(const std::string& path,
                           const std::vector<std::pair<std::string, int>>& ports);

// Reads one port from a port file. NotFound when the file or the key is
// missing; InvalidArgument when the file is not such a JSON object.
absl::StatusOr<int> ReadPort(const std::string& path, const std::string& name);

}  // namespace swaserve::base
