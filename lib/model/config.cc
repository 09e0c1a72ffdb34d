#include "lib/model/config.h"

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "lib/base/status.h"
#include "lib/model/config_json.h"

namespace swaserve::model {
namespace {

using config_internal::Describe;
using config_internal::FieldError;
using config_internal::Fields;
using Json = nlohmann::json;

// Upper bounds that keep every derived size (tensor shapes, per-layer
// vectors) far from overflow and allocation failure on hostile configs.
constexpr int64_t kMaxLayers = 4096;
constexpr int64_t kMaxMtpLayers = 64;
constexpr int64_t kMaxDim = 1 << 20;  // hidden, head dims, MLP widths
constexpr int64_t kMaxHeads = 4096;
constexpr int64_t kMaxExperts = 65536;
constexpr int64_t kMaxVocab = 1 << 26;

// Reads a per-layer list of two classes: either an int list of 0/1 (`int_name`)
// or a string list (`str_name`, with `str0`/`str1`). Both present: they must
// agree. Returns whether any was present.
absl::StatusOr<bool> ReadBinaryList(const Fields& f, const char* int_name,
                                    const char* str_name, const char* str0,
                                    const char* str1, std::vector<bool>* out,
                                    std::string* used_name) {
  std::string used;
  std::vector<bool> from_int, from_str;
  bool have_int = false, have_str = false;
  if (const Json* v = f.Find({int_name}, &used); v != nullptr) {
    if (!v->is_array()) {
      return FieldError(
          int_name, absl::StrCat("expected a list of 0/1, got ", Describe(*v)));
    }
    if (v->size() > kMaxLayers) {
      return FieldError(
          int_name,
          absl::StrCat("has ", v->size(), " entries (limit ", kMaxLayers, ")"));
    }
    for (size_t i = 0; i < v->size(); ++i) {
      const Json& e = (*v)[i];
      if (!e.is_number_integer() ||
          (e.get<int64_t>() != 0 && e.get<int64_t>() != 1)) {
        return FieldError(int_name,
                          absl::StrCat("entry ", i, " is ", Describe(e),
                                       ", expected 0 or 1"));
      }
      from_int.push_back(e.get<int64_t>() == 1);
    }
    have_int = true;
  }
  if (const Json* v = f.Find({str_name}, &used); v != nullptr) {
    if (!v->is_array()) {
      return FieldError(
          str_name,
          absl::StrCat("expected a list of strings, got ", Describe(*v)));
    }
    if (v->size() > kMaxLayers) {
      return FieldError(
          str_name,
          absl::StrCat("has ", v->size(), " entries (limit ", kMaxLayers, ")"));
    }
    for (size_t i = 0; i < v->size(); ++i) {
      const Json& e = (*v)[i];
      if (e.is_string() && e.get<std::string>() == str0) {
        from_str.push_back(false);
      } else if (e.is_string() && e.get<std::string>() == str1) {
        from_str.push_back(true);
      } else {
        return FieldError(str_name, absl::StrCat("entry ", i, " is ",
                                                 Describe(e), ", expected \"",
                                                 str0, "\" or \"", str1, "\""));
      }
    }
    have_str = true;
  }
  if (have_int && have_str && from_int != from_str) {
    return FieldError(str_name,
                      absl::StrCat("disagrees with ", int_name,
                                   " (both given; they must describe the same "
                                   "layers)"));
  }
  if (have_int) {
    *out = std::move(from_int);
    *used_name = int_name;
  } else if (have_str) {
    *out = std::move(from_str);
    *used_name = str_name;
  }
  return have_int || have_str;
}

absl::StatusOr<kv::DType> ParseTorchDType(const std::string& name,
                                          absl::string_view field) {
  absl::StatusOr<kv::DType> d = kv::ParseDType(name);
  if (!d.ok()) {
    return FieldError(field, absl::StrCat("unsupported dtype \"", name,
                                          "\" (expected float32, bfloat16 or "
                                          "float16)"));
  }
  return *d;
}

const char* TorchDTypeName(kv::DType d) {
  switch (d) {
    case kv::DType::kF32:
      return "float32";
    case kv::DType::kBF16:
      return "bfloat16";
    case kv::DType::kF16:
      return "float16";
  }
  return "float32";
}

// Fields this engine cannot honour: rejected by name rather than ignored.
absl::Status RejectUnsupported(const Json& root) {
  auto present = [&](const char* name) -> const Json* {
    auto it = root.find(name);
    if (it == root.end() || it->is_null()) return nullptr;
    return &*it;
  };
  RETURN_IF_ERROR(config_internal::CheckKnownFields(root));
  if (const Json* v = present("topk_method");
      v != nullptr && !(v->is_string() && (v->get<std::string>() == "noaux_tc" ||
                                           v->get<std::string>() == "greedy"))) {
    return FieldError("topk_method",
                      absl::StrCat("only \"noaux_tc\" (or \"greedy\", the same "
                                   "with n_group 1) is supported, got ",
                                   Describe(*v)));
  }
  if (const Json* v = present("attention_bias");
      v != nullptr && !(v->is_boolean() && !v->get<bool>())) {
    return FieldError("attention_bias",
                      absl::StrCat("only false is supported (no projection "
                                   "biases), got ",
                                   Describe(*v)));
  }
  if (const Json* v = present("hidden_act");
      v != nullptr && !(v->is_string() && v->get<std::string>() == "silu")) {
    return FieldError(
        "hidden_act",
        absl::StrCat("only \"silu\" is supported, got ", Describe(*v)));
  }
  if (const Json* v = present("n_shared_experts");
      v != nullptr && !(v->is_number_integer() && v->get<int64_t>() == 0)) {
    return FieldError(
        "n_shared_experts",
        absl::StrCat("shared experts are not supported, got ", Describe(*v)));
  }
  if (const Json* v = present("scoring_func");
      v != nullptr && !(v->is_string() && v->get<std::string>() == "sigmoid")) {
    return FieldError(
        "scoring_func",
        absl::StrCat("only \"sigmoid\" routing is supported, got ",
                     Describe(*v)));
  }
  if (const Json* v = present("n_group");
      v != nullptr && !(v->is_number_integer() && v->get<int64_t>() <= 1)) {
    return FieldError("n_group",
                      absl::StrCat("group-limited routing is not "
                                   "supported (need n_group <= 1), got ",
                                   Describe(*v)));
  }
  if (const Json* v = present("rope_scaling"); v != nullptr) {
    bool plain = false;
    if (v->is_object()) {
      auto t = v->find("rope_type");
      if (t == v->end()) t = v->find("type");
      plain =
          t != v->end() && t->is_string() && t->get<std::string>() == "default";
    }
    if (!plain) {
      return FieldError(
          "rope_scaling",
          absl::StrCat("RoPE scaling is not supported, got ", Describe(*v)));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckRange(absl::string_view field, int64_t value, int64_t lo,
                        int64_t hi) {
  if (value < lo) {
    return FieldError(field, absl::StrCat("must be >= ", lo, ", got ", value));
  }
  if (value > hi) {
    return FieldError(field, absl::StrCat(value, " exceeds the limit ", hi));
  }
  return absl::OkStatus();
}

absl::Status ValidateAttention(const AttentionConfig& a, bool swa,
                               double partial_rotary_factor) {
  const std::string p = swa ? "swa_" : "";
  const std::string heads = p + "num_attention_heads";
  const std::string kv_heads = p + "num_key_value_heads";
  RETURN_IF_ERROR(CheckRange(heads, a.num_heads, 1, kMaxHeads));
  RETURN_IF_ERROR(CheckRange(kv_heads, a.num_kv_heads, 1, kMaxHeads));
  if (a.num_heads % a.num_kv_heads != 0) {
    return FieldError(heads, absl::StrCat(a.num_heads, " is not a multiple of ",
                                          kv_heads, " ", a.num_kv_heads));
  }
  RETURN_IF_ERROR(CheckRange(p + "head_dim", a.head_dim, 1, kMaxDim));
  RETURN_IF_ERROR(CheckRange(p + "v_head_dim", a.v_head_dim, 1, kMaxDim));
  const std::string theta = swa ? "swa_rope_theta" : "rope_theta";
  if (!(a.rope_theta > 0) || !std::isfinite(a.rope_theta)) {
    return FieldError(theta, absl::StrCat("must be > 0, got ", a.rope_theta));
  }
  const int want = RotaryDim(a.head_dim, partial_rotary_factor);
  if (want <= 0) {
    return FieldError("partial_rotary_factor",
                      absl::StrCat(partial_rotary_factor, " x ", p, "head_dim ",
                                   a.head_dim, " leaves no rotary dims"));
  }
  if (a.rotary_dim != want) {
    return FieldError(
        absl::StrCat(swa ? "swa" : "full", ".rotary_dim"),
        absl::StrCat("is ", a.rotary_dim, ", but partial_rotary_factor ",
                     partial_rotary_factor, " x ", p, "head_dim ", a.head_dim,
                     " gives ", want));
  }
  return absl::OkStatus();
}

// The hub format's attention fields beyond the full-attention geometry: RoPE
// thetas, partial rotary factor, sinks and the SWA geometry (defaulting to
// the full one; RequireHubSwaFields refuses that default for MiMo).
absl::Status ReadHubAttention(const Fields& f, ModelConfig* out) {
  ModelConfig& c = *out;
  RETURN_IF_ERROR(f.Double({"rope_theta"}, &c.full.rope_theta).status());
  RETURN_IF_ERROR(
      f.Bool({"add_full_attention_sink_bias"}, &c.full.sink).status());

  // SWA geometry: defaults to the full one.
  c.swa = c.full;
  c.swa.sink = false;
  RETURN_IF_ERROR(
      f.Int({"swa_num_attention_heads"}, false, &c.swa.num_heads).status());
  RETURN_IF_ERROR(
      f.Int({"swa_num_key_value_heads"}, false, &c.swa.num_kv_heads)
          .status());
  RETURN_IF_ERROR(
      f.Int({"swa_head_dim", "swa_qk_head_dim"}, false, &c.swa.head_dim)
          .status());
  c.swa.v_head_dim = c.full.v_head_dim;
  RETURN_IF_ERROR(
      f.Int({"swa_v_head_dim"}, false, &c.swa.v_head_dim).status());
  RETURN_IF_ERROR(f.Double({"swa_rope_theta"}, &c.swa.rope_theta).status());
  RETURN_IF_ERROR(
      f.Bool({"add_swa_attention_sink_bias"}, &c.swa.sink).status());

  RETURN_IF_ERROR(
      f.Double({"partial_rotary_factor"}, &c.partial_rotary_factor).status());
  if (!(c.partial_rotary_factor > 0 && c.partial_rotary_factor <= 1)) {
    return FieldError(
        "partial_rotary_factor",
        absl::StrCat("must be in (0, 1], got ", c.partial_rotary_factor));
  }
  c.full.rotary_dim = RotaryDim(c.full.head_dim, c.partial_rotary_factor);
  c.swa.rotary_dim = RotaryDim(c.swa.head_dim, c.partial_rotary_factor);
  return absl::OkStatus();
}

}  // namespace

int RotaryDim(int head_dim, double partial_rotary_factor) {
  const double d = static_cast<double>(head_dim) * partial_rotary_factor;
  if (!(d >= 0) || d > static_cast<double>(std::numeric_limits<int>::max())) {
    return 0;
  }
  const int r = static_cast<int>(d);
  return r & ~1;
}

absl::StatusOr<ModelConfig> ModelConfig::FromJson(absl::string_view json,
                                                  absl::string_view source) {
  auto annotate = [&](const absl::Status& s) {
    return base::Annotate(s, source);
  };
  // nlohmann reads a NUL byte as the end of input; JSON never contains one.
  if (const size_t nul = json.find('\0'); nul != absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": invalid JSON: NUL byte at offset ", nul));
  }
  Json root = Json::parse(json.begin(), json.end(), nullptr,
                          /*allow_exceptions=*/false);
  if (root.is_discarded()) {
    try {
      Json unused = Json::parse(json.begin(), json.end());
      (void)unused;
    } catch (const Json::exception& e) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": invalid JSON: ", e.what()));
    }
    return absl::InvalidArgumentError(absl::StrCat(source, ": invalid JSON"));
  }
  if (!root.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": expected a JSON object, got ", root.type_name()));
  }
  if (absl::Status s = RejectUnsupported(root); !s.ok()) return annotate(s);

  ModelConfig c;
  Fields f(root);
  absl::Status status = [&]() -> absl::Status {
    RETURN_IF_ERROR(f.String({"model_type"}, &c.model_type).status());
    RETURN_IF_ERROR(f.Int({"vocab_size"}, true, &c.vocab_size).status());
    RETURN_IF_ERROR(f.Int({"hidden_size"}, true, &c.hidden_size).status());
    RETURN_IF_ERROR(f.Int({"num_hidden_layers"}, true, &c.num_layers).status());
    RETURN_IF_ERROR(
        CheckRange("num_hidden_layers", c.num_layers, 1, kMaxLayers));
    RETURN_IF_ERROR(CheckRange("hidden_size", c.hidden_size, 1, kMaxDim));

    // Full-attention geometry.
    RETURN_IF_ERROR(
        f.Int({"num_attention_heads"}, true, &c.full.num_heads).status());
    RETURN_IF_ERROR(
        CheckRange("num_attention_heads", c.full.num_heads, 1, kMaxHeads));
    c.full.num_kv_heads = c.full.num_heads;
    RETURN_IF_ERROR(
        f.Int({"num_key_value_heads"}, false, &c.full.num_kv_heads).status());
    ASSIGN_OR_RETURN(bool has_head_dim,
                     f.Int({"head_dim"}, false, &c.full.head_dim));
    if (!has_head_dim) {
      if (c.hidden_size % c.full.num_heads != 0) {
        return FieldError(
            "head_dim", absl::StrCat("missing, and hidden_size ", c.hidden_size,
                                     " is not a multiple of "
                                     "num_attention_heads ",
                                     c.full.num_heads));
      }
      c.full.head_dim = c.hidden_size / c.full.num_heads;
    }
    c.full.v_head_dim = c.full.head_dim;
    RETURN_IF_ERROR(f.Int({"v_head_dim"}, false, &c.full.v_head_dim).status());
    const bool native = config_internal::IsNativeFormat(root);
    if (!native) RETURN_IF_ERROR(ReadHubAttention(f, &c));
    RETURN_IF_ERROR(
        f.Double({"attention_value_scale"}, &c.attention_value_scale).status());

    // Layer pattern (default: every layer full).
    std::vector<bool> swa_layers(c.num_layers, false);
    std::string list_name;
    ASSIGN_OR_RETURN(bool has_pattern,
                     ReadBinaryList(f, "hybrid_layer_pattern", "layer_types",
                                    "full_attention", "sliding_attention",
                                    &swa_layers, &list_name));
    if (has_pattern && swa_layers.size() != static_cast<size_t>(c.num_layers)) {
      return FieldError(
          list_name,
          absl::StrCat("has ", swa_layers.size(),
                       " entries, but num_hidden_layers is ", c.num_layers));
    }
    c.layer_types.clear();
    for (bool s : swa_layers) {
      c.layer_types.push_back(s ? AttentionType::kSwa : AttentionType::kFull);
    }
    RETURN_IF_ERROR(f.Int({"sliding_window", "sliding_window_size"}, false,
                          &c.sliding_window)
                        .status());
    RETURN_IF_ERROR(config_internal::CheckSameInt(root, "attention_chunk_size",
                                                  c.sliding_window,
                                                  "sliding_window"));

    // MLPs (default: every layer dense).
    c.moe_layers.assign(c.num_layers, false);
    ASSIGN_OR_RETURN(
        bool has_moe,
        ReadBinaryList(f, "moe_layer_freq", "mlp_layer_types", "dense",
                       "sparse", &c.moe_layers, &list_name));
    if (has_moe && c.moe_layers.size() != static_cast<size_t>(c.num_layers)) {
      return FieldError(
          list_name,
          absl::StrCat("has ", c.moe_layers.size(),
                       " entries, but num_hidden_layers is ", c.num_layers));
    }
    RETURN_IF_ERROR(
        f.Int({"n_routed_experts"}, false, &c.n_routed_experts).status());
    RETURN_IF_ERROR(
        f.Int({"num_experts_per_tok"}, false, &c.num_experts_per_tok).status());
    RETURN_IF_ERROR(
        f.Int({"moe_intermediate_size"}, false, &c.moe_intermediate_size)
            .status());
    RETURN_IF_ERROR(
        f.Int({"intermediate_size"}, false, &c.intermediate_size).status());
    RETURN_IF_ERROR(f.Bool({"norm_topk_prob"}, &c.norm_topk_prob).status());
    RETURN_IF_ERROR(
        f.Double({"routed_scaling_factor"}, &c.routed_scaling_factor).status());
    ASSIGN_OR_RETURN(
        const bool has_mtp,
        f.Int({"num_nextn_predict_layers"}, false, &c.num_mtp_layers));
    c.mtp_layers_derived = !has_mtp;
    if (native) {
      RETURN_IF_ERROR(config_internal::ApplyNativeAttention(root, &c));
    } else {
      RETURN_IF_ERROR(config_internal::RequireHubSwaFields(root, c));
    }
    RETURN_IF_ERROR(config_internal::ReadQuantAndLayout(root, &c));

    RETURN_IF_ERROR(
        f.Double({"rms_norm_eps", "layernorm_epsilon"}, &c.rms_norm_eps)
            .status());
    std::string dtype;
    std::string dtype_field;
    if (f.Find({"torch_dtype", "dtype"}, &dtype_field) != nullptr) {
      RETURN_IF_ERROR(f.String({"torch_dtype", "dtype"}, &dtype).status());
      ASSIGN_OR_RETURN(c.dtype, ParseTorchDType(dtype, dtype_field));
    }
    RETURN_IF_ERROR(
        f.Bool({"tie_word_embeddings"}, &c.tie_word_embeddings).status());
    RETURN_IF_ERROR(
        f.Int({"max_position_embeddings"}, false, &c.max_position_embeddings)
            .status());
    RETURN_IF_ERROR(f.Int({"bos_token_id"}, false, &c.bos_token_id).status());
    std::string eos_field;
    if (const Json* eos = f.Find({"eos_token_id"}, &eos_field);
        eos != nullptr) {
      if (eos->is_array()) {
        if (eos->size() > 1024) {
          return FieldError("eos_token_id", "more than 1024 ids");
        }
        for (size_t i = 0; i < eos->size(); ++i) {
          ASSIGN_OR_RETURN(
              int id,
              Fields::AsInt((*eos)[i], absl::StrCat("eos_token_id[", i, "]")));
          c.eos_token_ids.push_back(id);
        }
      } else {
        ASSIGN_OR_RETURN(int id, Fields::AsInt(*eos, "eos_token_id"));
        c.eos_token_ids.push_back(id);
      }
    }
    return c.Validate();
  }();
  if (!status.ok()) return annotate(status);
  return c;
}

