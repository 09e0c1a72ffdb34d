// KvSender: the prefill side of the KV hand-off (docs/architecture.md#request-path step 3),
// without gRPC. MakeShip() gives a PrefillJob its ship function: once the
// prompt's KV is computed it asks for the decode worker's staging (the
// `destination` callback: the service's Decode.GetKvDestination call; the
// decode worker allocates the staging only now, under its staging budget),
// plans the page copies (full KV for every prompt token, SWA KV for the last
// window) and sends them over the TransferEngine with the commit payload
// (first token, last hidden state, cached tokens, the queue wait) in-band.
//
// Errors carry a swaserve.v1.ErrorDetail naming the decode worker, retryable
// (the router retries that leg elsewhere, and the prefill's KV stays in its
// prefix cache): no staging because the decode worker's budget stayed full
// (DEADLINE_EXCEEDED or RESOURCE_EXHAUSTED from `destination`) is
// ERROR_CODE_OVERLOADED; anything else ERROR_CODE_TRANSFER_FAILED.
//
// Thread-safe; ship functions may run on any thread and complete on the
// destination callback's or the transfer engine's thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "lib/kv/page_pool.h"
#include "lib/metrics/registry.h"
#include "lib/transfer/transfer_engine.h"
#include "lib/worker/prefill_core.h"
#include "swaserve/v1/worker.pb.h"

namespace swaserve::worker {

struct KvSenderOptions {
  // Not owned; must outlive the sender and every ship it made.
  transfer::TransferEngine* transfer = nullptr;
  const kv::KvPools* pools = nullptr;  // the pools the prefill core writes
  // Bound on asking for the destination and on the transfer. Default 30 s.
  absl::Duration transfer_timeout = absl::Seconds(30);
  // Metrics (null: none): swaserve_prefill_kv_sent_bytes_total,
  // swaserve_prefill_kv_sends_total{primitive="am|put",transport}.
  metrics::Registry* registry = nullptr;
};

// Asks the decode worker for the staging of the transfer; calls `done` once.
using DestinationFn = std::function<void(absl::StatusOr<v1::KvDestination>)>;
using DestinationSource = std::function<void(absl::Duration timeout, DestinationFn done)>;

class KvSender {
 public:
  // InvalidArgument without transfer or pools; metric registration errors.
  static absl::StatusOr<std::unique_ptr<KvSender>> Create(const KvSenderOptions& options);
  ~KvSender();

  // A ship function to `decode_worker` (its registry id, for errors) under
  // `transfer_id`. Acknowledged bytes are stored in *bytes_sent (may be
  // null), which must outlive the ship.
  ShipFn MakeShip(std::string transfer_id, std::string decode_worker,
                  DestinationSource destination, std::atomic<uint64_t>* bytes_sent) const;

  struct Shared;

 private:
  explicit KvSender(std::shared_ptr<Shared> shared) : shared_(std::move(shared)) {}
  std::shared_ptr<Shared> shared_;
};

// The commit a prefill result ships with (what the decode worker's
// KvReceiver decodes).
v1::CommitKvRequest MakeCommit(const std::string& transfer_id, const PrefillResult& result);

}  // namespace swaserve::worker
