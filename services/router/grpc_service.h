// The public gRPC API of a router replica: swaserve.v1.Router (Generate,
// ListModels) over router::Router, callback API. Each Generate call runs the
// router on its own thread (RequestThreads) and streams through a CallState;
// the reactor never blocks.
#pragma once

#include <atomic>
#include <functional>
#include <memory>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "lib/router/router.h"
#include "swaserve/v1/router.grpc.pb.h"

namespace swaserve::router_service {

// Runs each request on a thread of its own and counts them, so that a server
// can wait for the running ones at shutdown. Thread-safe.
class RequestThreads {
 public:
  void Spawn(std::function<void()> fn);
  // Waits until no request thread runs or `timeout` passes; true when idle.
  bool WaitIdle(absl::Duration timeout);
  int running();

 private:
  absl::Mutex mu_;
  int running_ ABSL_GUARDED_BY(mu_) = 0;
};

class RouterGrpcService final : public v1::Router::CallbackService {
 public:
  RouterGrpcService(router::Router* router, RequestThreads* threads)
      : router_(router), threads_(threads) {}

  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* context, const v1::GenerateRequest* request) override;
  grpc::ServerUnaryReactor* ListModels(grpc::CallbackServerContext* context,
                                       const v1::ListModelsRequest* request,
                                       v1::ListModelsResponse* response) override;

 private:
  router::Router* const router_;
  RequestThreads* const threads_;
};

}  // namespace swaserve::router_service
