#include "lib/transfer/engine_state.h"

#include <algorithm>
#include <limits>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "lib/base/logging.h"
#include "lib/base/status.h"
#include "lib/transfer/process_identity.h"
#include "lib/transfer/ucx_util.h"

namespace swaserve::transfer::internal {
namespace {

// The UCX configuration of the engine's context.
absl::StatusOr<ucp_config_t*> ReadConfig(const TransferEngineOptions& options) {
  ucp_config_t* config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
  if (st != UCS_OK) return FromUcs(st, "reading the UCX configuration");
  if (!options.ucx_tls.empty()) {
    st = ucp_config_modify(config, "TLS", options.ucx_tls.c_str());
    if (st != UCS_OK) {
      ucp_config_release(config);
      return absl::InvalidArgumentError(absl::StrCat(
          "ucx_tls '", options.ucx_tls,
          "' is not a valid UCX_TLS value: ", ucs_status_string(st)));
    }
  }
  // Shared-memory transports only take error-handling endpoints with this
  // (UCX 1.13); without it UCX would silently pick tcp over loopback.
  if (MayUseSharedMemory(options.ucx_tls) &&
      ucp_config_modify(config, "MM_ERROR_HANDLING", "y") != UCS_OK) {
    SWA_LOG(debug, "UCX has no MM_ERROR_HANDLING setting; ignoring");
  }
  const std::string keepalive = absl::StrCat(
      std::max<int64_t>(1,
                        absl::ToInt64Microseconds(options.keepalive_interval)),
      "us");
  if (ucp_config_modify(config, "KEEPALIVE_INTERVAL", keepalive.c_str()) !=
      UCS_OK) {
    SWA_LOG(warn, "UCX rejected KEEPALIVE_INTERVAL={}", keepalive);
  }
  return config;
}

}  // namespace

EngineState::EngineState(const TransferEngineOptions& options)
    : ctx_(options),
      registrations_(&ctx_),
      peers_(&ctx_, this),
      sender_(&ctx_, &registrations_, &peers_),
      receiver_(&ctx_, &registrations_, &peers_) {
  ctx_.publish_stats = [this] { PublishStats(); };
}

absl::StatusOr<std::unique_ptr<EngineState>> EngineState::Create(
    const TransferEngineOptions& options) {
  std::unique_ptr<EngineState> state(new EngineState(options));
  RETURN_IF_ERROR(state->Init());
  return state;
}

absl::Status EngineState::Init() {
  std::random_device rd;
  ctx_.rng.seed((static_cast<uint64_t>(rd()) << 32) ^ rd() ^
                static_cast<uint64_t>(NowNanos()));
  do {
    ctx_.engine_id = ctx_.rng();
  } while (ctx_.engine_id == 0);

  ASSIGN_OR_RETURN(ucp_config_t * config, ReadConfig(ctx_.options));
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
  params.name = ctx_.options.name.c_str();
  ucs_status_t st = ucp_init(&params, config, &ctx_.context);
  ucp_config_release(config);
  if (st != UCS_OK) return FromUcs(st, "ucp_init");

  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;
  st = ucp_worker_create(ctx_.context, &wp, &ctx_.worker);
  if (st != UCS_OK) return FromUcs(st, "ucp_worker_create");

  ucp_worker_attr_t attr{};
  attr.field_mask = UCP_WORKER_ATTR_FIELD_MAX_AM_HEADER;
  st = ucp_worker_query(ctx_.worker, &attr);
  if (st != UCS_OK) return FromUcs(st, "ucp_worker_query");
  if (attr.max_am_header < wire::MaxHeaderBytes()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "UCX allows active-message headers of ", attr.max_am_header,
        " bytes; the transfer protocol needs ", wire::MaxHeaderBytes(),
        ": use transports with larger AM headers (UCX_TLS)"));
  }

  ucp_address_t* address = nullptr;
  size_t address_length = 0;
  st = ucp_worker_get_address(ctx_.worker, &address, &address_length);
  if (st != UCS_OK) return FromUcs(st, "ucp_worker_get_address");
  wire::WorkerAddress wa;
  wa.engine_id = ctx_.engine_id;
  ctx_.self_process = SelfIdentity();
  wa.process = ctx_.self_process;
  wa.ucx_address.assign(reinterpret_cast<const char*>(address), address_length);
  ucp_worker_release_address(ctx_.worker, address);
  ctx_.framed_address = wire::PackWorkerAddress(wa);

  RETURN_IF_ERROR(peers_.RegisterHandlers(ctx_.worker));
  RETURN_IF_ERROR(receiver_.RegisterHandlers(ctx_.worker));
  return sender_.RegisterHandlers(ctx_.worker);
}

