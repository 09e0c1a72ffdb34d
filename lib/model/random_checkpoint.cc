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
};

void Fill(const TensorPlan& t, const std::map<std::string, std::vector<int64_t>>& all,
          uint64_t seed, absl::Span<uint8_t> out) {
  const std::string& src = t.is_scale ? t.weight : t.name;
  const std::vector<int64_t>& shape = all.at(src);
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  std::vector<float> v = Draw(src, InitFor(src, shape), seed, n);
  if (t.block_out > 0) {
    const Fp8Blocks b = QuantizeBlocks(v, shape[0], shape[1], t.block_out, t.block_in);
    if (t.is_scale) {
      std::memcpy(out.data(), b.scale.data(), b.scale.size() * 4);
      return;
    }
    if (t.dtype == TensorDType::kF8E4M3) {
      std::memcpy(out.data(), b.q.data(), b.q.size());
      return;
    }
    const int64_t sc = (shape[1] + t.block_in - 1) / t.block_in;
    for (size_t i = 0; i < n; ++i) {  // the FP8 twin's values, exactly
      const int64_t r = static_cast<int64_t>(i) / shape[1], c = static_cast<int64_t>(i) % shape[1];
      v[i] = Fp8E4M3ToF32(b.q[i]) * b.scale[(r / t.block_out) * sc + c / t.block_in];
    }
  }
  for (size_t i = 0; i < n; ++i) {
    if (t.dtype == TensorDType::kF32) {
      std::memcpy(out.data() + 4 * i, &v[i], 4);
    } else {
      const uint16_t h =
          t.dtype == TensorDType::kBF16 ? F32ToBf16(v[i]) : F32ToF16(v[i]);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
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
  RETURN_IF_ERROR(WriteText(root / "config.json", config.ToJson()));
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
