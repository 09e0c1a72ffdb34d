#include "services/router/http_service.h"

#include <httplib.h>

#include <chrono>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "lib/base/logging.h"
#include "lib/base/status.h"
#include "lib/metrics/exposition.h"
#include "lib/rpc/status_conversion.h"
#include "services/router/call_state.h"

namespace swaserve::router_service {
namespace {

constexpr char kJson[] = "application/json";

// The error a failed Generate gets over HTTP. A prompt too long for every
// bucket, or too large for every worker's KV memory, is 413 (issues 7, 16),
// not OpenAI's 400.
api::ApiError ErrorFor(const absl::Status& s) {
  std::optional<v1::ErrorDetail> d = rpc::GetErrorDetail(s);
  if (d && (d->code() == v1::ERROR_CODE_PROMPT_TOO_LONG ||
            d->code() == v1::ERROR_CODE_TOO_LARGE_FOR_WORKER)) {
    api::ApiError e;
    e.http_status = 413;
    e.type = "invalid_request_error";
    e.message = std::string(s.message());
    e.code = "context_length_exceeded";
    return e;
  }
  if (d && d->code() != v1::ERROR_CODE_UNSPECIFIED) {
    api::ApiError e = api::ApiErrorFromDetail(*d);
    if (e.message.empty()) e.message = std::string(s.message());
    return e;
  }
  return api::ApiErrorFromStatus(s);
}

}  // namespace

struct HttpService::Impl {
  HttpServiceOptions o;
  metrics::CounterFamily* requests = nullptr;
  std::mt19937_64 rng{std::random_device{}()};
  absl::Mutex rng_mu;

  std::string NewId() {
    absl::MutexLock lock(&rng_mu);
    return absl::StrFormat("%016x", rng());
  }

  void Reply(httplib::Response& res, const std::string& path, int status, std::string body) {
    res.status = status;
    res.set_content(std::move(body), kJson);
    requests->WithLabels({path, absl::StrCat(status)}).Increment();
  }
  void ReplyError(httplib::Response& res, const std::string& path, const api::ApiError& e) {
    if (e.retry_after_ms > 0) {
      res.set_header("Retry-After", absl::StrCat((e.retry_after_ms + 999) / 1000));
      res.set_header("retry-after-ms", absl::StrCat(e.retry_after_ms));
    }
    Reply(res, path, e.http_status, api::ErrorJson(e));
  }

  std::function<std::string(uint32_t)> TokenText() const {
    const model::Tokenizer* t = o.tokenizer;
    return [t](uint32_t id) { return t->Decode({&id, 1}); };
  }

