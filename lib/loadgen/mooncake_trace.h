// Mooncake-format request traces (FAST '25, kvcache-ai/Mooncake) and the
// deterministic synthetic prompts that replay them with real token ids.
//
// A trace is JSONL, one request per line:
//   {"timestamp": 0, "input_length": 6758, "output_length": 500,
//    "hash_ids": [0, 1, 2, ...]}
// timestamp is the arrival in ms from the trace start; hash_ids has one id per
// 512-token block of the prompt and is chained (an id stands for its block and
// everything before it), so two requests share a prefix exactly as far as
// their leading ids agree (see docs/benchmarks.md#traces).
//
// SynthesizePrompt turns a request into token ids: block i's tokens are a pure
// function of hash_ids[i] alone (the chain is implicit in the id), so requests
// sharing leading ids share exactly those leading tokens, and a prompt is cut
// to its (scaled) input length inside its last block. This is "plain
// per-block synthesis" in the README's words: a continuation's copy of the
// previous prompt's partial last block is not reconstructed.
//
// Free functions, no state: thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"

namespace swaserve::loadgen {

struct TraceRequest {
  int64_t timestamp_ms = 0;
  int64_t input_length = 0;
  int64_t output_length = 0;
  std::vector<int64_t> hash_ids;
};

// Reads a Mooncake-format JSONL trace. Blank lines are skipped. Errors
// (unreadable file, bad JSON, missing or mistyped field, negative lengths,
// input_length > 0 without hash_ids) name the file and the 1-based line.
// limit 0 = all; otherwise the first `limit` requests.
absl::StatusOr<std::vector<TraceRequest>> LoadMooncakeTrace(
    const std::string& path, int64_t limit = 0);

struct ScaleOptions {
  // Token lengths multiplied by this (a 512-token block becomes
  // round(512*length_scale) tokens, >= 1).
  double length_scale = 1.0;
  // Arrival times multiplied by this (0.5 = twice the rate).
  double time_scale = 1.0;
  // 0 = no cap; longer prompts are truncated to it (whole blocks: to the
  // largest multiple of the scaled block size <= the cap, or to the cap
  // itself when the cap is smaller than one block).
  int64_t max_input_tokens = 0;
  // 0 = no cap.
  int64_t max_output_tokens = 0;
  // Trace block size.
  int block_tokens = 512;
};

// Tokens per block after scaling: max(1, round(block_tokens * length_scale)).
int64_t ScaledBlockTokens(const ScaleOptions& s);

// The prompt length SynthesizePrompt produces: every block but the last
// becomes ScaledBlockTokens(s) tokens, the last one (input_length minus the
// full blocks before it) is scaled and rounded, kept in [1, scaled block];
// then max_input_tokens applies. 0 for an empty prompt. When the trace has
// more tokens than ids*block_tokens, the excess is ignored (ids bound the
// prompt).
int64_t ScaledInputLength(const TraceRequest& r, const ScaleOptions& s);

// max(1, round(output_length * length_scale)), capped by max_output_tokens
// (never 0: max_tokens = 0 would mean "server default").
int64_t ScaledOutputLength(const TraceRequest& r, const ScaleOptions& s);

// Scaled arrival time in ms: round(timestamp_ms * time_scale).
int64_t ScaledTimestampMs(const TraceRequest& r, const ScaleOptions& s);

// The tokens of one block with hash id `hash_id`: `count` ids, a pure
// function of (hash_id, index within the block), in [first_id, vocab_size).
// Shorter blocks are prefixes of longer ones for the same id.
void AppendBlockTokens(int64_t hash_id, int64_t count, uint32_t vocab_size,
                       uint32_t first_id, std::vector<uint32_t>* out);

// Deterministic synthetic prompt of ScaledInputLength(r, s) tokens: block i's
// tokens are AppendBlockTokens(hash_ids[i], ...), so requests sharing leading
// hash ids share exactly those leading tokens (at the scaled block size);
// the last block is cut to the scaled input length. Token ids are in
// [first_id, vocab_size) to avoid special tokens; requires first_id <
// vocab_size (otherwise every token is first_id).
std::vector<uint32_t> SynthesizePrompt(const TraceRequest& r,
                                       const ScaleOptions& s,
                                       uint32_t vocab_size,
                                       uint32_t first_id = 0);

// Synthesizes the prompts of a trace in trace order, optionally
// reconstructing conversation continuations (README "Caveat for SWA models"):
// when request B's leading ids equal all full-block ids of an earlier request
// A (at least one) and B is longer, B's first ScaledInputLength(A) tokens are
// A's prompt tokens (A's own reconstruction included), and B's remaining
// tokens continue B's blocks at their positions. Among several such A the
// most recent one with the most full blocks wins. Without
// reconstruct_continuations, Next(r) == SynthesizePrompt(r, ...).
//
// Memory: a few segments per request seen (not its tokens). Not thread-safe.
class PromptSynthesizer {
 public:
  struct Options {
    ScaleOptions scale;
    uint32_t vocab_size = 1000;
    uint32_t first_id = 0;
    bool reconstruct_continuations = false;
  };
  explicit PromptSynthesizer(const Options& options) : options_(options) {}

  // The prompt of the next request (ScaledInputLength(r, scale) tokens).
  // Call in trace order.
  std::vector<uint32_t> Next(const TraceRequest& r);

 private:
  // `count` tokens of block `hash_id`'s stream starting at `offset`.
  struct Segment {
    int64_t hash_id = 0;
    int64_t offset = 0;
    int64_t count = 0;
  };
  struct Entry {
    int64_t full_blocks = 0;
    int64_t length = 0;  // scaled, untruncated
    std::shared_ptr<const std::vector<Segment>> segments;
  };

  const Options options_;
  // Keyed by the id of the request's last full block.
  absl::flat_hash_map<int64_t, Entry> by_last_full_id_;
};

}  // namespace swaserve::loadgen
