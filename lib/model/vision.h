// The vision tower: a ViT that turns an image's
// patches (lib/media/image_preprocess.h) into placeholder-token embeddings of
// the language model's hidden size. The shape follows Qwen2.5-VL's vision
// encoder, which MiMo-V2.5's tower resembles (windowed and full attention
// layers, a 2-D rotary embedding, a merger that joins merge_size² patches into
// one token). Every formula is written here so the PyTorch reference
// (tools/reference/vision_reference.py) reproduces it independently:
//
// Input: patches X [N, 3·p²] of one image in row-major grid order (patch
//   (gy, gx) is row gy·gw + gx), gh × gw = N, both multiples of merge m.
// 1. h = X · Wpe^T (visual.patch_embed.proj.weight [D, 3·p²], no bias).
// 2. Rotary angles of patch (gy, gx) per head (head dim d, f = d / 4,
//    inv[k] = theta^(−k / f) for k < f): a[j] = gy·inv[j] for j < f,
//    gx·inv[j − f] for f <= j < 2f; NeoX rotation of dims (j, j + d/2) by
//    a[j] (cpu_kernels ApplyRope with per-pair angles).
// 3. Blocks i < depth (visual.blocks.{i}.*):
//      a = RmsNorm(h, norm1); [q k v] = a · Wqkv^T + bqkv (attn.qkv, [3D, D]);
//      q, k rotated (2.); per head, o = softmax(q·k^T / sqrt(d)) · v over the
//      keys of the query's window (a windowed layer) or all N (a full layer:
//      index in fullatt_block_indexes, or window_size = 0), bidirectional;
//      h += o · Wproj^T + bproj (attn.proj);
//      b = RmsNorm(h, norm2);
//      h += (silu(b·Wg^T + bg) ⊙ (b·Wu^T + bu)) · Wd^T + bd
//      (mlp.gate_proj / up_proj [I, D], down_proj [D, I], with biases).
//    Windows: ws = window_size / patch_size patches a side; patch (gy, gx) is
//    in window (gy / ws, gx / ws) (partial windows at the right and bottom).
// 4. Merger (visual.merger.*): u = RmsNorm(h, ln_q) per patch; token
//    (by, bx) of the (gh/m) × (gw/m) grid, row-major, concatenates
//    u(by·m + dy, bx·m + dx) for dy, dx < m in row-major order [m²·D];
//    out = GELU(concat · W0^T + b0) · W2^T + b2 (mlp.0 [m²D, m²D], mlp.2
//    [out_hidden, m²D]); GELU is the exact erf form.
// RmsNorm: x / sqrt(mean(x²) + eps) · weight.
//
// Thread-safety: a loaded VisionTower is immutable; Encode is thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace swaserve::model {

// config.json "vision_config" (Qwen2.5-VL's field names).
struct VisionConfig {
  int patch_size = 14;        // pixels a side
  int merge_size = 2;         // spatial_merge_size
  int hidden_size = 0;        // D
  int depth = 0;              // blocks
  int num_heads = 0;          // D / num_heads must be a multiple of 4
  int intermediate_size = 0;  // I
  int out_hidden_size = 0;    // the language model's hidden size
  int window_size = 0;        // pixels a side; 0: every layer full
  std::vector<int> fullatt_block_indexes;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;

  int head_dim() const { return num_heads > 0 ? hidden_size / num_heads : 0; }
  // Window side in patches (0: none).
  int window_patches() const { return window_size > 0 ? window_size / patch_size : 0; }
  bool IsFullAttention(int block) const;
  // Checks every constraint; InvalidArgument naming the field.
  absl::Status Validate() const;
  // The "vision_config" object of config.json text; NotFound when absent.
  static absl::StatusOr<VisionConfig> FromConfigJson(absl::string_view json,
                                                     absl::string_view source);
  // The object as JSON (what FromConfigJson reads back).
  std::string ToJson() const;
  bool operator==(const VisionConfig&) const = default;
};

// A tiny tower for tests and the demo (make-model --vision): patch 14, merge
// 2, hidden 64, 4 blocks of 4 heads (blocks 1 and 3 full, 0 and 2 windowed
// over 112-pixel = 8-patch windows), MLP 128, projecting to `out_hidden`.
VisionConfig TinyVisionConfig(int out_hidden);

// The tensors a vision tower for `config` holds: name -> shape.
std::vector<std::pair<std::string, std::vector<int64_t>>> VisionTensorShapes(
    const VisionConfig& config);

// Seeded random weights for `config` (matrices normal(0, 1/sqrt(fan_in)),
// biases 0.02·normal, norm weights 1 + 0.1·normal; a SplitMix64 stream per
// tensor name, Box-Muller normals: deterministic on every platform): writes
// <dir>/visual.safetensors (f32) and adds vision_config to <dir>/config.json,
// which must exist (swaserve make-model --vision). The language model's
// checkpoint loader skips visual.* tensors.
absl::Status WriteRandomVisionTower(const VisionConfig& config, uint64_t seed,
                                    const std::string& dir);

// One image's patches for Encode.
struct VisionInput {
  absl::Span<const float> patches;  // [grid_h · grid_w, 3·p²]
  int grid_h = 0;
  int grid_w = 0;
};

class VisionTower {
 public:
  // From a checkpoint directory: config.json's vision_config and the
  // visual.* tensors of its *.safetensors files (f32, bf16 or f16).
  // NotFound without a vision_config; InvalidArgument naming a missing or
  // misshaped tensor.
  static absl::StatusOr<std::unique_ptr<VisionTower>> Load(const std::string& dir);
  // From a config and f32 tensors (tests).
  static absl::StatusOr<std::unique_ptr<VisionTower>> FromTensors(
      const VisionConfig& config,
      const std::vector<std::pair<std::string, std::vector<float>>>& tensors);
  ~VisionTower();

  const VisionConfig& config() const { return config_; }
  // Placeholder tokens of an image of grid_h × grid_w patches.
  int64_t Tokens(int grid_h, int grid_w) const;
  // Embeddings of every input, concatenated in order: [Σ tokens, out_hidden].
  // Several images go through each linear layer as one matrix (the encoder
  // service's cross-request batch); each image's rows are computed exactly as
  // when it is encoded alone (the kernels are batch-invariant), so batched
  // output equals unbatched bit for bit. InvalidArgument for a grid that is
  // empty, not a multiple of merge_size, or does not match the patches.
  absl::StatusOr<std::vector<float>> Encode(absl::Span<const VisionInput> inputs) const;

 private:
  struct Weights;
  VisionTower(VisionConfig config, std::unique_ptr<Weights> weights);
  VisionConfig config_;
  std::unique_ptr<Weights> w_;
};

}  // namespace swaserve::model
