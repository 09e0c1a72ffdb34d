// Seeded random checkpoints (`swaserve make-model`) and the built-in shapes.
//
// Determinism: every tensor draws from its own std::mt19937_64, seeded from
// (seed, FNV-1a of the tensor name) through SplitMix64, and normals come from
// our own Box-Muller transform of that stream, so the bytes depend neither on
// the order tensors are written in nor on the standard library's
// distribution implementations. (Only libm's log/sin/cos enter; they are
// correctly rounded or within an ulp on every platform we build on, and the
// values are rounded to f32/bf16/f16 afterwards.)
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <system_error>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "lib/base/status.h"
#include "lib/model/checkpoint.h"
#include "lib/model/config.h"

namespace swaserve::model {
namespace {

namespace fs = std::filesystem;

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t Fnv1a64(absl::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

// Standard normals by Box-Muller from a mt19937_64 stream.
class NormalStream {
 public:
  explicit NormalStream(uint64_t seed) : gen_(seed) {}
  double Next() {
    if (have_spare_) {
      have_spare_ = false;
      return spare_;
    }
    constexpr double kTwoPi = 6.283185307179586476925286766559;
    constexpr double kInv53 = 1.0 / 9007199254740992.0;  // 2^-53
    const double u1 =
        static_cast<double>((gen_() >> 11) + 1) * kInv53;          // (0,1]
    const double u2 = static_cast<double>(gen_() >> 11) * kInv53;  // [0,1)
    const double r = std::sqrt(-2.0 * std::log(u1));
    spare_ = r * std::sin(kTwoPi * u2);
    have_spare_ = true;
    return r * std::cos(kTwoPi * u2);
  }

 private:
  std::mt19937_64 gen_;
  bool have_spare_ = false;
  double spare_ = 0;
};

bool EndsWith(const std::string& s, absl::string_view suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix.data(),
                   suffix.size()) == 0;
}

// mean + std * N(0, 1) for every element of tensor `name`.
struct Init {
  double mean = 0;
  double std = 1;
};

Init InitFor(const std::string& name, const std::vector<int64_t>& shape) {
  if (EndsWith(name, "norm.weight")) return {1.0, 0.05};  // RMSNorm gains
  if (EndsWith(name, "attention_sink_bias")) return {0.0, 0.5};
  if (EndsWith(name, "e_score_correction_bias")) return {0.0, 0.05};
  if (name == "model.embed_tokens.weight") return {0.0, 1.0};
  // Projections [out, in]: normal(0, 1/sqrt(fan_in)) keeps activations O(1).
  const int64_t fan_in = shape.size() == 2 ? shape[1] : 1;
  return {0.0,
          1.0 / std::sqrt(static_cast<double>(std::max<int64_t>(fan_in, 1)))};
}

// The f32 values of tensor `name` (n elements).
std::vector<float> Draw(const std::string& name, const Init& init,
                        uint64_t seed, size_t n) {
  NormalStream normal(SplitMix64(seed ^ SplitMix64(Fnv1a64(name))));
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(init.mean + init.std * normal.Next());
  return v;
}

// Block-quantized E4M3 of an [rows, cols] matrix with power-of-two scales
// (2^ceil(log2(amax / 448)) per block; 1 for an all-zero block): the
// dequantized values fp8 * scale are then exact in BF16 and F32 as well, so
// FP8, BF16 and F32 checkpoints can hold the very same weights.
struct Fp8Blocks {
  std::vector<uint8_t> q;
  std::vector<float> scale;  // [ceil(rows / bo), ceil(cols / bi)]
};

Fp8Blocks QuantizeBlocks(const std::vector<float>& w, int64_t rows,
                         int64_t cols, int bo, int bi) {
  const int64_t sr = (rows + bo - 1) / bo, sc = (cols + bi - 1) / bi;
  Fp8Blocks b;
  b.scale.assign(sr * sc, 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      float& amax = b.scale[(r / bo) * sc + c / bi];
      amax = std::max(amax, std::fabs(w[r * cols + c]));
    }
  }
  for (float& s : b.scale) {
    s = s > 0 ? std::ldexp(1.0f, static_cast<int>(std::ceil(std::log2(s / 448.0f))))
              : 1.0f;
  }
  b.q.resize(w.size());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      b.q[r * cols + c] =
          F32ToFp8E4M3(w[r * cols + c] / b.scale[(r / bo) * sc + c / bi]);
    }
  }
  return b;
}

