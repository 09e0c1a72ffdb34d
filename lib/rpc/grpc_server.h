// GrpcServer: the gRPC server every swaserve service runs (router, prefill,
// decode, encoder). It binds a listening address (port 0 picks a free one),
// registers the service's callback-API services, runs the standard
// grpc.health.v1 health service (the server-wide "" entry plus any names
// listed in the options) and shuts down gracefully:
//
//   Shutdown(drain):  1. health -> NOT_SERVING (on_drain_start runs);
//                     2. optional lame-duck period: still accepting calls so
//                        that health checkers and load balancers see
//                        NOT_SERVING and stop sending;
//                     3. stop accepting calls; in-flight calls (server
//                        streams included) continue until `drain` passes;
//                     4. then every remaining call is cancelled (reactors see
//                        OnCancel and must Finish); returns once every
//                        reactor's OnDone has run.
//                     Optionally, a little before the deadline of step 3,
//                     before_drain_deadline lets the service end its calls
//                     itself.
//
// Typical main():
//
//   auto signal = rpc::TerminationSignal::Create();   // first, before threads
//   MyService service(...);
//   auto server = rpc::GrpcServer::Create({.listen_address = "0.0.0.0:50051",
//                                          .services = {&service}});
//   return rpc::ServeUntilTerminated(**server, **signal) >= 0 ? 0 : 1;
//
// Health Watch streams (grpc.health.v1.Health/Watch) receive NOT_SERVING at
// step 1 but are in-flight calls like any other: a client that keeps one
// open holds the drain until its deadline. Probe with Check (kubelet, Envoy
// and rpc::CheckHealth do).
//
// Ownership: services are not owned; they must outlive the GrpcServer (or at
// least its Shutdown), and a service object serves one server only. Thread-safety: all methods are thread-safe, but
// Shutdown blocks until in-flight reactors are done, so never call it from a
// reactor or a gRPC callback thread.
#pragma once

#include <grpcpp/impl/service_type.h>
#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace swaserve::rpc {

struct GrpcServerOptions {
  // "host:port" to listen on: "0.0.0.0:50051", "[::]:0", "127.0.0.1:0".
  // Port 0 lets the kernel pick a free port; read it with port(). The port
  // is never shared with another process (SO_REUSEPORT is off), so a taken
  // port is an error rather than a silent split of traffic.
  std::string listen_address = "127.0.0.1:0";
  // Services to register (generated XService::CallbackService subclasses, or
  // any grpc::Service). Not owned; must outlive the server.
  std::vector<grpc::Service*> services;
  // Extra names reported by the health service beside "" (the whole server),
  // typically the full service names, e.g. "swaserve.v1.Worker".
  std::vector<std::string> health_service_names;
  // Health status right after Create: SERVING when true. A service that
  // needs to warm up (load weights) starts with false and calls
  // SetServing(true) when ready.
  bool serving_at_start = true;
  // The listener's credentials (rpc::ServerCredentialsFor: TLS from files,
  // reloaded); null: insecure.
  std::shared_ptr<grpc::ServerCredentials> credentials;
  // Largest message received / sent, in bytes; -1 means unlimited.
  int max_receive_message_bytes = 64 << 20;
  int max_send_message_bytes = 64 << 20;
  // Concurrent streams per HTTP/2 connection; 0 keeps gRPC's default.
  int max_concurrent_streams = 0;
  // Default drain deadline of Shutdown() (and ServeUntilTerminated).
  absl::Duration drain_deadline = absl::Seconds(30);
  // Time between NOT_SERVING and closing the listener, during which calls
  // are still accepted. Zero (default) closes at once.
  absl::Duration lame_duck = absl::ZeroDuration();
  // Server-side keepalive: ping idle clients after keepalive_time and drop
  // them when no ack arrives within keepalive_timeout (InfiniteDuration
  // disables server pings). Clients may ping as often as
  // min_client_ping_interval, also without calls in flight.
  absl::Duration keepalive_time = absl::Seconds(60);
  absl::Duration keepalive_timeout = absl::Seconds(20);
  absl::Duration min_client_ping_interval = absl::Seconds(10);
  // Called (on the thread calling Shutdown) right after the health status
  // turned NOT_SERVING and before draining, e.g. to deregister the worker
  // from the cluster registry. Must not block for long.
  std::function<void()> on_drain_start;
  // Called once, before_drain_deadline_margin before the drain deadline
  // (at most half the drain), on a thread of its own, when calls are still
  // in flight then: a service ends its long calls itself, with an answer the
  // client can act on (the prefill worker hands what it computed to L3 and
  // says DRAINING), instead of having them cancelled at the deadline.
  // Shutdown waits for it. Not called when the drain is zero or forced.
  // Its argument: the time left until the deadline (the margin as clamped).
  std::function<void(absl::Duration)> before_drain_deadline;
  absl::Duration before_drain_deadline_margin = absl::Seconds(3);
  // Escape hatch: called on the ServerBuilder after everything above has
  // been applied, before the server is built.
  std::function<void(grpc::ServerBuilder&)> configure_builder;
  // Name used in log lines.
  std::string name = "grpc";
};

