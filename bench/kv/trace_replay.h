// The replay behind kv_trace_replay_bench (hit rates of the dual pools,
// window restore and the tiers): the Mooncake trace loaded and its prompts synthesized as chained
// page hashes, and one replay of them through a PrefixCache of a given size
// (kv_trace_replay_bench.cc describes the method and the figures). Split out
// of the bench's driver, which sizes the caches, prints the tables and
// writes the JSON.
//
// Not thread-safe; a Replay owns everything it creates. Bad input (an
// unreadable trace, pools that cannot be made) ends the process (bench::Die).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "lib/kv/kv_shape.h"
#include "nlohmann/json.hpp"

namespace swaserve::kv::replay {

inline constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// How the dual+restore variant and the counting behave (the bench's flags).
struct ReplayKnobs {
  // Sequence's keep_divergence_window (see lib/kv/sequence.h); off with
  // --no-divergence-window to measure what it adds.
  bool keep_divergence_window = true;
  // SequenceOptions::swa_checkpoint_tokens of the dual+restore variant
  // (--checkpoint TOKENS; 0 = off).
  int checkpoint_tokens = 2048;
  // Restores computed as the worker does by default, as a pyramid
  // (kv::WindowRestoreRows: each layer only the rows later layers need); off
  // with --no-pyramid (every layer over the whole stretch [s, M)). A restored
  // hit then counts M minus the pyramid's work in token-equivalents
  // (kv::WindowRestorePyramidWork), and the restore choice uses that work.
  bool pyramid = true;
  // Restores may start at the window-safe hit L itself when L is past the
  // stretch's start (kv::PlanWindowRestoreStretch), as the worker does by
  // default; off with --no-safe-start (only restores from the stretch's start).
  bool safe_start = true;
  // PrefixCacheOptions::cold_superseded_windows for dual+restore, as the
  // worker does by default; off with --no-cold-superseded.
  bool cold_superseded = true;
  // SequenceOptions::checkpoints_yield (the worker's default): a request's
  // checkpoint windows give way before hot cached windows; off with
  // --no-checkpoint-yield.
  bool checkpoints_yield = true;
  // Requests before this index warm the cache but are not counted (hit,
  // prompt and restore figures): with --limit, a hold-out split (choose a
  // setting on the first part, measure it on the rest). 0: count all.
  size_t measure_from = 0;
};

struct TraceRequest {
  int64_t timestamp = 0;
  int input_length = 0;
  int output_length = 0;
  std::vector<int64_t> hash_ids;
};

// Prompts of all requests as chained page hashes, stored back to back.
struct Prompts {
  std::vector<int> length;       // tokens
  std::vector<int64_t> offset;   // into hashes; size() = requests + 1
  std::vector<uint64_t> hashes;
  int64_t total_tokens = 0;
  int64_t total_pages_upper = 0;  // sum of ceil(length / page)
  int max_length = 0;
  int64_t reconstructed_requests = 0;
  int64_t reconstructed_tokens = 0;

