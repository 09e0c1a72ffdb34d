#include "lib/model/gguf_export.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "lib/base/logging.h"
#include "lib/base/status.h"
#include "lib/model/checkpoint.h"
#include "lib/model/cpu_kernels.h"

namespace swaserve::model {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

// The Qwen2 pre-tokenizer split (llama.cpp's "qwen2" pre-tokenizer).
constexpr absl::string_view kQwen2Split =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

// llama.cpp token types.
constexpr int32_t kTokenNormal = 1;
constexpr int32_t kTokenControl = 3;
constexpr int32_t kTokenUserDefined = 4;
constexpr int32_t kTokenUnused = 5;

// llama_ftype values of general.file_type.
constexpr uint32_t kFileTypeF32 = 0;
constexpr uint32_t kFileTypeF16 = 1;
constexpr uint32_t kFileTypeBF16 = 32;

absl::Status Unrepresentable(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(
      "cannot export to llama.cpp's mimo2 architecture: ", what));
}

absl::Status CheckRepresentable(const ModelConfig& c) {
  const AttentionConfig& f = c.full;
  const AttentionConfig& s = c.swa;
  const bool any_swa = c.num_swa_layers() > 0 || c.num_mtp_layers > 0;
  if (any_swa && (f.num_heads != s.num_heads || f.head_dim != s.head_dim ||
                  f.v_head_dim != s.v_head_dim || f.rotary_dim != s.rotary_dim)) {
    return Unrepresentable(absl::StrCat(
        "full and SWA layers differ in heads / head_dim / v_head_dim / rotary "
        "dims (", f.num_heads, "/", f.head_dim, "/", f.v_head_dim, "/",
        f.rotary_dim, " vs ", s.num_heads, "/", s.head_dim, "/", s.v_head_dim,
        "/", s.rotary_dim, "); mimo2 has one geometry and per-layer KV heads"));
  }
  bool any_moe = false;
  for (bool m : c.moe_layers) any_moe |= m;
  if (any_moe && !c.norm_topk_prob) {
    return Unrepresentable(
        "norm_topk_prob false (mimo2 always normalises the top-k weights)");
  }
  if (any_moe && c.routed_scaling_factor != 1.0) {
    return Unrepresentable(absl::StrCat(
        "routed_scaling_factor ", c.routed_scaling_factor,
        " (mimo2 reads no expert weight scale)"));
  }
  if (c.sliding_window <= 0) {
    return Unrepresentable("sliding_window 0 (mimo2 needs a window)");
  }
  return absl::OkStatus();
}

absl::StatusOr<GgmlType> MatrixType(const ModelConfig& c,
                                    const std::string& dtype) {
  if (dtype == "f32") return GgmlType::kF32;
  if (dtype == "bf16") return GgmlType::kBF16;
  if (dtype == "f16") return GgmlType::kF16;
  if (dtype != "stored") {
    return absl::InvalidArgumentError(absl::StrCat(
        "dtype '", dtype, "': expected stored, f32, bf16 or f16"));
  }
  if (c.quant.fp8) {
    return Unrepresentable(
        "FP8 block-scaled weights as stored (GGUF has no such type); export "
        "with dtype f32 (exact) or bf16");
  }
  switch (c.dtype) {
    case kv::DType::kBF16: return GgmlType::kBF16;
    case kv::DType::kF16: return GgmlType::kF16;
    default: return GgmlType::kF32;
  }
}

// ---------------------------------------------------------------------------
// Tokenizer.

absl::StatusOr<std::string> ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  return std::string(std::istreambuf_iterator<char>(in),
                     std::istreambuf_iterator<char>());
}

