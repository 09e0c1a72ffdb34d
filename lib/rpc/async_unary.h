// CallUnary: one asynchronous unary gRPC call (the callback API) with a
// deadline, whose context and messages live until its callback ran, so the
// caller keeps nothing. Header-only.
//
//   rpc::CallUnary<v1::GetPrefillProgressRequest, v1::PrefillProgress>(
//       std::move(request), timeout,
//       [stub](auto* ctx, auto* req, auto* resp, auto cb) {
//         stub->async()->GetProgress(ctx, req, resp, std::move(cb));
//       },
//       [](grpc::Status s, v1::PrefillProgress p) { ... });
//
// Thread-safety: `done` runs once, on a gRPC thread (or inline when the call
// fails at once); it must not block.
#pragma once

#include <functional>
#include <memory>
#include <utility>

#include <grpcpp/grpcpp.h>

#include "absl/time/time.h"

namespace swaserve::rpc {

template <typename Request, typename Response, typename Start, typename Done>
void CallUnary(Request request, absl::Duration timeout, Start start, Done done) {
  struct Call {
    grpc::ClientContext ctx;
    Request request;
    Response response;
  };
  auto call = std::make_shared<Call>();
  call->ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  call->request = std::move(request);
  start(&call->ctx, &call->request, &call->response,
        std::function<void(grpc::Status)>(
            [call, done = std::move(done)](grpc::Status s) mutable {
              done(std::move(s), std::move(call->response));
            }));
}

}  // namespace swaserve::rpc
