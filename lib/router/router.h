// Router: the request path of a swaserve router replica (docs/architecture.md#request-path step
// 1), without any server: services/router wraps it in the gRPC
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
//      (role both) chosen for prefill also decodes; a prompt that no
//      candidate's KV pool can hold fails here (ResourceExhausted,
//      ERROR_CODE_TOO_LARGE_FOR_WORKER: HTTP 413) without a worker call; a
//      worker whose breaker is half-open takes its one trial only when the
//      policy picks it (WorkerDirectory::Pick); every decision counted by
//      reason; the dispatch is recorded in the prefix index (predicted
//      entries) off the request's path;
//   5. legs: Decode.Decode on the decode worker (its first message,
//      `accepted`, within destination_timeout; it allocates nothing), then
//      Prefill.Prefill naming that worker and the transfer id — the prompt
//      may queue there as long as the request's deadline allows; the
//      decode stream's tokens are turned into text (TextStream: UTF-8
//      safe, cut at stop strings, kept across legs) and handed to the sink.
//      A failed prefill leg cancels the decode leg and vice versa, at once;
//      no wait for the prefill's answer once the stream has finished;
//   6. failures, classified by failure.h: request errors end the request
//      (no breaker); overloads and worker faults are retried on another
//      worker (faults feed the WorkerDirectory's breakers): a failed
//      prefill leg goes to another worker of the bucket, a decode leg that
//      fails before the first token to another decode worker (both legs
//      start over with a new transfer id; the prefill keeps KV it could not
//      ship, so the retry hits). A decode leg that fails after tokens
//      reached the client MIGRATES (up to max_migrations): prompt + every
//      token sent is re-dispatched to another prefill/decode pair with
//      max_tokens reduced, and the same client stream continues — greedy
//      output identical to an uninterrupted run (batch- and chunk-invariant
//      kernels); usage counts the client's prompt and every token.
//
// Requests run asynchronously (Start): the blocking steps (the
// prompt's tokenization, the decision's Redis round trip, media encoding)
// run on a few control threads; the legs are asynchronous gRPC calls (the
// decode stream a callback reader, the prefill a callback unary call;
// WorkerClient, worker_client.h), so a request that queues for minutes at a
// prefill worker or streams for minutes holds no thread, and the output
// goes to the sink from gRPC's callback threads, paced by the sink's
// OnReady. It keeps no state beyond the request: replicas share only Redis.
//
// Metrics (on options.registry):
//   swaserve_router_requests_total{code}          requests by final status
//   swaserve_router_decisions_total{leg,reason}   leg = prefill | decode
//   swaserve_router_decision_seconds              Redis reads + policy
//   swaserve_router_retries_total{leg}
//   swaserve_router_migrations_total{reason}      worker_lost | draining
//   swaserve_router_ttft_seconds{bucket}          request start -> first token
//   swaserve_router_tpot_seconds{bucket}          per output token after it
//   swaserve_router_e2e_seconds{bucket}
//   swaserve_router_prompt_tokens_total, _cached_tokens_total (what the
//   prefill workers reported reusing, never the router's estimate),
//   swaserve_router_generated_tokens_total        (hit rate = cached/prompt)
//   swaserve_router_inflight_requests             gauge
//   swaserve_router_stalled_requests              gauge: in flight without
//                                                 progress for
//                                                 stall_report_after
//   swaserve_router_redis_fallbacks_total         index/load read failed:
//                                                 routed without it
//   swaserve_router_mirror_fallbacks_total        of those, routed on the
//                                                 index mirror's depths
//   swaserve_router_shed_total{reason}            requests refused with 429:
//                                                 inflight | backlog
//   swaserve_router_bucket_fallbacks_total{bucket} prefill attempts sent to
//                                                 a larger bucket's worker
//                                                 (bucket_fallback)
// (Redis latency: swaserve_redis_seconds{op}, from cluster::RedisClient.)
//
// Ownership: borrows the view, directory, tokenizer and chat template (must
// outlive it).
// Thread-safety: thread-safe; Generate may run concurrently.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "lib/base/request_defaults.h"
#include "lib/base/thread_pool.h"
#include "lib/base/timer_queue.h"
#include "lib/cluster/cluster_view.h"
#include "lib/metrics/registry.h"
#include "lib/grammar/grammar_cache.h"
#include "lib/model/chat_format.h"
#include "lib/model/chat_template.h"
#include "lib/model/tokenizer.h"
#include "lib/router/media.h"
#include "lib/router/policy.h"
#include "lib/router/routing_state.h"
#include "lib/router/worker_directory.h"
#include "swaserve/v1/router.pb.h"
#include "swaserve/v1/worker.pb.h"

