// lib/transfer: how prefill ships KV to decode over UCX (docs/architecture.md#request-path,
// steps 2–3).
//
// ===========================================================================
// README — the protocol
// ===========================================================================
//
// One TransferEngine per process: a UCP context, one UCP worker and a
// progress thread that owns both. Every UCX call happens on that thread; the
// public methods post work to it (and, where they return a value, wait for
// it). Peers are identified by an opaque worker address: the UCX worker
// address framed with an engine id, the process identity (boot id, pid
// namespace, pid, start time) and a checksum (wire.h).
//
// Receiver (decode), docs/architecture.md#request-path step 2:
//   1. Register() its staging memory once (ucp_mem_map; the packed rkey is
//      kept), then per request ExpectTransfer(transfer id, regions of that
//      memory, expected byte count, timeout, callback). That returns a
//      Destination: the worker address, and per region its base address,
//      length and the packed rkey framed with a fresh random 64-bit tag (the
//      tag makes the rkey valid for this transfer only). The service puts it
//      in the gRPC handshake (kv_destination.h: swaserve.v1.KvDestination).
//   2. The callback runs once: OK with the commit payload when every expected
//      byte is visible in the staging memory and the sender committed; an
//      error otherwise. When it runs, UCX holds no reference to the regions
//      any more, so the caller may reuse or free them.
// Sender (prefill), step 3:
//   3. Send(destination, page copies [(local pointer, region, offset, bytes)],
//      commit payload). Adjacent copies are merged into messages of up to
//      max_message_bytes; at most max_inflight_messages are outstanding.
//      Local memory inside a Registration of the sender's engine is sent
//      with its memory handle (no per-message registration).
//   4. On a new endpoint the sender first sends HELLO (its own worker
//      address), so the receiver can open an endpoint back for replies.
//   5. Data, by primitive (chosen per transport, see below):
//        kActiveMessage: one AM per message (header: transfer id, region,
//          rkey tag, remote address, length; UCX picks eager or rendezvous by
//          size). The receiver validates the header before a byte lands
//          (unknown transfer id, wrong tag, range outside the region, region
//          index) and receives the payload straight into the staging region
//          (ucp_am_recv_data_nbx). A rejected message is dropped and answered
//          with REJECT.
//        kPut: BEGIN (transfer id + region tags) first; the receiver checks
//          them and answers READY or REJECT, so nothing lands for an unknown
//          transfer or a foreign rkey. Then ucp_put_nbx into base + offset
//          with the unpacked rkey and ucp_ep_flush_nbx (remote completion).
//          Ranges are checked against the region length by the sender only.
//   6. COMMIT (after every message completed, i.e. the data is visible at the
//      receiver): transfer id, the tags of every region, bytes sent by AM and
//      by put, and the commit payload (services put a serialized
//      swaserve.v1.CommitKvRequest there: first token, last hidden state).
//      The receiver waits until every receive it started has completed,
//      checks tags and that the bytes equal the expected count, runs its
//      callback, and answers ACK (OK or the error). Send's callback runs on
//      the ACK, so a sender never reports success for data the receiver did
//      not accept.
// Errors and time bounds:
//   * Endpoints use UCP_ERR_HANDLING_MODE_PEER, which ucp_ep_close_nbx(FORCE)
//     needs. In UCX 1.13 shared memory only takes such endpoints with
//     MM_ERROR_HANDLING=y (set by the engine; otherwise UCX silently uses
//     tcp over loopback), and cma never does.
//   * A dead peer: tcp reports it (connection reset) through the endpoint's
//     error callback. UCX 1.13 does not notice a dead shared-memory peer
//     (measured: a rendezvous to a SIGKILLed process stays pending forever,
//     keepalive or not), so every keepalive_interval the engine checks
//     whether the process of each peer on this host still exists (same boot
//     id and pid namespace; pid and start time from /proc). Either way, the
//     peer's transfers fail with Unavailable and its endpoints are
//     force-closed, which completes every outstanding request on them.
//   * Every send and receive has a deadline (timeout, default 30 s). Past
//     it, it fails with DeadlineExceeded and, if requests are still
//     outstanding, the endpoints they use are force-closed (other transfers
//     on the same endpoint fail too). The callback runs only once no request
//     references the memory, so the caller can free it right away: a failed
//     transfer never leaves UCX writing into freed memory.
//   * Validation failures are InvalidArgument (malformed rkey/address, range
//     outside a region, wrong tag), NotFound (unknown transfer id) or
//     FailedPrecondition (wrong total size); the message says what to do.
//   * Late messages for a finished transfer are answered with its outcome for
//     finished_linger, then with NotFound.
// Progress: while a send is active or a receive has seen its first message,
// the thread polls ucp_worker_progress (yielding between empty polls):
// UCX 1.13 does not raise a wakeup event for every step of a shared-memory
// rendezvous or emulated put, and sleeping stalled them (measured: 16 MiB
// sends at ~0.1 GB/s). Otherwise it sleeps on the worker's event fd, at
// most 5 ms at a time.
// Choice of primitive (kAuto = AutoPrimitive(transport, whether every
// destination region is UCX-allocated)), measured with bench/transfer on
// UCX 1.13.1 between two processes on a shared 2-vCPU VM (bench/RESULTS.md,
// "KV transfer (UCX)"; figures there):
//   * shared memory, staging from TransferEngine::Allocate: put. The sender
//     maps the receiver's UCX-allocated segment (the unpacked rkey is cached
//     per peer: unpacking maps the whole segment, and doing it per transfer
//     cut puts to ~0.2 GB/s) and writes with one memcpy — the only
//     single-copy path on this machine, at up to memcpy speed, like
//     ucx_perftest's ucp_put_bw (which allocates its buffers the same way).
//   * shared memory, ordinary staging memory: active messages. UCX 1.13
//     emulates a put into ordinary memory over AM bcopy (no
//     process_vm_writev; it needs the receiver's progress anyway): puts and
//     the AM rendezvous measured within noise of each other (8-11 GB/s,
//     puts a little slower at 64-256 MiB), and AM keeps per-message
//     validation by the receiver.
//   * tcp: active messages, 4-6x faster than puts (whose flush crawls:
//     ucx_perftest's ucp_put_bw over tcp ran at 0.03-0.1 GB/s).
//   * RDMA (rc/dc/ud; none here, not measured): active messages — the
//     rendezvous is then a zero-copy RDMA read by the receiver and every
//     message stays validated; SendRequest::primitive = kPut forces puts.
// cma is unusable here: UCX 1.13 gives it no error handling, so endpoints in
// UCP_ERR_HANDLING_MODE_PEER never select it. For the put path, allocate one
// long-lived staging pool and carve transfers out of it: a sender keeps at
// most 4 unpacked rkeys per peer.
//
// Where the code is (all internal to lib/transfer but this header):
// transfer_engine.cc (TransferEngine; the progress thread and its task queue),
// engine_state.h (what the progress thread owns, one loop iteration's
// parts, shutdown), sender.h (steps 3-6, the send state machine),
// receiver.h (steps 1-2 and 5-6, the receive state machine, replies),
// peer_table.h (endpoints, HELLO, rkey cache, peer failures),
// registration_table.h (Register / Allocate), ucx_request.h (UCX request
// completion), process_identity.h (liveness of peers on this host),
// transfer_metrics.h, ucx_util.h (status mapping, transport detection) and
// wire.h (the wire format).
//
// Thread-safety: TransferEngine's methods are thread-safe. Callbacks run on
// the progress thread: keep them short, never block in them (SendAndWait
// from a callback is refused; Completion::Wait there would deadlock).
// Register, Allocate, ExpectTransfer, Send and Stats may be called from
// callbacks.
// Ownership: the caller owns all memory; registered memory must stay valid
// until its Registration is destroyed, and memory named in a transfer until
// that transfer's callback has run. A Registration may outlive the engine.
// Public headers include no UCX header.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "lib/kv/kv_shape.h"
#include "lib/metrics/registry.h"