class GrpcServer {
 public:
  // Builds, binds and starts the server. Unavailable when the address cannot
  // be bound (in use, no such interface); InvalidArgument for bad options.
  static absl::StatusOr<std::unique_ptr<GrpcServer>> Create(
      const GrpcServerOptions& options);

  // Shuts down without draining (cancels in-flight calls at once) if
  // Shutdown has not run; call Shutdown() first for a graceful stop.
  ~GrpcServer();
  GrpcServer(const GrpcServer&) = delete;
  GrpcServer& operator=(const GrpcServer&) = delete;

  // The bound port (the picked one when the address had port 0).
  int port() const { return port_; }
  // "host:port" with the bound port, e.g. "127.0.0.1:41234".
  const std::string& address() const { return address_; }
  // A target clients on this host can dial: the bound port on 127.0.0.1 for
  // wildcard hosts (0.0.0.0, [::]), address() otherwise.
  std::string local_target() const;

  // Health status of "" and every health_service_names entry. Ignored once
  // Shutdown started (the server stays NOT_SERVING).
  void SetServing(bool serving);
  // Health status of one name (registers it if new).
  void SetServing(const std::string& service_name, bool serving);

  // Graceful shutdown with options.drain_deadline, as described above.
  // Idempotent; concurrent and later callers block until the first one is
  // done. Blocks: not from a reactor.
  void Shutdown();
  void Shutdown(absl::Duration drain_deadline);

  // Cancels every in-flight call now (e.g. on a second SIGTERM), cutting a
  // running Shutdown's lame duck and drain short; if Shutdown has not
  // started, the next Shutdown will not wait. Does not block; callable from
  // any thread, including a signal-watcher thread.
  void CancelAllCalls();

  // Blocks until Shutdown has completed.
  void Wait();
  // Blocks until Shutdown has completed or `timeout` passed; true if done.
  bool WaitFor(absl::Duration timeout);

  // True once Shutdown has started.
  bool shutting_down() const;
  // True once Shutdown has stopped accepting calls (after the lame duck).
  bool draining() const;

  // The underlying server, for what this class does not wrap.
  grpc::Server* grpc_server() const { return server_.get(); }

 private:
  GrpcServer(const GrpcServerOptions& options,
             std::unique_ptr<grpc::Server> server, int port,
             std::string address);
  void ShutdownImpl(absl::Duration drain_deadline, absl::Duration lame_duck);

  const GrpcServerOptions options_;
  const std::unique_ptr<grpc::Server> server_;
  const int port_;
  const std::string address_;

  mutable absl::Mutex mu_;
  bool shutdown_started_ ABSL_GUARDED_BY(mu_) = false;
  // Set just before grpc::Server::Shutdown is called.
  bool grpc_shutdown_started_ ABSL_GUARDED_BY(mu_) = false;
  bool force_ ABSL_GUARDED_BY(mu_) = false;
  bool shutdown_done_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace swaserve::rpc
