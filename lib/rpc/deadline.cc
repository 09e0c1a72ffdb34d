#include "lib/rpc/deadline.h"

#include <algorithm>
#include <chrono>

namespace swaserve::rpc {
namespace {

absl::Time FromSystemTimePoint(std::chrono::system_clock::time_point point) {
  if (point == std::chrono::system_clock::time_point::max()) {
    return absl::InfiniteFuture();
  }
  return absl::FromChrono(point);
}

}  // namespace

absl::Time IncomingDeadline(const grpc::ServerContextBase& context) {
  return FromSystemTimePoint(context.deadline());
}

absl::Duration RemainingTime(const grpc::ServerContextBase& context) {
  const absl::Time deadline = IncomingDeadline(context);
  if (deadline == absl::InfiniteFuture()) return absl::InfiniteDuration();
  return std::max(absl::ZeroDuration(), deadline - absl::Now());
}

void SetTimeout(grpc::ClientContext& context, absl::Duration timeout) {
  if (timeout == absl::InfiniteDuration()) return;
  context.set_deadline(absl::ToChronoTime(
      absl::Now() + std::max(timeout, absl::ZeroDuration())));
}

std::unique_ptr<grpc::ClientContext> MakeChildContext(
    const grpc::CallbackServerContext& incoming,
    const ChildContextOptions& options) {
  grpc::PropagationOptions propagation;
  propagation.enable_deadline_propagation();
  if (options.propagate_cancellation) {
    propagation.enable_cancellation_propagation();
  } else {
    propagation.disable_cancellation_propagation();
  }
  std::unique_ptr<grpc::ClientContext> child =
      grpc::ClientContext::FromCallbackServerContext(incoming, propagation);
  // gRPC core takes the earlier of the child's own deadline and the parent's.
  // Setting the cap explicitly to min() also makes ClientDeadline() exact.
  const absl::Time incoming_deadline = IncomingDeadline(incoming);
  absl::Time deadline = incoming_deadline;
  if (options.max_timeout != absl::InfiniteDuration()) {
    deadline = std::min(deadline, absl::Now() + options.max_timeout);
  }
  if (deadline != absl::InfiniteFuture()) {
    child->set_deadline(absl::ToChronoTime(deadline));
  }
  return child;
}

std::unique_ptr<grpc::ClientContext> MakeClientContext(absl::Duration timeout) {
  auto context = std::make_unique<grpc::ClientContext>();
  SetTimeout(*context, timeout);
  return context;
}

absl::Time ClientDeadline(const grpc::ClientContext& context) {
  return FromSystemTimePoint(context.deadline());
}

}  // namespace swaserve::rpc
