// The public gRPC API of a router replica: swaserve.v1.Router (Generate,
// ListModels) over router::Router, callback API. Each Generate call starts
// the request asynchronously (Router::Start) and streams through the
// reactor's rpc::StreamWriter, which paces the request (WhenRoom); no thread
// is held per request, and the reactor never blocks. With
// GenerateRequest.progress_interval_ms, a request waiting for its first token
// gets progress messages (GenerateResponse.progress) from one timer thread
// shared by every call.
//
// Access control: with an ApiKeyStore, every call needs the metadata
// "authorization: Bearer <key>" (the HTTP API's keys; "x-api-key: <key>"
// too), else UNAUTHENTICATED; with a ConcurrencyLimiter a key has at most
// its limit of Generate calls in flight, else RESOURCE_EXHAUSTED. The
// grpc.health.v1 service stays open (probes). A key's requests run as its
// CallerPolicy says (its tenant's cache domain, priority floor and rate
// limits; over its request rate: RESOURCE_EXHAUSTED).
#pragma once

#include <memory>

#include "lib/api/api_keys.h"
#include "lib/router/caller_policy.h"
#include "lib/base/timer_queue.h"
#include "lib/router/router.h"
#include "swaserve/v1/router.grpc.pb.h"

namespace swaserve::router_service {

class RouterGrpcService final : public v1::Router::CallbackService {
 public:
  // `keys` and `limiter` may be null (no access control / no limit); not
  // owned, must outlive the service.
  // `callers` (required with `keys`) makes a key's router::Caller.
  explicit RouterGrpcService(router::Router* router, api::ApiKeyStore* keys = nullptr,
                             api::ConcurrencyLimiter* limiter = nullptr,
                             router::CallerPolicy* callers = nullptr)
      : router_(router), keys_(keys), limiter_(limiter), callers_(callers) {}

  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* context, const v1::GenerateRequest* request) override;
  grpc::ServerUnaryReactor* ListModels(grpc::CallbackServerContext* context,
                                       const v1::ListModelsRequest* request,
                                       v1::ListModelsResponse* response) override;

 private:
  // The key's name for the call's credentials, or the status to refuse it
  // with (keys_ set).
  absl::StatusOr<std::string> Authorize(const grpc::CallbackServerContext& context);

  router::Router* const router_;
  api::ApiKeyStore* const keys_;
  api::ConcurrencyLimiter* const limiter_;
  router::CallerPolicy* const callers_;
  // Progress messages' timers (one thread for every call).
  base::TimerQueue timers_;
};

}  // namespace swaserve::router_service
