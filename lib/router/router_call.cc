// Router::Call: one request's asynchronous run. The steps that block briefly (preparation, the decision's
// Redis round trip, media encoding, the bookkeeping between attempts) run on
// the router's control threads; the legs are asynchronous worker calls
// (worker_client.h), whose callbacks carry the request on:
//
//   Begin ─> Attempt ─> StartLegs ─> OnAccepted ─> OnRead ... ─> EndDecode
//   (control  (control)  (control)    (callback)    (callback)    (callback)
//   or media)
//        ^                                                           │
//        └──── AfterAttempt (control) <── LegDone: decode status and ┘
//              retry / migrate / done       prefill result both in
//
// A request holds no thread while it waits for `accepted`, for its prefill
// (which may queue for minutes), for tokens, or for a slow client (the sink's
// OnReady paces the reads). Ownership: each step holds a shared_ptr to the
// Call; the Leg (one attempt's calls) is shared by the callbacks of that
// attempt and destroyed on a control thread once both legs reported.
#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "lib/base/hash.h"
#include "lib/base/logging.h"
#include "lib/router/failure.h"
#include "lib/router/choice_group.h"
#include "lib/router/router.h"
#include "lib/router/router_metrics.h"
#include "lib/router/router_request.h"
#include "lib/router/text_stream.h"
#include "lib/rpc/status_conversion.h"

namespace swaserve::router {
namespace {

std::string CodeLabel(absl::StatusCode code) {
  std::string s = absl::StatusCodeToString(code);
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char ch) {
    return ch == ' ' ? '_' : static_cast<char>(std::tolower(ch));
  });
  return s;
}

// How an attempt ended: OK, or the failure classified (failure.h) with the
// leg and the worker at fault.
struct Outcome {
  absl::Status status;
  FailureKind kind = FailureKind::kWorker;
  std::string leg;            // "prefill" | "decode" (failed attempts)
  std::string worker;         // whose fault, when a worker's
  std::string exclusion_key;  // that worker's incarnation (ExclusionKey)
  bool draining = false;
  // The prefill worker could not fetch a by-reference embedding.
  bool embeddings_unavailable = false;
};

}  // namespace

class Router::Call : public std::enable_shared_from_this<Router::Call> {
 public:
  Call(Router* router, std::shared_ptr<GenerateSink> sink, std::shared_ptr<CancelFlag> cancel,
       GenerateDone done, Caller caller)
      : router_(router), sink_(std::move(sink)), cancel_(std::move(cancel)),
        done_(std::move(done)) {
    r_.caller = std::move(caller);
  }

  // Control thread: checks and prepares the request, then the first attempt.
  void Begin(const v1::GenerateRequest& request, int inflight);

 private:
  struct Leg;
  using LegPtr = std::shared_ptr<Leg>;
  // Control thread: a decision, then the legs (or a wait for a worker).
  void Attempt();
  void StartLegs(const Choice& c);
  // Callbacks of the decode stream.
  void OnAccepted(const LegPtr& leg, bool ok);
  void StartPrefill(const LegPtr& leg);
  void ReadNext(const LegPtr& leg);
  void OnRead(const LegPtr& leg, bool ok);
  // The decode stream will give no more tokens: cancels what is left of
  // the attempt, then FinishDecode.
  void EndDecode(const LegPtr& leg);
  // Asks for the decode stream's status (then LegDone).
  void FinishDecode(const LegPtr& leg);
  // One of the two legs reported (decode status, prefill result); after
  // both, AfterAttempt on a control thread.
  void LegDone(const LegPtr& leg);
  // Control thread: the attempt's outcome; retry, migrate or finish.
  void AfterAttempt(const LegPtr& leg);
  Outcome LegOutcome(Leg& leg);
  Outcome Classify(Leg& leg, const grpc::Status& s, bool self_cancelled, const std::string& which,
                   absl::string_view what);
  // Turns the request into its continuation after its decode worker failed
  // mid-stream: prompt + tokens sent, max_tokens reduced, that worker
  // excluded.
  absl::Status Migrate(const Outcome& o);
  // The last chunk (finish reason, usage) when every token was sent before
  // the decode worker died.
  absl::Status FinishLocally();
  // The request's MTP draft tokens, proposed and accepted, over its legs.
  void SetDraftUsage(v1::Usage* u) const;
  void Complete(absl::Status st);

