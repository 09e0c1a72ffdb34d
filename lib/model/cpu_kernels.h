// CPU kernels of the forward pass, written for batch invariance
// (docs/architecture.md#batch-invariance): the arithmetic that produces any one output value is
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
#include "absl/status/statusor.h"
#include "absl/types/span.h"
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

// How a weight is held in memory: as the checkpoint stores it.
//   kF32, kBF16, kF16: the element type.
//   kFp8E4M3: FP8 E4M3 (bias 7, no infinities) with one f32 scale per
//     block_out x block_in block of the [out, in] matrix (the checkpoint's
//     `weight_scale_inv`, a multiplier: w = fp8 * scale).
enum class WeightFormat : uint8_t { kF32, kBF16, kF16, kFp8E4M3 };

// One stored [rows, K] row-major matrix (the HF [out_features,
// in_features] layout) as it lies in the checkpoint, or a run of rows of one.
struct WeightPart {
  WeightFormat format = WeightFormat::kF32;
  const void* data = nullptr;  // rows x K elements of `format`
  int64_t rows = 0;
  int64_t K = 0;
  // kFp8E4M3: the whole tensor's scales, [ceil(tensor rows / block_out)]
  // x [scale_cols = ceil(K / block_in)] f32, and where this part's rows
  // start in the tensor (a part may begin and end inside a scale block).
  const float* scale = nullptr;
  int64_t scale_cols = 0;
  int block_out = 0;
  int block_in = 0;
  int64_t row0 = 0;
};

// A weight prepared for MatMul: the [out, in] matrix transposed to [in,
// out] (K x N, row stride ld), so the GEMM micro-kernel streams contiguous
// output columns. The elements stay in their stored format (converted to
// f32 inside the kernel, 32 columns at a time); narrow formats pad each row
// to ld = N rounded up to 32 with zeros. FP8 keeps, per K block of
// block_in rows and per column, the column's scale times 256 (the E4M3 ->
// f16 bit trick leaves a factor 2^-8; 256 * scale is exact), so the
// dequantized weight fp8 * scale is rounded once, exactly as the PyTorch
// reference's float32 dequantisation.
struct PackedWeight {
  int64_t K = 0;  // in_features
  int64_t N = 0;  // out_features
  WeightFormat format = WeightFormat::kF32;
  int64_t ld = 0;  // row stride of the packed data, in elements
  std::vector<float> data;        // kF32: K x ld
  std::vector<uint16_t> data16;   // kBF16 / kF16 bits: K x ld
  std::vector<uint8_t> data8;     // kFp8E4M3 bits: K x ld
  std::vector<float> col_scale;   // kFp8E4M3: ceil(K / block_in) x ld
  int64_t block_in = 0;

  // From a row-major [N, K] (out x in) f32 matrix.
  static PackedWeight FromOutIn(const float* w, int64_t N, int64_t K);
  // The parts stacked along the output dimension (e.g. gate_proj then
  // up_proj, or the q/k/v rows of a fused qkv_proj), kept in their format.
  // InvalidArgument when the parts differ in format, K or FP8 block_in, or
  // an FP8 part's scales do not cover its rows.
  static absl::StatusOr<PackedWeight> Pack(absl::Span<const WeightPart> parts);
  // The output features `cols` (each in [0, N)), in that order, in this
  // weight's format (e.g. a narrow lm_head over part of the vocabulary):
  // column j of the result computes exactly what column cols[j] of this
  // one does.
  PackedWeight Columns(absl::Span<const int32_t> cols) const;
  // The same into *out, reusing its buffers' memory where they are large
  // enough (a head rebuilt again and again allocates once).
  void ColumnsInto(absl::Span<const int32_t> cols, PackedWeight* out) const;
  bool empty() const { return N == 0; }
  // Bytes held (weights and scales).
  size_t bytes() const;
  // The dequantized element w[k][n] (= the [out, in] matrix's [n][k]).
  float At(int64_t k, int64_t n) const;
};

// Element conversions used by the kernels (exact: every E4M3, BF16 and F16
// value is an f32).
float Fp8E4M3ToF32(uint8_t x);
// Round to nearest even E4M3, saturating at +-448 (NaN maps to 0x7F).
uint8_t F32ToFp8E4M3(float x);

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
