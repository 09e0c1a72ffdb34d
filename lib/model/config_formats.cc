// config.json beyond the hub format's plain fields: the transformers-native
// format (rope_parameters), the list of fields known to be inert, FP8
// quantization_config, and the MTP layer count from the checkpoint's tensor
// names (see config.h).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <system_error>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "lib/base/logging.h"
#include "lib/model/config.h"
#include "lib/model/config_json.h"

namespace swaserve::model {

bool QuantConfig::Quantized(absl::string_view module) const {
  if (!fp8) return false;
  for (const std::string& ignored : ignored_layers) {
    if (module == ignored ||
        (absl::StartsWith(module, ignored) && module.size() > ignored.size() &&
         module[ignored.size()] == '.')) {
      return false;
    }
  }
  return true;
}

namespace config_internal {
namespace {

// Keys FromJson reads (config.cc, and this file).
constexpr const char* kReadFields[] = {
    "model_type", "vocab_size", "hidden_size", "num_hidden_layers",
    "num_attention_heads", "num_key_value_heads", "head_dim", "v_head_dim",
    "rope_theta", "swa_rope_theta", "partial_rotary_factor", "rope_parameters",
    "add_full_attention_sink_bias", "add_swa_attention_sink_bias",
    "swa_num_attention_heads", "swa_num_key_value_heads", "swa_head_dim",
    "swa_qk_head_dim", "swa_v_head_dim", "attention_value_scale",
    "hybrid_layer_pattern", "layer_types", "sliding_window",
    "sliding_window_size", "attention_chunk_size", "moe_layer_freq",
    "mlp_layer_types", "n_routed_experts", "num_experts_per_tok",
    "moe_intermediate_size", "intermediate_size", "norm_topk_prob",
    "routed_scaling_factor", "num_nextn_predict_layers", "rms_norm_eps",
    "layernorm_epsilon", "torch_dtype", "dtype", "tie_word_embeddings",
    "max_position_embeddings", "bos_token_id", "eos_token_id",
    "quantization_config", "attention_projection_layout",
    // Checked by RejectUnsupported (only the supported value passes).
    "attention_bias", "hidden_act", "n_shared_experts", "scoring_func",
    "topk_method", "n_group", "rope_scaling"};

// Keys that do not change what the engine computes, ignored by name.
//   topk_group: group-limited routing is rejected (n_group <= 1), so the
//     number of groups kept is moot.
//   moe_router_dtype: the router is computed in f32 whatever it says.
//   vision_config / audio_config: the encoders of MiMo-V2.5; only the text
//     model is served (their tensors are skipped, see checkpoint.h).
constexpr const char* kInertFields[] = {
    "architectures", "auto_map", "transformers_version", "_name_or_path",
    "use_cache", "initializer_range", "attention_dropout", "pad_token_id",
    "topk_group", "output_router_logits", "router_aux_loss_coef",
    "aux_loss_alpha", "seq_aux", "ep_size", "tokenizer_class",
    "moe_router_dtype", "vision_config", "audio_config"};

bool IsMimo(const ModelConfig& c) {
  return absl::StartsWith(c.model_type, "mimo_v2");
}

const Json* Present(const Json& obj, const char* name) {
  auto it = obj.find(name);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

// `name`, when present, must equal `want` (a number or a bool).
absl::Status CheckSame(const Json& root, const char* name, const Json& want,
                       absl::string_view why) {
  const Json* v = Present(root, name);
  if (v == nullptr) return absl::OkStatus();
  const bool same = want.is_number()
                        ? v->is_number() && v->get<double>() == want.get<double>()
                        : *v == want;
  if (!same) {
    return FieldError(name, absl::StrCat(Describe(*v), " disagrees with ", why,
                                         " (", want.dump(), ")"));
  }
  return absl::OkStatus();
}

struct RopeEntry {
  bool present = false;
  double theta = 0;
  double factor = 0;  // 0: not given
};

absl::StatusOr<RopeEntry> ReadRopeEntry(const Json& e,
                                        const std::string& path) {
  if (!e.is_object()) {
    return FieldError(path, absl::StrCat("expected an object, got ",
                                         Describe(e)));
  }
  RopeEntry r;
  r.present = true;
  for (auto it = e.begin(); it != e.end(); ++it) {
    const std::string& key = it.key();
    const std::string field = absl::StrCat(path, ".", key);
    if (key == "rope_type" || key == "type") {
      if (!it->is_string() || it->get<std::string>() != "default") {
        return FieldError(field, absl::StrCat("RoPE scaling is not supported "
                                              "(only \"default\"), got ",
                                              Describe(*it)));
      }
    } else if (key == "rope_theta") {
      if (!it->is_number() || !(it->get<double>() > 0)) {
        return FieldError(field, absl::StrCat("expected a number > 0, got ",
                                              Describe(*it)));
      }
      r.theta = it->get<double>();
    } else if (key == "partial_rotary_factor") {
      if (!it->is_number() ||
          !(it->get<double>() > 0 && it->get<double>() <= 1)) {
        return FieldError(field, absl::StrCat("expected a number in (0, 1], "
                                              "got ", Describe(*it)));
      }
      r.factor = it->get<double>();
    } else {
      return FieldError(field,
                        "unknown RoPE parameter (understood: rope_type "
                        "\"default\", rope_theta, partial_rotary_factor)");
    }
  }
  if (r.theta == 0) return FieldError(path + ".rope_theta", "missing");
  return r;
}

// rope_parameters: per layer type, or one flat entry for every type.
absl::Status ReadRopeParameters(const Json& rp, RopeEntry* full,
                                RopeEntry* swa) {
  if (!rp.is_object()) {
    return FieldError("rope_parameters",
                      absl::StrCat("expected an object, got ", Describe(rp)));
  }
  const bool per_type =
      rp.contains("full_attention") || rp.contains("sliding_attention");
  if (!per_type) {
    ASSIGN_OR_RETURN(*full, ReadRopeEntry(rp, "rope_parameters"));
    *swa = *full;
    return absl::OkStatus();
  }
  for (auto it = rp.begin(); it != rp.end(); ++it) {
    if (it.key() == "full_attention") {
      ASSIGN_OR_RETURN(*full,
                       ReadRopeEntry(*it, "rope_parameters.full_attention"));
    } else if (it.key() == "sliding_attention") {
      ASSIGN_OR_RETURN(
          *swa, ReadRopeEntry(*it, "rope_parameters.sliding_attention"));
    } else {
      return FieldError(absl::StrCat("rope_parameters.", it.key()),
                        "unknown layer type (expected full_attention or "
                        "sliding_attention)");
    }
  }
  return absl::OkStatus();
}

}  // namespace

bool IsNativeFormat(const Json& root) {
  return Present(root, "rope_parameters") != nullptr;
}

absl::Status CheckKnownFields(const Json& root) {
  for (auto it = root.begin(); it != root.end(); ++it) {
    if (it->is_null()) continue;  // null reads as absent (HF writes nulls)
    const std::string& key = it.key();
    auto is = [&](const char* k) { return key == k; };
    if (std::any_of(std::begin(kReadFields), std::end(kReadFields), is) ||
        std::any_of(std::begin(kInertFields), std::end(kInertFields), is)) {
      continue;
    }
    return FieldError(key,
                      "not understood by this engine (neither a supported "
                      "setting nor one known not to change the model); "
                      "rejected rather than ignored");
  }
  return absl::OkStatus();
}

absl::Status CheckSameInt(const Json& root, const char* name, int value,
                          const char* other) {
  const Json* v = Present(root, name);
  if (v == nullptr) return absl::OkStatus();
  if (!v->is_number_integer() || v->get<int64_t>() != value) {
    return FieldError(name, absl::StrCat(Describe(*v), " disagrees with ",
                                         other, " (", value, ")"));
  }
  return absl::OkStatus();
}

absl::Status ApplyNativeAttention(const Json& root, ModelConfig* out) {
  ModelConfig& c = *out;
  const bool needs_swa = c.num_swa_layers() > 0 || c.num_mtp_layers > 0 ||
                         (c.mtp_layers_derived && IsMimo(c));
  if (needs_swa && c.model_type != "mimo_v2_flash") {
    return FieldError(
        "model_type",
        absl::StrCat("a transformers-native config (rope_parameters) with "
                     "sliding-window or MTP layers is understood only for "
                     "mimo_v2_flash (the SWA geometry is the model class's), "
                     "got \"", c.model_type, "\""));
  }
  RopeEntry full, swa;
  RETURN_IF_ERROR(ReadRopeParameters(root["rope_parameters"], &full, &swa));
  if (!full.present && c.num_full_layers() > 0) {
    return FieldError("rope_parameters.full_attention",
                      "missing (there are full-attention layers)");
  }
  if (!swa.present && needs_swa) {
    return FieldError("rope_parameters.sliding_attention",
                      "missing (there are sliding-window or MTP layers)");
  }
  if (!full.present) full = swa;
  if (!swa.present) swa = full;
  if (full.factor != 0 && swa.factor != 0 && full.factor != swa.factor) {
    return FieldError("rope_parameters.sliding_attention.partial_rotary_factor",
                      absl::StrCat(swa.factor, " differs from full_attention's ",
                                   full.factor,
                                   " (one factor for both is supported)"));
  }
  double factor = full.factor != 0 ? full.factor : swa.factor;
  if (factor == 0) {
    if (const Json* v = Present(root, "partial_rotary_factor");
        v != nullptr && v->is_number()) {
      factor = v->get<double>();
    } else if (IsMimo(c)) {
      return FieldError(
          "rope_parameters.full_attention.partial_rotary_factor",
          "missing (transformers' MiMo code would assume 0.334; a config "
          "must state it)");
    } else {
      factor = 1.0;  // transformers' default RoPE: every dim rotates
    }
  }
  RETURN_IF_ERROR(CheckSame(root, "rope_theta", full.theta,
                                  "rope_parameters' full_attention theta"));
  RETURN_IF_ERROR(CheckSame(root, "swa_rope_theta", swa.theta,
                                  "rope_parameters' sliding_attention theta"));
  RETURN_IF_ERROR(CheckSame(root, "partial_rotary_factor", factor,
                                  "rope_parameters' partial_rotary_factor"));
  c.partial_rotary_factor = factor;
  c.full.rope_theta = full.theta;
  c.full.sink = false;
  c.full.rotary_dim = RotaryDim(c.full.head_dim, factor);
  // transformers' MiMoV2FlashAttention: SWA layers double the KV heads and
  // carry sinks; the other dims are shared.
  c.swa = c.full;
  c.swa.rope_theta = swa.theta;
  if (c.model_type == "mimo_v2_flash") {
    c.swa.num_kv_heads = 2 * c.full.num_kv_heads;
    c.swa.sink = true;
  }
  const std::string why = "the transformers-native MiMo layout";
  RETURN_IF_ERROR(CheckSame(root, "swa_num_attention_heads",
                                  c.swa.num_heads, why));
  RETURN_IF_ERROR(CheckSame(root, "swa_num_key_value_heads",
                                  c.swa.num_kv_heads, why));
  RETURN_IF_ERROR(
      CheckSame(root, "swa_head_dim", c.swa.head_dim, why));
  RETURN_IF_ERROR(
      CheckSame(root, "swa_qk_head_dim", c.swa.head_dim, why));
  RETURN_IF_ERROR(
      CheckSame(root, "swa_v_head_dim", c.swa.v_head_dim, why));
  RETURN_IF_ERROR(
      CheckSame(root, "add_swa_attention_sink_bias", c.swa.sink, why));
  RETURN_IF_ERROR(
      CheckSame(root, "add_full_attention_sink_bias", c.full.sink, why));
  return absl::OkStatus();
}

absl::Status RequireHubSwaFields(const Json& root, const ModelConfig& c) {
  if (!IsMimo(c)) return absl::OkStatus();
  if (c.num_swa_layers() == 0 && c.num_mtp_layers == 0 &&
      !c.mtp_layers_derived) {
    return absl::OkStatus();
  }
  for (const char* name : {"swa_num_key_value_heads", "swa_rope_theta",
                           "add_swa_attention_sink_bias"}) {
    if (Present(root, name) == nullptr) {
      return FieldError(
          name,
          "missing: a MiMo-V2 hub config must state the sliding-window "
          "layers' geometry (a transformers-native config states it with "
          "rope_parameters); it is never guessed from the full-attention "
          "fields");
    }
  }
  return absl::OkStatus();
}

namespace {

// quantization_config keys that quantization tools write but that do not
// change the computation: accepted (with a log line) when they say nothing
// beyond what the understood keys say. Everything else is an error naming it.
//
// Empty-only: a mapping or scheme that, when present with content, would
// change the math (fused modules the ignore list refers to, a quantized KV
// cache, sparsity, rotations); null, {} and [] say "none".
constexpr const char* kEmptyOnlyQuantFields[] = {
    "packed_modules_mapping", "kv_cache_scheme", "sparsity_config",
    "transform_config"};
// Informational: the producing tool and summary figures, never read by a
// loader.
constexpr const char* kInformationalQuantFields[] = {
    "producer", "version", "global_compression_ratio"};

bool IsEmptyValue(const Json& v) {
  return v.is_null() || ((v.is_object() || v.is_array()) && v.empty());
}

absl::Status CheckInertQuantField(const std::string& key, const Json& v,
                                  const std::string& field) {
  for (const char* name : kEmptyOnlyQuantFields) {
    if (key != name) continue;
    if (!IsEmptyValue(v)) {
      return FieldError(field, absl::StrCat(
          "would change the computation and is not supported (only null, "
          "{} or [] is accepted), got ", Describe(v)));
    }
    SWA_LOG(info, "{}: empty, accepted (changes nothing)", field);
    return absl::OkStatus();
  }
  for (const char* name : kInformationalQuantFields) {
    if (key != name) continue;
    SWA_LOG(info, "{}: informational, ignored ({})", field, Describe(v));
    return absl::OkStatus();
  }
  return FieldError(field, "unknown quantization setting (understood: "
                           "quant_method, fmt, activation_scheme, "
                           "weight_block_size, ignored_layers; accepted when "
                           "empty: packed_modules_mapping, kv_cache_scheme, "
                           "sparsity_config, transform_config; informational: "
                           "producer, version, global_compression_ratio)");
}

}  // namespace

absl::Status ReadQuantAndLayout(const Json& root, ModelConfig* c) {
  if (const Json* v = Present(root, "attention_projection_layout")) {
    if (v->is_string() && v->get<std::string>() == "fused_qkv") {
      c->qkv_layout = QkvLayout::kFused;
    } else if (v->is_string() && v->get<std::string>() == "split") {
      c->qkv_layout = QkvLayout::kSplit;
    } else {
      return FieldError("attention_projection_layout",
                        absl::StrCat("expected \"split\" or \"fused_qkv\", got ",
                                     Describe(*v)));
    }
  }
  const Json* q = Present(root, "quantization_config");
  if (q == nullptr) return absl::OkStatus();
  const std::string p = "quantization_config";
  if (!q->is_object()) {
    return FieldError(p, absl::StrCat("expected an object, got ",
                                      Describe(*q)));
  }
  QuantConfig& out = c->quant;
  bool have_method = false, have_block = false;
  for (auto it = q->begin(); it != q->end(); ++it) {
    const std::string& key = it.key();
    const std::string field = absl::StrCat(p, ".", key);
    const Json& v = *it;
    if (key == "quant_method") {
      if (!v.is_string() || v.get<std::string>() != "fp8") {
        return FieldError(field, absl::StrCat("only \"fp8\" (block-scaled "
                                              "FP8) is supported, got ",
                                              Describe(v)));
      }
      have_method = true;
    } else if (key == "fmt") {
      if (!v.is_string() || v.get<std::string>() != "e4m3") {
        return FieldError(field, absl::StrCat("only \"e4m3\" is supported, "
                                              "got ", Describe(v)));
      }
    } else if (key == "activation_scheme") {
      if (!v.is_string() || v.get<std::string>() != "dynamic") {
        return FieldError(field, absl::StrCat("only \"dynamic\" is supported "
                                              "(no static activation "
                                              "scales), got ", Describe(v)));
      }
    } else if (key == "weight_block_size") {
      if (!v.is_array() || v.size() != 2 || !v[0].is_number_integer() ||
          !v[1].is_number_integer() || v[0].get<int64_t>() < 1 ||
          v[1].get<int64_t>() < 1 || v[0].get<int64_t>() > (1 << 16) ||
          v[1].get<int64_t>() > (1 << 16)) {
        return FieldError(field, absl::StrCat("expected [rows, columns] of "
                                              "positive integers, got ",
                                              Describe(v)));
      }
      out.block_out = static_cast<int>(v[0].get<int64_t>());
      out.block_in = static_cast<int>(v[1].get<int64_t>());
      have_block = true;
    } else if (key == "ignored_layers" || key == "modules_to_not_convert") {
      if (v.is_null()) continue;
      if (!v.is_array()) {
        return FieldError(field, absl::StrCat("expected a list of module "
                                              "names, got ", Describe(v)));
      }
      for (const Json& e : v) {
        if (!e.is_string() || e.get<std::string>().empty()) {
          return FieldError(field, absl::StrCat("entry ", Describe(e),
                                                " is not a module name"));
        }
        out.ignored_layers.push_back(e.get<std::string>());
      }
    } else if (absl::Status inert = CheckInertQuantField(key, v, field);
               !inert.ok()) {
      return inert;
    }
  }
  if (!have_method) return FieldError(p + ".quant_method", "missing");
  if (!have_block) {
    return FieldError(p + ".weight_block_size",
                      "missing (only block-scaled FP8 is supported)");
  }
  std::sort(out.ignored_layers.begin(), out.ignored_layers.end());
  out.ignored_layers.erase(
      std::unique(out.ignored_layers.begin(), out.ignored_layers.end()),
      out.ignored_layers.end());
  out.fp8 = true;
  return absl::OkStatus();
}

nlohmann::ordered_json QuantToJson(const QuantConfig& q) {
  nlohmann::ordered_json j;
  j["quant_method"] = "fp8";
  j["fmt"] = "e4m3";
  j["activation_scheme"] = "dynamic";
  j["weight_block_size"] = {q.block_out, q.block_in};
  j["ignored_layers"] = q.ignored_layers;
  return j;
}

absl::StatusOr<int> CountMtpLayers(const std::vector<std::string>& names) {
  constexpr absl::string_view kPrefix = "model.mtp.layers.";
  constexpr int kMax = 64;
  std::set<int> seen;
  for (const std::string& name : names) {
    if (!absl::StartsWith(name, kPrefix)) continue;
    const absl::string_view rest = absl::string_view(name).substr(kPrefix.size());
    const size_t dot = rest.find('.');
    int k = -1;
    if (dot == absl::string_view::npos ||
        !absl::SimpleAtoi(rest.substr(0, dot), &k) || k < 0 || k >= kMax) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", name, "': not model.mtp.layers.{k}.* with k in [0, ",
          kMax, ")"));
    }
    seen.insert(k);
  }
  const int count = seen.empty() ? 0 : *seen.rbegin() + 1;
  for (int k = 0; k < count; ++k) {
    if (seen.count(k) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "num_nextn_predict_layers is absent and the checkpoint has "
          "model.mtp.layers.", count - 1, " but no model.mtp.layers.", k));
    }
  }
  return count;
}

