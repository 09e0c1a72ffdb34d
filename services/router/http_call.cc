#include "services/router/http_call.h"

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "lib/base/logging.h"
#include "lib/router/chat_input.h"
#include "lib/rpc/status_conversion.h"

namespace swaserve::router_service {

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

HttpCall::HttpCall(Params p) : p_(std::move(p)), req_(p_.req) {
  choices_.resize(std::max<uint32_t>(1, p_.parsed->request.n()));
  for (size_t i = 0; i < choices_.size(); ++i) {
    choices_[i].whole = BaseInput();
    choices_[i].whole.choice_index = static_cast<int>(i);
  }
  if (p_.parsed->messages_api && p_.parsed->stream) {
    events_ = std::make_unique<api::MessagesStream>(p_.id, p_.parsed->model);
  }
}

HttpCall::~HttpCall() {
  if (keepalive_ != nullptr) event_free(keepalive_);
  if (peer_closed_ != nullptr) event_free(peer_closed_);
}

std::shared_ptr<HttpCall> HttpCall::Begin(Params p) {
  std::shared_ptr<HttpCall> c(new HttpCall(std::move(p)));
  c->self_ = c;
  c->conn_ = evhttp_request_get_connection(c->req_);
  if (c->conn_ != nullptr) {
    evhttp_connection_set_closecb(c->conn_, &HttpCall::OnClose, c.get());
    c->WatchPeerClose();
  }
  if (c->p_.parsed->stream ? c->p_.stream_keepalive > absl::ZeroDuration()
                           : c->p_.nonstream_keepalive > absl::ZeroDuration()) {
    c->ArmKeepalive();
  }
  return c;
}

void HttpCall::WatchPeerClose() {
  // evhttp reads nothing more from a connection whose reply is pending, so
  // it would see the client's FIN only when a write fails: after the answer
  // (or a keep-alive) was computed for nobody. EV_CLOSED (epoll's
  // EPOLLRDHUP) reports it at once, beside the bufferevent's own events.
  if ((event_base_get_features(p_.base) & EV_FEATURE_EARLY_CLOSE) == 0) return;
  const evutil_socket_t fd = bufferevent_getfd(evhttp_connection_get_bufferevent(conn_));
  if (fd < 0) return;
  peer_closed_ = event_new(p_.base, fd, EV_CLOSED, &HttpCall::OnPeerClosed, this);
  if (peer_closed_ != nullptr && event_add(peer_closed_, nullptr) != 0) {
    event_free(peer_closed_);
    peer_closed_ = nullptr;
  }
}

void HttpCall::StopWatchingPeer() {
  if (peer_closed_ == nullptr) return;
  event_free(peer_closed_);  // loop thread: its callback is not running now
  peer_closed_ = nullptr;
}

void HttpCall::OnPeerClosed(int, short, void* arg) {
  // Freed by Done / Closed before the call can go, as the keep-alive timer.
  // The client closed its side (a half-close counts: as nginx, a client
  // that stops sending is taken as gone; HTTP/1.1 clients do not half-close
  // and wait). The request is cancelled; its end then writes the reply into
  // the closing connection, whose failure evhttp reports (Closed).
  auto* c = static_cast<HttpCall*>(arg);
  c->StopWatchingPeer();
  c->cancel_.Cancel();
}

const std::string& HttpCall::path() const {
  static const std::string kChat = "/v1/chat/completions";
  static const std::string kCompletions = "/v1/completions";
  static const std::string kMessages = "/v1/messages";
  if (p_.parsed->messages_api) return kMessages;
  return p_.chat ? kChat : kCompletions;
}

api::ResponseInput HttpCall::BaseInput() const {
  api::ResponseInput in;
  in.request_id = p_.id;
  in.model = p_.parsed->model;
  in.created = p_.created;
  in.logprobs = p_.parsed->logprobs;
  in.include_usage = p_.parsed->include_usage;
  return in;
}

// ---- Router side ----

bool HttpCall::Write(const v1::GenerateResponse& response) {
  absl::MutexLock lock(&mu_);
  if (closed_) return false;
  queue_.push_back(response);
  Notify();
  return true;
}

void HttpCall::OnReady(std::function<void()> ready) {
  {
    absl::MutexLock lock(&mu_);
    if (!closed_ && (queue_.size() >= kMaxQueued || backlogged_)) {
      ready_ = std::move(ready);
      return;
    }
  }
  ready();
}

void HttpCall::Finish(absl::Status status) {
  absl::MutexLock lock(&mu_);
  finished_ = true;
  status_ = std::move(status);
  if (!closed_) Notify();
}

void HttpCall::Notify() {
  // With mu_ held, so that the loop cannot close (and the service free the
  // event base at shutdown) in between; event_base_once takes the base's
  // lock, which the loop never holds while it runs a callback.
  if (notify_pending_ || closed_) return;
  notify_pending_ = true;
  auto* arg = new std::shared_ptr<HttpCall>(shared_from_this());
  if (event_base_once(p_.base, -1, EV_TIMEOUT, &HttpCall::OnNotify, arg, nullptr) != 0) {
    notify_pending_ = false;
    delete arg;
  }
}

// ---- Loop side ----

void HttpCall::OnNotify(int, short, void* arg) {
  std::unique_ptr<std::shared_ptr<HttpCall>> call(static_cast<std::shared_ptr<HttpCall>*>(arg));
  (*call)->Drain();
}

void HttpCall::OnPrompt(const router::PromptInfo& info) {
  absl::MutexLock lock(&mu_);
  prompt_ = info;
}

void HttpCall::Drain() {
  std::deque<v1::GenerateResponse> items;
  bool finished;
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    notify_pending_ = false;
    items.swap(queue_);
    finished = finished_;
    status = status_;
    prompt_seen_ = prompt_;
  }
  if (req_ == nullptr) return;  // closed, or the reply is over
  for (const v1::GenerateResponse& item : items) Emit(item);
  if (finished) return End(status);
  MaybeReady();
}

