// The OpenAI-compatible HTTP API of a router replica:
//   POST /v1/completions, POST /v1/chat/completions  (SSE with stream: true)
//   GET  /v1/models, /health (ready: workers registered), /livez (the
//        process serves HTTP), /metrics
// Bodies are parsed by lib/api (errors as OpenAI error JSON with the right
// status: 400 bad JSON or parameters, 401 missing/wrong key, 404 unknown
// model, 413 body over the limit or prompt beyond the largest bucket, 429
// key concurrency limit or router overloaded, 503 no healthy workers), then
// run by router::Router asynchronously (Router::Start). A streamed
// request's status is decided by its first event: errors before the first
// token get a proper status code; an error after it ends the stream with an
// error event and [DONE]. A non-streamed request unanswered after
// nonstream_keepalive gets its 200 and whitespace before its JSON body, so
// client and proxy timeouts do not cut a long prefill (HttpCall::Params).
//
// Event-driven:
// libevent's evhttp on `threads` event loops sharing the listening socket.
// A request is parsed and answered on its connection's loop; the router's
// output reaches it through an HttpCall (http_call.h), which the router
// writes from its own threads and the loop drains into the socket. No
// thread is held per request or per connection, and a slow client paces
// its own request (the router reads on only when the client has room). A
// client that closes its connection cancels its request.
//
// Optional access control: with an ApiKeyStore, every /v1/ path needs
// "Authorization: Bearer <key>"; a ConcurrencyLimiter bounds requests in
// flight per key. /health, /livez and /metrics are open (probes, Prometheus).
//
// Metrics: swaserve_router_http_requests_total{path,status}.
// Thread-safety: the server runs its own threads; Create/Stop from one thread.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "lib/api/api_keys.h"
#include "lib/router/caller_policy.h"
#include "lib/rpc/tls.h"
#include "lib/api/openai.h"
#include "lib/metrics/registry.h"
#include "lib/router/router.h"

namespace swaserve::router_service {

struct HttpServiceOptions {
  std::string host = "0.0.0.0";
  // 0: any free port (see port()).
  int port = 0;
  // Event loops (threads) serving connections; each holds any number of
  // connections and streams. Default 2.
  int threads = 2;
  api::ParseLimits limits;
  // TLS on the listener from these files, reloaded when they change
  // (rpc::HttpTlsContext); disabled (plaintext) without a certificate.
  rpc::TlsFiles tls;
  // HttpCall::Params::stream_keepalive: a streamed request waiting this
  // long for its first token starts its stream and sends an SSE comment
  // this often. Zero: off. Default 15 s.
  absl::Duration stream_keepalive = absl::Seconds(15);
  // HttpCall::Params::nonstream_keepalive: a non-streamed request without
  // its answer after this long gets its 200 and a whitespace byte this
  // often before its JSON body (a later error travels in that body). Zero:
  // off. Default 15 s (as the streamed one: errors found sooner keep their
  // status code).
  absl::Duration nonstream_keepalive = absl::Seconds(15);
  // Optional; not owned.
  api::ApiKeyStore* keys = nullptr;
  api::ConcurrencyLimiter* limiter = nullptr;
  // What an authenticated key's requests run as (its tenant's cache domain,
  // priority floor and rate limits); required with `keys`. Not owned.
  router::CallerPolicy* callers = nullptr;
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
  int port_ = 0;
};

}  // namespace swaserve::router_service
