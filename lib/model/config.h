// The model configuration (docs/architecture.md#model): read from a Hugging Face style
// config.json with MiMo-V2 field names, validated, and turned into the KV
// cache shape. Part of swaserve::model_text (no BLAS), so the router can link
// it.
//
// Two config.json formats are accepted:
//  * the hub format (what XiaomiMiMo publishes): hybrid_layer_pattern,
//    moe_layer_freq, swa_* geometry, rope_theta / swa_rope_theta /
//    partial_rotary_factor, add_{swa,full}_attention_sink_bias;
//  * the transformers-native format (what transformers' MiMoV2FlashConfig
//    re-saves): `rope_parameters` present, either per layer type
//    {"full_attention": {...}, "sliding_attention": {...}} or one flat
//    {"rope_type", "rope_theta", "partial_rotary_factor"} for every type;
//    layer_types / mlp_layer_types; no swa_* fields. As transformers' model
//    code does: SWA layers have num_attention_heads heads, 2 x
//    num_key_value_heads KV heads, head_dim / v_head_dim, and a sink
//    (`sinks`); full layers have no sink. Hub fields given as well must
//    agree with that, or the config is rejected naming them.
//
// Accepted field names (aliases in parentheses):
//   vocab_size, hidden_size, num_hidden_layers,
//   hybrid_layer_pattern (0 full / 1 SWA) or layer_types
//     ("full_attention" / "sliding_attention"),
//   sliding_window (sliding_window_size; attention_chunk_size must equal it),
//   num_attention_heads, num_key_value_heads, head_dim, v_head_dim,
//   swa_num_attention_heads, swa_num_key_value_heads, swa_head_dim
//   (swa_qk_head_dim), swa_v_head_dim, rope_theta, swa_rope_theta,
//   partial_rotary_factor, rope_parameters,
//   add_swa_attention_sink_bias, add_full_attention_sink_bias,
//   attention_value_scale, moe_layer_freq (list of 0/1, or mlp_layer_types
//   "dense"/"sparse"), n_routed_experts, num_experts_per_tok,
//   moe_intermediate_size, intermediate_size, norm_topk_prob,
//   routed_scaling_factor, num_nextn_predict_layers,
//   rms_norm_eps (layernorm_epsilon), torch_dtype, tie_word_embeddings,
//   max_position_embeddings, bos_token_id, eos_token_id (int or list),
//   quantization_config (below), attention_projection_layout ("split" or
//   "fused_qkv").
// Fields that do not change the computation are ignored, by an explicit list
// (config.cc kInertFields: architectures, auto_map, transformers_version,
// use_cache, initializer_range, attention_dropout, pad_token_id, ...;
// vision_config / audio_config: only the text model is served). Every other
// field with a non-null value is rejected by name: the engine never guesses
// at a field it does not understand.
//
// quantization_config (null or absent: weights as torch_dtype):
//   {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [bo, bi],
//    "activation_scheme": "dynamic" (optional), "ignored_layers" (alias
//    "modules_to_not_convert"): [module names kept in torch_dtype]}.
//   Keys quantization tools write that change nothing are accepted with a
//   log line: packed_modules_mapping, kv_cache_scheme, sparsity_config and
//   transform_config when null, {} or [] (with content they would change the
//   math and are rejected by name), and the informational producer, version
//   and global_compression_ratio. Any other method, format or key is
//   rejected by name. Weights are FP8
//   E4M3 with F32 `<name>_scale_inv` block scales [ceil(out/bo),
//   ceil(in/bi)]; activations stay f32 (weight-only dequantisation, what the
//   PyTorch reference does too).
//
// num_nextn_predict_layers absent: the MTP layer count is the number of
// model.mtp.layers.{k} in the checkpoint's tensors (Load on a checkpoint
// directory counts them; FromJson alone leaves 0 and sets
// mtp_layers_derived).
//
// Defaults and rules (config.cc):
//   required: vocab_size, hidden_size, num_hidden_layers, num_attention_heads.
//   num_key_value_heads defaults to num_attention_heads; head_dim to
//   hidden_size / num_attention_heads; v_head_dim to head_dim. A JSON null
//   reads as "absent" (HF writes nulls).
//   Hub format, model_type mimo_v2*: with SWA or MTP layers,
//   swa_num_key_value_heads, swa_rope_theta and add_swa_attention_sink_bias
//   are required (never guessed from the full-attention values). Other
//   model types: the SWA geometry defaults to the full one, swa_rope_theta
//   to rope_theta, no sinks.
//   No pattern: every layer full. No moe_layer_freq/mlp_layer_types: every
//   layer dense. When both spellings of a list are given they must agree.
//   sliding_window is required (> 0) when any layer is SWA or there are MTP
//   layers (their attention is SWA); an all-full model may omit it (W = 0).
//   torch_dtype (alias: dtype, the newer HF name) "float32" (default),
//   "bfloat16", "float16" (or f32/bf16/f16).
//   Rejected as unsupported, by name: attention_bias true, hidden_act other
//   than "silu", n_shared_experts > 0, scoring_func other than "sigmoid",
//   topk_method other than "noaux_tc" / "greedy", n_group > 1, rope_scaling
//   other than null / {"rope_type": "default"}, a rope_type other than
//   "default".
//
// Plain value type; thread-compatible.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "lib/kv/kv_shape.h"

