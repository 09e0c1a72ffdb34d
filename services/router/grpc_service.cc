#include "services/router/grpc_service.h"

#include <algorithm>
#include <optional>
#include <string>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "lib/router/progress_watch.h"
#include "lib/rpc/status_conversion.h"
#include "lib/rpc/stream_writer.h"

namespace swaserve::router_service {

namespace {

// What the request writes into: the client's stream, with back-pressure
// (WhenRoom: a slow client slows its own request, not the router), and,
// with GenerateRequest.progress_interval_ms, progress messages until the
// request's first message of its own.
//
// Progress: two timer phases per message, as the HTTP keep-alive comments
// (http_call.cc): the prefill worker is probed PrefillProgressWatch::Lead()
// before each message, which then carries its answer. Timer callbacks hold only a weak_ptr and
// stop re-arming once the request wrote or ended, so nothing is cancelled.
// A progress message and the request's own messages are written under mu_,
// so none comes after the first token.
class StreamSink final : public router::GenerateSink,
                         public std::enable_shared_from_this<StreamSink> {
 public:
  static constexpr size_t kMaxQueued = 64;
  StreamSink(std::shared_ptr<rpc::StreamWriter<v1::GenerateResponse>> writer,
             std::string request_id)
      : writer_(std::move(writer)), request_id_(std::move(request_id)) {}

  bool Write(const v1::GenerateResponse& response) override {
    absl::MutexLock lock(&mu_);
    answered_ = true;
    return writer_->Write(response);
  }
  void OnReady(std::function<void()> ready) override {
    writer_->WhenRoom(kMaxQueued, std::move(ready));
  }
  void SetProgressProbe(ProgressProbe probe) override { watch_.Set(std::move(probe)); }

  // Starts the progress messages (every `interval`, on `timers`' thread,
  // which must outlive the calls to this).
  void StartProgress(base::TimerQueue* timers, absl::Duration interval) {
    timers_ = timers;
    interval_ = interval;
    Arm(/*probe_phase=*/true);
  }
  // The request ended: no more progress messages.
  void Stop() {
    absl::MutexLock lock(&mu_);
    answered_ = true;
  }

 private:
  void Arm(bool probe_phase) {
    const absl::Duration lead = router::PrefillProgressWatch::Lead(interval_);
    timers_->Schedule(absl::Now() + (probe_phase ? interval_ - lead : lead),
                      [weak = weak_from_this(), probe_phase] {
                        if (std::shared_ptr<StreamSink> self = weak.lock()) {
                          self->OnTimer(probe_phase);
                        }
                      });
  }

  void OnTimer(bool probe_phase) {
    if (probe_phase) {
      {
        absl::MutexLock lock(&mu_);
        if (answered_) return;
      }
      watch_.Ask();
      return Arm(false);
    }
    {
      absl::MutexLock lock(&mu_);
      if (answered_) return;
      v1::GenerateResponse message;
      message.set_request_id(request_id_);
      *message.mutable_progress() = watch_.Last().value_or(v1::PrefillProgress());
      if (!writer_->Write(std::move(message))) return;  // finishing or cancelled
    }
    Arm(true);
  }

  const std::shared_ptr<rpc::StreamWriter<v1::GenerateResponse>> writer_;
  const std::string request_id_;
  base::TimerQueue* timers_ = nullptr;
  absl::Duration interval_;
  absl::Mutex mu_;
  bool answered_ ABSL_GUARDED_BY(mu_) = false;
  router::PrefillProgressWatch watch_;
};

// A Generate call refused before it started (credentials, limits).
class RefusedReactor final : public grpc::ServerWriteReactor<v1::GenerateResponse> {
 public:
  explicit RefusedReactor(grpc::Status status) { Finish(std::move(status)); }
  void OnDone() override { delete this; }
};

class GenerateReactor final : public rpc::StreamingReactor<v1::GenerateResponse> {
 public:
  // `lease`: the key's slot, held until the request ended (may be null).
  GenerateReactor(router::Router* router, base::TimerQueue* timers,
                  const v1::GenerateRequest& request,
                  std::shared_ptr<api::ConcurrencyLimiter::Lease> lease, router::Caller caller)
      : cancel_(std::make_shared<router::CancelFlag>()) {
    auto sink = std::make_shared<StreamSink>(writer(), request.request_id());
    // Below 10 ms the router refuses the request (INVALID_ARGUMENT).
    if (request.progress_interval_ms() >= 10) {
      sink->StartProgress(timers, absl::Milliseconds(request.progress_interval_ms()));
    }
    router->Start(request, sink, cancel_,
                  [writer = writer(), sink, lease = std::move(lease)](absl::Status s) mutable {
      sink->Stop();
      lease.reset();
      writer->Finish(rpc::ToGrpcStatus(s));
    }, std::move(caller));
  }

 private:
  // The client went away: the request stops (Write returns false once the
  // writer is cancelled, right after this).
  void OnCancelled() override { cancel_->Cancel(); }

  std::shared_ptr<router::CancelFlag> cancel_;
};

}  // namespace

absl::StatusOr<std::string> RouterGrpcService::Authorize(
    const grpc::CallbackServerContext& context) {
  const auto& md = context.client_metadata();
  std::string header;
  if (auto it = md.find("authorization"); it != md.end()) {
    header.assign(it->second.data(), it->second.size());
  } else if (auto key = md.find("x-api-key"); key != md.end()) {
    header = "Bearer " + std::string(key->second.data(), key->second.size());
  }
  return keys_->Authorize(header);
}

grpc::ServerWriteReactor<v1::GenerateResponse>* RouterGrpcService::Generate(
    grpc::CallbackServerContext* context, const v1::GenerateRequest* request) {
  std::shared_ptr<api::ConcurrencyLimiter::Lease> lease;
  router::Caller caller;
  if (keys_ != nullptr) {
    absl::StatusOr<std::string> name = Authorize(*context);
    if (!name.ok()) {
      return new RefusedReactor(grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                                             std::string(name.status().message())));
    }
    absl::StatusOr<router::Caller> admitted = callers_->Admit(*name);
    if (!admitted.ok()) return new RefusedReactor(rpc::ToGrpcStatus(admitted.status()));
    caller = *std::move(admitted);
    if (limiter_ != nullptr) {
      std::optional<api::ConcurrencyLimiter::Lease> l = limiter_->TryAcquire(*name);
      if (!l) {
        return new RefusedReactor(grpc::Status(
            grpc::StatusCode::RESOURCE_EXHAUSTED,
            "too many concurrent requests for this API key (limit " +
                std::to_string(limiter_->LimitFor(*name)) + ")"));
      }
      lease = std::make_shared<api::ConcurrencyLimiter::Lease>(std::move(*l));
    }
  }
  return new GenerateReactor(router_, &timers_, *request, std::move(lease), std::move(caller));
}

grpc::ServerUnaryReactor* RouterGrpcService::ListModels(grpc::CallbackServerContext* context,
                                                        const v1::ListModelsRequest* request,
                                                        v1::ListModelsResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (keys_ != nullptr) {
    absl::StatusOr<std::string> name = Authorize(*context);
    if (!name.ok()) {
      reactor->Finish(grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                                   std::string(name.status().message())));
      return reactor;
    }
  }
  *response = router_->ListModels();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace swaserve::router_service