absl::StatusOr<EncoderTowers> EncoderTowersOf(const std::string& model_dir) {
  const std::string path = (std::filesystem::path(model_dir) / "config.json").string();
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot read"));
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
  auto object = [&](const char* key) { return j.contains(key) && j[key].is_object(); };
  return EncoderTowers{.vision = object("vision_config"), .audio = object("audio_config")};
}

absl::StatusOr<ModelConfig> ModelConfig::Load(const std::string& path) {
  std::error_code ec;
  std::string file = path;
  if (std::filesystem::is_directory(path, ec)) {
    file = (std::filesystem::path(path) / "config.json").string();
  }
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat(file, ": cannot open"));
  }
  std::stringstream buf;
  buf << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat(file, ": read error"));
  ASSIGN_OR_RETURN(ModelConfig c, FromJson(buf.str(), file));
  if (c.mtp_layers_derived) {
    const std::string dir =
        std::filesystem::path(file).parent_path().string();
    absl::StatusOr<std::vector<std::string>> names =
        config_internal::CheckpointTensorNames(dir.empty() ? "." : dir);
    if (!names.ok()) return base::Annotate(names.status(), dir);
    absl::StatusOr<int> count = config_internal::CountMtpLayers(*names);
    if (!count.ok()) return base::Annotate(count.status(), dir);
    c.num_mtp_layers = *count;
    if (absl::Status s = c.Validate(); !s.ok()) {
      return base::Annotate(s, file);
    }
  }
  return c;
}

