// Host-memory staging of one request's KV between prefill and decode
// (docs/architecture.md#request-path steps 2–4).
//
// A decode worker allocates a KvStaging when a request arrives (before any
// pool page is committed to it), the prefill worker writes the prompt's KV
// into it (over UCX, or by memcpy in monolithic mode), and only when the
// request is admitted into the running batch are the bytes copied into pool
// pages (AdmitFromStaging). So requests can wait for decode capacity without
// holding pool pages.
//
// Layout (the KvDestination of proto/swaserve/v1/common.proto): two regions
// of whole pages in the pools' own page format (kv::PoolGeometry, page-first,
// so a page is one contiguous blob and copies are per page):
//   full region: page i holds tokens [i·P, (i+1)·P) of every full-attention
//                layer, for i < ceil(num_tokens / P);
//   SWA region:  page j holds tokens starting at first_swa_token + j·P of the
//                SWA and MTP layers, for the pages up to ceil(num_tokens / P),
//                where first_swa_token = kv::SwaWindowStart(num_tokens, W, P)
//                (the window the first generated token attends to).
// Only the SWA KV of the last window moves, never the whole prompt's.
//
// Memory: Create() allocates a page-aligned block from the heap (a transfer
// engine then registers it per request); CreateIn() carves it out of a
// StagingArena (memory registered once, e.g. from TransferEngine::Allocate,
// which gives single-copy puts over shared memory) and returns the block on
// destruction. A KvStaging from CreateIn holds a shared_ptr to its arena, so
// the arena — and the memory it keeps alive — outlives every staging carved
// from it.
//
// Not thread-safe; the memory is stable for the object's lifetime (so a
// transfer engine may register it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "lib/kv/kv_shape.h"
#include "lib/kv/page_pool.h"
#include "lib/kv/sequence.h"
#include "lib/worker/staging_arena.h"
#include "lib/worker/staging_budget.h"

namespace swaserve::worker {

// Geometry of one request's staged KV.
struct StagedKvLayout {
  int num_tokens = 0;
  int page_size = 16;
  int first_swa_token = 0;
  size_t full_page_bytes = 0;
  size_t swa_page_bytes = 0;

  // For num_tokens prompt tokens of a model with this KV shape, with SWA KV
  // from kv::SwaWindowStart (the least that works) or from an explicit,
  // page-aligned earlier token (a transfer plan's choice).
  static StagedKvLayout For(const kv::KvShape& shape, int num_tokens);
  static StagedKvLayout For(const kv::KvShape& shape, int num_tokens, int first_swa_token);

  int full_pages() const { return (num_tokens + page_size - 1) / page_size; }
  int swa_pages() const { return full_pages() - first_swa_token / page_size; }
  size_t full_bytes() const { return full_page_bytes * full_pages(); }
  size_t swa_bytes() const { return swa_page_bytes * swa_pages(); }
  size_t total_bytes() const { return full_bytes() + swa_bytes(); }
};

class KvStaging {
 public:
  // Allocates both regions in one page-aligned heap block. InvalidArgument
  // for a bad layout; ResourceExhausted when the allocation fails.
  static absl::StatusOr<std::unique_ptr<KvStaging>> Create(const StagedKvLayout& layout);
  // Both regions in one block of `arena` (not null), returned to it when
  // the staging is destroyed. InvalidArgument for a bad layout or a null
  // arena; ResourceExhausted when the arena has no free run that large now
  // (the caller may fall back to Create).
  static absl::StatusOr<std::unique_ptr<KvStaging>> CreateIn(const StagedKvLayout& layout,
                                                             std::shared_ptr<StagingArena> arena);
  ~KvStaging();
  KvStaging(const KvStaging&) = delete;
  KvStaging& operator=(const KvStaging&) = delete;

  const StagedKvLayout& layout() const { return layout_; }
  // Both regions, contiguous: [full region | SWA region] (what a transfer
  // engine registers once).
  uint8_t* data() { return full_; }
  size_t size() const { return layout_.total_bytes(); }
  uint8_t* full_region() { return full_; }
  uint8_t* swa_region() { return swa_; }
  const uint8_t* full_region() const { return full_; }
  const uint8_t* swa_region() const { return swa_; }

  // The arena this staging was carved from (null: heap, from Create), the
  // byte offset of data() from the arena's base (0 for heap staging) — what
  // a receiver passes as the registration offset of the transfer — and the
  // size of its arena block (size() rounded up to the arena's alignment; 0
  // for heap staging).
  const StagingArena* arena() const { return arena_.get(); }
  size_t arena_offset() const { return arena_offset_; }
  size_t arena_block_bytes() const { return arena_block_bytes_; }

  // The staging budget's reservation covering this staging's bytes (decode
  // workers): held until the staging is destroyed, so the budget counts
  // exactly the staged memory that exists.
  void set_reservation(std::unique_ptr<StagingBudget::Reservation> r) { reservation_ = std::move(r); }

 private:
  explicit KvStaging(const StagedKvLayout& layout) : layout_(layout) {}
  // Declared first: released after the memory (destroyed last).
  std::unique_ptr<StagingBudget::Reservation> reservation_;
  StagedKvLayout layout_;
  uint8_t* full_ = nullptr;
  uint8_t* swa_ = nullptr;
  std::shared_ptr<StagingArena> arena_;  // null: full_ is from the heap
  size_t arena_offset_ = 0;
  size_t arena_block_bytes_ = 0;
};

// Copies the KV of the first layout.num_tokens tokens of `seq` (a prefilled
// sequence whose pools allocate memory) into `staging`: the monolithic path,
// and what a transfer does byte for byte. FailedPrecondition when the
// sequence is shorter or no longer has the SWA pages of the window.
absl::Status CopySequenceToStaging(const kv::Sequence& seq, const kv::KvPools& pools,
                                   KvStaging* staging);

// Places staged KV into `seq` (empty; see kv::Sequence::AppendPrefilled) and
// copies the bytes into its new pages. ResourceExhausted (and nothing
// changed) when the pools cannot take it now.
absl::Status AdmitFromStaging(const KvStaging& staging, kv::KvPools& pools,
                              kv::Sequence* seq);

}  // namespace swaserve::worker
