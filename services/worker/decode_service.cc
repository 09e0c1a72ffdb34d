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
#include "services/worker/convert.h"

namespace swaserve::worker_service {

struct DecodeService::Shared {
  DecodeServiceOptions options;
  kv::KvShape shape;
  absl::Mutex mu;
  absl::flat_hash_map<std::string, v1::KvDestination> destinations ABSL_GUARDED_BY(mu);
  std::mt19937_64 seeds ABSL_GUARDED_BY(mu){std::random_device{}()};
  metrics::Histogram* ttft = nullptr;
  metrics::Histogram* tpot = nullptr;
  metrics::Histogram* wait_commit = nullptr;
  metrics::Counter* streams_ok = nullptr;
  metrics::Counter* streams_failed = nullptr;
  metrics::Counter* streams_cancelled = nullptr;
  metrics::Counter* staging_fallback = nullptr;

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

  // Queues a response; with `last`, the stream then finishes with `status`.
  void Push(std::optional<v1::DecodeResponse> response, bool last, grpc::Status status);
  // Starts the next write or the finish (called with mu held; the actual
  // gRPC call happens after unlocking, in Pump).
  void Pump();
};

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
    shared_->options.core->Cancel(state_->request_id);
    state_->Push(std::nullopt, true, grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
  }

  void OnDone() override {
    {
      absl::MutexLock lock(&state_->mu);
      state_->reactor = nullptr;
    }
    {
      absl::MutexLock lock(&shared_->mu);
      shared_->destinations.erase(state_->transfer_id);
    }
    delete this;
  }

  // gRPC calls, made by StreamState::Pump without its lock held.
  void DoWrite(const v1::DecodeResponse* r) { StartWrite(r); }
  void DoFinish(const grpc::Status& s) { Finish(s); }

