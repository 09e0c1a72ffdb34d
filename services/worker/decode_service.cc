#include "services/worker/decode_service.h"

#include <atomic>
#include <deque>
#include <random>

#include "absl/strings/str_cat.h"
#include "lib/base/clock.h"
#include "lib/base/logging.h"
#include "lib/base/status.h"
#include "lib/metrics/buckets.h"
#include "lib/rpc/status_conversion.h"
#include "lib/transfer/kv_destination.h"
#include "lib/worker/kv_staging.h"
#include "lib/worker/staging_budget.h"
#include "services/worker/convert.h"

namespace swaserve::worker_service {

struct DecodeService::Shared {
  DecodeServiceOptions options;
  kv::KvShape shape;
  absl::Mutex mu;
  // Decode calls waiting for their KV, by transfer id (from the stream's
  // start until it ends).
  struct Pending;
  absl::flat_hash_map<std::string, std::shared_ptr<Pending>> pending ABSL_GUARDED_BY(mu);
  std::unique_ptr<worker::StagingBudget> budget;
  std::atomic<bool> draining{false};
  std::mt19937_64 seeds ABSL_GUARDED_BY(mu){std::random_device{}()};
  metrics::Histogram* ttft = nullptr;
  metrics::Histogram* tpot = nullptr;
  metrics::Histogram* wait_commit = nullptr;
  metrics::Counter* streams_ok = nullptr;
  metrics::Counter* streams_failed = nullptr;
  metrics::Counter* streams_cancelled = nullptr;
  metrics::Counter* staging_fallback = nullptr;
  metrics::Counter* staging_waits = nullptr;

  // The staging arena (null: none) and the registration of its memory (the
  // arena keeps it alive too; this is what transfers name).
  std::shared_ptr<transfer::Registration> arena_registration;
  std::shared_ptr<worker::StagingArena> arena;
  // Arena stagings whose transfer failed, out of use until `until_ns`
  // (deadlines in order: the quarantine is one fixed duration).
  struct Quarantined {
    int64_t until_ns = 0;
    std::unique_ptr<worker::KvStaging> staging;
  };
  std::deque<Quarantined> quarantine ABSL_GUARDED_BY(mu);
  std::atomic<size_t> quarantined_bytes{0};

  uint64_t NextSeed() {
    absl::MutexLock lock(&mu);
    return seeds();
  }

  void Quarantine(std::unique_ptr<worker::KvStaging> staging) {
    quarantined_bytes += staging->arena_block_bytes();
    absl::MutexLock lock(&mu);
    quarantine.push_back(
        {base::MonotonicNanos() + absl::ToInt64Nanoseconds(options.staging_quarantine),
         std::move(staging)});
  }

  // Returns quarantined blocks whose time is up to the arena.
  void ReleaseQuarantined() {
    std::vector<std::unique_ptr<worker::KvStaging>> done;
    {
      absl::MutexLock lock(&mu);
      const int64_t now = base::MonotonicNanos();
      while (!quarantine.empty() && quarantine.front().until_ns <= now) {
        done.push_back(std::move(quarantine.front().staging));
        quarantine.pop_front();
      }
    }
    for (const auto& d : done) quarantined_bytes -= d->arena_block_bytes();
  }  // `done` returns the blocks here, outside mu
};

namespace {

using Shared = DecodeService::Shared;

constexpr char kArenaBytesMetric[] = "swaserve_decode_staging_arena_bytes";
constexpr char kBudgetBytesMetric[] = "swaserve_decode_staging_budget_bytes";

// The stream's state shared with transfer and token callbacks, which may
// outlive the reactor.
class DecodeStream;
struct StreamState {
  absl::Mutex mu;
  DecodeStream* reactor ABSL_GUARDED_BY(mu) = nullptr;
  std::deque<v1::DecodeResponse> queue ABSL_GUARDED_BY(mu);
  bool writing ABSL_GUARDED_BY(mu) = false;
  bool finish_pending ABSL_GUARDED_BY(mu) = false;
  bool finished ABSL_GUARDED_BY(mu) = false;
  grpc::Status final_status ABSL_GUARDED_BY(mu);
  bool transfer_pending ABSL_GUARDED_BY(mu) = false;
  bool cancelled ABSL_GUARDED_BY(mu) = false;
  std::string request_id, transfer_id;
  bool want_logprobs = false;
  int64_t start_ns = 0;
  int64_t last_token_ns = 0;  // decode loop thread only
  // From the commit (set before the job is submitted); < 0: unknown.
  double prefill_queue_seconds = -1;