namespace swaserve::transfer {

namespace internal {
class Core;
}  // namespace internal

// How bulk data moves.
enum class Primitive : uint8_t {
  kAuto,           // per transport: AutoPrimitive(transport)
  kActiveMessage,  // ucp_am_send_nbx (rendezvous for large messages)
  kPut,            // ucp_put_nbx + ucp_ep_flush_nbx
};
absl::string_view PrimitiveName(Primitive primitive);  // "auto", "am", "put"

// Class of transport UCX chose for an endpoint's active-message lane.
enum class Transport : uint8_t {
  kUnknown,
  kSelf,          // same worker
  kSharedMemory,  // posix, sysv, cma, xpmem, knem
  kTcp,
  kRdma,  // rc, dc, ud (InfiniBand / RoCE)
};
absl::string_view TransportName(Transport transport);  // "shm", "tcp", ...

// The primitive kAuto uses on `transport` (see the README above for why),
// and the one it uses when every destination region is UCX-allocated
// (TransferEngine::Allocate) — puts over shared memory then.
Primitive AutoPrimitive(Transport transport);
Primitive AutoPrimitive(Transport transport, bool destination_ucx_allocated);

struct TransferEngineOptions {
  // Shown in UCX logs and error messages.
  std::string name = "swaserve";
  // UCX transports (UCX_TLS syntax, e.g. "tcp" or "posix,sysv,self").
  // Empty: the UCX_TLS environment variable, else UCX's default (all).
  std::string ucx_tls;
  // Primitive for every send (kAuto: per transport). SendRequest can
  // override it.
  Primitive primitive = Primitive::kAuto;
  // Deadline of a send or receive whose request gives none.
  absl::Duration default_timeout = absl::Seconds(30);
  // How often the engine checks that peers on this host are still alive,
  // and UCP's keepalive period (UCX_KEEPALIVE_INTERVAL) for the others: how
  // fast a dead peer is noticed.
  absl::Duration keepalive_interval = absl::Seconds(1);
  // How long a finished or failed receive is remembered, so late messages
  // for it get its real outcome rather than "unknown transfer id".
  absl::Duration finished_linger = absl::Seconds(30);
  // Largest single data message; longer runs are split. Larger messages
  // amortize per-message cost, smaller ones pipeline better.
  size_t max_message_bytes = size_t{8} << 20;
  // Data messages one send keeps outstanding.
  int max_inflight_messages = 16;
  // With no transfer moving, the progress thread polls this long after the
  // last sign of activity before it sleeps on the worker's event fd.
  absl::Duration spin_before_sleep = absl::Microseconds(100);
  // While a transfer is moving the progress thread polls; true: it yields
  // the CPU between empty polls (friendly to compute threads on the same
  // cores), false: it spins (lowest latency on a dedicated core).
  bool yield_while_polling = true;
  // Where to export metrics; null: none. The families are shared by every
  // engine that uses the same registry:
  //   swaserve_kv_transfer_bytes_total{direction="send|receive"}
  //       (bytes of successful transfers)
  //   swaserve_kv_transfers_total{direction,result="ok|failed"}
  //   swaserve_kv_transfer_seconds{direction}  (successful transfers)
  //   swaserve_kv_transfer_failures_total{direction,reason="timeout|
  //       peer_failure|rejected|invalid|cancelled|internal"}
  //   swaserve_kv_transfers_in_flight{direction}
  metrics::Registry* registry = nullptr;
};

// Registered memory (ucp_mem_map). Destroying it deregisters the memory;
// transfers still using it are failed (Cancelled) first and the destructor
// waits until UCX no longer touches it. Destroying it inside a transfer's
// callback is fine (that transfer no longer uses it: it is deregistered
// before the destructor returns, so the memory may be freed right after) —
// only a registration other transfers still use cannot be waited for there
// and is unmapped once they drain. Thread-compatible; may outlive the engine
// that created it.
class Registration {
 public:
  ~Registration();
  Registration(const Registration&) = delete;
  Registration& operator=(const Registration&) = delete;

