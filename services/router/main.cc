// swaserve-router: a stateless router replica (docs/architecture.md#request-path step 1, #redis-state):
// gRPC swaserve.v1.Router and the OpenAI-compatible HTTP API in front of the
// workers registered in Redis.
//
//   swaserve-router --model=DIR --redis=127.0.0.1:6379 --listen=0.0.0.0:50051
//       --http.port=8000
//
// Replicas share Redis and nothing else; start as many as needed behind a
// load balancer. Clients need only the router's ports; worker ports are
// internal. --help lists every option.
#include <unistd.h>

#include <sys/resource.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "lib/base/request_defaults.h"
#include "lib/api/api_keys.h"
#include "lib/api/tenants.h"
#include "lib/router/caller_policy.h"
#include "lib/api/openai.h"
#include "lib/base/config.h"
#include "lib/base/logging.h"
#include "lib/base/serving.h"
#include "lib/base/status.h"
#include "lib/base/port_file.h"
#include "lib/cluster/cluster_view.h"
#include "lib/cluster/redis_client.h"
#include "lib/metrics/process.h"
#include "lib/metrics/registry.h"
#include "lib/model/chat_template.h"
#include "lib/model/config.h"
#include "lib/model/tokenizer.h"
#include "lib/router/router.h"
#include "lib/router/worker_directory.h"
#include "lib/rpc/channel.h"
#include "lib/rpc/grpc_server.h"
#include "lib/rpc/termination_signal.h"
#include "lib/rpc/tls.h"
#include "services/router/grpc_service.h"
#include "services/router/http_service.h"