  // Queues a response; with `last`, the stream then finishes with `status`.
  void Push(std::optional<v1::DecodeResponse> response, bool last, grpc::Status status);
  // Starts the next write or the finish (called with mu held; the actual
  // gRPC call happens after unlocking, in Pump).
  void Pump();
};

// The GetKvDestination call of a prefill worker, answered when the staging
// budget grants its bytes. Shared with the grant callback and the stream,
// which may outlive the reactor (OnDone clears it).
struct DestinationCall {
  absl::Mutex mu;
  grpc::ServerUnaryReactor* reactor ABSL_GUARDED_BY(mu) = nullptr;
  v1::KvDestination* response ABSL_GUARDED_BY(mu) = nullptr;
  bool finished ABSL_GUARDED_BY(mu) = false;

  // Finishes the call once; false if it had already finished (or is gone).
  bool Finish(const absl::StatusOr<v1::KvDestination>& dest) {
    absl::MutexLock lock(&mu);
    if (finished || reactor == nullptr) return false;
    finished = true;
    if (dest.ok()) *response = *dest;
    reactor->Finish(dest.ok() ? grpc::Status::OK : rpc::ToGrpcStatus(dest.status()));
    return true;
  }
};

}  // namespace

struct DecodeService::Shared::Pending {
  std::shared_ptr<StreamState> state;
  transfer::KvStagingPlan plan;
  worker::StagedKvLayout layout;
  worker::DecodeJob job;  // moved out by the transfer callback
  // Guarded by Shared::mu.
  bool acquiring = false;  // a GetKvDestination waits for the budget
  std::optional<v1::KvDestination> destination;
  std::shared_ptr<DestinationCall> call;
};

namespace {

using Pending = Shared::Pending;

// Drops a transfer id's pending entry: a GetKvDestination still waiting for
// the budget leaves the line and is answered NOT_FOUND with `why`.
void ForgetPending(Shared& shared, const std::string& transfer_id, absl::string_view why) {
  std::shared_ptr<DestinationCall> call;
  // Released outside the lock: its staging's budget reservation may grant
  // a waiter, whose callback takes shared.mu.
  std::shared_ptr<Pending> gone;
  {
    absl::MutexLock lock(&shared.mu);
    auto it = shared.pending.find(transfer_id);
    if (it == shared.pending.end()) return;
    gone = std::move(it->second);
    call = std::move(gone->call);
    shared.pending.erase(it);
  }
  if (call != nullptr) {
    shared.budget->Cancel(transfer_id);
    call->Finish(absl::NotFoundError(absl::StrCat("transfer ", transfer_id, ": ", why)));
  }
}

void OnTransferDone(const std::shared_ptr<Shared>& shared, const std::shared_ptr<Pending>& pending,
                    std::unique_ptr<transfer::Registration> reg, int64_t t0,
                    absl::StatusOr<transfer::ReceivedTransfer> got);

// Allocates `pending`'s staging (an arena block if there is room, else heap
// memory registered for this request), covered by `reservation`, and arms
// the transfer (its timeout counts from now: the KV is about to ship).
absl::StatusOr<v1::KvDestination> Stage(const std::shared_ptr<Shared>& shared,
                                        const std::shared_ptr<Pending>& pending,
                                        const std::string& transfer_id,
                                        std::unique_ptr<worker::StagingBudget::Reservation> reservation) {
  const DecodeServiceOptions& o = shared->options;
  std::unique_ptr<worker::KvStaging> staging;
  if (shared->arena != nullptr) {
    shared->ReleaseQuarantined();
    absl::StatusOr<std::unique_ptr<worker::KvStaging>> in =
        worker::KvStaging::CreateIn(pending->layout, shared->arena);
    if (in.ok()) {
      staging = *std::move(in);
    } else if (in.status().code() == absl::StatusCode::kResourceExhausted) {
      if (shared->staging_fallback != nullptr) shared->staging_fallback->Increment();
      SWA_LOG(debug, "transfer {}: {}; staging in heap memory", transfer_id,
              std::string(in.status().message()));
    } else {
      return in.status();
    }
  }
  std::unique_ptr<transfer::Registration> reg;
  if (staging == nullptr) {
    ASSIGN_OR_RETURN(staging, worker::KvStaging::Create(pending->layout));
    ASSIGN_OR_RETURN(reg, o.transfer->Register(staging->data(), staging->size()));
  }
  if (staging->size() != pending->plan.total_bytes()) {
    return absl::InternalError("KV staging and transfer plan disagree on the size");
  }
  staging->set_reservation(std::move(reservation));
  transfer::KvReceiveOptions ro;
  ro.transfer_id = transfer_id;
  ro.shape = shared->shape;
  ro.num_tokens = static_cast<int>(pending->job.prompt.size());
  ro.swa_slack = 0;
  ro.staging = reg != nullptr ? reg.get() : shared->arena_registration.get();
  ro.offset = staging->arena_offset();
  ro.timeout = o.commit_timeout;
  pending->job.staging = std::move(staging);
  {
    absl::MutexLock lock(&pending->state->mu);
    pending->state->transfer_pending = true;
  }
  const int64_t t0 = base::MonotonicNanos();
  // The callback owns the registration (heap staging) until UCX is done.
  auto reg_holder = std::make_shared<std::unique_ptr<transfer::Registration>>(std::move(reg));
  absl::StatusOr<v1::KvDestination> dest = transfer::ExpectKvTransfer(
      *o.transfer, ro,
      [shared, pending, reg_holder, t0](absl::StatusOr<transfer::ReceivedTransfer> got) {
        OnTransferDone(shared, pending, std::move(*reg_holder), t0, std::move(got));
      });
  if (!dest.ok()) {
    absl::MutexLock lock(&pending->state->mu);
    pending->state->transfer_pending = false;
    pending->job.staging.reset();
  }
  return dest;
}

class DecodeStream final : public grpc::ServerWriteReactor<v1::DecodeResponse> {
 public:
  DecodeStream(std::shared_ptr<Shared> shared, grpc::CallbackServerContext* context,
               const v1::DecodeRequest* request)
      : shared_(std::move(shared)), state_(std::make_shared<StreamState>()) {
    {
      absl::MutexLock lock(&state_->mu);
      state_->reactor = this;
    }
    state_->request_id = request->request_id();
    state_->transfer_id = request->transfer_id();
    state_->start_ns = base::MonotonicNanos();
    absl::Status st = Start(*request);
    if (!st.ok()) state_->Push(std::nullopt, true, rpc::ToGrpcStatus(st));
  }

