#include "lib/model/mini_checkpoints.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "lib/base/status.h"

namespace swaserve::model {
namespace {

ModelConfig FlashMini() {
  ModelConfig c;
  c.model_type = "mimo_v2_flash";
  c.vocab_size = 256;
  c.hidden_size = 160;
  c.num_layers = 4;
  c.layer_types = {AttentionType::kFull, AttentionType::kSwa, AttentionType::kSwa,
                   AttentionType::kFull};
  c.moe_layers = {false, true, true, true};
  c.sliding_window = 8;
  c.full = {.num_heads = 4, .num_kv_heads = 1, .head_dim = 48, .v_head_dim = 32,
            .rope_theta = 5000000.0, .sink = false};
  c.swa = {.num_heads = 4, .num_kv_heads = 2, .head_dim = 48, .v_head_dim = 32,
           .rope_theta = 10000.0, .sink = true};
  c.partial_rotary_factor = 0.334;
  c.full.rotary_dim = RotaryDim(48, c.partial_rotary_factor);
  c.swa.rotary_dim = c.full.rotary_dim;
  c.attention_value_scale = 0.707;
  c.intermediate_size = 320;
  c.moe_intermediate_size = 96;
  c.n_routed_experts = 4;
  c.num_experts_per_tok = 2;
  c.num_mtp_layers = 1;
  c.rms_norm_eps = 1e-5;
  c.dtype = kv::DType::kBF16;
  c.max_position_embeddings = 4096;
  c.eos_token_ids = {255};
  return c;
}

QuantConfig Fp8(std::vector<std::string> ignored) {
  QuantConfig q;
  q.fp8 = true;
  q.block_out = 128;
  q.block_in = 128;
  q.ignored_layers = std::move(ignored);
  return q;
}

}  // namespace

std::vector<MiniLayout> MiniLayouts() {
  std::vector<MiniLayout> out;
  RandomCheckpointOptions grid;
  grid.fp8_grid_block_out = 128;
  grid.fp8_grid_block_in = 128;

  MiniLayout bf16{.name = "flash-bf16", .config = FlashMini(), .options = grid};
  out.push_back(bf16);

  MiniLayout fp8{.name = "flash-fp8", .config = FlashMini(), .options = grid};
  fp8.config.quant = Fp8({"model.layers.0.mlp"});
  out.push_back(fp8);

  MiniLayout native{.name = "flash-native", .config = FlashMini(), .options = grid};
  native.options.native_config = true;
  out.push_back(native);

  MiniLayout fused{.name = "v2.5-fused-fp8", .config = FlashMini(), .options = {}};
  fused.config.model_type = "mimo_v2";
  fused.config.full.num_kv_heads = 2;
  fused.config.qkv_layout = QkvLayout::kFused;
  fused.config.quant = Fp8({});
  out.push_back(fused);
  return out;
}

absl::StatusOr<MiniLayout> FindMiniLayout(absl::string_view name) {
  std::vector<std::string> names;
  for (MiniLayout& l : MiniLayouts()) {
    if (l.name == name) return l;
    names.push_back(l.name);
  }
  return absl::NotFoundError(absl::StrCat("no mini layout \"", name, "\" (layouts: ",
                                          absl::StrJoin(names, ", "), ")"));
}

absl::Status WriteMiniCheckpoint(absl::string_view name, uint64_t seed,
                                 const std::string& dir) {
  ASSIGN_OR_RETURN(MiniLayout l, FindMiniLayout(name));
  RETURN_IF_ERROR(base::Annotate(l.config.Validate(), l.name));
  return WriteRandomCheckpoint(l.config, seed, dir, l.options);
}

}  // namespace swaserve::model
