#include "services/router/grpc_service.h"

#include <utility>

#include "lib/rpc/status_conversion.h"
#include "lib/rpc/stream_writer.h"

namespace swaserve::router_service {

namespace {

// What the request writes into: the client's stream, with back-pressure
// (WhenRoom: a slow client slows its own request, not the router).
class StreamSink final : public router::GenerateSink {
 public:
  static constexpr size_t kMaxQueued = 64;
  explicit StreamSink(std::shared_ptr<rpc::StreamWriter<v1::GenerateResponse>> writer)
      : writer_(std::move(writer)) {}
  bool Write(const v1::GenerateResponse& response) override { return writer_->Write(response); }
  void OnReady(std::function<void()> ready) override {
    writer_->WhenRoom(kMaxQueued, std::move(ready));
  }

 private:
  std::shared_ptr<rpc::StreamWriter<v1::GenerateResponse>> writer_;
};

class GenerateReactor final : public rpc::StreamingReactor<v1::GenerateResponse> {
 public:
  GenerateReactor(router::Router* router, const v1::GenerateRequest& request)
      : cancel_(std::make_shared<router::CancelFlag>()) {
    router->Start(request, std::make_shared<StreamSink>(writer()), cancel_,
                  [writer = writer()](absl::Status s) { writer->Finish(rpc::ToGrpcStatus(s)); });
  }

 private:
  // The client went away: the request stops (Write returns false once the
  // writer is cancelled, right after this).
  void OnCancelled() override { cancel_->Cancel(); }

  std::shared_ptr<router::CancelFlag> cancel_;
};

}  // namespace

grpc::ServerWriteReactor<v1::GenerateResponse>* RouterGrpcService::Generate(
    grpc::CallbackServerContext* context, const v1::GenerateRequest* request) {
  return new GenerateReactor(router_, *request);
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