  // What the request waits for now (a string literal) and since when:
  // ScanStalled reads them from the timer thread.
  void Progress(const char* phase) {
    phase_.store(phase, std::memory_order_relaxed);
    progress_ns_.store(NowNanos(), std::memory_order_relaxed);
    stall_reported_.store(false, std::memory_order_relaxed);
  }
  friend class Router;  // ScanStalled

  Router* const router_;
  std::atomic<const char*> phase_{"starting"};
  std::atomic<int64_t> progress_ns_{NowNanos()};
  std::atomic<bool> stall_reported_{false};
  absl::Mutex id_mu_;
  std::string id_ ABSL_GUARDED_BY(id_mu_);  // r_.id, for ScanStalled's log
  const std::shared_ptr<GenerateSink> sink_;
  const std::shared_ptr<CancelFlag> cancel_;  // may be null
  GenerateDone done_;
  // The request: touched by one step at a time (each step starts the next).
  Request r_;
  int prefill_attempts_ = 0;
  int decode_attempts_ = 0;
  absl::Time worker_wait_until_;
};

// One attempt's two legs. Shared by the attempt's callbacks (each holds a
// reference while it runs, so the calls outlive every callback into them);
// the last reference destroys the calls, possibly on a callback's thread
// (worker_client.h allows that once Finish's callback ran).
struct Router::Call::Leg {
  Choice c;
  std::string transfer_id;
  std::unique_ptr<DecodeCall> stream;
  std::unique_ptr<PrefillCall> pcall;
  // Which calls this router cancelled itself (their CANCELLED is nobody's
  // fault), and whether the client left.
  std::atomic<bool> d_cancelled{false}, p_cancelled{false}, client_left{false};
  std::atomic<bool> accept_timed_out{false};
  uint64_t accept_timer = 0;
  // The reading chain's (one callback at a time).
  v1::DecodeResponse msg;
  bool finished = false;
  bool sink_refused = false;
  bool protocol_error = false;  // the first message was not `accepted`
  grpc::Status dstatus;
  v1::PrefillResponse response;
  absl::Mutex mu;
  bool tokens_seen ABSL_GUARDED_BY(mu) = false;
  // The prefill leg failed before any token: the decode leg is being
  // cancelled, and tokens that still arrive are not passed on.
  bool decode_doomed ABSL_GUARDED_BY(mu) = false;
  bool prefill_started ABSL_GUARDED_BY(mu) = false;
  bool returned ABSL_GUARDED_BY(mu) = false;
  grpc::Status pstatus ABSL_GUARDED_BY(mu);
  // Legs still to report: the decode stream's status, and the prefill's
  // result once it was started.
  int pending ABSL_GUARDED_BY(mu) = 1;

  // Never with `mu` held: a call's callbacks may run inline.
  void CancelDecode() {
    d_cancelled = true;
    stream->Cancel();
  }
  void CancelPrefill() {
    p_cancelled = true;
    pcall->Cancel();
  }
  // Cancels the prefill leg unless it already returned.
  void CancelPrefillIfRunning() {
    bool running;
    {
      absl::MutexLock lock(&mu);
      running = !returned;
    }
    if (running) CancelPrefill();
  }
};

void Router::Call::Begin(const v1::GenerateRequest& request, int inflight) {
  Progress("preparing (tokenization, media)");
  r_.start_ns = NowNanos();
  r_.deadline = router_->options_.request_timeout > absl::ZeroDuration()
                    ? absl::Now() + router_->options_.request_timeout
                    : absl::InfiniteFuture();
  const RouterOptions& o = router_->options_;
  absl::Status st;
  if (o.max_inflight_requests > 0 && inflight > o.max_inflight_requests) {
    router_->metrics_->shed->WithLabels({"inflight"}).Increment();
    st = Overloaded(absl::StrCat("router overloaded: ", o.max_inflight_requests,
                                 " requests in flight"),
                    1.0);
  } else {
    st = router_->Prepare(request, r_);
  }
  if (!st.ok()) return Complete(std::move(st));
  {
    absl::MutexLock lock(&id_mu_);
    id_ = r_.id;
  }
  r_.prompt_tokens = static_cast<uint32_t>(r_.tokens.size());
  uint32_t breakpoint_tokens = 0;
  for (const v1::CachePin& pin : r_.cache_pins) {
    breakpoint_tokens = std::max(breakpoint_tokens, pin.tokens());
  }
  sink_->OnPrompt({.prompt_tokens = r_.prompt_tokens,
                   .opens_reasoning = r_.opens_reasoning,
                   .cache_breakpoint_tokens = breakpoint_tokens});
  r_.max_tokens = r_.sampling.max_tokens();
  r_.text = std::make_unique<TextStream>(
      *o.tokenizer, std::vector<std::string>(r_.sampling.stop().begin(), r_.sampling.stop().end()));
  worker_wait_until_ = std::min(r_.deadline, absl::Now() + o.worker_wait);
  if (r_.media.empty()) return Attempt();
  router_->OnControl([self = shared_from_this()] { self->Attempt(); });  // off the media thread
}