namespace swaserve {
namespace {

struct RouterConfig {
  std::string model;
  std::string model_name;
  std::string redis = "127.0.0.1:6379";
  std::string cluster = "default";
  std::string redis_password_file;
  std::string redis_username;
  int64_t redis_pool = 16;
  bool redis_coalesce = true;
  int64_t redis_in_flight = 2;
  bool index_mirror = true;
  std::string listen = "0.0.0.0:50051";
  std::string http_host = "0.0.0.0";
  std::string tls_cert;
  std::string tls_key;
  absl::Duration tls_refresh = absl::Seconds(60);
  int64_t http_port = 8000;
  int64_t http_threads = 2;
  absl::Duration http_stream_keepalive = router_service::HttpServiceOptions{}.stream_keepalive;
  absl::Duration http_nonstream_keepalive =
      router_service::HttpServiceOptions{}.nonstream_keepalive;
  std::string port_file;
  std::string log_level = "info";
  std::string bucket_bounds = "65536,262144,1048576";
  double cache_credit = router::PolicyOptions{}.cache_credit;
  double lower_tier_credit = router::PolicyOptions{}.lower_tier_credit;
  int64_t hotspot_abs_tokens = router::PolicyOptions{}.hotspot_abs_tokens;
  double hotspot_rel = router::PolicyOptions{}.hotspot_rel;
  int64_t window_scan_pages = router::PolicyOptions{}.window_scan_pages;
  int64_t default_max_tokens = base::kDefaultMaxTokens;
  std::string chat_template_kwargs;
  int64_t max_max_tokens = 32768;
  int64_t max_inflight = 4096;
  int64_t max_choices = 16;
  int64_t control_threads = 8;
  int64_t media_threads = router::RouterOptions{}.media_threads;
  double shed_backlog_seconds = router::RouterOptions{}.shed_backlog_seconds;
  int64_t max_body_bytes = static_cast<int64_t>(api::ParseLimits{}.max_body_bytes);
  int64_t max_prefill_attempts = router::RouterOptions{}.max_prefill_attempts;
  int64_t max_decode_attempts = router::RouterOptions{}.max_decode_attempts;
  absl::Duration request_timeout = router::RouterOptions{}.request_timeout;
  absl::Duration stall_report_after = absl::Seconds(60);
  absl::Duration destination_timeout = router::RouterOptions{}.destination_timeout;
  int64_t max_migrations = router::RouterOptions{}.max_migrations;
  absl::Duration worker_wait = router::RouterOptions{}.worker_wait;
  bool bucket_fallback = router::RouterOptions{}.bucket_fallback;
  absl::Duration refresh_interval = absl::Milliseconds(500);
  absl::Duration worker_keepalive = rpc::ChannelOptions{}.keepalive_time;
  absl::Duration worker_keepalive_timeout = rpc::ChannelOptions{}.keepalive_timeout;
  int64_t breaker_failures = 3;
  absl::Duration breaker_open = absl::Seconds(10);
  std::string api_keys;
  std::string tenants;
  double tenant_requests_per_minute = 0;
  double tenant_tokens_per_minute = 0;
  int64_t tenant_min_priority = 0;
  int64_t api_key_concurrency = 0;
  absl::Duration drain = absl::Seconds(30);
  // Multimodal items (lib/router/media.h).
  bool media_fetch = true;
  int64_t media_fetch_max_bytes = api::MediaFetcherOptions{}.max_bytes;
  absl::Duration media_fetch_timeout = api::MediaFetcherOptions{}.timeout;
  bool media_fetch_allow_private = false;
  bool media_fetch_allow_http = false;
  std::string media_fetch_allowed_domains;  // comma-separated; empty: any
  int64_t media_max_items = router::MediaOptions{}.max_items;
  int64_t media_encoder_attempts = router::MediaOptions{}.encoder_attempts;
  absl::Duration media_encode_timeout = router::MediaOptions{}.encode_timeout;
  int64_t media_inline_max_bytes = static_cast<int64_t>(router::MediaOptions{}.inline_max_bytes);
};


void AddRouterFlags(base::Config* config, RouterConfig* c) {
  config->Add("model", &c->model, "checkpoint directory (tokenizer.json, config.json); required")
      .Add("model_name", &c->model_name, "model id clients use (default: the directory name)")
      .Add("redis", &c->redis, "Redis host:port (worker registry, loads, prefix index)")
      .Add("redis_password_file", &c->redis_password_file,
           "file holding the Redis password (AUTH on every connection; re-read on reconnect; "
           "empty: none, or the one in a redis:// address)")
      .Add("redis_username", &c->redis_username,
           "Redis ACL user for AUTH (empty: the default user)")
      .Add("redis_pool", &c->redis_pool, "Redis connections (concurrent decisions)")
      .Add("redis_coalesce", &c->redis_coalesce,
           "group commit: calls that queue while redis_in_flight pipelines run go out "
           "together as one pipeline (less Redis CPU per decision under load)")
      .Add("redis_in_flight", &c->redis_in_flight,
           "with redis_coalesce: pipelines in flight at a time (<= redis_pool)")
      .Add("index_mirror", &c->index_mirror,
           "keep an in-memory copy of the prefix index fed by the workers' KV event streams, "
           "so a decision asks Redis only for predictions and loads (about a third of the "
           "Redis CPU per decision; ~40 bytes of router memory per indexed page; on a Redis "
           "Cluster it polls the streams, one XREAD each, every 2-50 ms)")
      .Add("cluster", &c->cluster, "cluster name (Redis key prefix)")
      .Add("listen", &c->listen, "gRPC listen address host:port (port 0: any free port)")
      .Add("http.host", &c->http_host, "HTTP (OpenAI API, /health, /metrics) bind host")
      .Add("http.port", &c->http_port, "HTTP port (0: any free port)")
      .Add("tls.cert", &c->tls_cert,
           "PEM certificate chain: TLS on the gRPC and HTTP listeners (empty: plaintext)")
      .Add("tls.key", &c->tls_key, "PEM private key of --tls.cert")
      .Add("tls.refresh", &c->tls_refresh,
           "how often the TLS files are checked for a new certificate")
      .Add("http.threads", &c->http_threads,
           "HTTP event loops (threads); each serves any number of connections and streams")
      .Add("http.max_body_bytes", &c->max_body_bytes, "largest request body (413 beyond)")
      .Add("http.stream_keepalive", &c->http_stream_keepalive,
           "a streamed request waiting this long for its first token starts its stream and "
           "sends an SSE comment this often, so that clients' timeouts do not cut a long "
           "prefill (0: off)")
      .Add("http.nonstream_keepalive", &c->http_nonstream_keepalive,
           "a non-streamed request without its answer after this long gets its 200 and a "
           "whitespace byte this often before its JSON body (valid JSON), so that clients' "
           "timeouts do not cut a long prefill; a later error travels in the body (0: off)")
      .Add("port_file", &c->port_file, "write the bound ports here as JSON once serving")
      .Add("log_level", &c->log_level, "trace, debug, info, warn, error")
      .Add("policy.bucket_bounds", &c->bucket_bounds,
           "upper bounds of the prompt-length buckets, comma-separated tokens")
      .Add("policy.cache_credit", &c->cache_credit, "weight of a cached token against queued work")
      .Add("policy.lower_tier_credit", &c->lower_tier_credit,
           "weight of a cached token in a worker's L2 (host) tier relative to one in L1")
      .Add("policy.hotspot_abs_tokens", &c->hotspot_abs_tokens,
           "hotspot guard: absolute load margin (tokens)")
      .Add("policy.hotspot_rel", &c->hotspot_rel, "hotspot guard: relative load margin")
      .Add("policy.window_scan_pages", &c->window_scan_pages,
           "for prefill workers that do not restore windows: pages below a match's depth the "
           "index searches for its window-safe depth")
      .Add("default_max_tokens", &c->default_max_tokens, "max_tokens when a request gives none")
      .Add("chat_template_kwargs", &c->chat_template_kwargs,
           "the model's default chat template variables, a JSON object (e.g. "
           "{\"enable_thinking\": false}); a request's chat_template_kwargs and "
           "reasoning_effort override them key by key")
      .Add("max_max_tokens", &c->max_max_tokens, "largest max_tokens accepted")
      .Add("max_inflight", &c->max_inflight, "requests in flight before 429 (0: unlimited)")
      .Add("max_choices", &c->max_choices, "most choices (n) per request")
      .Add("control_threads", &c->control_threads,
           "threads for requests' short blocking steps (tokenization, the Redis decision, "
           "the bookkeeping between attempts); a streaming or queued request holds none")
      .Add("media_threads", &c->media_threads,
           "threads that fetch and encode multimodal items; a request holds one through its "
           "items' encoding, so this bounds the requests at the encoders at once (fill the "
           "encoders' batches: --batch.max_items)")
      .Add("shed_backlog_seconds", &c->shed_backlog_seconds,
           "429 with Retry-After for a new request when every prefill worker of its bucket "
           "owes more than this many seconds of prefill (0: never)")
      .Add("retry.prefill_attempts", &c->max_prefill_attempts, "attempts of a prefill leg")
      .Add("retry.decode_attempts", &c->max_decode_attempts,
           "attempts of a decode leg (before the first token)")
      .Add("stall_report_after", &c->stall_report_after,
           "log a request (and count it in swaserve_router_stalled_requests) once it made no "
           "progress for this long (0: never)")
      .Add("request_timeout", &c->request_timeout,
           "deadline of a request's worker calls (its queue wait at a prefill worker included); "
           "0: none (a request lasts while its client waits and its workers live)")
      .Add("destination_timeout", &c->destination_timeout,
           "how long the decode worker may take to accept a request (it allocates nothing then)")
      .Add("worker_wait", &c->worker_wait,
           "how long a request waits for a worker to (re)appear when none is left to try")
      .Add("bucket_fallback", &c->bucket_fallback,
           "when no prefill worker of a prompt's length bucket can take it (all gone, failed "
           "it, or breakers open), send it to the nearest larger bucket's workers instead of "
           "waiting (swaserve_router_bucket_fallbacks_total)")
      .Add("max_migrations", &c->max_migrations,
           "re-dispatches of a request whose decode worker died or drained mid-stream")
      .Add("refresh_interval", &c->refresh_interval, "how often the worker registry is re-read")
      .Add("worker_keepalive", &c->worker_keepalive,
           "HTTP/2 ping interval toward workers (>= 10s, what workers accept): a silent worker "
           "under a waiting call is dropped after this plus --worker_keepalive_timeout")
      .Add("worker_keepalive_timeout", &c->worker_keepalive_timeout,
           "how long a ping toward a worker may go unanswered")
      .Add("breaker.failures", &c->breaker_failures, "consecutive failures that open a breaker")
      .Add("breaker.open_for", &c->breaker_open, "how long an open breaker skips a worker")
      .Add("api_keys", &c->api_keys,
           "file or directory (Kubernetes secret) of bearer API keys, checked on HTTP and gRPC; "
           "empty: no auth")
      .Add("tenants", &c->tenants,
           "file of 'tenant NAME: KEYS...' and 'share NAME: TENANTS...' lines: which keys share "
           "a prefix cache (lib/api/tenants.h); empty: every key a tenant of its own")
      .Add("tenant.requests_per_minute", &c->tenant_requests_per_minute,
           "requests per minute of a tenant the tenants file does not limit (0: unlimited)")
      .Add("tenant.tokens_per_minute", &c->tenant_tokens_per_minute,
           "prompt + max_tokens per minute of such a tenant (0: unlimited)")
      .Add("tenant.min_priority", &c->tenant_min_priority,
           "the most urgent priority a keyed caller may ask for, unless its tenant's line says "
           "otherwise (more urgent asks are served at this value)")
      .Add("api_key_concurrency", &c->api_key_concurrency,
           "requests in flight per API key (0: unlimited)")
      .Add("drain", &c->drain, "how long in-flight requests may finish on SIGTERM")
      .Add("media.fetch", &c->media_fetch,
           "fetch http(s) image/video URLs of requests (data: URLs always work)")
      .Add("media.fetch_max_bytes", &c->media_fetch_max_bytes, "largest fetched or data: URL body")
      .Add("media.fetch_timeout", &c->media_fetch_timeout, "deadline of one fetch (redirects too)")
      .Add("media.fetch_allow_private", &c->media_fetch_allow_private,
           "allow URLs that resolve to loopback/private/link-local addresses (tests only)")
      .Add("media.fetch_allow_http", &c->media_fetch_allow_http,
           "fetch plain http:// URLs too (default: https only)")
      .Add("media.fetch_allowed_domains", &c->media_fetch_allowed_domains,
           "comma-separated hosts URLs may name, exact or *.suffix (empty: any public host)")
      .Add("media.max_items", &c->media_max_items, "multimodal items per request")
      .Add("media.encoder_attempts", &c->media_encoder_attempts,
           "encoders tried per item (its hash-ring owner, then successors)")
      .Add("media.encode_timeout", &c->media_encode_timeout, "deadline of one Encode call")
      .Add("media.inline_max_bytes", &c->media_inline_max_bytes,
           "embeddings larger than this go to prefill by reference (fetched from the encoder); "
           "0: always inline");
}

// Checks and derives what the flags cannot: bucket bounds, the model name,
// the Redis address. InvalidArgument naming the flag (exit 2).
absl::Status FinishRouterConfig(RouterConfig* c, router::PolicyOptions* policy,
                                cluster::RedisOptions* redis) {
  if (c->model.empty()) return absl::InvalidArgumentError("--model is required");
  if (c->worker_keepalive < absl::Seconds(10) ||
      c->worker_keepalive_timeout <= absl::ZeroDuration()) {
    // Workers answer pings more frequent than 10 s with GOAWAY (too many pings).
    return absl::InvalidArgumentError(
        "--worker_keepalive must be at least 10s and --worker_keepalive_timeout positive");
  }
  policy->bucket_bounds.clear();
  for (absl::string_view part : absl::StrSplit(c->bucket_bounds, ',', absl::SkipWhitespace())) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(part, &v) || v <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--policy.bucket_bounds: not a positive integer: '", part, "'"));
    }
    policy->bucket_bounds.push_back(v);
  }
  policy->cache_credit = c->cache_credit;
  policy->lower_tier_credit = c->lower_tier_credit;
  policy->hotspot_abs_tokens = c->hotspot_abs_tokens;
  policy->hotspot_rel = c->hotspot_rel;
  policy->window_scan_pages = c->window_scan_pages;
  if (c->model_name.empty()) {
    c->model_name = std::filesystem::path(c->model).lexically_normal().filename().string();
    if (c->model_name.empty()) {
      c->model_name = std::filesystem::path(c->model).parent_path().filename().string();
    }
  }
  RETURN_IF_ERROR(cluster::ParseRedisAddress(c->redis, redis));
  redis->password_file = c->redis_password_file;
  if (!c->redis_username.empty()) redis->username = c->redis_username;
  redis->pool_size = static_cast<int>(std::max<int64_t>(1, c->redis_pool));
  redis->coalesce_calls = c->redis_coalesce;
  redis->coalesce_in_flight = static_cast<int>(c->redis_in_flight);
  return absl::OkStatus();
}

