// Router: the request path of a swaserve router replica (ARCHITECTURE §4 step
// 1; issue 7), without any server: services/router wraps it in the gRPC
// swaserve.v1.Router service and the OpenAI HTTP API.
//
// For each request:
//   1. prompt -> token ids (text, ids, or a chat rendered with the model's
//      chat template), max_tokens and model checked;
//   2. length bucket by prompt tokens (policy.h; beyond the largest:
//      OutOfRange, which the HTTP API maps to 413);
//   3. chained page hashes of the prompt; ONE Redis round trip (EVALSHA of
//      the index's Lua script) for the matched prefix depth of every prefill
//      candidate and the load reports of every candidate;
//   4. policy: prefill worker (cached tokens vs queued compute, hotspot
//      guard), decode worker (free KV pages, queue); a monolithic worker
//      (role both) chosen for prefill also decodes; every decision counted
//      by reason; the dispatch is recorded in the prefix index (predicted
//      entries) off the request's path;
//   5. legs: Decode.Decode on the decode worker (its first message is the KV
//      staging destination), then Prefill.Prefill with that destination,
//      while the decode stream's tokens are turned into text (TextStream:
//      UTF-8 safe, cut at stop strings) and handed to the sink;
//   6. retries: a failed prefill leg goes to another worker of the bucket, a
//      decode leg that fails before the first token is retried on another
//      decode worker (both legs start over with a new transfer id); after
//      the first token reached the client the stream ends with the error.
//      Failures feed the WorkerDirectory's circuit breakers.
//
// Generate() runs on the caller's thread and blocks until the request ends
// (the services give each request its own thread: never call it from a gRPC
// reactor). It keeps no state beyond the request: replicas share only Redis.
//
// Metrics (on options.registry):
//   swaserve_router_requests_total{code}          requests by final status
//   swaserve_router_decisions_total{leg,reason}   leg = prefill | decode
//   swaserve_router_decision_seconds              Redis reads + policy
//   swaserve_router_retries_total{leg}
//   swaserve_router_ttft_seconds{bucket}          request start -> first token
//   swaserve_router_tpot_seconds{bucket}          per output token after it
//   swaserve_router_e2e_seconds{bucket}
//   swaserve_router_prompt_tokens_total, _cached_tokens_total,
//   swaserve_router_generated_tokens_total        (hit rate = cached/prompt)
//   swaserve_router_inflight_requests             gauge
//   swaserve_router_redis_fallbacks_total         index/load read failed:
//                                                 routed without it
// (Redis latency: swaserve_redis_seconds{op}, from cluster::RedisClient.)
//
// Ownership: borrows the view, directory and tokenizer (must outlive it).
// Thread-safety: thread-safe; Generate may run concurrently.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "lib/base/thread_pool.h"
#include "lib/cluster/cluster_view.h"
#include "lib/metrics/registry.h"
#include "lib/model/tokenizer.h"
#include "lib/router/policy.h"
#include "lib/router/worker_directory.h"
#include "swaserve/v1/router.pb.h"