// Dequantized values of `b` over [rows, cols] with (bo, bi) blocks.
std::vector<float> Dequantize(const Fp8Blocks& b, int64_t rows, int64_t cols, int bo,
                              int bi) {
  const int64_t sc = (cols + bi - 1) / bi;
  std::vector<float> v(b.q.size());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      v[r * cols + c] = Fp8E4M3ToF32(b.q[r * cols + c]) * b.scale[(r / bo) * sc + c / bi];
    }
  }
  return v;
}

// A fused qkv_proj's geometry, for tensors whose values come from one.
struct QkvPlan {
  int groups = 0;  // 0: not a q/k/v/qkv projection on the fused layout
  QkvGroupRows rows;
  int64_t hidden = 0;
  std::string prefix;  // "model.layers.3.self_attn."
  int part = -1;       // 0/1/2: the q/k/v_proj cut out of it; -1: qkv_proj
};

// The fused qkv_proj's f32 values, assembled group by group from the
// q_proj, k_proj and v_proj draws (so split and fused checkpoints of one
// seed hold the same weights).
std::vector<float> FusedValues(const QkvPlan& p, uint64_t seed) {
  const int64_t g = p.groups, H = p.hidden;
  const int64_t part_rows[3] = {p.rows.q, p.rows.k, p.rows.v};
  const char* names[3] = {"q_proj.weight", "k_proj.weight", "v_proj.weight"};
  std::vector<float> out;
  out.reserve(static_cast<size_t>(g * p.rows.total() * H));
  std::vector<float> draws[3];
  for (int i = 0; i < 3; ++i) {
    draws[i] = Draw(p.prefix + names[i], InitFor(names[i], {0, H}), seed,
                    static_cast<size_t>(g * part_rows[i] * H));
  }
  for (int64_t grp = 0; grp < g; ++grp) {
    for (int i = 0; i < 3; ++i) {
      const auto begin = draws[i].begin() + grp * part_rows[i] * H;
      out.insert(out.end(), begin, begin + part_rows[i] * H);
    }
  }
  return out;
}

// FP8 per group of a fused qkv_proj: each group's rows on a block grid of
// their own (the published layout), scales concatenated.
Fp8Blocks QuantizeGroups(const std::vector<float>& w, const QkvPlan& p, int bo, int bi) {
  const int64_t gr = p.rows.total(), H = p.hidden;
  Fp8Blocks out;
  for (int64_t grp = 0; grp < p.groups; ++grp) {
    const std::vector<float> sub(w.begin() + grp * gr * H, w.begin() + (grp + 1) * gr * H);
    const Fp8Blocks b = QuantizeBlocks(sub, gr, H, bo, bi);
    out.q.insert(out.q.end(), b.q.begin(), b.q.end());
    out.scale.insert(out.scale.end(), b.scale.begin(), b.scale.end());
  }
  return out;
}

// How one tensor is written.
struct TensorPlan {
  std::string name;
  std::vector<int64_t> shape;
  TensorDType dtype = TensorDType::kF32;
  // FP8 (or rounded to the FP8 grid): the block size; the scale tensor's
  // plan names its weight in `weight`.
  int block_out = 0;
  int block_in = 0;
  bool is_scale = false;
  std::string weight;
  QkvPlan qkv;
};