// Everything a running router owns, in creation order (destroyed in reverse).
struct RouterProcess {
  const RouterConfig& c;
  metrics::Registry& registry = metrics::DefaultRegistry();
  std::unique_ptr<model::Tokenizer> tokenizer;
  std::unique_ptr<model::ChatTemplate> chat_template;
  std::unique_ptr<cluster::RedisClient> redis;
  std::unique_ptr<cluster::ClusterView> view;
  // --index_mirror: its own connection (it blocks on XREAD) and the copy.
  std::unique_ptr<cluster::RedisClient> mirror_redis;
  std::unique_ptr<cluster::IndexMirror> mirror;
  std::unique_ptr<router::WorkerDirectory> directory;
  std::unique_ptr<api::MediaFetcher> fetcher;
  std::unique_ptr<router::MediaResolver> media;
  std::unique_ptr<router::Router> router;
  std::unique_ptr<api::ApiKeyStore> keys;
  std::unique_ptr<api::ConcurrencyLimiter> limiter;
  std::unique_ptr<api::TenantMap> tenants;
  std::unique_ptr<router::CallerPolicy> callers;
  std::unique_ptr<router_service::RouterGrpcService> grpc_service;
  std::unique_ptr<rpc::GrpcServer> server;
  std::unique_ptr<router_service::HttpService> http;

