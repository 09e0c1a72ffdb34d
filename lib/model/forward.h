// The CPU forward pass of a MiMo-V2-style hybrid SWA + MoE model over paged
// KV (docs/architecture.md#model, #kv-cache, #request-path).
//
// One Forward() call runs a ragged batch: any mix of prefill chunks of
// several requests and decode steps of many. Each item names its request's
// kv::Sequence (already Append()ed to cover the item's tokens), the new token
// ids and their first position. KV of the new tokens is written into the
// sequence's pages (full-attention layers into the full pool, SWA layers
// into the SWA pool); attention reads earlier tokens' KV from the pages, so
// prefix-cache hits and chunked prefill need nothing special. SWA layers
// read only keys k > q - W.
//
// Window restore (kv::Sequence::BeginWindowRestore): an item may cover
// positions below the sequence's cached prefix; there the full layers read
// the cached full KV and write nothing (shared pages), the SWA and MTP
// layers write their KV, and SWA keys before Sequence::swa_key_start() are
// not read.
//
// Per layer: RMSNorm → Q/K/V projections (V × attention_value_scale) → NeoX
// RoPE on the first rotary_dim dims with the layer type's theta → GQA
// attention with optional per-head sink logit → o_proj → residual → RMSNorm →
// dense SwiGLU MLP, or MoE (sigmoid router, top-k by score + correction bias,
// weights = unbiased scores normalised to sum 1 × routed_scaling_factor,
// tokens grouped per expert) → residual. Then the final RMSNorm and lm_head.
//
// MTP (ForwardMtp): layer k maps (token t at position p+1, hidden h of
// position p) to eh_proj(concat(enorm(embed(t)), hnorm(h))) → one SWA block
// with sink and dense MLP (its KV in the SWA pool at pool layer
// num_swa_layers + k, at position p) → final_layernorm → lm_head, whose
// argmax drafts the token at p + 2.
//
// All kernels are batch-invariant (cpu_kernels.h): an item's outputs do not
// depend on what else is in the batch or how its prompt was chunked.
//
// An Engine owns the weights (kept in the checkpoint's format: F32, BF16, F16
// or FP8 E4M3 with block scales; projections packed for the GEMM, which
// widens them per 32-column panel, cpu_kernels.h)
// and scratch buffers that only grow, so a steady decode loop that reuses
// its ForwardOutput does not allocate. Forward is not reentrant (one
// scheduler thread drives it); kernels use KernelThreads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "lib/kv/sequence.h"
#include "lib/model/checkpoint.h"
#include "lib/model/config.h"

namespace swaserve::model {

// Rows of an item's new tokens whose input embedding is given instead of
// looked up (a multimodal placeholder's encoder output): tokens
// [offset, offset + rows) of the item take data[(j − offset) · hidden_size
// ...] (rows × hidden_size f32, owned by the caller, alive for the call)
// instead of embed_tokens[token]. The token ids there still count (range
// checks; the caller keeps them as the placeholder id). An MTP layer's input
// embedding of such a token is the override too.
struct EmbeddingOverride {
  int offset = 0;
  int rows = 0;
  const float* data = nullptr;
};

struct ForwardItem {
  kv::Sequence* seq = nullptr;
  // New tokens, at positions [start, start + tokens.size()); the sequence's
  // length must be >= start + tokens.size() and its KV for positions < start
  // must have been written by earlier Forward calls (or a cache hit; for a
  // window restore, full KV only from the hit and SWA KV from
  // swa_key_start()).
  absl::Span<const uint32_t> tokens;
  int start = 0;
  // Logits for every new token (speculative verification, prompt logprobs)
  // instead of only the last one.
  bool all_logits = false;
  // No logits row at all (first_row is then -1): KV and hidden states only
  // (MTP layers catching up on positions whose draft is not needed).
  bool no_logits = false;
  // Embedding overrides, in increasing offset order, not overlapping, inside
  // the item's tokens (InvalidArgument otherwise).
  absl::Span<const EmbeddingOverride> embeddings;
  // Window restore pyramid: > 0 marks the item as (part of) a
  // window restore to this M (the sequence's cached_tokens(), started by
  // BeginWindowRestore). Each main layer then computes only the rows whose
  // output a later layer needs for the window at M (kv::WindowRestoreRows):
  // a SWA layer writes its KV from input_from on and runs attention and MLP
  // from output_from on, a full layer from output_from; rows below are
  // dropped, so the item's hidden rows (logits, last_hidden, all_hidden)
  // start at ForwardOutput::first_position (an item may keep none). SWA
  // keys below the layer's input_from (ForwardMtp: below mtp_from) are not
  // read. The window's SWA and MTP KV comes out byte-identical to the full
  // recompute's (batch-invariant kernels) at about half its work. Rows at or
  // past M are computed as usual. 0: every row through every layer.
  int window_restore_end = 0;
};

struct ForwardOutput {
  // Logits rows, vocab_size floats each: for each item in order, one row
  // (its last token) or tokens.size() rows (all_logits).
  std::vector<float> logits;
  // First logits row of each item (-1 for a no_logits item, or an item that
  // kept no row: window_restore_end).
  std::vector<int> first_row;
  // Position of each item's first hidden row: its start, or later for a
  // window-restore item whose rows below were dropped (start + tokens when
  // none was kept). all_hidden holds only the kept rows.
  std::vector<int> first_position;
  // Final hidden state (after the last layer, before the final norm) of each
  // item's last token, hidden_size floats per item: the MTP input (zeros for
  // an item that kept no row).
  std::vector<float> last_hidden;
  // With keep_all_hidden: the same for every new token, in row order.
  std::vector<float> all_hidden;
};

struct PackedWeight;

// A narrow lm_head for MTP drafts (speculative decoding): the draft logits
// of `ids()` only, every other token -infinity, so a draft is drawn from
// those tokens alone. The main model verifies every draft against the whole
// vocabulary, so the output is exact whatever the set (greedy: the same
// tokens; sampling: the same distribution, with q the draft's own
// distribution over the set); a set holding the tokens the model emits most
// keeps the acceptance while a draft reads ids().size() / vocab of the
// lm_head's bytes (the idea of FR-Spec and of SGLang's
// --speculative-token-map). Made by Engine::MakeDraftHead, or filled (again)
// by Engine::FillDraftHead, which reuses its memory. Not thread-safe: refill
// it only while no forward reads it.
class DraftHead {
 public:
  DraftHead();  // empty: no ids (fill it before use)
  ~DraftHead();
  DraftHead(const DraftHead&) = delete;
  DraftHead& operator=(const DraftHead&) = delete;
  // Ascending, unique, each in [0, vocab_size).
  const std::vector<int32_t>& ids() const { return ids_; }

