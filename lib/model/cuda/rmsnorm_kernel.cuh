// Internal to swaserve::model_cuda: raw launchers for the RMSNorm kernels in
// rmsnorm_kernel.cu. Includes CUDA headers, so never include it from a public
// header; use lib/model/cuda/rmsnorm_cuda.h instead.
#ifndef SWASERVE_LIB_MODEL_CUDA_RMSNORM_KERNEL_CUH_
#define SWASERVE_LIB_MODEL_CUDA_RMSNORM_KERNEL_CUH_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace swaserve::model::internal {

// Threads per block for a row of `hidden` elements: about four elements per
// thread, a multiple of 32 in [32, 1024]. Depends on `hidden` only, never on
// the number of rows (batch invariance).
int RmsNormThreadsPerBlock(int hidden);

// Enqueue one block per row on `stream`. Arguments must already be validated
// (rows > 0, hidden > 0, non-null device pointers). Returns the launch error.
cudaError_t LaunchRmsNormKernelF32(const float* x, const float* weight,
                                   float* y, int rows, int hidden, float eps,
                                   cudaStream_t stream);
cudaError_t LaunchRmsNormKernelBf16(const uint16_t* x, const float* weight,
                                    float* y, int rows, int hidden, float eps,
                                    cudaStream_t stream);

}  // namespace swaserve::model::internal

#endif  // SWASERVE_LIB_MODEL_CUDA_RMSNORM_KERNEL_CUH_
