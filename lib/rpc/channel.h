// Client side: channels with the project's keepalive and message-size
// defaults, waiting for a channel to connect, and a grpc.health.v1 Check
// client (works against any server that runs the standard health service,
// GrpcServer's included).
//
// Free functions, no state: thread-safe. Channels are thread-safe and meant
// to be shared: create one per peer and reuse it.
#pragma once

#include <grpcpp/channel.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace swaserve::rpc {

struct ChannelOptions {
  // HTTP/2 keepalive: ping after this much idle time, and drop the connection
  // when the ack takes longer than keepalive_timeout, so a dead peer (a
  // vanished pod) is noticed within ~time+timeout instead of the kernel's TCP
  // timeouts. InfiniteDuration disables keepalive. GrpcServer accepts client
  // pings as often as every GrpcServerOptions::min_client_ping_interval (10s);
  // do not go below that against a GrpcServer.
  absl::Duration keepalive_time = absl::Seconds(30);
  absl::Duration keepalive_timeout = absl::Seconds(10);
  // Keep pinging while no call is in flight (long-idle worker channels).
  bool keepalive_without_calls = true;
  // Largest message received / sent, in bytes; -1 means unlimited. Defaults
  // match GrpcServerOptions (tensors and KV metadata can be large).
  int max_receive_message_bytes = 64 << 20;
  int max_send_message_bytes = 64 << 20;
  // Reconnect backoff after a failed connection attempt. gRPC (1.51) also
  // uses min_reconnect_backoff as the least time one connection attempt may
  // take (TCP connect + the HTTP/2 SETTINGS exchange): at 100 ms, a loaded
  // 2-core machine failed a first call to a live worker on loopback with
  // "connection attempt timed out before receiving SETTINGS frame" after
  // 111 ms (RouterIntegrationTest, clean-clone CI). A refused connection (a
  // dead worker on a live host) still fails at once; only a peer that does
  // not answer at all takes up to this long. Default 1 s.
  absl::Duration initial_reconnect_backoff = absl::Milliseconds(100);
  absl::Duration min_reconnect_backoff = absl::Seconds(1);
  absl::Duration max_reconnect_backoff = absl::Seconds(5);
  // gRPC load-balancing policy, e.g. "round_robin" for a DNS name that
  // resolves to several replicas; empty keeps gRPC's default (pick_first).
  std::string load_balancing_policy;
  // Give this channel its own connections instead of sharing them with other
  // channels to the same target that have the same arguments.
  bool use_local_subchannel_pool = false;
};

// An insecure (plaintext, in-cluster) channel to `target` ("host:port",
// "dns:///name:port", "unix:/path"). Does not connect until first used (or
// WaitForConnected). InvalidArgument for an empty target or bad options.
absl::StatusOr<std::shared_ptr<grpc::Channel>> CreateChannel(
    const std::string& target, const ChannelOptions& options = {});

// Connects `channel` if idle and waits until it is READY. DeadlineExceeded
// (with the last connectivity state) when `timeout` passes first.
absl::Status WaitForConnected(grpc::Channel& channel, absl::Duration timeout);

// grpc.health.v1.HealthCheckResponse.ServingStatus.
enum class HealthStatus {
  kUnknown = 0,
  kServing = 1,
  kNotServing = 2,
  kServiceUnknown = 3,
};
absl::string_view HealthStatusName(HealthStatus status);

// Calls grpc.health.v1.Health/Check for `service` ("" = the whole server)
// and returns the answer. RPC failures come back as errors (e.g. NotFound
// for a service the server does not know, Unavailable when it cannot be
// reached, DeadlineExceeded after `timeout`). Blocks: never call it from a
// reactor.
absl::StatusOr<HealthStatus> CheckHealth(
    const std::shared_ptr<grpc::Channel>& channel,
    absl::string_view service = "", absl::Duration timeout = absl::Seconds(2));

// Whether the server at `address` answers a whole-server health check with
// SERVING within `timeout` (false on any failure). A process registering
// under an id asks it about the address a record of that id names: a live
// holder means the id is taken (cluster::WorkerRegistrationOptions::is_live).
bool IsServing(const std::string& address, absl::Duration timeout = absl::Milliseconds(500));

}  // namespace swaserve::rpc