std::string ModelConfig::ToJson() const {
  nlohmann::ordered_json j;
  if (!model_type.empty()) j["model_type"] = model_type;
  j["vocab_size"] = vocab_size;
  j["hidden_size"] = hidden_size;
  j["num_hidden_layers"] = num_layers;
  std::vector<int> pattern;
  for (AttentionType t : layer_types) {
    pattern.push_back(t == AttentionType::kSwa ? 1 : 0);
  }
  j["hybrid_layer_pattern"] = pattern;
  if (sliding_window > 0) j["sliding_window"] = sliding_window;
  j["num_attention_heads"] = full.num_heads;
  j["num_key_value_heads"] = full.num_kv_heads;
  j["head_dim"] = full.head_dim;
  j["v_head_dim"] = full.v_head_dim;
  j["swa_num_attention_heads"] = swa.num_heads;
  j["swa_num_key_value_heads"] = swa.num_kv_heads;
  j["swa_head_dim"] = swa.head_dim;
  j["swa_v_head_dim"] = swa.v_head_dim;
  j["rope_theta"] = full.rope_theta;
  j["swa_rope_theta"] = swa.rope_theta;
  j["partial_rotary_factor"] = partial_rotary_factor;
  j["add_full_attention_sink_bias"] = full.sink;
  j["add_swa_attention_sink_bias"] = swa.sink;
  j["attention_value_scale"] = attention_value_scale;
  std::vector<int> moe;
  for (bool m : moe_layers) moe.push_back(m ? 1 : 0);
  j["moe_layer_freq"] = moe;
  j["n_routed_experts"] = n_routed_experts;
  j["num_experts_per_tok"] = num_experts_per_tok;
  j["moe_intermediate_size"] = moe_intermediate_size;
  j["intermediate_size"] = intermediate_size;
  j["norm_topk_prob"] = norm_topk_prob;
  j["routed_scaling_factor"] = routed_scaling_factor;
  j["scoring_func"] = "sigmoid";
  j["hidden_act"] = "silu";
  j["attention_bias"] = false;
  if (!mtp_layers_derived || num_mtp_layers > 0) {
    j["num_nextn_predict_layers"] = num_mtp_layers;
  }
  if (quant.fp8) j["quantization_config"] = config_internal::QuantToJson(quant);
  if (qkv_layout == QkvLayout::kFused) {
    j["attention_projection_layout"] = "fused_qkv";
  }
  j["rms_norm_eps"] = rms_norm_eps;
  j["torch_dtype"] = TorchDTypeName(dtype);
  j["tie_word_embeddings"] = tie_word_embeddings;
  j["max_position_embeddings"] = max_position_embeddings;
  if (bos_token_id >= 0) {
    j["bos_token_id"] = bos_token_id;
  } else {
    j["bos_token_id"] = nullptr;
  }
  if (eos_token_ids.size() == 1) {
    j["eos_token_id"] = eos_token_ids[0];
  } else {
    j["eos_token_id"] = eos_token_ids;
  }
  // One line per field (lists stay on one line: a 70-layer pattern is
  // readable that way).
  std::string out = "{\n";
  bool first = true;
  for (auto it = j.begin(); it != j.end(); ++it) {
    absl::StrAppend(&out, first ? "" : ",\n", "  ", Json(it.key()).dump(), ": ",
                    it->dump());
    first = false;
  }
  absl::StrAppend(&out, "\n}\n");
  return out;
}

