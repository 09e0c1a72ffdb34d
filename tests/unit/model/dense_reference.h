// An independent, deliberately naive dense implementation of the model's
// forward pass for tests: contiguous per-layer KV (no pages), plain loops,
// double-precision accumulation, written from docs/architecture.md#model without
// sharing code with lib/model/forward.cc (it reads weights through
// Checkpoint only).
#pragma once

#include <cstdint>
#include <vector>

#include "lib/model/checkpoint.h"

namespace swaserve::model::testing {

struct DenseResult {
  std::vector<std::vector<float>> logits;  // one row per position
  std::vector<std::vector<float>> hidden;  // last-layer hidden (pre final norm)
};

// Runs every position of `tokens` through the main model.
DenseResult DenseForward(const Checkpoint& ckpt, const std::vector<uint32_t>& tokens);

// MTP layer k (chained, DeepSeek-V3 style) over positions 0..n-2-k:
// position p combines token tokens[p + 1 + k] with hidden[p] (the main
// model's hidden for k = 0, MTP layer k-1's output otherwise), is rotated at
// position p, and its logits predict tokens[p + 2 + k]. Row p of the result
// is position p.
DenseResult DenseMtp(const Checkpoint& ckpt, int k, const std::vector<uint32_t>& tokens,
                     const std::vector<std::vector<float>>& hidden);

}  // namespace swaserve::model::testing
