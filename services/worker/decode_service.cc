#include "services/worker/decode_service.h"

#include <atomic>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "lib/base/clock.h"
#include "lib/base/status.h"
#include "lib/metrics/buckets.h"
#include "lib/rpc/status_conversion.h"
#include "lib/rpc/stream_writer.h"
#include "lib/worker/convert.h"
#include "services/worker/load_reply.h"

namespace swaserve::worker_service {

struct DecodeService::Shared {
  DecodeServiceOptions options;
  std::atomic<bool> draining{false};
  absl::Mutex mu;
  std::mt19937_64 seeds ABSL_GUARDED_BY(mu){std::random_device{}()};
  metrics::Histogram* ttft = nullptr;
  metrics::Histogram* tpot = nullptr;
  metrics::Counter* streams_ok = nullptr;
  metrics::Counter* streams_failed = nullptr;
  metrics::Counter* streams_cancelled = nullptr;

  uint64_t NextSeed() {
    absl::MutexLock lock(&mu);
    return seeds();
  }
};

namespace {

using Shared = DecodeService::Shared;
using Writer = rpc::StreamWriter<v1::DecodeResponse>;

// What the stream shares with the receiver's and the core's callbacks,
// which may outlive the reactor.
struct StreamState {
  std::shared_ptr<Shared> shared;
  std::shared_ptr<Writer> writer;
  std::string transfer_id;  // = the request's id in the core
  bool want_logprobs = false;
  int64_t start_ns = 0;
  int64_t last_token_ns = 0;  // decode loop thread only
  // From the commit (set before the job is submitted); < 0: unknown.
  double prefill_queue_seconds = -1;
  std::atomic<bool> cancelled{false};

  void Fail(const absl::Status& st) { writer->Finish(rpc::ToGrpcStatus(st)); }
  // The core's token events, turned into stream messages (loop thread).
  void OnTokens(const worker::TokenEvent& e);
  // The receiver's commit (or the transfer's failure).
  static void OnReceived(const std::shared_ptr<StreamState>& self,
                         absl::StatusOr<worker::ReceivedKv> got);
};

class DecodeStream final : public rpc::StreamingReactor<v1::DecodeResponse> {
 public:
  DecodeStream(std::shared_ptr<Shared> shared, const v1::DecodeRequest& request)
      : state_(std::make_shared<StreamState>()) {
    state_->shared = std::move(shared);
    state_->writer = writer();
    state_->transfer_id = request.request_id();
    state_->start_ns = base::MonotonicNanos();
    if (absl::Status st = Start(request); !st.ok()) state_->Fail(st);
  }

 private:
  void OnCancelled() override {
    state_->cancelled = true;
    // After `cancelled` is set: a commit that submits later sees it and
    // cancels what it submitted (OnReceived), so no request runs unheard.
    state_->shared->options.receiver->Forget(state_->transfer_id,
                                             "the decode stream was cancelled");
    state_->shared->options.core->Cancel(state_->transfer_id);
  }
  void OnStreamDone() override {
    state_->shared->options.receiver->Forget(state_->transfer_id, "the decode stream ended");
  }

  absl::Status Start(const v1::DecodeRequest& req) {
    const DecodeServiceOptions& o = state_->shared->options;
    if (state_->shared->draining.load()) {
      return rpc::ErrorWithDetail(absl::StatusCode::kUnavailable, v1::ERROR_CODE_DRAINING,
                                  absl::StrCat("decode worker ", o.worker_id, " is draining"),
                                  o.worker_id, /*retryable=*/true);
    }
    if (req.request_id().empty()) return absl::InvalidArgumentError("request_id is required");
    worker::DecodeJob job;
    job.id = req.request_id();
    job.prompt.assign(req.prompt_token_ids().begin(), req.prompt_token_ids().end());
    ASSIGN_OR_RETURN(job.sampling,
                     worker::ToSamplingOptions(req.sampling(), state_->shared->NextSeed(),
                                                state_->shared->options.constraints));
    ASSIGN_OR_RETURN(job.stop, worker::ToStopOptions(req.sampling(), o.default_max_tokens,
                                                     o.max_max_tokens, o.eos_ids));
    state_->want_logprobs = req.sampling().logprobs();
    RETURN_IF_ERROR(o.receiver->Expect(
        req.request_id(), std::move(job),
        [state = state_](absl::StatusOr<worker::ReceivedKv> got) {
          StreamState::OnReceived(state, std::move(got));
        }));
    // No memory yet: staging is allocated when prefill is about to ship.
    v1::DecodeResponse first;
    first.mutable_accepted()->set_worker_id(o.worker_id);
    writer()->Write(std::move(first));
    return absl::OkStatus();
  }

