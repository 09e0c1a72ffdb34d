// The model shape the engine and worker benchmarks share: hidden 256, 14
// layers (hybrid: full attention at layers 0 and 7, 12 SWA layers with
// W = 128; all_full: every layer full), 4 heads / 2 KV heads of dim 64,
// 8 experts top-2 (layer 0 dense), f32 — small enough for 2 cores, with the
// layer mix of the reference model.
#pragma once

#include "lib/model/checkpoint.h"
#include "lib/model/config.h"

namespace swaserve::bench {

inline model::ModelConfig BenchModelConfig(bool all_full = false) {
  model::ModelConfig c = *model::BuiltinConfig("tiny", 2048);
  c.hidden_size = 256;
  c.num_layers = 14;
  c.layer_types.assign(14, model::AttentionType::kSwa);
  c.layer_types[0] = c.layer_types[7] = model::AttentionType::kFull;
  if (all_full) c.layer_types.assign(14, model::AttentionType::kFull);
  c.moe_layers.assign(14, true);
  c.moe_layers[0] = false;
  c.sliding_window = 128;
  for (model::AttentionConfig* a : {&c.full, &c.swa}) {
    a->num_heads = 4;
    a->num_kv_heads = 2;
    a->head_dim = 64;
    a->v_head_dim = 64;
    a->rotary_dim = 32;
  }
  c.n_routed_experts = 8;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 128;
  c.intermediate_size = 512;
  c.num_mtp_layers = 0;
  c.dtype = kv::DType::kF32;
  return c;
}

}  // namespace swaserve::bench