  void OnWriteDone(bool ok) override {
    {
      absl::MutexLock lock(&state_->mu);
      if (!state_->queue.empty()) state_->queue.pop_front();
      state_->writing = false;
      if (!ok && !state_->finish_pending) {
        state_->finish_pending = true;
        state_->final_status = grpc::Status(grpc::StatusCode::CANCELLED, "client went away");
      }
    }
    state_->Pump();
  }

  void OnCancel() override {
    bool transfer_pending;
    {
      absl::MutexLock lock(&state_->mu);
      state_->cancelled = true;
      transfer_pending = state_->transfer_pending;
    }
    if (transfer_pending) {
      (void)shared_->options.transfer->CancelReceive(state_->transfer_id);
    }
    ForgetPending(*shared_, state_->transfer_id, "the decode stream was cancelled");
    // After `cancelled` is set: a transfer callback that submits later sees
    // it and cancels what it submitted (Stage), so no request runs unheard.
    shared_->options.core->Cancel(state_->request_id);
    state_->Push(std::nullopt, true, grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
  }

  void OnDone() override {
    {
      absl::MutexLock lock(&state_->mu);
      state_->reactor = nullptr;
    }
    ForgetPending(*shared_, state_->transfer_id, "the decode stream ended");
    delete this;
  }

  // gRPC calls, made by StreamState::Pump without its lock held.
  void DoWrite(const v1::DecodeResponse* r) { StartWrite(r); }
  void DoFinish(const grpc::Status& s) { Finish(s); }

 private:
  absl::Status Start(const v1::DecodeRequest& req) {
    const DecodeServiceOptions& o = shared_->options;
    if (shared_->draining.load()) {
      return rpc::ErrorWithDetail(absl::StatusCode::kUnavailable, v1::ERROR_CODE_DRAINING,
                                  absl::StrCat("decode worker ", o.worker_id, " is draining"),
                                  o.worker_id, /*retryable=*/true);
    }
    if (req.transfer_id().empty()) return absl::InvalidArgumentError("transfer_id is required");
    if (req.prompt_token_ids().empty()) {
      return absl::InvalidArgumentError("prompt_token_ids is required");
    }
    const int n = req.prompt_token_ids_size();
    ASSIGN_OR_RETURN(model::SamplingOptions sampling,
                     ToSamplingOptions(req.sampling(), shared_->NextSeed()));
    ASSIGN_OR_RETURN(worker::StopOptions stop,
                     ToStopOptions(req.sampling(), o.default_max_tokens, o.max_max_tokens,
                                   o.eos_ids));
    state_->want_logprobs = req.sampling().logprobs();
    // Requests that could never run here fail now, before any prefill
    // compute: the prompt plus its first token must fit the pools, and its
    // staging the budget. Request errors: no breaker counts them.
    const int ps = shared_->shape.page_size;
    const int64_t pages = (static_cast<int64_t>(n) + 1 + ps - 1) / ps;
    if (pages > o.pools->full().num_pages()) {
      return rpc::ErrorWithDetail(
          absl::StatusCode::kResourceExhausted, v1::ERROR_CODE_TOO_LARGE_FOR_WORKER,
          absl::StrCat("prompt of ", n, " tokens needs ", pages,
                       " full KV pages; decode worker ", o.worker_id, " has ",
                       o.pools->full().num_pages()),
          o.worker_id, /*retryable=*/false);
    }
    auto pending = std::make_shared<Pending>();
    pending->state = state_;
    ASSIGN_OR_RETURN(pending->plan, transfer::PlanStaging(shared_->shape, n, 0));
    pending->layout = worker::StagedKvLayout::For(shared_->shape, n, pending->plan.first_swa_token);
    if (pending->layout.total_bytes() > shared_->budget->capacity()) {
      return rpc::ErrorWithDetail(
          absl::StatusCode::kResourceExhausted, v1::ERROR_CODE_TOO_LARGE_FOR_WORKER,
          absl::StrCat("prompt of ", n, " tokens needs ", pending->layout.total_bytes() >> 20,
                       " MiB of KV staging; decode worker ", o.worker_id,
                       "'s staging budget is ", shared_->budget->capacity() >> 20, " MiB"),
          o.worker_id, /*retryable=*/false);
    }
    pending->job.id = req.request_id();
    pending->job.prompt.assign(req.prompt_token_ids().begin(), req.prompt_token_ids().end());
    pending->job.sampling = sampling;
    pending->job.stop = std::move(stop);
    {
      absl::MutexLock lock(&shared_->mu);
      if (!shared_->pending.emplace(req.transfer_id(), pending).second) {
        return absl::AlreadyExistsError(
            absl::StrCat("transfer ", req.transfer_id(), " is already pending here"));
      }
    }
    // No memory yet: staging is allocated when prefill is about to ship
    // (GetKvDestination), so the wait for the prefill leg costs nothing
    // here and is bounded by the router keeping this stream open.
    v1::DecodeResponse first;
    first.mutable_accepted()->set_worker_id(o.worker_id);
    state_->Push(std::move(first), false, grpc::Status::OK);
    return absl::OkStatus();
  }

  // The core's token events, turned into stream messages (public for the
  // transfer callback, which installs it as the job's sink).
 public:
  static void OnTokens(StreamState& state, Shared& shared, const worker::TokenEvent& e) {
    const int64_t now = base::MonotonicNanos();
    if (!e.tokens.empty()) {
      if (state.last_token_ns == 0) {
        if (shared.ttft != nullptr) shared.ttft->Observe(static_cast<double>(now - state.start_ns) * 1e-9);
      } else if (shared.tpot != nullptr) {
        shared.tpot->Observe(static_cast<double>(now - state.last_token_ns) * 1e-9 /
                             static_cast<double>(e.tokens.size()));
      }
      state.last_token_ns = now;
    }
    if (e.finish == worker::FinishReason::kError) {
      if (shared.streams_failed != nullptr) shared.streams_failed->Increment();
      state.Push(std::nullopt, true, rpc::ToGrpcStatus(e.error));
      return;
    }
    if (e.finish == worker::FinishReason::kCancelled) {
      if (shared.streams_cancelled != nullptr) shared.streams_cancelled->Increment();
      state.Push(std::nullopt, true, grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
      return;
    }
    v1::DecodeResponse r;
    v1::TokenChunk* chunk = r.mutable_tokens();
    for (const auto& t : e.tokens) {
      chunk->add_token_ids(t.token);
      if (state.want_logprobs) *chunk->add_logprobs() = ToProto(t);
    }
    const bool last = e.finish != worker::FinishReason::kNone;
    if (last) {
      chunk->set_finish_reason(ToProto(e.finish));
      v1::Usage* u = chunk->mutable_usage();
      u->set_prompt_tokens(e.prompt_tokens);
      u->set_completion_tokens(e.generated_tokens);
      u->set_cached_tokens(e.cached_tokens);
      if (state.prefill_queue_seconds >= 0) {
        u->set_prefill_queue_seconds(state.prefill_queue_seconds);
      }
      if (shared.streams_ok != nullptr) shared.streams_ok->Increment();
    }
    state.Push(std::move(r), last, grpc::Status::OK);
  }


 private:
  std::shared_ptr<Shared> shared_;
  std::shared_ptr<StreamState> state_;
};

void OnTransferDone(const std::shared_ptr<Shared>& shared, const std::shared_ptr<Pending>& pending,
                    std::unique_ptr<transfer::Registration> reg, int64_t t0,
                    absl::StatusOr<transfer::ReceivedTransfer> got) {
  StreamState* state = pending->state.get();
  {
    absl::MutexLock lock(&state->mu);
    state->transfer_pending = false;
  }
  reg.reset();  // UCX no longer touches the staging
  if (shared->wait_commit != nullptr) {
    shared->wait_commit->Observe(static_cast<double>(base::MonotonicNanos() - t0) * 1e-9);
  }
  if (!got.ok()) {
    // A sender may still put into an arena block (see the header).
    if (pending->job.staging != nullptr && pending->job.staging->arena() != nullptr) {
      shared->Quarantine(std::move(pending->job.staging));
    }
    state->Push(std::nullopt, true,
                rpc::ToGrpcStatus(rpc::ErrorWithDetail(
                    got.status().code(), v1::ERROR_CODE_TRANSFER_FAILED,
                    absl::StrCat("KV transfer ", state->transfer_id,
                                 " failed: ", got.status().message()),
                    shared->options.worker_id, /*retryable=*/true)));
    return;
  }
  absl::StatusOr<v1::CommitKvRequest> commit = transfer::DecodeCommitPayload(got->commit_payload);
  if (!commit.ok()) {
    state->Push(std::nullopt, true, rpc::ToGrpcStatus(commit.status()));
    return;
  }
  worker::DecodeJob job = std::move(pending->job);
  job.first_token = FromProto(commit->first_token_logprob());
  job.first_token.token = commit->first_token();
  // What the prefill worker actually reused (usage reports it, never the
  // router's estimate).
  job.cached_tokens = static_cast<int>(commit->cached_tokens());
  state->prefill_queue_seconds = commit->prefill_queue_seconds();
  std::shared_ptr<StreamState> st_ptr = pending->state;
  job.sink = [st_ptr, shared](const worker::TokenEvent& e) {
    DecodeStream::OnTokens(*st_ptr, *shared, e);
  };
  const std::string id = job.id;
  absl::Status st = shared->options.core->Submit(std::move(job));
  if (!st.ok()) {
    state->Push(std::nullopt, true, rpc::ToGrpcStatus(st));
    return;
  }
  // The stream may have been cancelled while the KV arrived: OnCancel set
  // `cancelled` before cancelling in the core, so either its Cancel came
  // after this Submit, or this check sees the flag.
  bool cancelled;
  {
    absl::MutexLock lock(&state->mu);
    cancelled = state->cancelled;
  }
  if (cancelled) shared->options.core->Cancel(id);
}

void StreamState::Push(std::optional<v1::DecodeResponse> response, bool last,
                       grpc::Status status) {
  {
    absl::MutexLock lock(&mu);
    if (reactor == nullptr || finish_pending) return;
    if (response.has_value()) queue.push_back(*std::move(response));
    if (last) {
      finish_pending = true;
      final_status = std::move(status);
    }
  }
  Pump();
}

void StreamState::Pump() {
  const v1::DecodeResponse* to_write = nullptr;
  std::optional<grpc::Status> to_finish;
  DecodeStream* r = nullptr;
  {
    absl::MutexLock lock(&mu);
    if (reactor == nullptr || writing || finished) return;
    r = reactor;
    if (!queue.empty() && !(finish_pending && !final_status.ok())) {
      writing = true;
      to_write = &queue.front();
    } else if (finish_pending) {
      finished = true;
      to_finish = final_status;
    } else {
      return;
    }
  }
  if (to_write != nullptr) {
    r->DoWrite(to_write);
  } else {
    r->DoFinish(*to_finish);
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<DecodeService>> DecodeService::Create(
    const DecodeServiceOptions& options) {
  if (options.core == nullptr || options.transfer == nullptr || options.pools == nullptr) {
    return absl::InvalidArgumentError("DecodeService needs a core, a transfer engine and pools");
  }
  auto shared = std::make_shared<Shared>();
  shared->options = options;
  shared->shape = options.pools->shape();
  if (options.staging_budget_bytes == 0) {
    return absl::InvalidArgumentError("the KV staging budget must be > 0 bytes");
  }
  shared->budget = std::make_unique<worker::StagingBudget>(options.staging_budget_bytes);
  if (options.staging_arena_bytes > 0) {
    constexpr size_t kArenaAlign = 4096;
    const size_t bytes = options.staging_arena_bytes / kArenaAlign * kArenaAlign;
    if (bytes == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "KV staging arena of ", options.staging_arena_bytes, " bytes is below one page"));
    }
    absl::StatusOr<std::unique_ptr<transfer::Registration>> reg =
        options.transfer->Allocate(bytes);
    if (!reg.ok()) {
      return base::Annotate(reg.status(),
                            absl::StrCat("allocating the ", bytes >> 20,
                                         " MiB KV staging arena (a smaller "
                                         "--decode.staging_arena_mib, or 0 for heap staging)"));
    }
    shared->arena_registration = *std::move(reg);
    worker::StagingArenaOptions ao;
    ao.base = shared->arena_registration->data();
    ao.size = shared->arena_registration->size();
    ao.alignment = kArenaAlign;
    ao.owner = shared->arena_registration;
    ASSIGN_OR_RETURN(shared->arena, worker::StagingArena::Create(ao));
  }
  if (metrics::Registry* r = options.registry; r != nullptr) {
    ASSIGN_OR_RETURN(auto* ttft, r->AddHistogram("swaserve_decode_ttft_seconds",
                                                 "Decode stream start to first token, as seen "
                                                 "by the decode worker (includes prefill and "
                                                 "the KV transfer).",
                                                 {}, metrics::DefaultLatencyBuckets()));
    shared->ttft = &ttft->WithLabels();
    ASSIGN_OR_RETURN(auto* tpot, r->AddHistogram("swaserve_decode_tpot_seconds",
                                                 "Time per output token after the first, as "
                                                 "seen by the decode worker.",
                                                 {}, metrics::DefaultLatencyBuckets()));
    shared->tpot = &tpot->WithLabels();
    ASSIGN_OR_RETURN(auto* wc, r->AddHistogram("swaserve_decode_commit_wait_seconds",
                                               "Decode stream start to the KV commit (or its "
                                               "failure).",
                                               {}, metrics::DefaultLatencyBuckets()));
    shared->wait_commit = &wc->WithLabels();
    ASSIGN_OR_RETURN(auto* streams, r->AddCounter("swaserve_decode_streams_total",
                                                  "Decode streams that ended, by result.",
                                                  {"result"}));
    shared->streams_ok = &streams->WithLabels({"ok"});
    shared->streams_failed = &streams->WithLabels({"error"});
    shared->streams_cancelled = &streams->WithLabels({"cancelled"});
    ASSIGN_OR_RETURN(auto* waits,
                     r->AddCounter("swaserve_decode_staging_waits_total",
                                   "KV stagings that had to wait because the staging budget "
                                   "was full when the prefill worker was ready to ship."));
    shared->staging_waits = &waits->WithLabels();
    // Reads only the budget (its own lock): never calls into the registry.
    RETURN_IF_ERROR(r->AddCallbackGauge(
        kBudgetBytesMetric,
        "KV staging budget bytes: in_use (staged or being received), waiting (requests "
        "in line for the budget), capacity (--decode.staging_budget_mib).",
        {"state"}, [budget = shared->budget.get()] {
          return std::vector<metrics::CallbackSample>{
              {{"in_use"}, static_cast<double>(budget->in_use())},
              {{"waiting"}, static_cast<double>(budget->waiting_bytes())},
              {{"capacity"}, static_cast<double>(budget->capacity())}};
        }));
    if (shared->arena != nullptr) {
      ASSIGN_OR_RETURN(auto* fallback,
                       r->AddCounter("swaserve_decode_staging_fallback_total",
                                     "Requests whose KV staging went to heap memory registered "
                                     "per request because the staging arena had no room.",
                                     {}));
      shared->staging_fallback = &fallback->WithLabels();
      // Reads only the arena and an atomic: never calls into the registry.
      RETURN_IF_ERROR(r->AddCallbackGauge(
          kArenaBytesMetric,
          "KV staging arena bytes by state: in_use (requests waiting for or holding staged "
          "KV), quarantined (after a failed transfer), free; they sum to the capacity.",
          {"state"}, [arena = shared->arena, s = shared.get()] {
            const double used = static_cast<double>(arena->bytes_in_use());
            const double quarantined = static_cast<double>(s->quarantined_bytes.load());
            return std::vector<metrics::CallbackSample>{
                {{"in_use"}, used - quarantined},
                {{"quarantined"}, quarantined},
                {{"free"}, static_cast<double>(arena->capacity()) - used}};
          }));
    }
  }
  return std::unique_ptr<DecodeService>(new DecodeService(std::move(shared)));
}

DecodeService::~DecodeService() {
  // The gauges' callbacks read shared_: stop them first.
  if (shared_->options.registry != nullptr) {
    (void)shared_->options.registry->RemoveCallback(kBudgetBytesMetric);
    if (shared_->arena != nullptr) {
      (void)shared_->options.registry->RemoveCallback(kArenaBytesMetric);
    }
  }
}

const worker::StagingArena* DecodeService::staging_arena() const { return shared_->arena.get(); }

grpc::ServerWriteReactor<v1::DecodeResponse>* DecodeService::Decode(
    grpc::CallbackServerContext* context, const v1::DecodeRequest* request) {
  return new DecodeStream(shared_, context, request);
}

namespace {

class DestinationReactor final : public grpc::ServerUnaryReactor {
 public:
  DestinationReactor(std::shared_ptr<Shared> shared, const v1::GetKvDestinationRequest* request,
                     v1::KvDestination* response)
      : shared_(std::move(shared)), call_(std::make_shared<DestinationCall>()) {
    {
      absl::MutexLock lock(&call_->mu);
      call_->reactor = this;
      call_->response = response;
    }
    transfer_id_ = request->transfer_id();
    Start();
  }

  void OnCancel() override {
    // The prefill worker gave up (its deadline): leave the budget's line.
    if (shared_->budget->Cancel(transfer_id_)) {
      absl::MutexLock lock(&shared_->mu);
      auto it = shared_->pending.find(transfer_id_);
      if (it != shared_->pending.end()) {
        it->second->acquiring = false;
        it->second->call.reset();
      }
    }
    call_->Finish(absl::CancelledError("GetKvDestination cancelled"));
  }

  void OnDone() override {
    {
      absl::MutexLock lock(&call_->mu);
      call_->reactor = nullptr;
    }
    delete this;
  }

 private:
  void Start() {
    std::shared_ptr<Pending> pending;
    {
      absl::MutexLock lock(&shared_->mu);
      auto it = shared_->pending.find(transfer_id_);
      if (it == shared_->pending.end()) {
        call_->Finish(absl::NotFoundError(absl::StrCat(
            "no pending transfer ", transfer_id_, " on decode worker ",
            shared_->options.worker_id, " (its decode stream ended)")));
        return;
      }
      pending = it->second;
      if (pending->destination.has_value()) {  // already staged: idempotent
        call_->Finish(*pending->destination);
        return;
      }
      if (pending->acquiring) {
        call_->Finish(absl::AbortedError(
            absl::StrCat("transfer ", transfer_id_, " is already being staged")));
        return;
      }
      pending->acquiring = true;
      pending->call = call_;
    }
    std::shared_ptr<Shared> shared = shared_;
    std::shared_ptr<DestinationCall> call = call_;
    const std::string id = transfer_id_;
    const bool waited = shared_->budget->in_use() + pending->layout.total_bytes() >
                        shared_->budget->capacity();
    if (waited && shared_->staging_waits != nullptr) shared_->staging_waits->Increment();
    absl::Status st = shared_->budget->Acquire(
        id, pending->layout.total_bytes(),
        [shared, pending, call, id](std::unique_ptr<worker::StagingBudget::Reservation> res) {
          {
            absl::MutexLock lock(&shared->mu);
            pending->acquiring = false;
            pending->call.reset();
            // The stream ended meanwhile: the reservation goes back.
            auto it = shared->pending.find(id);
            if (it == shared->pending.end() || it->second != pending) {
              call->Finish(absl::NotFoundError(
                  absl::StrCat("transfer ", id, ": the decode stream ended")));
              return;
            }
          }
          absl::StatusOr<v1::KvDestination> dest = Stage(shared, pending, id, std::move(res));
          if (dest.ok()) {
            absl::MutexLock lock(&shared->mu);
            pending->destination = *dest;
          }
          if (!call->Finish(dest) && dest.ok()) {
            // The caller is gone: nobody will send; the stream's own end
            // (router cancel) cancels the receive and frees the staging.
            SWA_LOG(debug, "transfer {} staged for a caller that left", id);
          }
        });
    if (!st.ok()) {
      {
        absl::MutexLock lock(&shared_->mu);
        pending->acquiring = false;
        pending->call.reset();
      }
      call_->Finish(st);
    }
  }

  std::shared_ptr<Shared> shared_;
  std::shared_ptr<DestinationCall> call_;
  std::string transfer_id_;
};

}  // namespace

grpc::ServerUnaryReactor* DecodeService::GetKvDestination(
    grpc::CallbackServerContext*, const v1::GetKvDestinationRequest* request,
    v1::KvDestination* response) {
  return new DestinationReactor(shared_, request, response);
}

void DecodeService::StartDraining() { shared_->draining.store(true); }

v1::WorkerLoad DecodeService::Load() const {
  const worker::DecodeLoad l = shared_->options.core->GetLoad();
  v1::WorkerLoad w = PoolLoad(shared_->options.worker_id, v1::ROLE_DECODE, *shared_->options.pools);
  w.set_running_requests(l.running);
  w.set_staged_requests(l.staged);
  return w;
}

grpc::ServerUnaryReactor* DecodeService::GetLoad(grpc::CallbackServerContext* context,
                                                 const v1::GetLoadRequest*,
                                                 v1::WorkerLoad* response) {
  return FinishWithLoad(context, Load(), response);
}

}  // namespace swaserve::worker_service