namespace swaserve::router {

struct RouterOptions {
  // The shared cluster state: `state` when set, else a ClusterViewState
  // over `view` (one of them is required; not owned).
  cluster::ClusterView* view = nullptr;
  RoutingState* state = nullptr;
  // Required; not owned (the services pass a WorkerDirectory).
  WorkerSource* directory = nullptr;
  const model::Tokenizer* tokenizer = nullptr;
  // The chat template of chat requests (not owned; the checkpoint's, see
  // model::ChatTemplate::FromCheckpointDir). nullptr: the built-in Qwen3
  // ChatML template.
  const model::ChatTemplate* chat_template = nullptr;
  // The model's default chat template variables: a JSON object (text) whose
  // keys a request's template kwargs override one by one, e.g.
  // {"enable_thinking": false} for a model that should not think unless
  // asked. Empty (default): none; not an object: Create fails.
  std::string default_template_kwargs;
  // The served model id (GenerateRequest.model must be empty or equal).
  std::string model_name = "swaserve";
  // Unix seconds the model was loaded (ListModels).
  int64_t created_unix_seconds = 0;
  PolicyOptions policy;
  // max_tokens when a request has 0, and the largest accepted.
  uint32_t default_max_tokens = base::kDefaultMaxTokens;
  uint32_t max_max_tokens = 32768;
  // Attempts per leg (first try included). Defaults 4 and 4.
  int max_prefill_attempts = 4;
  int max_decode_attempts = 4;
  // How long a request waits for a worker to (re)appear when there is none
  // to try (every candidate failed this request, is restarting, or Redis
  // restarted and the workers have not re-registered yet); then
  // Unavailable (HTTP 503). Bounded by the request's deadline. Default 10 s.
  absl::Duration worker_wait = absl::Seconds(10);
  // When no prefill worker of a prompt's bucket can take it (every one is
  // gone, failed this request, or has its breaker open), the workers of the
  // nearest larger bucket do: their pools hold longer prompts. The prompt
  // then shares their queue with long prompts, which beats failing or
  // waiting for a restart (a crashed pod's model load can take minutes).
  // Only then: with a worker of its own bucket available it is never used.
  // Default on.
  bool bucket_fallback = true;
  // Deadline of a whole request's worker calls; 0 (default): none. A
  // request then lasts as long as its client waits and its workers live:
  // HTTP/2 keepalive (rpc/channel.h: 30 s + 10 s) drops a dead or hung
  // worker's connection and the request is retried elsewhere, and
  // stall_report_after reports one that makes no progress. A fixed cap was
  // the default once (10 min) and cut off prompts whose own prefill takes
  // longer than that on the hardware at hand (a 304K-token prompt of the
  // demo model on 2 CPU cores: 503 after 600 s of compute) and long
  // generations; no peer engine (vLLM, SGLang) caps requests by default.
  absl::Duration request_timeout = absl::ZeroDuration();
  // How long to wait for the decode worker's first answer (`accepted`; it
  // allocates nothing, so this is short). Default 10 s.
  absl::Duration destination_timeout = absl::Seconds(10);
  // Re-dispatches of one request after its decode worker died or drained
  // mid-stream. Default 3.
  int max_migrations = 3;
  // Requests in flight beyond which new ones get ResourceExhausted (HTTP
  // 429, Retry-After 1 s); 0 means unlimited. Default 4096.
  int max_inflight_requests = 4096;
  // Load shedding before the workers saturate (policy.h
  // ShedRetryAfterSeconds): a NEW request (never a retry or a migration) is
  // answered ResourceExhausted (OVERLOADED, HTTP 429 with Retry-After) when
  // every eligible prefill worker of its bucket owes more than this many
  // seconds of prefill compute (queued uncached tokens over its measured
  // throughput); twice this for requests with a negative priority. 0
  // disables. Default 300 s: a request queued behind more than that is
  // better told at once when to come back than kept waiting.
  double shed_backlog_seconds = 300;
  // Most choices one request may ask for (GenerateRequest.n); more is
  // InvalidArgument. Default 16.
  uint32_t max_choices = 16;
  // Bounds checked before a request's prompt is tokenized (InvalidArgument
  // beyond): request_id bytes (default 256), stop strings (16, each 1 to
  // 1,024 bytes), stop token ids (64).
  size_t max_request_id_bytes = 256;
  size_t max_stop_strings = 16;
  size_t max_stop_string_bytes = 1024;
  size_t max_stop_token_ids = 64;
  // Threads recording dispatches in the prefix index (off the request path).
  int record_threads = 2;
  // Threads that run requests' short blocking steps: the prompt's
  // tokenization, the decision (one Redis round trip), media encoding, the
  // bookkeeping between attempts. A request holds one only during those
  // steps, never while it waits for a worker or streams tokens (those run
  // on gRPC's callbacks), so 10,000 streams need no more. Default 8.
  int control_threads = 8;
  // Threads that prepare requests with multimodal items (URL fetches,
  // encoder calls: up to seconds each), so that a slow encoder or URL never
  // holds up the decisions of text requests on the control threads. A
  // request holds one through its items' encoding, so this bounds the
  // requests one router has at the encoders at once: an encoder batches up
  // to 16 items across requests (--batch.max_items), and with 8 threads one
  // router could never fill a batch. Default 32 (two encoders' batches).
  int media_threads = 32;
  // A request that makes no progress (no decision, no answer from a worker,
  // no token, no room at its client) for this long is logged once, naming
  // what it waits for, and counted in swaserve_router_stalled_requests
  // (evaluated every stall_report_after / 4, at most every 5 s). Zero
  // disables. Default 60 s.
  absl::Duration stall_report_after = absl::Seconds(60);
  // Metrics registry; nullptr: metrics::DefaultRegistry().
  metrics::Registry* registry = nullptr;
  // Multimodal items (media.h): resolved to embeddings by the encoders;
  // nullptr: requests with items are InvalidArgument. Not owned.
  MediaResolver* media = nullptr;
  // The placeholder token id of each modality (model config's
  // image_token_id, video_token_id, audio_token_id).
  MediaTokenIds media_token_ids;
};

// Receives a request's output. Write() hands one response to the client and
// returns false when the client is gone (the request is then cancelled).
// Called from the router's control threads and gRPC callback threads, one
// call at a time per request: it must not block. Back-pressure goes through
// OnReady: the router reads the next tokens from the decode worker only
// once the sink has room, so a slow client slows its own request.
// What the router learned of a request's prompt while preparing it.
struct PromptInfo {
  // Tokens of the prompt (template and media placeholders included).
  uint32_t prompt_tokens = 0;
  // A chat prompt whose generation prompt leaves a reasoning block open
  // (model::OpensReasoning): the output starts inside the reasoning.
  bool opens_reasoning = false;
  // Prompt tokens up to the chat's last cache breakpoint
  // (ChatMessages.cache_breakpoints), kept preferentially; 0: none.
  uint32_t cache_breakpoint_tokens = 0;
};

class GenerateSink {
 public:
  virtual ~GenerateSink() = default;
  // Once, after the request was prepared and before its first Write.
  // Default: ignored.
  virtual void OnPrompt(const PromptInfo& info) {}
  virtual bool Write(const v1::GenerateResponse& response) = 0;
  // Runs `ready` once the sink has room for the next response (may run it
  // before returning; on any thread). At most one pending at a time. The
  // default: room at once.
  virtual void OnReady(std::function<void()> ready) { ready(); }
  // Asks the prefill worker where the request's prefill stands; the
  // callback runs at most once, on any thread, with the worker's answer
  // (nothing when the worker could not say).
  using ProgressProbe =
      std::function<void(std::function<void(const v1::PrefillProgress&)>)>;
  // While a prefill leg runs, the router hands the sink a probe for it (a
  // retry's leg replaces it; a probe of a leg that ended answers nothing).
  // The HTTP API shows the answers in its keep-alive comments. Default:
  // ignored.
  virtual void SetProgressProbe(ProgressProbe probe) {}
};

// Who sent a request, as the service that authenticated it says (never
// read from the request itself).
struct Caller {
  // The prefix-cache domain of the caller's tenant (api::TenantMap::
  // CacheDomainOf): requests of different domains never share cached KV,
  // their page hashes being seeded apart (base::PageHashSeedFor), so no
  // tenant can learn from hits, cached_tokens or timing what another sent.
  // Empty: the anonymous domain (a router without API keys).
  std::string cache_domain;
  // The most urgent GenerateRequest.priority the caller may ask for; a more
  // urgent one is served at this value. INT32_MIN: any.
  int32_t min_priority = INT32_MIN;
  // Called once per request when its prompt is tokenized, with prompt
  // tokens + max_tokens: OK, or the error that refuses the request
  // (ResourceExhausted with ErrorDetail.retry_after_ms: the caller's token
  // rate limit). Null: no limit.
  std::function<absl::Status(int64_t tokens)> admit_tokens;
};

// Called once when a request ended (after its last Write): OK, or its error
// (see Router::Generate).
using GenerateDone = std::function<void(absl::Status)>;

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