void Router::Call::Attempt() {
  Progress("deciding (Redis)");
  if (cancel_ != nullptr && cancel_->cancelled()) {
    return Complete(absl::CancelledError("client went away"));
  }
  absl::StatusOr<Choice> choice = router_->Decide(r_);
  if (!choice.ok() && absl::IsUnavailable(choice.status()) && absl::Now() < worker_wait_until_) {
    // No worker to send to (the others failed this request, are restarting,
    // or Redis restarted and they have not re-registered yet): wait for one
    // to come back rather than lose the request. A timer, not a thread.
    Progress("waiting for a worker to (re)appear");
    Router* router = router_;
    router_->timers_->Schedule(absl::Now() + absl::Milliseconds(100),
                               [router, self = shared_from_this()] {
                                 router->OnControl([self] { self->Attempt(); });
                               });
    return;
  }
  if (!choice.ok()) return Complete(choice.status());
  worker_wait_until_ = std::min(r_.deadline, absl::Now() + router_->options_.worker_wait);
  StartLegs(*choice);
}

void Router::Call::StartLegs(const Choice& c) {
  Progress("waiting for the decode worker's `accepted`");
  auto leg = std::make_shared<Leg>();
  leg->c = c;
  // Unique per dispatch even when clients reuse request ids (a decode
  // worker refuses a transfer id it has seen recently).
  leg->transfer_id =
      absl::StrFormat("%s/%08x-%d-%d", r_.id, static_cast<uint32_t>(router_->id_salt_),
                      router_->next_id_.fetch_add(1), r_.attempt);
  // Workers key requests by id (scheduling, cancellation): they get the
  // per-dispatch id, which starts with the client's for the logs.
  v1::DecodeRequest dreq;
  dreq.set_request_id(leg->transfer_id);  // also names the KV transfer
  dreq.mutable_prompt_token_ids()->Assign(r_.tokens.begin(), r_.tokens.end());
  *dreq.mutable_sampling() = r_.sampling;
  leg->stream = c.decode->client->StartDecode(dreq, r_.deadline);
  leg->pcall = c.prefill->client->NewPrefill(r_.deadline);
  if (cancel_ != nullptr) {
    cancel_->OnCancel([leg] {
      leg->client_left = true;
      leg->CancelDecode();
      leg->CancelPrefill();
    });
  }
  // The decode worker answers `accepted` at once (it allocates nothing
  // yet): bound that answer by destination_timeout. The timer only posts
  // the cancel (a callback of the cancelled read may run inline).
  Router* router = router_;
  leg->accept_timer = router_->timers_->Schedule(
      absl::Now() + router_->options_.destination_timeout, [router, leg] {
        leg->accept_timed_out = true;
        router->OnControl([leg] { leg->CancelDecode(); });
      });
  leg->stream->Read(&leg->msg,
                    [self = shared_from_this(), leg](bool ok) { self->OnAccepted(leg, ok); });
}

void Router::Call::OnAccepted(const LegPtr& leg, bool ok) {
  Progress("waiting for the first token (the prefill leg runs)");
  router_->timers_->Cancel(leg->accept_timer);
  if (!ok || !leg->msg.has_accepted()) {
    if (ok) {
      // Not this router's cancel (d_cancelled stays false): the worker
      // broke the protocol, which LegOutcome reports as INTERNAL.
      leg->protocol_error = true;
      leg->stream->Cancel();
    }
    return FinishDecode(leg);  // the prefill leg never started
  }
  StartPrefill(leg);
  ReadNext(leg);
}