  std::shared_ptr<StreamState> state_;
};

void StreamState::OnReceived(const std::shared_ptr<StreamState>& self,
                             absl::StatusOr<worker::ReceivedKv> got) {
  if (!got.ok()) return self->Fail(got.status());
  worker::DecodeJob job = std::move(got->job);
  self->prefill_queue_seconds = got->prefill_queue_seconds;
  job.sink = [self](const worker::TokenEvent& e) { self->OnTokens(e); };
  const std::string id = job.id;
  worker::DecodeCore* core = self->shared->options.core;
  if (absl::Status st = core->Submit(std::move(job)); !st.ok()) return self->Fail(st);
  // The stream may have been cancelled while the KV arrived: OnCancelled set
  // `cancelled` before cancelling in the core, so either its Cancel came
  // after this Submit, or this check sees the flag.
  if (self->cancelled.load()) core->Cancel(id);
}

void StreamState::OnTokens(const worker::TokenEvent& e) {
  const Shared& s = *shared;
  const int64_t now = base::MonotonicNanos();
  if (!e.tokens.empty()) {
    if (last_token_ns == 0) {
      if (s.ttft != nullptr) s.ttft->Observe(static_cast<double>(now - start_ns) * 1e-9);
    } else if (s.tpot != nullptr) {
      s.tpot->Observe(static_cast<double>(now - last_token_ns) * 1e-9 /
                      static_cast<double>(e.tokens.size()));
    }
    last_token_ns = now;
  }
  if (e.finish == worker::FinishReason::kError) {
    if (s.streams_failed != nullptr) s.streams_failed->Increment();
    return Fail(e.error);
  }
  if (e.finish == worker::FinishReason::kCancelled) {
    if (s.streams_cancelled != nullptr) s.streams_cancelled->Increment();
    return writer->Finish(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
  }
  v1::DecodeResponse r;
  v1::TokenChunk* chunk = r.mutable_tokens();
  for (const auto& t : e.tokens) {
    chunk->add_token_ids(t.token);
    if (want_logprobs) *chunk->add_logprobs() = worker::ToProto(t);
  }
  chunk->set_draft_tokens(static_cast<uint32_t>(e.draft_tokens));
  chunk->set_accepted_draft_tokens(static_cast<uint32_t>(e.accepted_draft_tokens));
  const bool last = e.finish != worker::FinishReason::kNone;
  if (last) {
    chunk->set_finish_reason(worker::ToProto(e.finish));
    v1::Usage* u = chunk->mutable_usage();
    u->set_prompt_tokens(e.prompt_tokens);
    u->set_completion_tokens(e.generated_tokens);
    u->set_cached_tokens(e.cached_tokens);
    u->set_draft_tokens(static_cast<uint32_t>(e.draft_tokens));
    u->set_accepted_draft_tokens(static_cast<uint32_t>(e.accepted_draft_tokens));
    if (prefill_queue_seconds >= 0) u->set_prefill_queue_seconds(prefill_queue_seconds);
    if (s.streams_ok != nullptr) s.streams_ok->Increment();
  }
  writer->Write(std::move(r));
  if (last) writer->Finish(grpc::Status::OK);
}

// GetKvDestination: answered when the receiver has staged the transfer.
class DestinationReactor final : public grpc::ServerUnaryReactor {
 public:
  DestinationReactor(std::shared_ptr<Shared> shared, const v1::GetKvDestinationRequest& request,
                     v1::KvDestination* response)
      : shared_(std::move(shared)), transfer_id_(request.transfer_id()) {
    shared_->options.receiver->GetDestination(
        transfer_id_, [this, response](absl::StatusOr<v1::KvDestination> dest) {
          // Called once, before OnDone (this reactor finishes only here).
          if (dest.ok()) *response = *std::move(dest);
          Finish(dest.ok() ? grpc::Status::OK : rpc::ToGrpcStatus(dest.status()));
        });
  }

  // The prefill worker gave up (its deadline): leave the budget's line.
  void OnCancel() override { shared_->options.receiver->CancelDestination(transfer_id_); }
  void OnDone() override { delete this; }

 private:
  std::shared_ptr<Shared> shared_;
  std::string transfer_id_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<DecodeService>> DecodeService::Create(
    const DecodeServiceOptions& options) {
  if (options.core == nullptr || options.receiver == nullptr || options.pools == nullptr) {
    return absl::InvalidArgumentError("DecodeService needs a core, a KV receiver and pools");
  }
  auto shared = std::make_shared<Shared>();
  shared->options = options;
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
    ASSIGN_OR_RETURN(auto* streams, r->AddCounter("swaserve_decode_streams_total",
                                                  "Decode streams that ended, by result.",
                                                  {"result"}));
    shared->streams_ok = &streams->WithLabels({"ok"});
    shared->streams_failed = &streams->WithLabels({"error"});
    shared->streams_cancelled = &streams->WithLabels({"cancelled"});
  }
  return std::unique_ptr<DecodeService>(new DecodeService(std::move(shared)));
}

DecodeService::~DecodeService() = default;

grpc::ServerWriteReactor<v1::DecodeResponse>* DecodeService::Decode(
    grpc::CallbackServerContext*, const v1::DecodeRequest* request) {
  return new DecodeStream(shared_, *request);
}

grpc::ServerUnaryReactor* DecodeService::GetKvDestination(
    grpc::CallbackServerContext*, const v1::GetKvDestinationRequest* request,
    v1::KvDestination* response) {
  return new DestinationReactor(shared_, *request, response);
}

void DecodeService::StartDraining() { shared_->draining.store(true); }

v1::WorkerLoad DecodeService::Load() const {
  const worker::DecodeLoad l = shared_->options.core->GetLoad();
  v1::WorkerLoad w =
      worker::PoolLoad(shared_->options.worker_id, v1::ROLE_DECODE, *shared_->options.pools);
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