void HttpCall::ArmKeepalive() {
  if (keepalive_ == nullptr) keepalive_ = evtimer_new(p_.base, &HttpCall::OnKeepalive, this);
  if (keepalive_ == nullptr) return;
  if (!p_.parsed->stream) {  // whitespace carries no progress: no probe
    const timeval tv = absl::ToTimeval(p_.nonstream_keepalive);
    evtimer_add(keepalive_, &tv);
    return;
  }
  // Two phases per comment: the probe (the watch's lead before it), the
  // comment.
  const absl::Duration lead = router::PrefillProgressWatch::Lead(p_.stream_keepalive);
  const timeval tv = absl::ToTimeval(probe_phase_ ? p_.stream_keepalive - lead : lead);
  evtimer_add(keepalive_, &tv);
}

void HttpCall::StopKeepalive() {
  if (keepalive_ == nullptr) return;
  event_free(keepalive_);  // loop thread: its callback is not running now
  keepalive_ = nullptr;
}

void HttpCall::OnKeepalive(int, short, void* arg) {
  // The timer is freed by Done / Closed before the call can go, so `arg`
  // is alive whenever this runs.
  auto* c = static_cast<HttpCall*>(arg);
  if (c->req_ == nullptr) return c->StopKeepalive();
  if (!c->p_.parsed->stream) {
    // Until the body: tokens arriving change nothing (the body waits for
    // the last one, and a long answer can take as long as a prefill).
    if (!c->started_) c->StartReply("application/json");
    ++c->keepalives_;
    c->SendFrame("\n");
    return c->ArmKeepalive();
  }
  if (c->emitted_) return c->StopKeepalive();
  const bool probe_phase = c->probe_phase_;
  c->probe_phase_ = !probe_phase;
  if (probe_phase) {
    // Ask the prefill worker now: its answer (on a gRPC thread, usually
    // within milliseconds) is what the comment a lead later says, the first
    // one included.
    c->watch_.Ask();
    return c->ArmKeepalive();
  }
  if (!c->started_) c->StartReply("text/event-stream");
  ++c->keepalives_;
  const std::optional<v1::PrefillProgress> progress = c->watch_.Last();
  std::string frame = api::WaitingComment(c->p_.stream_keepalive * c->keepalives_,
                                          progress ? &*progress : nullptr);
  // Anthropic's clients wait for pings (after message_start).
  if (c->events_ != nullptr) frame += c->events_->Ping(c->prompt_seen_.prompt_tokens);
  c->SendFrame(frame);
  c->ArmKeepalive();
}

