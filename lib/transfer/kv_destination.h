// The KV side of a transfer: what a decode worker stages for a request, the
// swaserve.v1.KvDestination it hands out in the gRPC handshake, and the page
// copies a prefill worker derives from its kv::Sequence (docs/architecture.md#kv-cache, #kv-transfer).
//
// Staging layout of one request (contiguous, in one Registration):
//   [full region: full_pages pages of the full pool's page size]
//   [SWA region:  swa_pages pages of the SWA pool's page size]
// Full page i holds tokens [i*page_size, (i+1)*page_size) — every prompt
// token. SWA page j holds tokens from first_swa_token + j*page_size — the
// last window only; the SWA pool holds the SWA layers and the MTP layers, so
// the MTP layers' KV travels in those pages. first_swa_token is the first
// token of the window the first generated token (position N) attends to,
// minus swa_slack, rounded down to a page:
//   kv::SwaWindowStart(N - swa_slack) =
//     floor(max(0, N - swa_slack - (W - 1)) / page_size) * page_size
// A prefill sequence always still holds it (after TrimWindow, and when it
// started from a prefix-cache hit, whose locked window covers it).
// Pages are shipped whole (a partial last page included): a page is one
// contiguous blob, and its unused token slots are never read.
//
// Both sides check that their KvShape matches the destination's KvLayout
// before any byte moves. Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "lib/kv/kv_shape.h"
#include "lib/kv/page_pool.h"
#include "lib/kv/sequence.h"
#include "lib/transfer/transfer_engine.h"
#include "swaserve/v1/common.pb.h"
#include "swaserve/v1/worker.pb.h"

namespace swaserve::transfer {

// What one request's staging area holds.
struct KvStagingPlan {
  int num_tokens = 0;
  int first_swa_token = 0;
  int full_pages = 0;
  int swa_pages = 0;
  uint64_t full_page_bytes = 0;
  uint64_t swa_page_bytes = 0;

  uint64_t full_bytes() const { return full_pages * full_page_bytes; }
  uint64_t swa_bytes() const { return swa_pages * swa_page_bytes; }
  uint64_t total_bytes() const { return full_bytes() + swa_bytes(); }
};

// First token whose SWA KV is shipped for an N-token prompt (see above).
int FirstSwaToken(const kv::KvShape& shape, int num_tokens, int swa_slack = 0);

// The staging plan of an N-token prompt. InvalidArgument for a bad shape or
// num_tokens <= 0.
absl::StatusOr<KvStagingPlan> PlanStaging(const kv::KvShape& shape,
                                          int num_tokens, int swa_slack = 0);

// The bytes a naive engine would ship: full and SWA KV for every token
// (whole pages), for comparison.
uint64_t NaiveTransferBytes(const kv::KvShape& shape, int num_tokens);

// KvLayout of a shape, and the check that a layout matches a shape
// (FailedPrecondition naming the first differing field).
v1::KvLayout LayoutOf(const kv::KvShape& shape);
absl::Status CheckLayout(const v1::KvLayout& layout, const kv::KvShape& shape);

// Destination <-> proto. ToProto adds the layout and the staging plan's
// token range; FromProto checks the fields it needs are present.
v1::KvDestination ToProto(const Destination& destination,
                          const kv::KvShape& shape, const KvStagingPlan& plan);
absl::StatusOr<Destination> DestinationFromProto(
    const v1::KvDestination& proto);

// Receiver: announces an N-token transfer whose staging area is
// [offset, offset + plan.total_bytes()) of `staging` (full region first,
// then SWA), and returns the KvDestination for the handshake.
struct KvReceiveOptions {
  std::string transfer_id;
  kv::KvShape shape;
  int num_tokens = 0;
  int swa_slack = 0;
  const Registration* staging = nullptr;
  size_t offset = 0;
  absl::Duration timeout = absl::ZeroDuration();
};
absl::StatusOr<v1::KvDestination> ExpectKvTransfer(
    TransferEngine& engine, const KvReceiveOptions& options,
    ReceiveCallback done);

// Sender: the copies that ship `sequence`'s KV for the destination's tokens
// (full pages for every token, SWA pages from first_swa_token). Errors:
// FailedPrecondition when the layout differs, the sequence is shorter than
// num_tokens, or it no longer holds a needed SWA page (its swa_slack is
// smaller than the receiver's); InvalidArgument for a malformed destination.
absl::StatusOr<std::vector<PageCopy>> PlanKvCopies(
    const kv::Sequence& sequence, const kv::KvPools& pools,
    const v1::KvDestination& destination);

// Bytes a list of copies moves.
uint64_t TotalBytes(const std::vector<PageCopy>& copies);

// The commit payload services exchange: a serialized CommitKvRequest.
std::string EncodeCommitPayload(const v1::CommitKvRequest& commit);
absl::StatusOr<v1::CommitKvRequest> DecodeCommitPayload(
    absl::string_view payload);

}  // namespace swaserve::transfer
