// Answers a GetLoad call (both worker services) with a load report.
// Stateless: thread-safe.
#pragma once

#include <utility>

#include "grpcpp/grpcpp.h"
#include "swaserve/v1/common.pb.h"

namespace swaserve::worker_service {

// Unary reactor that never blocks.
inline grpc::ServerUnaryReactor* FinishWithLoad(grpc::CallbackServerContext* context,
                                                v1::WorkerLoad load, v1::WorkerLoad* response) {
  *response = std::move(load);
  auto* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace swaserve::worker_service
