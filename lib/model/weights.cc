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
    scales.emplace_back(absl::StrCat(name, kScaleSuffix),
                        std::vector<int64_t>{
                            CeilDiv(shape[0], config.quant.block_out),
                            CeilDiv(shape[1], config.quant.block_in)});
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
  if (s == nullptr || s->dtype != TensorDType::kF32 || s->shape.size() != 2 ||
      bo <= 0 || bi <= 0 || s->shape[0] != CeilDiv(p.rows, bo) ||
      s->shape[1] != CeilDiv(p.K, bi)) {
    return absl::InvalidArgumentError(absl::StrCat(
        dir_, ": FP8 tensor \"", name, "\" needs F32 block scales \"",
        scale_name, "\" [", bo > 0 ? CeilDiv(p.rows, bo) : 0, ", ",
        bi > 0 ? CeilDiv(p.K, bi) : 0, "]"));
  }
  p.format = WeightFormat::kFp8E4M3;
  p.scale = reinterpret_cast<const float*>(s->data);
  p.scale_cols = s->shape[1];
  p.block_out = bo;
  p.block_in = bi;
  return p;
}

}  // namespace swaserve::model
