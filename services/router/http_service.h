// The OpenAI-compatible HTTP API of a router replica (issue 7):
//   POST /v1/completions, POST /v1/chat/completions  (SSE with stream: true)
//   GET  /v1/models, /health, /metrics
// Bodies are parsed by lib/api (errors as OpenAI error JSON with the right
// status: 400 bad JSON or parameters, 401 missing/wrong key, 404 unknown
// model, 413 body over the limit or prompt beyond the largest bucket, 429
// key concurrency limit or router overloaded, 503 no healthy workers), then
// run by router::Router (asynchronously: the connection's thread streams
// what the request queues in a CallState). A streamed
// request's status is decided by its first event: errors before the first
// token get a proper status code; an error after it ends the stream with an
// error event and [DONE].
//
// Optional access control: with an ApiKeyStore, every /v1/ path needs
// "Authorization: Bearer <key>"; a ConcurrencyLimiter bounds requests in
// flight per key. /health and /metrics are open (probes, Prometheus).
//
// Metrics: swaserve_router_http_requests_total{path,status}.
// Thread-safety: the server runs its own threads; Create/Stop from one thread.
#pragma once

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "lib/api/api_keys.h"
#include "lib/api/openai.h"
#include "lib/metrics/registry.h"
#include "lib/router/router.h"

namespace httplib {
class Server;
}

namespace swaserve::router_service {

struct HttpServiceOptions {
  std::string host = "0.0.0.0";
  // 0: any free port (see port()).
  int port = 0;
  // Threads serving connections; a streaming request holds one for its
  // duration. Default 256.
  int threads = 256;
  api::ParseLimits limits;
  // Optional; not owned.
  api::ApiKeyStore* keys = nullptr;
  api::ConcurrencyLimiter* limiter = nullptr;
  // Required; not owned.
  router::Router* router = nullptr;
  const model::Tokenizer* tokenizer = nullptr;
  // nullptr: metrics::DefaultRegistry() (also what /metrics serves).
  metrics::Registry* registry = nullptr;
};

class HttpService {
 public:
  static absl::StatusOr<std::unique_ptr<HttpService>> Create(const HttpServiceOptions& options);
  ~HttpService();
  int port() const { return port_; }
  // Stops accepting and waits for the listener thread.
  void Stop();

 private:
  HttpService() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace swaserve::router_service
