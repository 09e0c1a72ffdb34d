// The KV state of one request: a full page table for every token and a SWA
// page table for the last window only (docs/architecture.md#kv-cache).
//
// Token t's KV lives in full page full_pages()[t / page_size] (all full
// layers) and, while t is inside the window, SWA page swa_page(t / page_size)
// (all SWA and MTP layers). TrimWindow() releases SWA pages below
//   keep_from = max(0, length() - swa_slack - (W - 1) - (page_size - 1)),
// keeping enough for the next query (which sees the last W - 1 tokens) even
// after a Rollback() of up to swa_slack tokens (speculative drafts), and for
// a prefix hit at the last page boundary. Released pages go to the free list
// (private ones) or stop being read (the hit's shared ones: the cache's SWA
// lock is dropped once the whole hit window has slid out).
//
// Append(n) first trims to the current length, then allocates full AND SWA
// pages for all n new tokens: the forward pass of a chunk writes every new
// token's SWA KV and reads it within the chunk. So a chunk of C tokens holds
// about W + C SWA tokens until the next Append/TrimWindow/Finish; call
// TrimWindow() after the forward pass to release them early.
//
// Divergence window: when the hit was cut back by the window-safe rule (the
// cache had full KV up to D = hit.matched_tokens() but no SWA KV for the
// window ending at D), the sequence recomputes [hit, D) anyway, so it keeps
// the SWA pages of the window ending at D (tokens [D − W + 1, D)) instead of
// releasing them as it advances, and Finish() hands them to the cache with
// the trailing window. The cached path then becomes window-safe at D, where
// the next request sharing this prefix (e.g. a common system prompt) is
// likely to diverge too. Costs at most ⌈(W − 1)/page_size⌉ + 1 SWA pages per
// such request until it finishes. SequenceOptions::keep_divergence_window.
//
// Window restore: a full-KV hit (CacheHit::needs_window_restore) shares the
// full pages of [0, M) but no SWA page. BeginWindowRestore(s) plans the
// recompute of positions [s, M): Prepare() then allocates private SWA pages
// for them chunk by chunk (the forward pass writes only their SWA and MTP KV:
// full KV below cached_tokens() is never written, and SWA keys before s are
// never read — swa_key_start()), keeps the restored window [SwaWindowStart(M),
// M) until Finish() (which hands it to the cache, healing the tombstones on
// that path) and releases the rest of the stretch as the window moves on
// (the stretch before the window is exact only on the first SWA layers: it
// never goes to the cache). The restored window is exact when the restore
// starts at or before WindowRestoreStart(M, ...) — the caller's contract —
// or at L when the hit also locked the window at its window-safe length L
// (MatchOptions::lock_safe_window): then SWA keys before L are that cached
// window's, which is exactly what a straight run would have computed.
//
// A Sequence starts from an optional prefix-cache hit (whose pages it reads
// but does not own) and owns every page it allocates. Finish() hands the
// complete pages to the prefix cache (or frees them when there is none) and
// unlocks the hit; Abort() frees everything. The destructor Aborts a sequence
// that was neither finished nor aborted, so nothing leaks on error paths.
//
// Not thread-safe (see page_pool.h).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "lib/kv/page_pool.h"
#include "lib/kv/prefix_cache.h"

namespace swaserve::kv {

// Where one layer's K and V of a sequence live, for attention kernels:
// token t of this layer is at
//   K: PageData(pages[t / page_size]) + k_offset + (t % page_size) * k_token_stride
//   V: PageData(pages[t / page_size]) + v_offset + (t % page_size) * v_token_stride
// with [kv_head][dim] contiguous inside a token. For a SWA layer, pages of
// tokens before the window are kNoPage and must not be read.
struct LayerView {
  const PagePool* pool = nullptr;
  absl::Span<const PageId> pages;
  int page_size = 0;
  size_t k_offset = 0;
  size_t v_offset = 0;
  size_t k_token_stride = 0;
  size_t v_token_stride = 0;

