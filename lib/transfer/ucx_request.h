// UCX request plumbing of the transfer engine (internal to lib/transfer):
// the user data of every UCX request the engine waits for (OpCtx), who
// handles its completion (OpHandler), and the count of requests in flight
// (RequestTracker). Includes UCX: never include this from a public header.
//
// Thread-safety: none. Everything here belongs to the engine's progress
// thread: UCX runs the completion callbacks inside ucp_worker_progress on
// that thread, or Track runs them inline.
// Ownership: NewOp allocates an OpCtx that UCX (or Track) holds until the
// request completes; RequestTracker then deletes it right after its
// handler's OnOpDone returns. Handlers must outlive every request they own
// (the engine destroys them only after the UCP worker).
#pragma once

#include <ucp/api/ucp.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "lib/transfer/wire.h"

namespace swaserve::transfer::internal {

struct Peer;
struct BackEp;
class RequestTracker;

enum class OpKind {
  kHello,
  kData,
  kPut,
  kFlush,
  kCommit,
  kBegin,
  kReply,
  kRecvData,
  kRecvCommit,
  kClose
};

class OpHandler;

// user_data of every UCX request we wait for. The buffers a request reads
// or writes (header, payload) live here until it completes.
struct OpCtx {
  RequestTracker* tracker = nullptr;
  OpHandler* handler = nullptr;
  OpKind kind = OpKind::kData;
  uint64_t send_id = 0;
  std::string receive_id;
  uint64_t bytes = 0;
  std::string header;
  std::string payload;
  wire::DecodedCommit commit;
  // Keep an endpoint's err_handler argument alive while a request on (or
  // closing) it is outstanding.
  std::shared_ptr<Peer> peer;
  std::shared_ptr<BackEp> back;
};

class OpHandler {
 public:
  virtual ~OpHandler() = default;
  // The request of `ctx` completed with `status` (UCS_OK or an error). The
  // tracker's in-flight count already excludes it; `ctx` is deleted when
  // this returns.
  virtual void OnOpDone(OpCtx& ctx, ucs_status_t status) = 0;
};

class RequestTracker {
 public:
  // `last_activity_ns` (progress-thread state) is set to now whenever a
  // request completes.
  explicit RequestTracker(int64_t* last_activity_ns)
      : last_activity_ns_(last_activity_ns) {}
  RequestTracker(const RequestTracker&) = delete;
  RequestTracker& operator=(const RequestTracker&) = delete;

  // A new request context, counted in flight until it completes.
  OpCtx* NewOp(OpKind kind, OpHandler* handler);
  // Takes what a UCX *_nbx call returned for `ctx`: completes it now when the
  // call finished immediately (null) or failed (an error pointer); otherwise
  // UCX's callback will.
  void Track(OpCtx* ctx, ucs_status_ptr_t request);

  // Request parameters with the completion callback and `ctx` as user data
  // (send-like operations: AM sends, puts, flushes, closes); the second
  // form also sets `flags` (UCP_OP_ATTR_FIELD_FLAGS).
  static ucp_request_param_t SendParams(OpCtx* ctx);
  static ucp_request_param_t SendParams(OpCtx* ctx, uint32_t flags);
  // The same for ucp_am_recv_data_nbx (a length mismatch completes the
  // request with UCS_ERR_MESSAGE_TRUNCATED).
  static ucp_request_param_t RecvParams(OpCtx* ctx);

  // UCX requests not yet completed.
  int64_t inflight() const { return inflight_; }

 private:
  static void SendCallbackFn(void* request, ucs_status_t status,
                             void* user_data);
  static void RecvAmCallbackFn(void* request, ucs_status_t status,
                               size_t length, void* user_data);
  void Complete(OpCtx* ctx, ucs_status_t status);

  int64_t* last_activity_ns_;
  int64_t inflight_ = 0;
};

// Registers `cb` (with `arg`) as the whole-message handler of active message
// `id` on `worker`.
absl::Status SetAmHandler(ucp_worker_h worker, uint32_t id,
                          ucp_am_recv_callback_t cb, void* arg);

}  // namespace swaserve::transfer::internal
