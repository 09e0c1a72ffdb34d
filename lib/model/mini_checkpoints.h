// Mini checkpoints laid out like the released MiMo-V2 checkpoints:
// the real tensor names, config formats and weight formats, tiny sizes, seeded
// random weights (WriteRandomCheckpoint). Used by the tests, the golden
// fixture (tools/reference/make_layout_golden.py) and the benchmarks;
// tools/mini_checkpoints writes them from the command line.
//
// Layouts:
//   flash-bf16    MiMo-V2-Flash geometry (SWA layers 2 x the full layers' KV
//                 heads, sinks on SWA layers only), hub config.json, BF16
//                 weights rounded to the FP8 grid of flash-fp8 (so the two
//                 hold the same weights).
//   flash-fp8     the same, as released: FP8 E4M3 projections with 128 x 128
//                 block scales (`*.weight_scale_inv`), quantization_config
//                 with ignored_layers (model.layers.0.mlp stays BF16).
//   flash-native  flash-bf16's weights with the transformers-native config
//                 (rope_parameters per layer type, layer_types, no swa_*).
//   v2.5-fused-fp8  MiMo-V2.5 style: attention_projection_layout fused_qkv
//                 (one self_attn.qkv_proj per layer, TP groups), FP8 with
//                 128 x 128 blocks, 2 KV heads on both layer types.
// Dimensions are chosen so that 128 x 128 blocks have partial edge blocks
// (hidden 160, projections of 192, 96 and 320 rows).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "lib/model/checkpoint.h"
#include "lib/model/config.h"

namespace swaserve::model {

struct MiniLayout {
  std::string name;
  ModelConfig config;
  RandomCheckpointOptions options;
};

// Every layout above, in that order (vocab_size 256).
std::vector<MiniLayout> MiniLayouts();
// One by name; NotFound listing the names.
absl::StatusOr<MiniLayout> FindMiniLayout(absl::string_view name);
// Writes layout `name` with `seed` into `dir`.
absl::Status WriteMiniCheckpoint(absl::string_view name, uint64_t seed,
                                 const std::string& dir);

}  // namespace swaserve::model
