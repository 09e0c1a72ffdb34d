// HttpCall: one HTTP generate request (POST /v1/completions,
// /v1/chat/completions or /v1/messages) between router::Router, which writes
// its output from the router's threads (a GenerateSink), and the event loop
// of the request's connection (libevent evhttp), which renders it (OpenAI
// JSON or SSE chunks; Anthropic's message or event stream) into the socket.
//
//   router threads: Write / OnReady / Finish  ──queue + event_base_once──>
//   loop thread:    Drain: first event decides the status; SSE chunks out;
//                   OnReady's callback once < 64 responses wait and the
//                   socket holds < 1 MiB unsent (a slow client paces its
//                   own request); the reply ends after Finish.
//
// A connection closed by the client (evhttp's close callback) cancels the
// request and wakes a pending OnReady callback, so the request notices.
// Before that, while the reply is pending, an EV_CLOSED event on the
// connection sees the client's FIN at once (evhttp reads nothing then and
// would notice only at a failed write) and cancels the request too.
//
// Ownership: shared. The call keeps itself alive (self_) until its reply
// ended or its connection closed; the router holds it (sink, cancel flag,
// done callback) until the request ended. libevent objects are touched only
// on the loop thread, and only while the reply is open.
// Thread-safety: the GenerateSink side and Finish from any thread; the rest
// on the loop thread.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "lib/api/anthropic.h"
#include "lib/api/anthropic_response.h"
#include "lib/api/api_keys.h"
#include "lib/api/openai.h"
#include "lib/model/chat_output_parser.h"
#include "lib/router/progress_watch.h"
#include "lib/router/router.h"
#include "swaserve/v1/router.pb.h"

struct evhttp_request;
struct evhttp_connection;
struct event_base;
struct event;

namespace swaserve::router_service {

// The error a failed Generate gets over HTTP. A prompt too long for every
// bucket, or too large for every worker's KV memory, is 413,
// not OpenAI's 400.
api::ApiError ErrorFor(const absl::Status& s);

// What the HTTP service does for a call, on the loop thread: whole replies
// (counted in swaserve_router_http_requests_total) and the count of a
// streamed reply.
class HttpReplies {
 public:
  virtual ~HttpReplies() = default;
  virtual void Reply(evhttp_request* req, const std::string& path, int status, std::string body) = 0;
  virtual void ReplyError(evhttp_request* req, const std::string& path, const api::ApiError& e) = 0;
  virtual void Count(const std::string& path, int status) = 0;
  // A chat reply's output, once it ended: tool calls parsed, call blocks
  // returned as text, whether tool_choice wanted a call and none came,
  // tokens inside the reasoning block.
  virtual void CountChatOutput(int tool_calls, int rejected_calls, bool wanted_call_missing,
                               uint32_t reasoning_tokens) = 0;
};

class HttpCall final : public router::GenerateSink, public std::enable_shared_from_this<HttpCall> {
 public:
  struct Params {
    evhttp_request* req = nullptr;
    event_base* base = nullptr;
    HttpReplies* replies = nullptr;
    std::shared_ptr<const api::ParsedRequest> parsed;
    std::string id;
    int64_t created = 0;
    bool chat = false;
    // Held until the reply ended or the connection closed (per-key
    // concurrency): released on the loop then, not when the router lets go
    // of the call (a client may send its next request at once).
    std::shared_ptr<api::ConcurrencyLimiter::Lease> lease;
    std::function<std::string(uint32_t)> token_text;
    // A streamed request with no event for this long starts its stream
    // (200, text/event-stream) and then sends an SSE comment line
    // (": waiting for the first token, 45s") this often until its first
    // event: clients' header and idle timeouts (Node's fetch: 300 s; the
    // openai package: 10 min until the headers, retried twice) never cut a
    // long prompt's prefill, and the client sees that the request lives.
    // An error after that travels in the stream (an error event). Each
    // comment says where the prefill stands (queued, tokens done of the
    // prompt, shipping: api::WaitingComment), as the prefill worker answered
    // a probe sent router::PrefillProgressWatch::Lead() before it (a
    // quarter of this, at most 2 s;
    // no progress only when the worker has not answered by then). Zero: off.
    absl::Duration stream_keepalive = absl::ZeroDuration();
    // A NON-streamed request with no answer for this long starts its reply
    // (200, application/json, chunked) and then sends one whitespace byte
    // ("\n") this often until its body, which follows as the last chunk:
    // JSON allows whitespace before a value, so every JSON parser (the
    // openai package's response.json(), Python's json) reads the body as
    // usual, while the client's header timeout (the openai package: 10 min,
    // then a retry; Node's fetch: 300 s) and proxies' idle timeouts no
    // longer cut a prefill that takes longer. An error after that travels
    // in the body ({"error": ...}) with the 200 already sent, as a streamed
    // request's does in its stream; the router's
    // swaserve_router_requests_total{code} still counts it as an error.
    // Zero: off (every reply waits for its outcome, status code included).
    absl::Duration nonstream_keepalive = absl::ZeroDuration();
    // The served template's tool-call format and reasoning tags (chat
    // requests' output is split by them: model::ChatOutputParser). Not
    // owned; null: no splitting.
    const model::ChatFormat* chat_format = nullptr;
  };
  // Responses waiting for the loop, and unsent bytes in the socket's
  // buffer, beyond which the request waits (OnReady).
  static constexpr size_t kMaxQueued = 64;
  static constexpr size_t kMaxUnsentBytes = size_t{1} << 20;