void Router::Call::StartPrefill(const LegPtr& leg) {
  // Prefill leg, concurrently with reading the token stream: it may queue
  // at the prefill worker as long as the request's deadline allows; the
  // decode stream waits for it without a timer of its own.
  v1::PrefillRequest preq;
  preq.set_request_id(leg->transfer_id);
  preq.set_priority(r_.priority);
  if (r_.page_hash_seed != base::DefaultPageHashSeed()) preq.set_page_hash_seed(r_.page_hash_seed);
  for (const v1::CachePin& pin : r_.cache_pins) *preq.add_cache_pins() = pin;
  preq.mutable_token_ids()->Assign(r_.tokens.begin(), r_.tokens.end());
  for (const v1::MultimodalItem& m : r_.media) *preq.add_multimodal() = m;
  *preq.mutable_sampling() = r_.sampling;
  v1::DecodeTarget* t = preq.mutable_decode();
  t->set_worker_id(leg->c.decode->info.id);
  t->set_grpc_address(leg->c.decode->info.grpc_address);
  t->set_transfer_id(leg->transfer_id);
  {
    absl::MutexLock lock(&leg->mu);
    leg->prefill_started = true;
    ++leg->pending;
  }
  leg->pcall->Start(std::move(preq), &leg->response, [self = shared_from_this(), leg](grpc::Status s) {
    // Without its KV the decode leg would wait for a commit that will not
    // come: cancel it, unless tokens already flow (the commit arrived; the
    // prefill worker may die between committing and answering).
    bool doom = false;
    {
      absl::MutexLock lock(&leg->mu);
      leg->pstatus = std::move(s);
      leg->returned = true;
      doom = !leg->pstatus.ok() && !leg->tokens_seen;
      leg->decode_doomed |= doom;
    }
    if (doom) leg->CancelDecode();
    self->LegDone(leg);
  });
  // Where the prefill stands, for a client waiting on a long prompt: asked
  // of the worker only when the sink asks (the HTTP keep-alive), and only
  // while this leg's prefill runs.
  std::weak_ptr<Leg> weak = leg;
  std::shared_ptr<WorkerClient> client = leg->c.prefill->client;
  const absl::Duration timeout = router_->options_.destination_timeout;
  sink_->SetProgressProbe([weak, client, id = leg->transfer_id, timeout](
                              std::function<void(const v1::PrefillProgress&)> answer) {
    LegPtr l = weak.lock();
    if (l == nullptr) return;
    {
      absl::MutexLock lock(&l->mu);
      if (l->returned) return;
    }
    client->GetPrefillProgress(id, timeout, [answer = std::move(answer)](
                                                grpc::Status s, const v1::PrefillProgress& p) {
      if (s.ok() && p.found()) answer(p);
    });
  });
}

void Router::Call::ReadNext(const LegPtr& leg) {
  leg->stream->Read(&leg->msg,
                    [self = shared_from_this(), leg](bool ok) { self->OnRead(leg, ok); });
}

void Router::Call::OnRead(const LegPtr& leg, bool ok) {
  if (ok && leg->finished) leg->CancelDecode();  // nothing may follow the last chunk
  if (!ok || leg->finished) return EndDecode(leg);
  if (!leg->msg.has_tokens()) return ReadNext(leg);
  const v1::TokenChunk& chunk = leg->msg.tokens();
  if (chunk.token_ids_size() > 0 || chunk.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
    bool doomed;
    {
      absl::MutexLock lock(&leg->mu);
      doomed = leg->decode_doomed;
      leg->tokens_seen = !doomed;
    }
    // The prefill leg failed and cancelled this stream first: these tokens
    // are not passed on (the attempt is retried).
    if (doomed) return EndDecode(leg);
  }
  v1::GenerateResponse out;
  out.set_request_id(r_.id);
  std::string piece;
  for (uint32_t id : chunk.token_ids()) {
    out.add_token_ids(id);
    piece += r_.text->Add(id);
    r_.generated.push_back(id);
  }
  *out.mutable_logprobs() = chunk.logprobs();
  r_.completion_tokens += static_cast<uint32_t>(chunk.token_ids_size());
  r_.leg_draft_tokens = chunk.draft_tokens();
  r_.leg_accepted_draft_tokens = chunk.accepted_draft_tokens();
  const int64_t now = NowNanos();
  if (chunk.token_ids_size() > 0) {
    if (r_.first_token_ns == 0) r_.first_token_ns = now;
    r_.last_token_ns = now;
  }
  if (chunk.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
    piece += r_.text->Finish();
    out.set_finish_reason(chunk.finish_reason());
    if (r_.text->stopped()) out.set_stop_sequence(r_.text->matched_stop());
    v1::Usage* u = out.mutable_usage();
    *u = chunk.usage();  // cached_tokens and the queue wait: as prefill reported them
    u->set_prompt_tokens(r_.prompt_tokens);
    u->set_completion_tokens(r_.completion_tokens);
    // After a migration the last leg's prompt included generated tokens:
    // what it reused of the client's prompt is at most the prompt.
    u->set_cached_tokens(std::min(u->cached_tokens(), r_.prompt_tokens));
    r_.cached_tokens = u->cached_tokens();
    SetDraftUsage(u);
    leg->finished = true;
  }
  out.set_text(std::move(piece));
  if (!sink_->Write(out)) {
    leg->sink_refused = true;
    leg->client_left = true;
    leg->CancelDecode();
    leg->CancelPrefill();
    return EndDecode(leg);
  }
  r_.sent_any = true;
  if (leg->finished) {
    // The prefill answer carries only statistics (the commit, which the
    // stream needed, came before the first token): no wait for it on the
    // answer path; a prefill worker hung after committing must not hold the
    // end of the client's stream.
    leg->CancelPrefillIfRunning();
    // The worker ends the stream after its last chunk: read to its end.
    Progress("finished: waiting for the decode stream's end");
    return ReadNext(leg);
  }
  // The next read once the client has room: a slow client slows its own
  // request, never the router.
  Progress("streaming: waiting for room at the client");
  sink_->OnReady([self = shared_from_this(), leg] {
    self->Progress("streaming: waiting for the decode worker's next tokens");
    self->ReadNext(leg);
  });
}