  // Inline: attention kernels call these for every key row (perf put 7% of
  // a 64K-token prefill's samples in the out-of-line calls; attention_bench
  // and engine_bench show no difference beyond their noise).
  uint8_t* K(int token) const {
    uint8_t* base = pool->PageData(pages[token / page_size]);
    if (base == nullptr) return nullptr;
    return base + k_offset + static_cast<size_t>(token % page_size) * k_token_stride;
  }
  uint8_t* V(int token) const {
    uint8_t* base = pool->PageData(pages[token / page_size]);
    if (base == nullptr) return nullptr;
    return base + v_offset + static_cast<size_t>(token % page_size) * v_token_stride;
  }
};

struct SequenceOptions {
  // Not owned; must outlive the sequence.
  KvPools* pools = nullptr;
  // May be null (no prefix caching): Finish() then frees the pages.
  PrefixCache* cache = nullptr;
  // Extra tokens of SWA KV kept behind the window so that Rollback() of up
  // to this many tokens stays possible (speculative decoding).
  int swa_slack = 0;
  // When an allocation does not fit, evict from the cache and retry once.
  bool evict_on_demand = true;
  // Keep the SWA window at the hit's full-match end for the cache (above).
  bool keep_divergence_window = true;
  // SWA checkpoints: every this many tokens (rounded up to whole pages; 0 =
  // off, the default) the sequence keeps the SWA window ending there,
  // [SwaWindowStart(k·C), k·C), for the cache, like the divergence window,
  // for every checkpoint k·C past the hit whose window lies wholly in tokens
  // the sequence computed exactly (>= cached_tokens()). A later prompt that
  // diverges from this one between two checkpoints then has a window-safe
  // hit at most C tokens short of its full-KV match. Costs
  // ⌈(W − 1)/page_size⌉ + 1 SWA pages per C tokens while the sequence runs
  // and in the cache (LRU-evicted like any window). Kept pages are dropped
  // (all of them) when an allocation does not fit otherwise.
  int swa_checkpoint_tokens = 0;
  // Checkpoints yield to hot windows: when an allocation is short of SWA
  // pages (evict_on_demand), the cache's cold SWA KV goes first
  // (PrefixCache::EvictColdSwa), then this sequence's own checkpoint
  // windows, oldest first (they would go into the cache cold), and only then
  // hot cached windows. Off: the cache evicts cold then hot SWA KV for the
  // sequence, whose checkpoints stay. Default true.
  bool checkpoints_yield = true;
};

// The first token (page aligned) whose SWA KV the token at position
// n_tokens needs: floor(max(0, n_tokens − W + 1) / page_size) · page_size.
// What a prefill worker ships and a decode worker stages (docs/architecture.md#request-path).
int SwaWindowStart(int n_tokens, int window, int page_size);

// The first position a window restore must recompute so that the SWA KV of
// every SWA-attention layer (MTP layers included) is exact on the window that
// a query at `full_tokens` reads, [SwaWindowStart(full_tokens), full_tokens),
// page aligned: max(0, SwaWindowStart − (swa_chain_layers − 1)·(W − 1)).
// Why: full layers read the cached full KV, so only SWA layers widen the
// dependency; the i-th SWA layer on the path (main SWA layers in order, then
// MTP layer 0, 1, ... which read the main model's last hidden state) sees W − 1
// earlier positions, so its input at p is exact once positions
// [p − (i − 1)(W − 1), p] were recomputed. swa_chain_layers = the model's SWA
// layers + MTP layers. The bound is tight: starting one position later
// changes the last chain layer's KV at SwaWindowStart(full_tokens).
int WindowRestoreStart(int full_tokens, int window, int page_size, int swa_chain_layers);

// The window-restore pyramid: which rows of a restore's stretch each layer
// must compute. The restore above recomputes [s, M) through every layer (a
// rectangle), but only the chain's last layer needs its input on the whole
// window; the e-th chain layer (0-based: main SWA layers in order, then the
// MTP layers) needs its input — and writes its KV — only from
//   A(e) = SwaWindowStart(M) − (chain − 1 − e)·(W − 1)   (A(0) = s),
// and its output is needed only from A(e + 1) = A(e) + W − 1 (its attention
// there reads keys from A(e) on: all written). A full layer between chain
// layers e and e + 1 computes from A(e + 1) (its keys are the cached full
// KV); layers after the last main SWA layer from A(first MTP layer), or not
// at all below M when the model has no MTP layer. Summed over the layers
// that is about half the rectangle: for MiMo-V2.5-Pro (60 SWA + 10 full
// layers, W = 128) a restore costs ~3.9K token-equivalents instead of ~7.7K.
// Positions are clamped to [0, M].
struct WindowRestorePyramid {
  // Per main layer: the first position whose input the layer needs (its K/V
  // is computed and, for a SWA layer, written from there) ...
  std::vector<int> input_from;
  // ... and the first position whose output a later layer needs (the layer's
  // attention output and MLP run from there; >= input_from).
  std::vector<int> output_from;
  // The first position every MTP layer runs from (the main model's output
  // is needed from there on); M when the model has none.
  int mtp_from = 0;
  int mtp_layers = 0;
};
// `swa_layer[i]`: whether main layer i is a SWA layer; `mtp_layers` MTP
// layers follow (all SWA).
WindowRestorePyramid WindowRestoreRows(int full_tokens, int window, int page_size,
                                       const std::vector<bool>& swa_layer, int mtp_layers);
// The work of computing [from, M) with the pyramid, in token-equivalents:
// the rows each layer (main and MTP) runs attention and MLP for, averaged
// over the layers (the rectangle is M − from).
double WindowRestorePyramidWork(const WindowRestorePyramid& p, int from, int full_tokens);
// What one pyramid restore computes for a match M long enough that its
// stretch does not clamp at 0 (the bounds then move with M, so it is the same
// for every such page-aligned M), rounded to whole token-equivalents: what a
// worker publishes for the router's credit (cluster::WorkerInfo::
// window_restore_work). 0 without a window or SWA layer.
int WindowRestoreWorkPerRestore(int window, int page_size, const std::vector<bool>& swa_layer,
                                int mtp_layers);

// Where a window restore for a full-KV match M past the window-safe hit L
// starts and what it computes. From s = WindowRestoreStart(M), or, when
// `from_window_safe` and L >= s, from L itself (the hit then locks L's
// window: MatchOptions::lock_safe_window, Sequence::BeginWindowRestore): the
// stretch [L, M) through the pyramid's rows, reading the cached full KV and
// L's cached window, is less work than recomputing [L, M) as an ordinary
// prefill would (every layer, full KV included). `work` is in token-
// equivalents: WindowRestorePyramidWork with `pyramid`, else M − from.
struct WindowRestoreStretch {
  int from = 0;
  double work = 0;
  bool from_window_safe = false;  // from == L > 0
};
WindowRestoreStretch PlanWindowRestoreStretch(int full_tokens, int window_safe_tokens, int window,
                                              int page_size, const std::vector<bool>& swa_layer,
                                              int mtp_layers, bool pyramid,
                                              bool from_window_safe = true);

class Sequence {
 public:
  // Starts from `hit` (may be empty); takes ownership of its locks.
  Sequence(const SequenceOptions& options, CacheHit hit = CacheHit());
  ~Sequence();
  Sequence(const Sequence&) = delete;
  Sequence& operator=(const Sequence&) = delete;