  absl::Status BuildRouter(const router::PolicyOptions& policy, cluster::RedisOptions ro);
  absl::Status StartIndexMirror(cluster::RedisOptions ro);
  absl::Status LoadApiKeys();
  absl::Status StartServers();
};

absl::Status RouterProcess::BuildRouter(const router::PolicyOptions& policy,
                                        cluster::RedisOptions ro) {
  ASSIGN_OR_RETURN(tokenizer, model::Tokenizer::Load(c.model + "/tokenizer.json"));
  ASSIGN_OR_RETURN(chat_template, model::ChatTemplate::FromCheckpointDir(c.model));
  SWA_LOG(info, "chat template: {}", chat_template->origin());
  ro.metrics = &registry;
  ASSIGN_OR_RETURN(redis, cluster::RedisClient::Create(ro));
  RETURN_IF_ERROR(redis->CheckCredentials());
  ASSIGN_OR_RETURN(view, cluster::ClusterView::Create({.redis = redis.get(), .cluster = c.cluster}));
  if (c.index_mirror) RETURN_IF_ERROR(StartIndexMirror(ro));
  router::WorkerDirectoryOptions wdo;
  wdo.view = view.get();
  wdo.refresh_interval = c.refresh_interval;
  wdo.breaker.failures_to_open = static_cast<int>(c.breaker_failures);
  wdo.breaker.open_for = c.breaker_open;
  wdo.channel.keepalive_time = c.worker_keepalive;
  wdo.channel.keepalive_timeout = c.worker_keepalive_timeout;
  ASSIGN_OR_RETURN(directory, router::WorkerDirectory::Create(wdo));
  RETURN_IF_ERROR(metrics::RegisterProcessMetrics(&registry));
  RETURN_IF_ERROR(registry.AddCallbackGauge(
      "swaserve_router_open_breakers", "Workers whose circuit breaker is open.",
      [d = directory.get()] { return static_cast<double>(d->OpenBreakers()); }));
  router::RouterOptions opt;
  opt.view = view.get();
  opt.directory = directory.get();
  opt.tokenizer = tokenizer.get();
  opt.chat_template = chat_template.get();
  opt.model_name = c.model_name;
  opt.created_unix_seconds = absl::ToUnixSeconds(absl::Now());
  opt.policy = policy;
  opt.default_max_tokens = static_cast<uint32_t>(c.default_max_tokens);
  opt.default_template_kwargs = c.chat_template_kwargs;
  opt.max_max_tokens = static_cast<uint32_t>(c.max_max_tokens);
  opt.max_inflight_requests = static_cast<int>(c.max_inflight);
  if (c.max_choices < 1) return absl::InvalidArgumentError("--max_choices must be at least 1");
  opt.max_choices = static_cast<uint32_t>(c.max_choices);
  opt.control_threads = static_cast<int>(std::max<int64_t>(1, c.control_threads));
  opt.media_threads = static_cast<int>(std::max<int64_t>(1, c.media_threads));
  opt.shed_backlog_seconds = c.shed_backlog_seconds;
  opt.max_prefill_attempts = static_cast<int>(c.max_prefill_attempts);
  opt.max_decode_attempts = static_cast<int>(c.max_decode_attempts);
  opt.request_timeout = c.request_timeout;
  opt.stall_report_after = c.stall_report_after;
  opt.destination_timeout = c.destination_timeout;
  opt.max_migrations = static_cast<int>(c.max_migrations);
  opt.worker_wait = c.worker_wait;
  opt.bucket_fallback = c.bucket_fallback;
  opt.registry = &registry;
  if (c.media_fetch) {
    api::MediaFetcherOptions fo;
    fo.max_bytes = c.media_fetch_max_bytes;
    fo.timeout = c.media_fetch_timeout;
    fo.allow_private_addresses = c.media_fetch_allow_private;
    fo.allow_http = c.media_fetch_allow_http;
    fo.allowed_domains = absl::StrSplit(c.media_fetch_allowed_domains, ',', absl::SkipWhitespace());
    fetcher = std::make_unique<api::MediaFetcher>(fo);
  }
  router::MediaOptions mo;
  mo.fetcher = fetcher.get();
  mo.max_data_url_bytes = c.media_fetch_max_bytes;
  mo.max_items = static_cast<int>(c.media_max_items);
  mo.encoder_attempts = static_cast<int>(c.media_encoder_attempts);
  mo.encode_timeout = c.media_encode_timeout;
  mo.inline_max_bytes = static_cast<uint64_t>(std::max<int64_t>(0, c.media_inline_max_bytes));
  mo.registry = &registry;
  ASSIGN_OR_RETURN(mo.modalities, router::ModalitiesFor(c.model));
  ASSIGN_OR_RETURN(media, router::MediaResolver::Create(mo));
  opt.media = media.get();
  ASSIGN_OR_RETURN(opt.media_token_ids, router::MediaTokenIdsFor(c.model, *tokenizer));
  SWA_LOG(info, "multimodal placeholder ids: image {}, video {}, audio {}", opt.media_token_ids.image,
          opt.media_token_ids.video, opt.media_token_ids.audio);
  ASSIGN_OR_RETURN(router, router::Router::Create(opt));
  return absl::OkStatus();
}

