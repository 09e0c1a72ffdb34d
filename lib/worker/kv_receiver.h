// KvReceiver: the decode side of the KV hand-off (docs/architecture.md#request-path steps 2-3,
// and #failures: deadlines follow progress), without gRPC.
//
//   1. Expect(transfer id, job): checks that the request could ever run here
//      (the prompt plus its first token must fit the pools, its staging the
//      budget: RESOURCE_EXHAUSTED with ERROR_CODE_TOO_LARGE_FOR_WORKER, not
//      retryable) and records it pending. No memory is held and no timer
//      runs while the prefill leg queues and computes;
//   2. GetDestination(transfer id), when the prefill worker is about to
//      ship: takes a reservation of the staging bytes from the StagingBudget
//      (FIFO while it is full; the caller's deadline bounds the wait through
//      CancelDestination), then the staging: a block of the staging arena
//      when there is one with room (one TransferEngine::Allocate() at start:
//      UCX-allocated shared memory, registered once: single-copy puts),
//      otherwise heap memory registered for this request alone
//      (swaserve_decode_staging_fallback_total); arms the transfer, whose
//      timeout (commit_timeout) counts from here;
//   3. the commit arrives in-band over UCX: `on_received` gets the job with
//      its staging, first token and cached tokens, ready for
//      DecodeCore::Submit (the staging and its reservation are freed when
//      the core admits it or drops it).
// A transfer that does not complete within commit_timeout gives
// `on_received` DEADLINE_EXCEEDED (ERROR_CODE_TRANSFER_FAILED, retryable).
// An arena block whose transfer failed is quarantined for
// staging_quarantine before reuse: puts are one-sided, so a sender that has
// not yet seen the failure may still write into it. Forget() (the stream
// ended) cancels the receive, leaves the budget's line and frees the staging.
//
// Thread-safe. Callbacks run on the transfer engine's thread, the budget
// grant's thread or the caller's, never under the receiver's lock.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "lib/kv/page_pool.h"
#include "lib/metrics/registry.h"
#include "lib/transfer/transfer_engine.h"
#include "lib/worker/decode_core.h"
#include "lib/worker/staging_arena.h"
#include "swaserve/v1/worker.pb.h"

namespace swaserve::worker {

struct KvReceiverOptions {
  std::string worker_id;  // for error messages and details
  // Not owned; must outlive the receiver.
  transfer::TransferEngine* transfer = nullptr;
  const kv::KvPools* pools = nullptr;  // the KV shape and the too-large check
  // Bound on one KV transfer, from GetDestination (the prefill worker is
  // about to ship) to the commit. Default 60 s.
  absl::Duration commit_timeout = absl::Seconds(60);
  // Host bytes all staged requests may hold at once (arena and heap
  // together); past it GetDestination waits in line. Default 4 GiB.
  size_t staging_budget_bytes = size_t{4} << 30;
  // Bytes of the staging arena Create() allocates from `transfer` (rounded
  // down to whole 4 KiB pages); 0 (default): no arena, every request's
  // staging is heap memory registered per request.
  size_t staging_arena_bytes = 0;
  // How long an arena block whose transfer failed stays out of use; at
  // least the prefill workers' transfer timeout (their puts may land until
  // then). Default 30 s.
  absl::Duration staging_quarantine = absl::Seconds(30);
  // SWA tokens staged before the first generated token's window, for the
  // MTP layers' first draft step (the model's MTP layer count when decode
  // speculates; DecodeCoreOptions::mtp). Default 0.
  int mtp_lookback = 0;
  // Metrics (null: none): swaserve_decode_commit_wait_seconds,
  // swaserve_decode_staging_waits_total,
  // swaserve_decode_staging_budget_bytes{state="in_use|waiting|capacity"},
  // and with an arena swaserve_decode_staging_arena_bytes{state="in_use|
  // quarantined|free"} (summing to the capacity) and
  // swaserve_decode_staging_fallback_total.
  metrics::Registry* registry = nullptr;
};

// A committed transfer: `job` has its staging, first_token and
// cached_tokens set; the prefill worker's queue wait (< 0: unknown).
struct ReceivedKv {
  DecodeJob job;
  double prefill_queue_seconds = -1;
};
using ReceivedFn = std::function<void(absl::StatusOr<ReceivedKv>)>;
using KvDestinationFn = std::function<void(absl::StatusOr<v1::KvDestination>)>;

class KvReceiver {
 public:
  // InvalidArgument without transfer or pools or with a zero budget; the
  // transfer engine's error when the arena cannot be allocated.
  static absl::StatusOr<std::unique_ptr<KvReceiver>> Create(const KvReceiverOptions& options);
  ~KvReceiver();
  KvReceiver(const KvReceiver&) = delete;
  KvReceiver& operator=(const KvReceiver&) = delete;

  // Records `job` (id, prompt, sampling, stop set) pending under
  // `transfer_id`. ResourceExhausted (TOO_LARGE_FOR_WORKER) for a prompt
  // that could never be staged or run here, AlreadyExists for a pending id.
  // `on_received` is called at most once: with the committed job, or the
  // transfer's error; it may still be called (with an error) after Forget.
  absl::Status Expect(const std::string& transfer_id, DecodeJob job, ReceivedFn on_received);

  // Stages the pending transfer and calls `done` once with where to put the
  // KV: NotFound when nothing is pending under the id (or it is forgotten
  // while waiting), Aborted while another call stages it, the staging
  // error; idempotent once staged (the same destination again).
  void GetDestination(const std::string& transfer_id, KvDestinationFn done);
  // The GetDestination caller gave up: it leaves the budget's line and its
  // `done` gets Cancelled (no-op when already answered).
  void CancelDestination(const std::string& transfer_id);

  // The request's stream ended: cancels a receive in progress (its
  // on_received gets the error), answers a waiting GetDestination NotFound
  // with `why`, and drops the pending entry. No-op for an unknown id.
  void Forget(const std::string& transfer_id, absl::string_view why);

  // The staging arena (null without one) and the budget's capacity.
  const StagingArena* staging_arena() const;
  size_t staging_budget_bytes() const;
  // Transfers pending (Expect'ed and not yet committed, failed or forgotten).
  size_t pending() const;

  struct Shared;

 private:
  explicit KvReceiver(std::shared_ptr<Shared> shared) : shared_(std::move(shared)) {}
  std::shared_ptr<Shared> shared_;
};

}  // namespace swaserve::worker