void HttpCall::SetProgressProbe(ProgressProbe probe) { watch_.Set(std::move(probe)); }

model::ChatOutputParser& HttpCall::Parser(uint32_t index) {
  std::unique_ptr<model::ChatOutputParser>& parser = choices_[index].parser;
  if (parser != nullptr) return *parser;
  model::ChatOutputOptions o;
  const v1::GenerateRequest& r = p_.parsed->request;
  if (p_.chat_format != nullptr) {
    o.tool_format = p_.chat_format->tool_format;
    o.think_open = p_.chat_format->think_open;
    o.think_close = p_.chat_format->think_close;
  }
  if (!r.chat().tools_json().empty()) {
    o.tools = router::ToolDefinitions(
        nlohmann::ordered_json::parse(r.chat().tools_json(), nullptr, /*allow_exceptions=*/false));
  }
  o.parse_tool_calls = !o.tools.empty() && r.tool_choice().mode() != v1::ToolChoice::MODE_NONE;
  o.parallel_tool_calls = !r.has_parallel_tool_calls() || r.parallel_tool_calls();
  o.parse_reasoning = p_.chat_format != nullptr;
  o.starts_in_reasoning = prompt_seen_.opens_reasoning;
  o.call_id_prefix = choices_.size() > 1 ? absl::StrCat(p_.id, "_", index, "_")
                                          : absl::StrCat(p_.id, "_");
  parser = std::make_unique<model::ChatOutputParser>(std::move(o));
  return *parser;
}

void HttpCall::Emit(const v1::GenerateResponse& item) {
  if (item.index() >= choices_.size()) {
    SWA_LOG(err, "http: {}: output of choice {} of {}: dropped", p_.id, item.index(),
            choices_.size());
    return;
  }
  emitted_ = true;
  ChoiceOut& choice = choices_[item.index()];
  const bool last = item.finish_reason() != v1::FINISH_REASON_UNSPECIFIED;
  model::ChatOutputDelta delta;
  if (p_.chat) {
    model::ChatOutputParser& parser = Parser(item.index());
    if (parser.in_reasoning()) choice.reasoning_tokens += item.token_ids_size();
    delta = parser.Feed(item.text());
    if (last) {
      model::ChatOutputDelta rest = parser.Finish();
      delta.content += rest.content;
      delta.reasoning += rest.reasoning;
      for (model::ToolCallDelta& d : rest.tool_calls) delta.tool_calls.push_back(std::move(d));
    }
  } else {
    delta.content = item.text();
  }
  if (events_ != nullptr) return EmitEvents(item, std::move(delta));
  if (p_.parsed->stream) return EmitChunks(item, std::move(delta));
  api::ResponseInput& whole = choice.whole;
  whole.text += delta.content;
  whole.reasoning += delta.reasoning;
  whole.token_ids.insert(whole.token_ids.end(), item.token_ids().begin(),
                         item.token_ids().end());
  if (p_.parsed->logprobs) {
    for (api::TokenLogprobText& t : api::MakeTokenLogprobs(item.logprobs(), p_.token_text)) {
      whole.token_logprobs.push_back(std::move(t));
    }
  }
  if (last) {
    whole.finish_reason = item.finish_reason();
    whole.stop_sequence = item.stop_sequence();
    whole.usage = item.usage();
    choice.usage = item.usage();
    if (p_.chat) {
      for (const model::ParsedToolCall& c : choice.parser->calls()) {
        whole.tool_calls.push_back({.index = static_cast<int>(whole.tool_calls.size()),
                                    .id = c.id,
                                    .name = c.name,
                                    .arguments = c.arguments});
      }
      whole.finished_in_tool_calls = !whole.tool_calls.empty();
      whole.reasoning_tokens = choice.reasoning_tokens;
    }
  }
}