 private:
  friend class Engine;
  std::vector<int32_t> ids_;
  std::unique_ptr<PackedWeight> weight_;  // lm_head's columns ids_
};

struct EngineOptions {
  // Checkpoint directory (config.json + safetensors). Required.
  std::string checkpoint_dir;
  // Kernel threads (0: all cores).
  int threads = 0;
};

class Engine {
 public:
  static absl::StatusOr<std::unique_ptr<Engine>> Create(
      const EngineOptions& options);
  ~Engine();

  const ModelConfig& config() const { return config_; }
  // The KV shape this engine's sequences must use (page size as given).
  kv::KvShape KvShapeFor(int page_size) const { return config_.KvShape(page_size); }

  // Runs the batch. InvalidArgument for a malformed item (token id out of
  // range, sequence too short, KV shape not matching the model).
  absl::Status Forward(absl::Span<const ForwardItem> items, ForwardOutput* out,
                       bool keep_all_hidden = false);

  // MTP layer k over a batch. MTP position p combines the token at main
  // position p + 1 with the hidden state of main position p (or of MTP layer
  // k - 1 at position p), is rotated at position p, and predicts the token at
  // p + 2. For each item, tokens[i] is the token for MTP position start + i
  // (i.e. main token start + i + 1) and hidden holds one row per token over
  // all items, in order. Writes layer k's KV at those positions (SWA pool,
  // pool layer num_swa_layers + k); logits and last_hidden as Forward, and
  // all_hidden = the block outputs (the next MTP layer's input).
  // `head` (may be null: the whole vocabulary): the logits rows hold only
  // its tokens' logits, every other one -infinity (see DraftHead).
  absl::Status ForwardMtp(int k, absl::Span<const ForwardItem> items,
                          absl::Span<const float> hidden, ForwardOutput* out,
                          const DraftHead* head = nullptr);
  // The draft head over `ids` (sorted and deduplicated here): a copy of
  // those lm_head columns in their stored format. InvalidArgument for an
  // empty set or an id out of range.
  absl::StatusOr<std::shared_ptr<const DraftHead>> MakeDraftHead(std::vector<int32_t> ids) const;
  // Fills `head` with the columns of `ids` (ascending and unique: else
  // InvalidArgument, as for an empty set or an id out of range), reusing its
  // memory where large enough.
  absl::Status FillDraftHead(absl::Span<const int32_t> ids, DraftHead* head) const;

  // Embedding row of a token, widened to f32 into out[hidden_size].
  void Embedding(uint32_t token, float* out) const;
  // Bytes of weights held (packed projections in their stored format,
  // embeddings, norms): what the model costs in memory.
  size_t WeightBytes() const;

 private:
  struct Impl;
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  ModelConfig config_;
};

}  // namespace swaserve::model