void Router::Call::EndDecode(const LegPtr& leg) {
  Progress("ending the attempt (waiting for both legs' status)");
  if (!leg->finished && !leg->sink_refused) {
    // A failed decode leg cancels the prefill leg at once (its KV has
    // nowhere to go; the prefill worker keeps it in its prefix cache).
    leg->CancelDecode();
    leg->CancelPrefillIfRunning();
  }
  FinishDecode(leg);
}

void Router::Call::FinishDecode(const LegPtr& leg) {
  leg->stream->Finish([self = shared_from_this(), leg](grpc::Status s) {
    leg->dstatus = std::move(s);
    self->LegDone(leg);
  });
}

void Router::Call::LegDone(const LegPtr& leg) {
  {
    absl::MutexLock lock(&leg->mu);
    if (--leg->pending > 0) return;
  }
  router_->OnControl([self = shared_from_this(), leg] { self->AfterAttempt(leg); });
}

Outcome Router::Call::Classify(Leg& leg, const grpc::Status& s, bool self_cancelled,
                               const std::string& which, absl::string_view what) {
  Outcome o;
  const std::string& worker = which == "prefill" ? leg.c.prefill->info.id : leg.c.decode->info.id;
  std::optional<v1::ErrorDetail> d = rpc::GetErrorDetail(s);
  o.kind = leg.client_left ? FailureKind::kCancelled
                           : ClassifyFailure(rpc::FromGrpcCode(s.error_code()), d, self_cancelled);
  o.leg = which;
  o.worker = worker;
  o.exclusion_key = ExclusionKey(which == "prefill" ? leg.c.prefill->info : leg.c.decode->info);
  o.draining = d && d->code() == v1::ERROR_CODE_DRAINING;
  o.embeddings_unavailable = d && d->code() == v1::ERROR_CODE_EMBEDDINGS_UNAVAILABLE;
  if (o.kind == FailureKind::kCancelled) {
    o.status = absl::CancelledError("client went away");
  } else if (o.kind == FailureKind::kRequest && d) {
    o.status = rpc::ErrorWithDetail(rpc::FromGrpcCode(s.error_code()), d->code(),
                                    s.error_message(), worker, /*retryable=*/false);
  } else {
    o.status = rpc::ErrorWithDetail(
        rpc::FromGrpcCode(s.error_code()),
        o.kind == FailureKind::kOverload ? v1::ERROR_CODE_OVERLOADED : v1::ERROR_CODE_WORKER_LOST,
        absl::StrCat(which, " worker ", worker, what, s.error_message()), worker,
        RetryElsewhere(o.kind));
  }
  return o;
}