  // Tokens with KV (the hit's plus appended).
  int length() const { return length_; }
  // Tokens that came from the prefix cache.
  int cached_tokens() const { return hit_tokens_; }
  int page_size() const { return page_size_; }

  // Pages Append(n) would allocate in each pool (dry run for schedulers).
  struct PageNeeds {
    int64_t full = 0;
    int64_t swa = 0;
  };
  PageNeeds NeedsFor(int n_tokens) const;

  // Extends the sequence by n tokens (a prefill chunk, a decode step or
  // speculative drafts): first trims the window to the current length
  // (TrimWindow), then allocates full and SWA pages for the new tokens in
  // both pools, all-or-nothing. ResourceExhausted (and nothing but the trim
  // changed) when the pools cannot supply the pages even after eviction.
  absl::Status Append(int n_tokens);

  // Extends an EMPTY sequence (no hit, length 0) by n tokens whose KV is
  // copied in from elsewhere (a KV transfer from a prefill worker): full
  // pages for all n tokens, SWA pages only from first_swa_token (page
  // aligned, at most SwaWindowStart(n, W, page_size), so that the next token
  // sees its whole window). All-or-nothing like Append; the caller then
  // writes the KV bytes into the pages. InvalidArgument for a non-empty
  // sequence or a bad first_swa_token; ResourceExhausted when it does not fit.
  absl::Status AppendPrefilled(int n_tokens, int first_swa_token);

  // Plans a window restore from from_token (see above): the sequence must
  // come from a full-KV hit and have computed nothing yet; 0 <= from_token <
  // cached_tokens(), and from_token == the hit's window_safe_tokens() when
  // the hit locked that window. InvalidArgument otherwise.
  absl::Status BeginWindowRestore(int from_token);

  // Pages for computing positions [from, from + n): from is length() (then
  // the same as Append(n)) or, during a window restore, the next position of
  // the restore stretch (SWA pages for its part below cached_tokens(), full
  // and SWA pages for the part beyond). Trims the window for a query at
  // `from` first. InvalidArgument for any other `from`; ResourceExhausted
  // like Append.
  absl::Status Prepare(int from, int n);

  // Window restore in progress or planned: its first position, else -1.
  int restore_from() const { return restore_from_; }
  // SWA keys before this position are not read (no SWA KV exists there):
  // restore_from() during a restore (the start of the hit's cached window
  // when it restores from there), else 0.
  int swa_key_start() const { return restore_from_ < 0 ? 0 : swa_key_start_; }

  // Releases SWA pages below keep_from (see above; during a window restore,
  // counted from the end of the last prepared chunk). Idempotent.
  void TrimWindow();

