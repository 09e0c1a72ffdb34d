#include "services/router/grpc_service.h"

#include <thread>
#include <utility>

#include "lib/rpc/status_conversion.h"
#include "lib/rpc/stream_writer.h"

namespace swaserve::router_service {

void RequestThreads::Spawn(std::function<void()> fn) {
  {
    absl::MutexLock lock(&mu_);
    ++running_;
  }
  std::thread([this, fn = std::move(fn)] {
    fn();
    absl::MutexLock lock(&mu_);
    --running_;
  }).detach();
}

bool RequestThreads::WaitIdle(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return running_ == 0; };
  return mu_.AwaitWithTimeout(absl::Condition(&idle), timeout);
}

int RequestThreads::running() {
  absl::MutexLock lock(&mu_);
  return running_;
}

namespace {

// What the router's producer thread writes into: the client's stream, with
// back-pressure (a slow client slows its own request, not the router).
class StreamSink final : public router::GenerateSink {
 public:
  static constexpr size_t kMaxQueued = 64;
  explicit StreamSink(std::shared_ptr<rpc::StreamWriter<v1::GenerateResponse>> writer)
      : writer_(std::move(writer)) {}
  bool Write(const v1::GenerateResponse& response) override {
    return writer_->WriteWhenRoom(response, kMaxQueued);
  }

 private:
  std::shared_ptr<rpc::StreamWriter<v1::GenerateResponse>> writer_;
};

class GenerateReactor final : public rpc::StreamingReactor<v1::GenerateResponse> {
 public:
  GenerateReactor(router::Router* router, RequestThreads* threads,
                  const v1::GenerateRequest& request)
      : cancel_(std::make_shared<router::CancelFlag>()) {
    threads->Spawn([router, writer = writer(), cancel = cancel_, request] {
      StreamSink sink(writer);
      absl::Status s = router->Generate(request, sink, cancel.get());
      writer->Finish(rpc::ToGrpcStatus(s));
    });
  }

 private:
  // The client went away: the request stops (WriteWhenRoom returns false
  // once the writer is cancelled, right after this).
  void OnCancelled() override { cancel_->Cancel(); }

  std::shared_ptr<router::CancelFlag> cancel_;
};

}  // namespace

grpc::ServerWriteReactor<v1::GenerateResponse>* RouterGrpcService::Generate(
    grpc::CallbackServerContext* context, const v1::GenerateRequest* request) {
  return new GenerateReactor(router_, threads_, *request);
}

grpc::ServerUnaryReactor* RouterGrpcService::ListModels(grpc::CallbackServerContext* context,
                                                        const v1::ListModelsRequest* request,
                                                        v1::ListModelsResponse* response) {
  *response = router_->ListModels();
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace swaserve::router_service
