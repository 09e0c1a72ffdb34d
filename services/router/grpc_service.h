// The public gRPC API of a router replica: swaserve.v1.Router (Generate,
// ListModels) over router::Router, callback API. Each Generate call starts
// the request asynchronously (Router::Start) and streams through the
// reactor's rpc::StreamWriter, which paces the request (WhenRoom); no thread
// is held per request, and the reactor never blocks. With
// GenerateRequest.progress_interval_ms, a request waiting for its first token
// gets progress messages (GenerateResponse.progress) from one timer thread
// shared by every call.
#pragma once

#include <memory>

#include "lib/base/timer_queue.h"
#include "lib/router/router.h"
#include "swaserve/v1/router.grpc.pb.h"

namespace swaserve::router_service {

class RouterGrpcService final : public v1::Router::CallbackService {
 public:
  explicit RouterGrpcService(router::Router* router) : router_(router) {}

  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* context, const v1::GenerateRequest* request) override;
  grpc::ServerUnaryReactor* ListModels(grpc::CallbackServerContext* context,
                                       const v1::ListModelsRequest* request,
                                       v1::ListModelsResponse* response) override;

 private:
  router::Router* const router_;
  // Progress messages' timers (one thread for every call).
  base::TimerQueue timers_;
};

}  // namespace swaserve::router_service