  void* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  friend class TransferEngine;
  friend class internal::Core;
  Registration(std::shared_ptr<internal::Core> core, uint64_t id, void* data,
               size_t size)
      : core_(std::move(core)), id_(id), data_(data), size_(size) {}

  std::shared_ptr<internal::Core> core_;
  uint64_t id_;
  void* data_;
  size_t size_;
};

// A region of a receiver's registered memory that a sender may write into.
struct RemoteRegion {
  kv::PoolKind pool = kv::PoolKind::kFull;
  uint64_t base_address = 0;
  uint64_t length = 0;
  // Opaque packed rkey (wire.h): valid for this transfer only.
  std::string rkey;
};

// Where one transfer's data goes. Produced by the receiver's
// ExpectTransfer, carried to the sender (kv_destination.h: as proto).
struct Destination {
  std::string transfer_id;
  // Opaque worker address of the receiving engine.
  std::string worker_address;
  std::vector<RemoteRegion> regions;
};

// A slice of a Registration that a transfer writes into.
struct LocalRegion {
  const Registration* registration = nullptr;
  size_t offset = 0;
  size_t length = 0;
  kv::PoolKind pool = kv::PoolKind::kFull;
};

struct ReceiveRequest {
  // 1..128 bytes; unique among this engine's pending receives.
  std::string transfer_id;
  // At most 8 regions (one per pool today).
  std::vector<LocalRegion> regions;
  // Bytes the sender must write in total; a commit with another total fails
  // the transfer.
  uint64_t expected_bytes = 0;
  // Zero: the engine's default_timeout.
  absl::Duration timeout = absl::ZeroDuration();
};

struct ReceivedTransfer {
  std::string transfer_id;
  uint64_t bytes = 0;
  // The sender's commit payload (e.g. a serialized CommitKvRequest).
  std::string commit_payload;
  // From ExpectTransfer to the commit.
  absl::Duration elapsed;
};

// One contiguous copy: `bytes` from `local` to region `region` of the
// destination at byte `offset` from the region's base.
struct PageCopy {
  const void* local = nullptr;
  uint32_t region = 0;
  uint64_t offset = 0;
  uint64_t bytes = 0;
};

struct SendRequest {
  Destination destination;
  std::vector<PageCopy> copies;
  std::string commit_payload;
  // Zero: the engine's default_timeout.
  absl::Duration timeout = absl::ZeroDuration();
  // kAuto: the engine's option.
  Primitive primitive = Primitive::kAuto;
};

struct SendResult {
  uint64_t bytes = 0;
  // Data messages (or puts) after merging and splitting.
  uint64_t messages = 0;
  // From Send to the receiver's commit acknowledgement.
  absl::Duration elapsed;
  Primitive primitive = Primitive::kAuto;
  Transport transport = Transport::kUnknown;
};

using ReceiveCallback =
    absl::AnyInvocable<void(absl::StatusOr<ReceivedTransfer>)>;
using SendCallback = absl::AnyInvocable<void(absl::StatusOr<SendResult>)>;

// Counters of live state, for tests and debugging (a leak shows as a
// nonzero count after everything finished).
struct EngineStats {
  int64_t active_sends = 0;
  // Pending receives (not counting finished ones kept for finished_linger).
  int64_t active_receives = 0;
  // UCX requests not yet completed (data, commit, replies, flushes, closes).
  int64_t inflight_requests = 0;
  int64_t registrations = 0;
  int64_t registered_bytes = 0;
  // Endpoints to peers we send to, and back to peers that send to us.
  int64_t endpoints = 0;
};

class TransferEngine {
 public:
  // Creates the UCP context and worker and starts the progress thread.
  // Errors: UCX initialization failures (Internal/Unavailable, with UCX's
  // reason), invalid options (InvalidArgument).
  static absl::StatusOr<std::unique_ptr<TransferEngine>> Create(
      const TransferEngineOptions& options);
  // Fails every pending transfer (Cancelled), closes endpoints, stops the
  // thread. Registrations stay valid until destroyed.
  ~TransferEngine();
  TransferEngine(const TransferEngine&) = delete;
  TransferEngine& operator=(const TransferEngine&) = delete;