absl::Status RouterProcess::StartIndexMirror(cluster::RedisOptions ro) {
  cluster::IndexMirrorOptions mo;
  mo.metrics = &registry;
  ro.pool_size = 1;
  ro.coalesce_calls = false;
  ro.command_timeout = std::max(ro.command_timeout, mo.poll + absl::Seconds(2));
  ASSIGN_OR_RETURN(mirror_redis, cluster::RedisClient::Create(ro));
  // Every registered worker (decode workers have empty streams: cheap).
  ASSIGN_OR_RETURN(mirror, cluster::IndexMirror::Start(
                               mirror_redis.get(), view->keys(),
                               [v = view.get()]() -> absl::StatusOr<std::vector<std::string>> {
                                 ASSIGN_OR_RETURN(auto workers, v->ListWorkers());
                                 std::vector<std::string> ids;
                                 for (const cluster::WorkerInfo& w : workers) ids.push_back(w.id);
                                 return ids;
                               },
                               mo));
  view->SetIndexMirror(mirror.get());
  SWA_LOG(info, "prefix index: decisions use the router's index mirror (KV event streams)");
  return absl::OkStatus();
}

absl::Status RouterProcess::LoadApiKeys() {
  if (c.api_keys.empty()) {
    if (!c.tenants.empty()) return absl::InvalidArgumentError("--tenants needs --api_keys");
    return absl::OkStatus();
  }
  if (!c.tenants.empty()) {
    ASSIGN_OR_RETURN(api::TenantMap t, api::TenantMap::Load(c.tenants));
    tenants = std::make_unique<api::TenantMap>(std::move(t));
    SWA_LOG(info, "tenants: {} from {}", tenants->tenants(), c.tenants);
  }
  callers = std::make_unique<router::CallerPolicy>(router::CallerPolicyOptions{
      .tenants = tenants.get(),
      .default_limit = {.requests_per_minute = c.tenant_requests_per_minute,
                        .tokens_per_minute = c.tenant_tokens_per_minute},
      .default_min_priority = static_cast<int32_t>(c.tenant_min_priority)});
  ASSIGN_OR_RETURN(keys, api::ApiKeyStore::Create({.path = c.api_keys}));
  api::ConcurrencyLimiterOptions lo;
  lo.per_key_limit = static_cast<uint32_t>(std::max<int64_t>(0, c.api_key_concurrency));
  limiter = std::make_unique<api::ConcurrencyLimiter>(lo);
  SWA_LOG(info, "API keys required ({} loaded from {})", keys->KeyNames().size(), c.api_keys);
  return absl::OkStatus();
}

