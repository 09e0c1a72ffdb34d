// Paged GQA attention over a sequence's KV pages (docs/architecture.md#model, #kv-cache), for
// prefill chunks, decode steps and speculative verification alike.
//
// Batch invariance (docs/architecture.md#batch-invariance): the arithmetic that produces one
// (query, head) output depends only on that query's position, its own key
// range and the KV values — never on which other queries share the call, a
// chunk or a vector. How the AVX-512 kernel keeps that while running at
// matrix speed:
//   - SIMD lanes hold (query, head) pairs that share a KV head (a "tile" of
//     16), so every reduction is vertical: a lane's score is a fused
//     multiply-add chain over the head dim in order; its softmax statistics
//     and output are updated key by key in position order.
//   - Keys are visited in blocks aligned to absolute positions (kKeyBlock);
//     online softmax rescales once per block. A block holding no key of a
//     lane's range leaves that lane bit-for-bit unchanged (its max stays,
//     the correction is exp(0) = 1, masked lanes add nothing), so the keys a
//     tile's *other* lanes need cost that lane nothing but time.
//   - exp is one fixed polynomial (no libm lane-dependent paths).
//   - A task computes up to three tiles of one span and KV head together
//     (48 lanes): each key row is read, widened and broadcast once for all
//     of them, and the next block's rows are prefetched. Every lane's
//     arithmetic is the one-tile kernel's, bit for bit, so how many tiles a
//     task takes is a speed choice only (long prefill chunks: 3; decode
//     steps and short sliding windows: 1).
// A sliding-window layer reads only keys [pos − W + 1, pos] of each query's
// tile range: nothing outside the union of the tile's windows is touched.
//
// Without AVX-512 a portable kernel (one (query, head) at a time, keys in
// order) is used; it is batch-invariant too but differs from the AVX-512
// path in the last bits (a given machine always takes the same path).
#pragma once

#include "absl/types/span.h"
#include "lib/kv/sequence.h"

namespace swaserve::model {

struct AttentionParams {
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;    // query/key head dim
  int v_head_dim = 0;  // value head dim
  float scale = 1.0f;  // applied to q·k
  // 0: full causal attention; otherwise keys [pos − window + 1, pos].
  int window = 0;
  // Per-head sink logits (num_heads floats) added to the softmax
  // denominator, or null.
  const float* sinks = nullptr;
};

// A run of consecutive query rows of one sequence: rows [row0, row0 + n) of
// q/out hold positions [pos0, pos0 + n). The positions' KV must already be
// written into `view`'s pages.
struct AttentionSpan {
  kv::LayerView view;
  int row0 = 0;
  int pos0 = 0;
  int n = 0;
  // Keys before this position are not read (a window restore's stretch
  // starts here: no KV exists before it). 0: all keys of the causal range.
  int first_key = 0;
};

// out[row][head][0..v_head_dim) = softmax(q·K^T · scale (+ sink)) · V for
// every row of every span. q is [rows][num_heads][head_dim] and out
// [rows][num_heads][v_head_dim], both row-major f32. KV may be f32, bf16 or
// f16 (the pool's dtype). Multithreaded over KernelThreads; allocation-free
// once scratch has grown to the largest call seen.
void PagedAttention(const AttentionParams& params,
                    absl::Span<const AttentionSpan> spans, const float* q,
                    float* out);

// Keys per block of the AVX-512 kernel (fixed: it is part of the numerics).
inline constexpr int kAttentionKeyBlock = 32;

}  // namespace swaserve::model