  void Generate(const httplib::Request& req, httplib::Response& res, bool chat);
};

void HttpService::Impl::Generate(const httplib::Request& req, httplib::Response& res, bool chat) {
  const std::string path = chat ? "/v1/chat/completions" : "/v1/completions";
  std::shared_ptr<api::ConcurrencyLimiter::Lease> lease;
  if (o.keys != nullptr) {
    absl::StatusOr<std::string> name = o.keys->Authorize(req.get_header_value("Authorization"));
    if (!name.ok()) {
      return ReplyError(res, path, api::AuthenticationError(std::string(name.status().message())));
    }
    if (o.limiter != nullptr) {
      std::optional<api::ConcurrencyLimiter::Lease> l = o.limiter->TryAcquire(*name);
      if (!l) {
        return ReplyError(res, path,
                          api::RateLimitError(absl::StrCat(
                              "too many concurrent requests for this API key (limit ",
                              o.limiter->LimitFor(*name), ")")));
      }
      lease = std::make_shared<api::ConcurrencyLimiter::Lease>(std::move(*l));
    }
  }
  if (req.body.size() > o.limits.max_body_bytes) {
    return ReplyError(res, path, api::PayloadTooLargeError(o.limits.max_body_bytes));
  }
  api::ParseResult parsed = chat ? api::ParseChatRequest(req.body, o.limits)
                                 : api::ParseCompletionRequest(req.body, o.limits);
  if (auto* e = std::get_if<api::ApiError>(&parsed)) return ReplyError(res, path, *e);
  auto p = std::make_shared<api::ParsedRequest>(std::get<api::ParsedRequest>(std::move(parsed)));
  const std::string id = NewId();
  p->request.set_request_id(id);
  const int64_t created = absl::ToUnixSeconds(absl::Now());

  auto call = std::make_shared<CallState>();
  router::Router* router = o.router;
  router->Start(p->request, call, std::shared_ptr<router::CancelFlag>(call, &call->cancel_flag()),
                [call](absl::Status s) { call->Finish(std::move(s)); });

  // The first event decides the status code.
  v1::GenerateResponse first;
  absl::Status status;
  // (httplib 0.11 cannot tell that a client left before the response
  // starts: such a request runs to its end, bounded by max_tokens.)
  CallState::Next next;
  do {
    next = call->Pop(&first, &status, absl::Seconds(1));
  } while (next == CallState::Next::kEmpty);
  if (next == CallState::Next::kFinished && !status.ok()) {
    return ReplyError(res, path, ErrorFor(status));
  }

  auto base_input = [p, id, created] {
    api::ResponseInput in;
    in.request_id = id;
    in.model = p->model;
    in.created = created;
    in.logprobs = p->logprobs;
    in.include_usage = p->include_usage;
    return in;
  };

  if (!p->stream) {
    api::ResponseInput in = base_input();
    v1::GenerateResponse item = std::move(first);
    bool have = next == CallState::Next::kItem;
    while (true) {
      if (have) {
        in.text += item.text();
        in.token_ids.insert(in.token_ids.end(), item.token_ids().begin(), item.token_ids().end());
        if (p->logprobs) {
          for (api::TokenLogprobText& t : api::MakeTokenLogprobs(item.logprobs(), TokenText())) {
            in.token_logprobs.push_back(std::move(t));
          }
        }
        if (item.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
          in.finish_reason = item.finish_reason();
          in.usage = item.usage();
        }
      }
      next = call->Pop(&item, &status, absl::Seconds(1));
      if (next == CallState::Next::kFinished) break;
      have = next == CallState::Next::kItem;
    }
    if (!status.ok()) return ReplyError(res, path, ErrorFor(status));
    in.include_usage = false;
    return Reply(res, path, 200, chat ? api::ChatResponseJson(in) : api::CompletionResponseJson(in));
  }

  // Streaming: 200 from here on.
  requests->WithLabels({path, "200"}).Increment();
  res.status = 200;
  res.set_header("Cache-Control", "no-cache");
  auto pending = std::make_shared<std::optional<v1::GenerateResponse>>();
  if (next == CallState::Next::kItem) *pending = std::move(first);
  auto token_text = TokenText();
  res.set_chunked_content_provider(
      "text/event-stream",
      [call, p, pending, base_input, token_text, chat, lease](size_t,
                                                               httplib::DataSink& sink) {
        bool first_chunk = true;
        size_t offset = 0;
        std::optional<v1::Usage> usage;
        auto send = [&](const std::string& frame) {
          if (!sink.write(frame.data(), frame.size())) {
            call->Cancel();
            return false;
          }
          return true;
        };
        auto emit = [&](const v1::GenerateResponse& item) {
          api::ResponseInput in = base_input();
          in.text = item.text();
          in.token_ids.assign(item.token_ids().begin(), item.token_ids().end());
          if (p->logprobs) in.token_logprobs = api::MakeTokenLogprobs(item.logprobs(), token_text);
          in.text_offset_start = offset;
          offset += item.text().size();
          in.finish_reason = item.finish_reason();
          if (item.has_usage()) usage = item.usage();
          in.first_chunk = first_chunk;
          first_chunk = false;
          return send(api::SseFrame(chat ? api::ChatChunkJson(in) : api::CompletionChunkJson(in)));
        };
        v1::GenerateResponse item;
        absl::Status status;
        if (pending->has_value()) {
          if (!emit(**pending)) return false;
          pending->reset();
        }
        while (true) {
          CallState::Next next = call->Pop(&item, &status, absl::Seconds(1));
          if (next == CallState::Next::kFinished) break;
          if (next == CallState::Next::kEmpty) {
            if (!sink.is_writable()) {
              call->Cancel();
              return false;
            }
            continue;
          }
          if (!emit(item)) return false;
        }
        if (!status.ok()) {
          if (!send(api::SseFrame(api::ErrorJson(ErrorFor(status))))) return false;
        } else if (p->include_usage) {
          api::ResponseInput in = base_input();
          in.usage = usage;
          if (!send(api::SseFrame(api::UsageChunkJson(in, chat)))) return false;
        }
        if (!send(std::string(api::kSseDone))) return false;
        sink.done();
        return true;
      },
      [call](bool success) {
        if (!success) call->Cancel();
      });
}

HttpService::~HttpService() { Stop(); }

void HttpService::Stop() {
  if (server_ != nullptr) server_->stop();
  if (thread_.joinable()) thread_.join();
}

absl::StatusOr<std::unique_ptr<HttpService>> HttpService::Create(
    const HttpServiceOptions& options) {
  if (options.router == nullptr || options.tokenizer == nullptr) {
    return absl::InvalidArgumentError("HttpService needs a router and a tokenizer");
  }
  std::unique_ptr<HttpService> self(new HttpService());
  self->impl_ = std::make_unique<Impl>();
  Impl* impl = self->impl_.get();
  impl->o = options;
  metrics::Registry* registry =
      options.registry != nullptr ? options.registry : &metrics::DefaultRegistry();
  ASSIGN_OR_RETURN(impl->requests,
                   registry->AddCounter("swaserve_router_http_requests_total",
                                        "HTTP API requests by path and status code.",
                                        {"path", "status"}));
  auto server = std::make_unique<httplib::Server>();
  const int threads = std::max(4, options.threads);
  server->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  // Only rebinding over TIME_WAIT, never sharing a port (no SO_REUSEPORT).
  server->set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  // Bodies past the limit are answered 413 by the handler; httplib cuts off
  // anything grossly larger.
  server->set_payload_max_length(options.limits.max_body_bytes * 2 + 4096);
  server->set_read_timeout(30);
  server->set_write_timeout(30);
  server->set_keep_alive_max_count(1000);

  server->Post("/v1/completions", [impl](const httplib::Request& req, httplib::Response& res) {
    impl->Generate(req, res, /*chat=*/false);
  });
  server->Post("/v1/chat/completions",
               [impl](const httplib::Request& req, httplib::Response& res) {
                 impl->Generate(req, res, /*chat=*/true);
               });
  server->Get("/v1/models", [impl](const httplib::Request& req, httplib::Response& res) {
    if (impl->o.keys != nullptr) {
      absl::StatusOr<std::string> name = impl->o.keys->Authorize(req.get_header_value("Authorization"));
      if (!name.ok()) {
        return impl->ReplyError(res, "/v1/models",
                                api::AuthenticationError(std::string(name.status().message())));
      }
    }
    impl->Reply(res, "/v1/models", 200, api::ModelsJson(impl->o.router->ListModels()));
  });
  server->Get("/health", [impl](const httplib::Request&, httplib::Response& res) {
    absl::Status s = impl->o.router->Health();
    res.status = s.ok() ? 200 : 503;
    res.set_content(s.ok() ? "ok\n" : absl::StrCat(s.message(), "\n"), "text/plain; charset=utf-8");
  });
  server->Get("/metrics", [registry](const httplib::Request&, httplib::Response& res) {
    res.status = 200;
    res.set_content(registry->RenderText(), std::string(metrics::kTextFormatContentType).c_str());
  });
  // Unknown paths and wrong methods: OpenAI-style JSON errors.
  server->set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    api::ApiError e = api::InvalidRequestError(
        res.status == 404 ? absl::StrCat("unknown path ", req.path)
        : res.status == 413 ? "request body too large"
                            : absl::StrCat("HTTP ", res.status));
    e.http_status = res.status;
    res.set_content(api::ErrorJson(e), kJson);
  });

  int port = options.port;
  if (port == 0) {
    port = server->bind_to_any_port(options.host);
    if (port < 0) return absl::UnavailableError(absl::StrCat("cannot bind ", options.host, ":0"));
  } else if (!server->bind_to_port(options.host, port)) {
    return absl::UnavailableError(absl::StrCat("cannot bind HTTP ", options.host, ":", port));
  }
  self->port_ = port;
  self->server_ = std::move(server);
  httplib::Server* raw = self->server_.get();
  self->thread_ = std::thread([raw] { raw->listen_after_bind(); });
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (!raw->is_running() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
  return self;
}

}  // namespace swaserve::router_service
