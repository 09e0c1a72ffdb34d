// MetricsHttpServer: the /metrics and /health HTTP endpoint every swaserve
// service runs next to its gRPC server.
//
//   GET /metrics  200, the registry in the text format 0.0.4
//                 (Content-Type: text/plain; version=0.0.4; charset=utf-8)
//   GET /health   200 "ok" when the health callback returns OK (or there is
//                 none); 503 with the callback's message otherwise
//
// Runs cpp-httplib on its own background threads (an accept thread plus a
// small worker pool). Create() returns once the socket is bound and the
// server is accepting, so port() can be handed to a scraper immediately.
// Create() also makes the process ignore SIGPIPE if it has the default
// disposition (a scraper hanging up mid-response must not kill the service).
//
// Ownership: owns its threads and socket; does not own the Registry, which
// must outlive the server. Thread-safety: port()/host() are thread-safe;
// Stop() and the destructor must not race with each other.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "lib/metrics/registry.h"

namespace httplib {
class Server;
}  // namespace httplib

namespace swaserve::metrics {

struct MetricsHttpServerOptions {
  // Address to bind. Default "0.0.0.0" (all interfaces: Prometheus scrapes
  // from another pod); tests use "127.0.0.1".
  std::string host = "0.0.0.0";
  // Port to bind; 0 (default) picks a free one (see port()).
  int port = 0;
  // Registry served on /metrics; not owned. Default (nullptr):
  // DefaultRegistry().
  const Registry* registry = nullptr;
  // Health check for /health, called on a server thread per request; OK means
  // healthy. Default (empty): always healthy.
  std::function<absl::Status()> health;
  // Worker threads serving requests. Default 2.
  int num_threads = 2;
};

class MetricsHttpServer {
 public:
  // Binds and starts serving. Unavailable when the address cannot be bound
  // (port in use, bad host); InvalidArgument for bad options.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Create(
      const MetricsHttpServerOptions& options);

  // Stops the server (see Stop()).
  ~MetricsHttpServer();
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  // The bound port (the picked one when options.port was 0).
  int port() const { return port_; }
  const std::string& host() const { return host_; }

  // Stops accepting, finishes in-flight requests and joins the threads.
  // Idempotent.
  void Stop();

 private:
  MetricsHttpServer(std::string host, int port,
                    std::unique_ptr<httplib::Server> server);

  const std::string host_;
  const int port_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  std::atomic<bool> listen_returned_{false};
};

}  // namespace swaserve::metrics
