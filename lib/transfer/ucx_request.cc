#include "lib/transfer/ucx_request.h"

#include "lib/transfer/ucx_util.h"

namespace swaserve::transfer::internal {

OpCtx* RequestTracker::NewOp(OpKind kind, OpHandler* handler) {
  auto* ctx = new OpCtx;
  ctx->tracker = this;
  ctx->handler = handler;
  ctx->kind = kind;
  ++inflight_;
  return ctx;
}

void RequestTracker::Track(OpCtx* ctx, ucs_status_ptr_t request) {
  if (request == nullptr) {
    Complete(ctx, UCS_OK);
  } else if (UCS_PTR_IS_ERR(request)) {
    Complete(ctx, UCS_PTR_STATUS(request));
  }
  // Otherwise the callback completes it.
}

namespace {

// Callback (set by the caller) and user data `ctx`.
ucp_request_param_t CallbackParams(OpCtx* ctx) {
  ucp_request_param_t rp{};
  rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  rp.user_data = ctx;
  return rp;
}

}  // namespace

ucp_request_param_t RequestTracker::SendParams(OpCtx* ctx) {
  ucp_request_param_t rp = CallbackParams(ctx);
  rp.cb.send = &RequestTracker::SendCallbackFn;
  return rp;
}

ucp_request_param_t RequestTracker::SendParams(OpCtx* ctx, uint32_t flags) {
  ucp_request_param_t rp = SendParams(ctx);
  rp.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
  rp.flags = flags;
  return rp;
}

ucp_request_param_t RequestTracker::RecvParams(OpCtx* ctx) {
  ucp_request_param_t rp = CallbackParams(ctx);
  rp.cb.recv_am = &RequestTracker::RecvAmCallbackFn;
  return rp;
}

void RequestTracker::SendCallbackFn(void* request, ucs_status_t status,
                                    void* user_data) {
  auto* ctx = static_cast<OpCtx*>(user_data);
  ctx->tracker->Complete(ctx, status);
  ucp_request_free(request);
}

void RequestTracker::RecvAmCallbackFn(void* request, ucs_status_t status,
                                      size_t length, void* user_data) {
  auto* ctx = static_cast<OpCtx*>(user_data);
  if (status == UCS_OK && length != ctx->bytes) {
    status = UCS_ERR_MESSAGE_TRUNCATED;
  }
  ctx->tracker->Complete(ctx, status);
  ucp_request_free(request);
}

void RequestTracker::Complete(OpCtx* ctx, ucs_status_t status) {
  std::unique_ptr<OpCtx> owned(ctx);
  --inflight_;
  *last_activity_ns_ = NowNanos();
  ctx->handler->OnOpDone(*ctx, status);
}

absl::Status SetAmHandler(ucp_worker_h worker, uint32_t id,
                          ucp_am_recv_callback_t cb, void* arg) {
  ucp_am_handler_param_t hp{};
  hp.field_mask =
      UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
      UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
  hp.id = id;
  hp.cb = cb;
  hp.arg = arg;
  hp.flags = UCP_AM_FLAG_WHOLE_MSG;
  const ucs_status_t st = ucp_worker_set_am_recv_handler(worker, &hp);
  if (st != UCS_OK) return FromUcs(st, "ucp_worker_set_am_recv_handler");
  return absl::OkStatus();
}

}  // namespace swaserve::transfer::internal
