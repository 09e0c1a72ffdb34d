// RMSNorm kernels: one thread block per row, batch-invariant reduction.
//
// Reduction order for a row (fixed for a given `hidden`, independent of the
// number of rows and of the row's index):
//   1. thread t accumulates x[t], x[t + T], x[t + 2T], ... in that order
//      (T = RmsNormThreadsPerBlock(hidden)), with fused multiply-adds;
//   2. each warp combines its 32 partials with a xor-shuffle butterfly
//      (offsets 16, 8, 4, 2, 1);
//   3. warp 0 combines the per-warp sums, stored in shared memory in warp
//      order, with the same butterfly.
// No atomics, no dependence on scheduling.
#include <cuda_runtime.h>

#include <cstdint>

#include "lib/model/cuda/rmsnorm_kernel.cuh"

namespace swaserve::model::internal {
namespace {

constexpr int kWarpSize = 32;
constexpr int kMaxThreads = 1024;
constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ float LoadAsFloat(const float* p) { return *p; }

// bf16 -> f32 is exact: the bf16 bits are the upper half of the f32.
__device__ __forceinline__ float LoadAsFloat(const uint16_t* p) {
  return __uint_as_float(static_cast<unsigned>(*p) << 16);
}

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset >>= 1) {
    v += __shfl_xor_sync(kFullMask, v, offset);
  }
  return v;
}

template <typename T>
__global__ void __launch_bounds__(kMaxThreads)
    RmsNormKernel(const T* __restrict__ x, const float* __restrict__ weight,
                  float* __restrict__ y, int hidden, float eps) {
  __shared__ float warp_sums[kMaxThreads / kWarpSize];
  __shared__ float inv_rms;

  const int64_t row_offset = static_cast<int64_t>(blockIdx.x) * hidden;
  const T* __restrict__ x_row = x + row_offset;
  float* __restrict__ y_row = y + row_offset;
  const int tid = static_cast<int>(threadIdx.x);
  const int threads = static_cast<int>(blockDim.x);
  const int lane = tid % kWarpSize;
  const int warp = tid / kWarpSize;
  const int num_warps = threads / kWarpSize;

  float sum = 0.0f;
  for (int i = tid; i < hidden; i += threads) {
    const float v = LoadAsFloat(x_row + i);
    sum = __fmaf_rn(v, v, sum);
  }
  sum = WarpSum(sum);
  if (lane == 0) warp_sums[warp] = sum;
  __syncthreads();
  if (warp == 0) {
    float total = lane < num_warps ? warp_sums[lane] : 0.0f;
    total = WarpSum(total);
    if (lane == 0) {
      // IEEE-rounded division and square root (no fast-math), so the scale is
      // a deterministic function of the row's sum of squares.
      const float mean_square = __fdiv_rn(total, static_cast<float>(hidden));
      inv_rms = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean_square, eps)));
    }
  }
  __syncthreads();
  const float scale = inv_rms;
  for (int i = tid; i < hidden; i += threads) {
    y_row[i] = __fmul_rn(__fmul_rn(LoadAsFloat(x_row + i), scale), weight[i]);
  }
}

template <typename T>
cudaError_t Launch(const T* x, const float* weight, float* y, int rows,
                   int hidden, float eps, cudaStream_t stream) {
  const int threads = RmsNormThreadsPerBlock(hidden);
  RmsNormKernel<T><<<static_cast<unsigned>(rows), threads, 0, stream>>>(
      x, weight, y, hidden, eps);
  return cudaGetLastError();
}

}  // namespace

int RmsNormThreadsPerBlock(int hidden) {
  constexpr int64_t kPerThread = 4;
  const int64_t wanted =
      (static_cast<int64_t>(hidden) + kPerThread - 1) / kPerThread;
  int64_t threads = (wanted + kWarpSize - 1) / kWarpSize * kWarpSize;
  if (threads < kWarpSize) threads = kWarpSize;
  if (threads > kMaxThreads) threads = kMaxThreads;
  return static_cast<int>(threads);
}

cudaError_t LaunchRmsNormKernelF32(const float* x, const float* weight,
                                   float* y, int rows, int hidden, float eps,
                                   cudaStream_t stream) {
  return Launch(x, weight, y, rows, hidden, eps, stream);
}

cudaError_t LaunchRmsNormKernelBf16(const uint16_t* x, const float* weight,
                                    float* y, int rows, int hidden, float eps,
                                    cudaStream_t stream) {
  return Launch(x, weight, y, rows, hidden, eps, stream);
}

}  // namespace swaserve::model::internal