absl::Status CheckPreTokenizer(const Json& t, const std::string& path) {
  const Json* pre = t.contains("pre_tokenizer") ? &t["pre_tokenizer"] : nullptr;
  bool ok = false;
  if (pre != nullptr && pre->is_object() && pre->value("type", "") == "Sequence" &&
      pre->contains("pretokenizers") && (*pre)["pretokenizers"].size() == 2) {
    const Json& split = (*pre)["pretokenizers"][0];
    const Json& bl = (*pre)["pretokenizers"][1];
    ok = split.value("type", "") == "Split" && split.contains("pattern") &&
         split["pattern"].is_object() &&
         split["pattern"].value("Regex", "") == kQwen2Split &&
         split.value("behavior", "") == "Isolated" &&
         !split.value("invert", false) && bl.value("type", "") == "ByteLevel" &&
         !bl.value("use_regex", true) && !bl.value("add_prefix_space", true);
  }
  if (!ok) {
    return Unrepresentable(absl::StrCat(
        path, ": pre_tokenizer is not the Qwen2 byte-level split (the one "
        "llama.cpp pre-tokenizer this exporter maps to): ",
        pre == nullptr ? "null" : pre->dump().substr(0, 200)));
  }
  // NFC (what Qwen2/Qwen3 tokenizers carry) is accepted: llama.cpp's qwen2
  // pre-tokenizer does not normalize, which tokenizes NFC text identically
  // and other text possibly not; any other normalizer is refused.
  if (t.contains("normalizer") && !t["normalizer"].is_null()) {
    const Json& n = t["normalizer"];
    if (!n.is_object() || n.value("type", "") != "NFC") {
      return Unrepresentable(absl::StrCat(path, ": a normalizer (",
                                          n.dump().substr(0, 80), ")"));
    }
    SWA_LOG(warn, "{}: NFC normalizer: llama.cpp does not normalize; text that is not NFC "
                  "may tokenize differently there", path);
  }
  return absl::OkStatus();
}