namespace swaserve::router {

struct RouterOptions {
  // Required; not owned.
  cluster::ClusterView* view = nullptr;
  WorkerDirectory* directory = nullptr;
  const model::Tokenizer* tokenizer = nullptr;
  // The served model id (GenerateRequest.model must be empty or equal).
  std::string model_name = "swaserve";
  // Unix seconds the model was loaded (ListModels).
  int64_t created_unix_seconds = 0;
  PolicyOptions policy;
  // max_tokens when a request has 0, and the largest accepted.
  uint32_t default_max_tokens = 256;
  uint32_t max_max_tokens = 32768;
  // Attempts per leg (first try included).
  int max_prefill_attempts = 3;
  int max_decode_attempts = 2;
  // Deadline of a whole request's worker calls. Default 10 min.
  absl::Duration request_timeout = absl::Minutes(10);
  // How long to wait for the decode worker's KV destination. Default 30 s.
  absl::Duration destination_timeout = absl::Seconds(30);
  // Requests in flight beyond which new ones get ResourceExhausted (HTTP
  // 429); 0 means unlimited. Default 4096.
  int max_inflight_requests = 4096;
  // Threads recording dispatches in the prefix index (off the request path).
  int record_threads = 2;
  // Metrics registry; nullptr: metrics::DefaultRegistry().
  metrics::Registry* registry = nullptr;
};

// Receives a request's output. Write() returns false when the client is
// gone (the request is then cancelled). Called from the Generate() thread.
class GenerateSink {
 public:
  virtual ~GenerateSink() = default;
  virtual bool Write(const v1::GenerateResponse& response) = 0;
};

// Cancels a request from another thread (a client that disconnected).
class CancelFlag {
 public:
  void Cancel();
  bool cancelled() const { return cancelled_.load(std::memory_order_acquire); }
  // Runs `fn` now if cancelled, else on Cancel(). One callback at a time;
  // Clear() before the objects it touches die.
  void OnCancel(std::function<void()> fn);
  void Clear();

 private:
  std::atomic<bool> cancelled_{false};
  absl::Mutex mu_;
  std::function<void()> fn_ ABSL_GUARDED_BY(mu_);
};

class Router {
 public:
  static absl::StatusOr<std::unique_ptr<Router>> Create(const RouterOptions& options);
  ~Router();
  Router(const Router&) = delete;
  Router& operator=(const Router&) = delete;

  // Runs one request to its end. OK after the last response (with
  // finish_reason and usage) was written; otherwise the error, carrying an
  // ErrorDetail (rpc::GetErrorDetail) when the cause is known:
  //   InvalidArgument   bad prompt or parameters (ERROR_CODE_INVALID_REQUEST)
  //   NotFound          unknown model (ERROR_CODE_UNKNOWN_MODEL)
  //   OutOfRange        prompt beyond the largest bucket (PROMPT_TOO_LONG)
  //   ResourceExhausted too many requests in flight (OVERLOADED)
  //   Unavailable       no healthy worker, or every attempt failed
  //   Cancelled         the sink refused a write or `cancel` fired
  absl::Status Generate(const v1::GenerateRequest& request, GenerateSink& sink,
                        CancelFlag* cancel = nullptr);

  // The routing decision for `request` without running it (no worker is
  // called, nothing is recorded in the index): what Generate's first attempt
  // would pick. For operators (dry runs) and the decision benchmark. Errors
  // as Generate's before any worker call.
  struct RouteResult {
    std::string prefill_worker;
    std::string decode_worker;
    int bucket = 0;
    int64_t prompt_tokens = 0;
    int64_t expected_cached_tokens = 0;
  };
  absl::StatusOr<RouteResult> Route(const v1::GenerateRequest& request);

  v1::ListModelsResponse ListModels() const;

  // OK when at least one healthy prefill-capable and one decode-capable
  // worker are registered (the /health of the router).
  absl::Status Health();

  const RouterOptions& options() const { return options_; }

 private:
  struct Metrics;
  struct Request;
  struct Choice;
  explicit Router(const RouterOptions& options);

  absl::Status Prepare(const v1::GenerateRequest& in, Request& r);
  // `record`: write predicted index entries for the choice (off the path).
  absl::StatusOr<Choice> Decide(Request& r, bool record = true);
  // One attempt of both legs. Sets *retry_leg ("prefill"/"decode") when the
  // failure may be retried elsewhere.
  absl::Status RunLegs(Request& r, const Choice& c, GenerateSink& sink, CancelFlag* cancel,
                       std::string* retry_leg);

  const RouterOptions options_;
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<base::ThreadPool> record_pool_;
  std::atomic<int> inflight_{0};
  std::atomic<uint64_t> next_id_{0};
  const uint64_t id_salt_;
};

}  // namespace swaserve::router