  // Starts one request and returns at once; `done` runs exactly once, after
  // the last sink Write, on a router or gRPC thread. `sink` and `cancel`
  // (may be null) are shared with the request until then. No thread is held
  // while the request waits at a worker or streams.
  void Start(const v1::GenerateRequest& request, std::shared_ptr<GenerateSink> sink,
             std::shared_ptr<CancelFlag> cancel, GenerateDone done, Caller caller = {});

  // Runs one request to its end on the caller's thread (Start, then wait):
  // for tests and tools. OK after the last response (with finish_reason and
  // usage) was written; otherwise the error, carrying an ErrorDetail
  // (rpc::GetErrorDetail) when the cause is known:
  //   InvalidArgument   bad prompt or parameters (ERROR_CODE_INVALID_REQUEST)
  //   NotFound          unknown model (ERROR_CODE_UNKNOWN_MODEL)
  //   OutOfRange        prompt beyond the largest bucket (PROMPT_TOO_LONG)
  //   ResourceExhausted too many requests in flight, or every worker of the
  //                     bucket too backlogged (OVERLOADED, with
  //                     ErrorDetail.retry_after_ms)
  //   Unavailable       no healthy worker, or every attempt failed
  //   Cancelled         the sink refused a write or `cancel` fired
  // `sink` and `cancel` must outlive the call.
  absl::Status Generate(const v1::GenerateRequest& request, GenerateSink& sink,
                        CancelFlag* cancel = nullptr, Caller caller = {});