// The f32 values of `t` (for a scale plan: of its weight), after the FP8
// grid when it has one; *blocks receives the quantization when it does.
std::vector<float> Values(const TensorPlan& t,
                          const std::map<std::string, std::vector<int64_t>>& all,
                          uint64_t seed, Fp8Blocks* blocks) {
  const std::string& src = t.is_scale ? t.weight : t.name;
  const std::vector<int64_t>& shape = all.at(src);
  if (t.qkv.groups > 0) {
    const std::vector<float> fused = FusedValues(t.qkv, seed);
    if (t.block_out == 0) return fused;
    *blocks = QuantizeGroups(fused, t.qkv, t.block_out, t.block_in);
    const int64_t gr = t.qkv.rows.total(), H = t.qkv.hidden;
    std::vector<float> deq;
    for (int64_t grp = 0; grp < t.qkv.groups; ++grp) {
      Fp8Blocks b;
      const int64_t sr = (gr + t.block_out - 1) / t.block_out * ((H + t.block_in - 1) / t.block_in);
      b.q.assign(blocks->q.begin() + grp * gr * H, blocks->q.begin() + (grp + 1) * gr * H);
      b.scale.assign(blocks->scale.begin() + grp * sr, blocks->scale.begin() + (grp + 1) * sr);
      const std::vector<float> d = Dequantize(b, gr, H, t.block_out, t.block_in);
      if (t.qkv.part < 0) {
        deq.insert(deq.end(), d.begin(), d.end());
        continue;
      }
      const int64_t off[3] = {0, t.qkv.rows.q, t.qkv.rows.q + t.qkv.rows.k};
      const int64_t cnt[3] = {t.qkv.rows.q, t.qkv.rows.k, t.qkv.rows.v};
      deq.insert(deq.end(), d.begin() + off[t.qkv.part] * H,
                 d.begin() + (off[t.qkv.part] + cnt[t.qkv.part]) * H);
    }
    return deq;
  }
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  std::vector<float> v = Draw(src, InitFor(src, shape), seed, n);
  if (t.block_out == 0) return v;
  *blocks = QuantizeBlocks(v, shape[0], shape[1], t.block_out, t.block_in);
  return Dequantize(*blocks, shape[0], shape[1], t.block_out, t.block_in);
}