EngineState::~EngineState() {
  // Registrations are gone (they hold a reference to the engine); the worker
  // is gone (DestroyWorker) unless Init failed half-way.
  registrations_.UnmapAll();
  if (ctx_.worker != nullptr) ucp_worker_destroy(ctx_.worker);
  if (ctx_.context != nullptr) ucp_cleanup(ctx_.context);
}

void EngineState::DestroyWorker() {
  if (ctx_.worker != nullptr) {
    ucp_worker_destroy(ctx_.worker);
    ctx_.worker = nullptr;
  }
}

absl::StatusOr<void*> EngineState::Register(uint64_t id, void* data,
                                            size_t size, bool allocate) {
  if (ctx_.shutting_down || ctx_.worker == nullptr) {
    return absl::FailedPreconditionError(
        "the transfer engine is shutting down");
  }
  return registrations_.Map(id, data, size, allocate);
}

bool EngineState::Release(uint64_t id, bool unmap_now,
                          absl::Notification* released) {
  RegionRec* rec = registrations_.Find(id);
  if (rec == nullptr) return false;
  if (unmap_now || rec->users == 0) {
    // Unused (or the engine has stopped): unmap now, so that a caller that
    // frees the memory right after (even inside a transfer callback) never
    // frees registered memory.
    registrations_.Unmap(id);
    return false;
  }
  // In use: fail its users; ProcessDeferred unmaps it once they drained.
  rec->releasing = true;
  rec->released = released;
  const absl::Status why = absl::CancelledError(
      "the registration holding this transfer's memory was released");
  receiver_.FailReceivesUsing(id, why);
  sender_.FailSendsUsing(id, why);
  return true;
}

unsigned EngineState::Progress() {
  return ctx_.worker == nullptr ? 0 : ucp_worker_progress(ctx_.worker);
}

bool EngineState::HasPendingWork() const {
  return sender_.HasDirty() || receiver_.HasPendingWork() ||
         peers_.HasPendingWork();
}

void EngineState::ProcessDeferred() {
  for (int round = 0; round < 4 && HasPendingWork(); ++round) {
    peers_.ProcessPeerErrors();
    peers_.ProcessBackErrors();
    peers_.ProcessHellos();
    receiver_.SendPendingReplies();
    sender_.PumpDirty();
    receiver_.CheckDirty();
  }
  // Registrations whose release waits for their users.
  registrations_.ReapReleased();
}

void EngineState::CheckDeadlines(int64_t now) {
  next_deadline_check_ns_ = now + DurationNanos(absl::Milliseconds(5));
  if (now >= next_liveness_check_ns_) {
    next_liveness_check_ns_ =
        now + DurationNanos(ctx_.options.keepalive_interval);
    peers_.CheckLiveness();
  }
  ctx_.next_deadline_ns = std::numeric_limits<int64_t>::max();
  sender_.CheckDeadlines(now);
  receiver_.CheckDeadlines(now);
}

void EngineState::BeginShutdown() {
  if (ctx_.shutting_down) return;
  ctx_.shutting_down = true;
  const absl::Status why =
      absl::CancelledError("the transfer engine is shutting down");
  sender_.FailAll(why);
  receiver_.FailAll(why);
  peers_.CloseAll(why);
}

bool EngineState::Quiescent() const {
  return ctx_.requests.inflight() == 0 && peers_.closing_endpoints() == 0 &&
         sender_.active() == 0 && receiver_.pending() == 0 &&
         !sender_.HasDirty() && !receiver_.HasDirty();
}

void EngineState::OnPeerClosing(Peer& peer, const absl::Status& why) {
  sender_.FailSendsOf(peer, why);
}

void EngineState::OnBackEpClosing(const BackEp& back, ucp_ep_h ep,
                                  const absl::Status& why) {
  receiver_.OnSenderClosed(back.engine_id, ep, why);
}

void EngineState::PublishStats() {
  stat_sends_.store(static_cast<int64_t>(sender_.active()),
                    std::memory_order_relaxed);
  stat_receives_.store(receiver_.pending(), std::memory_order_relaxed);
  stat_inflight_.store(ctx_.requests.inflight(), std::memory_order_relaxed);
  stat_endpoints_.store(peers_.endpoints(), std::memory_order_relaxed);
}

EngineStats EngineState::Stats() const {
  EngineStats s;
  s.active_sends = stat_sends_.load(std::memory_order_relaxed);
  s.active_receives = stat_receives_.load(std::memory_order_relaxed);
  s.inflight_requests = stat_inflight_.load(std::memory_order_relaxed);
  s.registrations = registrations_.count();
  s.registered_bytes = registrations_.bytes();
  s.endpoints = stat_endpoints_.load(std::memory_order_relaxed);
  return s;
}

}  // namespace swaserve::transfer::internal