std::optional<v1::Usage> HttpCall::TotalUsage() const {
  if (choices_.size() == 1) return choices_[0].usage;
  std::optional<v1::Usage> total;
  for (const ChoiceOut& c : choices_) {
    if (!c.usage) continue;
    if (!total) {
      total = choices_[0].usage.value_or(*c.usage);
      total->set_completion_tokens(0);
      total->set_draft_tokens(0);
      total->set_accepted_draft_tokens(0);
    }
    total->set_completion_tokens(total->completion_tokens() + c.usage->completion_tokens());
    total->set_draft_tokens(total->draft_tokens() + c.usage->draft_tokens());
    total->set_accepted_draft_tokens(total->accepted_draft_tokens() +
                                     c.usage->accepted_draft_tokens());
  }
  return total;
}

uint32_t HttpCall::TotalReasoningTokens() const {
  uint32_t n = 0;
  for (const ChoiceOut& c : choices_) n += c.reasoning_tokens;
  return n;
}

void HttpCall::EmitChunks(const v1::GenerateResponse& item, model::ChatOutputDelta delta) {
  if (!started_) StartReply("text/event-stream");
  ChoiceOut& choice = choices_[item.index()];
  const bool last = item.finish_reason() != v1::FINISH_REASON_UNSPECIFIED;
  std::vector<api::ResponseInput> chunks;
  api::ResponseInput head = BaseInput();
  head.text = std::move(delta.content);
  head.reasoning = std::move(delta.reasoning);
  head.token_ids.assign(item.token_ids().begin(), item.token_ids().end());
  if (p_.parsed->logprobs) head.token_logprobs = api::MakeTokenLogprobs(item.logprobs(), p_.token_text);
  head.text_offset_start = choice.offset;
  choice.offset += item.text().size();
  const bool chat_head = choice.first_chunk || !head.text.empty() || !head.reasoning.empty() ||
                         !head.token_logprobs.empty();
  if (!p_.chat || chat_head) chunks.push_back(std::move(head));
  for (model::ToolCallDelta& d : delta.tool_calls) {
    api::ResponseInput c = BaseInput();
    c.tool_calls.push_back(
        {.index = d.index, .id = std::move(d.id), .name = std::move(d.name),
         .arguments = std::move(d.arguments)});
    chunks.push_back(std::move(c));
  }
  if (item.has_usage()) choice.usage = item.usage();
  if (last) {
    if (chunks.empty()) chunks.push_back(BaseInput());
    chunks.back().finish_reason = item.finish_reason();
    chunks.back().finished_in_tool_calls =
        choice.parser != nullptr && !choice.parser->calls().empty();
  }
  for (api::ResponseInput& in : chunks) {
    in.choice_index = static_cast<int>(item.index());
    in.first_chunk = choice.first_chunk;
    choice.first_chunk = false;
    SendFrame(api::SseFrame(p_.chat ? api::ChatChunkJson(in) : api::CompletionChunkJson(in)));
  }
}

api::MessagesUsage HttpCall::MessagesUsage(const v1::Usage& usage) const {
  return api::MessagesUsageFrom(usage, prompt_seen_.cache_breakpoint_tokens);
}

