// Geometry of the KV cache: element types, per-pool page layout, and the
// model-level shape (how many full and SWA layers, window, page size).
//
// Page layout (docs/architecture.md#kv-cache, and KvPoolLayout in common.proto): a page holds
// `page_size` tokens for every layer of its pool, page-first, one contiguous
// blob: [layer][K|V][token][kv_head][dim]. So layer l's K block of a page
// starts at KOffset(l) and is page_size × kv_heads × k_head_dim elements,
// followed by its V block (page_size × kv_heads × v_head_dim).
//
// Plain value types; thread-compatible.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace swaserve::kv {

enum class DType : uint8_t { kF32, kBF16, kF16 };

// Bytes per element.
size_t DTypeSize(DType dtype);
absl::string_view DTypeName(DType dtype);
// "f32"/"float32", "bf16"/"bfloat16", "f16"/"float16"; InvalidArgument otherwise.
absl::StatusOr<DType> ParseDType(absl::string_view name);

enum class PoolKind : uint8_t { kFull, kSwa };
absl::string_view PoolKindName(PoolKind kind);  // "full" / "swa"

// Index of a page within its pool.
using PageId = int32_t;
inline constexpr PageId kNoPage = -1;

// The geometry of one pool's pages.
struct PoolGeometry {
  PoolKind kind = PoolKind::kFull;
  int num_layers = 0;    // layers whose KV lives in this pool
  int num_kv_heads = 0;
  int k_head_dim = 0;    // Q/K head dim (192 in MiMo-V2.5-Pro)
  int v_head_dim = 0;    // V head dim (128 in MiMo-V2.5-Pro)
  DType dtype = DType::kBF16;
  int page_size = 16;    // tokens per page

  // Bytes of K+V of one token in one layer.
  size_t TokenLayerBytes() const;
  // Bytes of K+V of one token across all layers of the pool.
  size_t TokenBytes() const { return TokenLayerBytes() * num_layers; }
  // Bytes of one page (all layers, K and V).
  size_t PageBytes() const { return TokenBytes() * page_size; }
  // Offsets of layer `layer`'s K and V blocks within a page.
  size_t KOffset(int layer) const;
  size_t VOffset(int layer) const;
  // Bytes between consecutive tokens inside a K (or V) block.
  size_t KTokenStride() const;
  size_t VTokenStride() const;

  // InvalidArgument naming the field when a count is not positive.
  absl::Status Validate() const;
};

// The KV shape of a model: what lib/kv needs to know of docs/architecture.md#model.
struct KvShape {
  // Full-attention layers (their KV is kept for every token).
  int full_layers = 0;
  int full_kv_heads = 0;
  int full_k_head_dim = 0;
  int full_v_head_dim = 0;
  // SWA layers plus MTP layers (their KV is kept for the last window only).
  int swa_layers = 0;
  int swa_kv_heads = 0;
  int swa_k_head_dim = 0;
  int swa_v_head_dim = 0;
  // W: a query sees W keys including itself.
  int sliding_window = 128;
  int page_size = 16;
  DType dtype = DType::kBF16;

  PoolGeometry Full() const;
  PoolGeometry Swa() const;
  absl::Status Validate() const;

  // The MiMo-V2.5-Pro shape (70 layers = 10 full + 60 SWA, W = 128, 8 KV
  // heads, K 192 / V 128, bf16), used for capacity figures.
  static KvShape MiMoV25Pro();
};

// How many tokens each pool holds for a byte budget, SGLang's rule: with
// F = full token bytes and S = SWA token bytes, swa_tokens = ratio ×
// full_tokens and full_tokens × F + swa_tokens × S = budget. Both rounded
// down to whole pages.
struct PoolSizes {
  int64_t full_pages = 0;
  int64_t swa_pages = 0;
  int64_t bytes = 0;  // bytes the pages take
};
absl::StatusOr<PoolSizes> SizePools(const KvShape& shape, int64_t byte_budget,
                                    double swa_full_token_ratio);

// The inverse of SizePools: the smallest whole-MiB byte budget whose full
// pool holds at least `full_tokens` tokens and whose SWA pool at least
// `swa_tokens` at `swa_full_token_ratio` (so SizePools(shape, result,
// ratio)->full_pages * page_size >= full_tokens, likewise swa_pages). What a
// worker's --kv.*_mib must be for one prompt of `full_tokens` tokens to fit
// while a step's SWA working set (`swa_tokens`) does. InvalidArgument for
// full_tokens < 1, swa_tokens < 0 or SizePools' errors.
absl::StatusOr<int64_t> MinBudgetForFullTokens(const KvShape& shape, int64_t full_tokens,
                                               double swa_full_token_ratio,
                                               int64_t swa_tokens = 0);

}  // namespace swaserve::kv