void Fill(const TensorPlan& t, const std::map<std::string, std::vector<int64_t>>& all,
          uint64_t seed, absl::Span<uint8_t> out) {
  Fp8Blocks b;
  const std::vector<float> v = Values(t, all, seed, &b);
  if (t.is_scale) {
    std::memcpy(out.data(), b.scale.data(), b.scale.size() * 4);
    return;
  }
  if (t.dtype == TensorDType::kF8E4M3) {
    std::memcpy(out.data(), b.q.data(), b.q.size());
    return;
  }
  for (size_t i = 0; i < v.size(); ++i) {
    if (t.dtype == TensorDType::kF32) {
      std::memcpy(out.data() + 4 * i, &v[i], 4);
    } else {
      const uint16_t h = t.dtype == TensorDType::kBF16 ? F32ToBf16(v[i]) : F32ToF16(v[i]);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
}

// The fused-qkv plan of tensor `name` ("" groups when it is not one).
QkvPlan QkvPlanFor(const ModelConfig& c, const std::string& name, bool fused_grid) {
  QkvPlan p;
  const char* parts[4] = {"self_attn.q_proj.weight", "self_attn.k_proj.weight",
                          "self_attn.v_proj.weight", "self_attn.qkv_proj.weight"};
  int which = -1;
  for (int i = 0; i < 4; ++i) {
    if (EndsWith(name, parts[i])) which = i;
  }
  if (which < 0 || (which < 3 && !fused_grid)) return p;
  p.prefix = name.substr(0, name.size() - std::string(parts[which]).size()) + "self_attn.";
  const AttentionConfig* a = &c.swa;
  if (name.rfind("model.layers.", 0) == 0) {
    a = &c.attention(std::stoi(name.substr(13)));
  }
  p.groups = c.qkv_groups();
  p.rows = FusedQkvGroupRows(c, *a);
  p.hidden = c.hidden_size;
  p.part = which < 3 ? which : -1;
  return p;
}

absl::Status WriteText(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) {
    return absl::DataLossError(absl::StrCat(path.string(), ": write failed"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteRandomCheckpoint(const ModelConfig& config, uint64_t seed,
                                   const std::string& dir,
                                   const std::string& tokenizer_json) {
  return WriteRandomCheckpoint(config, seed, dir, tokenizer_json, nullptr);
}

absl::Status WriteRandomCheckpoint(
    const ModelConfig& config, uint64_t seed, const std::string& dir,
    const std::string& tokenizer_json,
    const SafetensorsWriter::ProgressFn& progress) {
  RandomCheckpointOptions options;
  options.tokenizer_json = tokenizer_json;
  options.progress = progress;
  return WriteRandomCheckpoint(config, seed, dir, options);
}

absl::Status WriteRandomCheckpoint(const ModelConfig& config, uint64_t seed,
                                   const std::string& dir,
                                   const RandomCheckpointOptions& options) {
  const std::string& tokenizer_json = options.tokenizer_json;
  RETURN_IF_ERROR(base::Annotate(config.Validate(), "config"));
  std::error_code ec;
  if (!tokenizer_json.empty() && !fs::is_regular_file(tokenizer_json, ec)) {
    return absl::NotFoundError(
        absl::StrCat(tokenizer_json, ": tokenizer file not found"));
  }
  const fs::path root(dir);
  fs::create_directories(root, ec);
  if (ec) {
    return absl::PermissionDeniedError(
        absl::StrCat(dir, ": cannot create directory: ", ec.message()));
  }
  std::string config_json = config.ToJson();
  if (options.native_config) {
    ASSIGN_OR_RETURN(config_json, config.ToNativeJson());
  }
  RETURN_IF_ERROR(WriteText(root / "config.json", config_json));
  if (!tokenizer_json.empty()) {
    fs::copy_file(tokenizer_json, root / "tokenizer.json",
                  fs::copy_options::overwrite_existing, ec);
    if (ec) {
      return absl::PermissionDeniedError(absl::StrCat(
          "copying ", tokenizer_json, " to ", dir, ": ", ec.message()));
    }
    // tokenizer_config.json (special tokens, chat template) travels with it.
    const fs::path tc =
        fs::path(tokenizer_json).parent_path() / "tokenizer_config.json";
    if (fs::is_regular_file(tc, ec)) {
      fs::copy_file(tc, root / "tokenizer_config.json",
                    fs::copy_options::overwrite_existing, ec);
      if (ec) {
        return absl::PermissionDeniedError(absl::StrCat(
            "copying ", tc.string(), " to ", dir, ": ", ec.message()));
      }
    }
  }
  const TensorDType dtype = ToTensorDType(config.dtype);
  const std::map<std::string, std::vector<int64_t>> expected = ExpectedTensors(config);
  SafetensorsWriter writer;
  for (const auto& [name, shape] : expected) {
    TensorPlan t;
    t.name = name;
    t.shape = shape;
    t.dtype = dtype;
    if (IsScaleTensor(name)) {
      t.is_scale = true;
      t.weight = name.substr(0, name.size() - std::string("_scale_inv").size());
      t.dtype = TensorDType::kF32;
    }
    if (ExpectFp8(config, t.is_scale ? t.weight : name)) {
      t.block_out = config.quant.block_out;
      t.block_in = config.quant.block_in;
      if (!t.is_scale) t.dtype = TensorDType::kF8E4M3;
    } else if (options.fp8_grid_block_out > 0 && IsQuantizableProjection(name)) {
      t.block_out = options.fp8_grid_block_out;
      t.block_in = options.fp8_grid_block_in;
    }
    // A split twin of a fused FP8 checkpoint: q/k/v on the fused grid.
    t.qkv = QkvPlanFor(config, t.is_scale ? t.weight : name,
                       options.fused_qkv_grid && t.block_out > 0 &&
                           t.dtype != TensorDType::kF8E4M3 && !t.is_scale);
    RETURN_IF_ERROR(writer.AddLazy(
        name, t.dtype, shape,
        [t, &expected, seed](absl::Span<uint8_t> out) { Fill(t, expected, seed, out); }));
  }
  return writer.Write((root / "model.safetensors").string(), options.progress);
}

absl::StatusOr<ModelConfig> BuiltinConfig(absl::string_view name,
                                          int vocab_size) {
  ModelConfig c;
  c.model_type = "mimo_v2";
  c.vocab_size = vocab_size;
  if (name == "tiny") {
    // 6 layers, both attention types with different KV geometry, W = 16,
    // 4 experts top-2, 2 MTP layers, f32.
    c.hidden_size = 64;
    c.num_layers = 6;
    for (int p : {0, 1, 1, 0, 1, 1}) {
      c.layer_types.push_back(p ? AttentionType::kSwa : AttentionType::kFull);
    }
    c.moe_layers = {false, true, true, true, true, true};
    c.sliding_window = 16;
    c.full = {.num_heads = 4,
              .num_kv_heads = 2,
              .head_dim = 16,
              .v_head_dim = 8,
              .rope_theta = 100000.0,
              .sink = false};
    c.swa = {.num_heads = 4,
             .num_kv_heads = 4,
             .head_dim = 16,
             .v_head_dim = 8,
             .rope_theta = 10000.0,
             .sink = true};
    c.partial_rotary_factor = 0.5;
    c.attention_value_scale = 0.707;
    c.intermediate_size = 96;
    c.moe_intermediate_size = 32;
    c.n_routed_experts = 4;
    c.num_experts_per_tok = 2;
    c.num_mtp_layers = 2;
    c.rms_norm_eps = 1e-6;
    c.dtype = kv::DType::kF32;
    c.max_position_embeddings = 65536;
  } else if (name == "mimo-v2.5-pro-mini") {
    // MiMo-V2.5-Pro's attention shape (70 layers: full at layer 0 and every
    // 7th layer = 10 full + 60 SWA; W = 128; 8 KV heads on both types; K 192 /
    // V 128; partial RoPE 0.334 -> 64 rotary dims) with a scaled-down hidden
    // size (256), 16 query heads, 8 experts top-2, 1 MTP layer, bf16.
    c.hidden_size = 256;
    c.num_layers = 70;
    for (int l = 0; l < 70; ++l) {
      c.layer_types.push_back(l % 7 == 0 ? AttentionType::kFull
                                         : AttentionType::kSwa);
      c.moe_layers.push_back(l != 0);
    }
    c.sliding_window = 128;
    c.full = {.num_heads = 16,
              .num_kv_heads = 8,
              .head_dim = 192,
              .v_head_dim = 128,
              .rope_theta = 5000000.0,
              .sink = false};
    c.swa = {.num_heads = 16,
             .num_kv_heads = 8,
             .head_dim = 192,
             .v_head_dim = 128,
             .rope_theta = 10000.0,
             .sink = true};
    c.partial_rotary_factor = 0.334;
    c.attention_value_scale = 0.707;
    c.intermediate_size = 512;
    c.moe_intermediate_size = 64;
    c.n_routed_experts = 8;
    c.num_experts_per_tok = 2;
    c.num_mtp_layers = 1;
    c.rms_norm_eps = 1e-6;
    c.dtype = kv::DType::kBF16;
    c.max_position_embeddings = 1048576;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown model shape \"", name,
                     "\" (built-in shapes: tiny, mimo-v2.5-pro-mini)"));
  }
  c.full.rotary_dim = RotaryDim(c.full.head_dim, c.partial_rotary_factor);
  c.swa.rotary_dim = RotaryDim(c.swa.head_dim, c.partial_rotary_factor);
  // Qwen-family special ids when the vocabulary has them (<|endoftext|> =
  // 151643, <|im_end|> = 151645); none for small test vocabularies.
  if (vocab_size > 151645) {
    c.bos_token_id = 151643;
    c.eos_token_ids = {151645, 151643};
  }
  RETURN_IF_ERROR(base::Annotate(c.Validate(), absl::StrCat("shape ", name)));
  return c;
}

}  // namespace swaserve::model