namespace swaserve::model {

enum class AttentionType : uint8_t { kFull, kSwa };

// Geometry of one attention type.
struct AttentionConfig {
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;    // Q and K
  int v_head_dim = 0;  // V (and the o_proj input is num_heads * v_head_dim)
  double rope_theta = 10000.0;
  bool sink = false;   // learned per-head attention-sink logit
  // NeoX RoPE on the first rotary_dim dims of each Q/K head:
  // int(head_dim * partial_rotary_factor), rounded down to even.
  int rotary_dim = 0;

  bool operator==(const AttentionConfig&) const = default;
};

// Block-scaled FP8 weights (quantization_config, see above).
struct QuantConfig {
  bool fp8 = false;     // quant_method "fp8", fmt "e4m3"
  int block_out = 0;    // weight_block_size[0]: output rows per scale
  int block_in = 0;     // weight_block_size[1]: input columns per scale
  // Module names (e.g. "model.layers.0.mlp.gate", "lm_head") whose weights
  // are stored unquantized; an entry also matches every module below it.
  std::vector<std::string> ignored_layers;

  // Whether the weight of `module` ("model.layers.3.self_attn.q_proj") is
  // stored as FP8 (false when !fp8 or the module is ignored).
  bool Quantized(absl::string_view module) const;
  bool operator==(const QuantConfig&) const = default;
};

// How attention projections are stored: q/k/v_proj, or one
// self_attn.qkv_proj (MiMo-V2.5, attention_projection_layout "fused_qkv").
enum class QkvLayout : uint8_t { kSplit, kFused };

// int(head_dim * partial_rotary_factor), rounded down to even (how FromJson
// sets AttentionConfig::rotary_dim; Validate checks it).
int RotaryDim(int head_dim, double partial_rotary_factor);

struct ModelConfig {
  std::string model_type;
  int vocab_size = 0;
  int hidden_size = 0;
  int num_layers = 0;
  std::vector<AttentionType> layer_types;  // one per layer
  std::vector<bool> moe_layers;            // one per layer: MoE (true) or dense
  int sliding_window = 0;                  // W: a query sees W keys incl. itself
  AttentionConfig full;
  AttentionConfig swa;                     // SWA layers and MTP layers
  double partial_rotary_factor = 1.0;
  double attention_value_scale = 1.0;
  int intermediate_size = 0;       // dense MLPs (and MTP MLPs)
  int moe_intermediate_size = 0;   // each routed expert
  int n_routed_experts = 0;
  int num_experts_per_tok = 0;
  bool norm_topk_prob = true;
  double routed_scaling_factor = 1.0;
  int num_mtp_layers = 0;          // num_nextn_predict_layers
  // num_nextn_predict_layers was absent: num_mtp_layers was counted from the
  // checkpoint's tensors by Load (0 after FromJson alone).
  bool mtp_layers_derived = false;
  QuantConfig quant;
  QkvLayout qkv_layout = QkvLayout::kSplit;
  double rms_norm_eps = 1e-6;
  kv::DType dtype = kv::DType::kF32;  // torch_dtype of the stored weights
  bool tie_word_embeddings = false;
  int max_position_embeddings = 0;
  int bos_token_id = -1;
  std::vector<int> eos_token_ids;

