#include "lib/kv/kv_shape.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace swaserve::kv {

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 4;
    case DType::kBF16:
    case DType::kF16:
      return 2;
  }
  return 0;
}

absl::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kBF16:
      return "bf16";
    case DType::kF16:
      return "f16";
  }
  return "?";
}

absl::StatusOr<DType> ParseDType(absl::string_view name) {
  std::string n = absl::AsciiStrToLower(name);
  if (n == "f32" || n == "float32") return DType::kF32;
  if (n == "bf16" || n == "bfloat16") return DType::kBF16;
  if (n == "f16" || n == "float16") return DType::kF16;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype '", name, "' (expected f32, bf16 or f16)"));
}

absl::string_view PoolKindName(PoolKind kind) {
  return kind == PoolKind::kFull ? "full" : "swa";
}

size_t PoolGeometry::TokenLayerBytes() const {
  return static_cast<size_t>(num_kv_heads) * (k_head_dim + v_head_dim) *
         DTypeSize(dtype);
}

size_t PoolGeometry::KTokenStride() const {
  return static_cast<size_t>(num_kv_heads) * k_head_dim * DTypeSize(dtype);
}

size_t PoolGeometry::VTokenStride() const {
  return static_cast<size_t>(num_kv_heads) * v_head_dim * DTypeSize(dtype);
}

size_t PoolGeometry::KOffset(int layer) const {
  return static_cast<size_t>(layer) * page_size * TokenLayerBytes();
}

size_t PoolGeometry::VOffset(int layer) const {
  return KOffset(layer) + static_cast<size_t>(page_size) * KTokenStride();
}

absl::Status PoolGeometry::Validate() const {
  // A pool may hold no layers (a model without SWA layers has an empty SWA
  // pool); its geometry must still be well formed.
  if (num_layers < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        PoolKindName(kind), " pool: num_layers must be >= 0, got ", num_layers));
  }
  const std::pair<const char*, int> fields[] = {{"num_kv_heads", num_kv_heads},
                                                {"k_head_dim", k_head_dim},
                                                {"v_head_dim", v_head_dim},
                                                {"page_size", page_size}};
  for (const auto& [name, value] : fields) {
    if (value <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          PoolKindName(kind), " pool: ", name, " must be > 0, got ", value));
    }
  }
  return absl::OkStatus();
}

PoolGeometry KvShape::Full() const {
  return PoolGeometry{PoolKind::kFull, full_layers,     full_kv_heads,
                      full_k_head_dim, full_v_head_dim, dtype,
                      page_size};
}

PoolGeometry KvShape::Swa() const {
  return PoolGeometry{PoolKind::kSwa, swa_layers,     swa_kv_heads,
                      swa_k_head_dim, swa_v_head_dim, dtype,
                      page_size};
}

absl::Status KvShape::Validate() const {
  if (sliding_window <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("sliding_window must be > 0, got ", sliding_window));
  }
  if (full_layers + swa_layers <= 0) {
    return absl::InvalidArgumentError("the KV shape has no layers");
  }
  if (absl::Status s = Full().Validate(); !s.ok()) return s;
  return Swa().Validate();
}

KvShape KvShape::MiMoV25Pro() {
  KvShape s;
  s.full_layers = 10;
  s.full_kv_heads = 8;
  s.full_k_head_dim = 192;
  s.full_v_head_dim = 128;
  s.swa_layers = 60;
  s.swa_kv_heads = 8;
  s.swa_k_head_dim = 192;
  s.swa_v_head_dim = 128;
  s.sliding_window = 128;
  s.page_size = 16;
  s.dtype = DType::kBF16;
  return s;
}

absl::StatusOr<PoolSizes> SizePools(const KvShape& shape, int64_t byte_budget,
                                    double swa_full_token_ratio) {
  if (absl::Status s = shape.Validate(); !s.ok()) return s;
  if (byte_budget <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("byte budget must be > 0, got ", byte_budget));
  }
  if (!(swa_full_token_ratio > 0) || !std::isfinite(swa_full_token_ratio)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "swa/full token ratio must be > 0, got ", swa_full_token_ratio));
  }
  const double full_token = static_cast<double>(shape.Full().TokenBytes());
  const double swa_token = static_cast<double>(shape.Swa().TokenBytes());
  const double full_tokens =
      static_cast<double>(byte_budget) /
      (full_token + swa_full_token_ratio * swa_token);
  PoolSizes sizes;
  sizes.full_pages = static_cast<int64_t>(full_tokens / shape.page_size);
  sizes.swa_pages = static_cast<int64_t>(full_tokens * swa_full_token_ratio /
                                         shape.page_size);
  sizes.bytes = sizes.full_pages * static_cast<int64_t>(shape.Full().PageBytes()) +
                sizes.swa_pages * static_cast<int64_t>(shape.Swa().PageBytes());
  if (sizes.full_pages <= 0 || sizes.swa_pages <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "byte budget ", byte_budget, " is too small for one page of each pool (",
        shape.Full().PageBytes(), " + ", shape.Swa().PageBytes(), " bytes)"));
  }
  return sizes;
}

absl::StatusOr<int64_t> MinBudgetForFullTokens(const KvShape& shape, int64_t full_tokens,
                                               double swa_full_token_ratio, int64_t swa_tokens) {
  if (full_tokens < 1 || swa_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat("full_tokens must be >= 1 and swa_tokens >= 0, got ",
                                                   full_tokens, " and ", swa_tokens));
  }
  // A budget too small for one page of each pool is an error of SizePools
  // that more bytes cure; a bad shape or ratio is caught by the first call.
  if (absl::StatusOr<PoolSizes> probe = SizePools(shape, int64_t{1} << 40, swa_full_token_ratio);
      !probe.ok()) {
    return probe.status();
  }
  constexpr int64_t kMiB = int64_t{1} << 20;
  // SizePools' own formula solved for the budget, then corrected upwards in
  // whole MiB for its rounding down to pages (a step or two at most).
  const double per_token = static_cast<double>(shape.Full().TokenBytes()) +
                           swa_full_token_ratio * static_cast<double>(shape.Swa().TokenBytes());
  // The SWA pool holds ratio x the full pool's tokens: so many full tokens
  // give swa_tokens.
  const int64_t full_for_swa = static_cast<int64_t>(
      std::ceil(static_cast<double>(swa_tokens) / swa_full_token_ratio));
  const int64_t pages =
      (std::max(full_tokens, full_for_swa) + shape.page_size - 1) / shape.page_size;
  int64_t mib = std::max<int64_t>(
      1, static_cast<int64_t>(std::ceil(static_cast<double>(pages) * shape.page_size * per_token /
                                        static_cast<double>(kMiB))));
  for (int step = 0; step < 64; ++step, ++mib) {
    absl::StatusOr<PoolSizes> sizes = SizePools(shape, mib * kMiB, swa_full_token_ratio);
    if (sizes.ok() && sizes->full_pages * shape.page_size >= full_tokens &&
        sizes->swa_pages * shape.page_size >= swa_tokens) {
      return mib * kMiB;
    }
  }
  return absl::InternalError(absl::StrCat("no budget found for ", full_tokens, " tokens"));
}

}  // namespace swaserve::kv
