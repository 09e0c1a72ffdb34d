#include "services/router/http_service.h"

#include <event2/buffer.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <event2/thread.h>
#include <netinet/in.h>
#include <openssl/ssl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <random>
#include <utility>

#include "absl/base/call_once.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "lib/api/anthropic.h"
#include "lib/base/logging.h"
#include "lib/base/status.h"
#include "lib/metrics/exposition.h"
#include "services/router/http_call.h"

namespace swaserve::router_service {
namespace {

constexpr char kJson[] = "application/json";

std::string Header(evhttp_request* req, const char* name) {
  const char* v = evhttp_find_header(evhttp_request_get_input_headers(req), name);
  return v != nullptr ? v : "";
}

std::string Body(evhttp_request* req) {
  evbuffer* b = evhttp_request_get_input_buffer(req);
  std::string s(evbuffer_get_length(b), '\0');
  if (!s.empty()) evbuffer_copyout(b, s.data(), s.size());
  return s;
}

void Send(evhttp_request* req, int status, const char* content_type, const std::string& body) {
  evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", content_type);
  evbuffer* b = evbuffer_new();
  evbuffer_add(b, body.data(), body.size());
  evhttp_send_reply(req, status, nullptr, b);
  evbuffer_free(b);
}

// One event loop: its base, its evhttp (sharing the listening socket with
// the other loops') and its thread.
struct Loop {
  event_base* base = nullptr;
  evhttp* http = nullptr;
  std::thread thread;
};

}  // namespace

namespace {

// evhttp's bufferevent for an accepted connection when TLS is on: an
// OpenSSL one in the accepting state over the current certificate. There is
// no plaintext fallback: without an SSL object (out of memory) the process
// stops rather than serve a TLS port in the clear.
bufferevent* NewTlsBufferevent(event_base* base, void* arg) {
  SSL* ssl = static_cast<rpc::HttpTlsContext*>(arg)->NewSsl();
  if (ssl == nullptr) {
    SWA_LOG(critical, "http: SSL_new failed for an accepted connection");
    std::abort();
  }
  return bufferevent_openssl_socket_new(base, -1, ssl, BUFFEREVENT_SSL_ACCEPTING,
                                        BEV_OPT_CLOSE_ON_FREE);
}

}  // namespace

struct HttpService::Impl final : public HttpReplies {
  HttpServiceOptions o;
  metrics::Registry* registry = nullptr;
  metrics::CounterFamily* requests = nullptr;
  metrics::CounterFamily* tool_calls = nullptr;
  metrics::CounterFamily* reasoning_tokens = nullptr;
  std::mt19937_64 rng{std::random_device{}()};
  absl::Mutex rng_mu;
  std::vector<std::unique_ptr<Loop>> loops;
  // TLS of every connection (options.tls); null: plaintext.
  std::unique_ptr<rpc::HttpTlsContext> tls;
  bool stopped = false;

  // What a loop's request callback gets.
  struct LoopArg {
    Impl* impl;
    Loop* loop;
  };
  std::vector<std::unique_ptr<LoopArg>> args;

  std::string NewId() {
    absl::MutexLock lock(&rng_mu);
    return absl::StrFormat("%016x", rng());
  }

  void Count(const std::string& path, int status) override {
    requests->WithLabels({path, absl::StrCat(status)}).Increment();
  }
  void CountChatOutput(int calls, int rejected, bool wanted_missing, uint32_t reasoning) override {
    if (calls > 0) tool_calls->WithLabels({"parsed"}).Increment(calls);
    if (rejected > 0) tool_calls->WithLabels({"returned_as_text"}).Increment(rejected);
    if (wanted_missing) tool_calls->WithLabels({"required_but_none"}).Increment();
    if (reasoning > 0) reasoning_tokens->WithLabels({}).Increment(reasoning);
  }
  void Reply(evhttp_request* req, const std::string& path, int status, std::string body) override {
    Send(req, status, kJson, body);
    Count(path, status);
  }
  void ReplyError(evhttp_request* req, const std::string& path, const api::ApiError& e) override {
    if (e.retry_after_ms > 0) {
      evkeyvalq* h = evhttp_request_get_output_headers(req);
      evhttp_add_header(h, "Retry-After", absl::StrCat((e.retry_after_ms + 999) / 1000).c_str());
      evhttp_add_header(h, "retry-after-ms", absl::StrCat(e.retry_after_ms).c_str());
    }
    if (AnthropicClient(req, path)) {
      return Reply(req, path, api::AnthropicStatus(e), api::AnthropicErrorJson(e));
    }
    Reply(req, path, e.http_status, api::ErrorJson(e));
  }
  // Errors and the model list in Anthropic's shape: the Messages API's
  // paths, and any request that names an anthropic-version.
  static bool AnthropicClient(evhttp_request* req, const std::string& path) {
    return path.rfind("/v1/messages", 0) == 0 || !Header(req, "anthropic-version").empty();
  }