  // Parses and validates config.json text; `source` names it in errors.
  // Errors name the field: missing, wrong type, inconsistent head dims,
  // W <= 0, unknown dtype, pattern length != num_hidden_layers, ...
  static absl::StatusOr<ModelConfig> FromJson(absl::string_view json,
                                              absl::string_view source);
  // Reads <dir>/config.json (or a config.json path). When
  // num_nextn_predict_layers is absent, counts model.mtp.layers.{k} in the
  // tensor names of that directory's checkpoint (the weight_map of
  // model.safetensors.index.json, else the headers of its *.safetensors);
  // the k must be 0..K-1 without gaps.
  static absl::StatusOr<ModelConfig> Load(const std::string& path);
  // config.json text that FromJson reads back to an equal config (hub
  // format; num_nextn_predict_layers written unless it was derived and 0).
  std::string ToJson() const;

  // The same config in the transformers-native format (what transformers'
  // MiMoV2FlashConfig saves: rope_parameters per layer type, layer_types,
  // mlp_layer_types, no swa_* fields). Only a config that format can express:
  // model_type mimo_v2_flash, SWA layers with the full layers' heads and
  // dims, 2 x their KV heads and a sink, full layers without one, split
  // q/k/v; InvalidArgument naming what it cannot express otherwise.
  absl::StatusOr<std::string> ToNativeJson() const;

  // Checks every constraint; InvalidArgument naming the field.
  absl::Status Validate() const;

  // Fused qkv_proj (qkv_layout kFused): the tensor-parallel groups its rows
  // are stored in, as SGLang's MiMo-V2 loader reads them: num_key_value_heads
  // of the full-attention layers. Each group holds, in order, its share of
  // the Q rows (num_heads / G heads), K rows and V rows (num_kv_heads / G
  // heads each) of the layer's geometry; FP8 block scales are laid out per
  // group, each group's rows padded to whole blocks.
  int qkv_groups() const { return full.num_kv_heads; }
  const AttentionConfig& attention(int layer) const {
    return layer_types[layer] == AttentionType::kFull ? full : swa;
  }
  int num_full_layers() const;
  int num_swa_layers() const;  // main-model SWA layers (MTP not included)
  // Per main layer, whether it is a SWA layer (kv::WindowRestoreRows).
  std::vector<bool> swa_layer_mask() const;
  // Index of `layer` within its KV pool: full layers count 0.. in order; SWA
  // layers count 0.. in order; MTP layer k is SWA pool layer
  // num_swa_layers() + k.
  int pool_layer(int layer) const;
  int mtp_pool_layer(int k) const { return num_swa_layers() + k; }
  // The KV cache shape (full pool: full layers; SWA pool: SWA + MTP layers).
  kv::KvShape KvShape(int page_size = 16) const;

  bool operator==(const ModelConfig&) const = default;
};

// Prefill work per key of attention context, relative to the rest of a
// prompt token's work: multiply-adds per key of the full-attention layers
// (num_heads x (head_dim + v_head_dim) each, for Q.K and P.V) over the
// multiply-adds per token of the projections, MLPs and routed experts (the
// SWA layers' attention reads at most W keys, a constant folded into the
// latter; the LM head runs for one token per prompt and is left out). A
// token at position s then costs about 1 + k * s: what the prefill
// scheduler's FCFS-wait guard uses as context_cost_per_token.
double ContextCostPerToken(const ModelConfig& config);

// The encoder towers checkpoint directory `model_dir` has: a vision_config
// and an audio_config object in its config.json (ModelConfig ignores them;
// swaserve-encoder serves them, lib/model/vision.h and audio.h). What `swaserve
// up` starts an encoder for and the router accepts media items of. NotFound /
// InvalidArgument for a missing or non-object config.json.
struct EncoderTowers {
  bool vision = false;  // images and video
  bool audio = false;
  bool any() const { return vision || audio; }
};
absl::StatusOr<EncoderTowers> EncoderTowersOf(const std::string& model_dir);

}  // namespace swaserve::model
