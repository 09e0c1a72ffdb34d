// CUDA device discovery and cudaError_t -> absl::Status conversion for
// swaserve::model_cuda. Both live in lib/cuda/cuda_status.h
// (swaserve::cuda_status, shared with lib/transfer/cuda); this header makes
// them available under swaserve::model as before.
//
// This header includes no CUDA headers (docs/architecture.md#conventions), so any target may
// include it; only targets that link swaserve::model_cuda (built when
// SWASERVE_HAVE_CUDA) can call it. All functions are thread-safe.
#ifndef SWASERVE_LIB_MODEL_CUDA_CUDA_DEVICE_H_
#define SWASERVE_LIB_MODEL_CUDA_CUDA_DEVICE_H_

#include "lib/cuda/cuda_status.h"

namespace swaserve::model {

// absl::Status CudaErrorToStatus(int cuda_error, std::string_view context):
// "<context>: <cudaGetErrorName>: <cudaGetErrorString>", cudaSuccess -> OK;
// the code mapping is documented in lib/cuda/cuda_status.h.
using ::swaserve::cuda::CudaErrorToStatus;

// absl::StatusOr<int> CudaDeviceCount(): number of CUDA devices visible to
// this process (honours CUDA_VISIBLE_DEVICES). kUnavailable, with the CUDA
// runtime's reason, when there is no device or no usable driver; never 0.
using ::swaserve::cuda::CudaDeviceCount;

// True when at least one CUDA device can be used.
inline bool CudaAvailable() { return ::swaserve::cuda::CudaDeviceAvailable(); }

}  // namespace swaserve::model

#endif  // SWASERVE_LIB_MODEL_CUDA_CUDA_DEVICE_H_
