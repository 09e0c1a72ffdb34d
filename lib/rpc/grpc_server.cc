#include "lib/rpc/grpc_server.h"

#include <grpc/grpc.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/security/server_credentials.h>

#include <algorithm>
#include <cstdint>
#include <thread>
#include <utility>

#include "absl/base/call_once.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "lib/base/logging.h"

namespace swaserve::rpc {
namespace {

int ToMillisArg(absl::Duration d) {
  const int64_t ms = absl::ToInt64Milliseconds(d);
  return static_cast<int>(std::clamp<int64_t>(ms, 0, INT32_MAX));
}

// The host part of "host:port" ("[::]" keeps its brackets).
std::string HostOf(const std::string& address) {
  const size_t colon = address.rfind(':');
  return colon == std::string::npos ? address : address.substr(0, colon);
}

}  // namespace

absl::StatusOr<std::unique_ptr<GrpcServer>> GrpcServer::Create(
    const GrpcServerOptions& options) {
  const size_t colon = options.listen_address.rfind(':');
  if (colon == std::string::npos ||
      colon + 1 == options.listen_address.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "listen address '", options.listen_address, "' is not host:port"));
  }
  for (grpc::Service* service : options.services) {
    if (service == nullptr) return absl::InvalidArgumentError("null service");
  }
  if (options.drain_deadline < absl::ZeroDuration() ||
      options.lame_duck < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("negative drain_deadline or lame_duck");
  }
  if (options.min_client_ping_interval <= absl::ZeroDuration() ||
      options.keepalive_time <= absl::ZeroDuration() ||
      options.keepalive_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("keepalive durations must be positive");
  }

  // Process-wide switch, not thread-safe in gRPC: flip it exactly once.
  static absl::once_flag health_once;
  absl::call_once(health_once,
                  [] { grpc::EnableDefaultHealthCheckService(true); });

  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(options.listen_address,
                           options.credentials != nullptr ? options.credentials
                                                          : grpc::InsecureServerCredentials(),
                           &port);
  for (grpc::Service* service : options.services) {
    builder.RegisterService(service);
  }
  builder.SetMaxReceiveMessageSize(options.max_receive_message_bytes);
  builder.SetMaxSendMessageSize(options.max_send_message_bytes);
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  if (options.max_concurrent_streams > 0) {
    builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                               options.max_concurrent_streams);
  }
  if (options.keepalive_time != absl::InfiniteDuration()) {
    builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS,
                               ToMillisArg(options.keepalive_time));
    builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
                               ToMillisArg(options.keepalive_timeout));
    builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  }
  // Accept client keepalive pings (ChannelOptions) also between calls.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(
      GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
      ToMillisArg(options.min_client_ping_interval));
  if (options.configure_builder) options.configure_builder(builder);

  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    if (server != nullptr) server->Shutdown(std::chrono::system_clock::now());
    return absl::UnavailableError(absl::StrCat("gRPC server ", options.name,
                                               ": cannot listen on ",
                                               options.listen_address));
  }
  grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
  if (health == nullptr) {
    server->Shutdown(std::chrono::system_clock::now());
    return absl::InternalError("gRPC default health service is unavailable");
  }
  health->SetServingStatus("", options.serving_at_start);
  for (const std::string& name : options.health_service_names) {
    health->SetServingStatus(name, options.serving_at_start);
  }
  std::string address = absl::StrCat(HostOf(options.listen_address), ":", port);
  SWA_LOG(info, "{}: gRPC server listening on {}", options.name, address);
  return std::unique_ptr<GrpcServer>(
      new GrpcServer(options, std::move(server), port, std::move(address)));
}

GrpcServer::GrpcServer(const GrpcServerOptions& options,
                       std::unique_ptr<grpc::Server> server, int port,
                       std::string address)
    : options_(options),
      server_(std::move(server)),
      port_(port),
      address_(std::move(address)) {}

GrpcServer::~GrpcServer() {
  ShutdownImpl(absl::ZeroDuration(), absl::ZeroDuration());
}

std::string GrpcServer::local_target() const {
  const std::string host = HostOf(address_);
  if (host.empty() || host == "0.0.0.0" || host == "[::]" || host == "::") {
    return absl::StrCat("127.0.0.1:", port_);
  }
  return address_;
}