 private:
  absl::Status Start(const v1::DecodeRequest& req) {
    const DecodeServiceOptions& o = shared_->options;
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
    ASSIGN_OR_RETURN(transfer::KvStagingPlan plan, transfer::PlanStaging(shared_->shape, n, 0));
    const worker::StagedKvLayout layout =
        worker::StagedKvLayout::For(shared_->shape, n, plan.first_swa_token);
    // A block of the arena if it has room, else heap memory registered for
    // this request.
    std::unique_ptr<worker::KvStaging> staging;
    if (shared_->arena != nullptr) {
      shared_->ReleaseQuarantined();
      absl::StatusOr<std::unique_ptr<worker::KvStaging>> in =
          worker::KvStaging::CreateIn(layout, shared_->arena);
      if (in.ok()) {
        staging = *std::move(in);
      } else if (in.status().code() == absl::StatusCode::kResourceExhausted) {
        if (shared_->staging_fallback != nullptr) shared_->staging_fallback->Increment();
        SWA_LOG(debug, "request {}: {}; staging in heap memory", req.request_id(),
                std::string(in.status().message()));
      } else {
        return in.status();
      }
    }
    std::unique_ptr<transfer::Registration> reg;
    if (staging == nullptr) {
      ASSIGN_OR_RETURN(staging, worker::KvStaging::Create(layout));
      ASSIGN_OR_RETURN(reg, o.transfer->Register(staging->data(), staging->size()));
    }
    if (staging->size() != plan.total_bytes()) {
      return absl::InternalError("KV staging and transfer plan disagree on the size");
    }
    // What the transfer callback needs once the KV is in.
    struct Pending {
      std::unique_ptr<worker::KvStaging> staging;
      std::unique_ptr<transfer::Registration> reg;  // heap staging only
      worker::DecodeJob job;
    };
    auto pending = std::make_shared<Pending>();
    pending->job.id = req.request_id();
    pending->job.prompt.assign(req.prompt_token_ids().begin(), req.prompt_token_ids().end());
    pending->job.sampling = sampling;
    pending->job.stop = std::move(stop);
    pending->job.cached_tokens = static_cast<int>(req.cached_tokens());
    transfer::KvReceiveOptions ro;
    ro.transfer_id = req.transfer_id();
    ro.shape = shared_->shape;
    ro.num_tokens = n;
    ro.swa_slack = 0;
    ro.staging = reg != nullptr ? reg.get() : shared_->arena_registration.get();
    ro.offset = staging->arena_offset();
    ro.timeout = o.commit_timeout;
    pending->staging = std::move(staging);
    pending->reg = std::move(reg);
    {
      absl::MutexLock lock(&state_->mu);
      state_->transfer_pending = true;
    }
    std::shared_ptr<StreamState> state = state_;
    std::shared_ptr<Shared> shared = shared_;
    const int64_t t0 = base::MonotonicNanos();
    absl::StatusOr<v1::KvDestination> dest = transfer::ExpectKvTransfer(
        *o.transfer, ro,
        [state, shared, pending, t0](absl::StatusOr<transfer::ReceivedTransfer> got) mutable {
          {
            absl::MutexLock lock(&state->mu);
            state->transfer_pending = false;
          }
          pending->reg.reset();  // UCX no longer touches the staging
          if (shared->wait_commit != nullptr) {
            shared->wait_commit->Observe(static_cast<double>(base::MonotonicNanos() - t0) * 1e-9);
          }
          if (!got.ok()) {
            // A sender may still put into an arena block (see the header).
            if (pending->staging->arena() != nullptr) {
              shared->Quarantine(std::move(pending->staging));
            }
            state->Push(std::nullopt, true,
                        rpc::ToGrpcStatus(rpc::ErrorWithDetail(
                            got.status().code(), v1::ERROR_CODE_TRANSFER_FAILED,
                            absl::StrCat("KV transfer ", state->transfer_id,
                                         " failed: ", got.status().message()),
                            shared->options.worker_id, /*retryable=*/true)));
            return;
          }
          absl::StatusOr<v1::CommitKvRequest> commit =
              transfer::DecodeCommitPayload(got->commit_payload);
          if (!commit.ok()) {
            state->Push(std::nullopt, true, rpc::ToGrpcStatus(commit.status()));
            return;
          }
          worker::DecodeJob job = std::move(pending->job);
          job.first_token = FromProto(commit->first_token_logprob());
          job.first_token.token = commit->first_token();
          if (commit->cached_tokens() > 0) job.cached_tokens = static_cast<int>(commit->cached_tokens());
          job.staging = std::move(pending->staging);
          job.sink = [state, shared](const worker::TokenEvent& e) { OnTokens(*state, *shared, e); };
          absl::Status st = shared->options.core->Submit(std::move(job));
          if (!st.ok()) state->Push(std::nullopt, true, rpc::ToGrpcStatus(st));
        });
    if (!dest.ok()) {
      absl::MutexLock lock(&state_->mu);
      state_->transfer_pending = false;
      return dest.status();
    }
    {
      absl::MutexLock lock(&shared_->mu);
      shared_->destinations[req.transfer_id()] = *dest;
    }
    v1::DecodeResponse first;
    *first.mutable_kv_destination() = *std::move(dest);
    state_->Push(std::move(first), false, grpc::Status::OK);
    return absl::OkStatus();
  }

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
      if (shared.streams_ok != nullptr) shared.streams_ok->Increment();
    }
    state.Push(std::move(r), last, grpc::Status::OK);
  }

  std::shared_ptr<Shared> shared_;
  std::shared_ptr<StreamState> state_;
};

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
  // The gauge's callback reads shared_: stop it first.
  if (shared_->arena != nullptr && shared_->options.registry != nullptr) {
    (void)shared_->options.registry->RemoveCallback(kArenaBytesMetric);
  }
}

const worker::StagingArena* DecodeService::staging_arena() const { return shared_->arena.get(); }

grpc::ServerWriteReactor<v1::DecodeResponse>* DecodeService::Decode(
    grpc::CallbackServerContext* context, const v1::DecodeRequest* request) {
  return new DecodeStream(shared_, context, request);
}

grpc::ServerUnaryReactor* DecodeService::GetKvDestination(
    grpc::CallbackServerContext* context, const v1::GetKvDestinationRequest* request,
    v1::KvDestination* response) {
  auto* reactor = context->DefaultReactor();
  absl::MutexLock lock(&shared_->mu);
  auto it = shared_->destinations.find(request->transfer_id());
  if (it == shared_->destinations.end()) {
    reactor->Finish(grpc::Status(grpc::StatusCode::NOT_FOUND,
                                 absl::StrCat("no pending transfer ", request->transfer_id(),
                                              " on decode worker ", shared_->options.worker_id)));
  } else {
    *response = it->second;
    reactor->Finish(grpc::Status::OK);
  }
  return reactor;
}

grpc::ServerUnaryReactor* DecodeService::CommitKv(grpc::CallbackServerContext* context,
                                                  const v1::CommitKvRequest*,
                                                  v1::CommitKvResponse*) {
  auto* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                               "the KV commit travels with the UCX transfer (lib/transfer "
                               "COMMIT message); this RPC is not used"));
  return reactor;
}

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