  // The opaque worker address peers send to.
  const std::string& worker_address() const;
  const TransferEngineOptions& options() const { return options_; }

  // Registers [data, data + size) for transfers (receiving or sending).
  // InvalidArgument for null/empty; Internal with UCX's reason otherwise.
  absl::StatusOr<std::unique_ptr<Registration>> Register(void* data,
                                                         size_t size);

  // Allocates `size` bytes that UCX chooses (UCP_MEM_MAP_ALLOCATE: with the
  // posix/sysv transports a shared-memory segment that a peer on this host
  // maps and writes straight into) and registers them; data() is the
  // address. Freed when the Registration is destroyed. For staging areas.
  absl::StatusOr<std::unique_ptr<Registration>> Allocate(size_t size);

  // Announces an incoming transfer and returns its Destination. `done` runs
  // exactly once (see README), unless this returns an error (then never).
  // Errors: InvalidArgument (id length, no/too many regions, a region outside
  // its registration, a registration of another engine), AlreadyExists (id
  // pending or finished within finished_linger), FailedPrecondition (engine
  // shutting down).
  absl::StatusOr<Destination> ExpectTransfer(ReceiveRequest request,
                                             ReceiveCallback done);

  // Fails a pending receive with Cancelled (its callback runs once UCX has
  // released its memory). NotFound when no such pending receive.
  absl::Status CancelReceive(absl::string_view transfer_id);

