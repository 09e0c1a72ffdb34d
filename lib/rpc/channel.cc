#include "lib/rpc/channel.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/wire_format_lite.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/channel_arguments.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "lib/rpc/deadline.h"
#include "lib/rpc/status_conversion.h"

namespace swaserve::rpc {
namespace {

using google::protobuf::internal::WireFormatLite;

constexpr char kHealthCheckMethod[] = "/grpc.health.v1.Health/Check";

int ToMillisArg(absl::Duration d) {
  const int64_t ms = absl::ToInt64Milliseconds(d);
  return static_cast<int>(std::min<int64_t>(ms, INT32_MAX));
}

// grpc.health.v1.HealthCheckRequest { string service = 1; }, hand-encoded:
// Debian ships no health.proto, and the two messages are tiny.
grpc::ByteBuffer EncodeHealthCheckRequest(absl::string_view service) {
  std::string bytes;
  if (!service.empty()) {
    google::protobuf::io::StringOutputStream stream(&bytes);
    google::protobuf::io::CodedOutputStream coded(&stream);
    WireFormatLite::WriteString(1, std::string(service), &coded);
  }
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

// grpc.health.v1.HealthCheckResponse { ServingStatus status = 1; }
absl::StatusOr<HealthStatus> DecodeHealthCheckResponse(
    const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  if (!buffer.Dump(&slices).ok()) {
    return absl::InternalError("health check: unreadable response");
  }
  std::string bytes;
  for (const grpc::Slice& slice : slices) {
    bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  google::protobuf::io::CodedInputStream input(
      reinterpret_cast<const uint8_t*>(bytes.data()),
      static_cast<int>(bytes.size()));
  uint32_t status = 0;
  while (uint32_t tag = input.ReadTag()) {
    if (WireFormatLite::GetTagFieldNumber(tag) == 1 &&
        WireFormatLite::GetTagWireType(tag) ==
            WireFormatLite::WIRETYPE_VARINT) {
      if (!input.ReadVarint32(&status)) break;
    } else if (!WireFormatLite::SkipField(&input, tag)) {
      return absl::InternalError("health check: malformed response");
    }
  }
  if (!input.ConsumedEntireMessage()) {
    return absl::InternalError("health check: malformed response");
  }
  if (status > static_cast<uint32_t>(HealthStatus::kServiceUnknown)) {
    return HealthStatus::kUnknown;
  }
  return static_cast<HealthStatus>(status);
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::Channel>> CreateChannel(
    const std::string& target, const ChannelOptions& options) {
  if (target.empty()) return absl::InvalidArgumentError("empty channel target");
  if (options.keepalive_time <= absl::ZeroDuration() ||
      options.keepalive_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("keepalive durations must be positive");
  }
  if (options.min_reconnect_backoff > options.max_reconnect_backoff) {
    return absl::InvalidArgumentError(
        "min_reconnect_backoff exceeds max_reconnect_backoff");
  }
  grpc::ChannelArguments args;
  if (options.keepalive_time != absl::InfiniteDuration()) {
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS,
                ToMillisArg(options.keepalive_time));
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
                ToMillisArg(options.keepalive_timeout));
    args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS,
                options.keepalive_without_calls ? 1 : 0);
    // Keep pinging an idle connection (default stops after 2 pings).
    args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  }
  args.SetMaxReceiveMessageSize(options.max_receive_message_bytes);
  args.SetMaxSendMessageSize(options.max_send_message_bytes);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS,
              ToMillisArg(options.initial_reconnect_backoff));
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS,
              ToMillisArg(options.min_reconnect_backoff));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS,
              ToMillisArg(options.max_reconnect_backoff));
  if (!options.load_balancing_policy.empty()) {
    args.SetLoadBalancingPolicyName(options.load_balancing_policy);
  }
  if (options.use_local_subchannel_pool) {
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  }
  std::shared_ptr<grpc::Channel> channel = grpc::CreateCustomChannel(
      target, grpc::InsecureChannelCredentials(), args);
  if (channel == nullptr) {
    return absl::InternalError(
        absl::StrCat("cannot create channel to ", target));
  }
  return channel;
}

absl::Status WaitForConnected(grpc::Channel& channel, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  grpc_connectivity_state state = channel.GetState(/*try_to_connect=*/true);
  while (state != GRPC_CHANNEL_READY) {
    if (!channel.WaitForStateChange(state, absl::ToChronoTime(deadline))) {
      return absl::DeadlineExceededError(absl::StrCat(
          "channel not connected after ", absl::FormatDuration(timeout),
          " (state ", static_cast<int>(state), ")"));
    }
    state = channel.GetState(/*try_to_connect=*/true);
  }
  return absl::OkStatus();
}

absl::string_view HealthStatusName(HealthStatus status) {
  switch (status) {
    case HealthStatus::kUnknown:
      return "UNKNOWN";
    case HealthStatus::kServing:
      return "SERVING";
    case HealthStatus::kNotServing:
      return "NOT_SERVING";
    case HealthStatus::kServiceUnknown:
      return "SERVICE_UNKNOWN";
  }
  return "UNKNOWN";
}

absl::StatusOr<HealthStatus> CheckHealth(
    const std::shared_ptr<grpc::Channel>& channel, absl::string_view service,
    absl::Duration timeout) {
  if (channel == nullptr) return absl::InvalidArgumentError("null channel");
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  SetTimeout(context, timeout);
  const grpc::ByteBuffer request = EncodeHealthCheckRequest(service);
  grpc::ByteBuffer response;
  grpc::Status status;
  absl::Notification done;
  stub.UnaryCall(&context, kHealthCheckMethod, grpc::StubOptions(), &request,
                 &response, [&](grpc::Status s) {
                   status = std::move(s);
                   done.Notify();
                 });
  done.WaitForNotification();
  if (!status.ok()) return FromGrpcStatus(status);
  return DecodeHealthCheckResponse(response);
}

bool IsServing(const std::string& address, absl::Duration timeout) {
  absl::StatusOr<std::shared_ptr<grpc::Channel>> ch = CreateChannel(address);
  if (!ch.ok()) return false;
  absl::StatusOr<HealthStatus> h = CheckHealth(*ch, "", timeout);
  return h.ok() && *h == HealthStatus::kServing;
}

}  // namespace swaserve::rpc
