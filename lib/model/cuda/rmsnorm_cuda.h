// RMSNorm on a CUDA device:
//
//   y[r][i] = x[r][i] / sqrt(mean_j(x[r][j]^2) + eps) * weight[i]
//
// for a row-major [rows, hidden] input, f32 weight and f32 output. The input
// is f32 or bf16 (bf16 passed as its raw bit pattern, uint16_t, so that this
// header needs no CUDA headers; docs/architecture.md#conventions).
//
// Batch invariance (docs/architecture.md#batch-invariance): each row is reduced by one thread block
// whose size depends only on `hidden`, in a fixed order (per-thread strided
// sums, a fixed warp-shuffle tree, per-warp partials combined in warp order).
// A row's output is therefore bit-identical whatever `rows` is and wherever
// the row sits in the batch.
//
// Accuracy: sums of squares are accumulated in f32; against an exact
// reference the relative error is ~1e-6 for hidden up to several thousand.
// eps = 0 with an all-zero row yields NaN, as the formula does.
//
// Every function validates its arguments before touching the device and
// returns kInvalidArgument on a bad shape (rows < 0, hidden <= 0), a negative
// or non-finite eps, or a null pointer with rows > 0. rows == 0 is a no-op
// that returns OK without touching the device. CUDA failures are converted by
// CudaErrorToStatus (lib/model/cuda/cuda_device.h): no device or no usable
// driver -> kUnavailable. Functions use the calling thread's current device
// and are thread-safe (the CUDA runtime is).
#ifndef SWASERVE_LIB_MODEL_CUDA_RMSNORM_CUDA_H_
#define SWASERVE_LIB_MODEL_CUDA_RMSNORM_CUDA_H_

#include <cstdint>

#include "absl/status/status.h"

// The CUDA runtime's stream type (cudaStream_t is CUstream_st*), declared here
// so callers need no CUDA headers. nullptr means the legacy default stream.
struct CUstream_st;

namespace swaserve::model {

// Host-memory convenience: copies x and weight to the device, runs the
// kernel, copies y back and waits. Allocates and frees device memory on every
// call; meant for tests, tools and one-off use, not the serving hot path.
// x_host: rows*hidden, weight_host: hidden, y_host: rows*hidden elements.
absl::Status RmsNormCuda(const float* x_host, const float* weight_host,
                         float* y_host, int rows, int hidden, float eps);

// As RmsNormCuda, with a bf16 input given as raw bits (bf16 value = the f32
// whose upper 16 bits are these bits).
absl::Status RmsNormBf16Cuda(const uint16_t* x_bf16_host,
                             const float* weight_host, float* y_host, int rows,
                             int hidden, float eps);

// Device-memory launch: all pointers are device pointers. Enqueues the kernel
// on `stream` and returns without waiting; launch-configuration errors are
// reported here, faults during execution by the stream's next synchronizing
// call. Same results, bit for bit, as the host-memory functions.
absl::Status LaunchRmsNormCuda(const float* x_device,
                               const float* weight_device, float* y_device,
                               int rows, int hidden, float eps,
                               CUstream_st* stream);
absl::Status LaunchRmsNormBf16Cuda(const uint16_t* x_bf16_device,
                                   const float* weight_device, float* y_device,
                                   int rows, int hidden, float eps,
                                   CUstream_st* stream);

}  // namespace swaserve::model

#endif  // SWASERVE_LIB_MODEL_CUDA_RMSNORM_CUDA_H_