absl::Status ModelConfig::Validate() const {
  RETURN_IF_ERROR(CheckRange("vocab_size", vocab_size, 1, kMaxVocab));
  RETURN_IF_ERROR(CheckRange("hidden_size", hidden_size, 1, kMaxDim));
  RETURN_IF_ERROR(CheckRange("num_hidden_layers", num_layers, 1, kMaxLayers));
  if (layer_types.size() != static_cast<size_t>(num_layers)) {
    return FieldError(
        "hybrid_layer_pattern",
        absl::StrCat("has ", layer_types.size(),
                     " entries, but num_hidden_layers is ", num_layers));
  }
  if (moe_layers.size() != static_cast<size_t>(num_layers)) {
    return FieldError(
        "moe_layer_freq",
        absl::StrCat("has ", moe_layers.size(),
                     " entries, but num_hidden_layers is ", num_layers));
  }
  RETURN_IF_ERROR(
      CheckRange("num_nextn_predict_layers", num_mtp_layers, 0, kMaxMtpLayers));
  if (!(partial_rotary_factor > 0 && partial_rotary_factor <= 1)) {
    return FieldError(
        "partial_rotary_factor",
        absl::StrCat("must be in (0, 1], got ", partial_rotary_factor));
  }
  RETURN_IF_ERROR(
      ValidateAttention(full, /*swa=*/false, partial_rotary_factor));
  RETURN_IF_ERROR(ValidateAttention(swa, /*swa=*/true, partial_rotary_factor));
  if (sliding_window < 0 ||
      (sliding_window == 0 && (num_swa_layers() > 0 || num_mtp_layers > 0))) {
    return FieldError(
        "sliding_window",
        absl::StrCat("must be > 0",
                     num_swa_layers() > 0 ? " (there are SWA layers)"
                                          : " (MTP layers use SWA)",
                     ", got ", sliding_window));
  }
  if (!(attention_value_scale > 0) || !std::isfinite(attention_value_scale)) {
    return FieldError("attention_value_scale",
                      absl::StrCat("must be > 0, got ", attention_value_scale));
  }
  int dense = num_mtp_layers, sparse = 0;
  for (bool m : moe_layers) (m ? sparse : dense)++;
  if (dense > 0) {
    if (intermediate_size <= 0) {
      return FieldError("intermediate_size",
                        absl::StrCat("must be > 0 (", dense,
                                     " dense MLP layers incl. MTP), got ",
                                     intermediate_size));
    }
  }
  RETURN_IF_ERROR(
      CheckRange("intermediate_size", intermediate_size, 0, kMaxDim));
  if (sparse > 0) {
    if (n_routed_experts <= 0) {
      return FieldError(
          "n_routed_experts",
          absl::StrCat("must be > 0 (moe_layer_freq marks ", sparse,
                       " MoE layers), got ", n_routed_experts));
    }
    RETURN_IF_ERROR(
        CheckRange("n_routed_experts", n_routed_experts, 1, kMaxExperts));
    if (num_experts_per_tok <= 0 || num_experts_per_tok > n_routed_experts) {
      return FieldError(
          "num_experts_per_tok",
          absl::StrCat("must be in [1, n_routed_experts = ", n_routed_experts,
                       "], got ", num_experts_per_tok));
    }
    if (moe_intermediate_size <= 0) {
      return FieldError(
          "moe_intermediate_size",
          absl::StrCat("must be > 0 (", sparse, " MoE layers), got ",
                       moe_intermediate_size));
    }
  }
  RETURN_IF_ERROR(
      CheckRange("n_routed_experts", n_routed_experts, 0, kMaxExperts));
  RETURN_IF_ERROR(
      CheckRange("moe_intermediate_size", moe_intermediate_size, 0, kMaxDim));
  if (!(routed_scaling_factor > 0) || !std::isfinite(routed_scaling_factor)) {
    return FieldError("routed_scaling_factor",
                      absl::StrCat("must be > 0, got ", routed_scaling_factor));
  }
  if (!(rms_norm_eps > 0) || !std::isfinite(rms_norm_eps)) {
    return FieldError("rms_norm_eps",
                      absl::StrCat("must be > 0, got ", rms_norm_eps));
  }
  if (max_position_embeddings < 0) {
    return FieldError(
        "max_position_embeddings",
        absl::StrCat("must be >= 0, got ", max_position_embeddings));
  }
  if (bos_token_id < -1 || bos_token_id >= vocab_size) {
    return FieldError(
        "bos_token_id",
        absl::StrCat(bos_token_id, " is not a token id (vocab_size ",
                     vocab_size, ")"));
  }
  for (int id : eos_token_ids) {
    if (id < 0 || id >= vocab_size) {
      return FieldError(
          "eos_token_id",
          absl::StrCat(id, " is not a token id (vocab_size ", vocab_size, ")"));
    }
  }
  if (qkv_layout == QkvLayout::kFused) {
    const int g = qkv_groups();
    for (const AttentionConfig* a : {&full, &swa}) {
      if (a->num_heads % g != 0 || a->num_kv_heads % g != 0) {
        return FieldError(
            "attention_projection_layout",
            absl::StrCat("fused_qkv groups rows by num_key_value_heads = ", g,
                         ", which must divide every layer type's query and "
                         "KV heads (", a->num_heads, ", ", a->num_kv_heads,
                         ")"));
      }
    }
  }
  if (quant.fp8 && (quant.block_out < 1 || quant.block_in < 1)) {
    return FieldError("quantization_config.weight_block_size",
                      "must be positive");
  }
  switch (dtype) {
    case kv::DType::kF32:
    case kv::DType::kBF16:
    case kv::DType::kF16:
      break;
    default:
      return FieldError("torch_dtype", "unknown dtype");
  }
  return absl::OkStatus();
}