absl::Status RouterProcess::StartServers() {
  grpc_service =
      std::make_unique<router_service::RouterGrpcService>(router.get(), keys.get(), limiter.get(),
                                                          callers.get());
  if (c.tls_cert.empty() != c.tls_key.empty()) {
    return absl::InvalidArgumentError("--tls.cert and --tls.key go together");
  }
  const rpc::TlsFiles tls{.cert_file = c.tls_cert, .key_file = c.tls_key, .refresh = c.tls_refresh};
  rpc::GrpcServerOptions go;
  ASSIGN_OR_RETURN(go.credentials, rpc::ServerCredentialsFor(tls));
  go.listen_address = c.listen;
  go.services = {grpc_service.get()};
  go.health_service_names = {"swaserve.v1.Router"};
  go.drain_deadline = c.drain;
  go.name = "router";
  ASSIGN_OR_RETURN(server, rpc::GrpcServer::Create(go));
  router_service::HttpServiceOptions ho;
  ho.host = c.http_host;
  ho.port = static_cast<int>(c.http_port);
  ho.tls = tls;
  ho.threads = static_cast<int>(c.http_threads);
  ho.stream_keepalive = c.http_stream_keepalive;
  ho.nonstream_keepalive = c.http_nonstream_keepalive;
  ho.limits.max_body_bytes = static_cast<size_t>(c.max_body_bytes);
  ho.limits.max_tokens_limit = static_cast<uint32_t>(c.max_max_tokens);
  ho.limits.default_max_tokens = static_cast<uint32_t>(c.default_max_tokens);
  ho.keys = keys.get();
  ho.limiter = limiter.get();
  ho.callers = callers.get();
  ho.router = router.get();
  ho.tokenizer = tokenizer.get();
  ho.registry = &registry;
  ASSIGN_OR_RETURN(http, router_service::HttpService::Create(ho));
  SWA_LOG(info, "router serving model {}: gRPC {}, HTTP {}:{} (OpenAI API, /health, /metrics)",
          c.model_name, server->address(), c.http_host, http->port());
  if (c.port_file.empty()) return absl::OkStatus();
  return base::WritePortFile(c.port_file, {{"grpc_port", server->port()},
                                           {"http_port", http->port()},
                                           {"metrics_port", http->port()}});
}

