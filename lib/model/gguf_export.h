// A MiMo-V2-family checkpoint as a GGUF file that llama.cpp's `mimo2`
// architecture loads (`swaserve export-gguf`; read back with gguf.h).
//
// What is written (names and keys as llama.cpp's mimo2 loader reads them):
//   metadata  general.architecture "mimo2", general.name, general.file_type;
//             mimo2.{context_length, embedding_length, block_count (main +
//             MTP layers), nextn_predict_layers, feed_forward_length,
//             expert_feed_forward_length, expert_count, expert_used_count};
//             mimo2.attention.{head_count, head_count_kv (per block, i32),
//             key_length, value_length, layer_norm_rms_epsilon,
//             sliding_window, sliding_window_pattern (per block, i32 1 = SWA;
//             MTP blocks are SWA), value_scale (when != 1)};
//             mimo2.rope.{dimension_count (the partial rotary dims),
//             freq_base (full layers), freq_base_swa (SWA and MTP layers)};
//             tokenizer.ggml.{model "gpt2", pre "qwen2", tokens, token_type,
//             merges, eos_token_id, bos_token_id, add_bos_token} and
//             tokenizer.chat_template when the checkpoint has one.
//   tensors   token_embd, output_norm, output (the embedding again when tied);
//             per block blk.{i}.attn_norm, attn_q/attn_k/attn_v (split
//             checkpoints) or attn_qkv ([Q | K | V] rows: fused checkpoints,
//             regrouped from their tensor-parallel groups, and every MTP
//             block, which llama.cpp reads fused), attn_output, attn_sinks,
//             ffn_norm, ffn_gate/ffn_up/ffn_down (dense) or ffn_gate_inp,
//             exp_probs_b.bias, ffn_{gate,up,down}_exps (experts stacked);
//             MTP block N + k: nextn.eh_proj, nextn.enorm, nextn.hnorm,
//             layer_output_norm (the MTP layer's final norm).
//   MoE routing: llama.cpp's mimo2 graph is sigmoid scores, the score
//   correction bias for selection only, top-k, weights normalised, no
//   scaling; it has no key for the rest.
//
// Element types: matrices in `dtype` (below); 1-D tensors (norms, sinks, the
// router bias) and the router matrix in F32, widened exactly, as llama.cpp's
// own converter stores them.
//
// What cannot be represented is an error naming it (InvalidArgument):
// different head counts or head dims for full and SWA layers,
// norm_topk_prob false, routed_scaling_factor != 1, FP8 weights with dtype
// "stored" (GGUF has no block-scaled E4M3; export as f32 or bf16), a
// tokenizer other than byte-level BPE with the Qwen2 pre-tokenizer (an NFC
// normalizer is accepted with a warning: llama.cpp does not normalize), no
// tokenizer.json, no context length.
//
// Thread-compatible free functions.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "lib/model/gguf.h"

namespace swaserve::model {

struct GgufExportOptions {
  // Element type of the matrices: "stored" (the checkpoint's torch_dtype,
  // bytes unchanged), "f32" (exact for every stored format, FP8 included:
  // what the oracle comparisons load), "bf16" or "f16" (rounded to nearest
  // even where the stored values do not fit).
  std::string dtype = "stored";
  // general.name; empty: the checkpoint directory's name.
  std::string name;
  // mimo2.context_length; 0: config.json's max_position_embeddings (an error
  // when that is 0 too).
  int context_length = 0;
};

// What ExportGguf wrote.
struct GgufExportSummary {
  int tensors = 0;
  uint64_t bytes = 0;  // file size
  GgmlType matrix_type = GgmlType::kF32;
};

// Writes the checkpoint in directory `checkpoint_dir` (config.json,
// safetensors, tokenizer.json) to `out_path` (via `out_path`.tmp + rename).
absl::StatusOr<GgufExportSummary> ExportGguf(const std::string& checkpoint_dir,
                                             const std::string& out_path,
                                             const GgufExportOptions& options);

}  // namespace swaserve::model