double ContextCostPerToken(const ModelConfig& c) {
  const double h = c.hidden_size;
  double per_token = 0, per_key = 0;
  for (int l = 0; l < c.num_layers && l < static_cast<int>(c.layer_types.size()); ++l) {
    const AttentionConfig& a = c.attention(l);
    per_token += h * (a.num_heads * a.head_dim + a.num_kv_heads * (a.head_dim + a.v_head_dim)) +
                 static_cast<double>(a.num_heads) * a.v_head_dim * h;
    const bool moe = l < static_cast<int>(c.moe_layers.size()) && c.moe_layers[l];
    per_token += moe ? 3.0 * h * c.moe_intermediate_size * c.num_experts_per_tok +
                           h * c.n_routed_experts  // router
                     : 3.0 * h * c.intermediate_size;
    if (c.layer_types[l] == AttentionType::kFull) {
      per_key += static_cast<double>(a.num_heads) * (a.head_dim + a.v_head_dim);
    }
  }
  return per_token > 0 ? per_key / per_token : 0;
}

int ModelConfig::num_full_layers() const {
  int n = 0;
  for (AttentionType t : layer_types) n += t == AttentionType::kFull;
  return n;
}

int ModelConfig::num_swa_layers() const {
  int n = 0;
  for (AttentionType t : layer_types) n += t == AttentionType::kSwa;
  return n;
}

std::vector<bool> ModelConfig::swa_layer_mask() const {
  std::vector<bool> swa;
  swa.reserve(layer_types.size());
  for (AttentionType t : layer_types) swa.push_back(t == AttentionType::kSwa);
  return swa;
}

int ModelConfig::pool_layer(int layer) const {
  const AttentionType type = layer_types[layer];
  int n = 0;
  for (int i = 0; i < layer; ++i) n += layer_types[i] == type;
  return n;
}

kv::KvShape ModelConfig::KvShape(int page_size) const {
  kv::KvShape s;
  s.full_layers = num_full_layers();
  s.full_kv_heads = full.num_kv_heads;
  s.full_k_head_dim = full.head_dim;
  s.full_v_head_dim = full.v_head_dim;
  s.swa_layers = num_swa_layers() + num_mtp_layers;
  s.swa_kv_heads = swa.num_kv_heads;
  s.swa_k_head_dim = swa.head_dim;
  s.swa_v_head_dim = swa.v_head_dim;
  s.sliding_window = sliding_window;
  s.page_size = page_size;
  s.dtype = dtype;
  return s;
}

}  // namespace swaserve::model
