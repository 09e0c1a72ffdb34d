// A minimal swaserve-style server for the rpc integration tests: the Echo
// test service on a GrpcServer, stopped gracefully by SIGTERM/SIGINT through
// TerminationSignal + ServeUntilTerminated, exactly as the real services'
// main() does it.
//
//   rpc_test_server --port_file=PATH [--listen=127.0.0.1:0] [--drain_ms=5000]
//                   [--lame_duck_ms=0]
//
// Writes the bound port to --port_file (atomically) once serving. Exits 0
// after a graceful stop, 1 on errors, 2 on bad flags.
#include <cstdio>
#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "lib/base/logging.h"
#include "lib/rpc/grpc_server.h"
#include "lib/rpc/termination_signal.h"
#include "tests/unit/rpc/echo_service.h"

namespace {

struct Flags {
  std::string listen = "127.0.0.1:0";
  std::string port_file;
  int drain_ms = 5000;
  int lame_duck_ms = 0;
};

bool ParseFlags(int argc, char** argv, Flags* flags) {
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    const size_t eq = arg.find('=');
    if (!absl::StartsWith(arg, "--") || eq == absl::string_view::npos) {
      return false;
    }
    const absl::string_view name = arg.substr(2, eq - 2);
    const absl::string_view value = arg.substr(eq + 1);
    if (name == "listen") {
      flags->listen = std::string(value);
    } else if (name == "port_file") {
      flags->port_file = std::string(value);
    } else if (name == "drain_ms") {
      if (!absl::SimpleAtoi(value, &flags->drain_ms)) return false;
    } else if (name == "lame_duck_ms") {
      if (!absl::SimpleAtoi(value, &flags->lame_duck_ms)) return false;
    } else {
      return false;
    }
  }
  return !flags->port_file.empty();
}

bool WritePortFile(const std::string& path, int port) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << port << "\n";
    if (!out.good()) return false;
  }
  return std::rename(tmp.c_str(), path.c_str()) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace swaserve;  // NOLINT: test binary
  // First, before any thread exists.
  auto signal = rpc::TerminationSignal::Create();
  if (!signal.ok()) {
    std::fprintf(stderr, "%s\n", signal.status().ToString().c_str());
    return 1;
  }
  Flags flags;
  if (!ParseFlags(argc, argv, &flags)) {
    std::fprintf(stderr,
                 "usage: %s --port_file=PATH [--listen=HOST:PORT] "
                 "[--drain_ms=N] [--lame_duck_ms=N]\n",
                 argv[0]);
    return 2;
  }
  base::LoggingOptions logging;
  logging.name = "rpc_test_server";
  if (const absl::Status s = base::InitLogging(logging); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }

  rpctest::EchoService service;
  rpc::GrpcServerOptions options;
  options.name = "rpc_test_server";
  options.listen_address = flags.listen;
  options.services = {&service};
  options.drain_deadline = absl::Milliseconds(flags.drain_ms);
  options.lame_duck = absl::Milliseconds(flags.lame_duck_ms);
  auto server = rpc::GrpcServer::Create(options);
  if (!server.ok()) {
    SWA_LOG(err, "{}", server.status().ToString());
    return 1;
  }
  if (!WritePortFile(flags.port_file, (*server)->port())) {
    SWA_LOG(err, "cannot write {}", flags.port_file);
    return 1;
  }
  const int signo = rpc::ServeUntilTerminated(**server, **signal);
  SWA_LOG(info, "exiting after signal {}; {} calls served, {} cancelled", signo,
          service.done(), service.cancelled());
  return 0;
}
