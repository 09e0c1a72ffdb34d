// Deadlines of incoming calls and their propagation to outgoing calls.
//
// A service that calls another service while handling a call (the router
// calling a prefill worker, prefill calling decode) builds the outgoing
// grpc::ClientContext with MakeChildContext(incoming): the outgoing call then
// expires no later than the incoming one (optionally earlier, capped by
// max_timeout) and is cancelled when the incoming call is cancelled, so no
// work outlives the request that asked for it.
//
//   grpc::ServerUnaryReactor* Relay(grpc::CallbackServerContext* ctx, ...) {
//     auto child = rpc::MakeChildContext(*ctx, {.max_timeout = kLegTimeout});
//     stub_->async()->Do(child.get(), ...);  // child must outlive the call
//
// Free functions, no state: thread-safe.
#pragma once

#include <grpcpp/client_context.h>
#include <grpcpp/server_context.h>

#include <memory>

#include "absl/time/time.h"

namespace swaserve::rpc {

// The deadline of an incoming call; absl::InfiniteFuture() when the client set
// none.
absl::Time IncomingDeadline(const grpc::ServerContextBase& context);

// Time left until the incoming call's deadline: never negative,
// absl::InfiniteDuration() when there is no deadline.
absl::Duration RemainingTime(const grpc::ServerContextBase& context);

struct ChildContextOptions {
  // The outgoing call's deadline is min(incoming deadline, now + max_timeout).
  // Default: no cap, the incoming deadline alone.
  absl::Duration max_timeout = absl::InfiniteDuration();
  // Cancel the outgoing call when the incoming one is cancelled (by its
  // client, its deadline, or server shutdown). Default on.
  bool propagate_cancellation = true;
};

// A ClientContext for an outgoing call made on behalf of `incoming`. The
// incoming call must still be in progress when the outgoing call starts (the
// child refers to it); the returned context must outlive the outgoing call.
std::unique_ptr<grpc::ClientContext> MakeChildContext(
    const grpc::CallbackServerContext& incoming,
    const ChildContextOptions& options = {});

// A ClientContext for a call that does not serve an incoming call, expiring
// after `timeout` (none when infinite).
std::unique_ptr<grpc::ClientContext> MakeClientContext(absl::Duration timeout);

// Sets context's deadline to now + timeout (no-op for an infinite timeout).
// Only before the call starts.
void SetTimeout(grpc::ClientContext& context, absl::Duration timeout);

// The deadline set on a ClientContext (absl::InfiniteFuture() when none).
// With a child context this is only the cap; the effective deadline also
// includes the incoming call's.
absl::Time ClientDeadline(const grpc::ClientContext& context);

}  // namespace swaserve::rpc
