// CPU kernels of the forward pass, written for batch invariance
// (ARCHITECTURE §4): the arithmetic that produces any one output value is
// the same sequence of operations whatever the batch size, the chunking or
// the row's position in the batch. So greedy outputs do not change between
// monolithic and disaggregated runs, chunk sizes or batch mixes.
//
// How: a GEMM output element is one accumulator lane that sums x[m,k]·w[k,n]
// for k = 0..K-1 in order with fused multiply-adds (weights are packed
// [in, out] so 16 output columns share a vector). Register blocking (rows ×
// 32 columns) and the thread split only decide which elements are computed
// together, never the order of any element's sum; there is no GEMV special
// case. Other dot products (attention scores, RMSNorm) run over k in 16-lane
// vector steps (the tail masked) and reduce the lanes in one fixed order.
//
// An AVX-512 path is used when the CPU has it; otherwise a portable path with
// the same lane structure (slower; results may differ from the AVX-512 path
// in the last bits, but a given machine always takes the same path).
//
// Thread-safe: kernels keep no state; parallel kernels use KernelThreads.
#pragma once

#include <cstdint>
#include <functional>

#include "absl/functional/function_ref.h"
#include <memory>
#include <thread>
#include <vector>

namespace swaserve::model {

// A fixed set of worker threads for data-parallel kernels. ParallelFor runs
// fn(begin, end) over [0, n) split into at most threads() contiguous chunks
// aligned to `grain`, the calling thread taking the first chunk. Calls from
// several threads at once are serialised.
class KernelThreads {
 public:
  // The process-wide pool; sized by SetThreads (default: all cores).
  static KernelThreads& Get();
  static void SetThreads(int n);
  int threads() const;
  // fn must stay valid for the call (it is not copied: no allocation).
  void ParallelFor(int64_t n, int64_t grain,
                   absl::FunctionRef<void(int64_t, int64_t)> fn);

  struct Impl;
  explicit KernelThreads(int n);
  ~KernelThreads();

 private:
  std::unique_ptr<Impl> impl_;
};

// Fixed-order dot product of a and b (n floats).
float Dot(const float* a, const float* b, int64_t n);

// A weight prepared for MatMul: the Hugging Face [out_features,
// in_features] matrix transposed to [in, out] (K×N, row-major), so the GEMM
// micro-kernel streams contiguous output columns.
struct PackedWeight {
  int64_t K = 0;  // in_features
  int64_t N = 0;  // out_features
  std::vector<float> data;  // K×N
  // From a row-major [N, K] (out × in) matrix.
  static PackedWeight FromOutIn(const float* w, int64_t N, int64_t K);
  bool empty() const { return data.empty(); }
};

// y[m*ldy + n] = sum_k x[m*K + k] * w[k][n] for m < M, n < N, accumulated in
// k order with fused multiply-adds (each output element's arithmetic is the
// same whatever M, its row, or the thread split). Multithreaded over N.
void MatMul(const float* x, int64_t M, const PackedWeight& w, float* y,
            int64_t ldy);
inline void MatMul(const float* x, int64_t M, const PackedWeight& w, float* y) {
  MatMul(x, M, w, y, w.N);
}

// The same product with an unpacked [N, K] weight (packs on every call: for
// tests and benchmarks, not for the forward pass).
void MatMulNT(const float* x, int64_t M, int64_t K, const float* w, int64_t N,
              float* y);

// y = x / sqrt(mean(x^2) + eps) * weight, per row of `dim`.
void RmsNorm(const float* x, const float* weight, float* y, int64_t rows,
             int64_t dim, float eps);

// NeoX-style rotary embedding on the first rot_dim dims of each of `heads`
// heads (vec is heads × head_dim): pairs (i, i + rot_dim/2).
void ApplyRope(float* vec, int heads, int head_dim, int rot_dim, int64_t pos,
               double theta);

// y += a * x.
void Axpy(float a, const float* x, float* y, int64_t n);

float Silu(float x);

// Whether the AVX-512 path is in use (for benchmarks' reports).
bool UsingAvx512();

}  // namespace swaserve::model