Outcome Router::Call::LegOutcome(Leg& leg) {
  const std::string& pid = leg.c.prefill->info.id;
  const std::string& did = leg.c.decode->info.id;
  bool started;
  grpc::Status pstatus;
  {
    absl::MutexLock lock(&leg.mu);
    started = leg.prefill_started;
    pstatus = leg.pstatus;
  }
  if (!started) {
    // The decode worker never accepted: the prefill leg did not start.
    grpc::Status s = leg.dstatus;
    if (s.ok() || leg.protocol_error) {
      s = grpc::Status(grpc::StatusCode::INTERNAL, "no `accepted` first message");
    }
    if (leg.accept_timed_out) {
      s = grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                       absl::StrCat("no answer within ",
                                    absl::FormatDuration(router_->options_.destination_timeout)));
    }
    return Classify(leg, s, leg.d_cancelled && !leg.accept_timed_out, "decode", ": ");
  }
  if (leg.client_left) return Classify(leg, grpc::Status::CANCELLED, true, "decode", "");
  WorkerSource& directory = *router_->options_.directory;
  if (leg.finished) {
    directory.ReportSuccess(did);
    if (pstatus.ok()) {
      directory.ReportSuccess(pid);
    } else if (!(leg.p_cancelled && pstatus.error_code() == grpc::StatusCode::CANCELLED)) {
      // Died after committing: its fault, though the request succeeded.
      const Outcome late = Classify(leg, pstatus, false, "prefill", ": ");
      if (FeedsBreaker(late.kind)) directory.ReportFailure(pid);
    }
    return Outcome{.status = absl::OkStatus()};
  }
  // Failed. Whose fault? A failed prefill call cancels the decode stream;
  // but a prefill that failed to ship KV to a dead decode worker names that
  // worker in its ErrorDetail: then the decode leg is the one to retry.
  std::optional<v1::ErrorDetail> pdetail = rpc::GetErrorDetail(pstatus);
  // Its own failure, unless this router cancelled it (and that is what
  // ended it).
  const bool prefill_failed =
      !pstatus.ok() && !(leg.p_cancelled && pstatus.error_code() == grpc::StatusCode::CANCELLED);
  const bool decode_fault = prefill_failed && pdetail && pdetail->worker_id() == did && did != pid;
  if (prefill_failed && !decode_fault) return Classify(leg, pstatus, false, "prefill", ": ");
  if (decode_fault) return Classify(leg, pstatus, false, "decode", ": ");
  grpc::Status dstatus = leg.dstatus;
  if (dstatus.ok()) dstatus = grpc::Status(grpc::StatusCode::INTERNAL, "stream ended early");
  // CANCELLED that this router asked for because the prefill leg failed was
  // handled above; any other CANCELLED came from the worker (shutdown).
  return Classify(leg, dstatus, leg.d_cancelled && !r_.sent_any && prefill_failed, "decode",
                  r_.sent_any ? " failed mid-stream: " : ": ");
}

void Router::Call::AfterAttempt(const LegPtr& leg) {
  if (cancel_ != nullptr) cancel_->Clear();
  const Outcome o = LegOutcome(*leg);
  absl::Status st = o.status;
  if (st.ok() || !RetryElsewhere(o.kind)) return Complete(std::move(st));
  const RouterOptions& opt = router_->options_;
  if (o.embeddings_unavailable && !r_.media_inline) {
    // A by-reference embedding is gone (evicted, or its encoder died):
    // encode the items again, inline this time, and retry.
    SWA_LOG(warn, "request {}: {}; encoding its media again, inline", r_.id,
            std::string(st.message()));
    router_->OnMedia([self = shared_from_this()] {
      absl::Status s = self->router_->MediaInline(self->r_);
      if (!s.ok()) return self->Complete(std::move(s));
      ++self->r_.attempt;
      self->router_->OnControl([self] { self->Attempt(); });
    });
    return;
  }
  if (FeedsBreaker(o.kind)) opt.directory->ReportFailure(o.worker);
  if (absl::Now() >= r_.deadline) return Complete(std::move(st));
  if (o.leg == "decode" && r_.sent_any) {
    if (r_.migrations >= opt.max_migrations) return Complete(std::move(st));
    // Every token was sent; only the last chunk was lost.
    if (r_.completion_tokens >= r_.max_tokens) return Complete(FinishLocally());
    st = Migrate(o);
    if (!st.ok()) return Complete(std::move(st));
    ++r_.attempt;
    return Attempt();
  }
  const bool more = o.leg == "prefill" ? ++prefill_attempts_ < opt.max_prefill_attempts
                                       : ++decode_attempts_ < opt.max_decode_attempts;
  if (!more) return Complete(std::move(st));
  SWA_LOG(warn, "request {}: {} leg failed ({}: {}), retrying elsewhere", r_.id, o.leg,
          FailureKindName(o.kind), std::string(st.message()));
  router_->metrics_->retries->WithLabels({o.leg}).Increment();
  // An overloaded worker is not excluded (it may have room next time); a
  // faulty one is.
  if (o.kind == FailureKind::kWorker) {
    (o.leg == "prefill" ? r_.excluded_prefill : r_.excluded_decode).insert(o.exclusion_key);
  }
  ++r_.attempt;
  Attempt();
}