  size_t size() const { return length.size(); }
  absl::Span<const uint64_t> Hashes(size_t i) const {
    return absl::MakeConstSpan(hashes).subspan(offset[i], offset[i + 1] - offset[i]);
  }
};

struct CacheSpec {
  std::string name;      // "dual", "single", "single7x", ...
  std::string budget;    // "3M" (single-pool tokens) or "inf"
  KvShape shape;
  int64_t full_pages = 0;
  int64_t swa_pages = 0;
  double ratio = 0;      // SizePools ratio used (0 for infinite)
  bool infinite = false;
  std::string synthesis = "reconstructed";
  // Window restore: a full-KV match past the window-safe hit
  // recomputes only the bounded stretch before it (kv::WindowRestoreStart,
  // chain = the shape's SWA layers) when that saves >= 64 tokens. As in a
  // worker with restore on: the cache keeps restorable tombstones
  // (PrefixCacheOptions::keep_restorable_tombstones) and sequences keep cold
  // SWA checkpoints every --checkpoint tokens (default 2048, the worker's).
  bool restore = false;
  // L2 tier (0: none): host pools of this many pages; before each
  // lookup the request loads its match's L2 part back (PrefixCache::LoadBack).
  int64_t l2_full_pages = 0;
  int64_t l2_swa_pages = 0;
  // L3 tier (0: none): a MemoryPageStore of this many page blobs (metadata
  // pools store empty blobs, so the bound counts blobs); before each lookup
  // the prompt's L3 part is fetched (FetchFromL3, synchronously: the replay
  // has no clock, so every prefetch completes) and attached, then loaded back.
  int64_t l3_pages = 0;
  // Layer-grouped SWA pool, an estimate (layer_group_shadow.h; needs
  // restore, no tiers): the first `group_bottom_layers` SWA layers form the
  // bottom group, with `bottom_pages` pages of its own; swa_pages is then the
  // top group's pages. 0: one SWA pool, as built.
  int group_bottom_layers = 0;
  int64_t bottom_pages = 0;
};

struct ReplayResult {
  CacheSpec spec;
  int64_t requests = 0;
  int64_t failed = 0;
  int64_t prompt_tokens = 0;
  int64_t hit_tokens = 0;
  int64_t matched_tokens = 0;      // full-KV match (before the window rule)
  // Window restore: hits minus recomputed tokens (= hit_tokens without
  // restore), restores and the tokens they recomputed.
  int64_t effective_hit_tokens = 0;
  int64_t restores = 0;
  int64_t restored_tokens = 0;
  int64_t window_lost_tokens = 0;
  // Layer groups: hits (and restores from the window-safe hit) whose
  // window had only its top half, and the work of restoring the bottom
  // halves (token-equivalents, counted against the effective hit).
  int64_t bottom_restores = 0;
  double bottom_restore_work = 0;
  int64_t bottom_evicted_pages = 0;
  int64_t bottom_peak_pages = 0;
  int64_t cached_full_pages = 0;   // at the end
  int64_t cached_swa_pages = 0;
  int64_t peak_cached_full_pages = 0;
  double pool_bytes = 0;           // pools' total bytes (the budget)
  double cached_bytes = 0;         // bytes of cached pages at the end
  int64_t evicted_full_pages = 0;
  int64_t evicted_swa_pages = 0;
  int64_t tombstoned_nodes = 0;
  int64_t nodes = 0;
  int64_t tombstone_nodes = 0;
  int64_t demoted_pages = 0;      // L1 -> L2
  int64_t loaded_back_pages = 0;  // L2 -> L1
  int64_t l3_attached_pages = 0;  // L3 -> L2
  int64_t l3_written_pages = 0;
  double seconds = 0;

  double HitRate() const { return prompt_tokens ? double(hit_tokens) / prompt_tokens : 0; }
  double EffectiveHitRate() const {
    return prompt_tokens ? double(effective_hit_tokens) / prompt_tokens : 0;
  }
  int64_t CachedTokens(int ps) const { return cached_full_pages * ps; }
  double TokensPerGiBBudget(int ps) const {
    return pool_bytes > 0 ? CachedTokens(ps) / (pool_bytes / kGiB) : 0;
  }
  double TokensPerGiBUsed(int ps) const {
    return cached_bytes > 0 ? CachedTokens(ps) / (cached_bytes / kGiB) : 0;
  }
  bool Evicted() const { return evicted_full_pages > 0; }
};

// The trace's requests in timestamp order (the first `limit` when > 0).
std::vector<TraceRequest> LoadTrace(const std::string& path, int64_t limit);
// Every request's prompt tokens synthesized (continuations reconstructed
// when `reconstruct`) and hashed into pages of `page_size`.
Prompts BuildPrompts(const std::vector<TraceRequest>& trace, int page_size, bool reconstruct);
// One replay of `prompts` through the cache `spec` describes, prefilling in
// `chunk`-token chunks.
ReplayResult Replay(const CacheSpec& spec, const Prompts& prompts, int chunk,
                    const ReplayKnobs& knobs);
// One result as the bench's JSON record.
nlohmann::json ToJson(const ReplayResult& r, int ps);

}  // namespace swaserve::kv::replay