  std::function<std::string(uint32_t)> TokenText() const {
    const model::Tokenizer* t = o.tokenizer;
    return [t](uint32_t id) { return t->Decode({&id, 1}); };
  }

  static void OnRequest(evhttp_request* req, void* arg);
  void Handle(Loop& loop, evhttp_request* req);
  // The three generate endpoints.
  enum class Endpoint { kCompletions, kChat, kMessages };
  void Generate(Loop& loop, evhttp_request* req, Endpoint endpoint);
  // POST /v1/messages/count_tokens.
  void CountTokens(evhttp_request* req, const std::string& path);
  // POST /tokenize, /detokenize (api::ParseTokenizeRequest): answered on the
  // loop thread.
  void Tokenize(evhttp_request* req, const std::string& path);
  void Detokenize(evhttp_request* req, const std::string& path);
  // The body of a request to `path` once its key was checked and its size
  // is within the limit; nullopt when an error reply was sent.
  std::optional<std::string> AuthorizedBody(evhttp_request* req, const std::string& path);
  // /v1/ paths with API keys configured: the key's name, or an error reply
  // was sent (nullopt).
  std::optional<std::string> Authorize(evhttp_request* req, const std::string& path);
};

void HttpService::Impl::OnRequest(evhttp_request* req, void* arg) {
  auto* a = static_cast<LoopArg*>(arg);
  a->impl->Handle(*a->loop, req);
}

void HttpService::Impl::Handle(Loop& loop, evhttp_request* req) {
  const evhttp_uri* uri = evhttp_request_get_evhttp_uri(req);
  const char* raw_path = uri != nullptr ? evhttp_uri_get_path(uri) : nullptr;
  const std::string path = raw_path != nullptr && *raw_path != '\0' ? raw_path : "/";
  const evhttp_cmd_type method = evhttp_request_get_command(req);
  const bool get = method == EVHTTP_REQ_GET || method == EVHTTP_REQ_HEAD;
  if (method == EVHTTP_REQ_POST && path == "/v1/completions") {
    return Generate(loop, req, Endpoint::kCompletions);
  }
  if (method == EVHTTP_REQ_POST && path == "/v1/chat/completions") {
    return Generate(loop, req, Endpoint::kChat);
  }
  if (method == EVHTTP_REQ_POST && path == "/v1/messages") {
    return Generate(loop, req, Endpoint::kMessages);
  }
  if (method == EVHTTP_REQ_POST && path == "/v1/messages/count_tokens") {
    return CountTokens(req, path);
  }
  if (method == EVHTTP_REQ_POST && (path == "/tokenize" || path == "/v1/tokenize")) {
    return Tokenize(req, path);
  }
  if (method == EVHTTP_REQ_POST && (path == "/detokenize" || path == "/v1/detokenize")) {
    return Detokenize(req, path);
  }
  if (get && path == "/v1/models") {
    if (o.keys != nullptr && !Authorize(req, path)) return;
    if (AnthropicClient(req, path)) {
      return Reply(req, path, 200, api::AnthropicModelsJson(o.router->ListModels()));
    }
    return Reply(req, path, 200, api::ModelsJson(o.router->ListModels()));
  }
  if (get && path == "/livez") {  // liveness: 200 whenever this serves HTTP
    return Send(req, 200, "text/plain; charset=utf-8", "ok\n");
  }
  if (get && path == "/health") {
    absl::Status s = o.router->Health();
    return Send(req, s.ok() ? 200 : 503, "text/plain; charset=utf-8",
                s.ok() ? "ok\n" : absl::StrCat(s.message(), "\n"));
  }
  if (get && path == "/metrics") {
    return Send(req, 200, std::string(metrics::kTextFormatContentType).c_str(),
                registry->RenderText());
  }
  // Unknown paths and wrong methods: JSON errors in the client's API's shape.
  api::ApiError e = api::InvalidRequestError(absl::StrCat("unknown path ", path));
  e.http_status = 404;
  Send(req, 404, kJson, AnthropicClient(req, path) ? api::AnthropicErrorJson(e) : api::ErrorJson(e));
}

std::optional<std::string> HttpService::Impl::AuthorizedBody(evhttp_request* req,
                                                              const std::string& path) {
  if (o.keys != nullptr && !Authorize(req, path)) return std::nullopt;
  std::string body = Body(req);
  if (body.size() > o.limits.max_body_bytes) {
    ReplyError(req, path, api::PayloadTooLargeError(o.limits.max_body_bytes));
    return std::nullopt;
  }
  return body;
}

void HttpService::Impl::Tokenize(evhttp_request* req, const std::string& path) {
  const std::optional<std::string> body = AuthorizedBody(req, path);
  if (!body) return;
  auto parsed = api::ParseTokenizeRequest(*body, o.limits);
  if (auto* e = std::get_if<api::ApiError>(&parsed)) return ReplyError(req, path, *e);
  const api::TokenizeRequest& t = std::get<api::TokenizeRequest>(parsed);
  absl::StatusOr<std::vector<uint32_t>> ids = o.router->Tokenize(t.request);
  if (!ids.ok()) return ReplyError(req, path, ErrorFor(ids.status()));
  std::vector<std::string> strs;
  if (t.return_token_strs) {
    for (uint32_t id : *ids) strs.push_back(o.tokenizer->Decode({&id, 1}));
  }
  const v1::ListModelsResponse models = o.router->ListModels();
  const uint32_t max_len = models.models_size() > 0 ? models.models(0).max_prompt_tokens() : 0;
  Reply(req, path, 200,
        api::TokenizeResponseJson(*ids, max_len, t.return_token_strs ? &strs : nullptr));
}

void HttpService::Impl::CountTokens(evhttp_request* req, const std::string& path) {
  const std::optional<std::string> body = AuthorizedBody(req, path);
  if (!body) return;
  auto parsed = api::ParseCountTokensRequest(*body, o.limits);
  if (auto* e = std::get_if<api::ApiError>(&parsed)) return ReplyError(req, path, *e);
  absl::StatusOr<std::vector<uint32_t>> ids =
      o.router->Tokenize(std::get<api::TokenizeRequest>(parsed).request);
  if (!ids.ok()) return ReplyError(req, path, ErrorFor(ids.status()));
  Reply(req, path, 200, api::CountTokensResponseJson(ids->size()));
}

void HttpService::Impl::Detokenize(evhttp_request* req, const std::string& path) {
  const std::optional<std::string> body = AuthorizedBody(req, path);
  if (!body) return;
  auto parsed = api::ParseDetokenizeRequest(*body, o.limits);
  if (auto* e = std::get_if<api::ApiError>(&parsed)) return ReplyError(req, path, *e);
  const std::vector<uint32_t>& ids = std::get<std::vector<uint32_t>>(parsed);
  const uint32_t vocab = static_cast<uint32_t>(o.tokenizer->vocab_size());
  for (uint32_t id : ids) {
    if (id >= vocab) {
      return ReplyError(req, path,
                        api::InvalidRequestError(absl::StrCat("token id ", id,
                                                              " is outside the vocabulary (",
                                                              vocab, " tokens)"),
                                                 "tokens", "invalid_value"));
    }
  }
  Reply(req, path, 200, api::DetokenizeResponseJson(o.tokenizer->Decode(ids)));
}

std::optional<std::string> HttpService::Impl::Authorize(evhttp_request* req,
                                                        const std::string& path) {
  // Bearer keys, or Anthropic's x-api-key header with the same keys.
  std::string authorization = Header(req, "Authorization");
  if (authorization.empty()) {
    const std::string key = Header(req, "x-api-key");
    if (!key.empty()) authorization = absl::StrCat("Bearer ", key);
  }
  absl::StatusOr<std::string> name = o.keys->Authorize(authorization);
  if (!name.ok()) {
    ReplyError(req, path, api::AuthenticationError(std::string(name.status().message())));
    return std::nullopt;
  }
  return *name;
}

void HttpService::Impl::Generate(Loop& loop, evhttp_request* req, Endpoint endpoint) {
  const bool chat = endpoint != Endpoint::kCompletions;
  const std::string path = endpoint == Endpoint::kMessages ? "/v1/messages"
                           : chat                          ? "/v1/chat/completions"
                                                           : "/v1/completions";
  std::shared_ptr<api::ConcurrencyLimiter::Lease> lease;
  router::Caller caller;
  if (o.keys != nullptr) {
    std::optional<std::string> name = Authorize(req, path);
    if (!name) return;
    absl::StatusOr<router::Caller> admitted = o.callers->Admit(*name);
    if (!admitted.ok()) return ReplyError(req, path, ErrorFor(admitted.status()));
    caller = *std::move(admitted);
    if (o.limiter != nullptr) {
      std::optional<api::ConcurrencyLimiter::Lease> l = o.limiter->TryAcquire(*name);
      if (!l) {
        return ReplyError(req, path,
                          api::RateLimitError(absl::StrCat(
                              "too many concurrent requests for this API key (limit ",
                              o.limiter->LimitFor(*name), ")")));
      }
      lease = std::make_shared<api::ConcurrencyLimiter::Lease>(std::move(*l));
    }
  }
  const std::string body = Body(req);
  if (body.size() > o.limits.max_body_bytes) {
    return ReplyError(req, path, api::PayloadTooLargeError(o.limits.max_body_bytes));
  }
  api::ParseResult parsed = endpoint == Endpoint::kMessages ? api::ParseMessagesRequest(body, o.limits)
                            : chat ? api::ParseChatRequest(body, o.limits)
                                   : api::ParseCompletionRequest(body, o.limits);
  if (auto* e = std::get_if<api::ApiError>(&parsed)) return ReplyError(req, path, *e);
  auto p = std::make_shared<api::ParsedRequest>(std::get<api::ParsedRequest>(std::move(parsed)));
  HttpCall::Params cp;
  cp.req = req;
  cp.base = loop.base;
  cp.replies = this;
  cp.id = NewId();
  p->request.set_request_id(cp.id);
  cp.parsed = p;
  cp.created = absl::ToUnixSeconds(absl::Now());
  cp.chat = chat;
  cp.lease = std::move(lease);
  cp.token_text = TokenText();
  cp.stream_keepalive = o.stream_keepalive;
  cp.nonstream_keepalive = o.nonstream_keepalive;
  cp.chat_format = &o.router->chat_format();
  std::shared_ptr<HttpCall> call = HttpCall::Begin(std::move(cp));
  o.router->Start(p->request, call, std::shared_ptr<router::CancelFlag>(call, &call->cancel_flag()),
                  [call](absl::Status s) { call->Finish(std::move(s)); }, std::move(caller));
}

HttpService::~HttpService() { Stop(); }

void HttpService::Stop() {
  if (impl_ == nullptr || impl_->stopped) return;
  impl_->stopped = true;
  for (auto& l : impl_->loops) event_base_loopbreak(l->base);
  for (auto& l : impl_->loops) {
    if (l->thread.joinable()) l->thread.join();
  }
  // Frees the connections (requests in flight see their close callback and
  // are cancelled), then the bases.
  for (auto& l : impl_->loops) {
    evhttp_free(l->http);
    event_base_free(l->base);
  }
  impl_->loops.clear();
}

absl::StatusOr<std::unique_ptr<HttpService>> HttpService::Create(
    const HttpServiceOptions& options) {
  if (options.router == nullptr || options.tokenizer == nullptr) {
    return absl::InvalidArgumentError("HttpService needs a router and a tokenizer");
  }
  static absl::once_flag threads_once;
  absl::call_once(threads_once, [] { evthread_use_pthreads(); });
  std::unique_ptr<HttpService> self(new HttpService());
  self->impl_ = std::make_unique<Impl>();
  Impl* impl = self->impl_.get();
  impl->o = options;
  impl->registry = options.registry != nullptr ? options.registry : &metrics::DefaultRegistry();
  ASSIGN_OR_RETURN(impl->requests,
                   impl->registry->AddCounter("swaserve_router_http_requests_total",
                                              "HTTP API requests by path and status code.",
                                              {"path", "status"}));
  ASSIGN_OR_RETURN(impl->tool_calls,
                   impl->registry->AddCounter(
                       "swaserve_router_tool_calls_total",
                       "Tool-call blocks in chat outputs: parsed into tool_calls, or returned as "
                       "text (malformed, an undeclared function, cut off, a second call with "
                       "parallel calls off); a rising share of the latter means the model and the "
                       "template's call format disagree. required_but_none: replies to "
                       "tool_choice required or a named function that made no call (nothing "
                       "forces a call).",
                       {"result"}));
  ASSIGN_OR_RETURN(impl->reasoning_tokens,
                   impl->registry->AddCounter("swaserve_router_reasoning_tokens_total",
                                              "Generated tokens inside reasoning blocks.", {}));
  impl->tool_calls->WithLabels({"parsed"});
  impl->tool_calls->WithLabels({"returned_as_text"});
  impl->tool_calls->WithLabels({"required_but_none"});
  if (options.tls.enabled()) {
    ASSIGN_OR_RETURN(impl->tls, rpc::HttpTlsContext::Create(options.tls));
  }
  const int n = std::clamp(options.threads, 1, 64);
  evutil_socket_t listen_fd = -1;
  for (int i = 0; i < n; ++i) {
    auto loop = std::make_unique<Loop>();
    loop->base = event_base_new();
    if (loop->base == nullptr) return absl::InternalError("event_base_new failed");
    loop->http = evhttp_new(loop->base);
    if (loop->http == nullptr) {
      event_base_free(loop->base);
      return absl::InternalError("evhttp_new failed");
    }
    // A body over the limit is refused on its Content-Length, before a byte
    // of it is read: evhttp answers 413 and closes the connection (a chunked
    // body is cut off when it passes the limit). The handler's JSON 413 is
    // for what evhttp lets through.
    evhttp_set_max_body_size(loop->http, static_cast<ev_ssize_t>(options.limits.max_body_bytes));
    evhttp_set_max_headers_size(loop->http, 64 << 10);
    // Reading a request and writing to a client that stopped reading time
    // out; a request waiting for its first token does not (evhttp reads
    // nothing then).
    evhttp_set_timeout(loop->http, 30);
    evhttp_set_allowed_methods(loop->http, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_HEAD);
    if (impl->tls != nullptr) evhttp_set_bevcb(loop->http, &NewTlsBufferevent, impl->tls.get());
    auto arg = std::make_unique<Impl::LoopArg>(Impl::LoopArg{impl, loop.get()});
    evhttp_set_gencb(loop->http, &Impl::OnRequest, arg.get());
    impl->args.push_back(std::move(arg));
    if (i == 0) {
      // SO_REUSEADDR only (rebinding over TIME_WAIT), never SO_REUSEPORT.
      evhttp_bound_socket* bound =
          evhttp_bind_socket_with_handle(loop->http, options.host.c_str(),
                                         static_cast<ev_uint16_t>(options.port));
      if (bound == nullptr) {
        evhttp_free(loop->http);
        event_base_free(loop->base);
        return absl::UnavailableError(
            absl::StrCat("cannot bind HTTP ", options.host, ":", options.port));
      }
      listen_fd = evhttp_bound_socket_get_fd(bound);
      sockaddr_storage addr{};
      socklen_t len = sizeof(addr);
      getsockname(listen_fd, reinterpret_cast<sockaddr*>(&addr), &len);
      self->port_ = addr.ss_family == AF_INET6
                        ? ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port)
                        : ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
    } else if (evhttp_accept_socket(loop->http, dup(listen_fd)) != 0) {
      // Each loop accepts on its own descriptor of the one socket (each
      // closes its own).
      evhttp_free(loop->http);
      event_base_free(loop->base);
      return absl::InternalError("evhttp_accept_socket failed");
    }
    impl->loops.push_back(std::move(loop));
  }
  for (auto& l : impl->loops) {
    event_base* base = l->base;
    l->thread = std::thread([base] { event_base_dispatch(base); });
  }
  return self;
}

}  // namespace swaserve::router_service