  // Loop thread: a call for `p.req`, watching its connection.
  static std::shared_ptr<HttpCall> Begin(Params p);
  ~HttpCall() override;

  // Router side (any thread).
  bool Write(const v1::GenerateResponse& response) override;
  void OnReady(std::function<void()> ready) override;
  // Kept for the keep-alive comments (watch_): probed a lead before each
  // one, which then says where the prefill stood.
  void SetProgressProbe(ProgressProbe probe) override;
  // Whether the output starts inside a reasoning block.
  void OnPrompt(const router::PromptInfo& info) override;
  void Finish(absl::Status status);
  router::CancelFlag& cancel_flag() { return cancel_; }

 private:
  explicit HttpCall(Params p);
  // Schedules Drain on the loop (once until it ran).
  void Notify() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static void OnNotify(int fd, short what, void* arg);
  static void OnClose(evhttp_connection* conn, void* arg);
  static void OnChunkSent(evhttp_connection* conn, void* arg);
  static void OnKeepalive(int fd, short what, void* arg);
  void ArmKeepalive();
  // Watches the connection for the client's close while the reply is
  // pending (OnPeerClosed cancels the request); stopped by Done / Closed.
  void WatchPeerClose();
  void StopWatchingPeer();
  static void OnPeerClosed(int fd, short what, void* arg);
  void StopKeepalive();
  // Loop thread.
  void Drain();
  void Emit(const v1::GenerateResponse& item);
  // A chat request's output parser for a choice, made at its first output.
  model::ChatOutputParser& Parser(uint32_t index);
  // A streamed item's chunks: its text (and logprobs), each tool-call
  // delta, the finish reason on the last.
  void EmitChunks(const v1::GenerateResponse& item, model::ChatOutputDelta delta);
  // The request's usage: the prompt's (the first choice's prefill) and every
  // choice's completion tokens.
  std::optional<v1::Usage> TotalUsage() const;
  uint32_t TotalReasoningTokens() const;
  // The same for a Messages API stream: content-block events.
  void EmitEvents(const v1::GenerateResponse& item, model::ChatOutputDelta delta);
  // The Messages API's usage of the finished request.
  api::MessagesUsage MessagesUsage(const v1::Usage& usage) const;
  // The non-streamed reply's body.
  std::string WholeBody() const;
  void End(const absl::Status& status);
  // The reply's 200 and headers, before its body is known: a stream
  // ("text/event-stream"), or a JSON body after whitespace.
  void StartReply(const char* content_type);
  void SendFrame(const std::string& frame);
  void MaybeReady();
  void Closed();
  // The reply is over: stops watching the connection, lets go of self_.
  void Done();
  api::ResponseInput BaseInput() const;
  const std::string& path() const;

  Params p_;  // p_.lease is released by Done / Closed
  router::CancelFlag cancel_;
  // Loop thread only.
  evhttp_request* req_;
  evhttp_connection* conn_ = nullptr;
  std::shared_ptr<HttpCall> self_;
  bool started_ = false;  // reply begun (200 sent): a stream, or a JSON body's whitespace
  bool emitted_ = false;  // a response item went out (keep-alives stop)
  event* keepalive_ = nullptr;  // the keep-alive timer, while armed
  event* peer_closed_ = nullptr;  // EV_CLOSED on the connection, while watched
  int keepalives_ = 0;
  bool probe_phase_ = true;  // the timer's next phase: probe, else comment
  // One per choice (GenerateRequest.n; one for n <= 1), by index.
  struct ChoiceOut {
    bool first_chunk = true;
    size_t offset = 0;  // completion text bytes sent (logprobs' text_offset)
    std::optional<v1::Usage> usage;
    api::ResponseInput whole;  // a non-streamed reply, accumulated
    // Chat requests: content, reasoning and tool calls split off the text.
    std::unique_ptr<model::ChatOutputParser> parser;
    // Tokens of items that began inside the reasoning block.
    uint32_t reasoning_tokens = 0;
  };
  std::vector<ChoiceOut> choices_;
  router::PromptInfo prompt_seen_;  // copied from prompt_ by Drain
  // Messages API streams: the event encoder (null for the OpenAI API).
  std::unique_ptr<api::MessagesStream> events_;

  absl::Mutex mu_;
  std::deque<v1::GenerateResponse> queue_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;  // connection closed or reply over
  bool notify_pending_ ABSL_GUARDED_BY(mu_) = false;
  // The socket holds kMaxUnsentBytes or more not yet sent (a slow client).
  bool backlogged_ ABSL_GUARDED_BY(mu_) = false;
  std::function<void()> ready_ ABSL_GUARDED_BY(mu_);
  router::PromptInfo prompt_ ABSL_GUARDED_BY(mu_);
  // The router's probe of the current prefill leg and the worker's last
  // answer (thread-safe itself).
  router::PrefillProgressWatch watch_;
};

}  // namespace swaserve::router_service