void GrpcServer::SetServing(bool serving) {
  {
    absl::MutexLock lock(&mu_);
    if (shutdown_started_) return;
  }
  // Applies to every name registered with the health service ("" included).
  server_->GetHealthCheckService()->SetServingStatus(serving);
}

void GrpcServer::SetServing(const std::string& service_name, bool serving) {
  {
    absl::MutexLock lock(&mu_);
    if (shutdown_started_) return;
  }
  server_->GetHealthCheckService()->SetServingStatus(service_name, serving);
}

void GrpcServer::Shutdown() {
  ShutdownImpl(options_.drain_deadline, options_.lame_duck);
}

void GrpcServer::Shutdown(absl::Duration drain_deadline) {
  ShutdownImpl(drain_deadline, options_.lame_duck);
}

void GrpcServer::ShutdownImpl(absl::Duration drain_deadline,
                              absl::Duration lame_duck) {
  {
    absl::MutexLock lock(&mu_);
    if (shutdown_started_) {
      mu_.Await(absl::Condition(&shutdown_done_));
      return;
    }
    shutdown_started_ = true;
  }
  const absl::Time start = absl::Now();
  // NOT_SERVING for every name, and no later SetServingStatus takes effect.
  server_->GetHealthCheckService()->Shutdown();
  if (options_.on_drain_start) options_.on_drain_start();

  absl::Time deadline;
  absl::Duration drain = drain_deadline;
  {
    absl::MutexLock lock(&mu_);
    if (lame_duck > absl::ZeroDuration() && !force_) {
      SWA_LOG(info, "{}: NOT_SERVING; lame duck for {}", options_.name,
              absl::FormatDuration(lame_duck));
      mu_.AwaitWithTimeout(absl::Condition(&force_), lame_duck);
    }
    if (force_) drain = absl::ZeroDuration();
    deadline = absl::Now() + drain;
    grpc_shutdown_started_ = true;
  }
  SWA_LOG(info, "{}: draining in-flight calls for up to {}", options_.name,
          absl::FormatDuration(drain));
  // The service's own end of its calls, a little before the deadline, if
  // the drain is still going on then.
  absl::Notification drained;
  std::thread before_deadline;
  if (options_.before_drain_deadline && drain > absl::ZeroDuration()) {
    const absl::Duration margin = std::min(options_.before_drain_deadline_margin, drain / 2);
    before_deadline = std::thread([this, at = deadline - margin, margin, &drained] {
      if (!drained.WaitForNotificationWithDeadline(at)) {
        SWA_LOG(info, "{}: drain deadline near; the service ends its calls", options_.name);
        options_.before_drain_deadline(margin);
      }
    });
  }
  // Stops accepting calls, waits for in-flight ones until the deadline,
  // then cancels the rest and waits for every reactor's OnDone.
  server_->Shutdown(absl::ToChronoTime(deadline));
  drained.Notify();
  if (before_deadline.joinable()) before_deadline.join();
  server_->Wait();
  SWA_LOG(info, "{}: gRPC server stopped after {}", options_.name,
          absl::FormatDuration(absl::Now() - start));
  absl::MutexLock lock(&mu_);
  shutdown_done_ = true;
}

void GrpcServer::CancelAllCalls() {
  bool cancel_now = false;
  {
    absl::MutexLock lock(&mu_);
    force_ = true;
    cancel_now = grpc_shutdown_started_ && !shutdown_done_;
  }
  // Outside mu_: OnCancel reactions may run inline and call back into us.
  // Harmless if the drain just finished, and when it precedes the
  // grpc::Server::Shutdown call by a hair it disconnects the current clients,
  // which is what forcing means anyway.
  if (cancel_now) {
    SWA_LOG(warn, "{}: cancelling all in-flight calls", options_.name);
    grpc_server_cancel_all_calls(server_->c_server());
  }
}

void GrpcServer::Wait() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&shutdown_done_));
}

bool GrpcServer::WaitFor(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(absl::Condition(&shutdown_done_), timeout);
}

bool GrpcServer::shutting_down() const {
  absl::MutexLock lock(&mu_);
  return shutdown_started_;
}

bool GrpcServer::draining() const {
  absl::MutexLock lock(&mu_);
  return grpc_shutdown_started_;
}

}  // namespace swaserve::rpc