absl::StatusOr<std::vector<std::string>> CheckpointTensorNames(
    const std::string& dir) {
  namespace fs = std::filesystem;
  std::vector<std::string> names;
  std::error_code ec;
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  auto read_json = [](const fs::path& path, uint64_t skip,
                      uint64_t size) -> absl::StatusOr<Json> {
    std::ifstream in(path, std::ios::binary);
    std::string text(size, '\0');
    if (!in || !in.seekg(static_cast<std::streamoff>(skip)) ||
        !in.read(text.data(), static_cast<std::streamsize>(size))) {
      return absl::DataLossError(absl::StrCat(path.string(), ": read error"));
    }
    Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path.string(), ": not a JSON object"));
    }
    return j;
  };
  if (fs::exists(index, ec)) {
    ASSIGN_OR_RETURN(Json j, read_json(index, 0, fs::file_size(index, ec)));
    auto map = j.find("weight_map");
    if (map == j.end() || !map->is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(index.string(), ": no weight_map object"));
    }
    for (auto it = map->begin(); it != map->end(); ++it) {
      names.push_back(it.key());
    }
    return names;
  }
  std::vector<fs::path> files;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    if (e.path().extension() == ".safetensors") files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  for (const fs::path& file : files) {
    std::ifstream in(file, std::ios::binary);
    unsigned char len_bytes[8] = {};
    if (!in.read(reinterpret_cast<char*>(len_bytes), 8)) {
      return absl::DataLossError(absl::StrCat(file.string(), ": too short"));
    }
    uint64_t len = 0;
    for (int i = 7; i >= 0; --i) len = (len << 8) | len_bytes[i];
    if (len > (uint64_t{100} << 20) || len + 8 > fs::file_size(file, ec)) {
      return absl::InvalidArgumentError(
          absl::StrCat(file.string(), ": bad header length ", len));
    }
    ASSIGN_OR_RETURN(Json j, read_json(file, 8, len));
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (it.key() != "__metadata__") names.push_back(it.key());
    }
  }
  return names;
}

}  // namespace config_internal
absl::StatusOr<std::string> ModelConfig::ToNativeJson() const {
  using config_internal::FieldError;
  if (model_type != "mimo_v2_flash") {
    return FieldError("model_type", "the transformers-native format is mimo_v2_flash's");
  }
  if (swa.num_heads != full.num_heads || swa.num_kv_heads != 2 * full.num_kv_heads ||
      swa.head_dim != full.head_dim || swa.v_head_dim != full.v_head_dim || !swa.sink ||
      full.sink) {
    return FieldError("swa", "the transformers-native MiMo layout cannot express this SWA "
                             "geometry (same heads and dims as full, 2 x its KV heads, sinks "
                             "on SWA layers only)");
  }
  if (qkv_layout != QkvLayout::kSplit) {
    return FieldError("attention_projection_layout", "transformers stores split q/k/v");
  }
  nlohmann::ordered_json hub = nlohmann::ordered_json::parse(ToJson());
  const nlohmann::ordered_json dtype_name = hub["torch_dtype"];
  nlohmann::ordered_json j;
  for (const char* drop :
       {"hybrid_layer_pattern", "moe_layer_freq", "swa_num_attention_heads",
        "swa_num_key_value_heads", "swa_head_dim", "swa_v_head_dim", "rope_theta",
        "swa_rope_theta", "partial_rotary_factor", "add_full_attention_sink_bias",
        "add_swa_attention_sink_bias", "scoring_func", "torch_dtype"}) {
    hub.erase(drop);
  }
  for (auto it = hub.begin(); it != hub.end(); ++it) j[it.key()] = *it;
  std::vector<std::string> types, mlp;
  for (AttentionType t : layer_types) {
    types.push_back(t == AttentionType::kSwa ? "sliding_attention" : "full_attention");
  }
  for (bool m : moe_layers) mlp.push_back(m ? "sparse" : "dense");
  j["layer_types"] = types;
  j["mlp_layer_types"] = mlp;
  j["rope_parameters"] = {
      {"full_attention",
       {{"rope_type", "default"},
        {"rope_theta", full.rope_theta},
        {"partial_rotary_factor", partial_rotary_factor}}},
      {"sliding_attention",
       {{"rope_type", "default"},
        {"rope_theta", swa.rope_theta},
        {"partial_rotary_factor", partial_rotary_factor}}}};
  j["dtype"] = dtype_name;
  return j.dump(2) + "\n";
}

}  // namespace swaserve::model