  // Requests started and not yet done.
  int inflight() const { return inflight_.load(); }
  // Waits until no request is in flight or `timeout` passed; true when idle.
  bool WaitIdle(absl::Duration timeout);

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

  // The prompt's token ids as a request would be prepared (template, media
  // placeholders), without running it: for /tokenize. Errors as Generate's
  // request errors; multimodal items are InvalidArgument here.
  absl::StatusOr<std::vector<uint32_t>> Tokenize(const v1::GenerateRequest& request);

  // What the served checkpoint's chat template does with tools and
  // reasoning (model::DetectChatFormat, found once at Create).
  const model::ChatFormat& chat_format() const { return chat_format_; }

  // OK when at least one healthy prefill-capable and one decode-capable
  // worker are registered (the /health of the router).
  absl::Status Health();

  const RouterOptions& options() const { return options_; }

 private:
  struct Metrics;
  struct Request;
  struct Choice;
  // One request's asynchronous run: its attempts, legs, retries and
  // migrations (router_call.cc).
  class Call;
  explicit Router(const RouterOptions& options);

  absl::Status Prepare(const v1::GenerateRequest& in, Request& r);
  // Prepare's checks that need no tokenization (run first).
  absl::Status CheckRequest(const v1::GenerateRequest& in) const;
  // The structured-output part of Prepare (router_constraint.cc): the
  // request's constraint completed into r.sampling and compiled to check it.
  absl::Status PrepareConstraint(const v1::GenerateRequest& in, Request& r);
  // The tokenizer's vocabulary for grammars, made on first use.
  std::shared_ptr<const grammar::TokenVocabulary> ConstraintVocabulary();
  // The multimodal part of Prepare: markers checked, items resolved
  // (MediaResolver), placeholders expanded into r.tokens.
  absl::Status PrepareMedia(const v1::GenerateRequest& in,
                            absl::Span<const model::MarkerCut> cuts, Request& r);
  // MediaResolver::Resolve over the registered encoders, its errors with
  // details (INVALID_REQUEST / NO_WORKERS).
  absl::StatusOr<std::vector<v1::MultimodalItem>> ResolveMedia(
      absl::Span<const v1::MultimodalItem> items, const std::string& request_id,
      bool force_inline);
  // r's items encoded again, inline (a by-reference embedding was gone).
  absl::Status MediaInline(Request& r);
  // `record`: write predicted index entries for the choice (off the path).
  absl::StatusOr<Choice> Decide(Request& r, bool record = true);
  // Decide for r among the prefill workers of its bucket (`larger_bucket`
  // false) or of the nearest larger bucket that has any (true).
  absl::StatusOr<Choice> DecideIn(Request& r, bool record, bool larger_bucket);
  // Decide's parts. The registered workers of this model that may take r:
  // prefill workers of its bucket (or, when none is configured for it, any
  // whose range admits the prompt; with `larger_bucket`, those of the
  // nearest bucket above the prompt instead) and decode workers, minus r's
  // exclusions.
  absl::Status Candidates(
      const Request& r, bool larger_bucket, std::vector<std::shared_ptr<const WorkerEndpoint>>* pre,
      std::vector<std::shared_ptr<const WorkerEndpoint>>* dec) const;
  // The policy's view of each prefill candidate: its prefix credit (one
  // Redis round trip for depths, window-safe depths and every candidate's
  // load, `*loads` in pre's then dec's order) and load.
  std::vector<PrefillCandidate> ScorePrefill(
      Request& r, const std::vector<std::shared_ptr<const WorkerEndpoint>>& pre,
      const std::vector<std::shared_ptr<const WorkerEndpoint>>& dec,
      std::vector<std::optional<v1::WorkerLoad>>* loads);
  // The decode worker for r once its prefill worker is chosen.
  absl::StatusOr<std::shared_ptr<const WorkerEndpoint>> ChooseDecodeFor(
      const Request& r, const std::shared_ptr<const WorkerEndpoint>& prefill,
      const std::vector<std::shared_ptr<const WorkerEndpoint>>& dec,
      absl::Span<const std::optional<v1::WorkerLoad>> dec_loads, uint64_t tie);
  // Every StallScanInterval (timer thread): requests without progress for
  // stall_report_after, logged once each and counted.
  void ScanStalled();
  // stall_report_after / 4 within [50 ms, 5 s].
  absl::Duration StallScanInterval() const {
    return std::clamp(options_.stall_report_after / 4, absl::Milliseconds(50), absl::Seconds(5));
  }
  // Start for one choice (request.n() <= 1).
  void StartOne(const v1::GenerateRequest& request, std::shared_ptr<GenerateSink> sink,
                std::shared_ptr<CancelFlag> cancel, GenerateDone done, Caller caller);
  // Runs `fn` on a control thread / a media thread.
  void OnControl(std::function<void()> fn);
  void OnMedia(std::function<void()> fn);