// Every client connection holds a descriptor: the soft limit (often 1,024)
// would refuse connections long before memory runs out, so the router takes
// the hard limit.
void RaiseDescriptorLimit() {
  rlimit l{};
  if (getrlimit(RLIMIT_NOFILE, &l) != 0 || l.rlim_cur >= l.rlim_max) return;
  const rlim_t before = l.rlim_cur;
  l.rlim_cur = l.rlim_max;
  if (setrlimit(RLIMIT_NOFILE, &l) == 0) {
    SWA_LOG(info, "open files limit raised from {} to {}", before, l.rlim_cur);
  }
}

int Run(int argc, char** argv) {
  auto signal = rpc::TerminationSignal::Create();  // first: before any thread
  if (!signal.ok()) {
    std::fprintf(stderr, "swaserve-router: %s\n", signal.status().ToString().c_str());
    return 1;
  }
  RaiseDescriptorLimit();
  RouterConfig c;
  base::Config config("swaserve-router",
                      "A stateless swaserve router: gRPC swaserve.v1.Router and OpenAI HTTP in "
                      "front of the workers registered in Redis.");
  AddRouterFlags(&config, &c);
  base::ParseConfigOrExit(config, argc, argv);
  auto bad = [](const std::string& msg) {
    std::fprintf(stderr, "swaserve-router: %s (see --help)\n", msg.c_str());
    return 2;
  };
  router::PolicyOptions policy;
  cluster::RedisOptions ro;
  if (absl::Status s = FinishRouterConfig(&c, &policy, &ro); !s.ok()) {
    return bad(std::string(s.message()));
  }
  base::TuneForServing();
  if (absl::Status s = base::InitLogging({c.log_level, "router"}); !s.ok()) return bad(s.ToString());
  RouterProcess p{c};
  absl::Status st = p.BuildRouter(policy, ro);
  if (st.ok()) st = p.LoadApiKeys();
  if (st.ok()) st = p.StartServers();
  if (!st.ok()) {
    SWA_LOG(err, "start-up failed: {}", st.ToString());
    return 1;
  }
  const int signo = rpc::ServeUntilTerminated(*p.server, **signal);
  SWA_LOG(info, "router stopping (signal {})", signo);
  p.http->Stop();
  if (!p.router->WaitIdle(absl::Seconds(5))) {
    SWA_LOG(warn, "{} requests still running at exit", p.router->inflight());
  }
  return signo >= 0 ? 0 : 1;
}

}  // namespace
}  // namespace swaserve

int main(int argc, char** argv) { return swaserve::Run(argc, argv); }