absl::Status Router::Call::Migrate(const Outcome& o) {
  // Re-dispatch prompt + every token already sent; the stream continues.
  const std::string reason = o.draining ? "draining" : "worker_lost";
  router_->metrics_->migrations->WithLabels({reason}).Increment();
  Request& r = r_;
  const size_t sent = r.generated.size() - r.generated_in_tokens;
  r.tokens.insert(r.tokens.end(), r.generated.begin() + r.generated_in_tokens, r.generated.end());
  r.generated_in_tokens = r.generated.size();
  // A constrained output continues where it stood.
  if (r.sampling.has_constraint()) {
    r.sampling.mutable_constraint()->mutable_generated_token_ids()->Assign(r.generated.begin(),
                                                                          r.generated.end());
  }
  r.hash_page_size = 0;  // recompute the page hashes of the longer prompt
  r.sampling.set_max_tokens(r.max_tokens - r.completion_tokens);
  r.excluded_decode.insert(o.exclusion_key);
  ++r.migrations;
  // The dead leg's drafts count up to its last chunk.
  r.draft_tokens_before += r.leg_draft_tokens;
  r.accepted_draft_tokens_before += r.leg_accepted_draft_tokens;
  r.leg_draft_tokens = 0;
  r.leg_accepted_draft_tokens = 0;
  SWA_LOG(warn, "request {}: decode worker {} {} after {} tokens; migrating ({} tokens re-sent)",
          r.id, o.worker, o.draining ? "is draining" : "failed", r.completion_tokens, sent);
  absl::StatusOr<int> bucket =
      BucketFor(static_cast<int64_t>(r.tokens.size()), router_->options_.policy);
  if (!bucket.ok()) {
    return rpc::ErrorWithDetail(absl::StatusCode::kUnavailable, v1::ERROR_CODE_WORKER_LOST,
                                absl::StrCat("decode worker ", o.worker,
                                             " failed mid-stream and the continued prompt (",
                                             r.tokens.size(), " tokens) fits no bucket"),
                                o.worker, false);
  }
  r.bucket = *bucket;
  return absl::OkStatus();
}

void Router::Call::SetDraftUsage(v1::Usage* u) const {
  u->set_draft_tokens(r_.draft_tokens_before + r_.leg_draft_tokens);
  u->set_accepted_draft_tokens(r_.accepted_draft_tokens_before + r_.leg_accepted_draft_tokens);
}

absl::Status Router::Call::FinishLocally() {
  v1::GenerateResponse out;
  out.set_request_id(r_.id);
  out.set_text(r_.text->Finish());
  out.set_finish_reason(v1::FINISH_REASON_LENGTH);
  v1::Usage* u = out.mutable_usage();
  u->set_prompt_tokens(r_.prompt_tokens);
  u->set_completion_tokens(r_.completion_tokens);
  u->set_cached_tokens(r_.cached_tokens);
  SetDraftUsage(u);
  if (!sink_->Write(out)) return absl::CancelledError("client went away");
  return absl::OkStatus();
}

void Router::Call::Complete(absl::Status st) {
  Metrics& m = *router_->metrics_;
  // The gauge first: a scrape that sees the request counted as ended must
  // not also see it in flight (one that comes in between sees neither).
  m.inflight->Decrement();
  m.requests->WithLabels({CodeLabel(st.code())}).Increment();
  if (st.ok()) {
    const Request& r = r_;
    const int64_t end = NowNanos();
    m.e2e->WithLabels({r.bucket_label}).Observe(static_cast<double>(end - r.start_ns) * 1e-9);
    if (r.first_token_ns > 0) {
      m.ttft->WithLabels({r.bucket_label})
          .Observe(static_cast<double>(r.first_token_ns - r.start_ns) * 1e-9);
    }
    if (r.completion_tokens > 1) {
      m.tpot->WithLabels({r.bucket_label})
          .Observe(static_cast<double>(r.last_token_ns - r.first_token_ns) * 1e-9 /
                   (r.completion_tokens - 1));
    }
    m.prompt_tokens->WithLabels({r.bucket_label}).Increment(static_cast<double>(r.prompt_tokens));
    m.cached_tokens->WithLabels({r.bucket_label}).Increment(r.cached_tokens);
    m.generated_tokens->Increment(r.completion_tokens);
  }
  {
    absl::MutexLock lock(&router_->live_mu_);
    router_->live_.erase(this);
  }
  // Before `done`: its caller may destroy the router once it ran (~Router
  // joins the media and control threads, on one of which this runs).
  {
    absl::MutexLock lock(&router_->idle_mu_);
    router_->inflight_.fetch_sub(1);
  }
  GenerateDone done = std::move(done_);
  done(std::move(st));
}