  // The chat prompt of `in` into r.tokens (and r.opens_reasoning).
  absl::Status PrepareChat(const v1::GenerateRequest& in, absl::Span<const std::string> markers,
                           std::vector<model::MarkerCut>* cuts, Request& r);

  const RouterOptions options_;
  // The chat template when options_.chat_template is null.
  std::unique_ptr<model::ChatTemplate> builtin_template_;
  model::ChatFormat chat_format_;
  absl::Mutex vocab_mu_;
  std::shared_ptr<const grammar::TokenVocabulary> vocab_ ABSL_GUARDED_BY(vocab_mu_);
  grammar::GrammarCache grammar_cache_;
  // options_.default_template_kwargs, parsed.
  nlohmann::ordered_json default_kwargs_ = nlohmann::ordered_json::object();
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<base::ThreadPool> record_pool_;
  // ~Router stops the control threads first (their tasks may set timers),
  // then the timers.
  std::unique_ptr<base::ThreadPool> control_;
  std::unique_ptr<base::ThreadPool> media_;
  std::unique_ptr<base::TimerQueue> timers_;  // destination timeouts, worker waits
  std::unique_ptr<RoutingState> own_state_;   // over options.view
  RoutingState* state_ = nullptr;
  std::atomic<int> inflight_{0};
  absl::Mutex idle_mu_;  // WaitIdle's wake-ups
  // Requests in flight, for ScanStalled.
  absl::Mutex live_mu_;
  absl::flat_hash_map<Call*, std::weak_ptr<Call>> live_ ABSL_GUARDED_BY(live_mu_);
  std::atomic<uint64_t> next_id_{0};
  const uint64_t id_salt_;
};

}  // namespace swaserve::router
