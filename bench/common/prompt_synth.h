// Deterministic token prompts for Mooncake trace requests, shared by
// bench/kv/kv_trace_replay_bench and bench/router/policy_sim so that both
// replay the same prompts. Part of swaserve::bench_util.
//
// Each 512-token block id of a request's hash_ids gets its own pseudo-random
// tokens (GenToken). With `reconstruct`, a request whose prompt continues an
// earlier one past that one's last full block (the trace hashes only full
// blocks identically) starts its first unseen block with the earlier
// request's partial last block, so prefix caches see the real continuation.
// Requests must be given in timestamp order: a block's contents depend on
// what was seen before.
//
// Not thread-safe; one synthesizer per replay.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"

namespace swaserve::bench {

// Tokens per Mooncake hash id.
inline constexpr int kTraceBlockTokens = 512;

// The splitmix64 finalizer (also usable as a cheap deterministic hash).
uint64_t Mix64(uint64_t x);

// Token `pos` of block `block_id` (splitmix64 of a fixed seed, block and
// position, modulo Qwen's vocabulary of 152064).
uint32_t GenToken(int64_t block_id, int pos);

class PromptSynthesizer {
 public:
  explicit PromptSynthesizer(bool reconstruct) : reconstruct_(reconstruct) {}

  // Fills `out` with the `input_length` prompt tokens of a request with
  // `hash_ids` (at least ceil(input_length / 512) of them; extra ids are
  // ignored for the tokens). `*reconstructed`: tokens its first unseen block
  // took from an earlier request (0 when none).
  void Tokens(const std::vector<int64_t>& hash_ids, int input_length,
              std::vector<uint32_t>* out, int* reconstructed);

 private:
  struct Recipe {
    int64_t src;  // block whose first t tokens this block starts with
    int t;
  };
  struct Ending {
    int length;       // the earlier request's input_length
    int64_t tail_id;  // id of its partial last block
  };

  // Tokens [begin, end) of block `id` into block[begin..end).
  void Fill(int64_t id, int begin, int end, uint32_t* block) const;

  bool reconstruct_;
  absl::flat_hash_set<int64_t> seen_;
  absl::flat_hash_map<int64_t, std::vector<Ending>> by_last_full_;
  absl::flat_hash_map<int64_t, Recipe> recipes_;
};

}  // namespace swaserve::bench