void Router::Start(const v1::GenerateRequest& request, std::shared_ptr<GenerateSink> sink,
                   std::shared_ptr<CancelFlag> cancel, GenerateDone done, Caller caller) {
  if (request.n() <= 1) {
    return StartOne(request, std::move(sink), std::move(cancel), std::move(done),
                    std::move(caller));
  }
  if (request.n() > options_.max_choices) {
    absl::Status st = rpc::ErrorWithDetail(
        absl::StatusCode::kInvalidArgument, v1::ERROR_CODE_INVALID_REQUEST,
        absl::StrCat("n is ", request.n(), "; at most ", options_.max_choices,
                     " choices are served per request"));
    OnControl([done = std::move(done), st]() mutable { done(std::move(st)); });
    return;
  }
  v1::GenerateRequest group = request;
  if (group.request_id().empty()) {
    group.set_request_id(
        absl::StrFormat("req-%08x-%d", static_cast<uint32_t>(id_salt_), next_id_++));
  }
  StartChoiceGroup(group, std::move(sink), std::move(cancel), std::move(done),
                   [this, caller](const v1::GenerateRequest& one, std::shared_ptr<GenerateSink> s,
                                  std::shared_ptr<CancelFlag> c, GenerateDone d) {
                     StartOne(one, std::move(s), std::move(c), std::move(d), caller);
                   });
}

void Router::StartOne(const v1::GenerateRequest& request, std::shared_ptr<GenerateSink> sink,
                      std::shared_ptr<CancelFlag> cancel, GenerateDone done, Caller caller) {
  const int inflight = inflight_.fetch_add(1) + 1;
  metrics_->inflight->Increment();
  auto call = std::make_shared<Call>(this, std::move(sink), std::move(cancel), std::move(done),
                                     std::move(caller));
  {
    absl::MutexLock lock(&live_mu_);
    live_[call.get()] = call;
  }
  // A request with multimodal items prepares on a media thread (its items
  // may take seconds to fetch and encode); its attempts run on the control
  // threads like any other.
  auto begin = [call, request, inflight] { call->Begin(request, inflight); };
  if (request.multimodal_size() > 0) {
    OnMedia(std::move(begin));
  } else {
    OnControl(std::move(begin));
  }
}

absl::Status Router::Generate(const v1::GenerateRequest& request, GenerateSink& sink,
                              CancelFlag* cancel, Caller caller) {
  // Non-owning: the caller keeps both until Start's `done` ran.
  std::shared_ptr<GenerateSink> s(&sink, [](GenerateSink*) {});
  std::shared_ptr<CancelFlag> c(cancel, [](CancelFlag*) {});
  absl::Notification finished;
  absl::Status out;
  Start(request, std::move(s), cancel != nullptr ? std::move(c) : nullptr,
        [&](absl::Status st) {
          out = std::move(st);
          finished.Notify();
        },
        std::move(caller));
  finished.WaitForNotification();
  return out;
}

void Router::ScanStalled() {
  const int64_t now = NowNanos();
  const int64_t limit = absl::ToInt64Nanoseconds(options_.stall_report_after);
  int64_t stalled = 0;
  std::vector<std::shared_ptr<Call>> report;
  {
    absl::MutexLock lock(&live_mu_);
    for (auto& [raw, weak] : live_) {
      std::shared_ptr<Call> c = weak.lock();
      if (c == nullptr || now - c->progress_ns_.load(std::memory_order_relaxed) < limit) continue;
      ++stalled;
      if (!c->stall_reported_.exchange(true)) report.push_back(std::move(c));
    }
  }
  metrics_->stalled->Set(static_cast<double>(stalled));
  for (const std::shared_ptr<Call>& c : report) {
    std::string id;
    {
      absl::MutexLock lock(&c->id_mu_);
      id = c->id_;
    }
    SWA_LOG(warn, "request {} has made no progress for {:.1f} s: {}", id.empty() ? "?" : id,
            static_cast<double>(now - c->progress_ns_.load()) * 1e-9,
            c->phase_.load(std::memory_order_relaxed));
  }
  timers_->Schedule(absl::Now() + StallScanInterval(), [this] { ScanStalled(); });
}

bool Router::WaitIdle(absl::Duration timeout) {
  absl::MutexLock lock(&idle_mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(idle_mu_) { return inflight_.load() == 0; };
  return idle_mu_.AwaitWithTimeout(absl::Condition(&idle), timeout);
}

}  // namespace swaserve::router
