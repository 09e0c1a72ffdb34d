#include "lib/launch/service_process.h"

#include <deque>
#include <filesystem>
#include <fstream>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "lib/base/port_file.h"

namespace swaserve::launch {

std::string TailFile(const std::string& path, int lines) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  std::deque<std::string> tail;
  for (std::string line; std::getline(in, line);) {
    tail.push_back(std::move(line));
    if (static_cast<int>(tail.size()) > lines) tail.pop_front();
  }
  return absl::StrJoin(tail, "\n");
}

absl::Status ProcessFailed(const ServiceProcess& p, absl::string_view what) {
  std::string tail = TailFile(p.log_path);
  if (tail.empty()) tail = "(empty)";
  return absl::UnavailableError(
      absl::StrCat(p.name, " ", what, " (log ", p.log_path, "); last lines:\n", tail));
}

absl::StatusOr<ServiceProcess> SpawnService(SpawnOptions options) {
  ServiceProcess p;
  p.name = options.name;
  p.log_path = absl::StrCat(options.dir, "/", options.name, ".log");
  if (options.port_file) {
    p.port_file = absl::StrCat(options.dir, "/", options.name, ".ports.json");
    std::error_code ec;
    std::filesystem::remove(p.port_file, ec);
    options.argv.push_back("--port_file=" + p.port_file);
  }
  base::SubprocessOptions so;
  so.argv = std::move(options.argv);
  so.log_path = p.log_path;
  so.stop_grace = options.stop_grace;
  so.nice_increment = options.nice_increment;
  absl::StatusOr<std::unique_ptr<base::Subprocess>> proc = base::Subprocess::Start(so);
  if (!proc.ok()) {
    return absl::Status(proc.status().code(),
                        absl::StrCat(p.name, ": ", std::string(proc.status().message())));
  }
  p.process = *std::move(proc);
  return p;
}

absl::Status WaitServing(ServiceProcess& p, absl::Time deadline, absl::Duration budget) {
  std::error_code ec;
  while (!std::filesystem::exists(p.port_file, ec)) {
    if (!p.process->Running()) {
      absl::StatusOr<int> code = p.process->Wait(absl::ZeroDuration());
      return ProcessFailed(
          p, absl::StrCat("exited with status ", code.ok() ? *code : -1, " before serving"));
    }
    if (absl::Now() > deadline) {
      return ProcessFailed(
          p, absl::StrCat("did not start serving within ", absl::FormatDuration(budget)));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  absl::StatusOr<int> grpc = base::ReadPort(p.port_file, "grpc_port");
  absl::StatusOr<int> metrics = base::ReadPort(p.port_file, "metrics_port");
  if (!grpc.ok() || !metrics.ok()) {
    return ProcessFailed(p, absl::StrCat("wrote an unreadable port file ", p.port_file, ": ",
                                         (!grpc.ok() ? grpc : metrics).status().message()));
  }
  p.grpc_port = *grpc;
  p.metrics_port = *metrics;
  return absl::OkStatus();
}

std::vector<std::string> WorkerArgv(const WorkerArgs& a) {
  std::vector<std::string> argv = {a.bin,
                                   "--model=" + a.model,
                                   "--role=" + a.role,
                                   "--worker_id=" + a.worker_id,
                                   "--listen=127.0.0.1:0",
                                   "--metrics.host=127.0.0.1",
                                   "--metrics.port=0",
                                   "--redis=" + a.redis,
                                   "--cluster=" + a.cluster};
  if (!a.model_name.empty()) argv.push_back("--model_name=" + a.model_name);
  if (a.threads > 0) argv.push_back(absl::StrCat("--threads=", a.threads));
  return argv;
}

}  // namespace swaserve::launch