  // Drops the last n tokens (rejected drafts). FailedPrecondition when that
  // would cut into the cached prefix or need SWA KV already released.
  absl::Status Rollback(int n_tokens);

  absl::Span<const PageId> full_pages() const { return full_pages_; }
  // SWA page of page index p, or kNoPage when outside the window.
  PageId swa_page(int page_index) const;
  // First page index whose SWA KV is kept.
  int swa_first_page() const { return swa_first_page_; }
  // The SWA table for page indices [0, pages): kNoPage before the window.
  absl::Span<const PageId> swa_pages() const { return swa_pages_; }

  // Views for attention; layer is the index within the pool.
  LayerView FullLayer(int layer) const;
  LayerView SwaLayer(int layer) const;

  // Hands the complete pages (page_hashes.size() of them, at most
  // length() / page_size; fewer is fine, e.g. the prompt only) to the prefix
  // cache, frees the rest, unlocks the hit. The sequence is then empty.
  // Pages [l3_written_from_page, l3_written_to_page) are already in L3 (the
  // request's checkpoints, PrefixCache::CheckpointToL3): see Insert.
  void Finish(absl::Span<const uint64_t> page_hashes, int l3_written_from_page = 0,
              int l3_written_to_page = 0);
  // Frees every page it owns and unlocks the hit. The sequence is then empty.
  void Abort();

  bool finished() const { return done_; }
  // The prefix-cache hit this sequence started from (locked until Finish).
  const CacheHit& hit() const { return hit_; }
  // SWA pages this sequence owns (allocated by it, kept windows included;
  // the hit's shared pages excluded): what an admission check counts as
  // already held.
  int64_t private_swa_pages() const;
  // The windows kept for the cache (divergence, restored, checkpoints) were
  // given up so that an allocation fits (see swa_checkpoint_tokens).
  bool kept_windows_dropped() const { return kept_dropped_; }
  // Checkpoint pages given up to make room before hot cached windows
  // (SequenceOptions::checkpoints_yield), so far.
  int64_t checkpoint_pages_yielded() const { return checkpoint_pages_yielded_; }

 private:
  int KeepFromToken(int length) const;
  // Page p is in the divergence / restored window or a checkpoint window.
  bool Kept(int page_index) const;
  // Frees every kept SWA page below the window (checkpoints and divergence
  // window); true if it freed any.
  bool DropKept();
  // Frees checkpoint pages below the window, whole windows from the oldest,
  // until at least `need` are freed (or none is left); returns how many.
  int64_t DropCheckpoints(int64_t need);
  // Makes room for n_full full and n_swa SWA pages by evicting from the
  // cache (evict_on_demand); with checkpoints_yield, this sequence's
  // checkpoints go after the cache's cold SWA KV and before its hot.
  void MakeRoom(int64_t n_full, int64_t n_swa);
  void FreePrivateFrom(int page_index);
  bool IsShared(int page_index) const { return page_index < hit_pages_; }
  bool IsSharedSwa(int page_index) const { return page_index < swa_shared_end_; }
  // Allocates n_full full pages and SWA pages for page indices
  // [swa_from_page, swa_to_page) that have none, all-or-nothing.
  absl::Status Allocate(int64_t n_full, int swa_from_page, int swa_to_page, const char* what,
                        int n_tokens);

  KvPools* pools_;
  PrefixCache* cache_;
  int page_size_;
  int window_;
  int swa_slack_;
  bool evict_on_demand_;
  bool checkpoints_yield_;
  CacheHit hit_;
  int hit_tokens_ = 0;
  int hit_pages_ = 0;
  int length_ = 0;
  std::vector<PageId> full_pages_;
  std::vector<PageId> swa_pages_;  // one per page index, kNoPage outside
  int swa_first_page_ = 0;
  // Page indices [keep_begin_, keep_end_) are not released by TrimWindow
  // (the divergence window; empty when keep_begin_ == keep_end_).
  int keep_begin_ = 0;
  int keep_end_ = 0;
  // Checkpoint interval in pages (0: none) and the first token a
  // checkpoint window may start at (exactly computed KV only).
  int checkpoint_pages_ = 0;
  int checkpoint_floor_ = 0;
  bool kept_dropped_ = false;
  int64_t checkpoint_pages_yielded_ = 0;
  // SWA pages below this page index are the hit's (shared, not freed).
  int swa_shared_end_ = 0;
  // Window restore: first position (-1: none) and the end of the last
  // prepared chunk (TrimWindow keeps what a query there reads).
  int restore_from_ = -1;
  int swa_key_start_ = 0;
  int frontier_ = 0;
  // Window restore: SWA pages from restore_from_ up to this page index are
  // inexact (never cached).
  int restore_exact_page_ = 0;
  bool done_ = false;
};

}  // namespace swaserve::kv