void HttpCall::EmitEvents(const v1::GenerateResponse& item, model::ChatOutputDelta delta) {
  if (!started_) StartReply("text/event-stream");
  std::string frames = events_->Start(prompt_seen_.prompt_tokens);
  std::vector<api::ToolCallOut> calls;
  for (model::ToolCallDelta& d : delta.tool_calls) {
    calls.push_back({.index = d.index, .id = std::move(d.id), .name = std::move(d.name),
                     .arguments = std::move(d.arguments)});
  }
  frames += events_->Delta(delta.reasoning, delta.content, calls);
  ChoiceOut& choice = choices_[0];
  if (item.has_usage()) choice.usage = item.usage();
  if (item.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
    api::ResponseInput last = BaseInput();
    last.finish_reason = item.finish_reason();
    last.stop_sequence = item.stop_sequence();
    last.finished_in_tool_calls = choice.parser != nullptr && !choice.parser->calls().empty();
    frames += events_->Finish(last, MessagesUsage(item.usage()));
  }
  if (!frames.empty()) SendFrame(frames);
}

std::string HttpCall::WholeBody() const {
  if (p_.parsed->messages_api) {
    const api::ResponseInput& whole = choices_[0].whole;
    return api::MessagesResponseJson(whole, MessagesUsage(whole.usage.value_or(v1::Usage())));
  }
  if (choices_.size() == 1) {
    api::ResponseInput in = choices_[0].whole;
    in.include_usage = false;
    return p_.chat ? api::ChatResponseJson(in) : api::CompletionResponseJson(in);
  }
  std::vector<api::ResponseInput> all;
  for (const ChoiceOut& c : choices_) all.push_back(c.whole);
  api::ResponseInput usage = BaseInput();
  usage.usage = TotalUsage();
  if (p_.chat) usage.reasoning_tokens = TotalReasoningTokens();
  return p_.chat ? api::ChatMultiResponseJson(all, usage)
                 : api::CompletionMultiResponseJson(all, usage);
}

void HttpCall::StartReply(const char* content_type) {
  evkeyvalq* h = evhttp_request_get_output_headers(req_);
  evhttp_add_header(h, "Content-Type", content_type);
  evhttp_add_header(h, "Cache-Control", "no-cache");
  evhttp_send_reply_start(req_, 200, "OK");
  p_.replies->Count(path(), 200);
  started_ = true;
}

void HttpCall::SendFrame(const std::string& frame) {
  evbuffer* b = evbuffer_new();
  evbuffer_add(b, frame.data(), frame.size());
  evhttp_send_reply_chunk_with_cb(req_, b, &HttpCall::OnChunkSent, this);
  evbuffer_free(b);
  if (conn_ != nullptr) {
    const size_t unsent =
        evbuffer_get_length(bufferevent_get_output(evhttp_connection_get_bufferevent(conn_)));
    absl::MutexLock lock(&mu_);
    backlogged_ = unsent >= kMaxUnsentBytes;
  }
}

void HttpCall::OnChunkSent(evhttp_connection*, void* arg) {
  // The socket took everything written so far (the reply is open: the call
  // is alive, see SendFrame's callers).
  auto* c = static_cast<HttpCall*>(arg);
  {
    absl::MutexLock lock(&c->mu_);
    c->backlogged_ = false;
  }
  c->MaybeReady();
}

void HttpCall::MaybeReady() {
  std::function<void()> ready;
  {
    absl::MutexLock lock(&mu_);
    if (ready_ == nullptr || queue_.size() >= kMaxQueued || backlogged_) return;
    ready = std::move(ready_);
    ready_ = nullptr;
  }
  ready();  // the request reads on (from the loop: it does not block)
}