  // Starts a send; `done` runs exactly once. Returns an id for CancelSend.
  // Invalid requests fail through `done` (InvalidArgument), as do all other
  // errors (see README).
  uint64_t Send(SendRequest request, SendCallback done);

  // Send and wait for the outcome. FailedPrecondition when called on the
  // progress thread (from a callback).
  absl::StatusOr<SendResult> SendAndWait(SendRequest request);

  // Fails a send with Cancelled (no-op when already finished). Its callback
  // runs once UCX no longer reads the pages.
  void CancelSend(uint64_t send_id);

  EngineStats Stats() const;

 private:
  TransferEngine(const TransferEngineOptions& options,
                 std::shared_ptr<internal::Core> core);

  TransferEngineOptions options_;
  std::shared_ptr<internal::Core> core_;
};

// Turns a callback into something to wait on:
//   Completion<SendResult> c;
//   engine->Send(request, c.Callback());
//   absl::StatusOr<SendResult> r = c.Wait();
// Thread-safe. Callback() may be called once.
template <typename T>
class Completion {
 public:
  Completion() : state_(std::make_shared<State>()) {}

  absl::AnyInvocable<void(absl::StatusOr<T>)> Callback() {
    return [state = state_](absl::StatusOr<T> result) {
      {
        absl::MutexLock lock(&state->mu);
        state->result = std::move(result);
      }
      state->done.Notify();
    };
  }

  // Blocks until the callback ran; returns its argument.
  absl::StatusOr<T> Wait() {
    state_->done.WaitForNotification();
    absl::MutexLock lock(&state_->mu);
    return *state_->result;
  }

  // As Wait, but gives up after `timeout` (nullopt).
  std::optional<absl::StatusOr<T>> WaitFor(absl::Duration timeout) {
    if (!state_->done.WaitForNotificationWithTimeout(timeout)) {
      return std::nullopt;
    }
    absl::MutexLock lock(&state_->mu);
    return *state_->result;
  }

  bool HasCompleted() const { return state_->done.HasBeenNotified(); }

 private:
  struct State {
    absl::Mutex mu;
    std::optional<absl::StatusOr<T>> result ABSL_GUARDED_BY(mu);
    absl::Notification done;
  };
  std::shared_ptr<State> state_;
};

}  // namespace swaserve::transfer