absl::Status AddTokenizer(const ModelConfig& config, const std::string& dir,
                          GgufWriter* w) {
  const std::string path = dir + "/tokenizer.json";
  if (!fs::exists(path)) {
    return Unrepresentable(absl::StrCat(
        "no ", path, " (llama.cpp loads the vocabulary from the GGUF file)"));
  }
  ASSIGN_OR_RETURN(std::string text, ReadText(path));
  Json t = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (t.is_discarded() || !t.is_object() || !t.contains("model") ||
      !t["model"].is_object() || t["model"].value("type", "") != "BPE" ||
      !t["model"].contains("vocab") || !t["model"]["vocab"].is_object() ||
      !t["model"].contains("merges") || !t["model"]["merges"].is_array()) {
    return Unrepresentable(absl::StrCat(path, ": not a BPE tokenizer.json"));
  }
  RETURN_IF_ERROR(CheckPreTokenizer(t, path));
  const int n = config.vocab_size;
  std::vector<std::string> tokens(n);
  std::vector<int32_t> types(n, kTokenUnused);
  auto put = [&](const std::string& s, const Json& id, int32_t type) -> absl::Status {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
        id.get<int64_t>() >= n) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": token '", s, "' has id ", id.dump(), " outside [0, ",
          n, ") (vocab_size)"));
    }
    tokens[id.get<int64_t>()] = s;
    types[id.get<int64_t>()] = type;
    return absl::OkStatus();
  };
  for (auto it = t["model"]["vocab"].begin(); it != t["model"]["vocab"].end(); ++it) {
    RETURN_IF_ERROR(put(it.key(), *it, kTokenNormal));
  }
  if (t.contains("added_tokens") && t["added_tokens"].is_array()) {
    for (const Json& a : t["added_tokens"]) {
      if (!a.is_object() || !a.contains("content") || !a["content"].is_string()) {
        return absl::InvalidArgumentError(absl::StrCat(path, ": bad added token"));
      }
      RETURN_IF_ERROR(put(a["content"].get<std::string>(), a.value("id", Json()),
                          a.value("special", false) ? kTokenControl
                                                    : kTokenUserDefined));
    }
  }
  for (int i = 0; i < n; ++i) {
    if (types[i] == kTokenUnused) tokens[i] = absl::StrCat("[PAD", i, "]");
  }
  std::vector<std::string> merges;
  for (const Json& m : t["model"]["merges"]) {
    if (m.is_string()) {
      merges.push_back(m.get<std::string>());
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      merges.push_back(absl::StrCat(m[0].get<std::string>(), " ",
                                    m[1].get<std::string>()));
    } else {
      return absl::InvalidArgumentError(absl::StrCat(path, ": bad merge ", m.dump()));
    }
  }
  RETURN_IF_ERROR(w->AddMetadata("tokenizer.ggml.model", GgufValue::Str("gpt2")));
  RETURN_IF_ERROR(w->AddMetadata("tokenizer.ggml.pre", GgufValue::Str("qwen2")));
  RETURN_IF_ERROR(w->AddMetadata("tokenizer.ggml.tokens",
                                 GgufValue::StrArray(std::move(tokens))));
  RETURN_IF_ERROR(w->AddMetadata("tokenizer.ggml.token_type", GgufValue::I32Array(types)));
  RETURN_IF_ERROR(w->AddMetadata("tokenizer.ggml.merges",
                                 GgufValue::StrArray(std::move(merges))));
  if (!config.eos_token_ids.empty()) {
    RETURN_IF_ERROR(w->AddMetadata("tokenizer.ggml.eos_token_id",
                                   GgufValue::U32(config.eos_token_ids[0])));
  }
  if (config.bos_token_id >= 0) {
    RETURN_IF_ERROR(w->AddMetadata("tokenizer.ggml.bos_token_id",
                                   GgufValue::U32(config.bos_token_id)));
  }
  RETURN_IF_ERROR(w->AddMetadata("tokenizer.ggml.add_bos_token", GgufValue::Bool(false)));
  // The checkpoint's chat template, when it has one.
  std::string chat_template;
  if (fs::exists(dir + "/chat_template.jinja")) {
    ASSIGN_OR_RETURN(chat_template, ReadText(dir + "/chat_template.jinja"));
  } else if (fs::exists(dir + "/tokenizer_config.json")) {
    ASSIGN_OR_RETURN(std::string tc, ReadText(dir + "/tokenizer_config.json"));
    Json j = Json::parse(tc, nullptr, false);
    if (j.is_object() && j.contains("chat_template") && j["chat_template"].is_string()) {
      chat_template = j["chat_template"].get<std::string>();
    }
  }
  if (!chat_template.empty()) {
    RETURN_IF_ERROR(w->AddMetadata("tokenizer.chat_template",
                                   GgufValue::Str(std::move(chat_template))));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Hyperparameters.

absl::Status AddHparams(const ModelConfig& c, const GgufExportOptions& o,
                        const std::string& name, GgmlType matrix_type,
                        GgufWriter* w) {
  const int blocks = c.num_layers + c.num_mtp_layers;
  const int ctx = o.context_length > 0 ? o.context_length : c.max_position_embeddings;
  if (ctx <= 0) {
    return Unrepresentable(
        "no context length (max_position_embeddings is 0; pass one)");
  }
  std::vector<int32_t> kv_heads, pattern;
  for (int b = 0; b < blocks; ++b) {
    const bool swa = b >= c.num_layers || c.layer_types[b] == AttentionType::kSwa;
    pattern.push_back(swa ? 1 : 0);
    kv_heads.push_back(swa ? c.swa.num_kv_heads : c.full.num_kv_heads);
  }
  int experts = 0;
  for (bool m : c.moe_layers) experts += m ? 1 : 0;
  const uint32_t file_type = matrix_type == GgmlType::kF32   ? kFileTypeF32
                             : matrix_type == GgmlType::kF16 ? kFileTypeF16
                                                             : kFileTypeBF16;
  const std::pair<std::string, GgufValue> kv[] = {
      {"general.architecture", GgufValue::Str("mimo2")},
      {"general.name", GgufValue::Str(name)},
      {"general.file_type", GgufValue::U32(file_type)},
      {"mimo2.context_length", GgufValue::U32(ctx)},
      {"mimo2.embedding_length", GgufValue::U32(c.hidden_size)},
      {"mimo2.block_count", GgufValue::U32(blocks)},
      {"mimo2.feed_forward_length", GgufValue::U32(c.intermediate_size)},
      {"mimo2.attention.head_count", GgufValue::U32(c.full.num_heads)},
      {"mimo2.attention.head_count_kv", GgufValue::I32Array(kv_heads)},
      {"mimo2.attention.key_length", GgufValue::U32(c.full.head_dim)},
      {"mimo2.attention.value_length", GgufValue::U32(c.full.v_head_dim)},
      {"mimo2.attention.layer_norm_rms_epsilon",
       GgufValue::F32(static_cast<float>(c.rms_norm_eps))},
      {"mimo2.attention.sliding_window", GgufValue::U32(c.sliding_window)},
      {"mimo2.attention.sliding_window_pattern", GgufValue::I32Array(pattern)},
      {"mimo2.rope.dimension_count", GgufValue::U32(c.full.rotary_dim)},
      {"mimo2.rope.freq_base", GgufValue::F32(static_cast<float>(c.full.rope_theta))},
      {"mimo2.rope.freq_base_swa",
       GgufValue::F32(static_cast<float>(c.swa.rope_theta))},
  };
  for (const auto& [k, v] : kv) RETURN_IF_ERROR(w->AddMetadata(k, v));
  if (c.num_mtp_layers > 0) {
    RETURN_IF_ERROR(w->AddMetadata("mimo2.nextn_predict_layers",
                                   GgufValue::U32(c.num_mtp_layers)));
  }
  if (experts > 0) {
    RETURN_IF_ERROR(w->AddMetadata("mimo2.expert_count", GgufValue::U32(c.n_routed_experts)));
    RETURN_IF_ERROR(w->AddMetadata("mimo2.expert_used_count",
                                   GgufValue::U32(c.num_experts_per_tok)));
    RETURN_IF_ERROR(w->AddMetadata("mimo2.expert_feed_forward_length",
                                   GgufValue::U32(c.moe_intermediate_size)));
  }
  if (c.attention_value_scale != 1.0) {
    RETURN_IF_ERROR(w->AddMetadata(
        "mimo2.attention.value_scale",
        GgufValue::F32(static_cast<float>(c.attention_value_scale))));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Tensors.

// One GGUF tensor: the stored row blocks it stacks, in order.
struct Planned {
  std::string name;
  GgmlType type;
  std::vector<int64_t> ne;
  std::vector<WeightPart> parts;
};

float PartValue(const WeightPart& p, int64_t r, int64_t k) {
  const int64_t i = r * p.K + k;
  switch (p.format) {
    case WeightFormat::kF32: {
      float x;
      std::memcpy(&x, static_cast<const uint8_t*>(p.data) + 4 * i, 4);
      return x;
    }
    case WeightFormat::kBF16: {
      uint16_t x;
      std::memcpy(&x, static_cast<const uint8_t*>(p.data) + 2 * i, 2);
      return Bf16ToF32(x);
    }
    case WeightFormat::kF16: {
      uint16_t x;
      std::memcpy(&x, static_cast<const uint8_t*>(p.data) + 2 * i, 2);
      return F16ToF32(x);
    }
    case WeightFormat::kFp8E4M3: {
      const int64_t srow = (p.row0 + r) / p.block_out;
      float s;
      std::memcpy(&s, p.scale + srow * p.scale_cols + k / p.block_in, 4);
      return Fp8E4M3ToF32(static_cast<const uint8_t*>(p.data)[i]) * s;
    }
  }
  return 0.0f;
}

bool SameFormat(WeightFormat f, GgmlType t) {
  return (f == WeightFormat::kF32 && t == GgmlType::kF32) ||
         (f == WeightFormat::kBF16 && t == GgmlType::kBF16) ||
         (f == WeightFormat::kF16 && t == GgmlType::kF16);
}

absl::Status Fill(const Planned& t, absl::Span<uint8_t> out) {
  const size_t es = GgmlTypeSize(t.type);
  size_t at = 0;
  for (const WeightPart& p : t.parts) {
    const size_t bytes = static_cast<size_t>(p.rows * p.K) * es;
    if (at + bytes > out.size()) return absl::InternalError("parts overrun the tensor");
    if (SameFormat(p.format, t.type)) {
      std::memcpy(out.data() + at, p.data, bytes);
    } else {
      uint8_t* dst = out.data() + at;
      for (int64_t r = 0; r < p.rows; ++r) {
        for (int64_t k = 0; k < p.K; ++k, dst += es) {
          const float x = PartValue(p, r, k);
          if (t.type == GgmlType::kF32) {
            std::memcpy(dst, &x, 4);
          } else {
            const uint16_t h = t.type == GgmlType::kBF16 ? F32ToBf16(x) : F32ToF16(x);
            std::memcpy(dst, &h, 2);
          }
        }
      }
    }
    at += bytes;
  }
  if (at != out.size()) return absl::InternalError("parts do not cover the tensor");
  return absl::OkStatus();
}

class Planner {
 public:
  Planner(const Checkpoint& ck, GgmlType matrix_type)
      : ck_(ck), c_(ck.config()), matrix_type_(matrix_type) {}

  absl::StatusOr<std::vector<Planned>> Plan() {
    RETURN_IF_ERROR(Vector("token_embd.weight", "model.embed_tokens.weight", true));
    RETURN_IF_ERROR(Vector("output_norm.weight", "model.norm.weight", false));
    RETURN_IF_ERROR(Vector("output.weight",
                           c_.tie_word_embeddings ? "model.embed_tokens.weight"
                                                  : "lm_head.weight",
                           true));
    for (int b = 0; b < c_.num_layers + c_.num_mtp_layers; ++b) {
      RETURN_IF_ERROR(Block(b));
    }
    return std::move(out_);
  }

 private:
  // A tensor stored whole: matrices in the matrix type, 1-D ones in F32.
  absl::Status Vector(const std::string& gguf, const std::string& hf, bool matrix) {
    const TensorInfo* t = ck_.Find(hf);
    if (t == nullptr) return absl::NotFoundError(absl::StrCat("no tensor ", hf));
    if (t->shape.size() == 2) {
      ASSIGN_OR_RETURN(WeightPart p, ck_.Weight(hf));
      out_.push_back(Planned{.name = gguf,
                             .type = matrix ? matrix_type_ : GgmlType::kF32,
                             .ne = {t->shape[1], t->shape[0]},
                             .parts = {p}});
      return absl::OkStatus();
    }
    WeightPart p{.data = t->data, .rows = 1, .K = t->numel()};
    switch (t->dtype) {
      case TensorDType::kF32: p.format = WeightFormat::kF32; break;
      case TensorDType::kBF16: p.format = WeightFormat::kBF16; break;
      case TensorDType::kF16: p.format = WeightFormat::kF16; break;
      default:
        return absl::InvalidArgumentError(absl::StrCat(hf, ": unexpected dtype"));
    }
    out_.push_back(Planned{.name = gguf, .type = GgmlType::kF32,
                           .ne = {t->numel()}, .parts = {p}});
    return absl::OkStatus();
  }

  absl::Status Stack(const std::string& gguf, const std::vector<std::string>& hf,
                     bool matrix) {
    Planned t{.name = gguf, .type = matrix ? matrix_type_ : GgmlType::kF32};
    int64_t rows = 0, K = -1;
    for (const std::string& n : hf) {
      ASSIGN_OR_RETURN(WeightPart p, ck_.Weight(n));
      if (K >= 0 && p.K != K) return absl::InternalError(absl::StrCat(n, ": width"));
      K = p.K;
      rows += p.rows;
      t.parts.push_back(p);
    }
    t.ne = {K, rows};
    out_.push_back(std::move(t));
    return absl::OkStatus();
  }

  absl::Status Attention(const std::string& blk, const std::string& p,
                         const AttentionConfig& a, bool fused_out) {
    if (c_.qkv_layout == QkvLayout::kFused) {
      ASSIGN_OR_RETURN(WeightPart fused, ck_.Weight(p + "self_attn.qkv_proj.weight"));
      ASSIGN_OR_RETURN(FusedQkvParts parts, SplitFusedQkv(c_, a, fused));
      Planned t{.name = blk + "attn_qkv.weight", .type = matrix_type_};
      int64_t rows = 0;
      for (const auto* v : {&parts.q, &parts.k, &parts.v}) {
        for (const WeightPart& w : *v) {
          t.parts.push_back(w);
          rows += w.rows;
        }
      }
      t.ne = {fused.K, rows};
      out_.push_back(std::move(t));
    } else if (fused_out) {
      RETURN_IF_ERROR(Stack(blk + "attn_qkv.weight",
                            {p + "self_attn.q_proj.weight", p + "self_attn.k_proj.weight",
                             p + "self_attn.v_proj.weight"},
                            true));
    } else {
      RETURN_IF_ERROR(Vector(blk + "attn_q.weight", p + "self_attn.q_proj.weight", true));
      RETURN_IF_ERROR(Vector(blk + "attn_k.weight", p + "self_attn.k_proj.weight", true));
      RETURN_IF_ERROR(Vector(blk + "attn_v.weight", p + "self_attn.v_proj.weight", true));
    }
    RETURN_IF_ERROR(Vector(blk + "attn_output.weight", p + "self_attn.o_proj.weight", true));
    if (a.sink) {
      RETURN_IF_ERROR(Vector(blk + "attn_sinks.weight",
                             p + "self_attn.attention_sink_bias", false));
    }
    return absl::OkStatus();
  }

  absl::Status Block(int b) {
    const bool mtp = b >= c_.num_layers;
    const std::string blk = absl::StrCat("blk.", b, ".");
    const std::string p = mtp ? absl::StrCat("model.mtp.layers.", b - c_.num_layers, ".")
                              : absl::StrCat("model.layers.", b, ".");
    RETURN_IF_ERROR(Vector(blk + "attn_norm.weight", p + "input_layernorm.weight", false));
    RETURN_IF_ERROR(Vector(blk + "ffn_norm.weight", p + "post_attention_layernorm.weight",
                           false));
    RETURN_IF_ERROR(Attention(blk, p, mtp ? c_.swa : c_.attention(b), mtp));
    if (!mtp && c_.moe_layers[b]) {
      // The router in F32 (exact), as llama.cpp's converter keeps it.
      RETURN_IF_ERROR(Vector(blk + "ffn_gate_inp.weight", p + "mlp.gate.weight", false));
      RETURN_IF_ERROR(Vector(blk + "exp_probs_b.bias",
                             p + "mlp.gate.e_score_correction_bias", false));
      for (const char* proj : {"gate", "up", "down"}) {
        std::vector<std::string> names;
        for (int e = 0; e < c_.n_routed_experts; ++e) {
          names.push_back(absl::StrCat(p, "mlp.experts.", e, ".", proj, "_proj.weight"));
        }
        RETURN_IF_ERROR(Stack(absl::StrCat(blk, "ffn_", proj, "_exps.weight"), names, true));
        // Stack wrote {K, E x rows}; experts are a third dimension.
        Planned& t = out_.back();
        t.ne = {t.ne[0], t.ne[1] / c_.n_routed_experts, c_.n_routed_experts};
      }
    } else {
      for (const char* proj : {"gate", "up", "down"}) {
        RETURN_IF_ERROR(Vector(absl::StrCat(blk, "ffn_", proj, ".weight"),
                               absl::StrCat(p, "mlp.", proj, "_proj.weight"), true));
      }
    }
    if (mtp) {
      RETURN_IF_ERROR(Vector(blk + "nextn.eh_proj.weight", p + "eh_proj.weight", true));
      RETURN_IF_ERROR(Vector(blk + "nextn.enorm.weight", p + "enorm.weight", false));
      RETURN_IF_ERROR(Vector(blk + "nextn.hnorm.weight", p + "hnorm.weight", false));
      RETURN_IF_ERROR(Vector(blk + "layer_output_norm.weight",
                             p + "final_layernorm.weight", false));
    }
    return absl::OkStatus();
  }

  const Checkpoint& ck_;
  const ModelConfig& c_;
  GgmlType matrix_type_;
  std::vector<Planned> out_;
};

}  // namespace

absl::StatusOr<GgufExportSummary> ExportGguf(const std::string& checkpoint_dir,
                                             const std::string& out_path,
                                             const GgufExportOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ck, Checkpoint::Open(checkpoint_dir));
  const ModelConfig& c = ck->config();
  RETURN_IF_ERROR(CheckRepresentable(c));
  ASSIGN_OR_RETURN(GgmlType matrix_type, MatrixType(c, options.dtype));
  std::string name = options.name;
  if (name.empty()) name = fs::path(checkpoint_dir).lexically_normal().filename().string();
  if (name.empty()) name = fs::absolute(checkpoint_dir).parent_path().filename().string();

  GgufWriter w;
  RETURN_IF_ERROR(AddHparams(c, options, name, matrix_type, &w));
  RETURN_IF_ERROR(AddTokenizer(c, checkpoint_dir, &w));
  Planner planner(*ck, matrix_type);
  ASSIGN_OR_RETURN(std::vector<Planned> plan, planner.Plan());
  auto shared = std::make_shared<std::vector<Planned>>(std::move(plan));
  for (size_t i = 0; i < shared->size(); ++i) {
    const Planned& t = (*shared)[i];
    RETURN_IF_ERROR(w.AddTensor(t.name, t.type, t.ne,
                                [shared, i](absl::Span<uint8_t> out) {
                                  return Fill((*shared)[i], out);
                                }));
  }
  RETURN_IF_ERROR(w.Write(out_path));
  return GgufExportSummary{.tensors = static_cast<int>(shared->size()),
                           .bytes = fs::file_size(out_path),
                           .matrix_type = matrix_type};
}

}  // namespace swaserve::model
