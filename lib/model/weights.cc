// Quantized and narrow weights in checkpoints (checkpoint.h): which tensors
// an FP8 checkpoint quantizes, their block scales, the dtype rules of
// Checkpoint::Open, and Checkpoint::Weight (a stored weight for
// PackedWeight::Pack).
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "lib/model/checkpoint.h"

namespace swaserve::model {
namespace {

constexpr absl::string_view kWeight = ".weight";
constexpr absl::string_view kScaleSuffix = "_scale_inv";

absl::string_view ModuleOf(absl::string_view weight_name) {
  return absl::EndsWith(weight_name, kWeight)
             ? weight_name.substr(0, weight_name.size() - kWeight.size())
             : weight_name;
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

bool IsQuantizableProjection(absl::string_view name) {
  if (!absl::EndsWith(name, kWeight)) return false;
  const absl::string_view module = ModuleOf(name);
  const size_t dot = module.rfind('.');
  const absl::string_view leaf =
      dot == absl::string_view::npos ? module : module.substr(dot + 1);
  for (absl::string_view p : {"q_proj", "k_proj", "v_proj", "qkv_proj",
                              "o_proj", "gate_proj", "up_proj", "down_proj",
                              "eh_proj"}) {
    if (leaf == p) return true;
  }
  return false;
}

bool IsSkippedTensor(absl::string_view name) {
  absl::string_view n = name;
  if (absl::StartsWith(n, "model.")) n.remove_prefix(6);
  for (absl::string_view p : {"visual.", "vision_tower.", "audio.", "audio_encoder.",
                              "audio_tower."}) {
    if (absl::StartsWith(n, p)) return true;
  }
  return false;
}

QkvGroupRows FusedQkvGroupRows(const ModelConfig& config, const AttentionConfig& a) {
  const int g = config.qkv_groups();
  QkvGroupRows r;
  r.q = static_cast<int64_t>(a.num_heads / g) * a.head_dim;
  r.k = static_cast<int64_t>(a.num_kv_heads / g) * a.head_dim;
  r.v = static_cast<int64_t>(a.num_kv_heads / g) * a.v_head_dim;
  return r;
}

bool ExpectFp8(const ModelConfig& config, absl::string_view name) {
  return config.quant.fp8 && IsQuantizableProjection(name) &&
         config.quant.Quantized(ModuleOf(name));
}

bool IsScaleTensor(absl::string_view name) {
  return absl::EndsWith(name, absl::StrCat(kWeight, kScaleSuffix));
}

void AddScaleTensors(const ModelConfig& config,
                     std::map<std::string, std::vector<int64_t>>* expected) {
  if (!config.quant.fp8) return;
  std::vector<std::pair<std::string, std::vector<int64_t>>> scales;
  for (const auto& [name, shape] : *expected) {
    if (!ExpectFp8(config, name) || shape.size() != 2) continue;
    int64_t rows = CeilDiv(shape[0], config.quant.block_out);
    if (absl::EndsWith(name, ".self_attn.qkv_proj.weight")) {
      const int64_t g = config.qkv_groups();
      rows = g * CeilDiv(shape[0] / g, config.quant.block_out);
    }
    scales.emplace_back(absl::StrCat(name, kScaleSuffix),
                        std::vector<int64_t>{rows, CeilDiv(shape[1], config.quant.block_in)});
  }
  for (auto& [name, shape] : scales) (*expected)[name] = std::move(shape);
}

std::string DTypeProblem(const ModelConfig& config, absl::string_view name,
                         const TensorInfo& t) {
  if (IsScaleTensor(name)) {
    return t.dtype == TensorDType::kF32
               ? ""
               : absl::StrCat("is ", t.dtype_name,
                              ", but FP8 block scales must be F32");
  }
  if (ExpectFp8(config, name)) {
    return t.dtype == TensorDType::kF8E4M3
               ? ""
               : absl::StrCat("is ", t.dtype_name,
                              ", but quantization_config makes it F8_E4M3 "
                              "(list the module in ignored_layers to keep it "
                              "unquantized)");
  }
  switch (t.dtype) {
    case TensorDType::kF32:
    case TensorDType::kBF16:
    case TensorDType::kF16:
      return "";
    case TensorDType::kF8E4M3:
      if (!config.quant.fp8) {
        return "is F8_E4M3, but config.json has no FP8 quantization_config";
      }
      return IsQuantizableProjection(name)
                 ? "is F8_E4M3, but quantization_config.ignored_layers "
                   "lists its module (stored unquantized)"
                 : "is F8_E4M3, but only linear projections are quantized "
                   "(embeddings, lm_head, the MoE router, norms and sinks "
                   "stay in torch_dtype)";
    case TensorDType::kOther:
      break;
  }
  return absl::StrCat("has unsupported dtype \"", t.dtype_name,
                      "\" (expected F32, BF16, F16, or F8_E4M3 for quantized "
                      "projections)");
}

absl::StatusOr<WeightPart> Checkpoint::Weight(absl::string_view name) const {
  const TensorInfo* t = Find(name);
  if (t == nullptr || t->shape.size() != 2) {
    return absl::NotFoundError(
        absl::StrCat(dir_, ": no 2-D tensor \"", name, "\""));
  }
  WeightPart p;
  p.data = t->data;
  p.rows = t->shape[0];
  p.K = t->shape[1];
  switch (t->dtype) {
    case TensorDType::kF32:
      p.format = WeightFormat::kF32;
      return p;
    case TensorDType::kBF16:
      p.format = WeightFormat::kBF16;
      return p;
    case TensorDType::kF16:
      p.format = WeightFormat::kF16;
      return p;
    case TensorDType::kF8E4M3:
      break;
    case TensorDType::kOther:
      return absl::InvalidArgumentError(
          absl::StrCat(dir_, ": tensor \"", name, "\" has dtype ",
                       t->dtype_name));
  }
  const std::string scale_name = absl::StrCat(name, kScaleSuffix);
  const TensorInfo* s = Find(scale_name);
  const int bo = config_.quant.block_out, bi = config_.quant.block_in;
  const int64_t groups =
      absl::EndsWith(name, ".self_attn.qkv_proj.weight") ? config_.qkv_groups() : 1;
  const int64_t want_rows = bo > 0 ? groups * CeilDiv(p.rows / groups, bo) : 0;
  if (s == nullptr || s->dtype != TensorDType::kF32 || s->shape.size() != 2 ||
      bo <= 0 || bi <= 0 || s->shape[0] != want_rows || s->shape[1] != CeilDiv(p.K, bi)) {
    return absl::InvalidArgumentError(absl::StrCat(
        dir_, ": FP8 tensor \"", name, "\" needs F32 block scales \"",
        scale_name, "\" [", want_rows, ", ",
        bi > 0 ? CeilDiv(p.K, bi) : 0, "]"));
  }
  p.format = WeightFormat::kFp8E4M3;
  p.scale = reinterpret_cast<const float*>(s->data);
  p.scale_cols = s->shape[1];
  p.block_out = bo;
  p.block_in = bi;
  return p;
}

absl::StatusOr<FusedQkvParts> SplitFusedQkv(const ModelConfig& config,
                                            const AttentionConfig& a,
                                            const WeightPart& fused) {
  const QkvGroupRows r = FusedQkvGroupRows(config, a);
  const int64_t g = config.qkv_groups();
  if (fused.rows != g * r.total()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fused qkv_proj has ", fused.rows, " rows; the layout (", g,
        " groups of q ", r.q, " + k ", r.k, " + v ", r.v, " rows) needs ",
        g * r.total()));
  }
  const size_t esize = fused.format == WeightFormat::kF32    ? 4
                       : fused.format == WeightFormat::kFp8E4M3 ? 1
                                                              : 2;
  const bool fp8 = fused.format == WeightFormat::kFp8E4M3;
  const int64_t group_scale_rows = fp8 ? CeilDiv(r.total(), fused.block_out) : 0;
  FusedQkvParts out;
  const int64_t offsets[3] = {0, r.q, r.q + r.k};
  const int64_t counts[3] = {r.q, r.k, r.v};
  std::vector<WeightPart>* dst[3] = {&out.q, &out.k, &out.v};
  for (int64_t grp = 0; grp < g; ++grp) {
    for (int i = 0; i < 3; ++i) {
      WeightPart p = fused;
      p.rows = counts[i];
      p.data = static_cast<const uint8_t*>(fused.data) +
               static_cast<size_t>(grp * r.total() + offsets[i]) * fused.K * esize;
      if (fp8) {
        // Each group's scales start on a block boundary of their own.
        p.scale = fused.scale + grp * group_scale_rows * fused.scale_cols;
        p.row0 = offsets[i];
      }
      dst[i]->push_back(p);
    }
  }
  return out;
}

}  // namespace swaserve::model