void HttpCall::End(const absl::Status& status) {
  if (!p_.parsed->stream) {
    std::string body;
    if (!status.ok() && !started_) {
      p_.replies->ReplyError(req_, path(), ErrorFor(status));
      return Done();
    }
    if (!status.ok()) {
      // The 200 went out with the whitespace.
      body = p_.parsed->messages_api ? api::AnthropicErrorJson(ErrorFor(status))
                                     : api::ErrorJson(ErrorFor(status));
    } else {
      body = WholeBody();
    }
    if (!started_) {
      p_.replies->Reply(req_, path(), 200, std::move(body));
      return Done();
    }
    SendFrame(body);
    evhttp_send_reply_end(req_);
    return Done();
  }
  if (!started_) {
    // The first event decides the status code.
    if (!status.ok()) {
      p_.replies->ReplyError(req_, path(), ErrorFor(status));
      return Done();
    }
    StartReply("text/event-stream");
  }
  if (events_ != nullptr) {
    // An error event ends the stream; a finished one ended with message_stop.
    if (!status.ok()) {
      SendFrame(api::MessagesStream::Error(ErrorFor(status)));
    } else if (!events_->finished()) {
      api::ResponseInput last = BaseInput();
      last.finish_reason = v1::FINISH_REASON_STOP;
      SendFrame(events_->Finish(last, MessagesUsage(choices_[0].usage.value_or(v1::Usage()))));
    }
    evhttp_send_reply_end(req_);
    return Done();
  }
  if (!status.ok()) {
    SendFrame(api::SseFrame(api::ErrorJson(ErrorFor(status))));
  } else if (p_.parsed->include_usage) {
    api::ResponseInput in = BaseInput();
    in.usage = TotalUsage();
    if (p_.chat) in.reasoning_tokens = TotalReasoningTokens();
    SendFrame(api::SseFrame(api::UsageChunkJson(in, p_.chat)));
  }
  SendFrame(std::string(api::kSseDone));
  evhttp_send_reply_end(req_);
  Done();
}

void HttpCall::Done() {
  for (const ChoiceOut& c : choices_) {
    if (c.parser == nullptr) continue;
    const v1::ToolChoice::Mode mode = p_.parsed->request.tool_choice().mode();
    const bool wanted = mode == v1::ToolChoice::MODE_REQUIRED || mode == v1::ToolChoice::MODE_FUNCTION;
    p_.replies->CountChatOutput(static_cast<int>(c.parser->calls().size()),
                                c.parser->rejected_calls(), wanted && c.parser->calls().empty(),
                                c.reasoning_tokens);
  }
  StopKeepalive();
  StopWatchingPeer();
  // evhttp owns the request again (and frees it once the reply went out).
  if (conn_ != nullptr) evhttp_connection_set_closecb(conn_, nullptr, nullptr);
  req_ = nullptr;
  conn_ = nullptr;
  p_.lease.reset();
  {
    absl::MutexLock lock(&mu_);
    closed_ = true;
  }
  std::shared_ptr<HttpCall> keep = std::move(self_);  // may be the last reference
}

void HttpCall::OnClose(evhttp_connection*, void* arg) { static_cast<HttpCall*>(arg)->Closed(); }

void HttpCall::Closed() {
  StopKeepalive();
  StopWatchingPeer();
  // The connection is going away with the reply unfinished. A request that
  // evhttp detached from it (a write failed: the client left) is ours to
  // free; one still attached (the server is shutting down) evhttp frees.
  if (req_ != nullptr && evhttp_request_get_connection(req_) == nullptr) {
    evhttp_request_free(req_);
  }
  req_ = nullptr;
  conn_ = nullptr;
  p_.lease.reset();
  std::function<void()> ready;
  {
    absl::MutexLock lock(&mu_);
    closed_ = true;
    queue_.clear();
    ready = std::move(ready_);
    ready_ = nullptr;
  }
  cancel_.Cancel();
  if (ready != nullptr) ready();  // the request notices (its reads fail now)
  std::shared_ptr<HttpCall> keep = std::move(self_);  // may be the last reference
}

}  // namespace swaserve::router_service
