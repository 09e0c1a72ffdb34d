// CUDA device discovery and cudaError_t -> absl::Status conversion for
// swaserve::model_cuda.
//
// This header includes no CUDA headers (ARCHITECTURE §7), so any target may
// include it; only targets that link swaserve::model_cuda (built when
// SWASERVE_HAVE_CUDA) can call it. All functions are thread-safe.
#ifndef SWASERVE_LIB_MODEL_CUDA_CUDA_DEVICE_H_
#define SWASERVE_LIB_MODEL_CUDA_CUDA_DEVICE_H_

#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace swaserve::model {

// Converts a cudaError_t value (passed as int so that this header needs no
// CUDA headers) into an absl::Status whose message is
// "<context>: <cudaGetErrorName>: <cudaGetErrorString>". cudaSuccess -> OK.
//
//   no device, no/too old/mismatched driver, stub library, devices busy or
//   prohibited, driver not ready, initialization error  -> kUnavailable
//   binary built for other GPU architectures / newer PTX -> kFailedPrecondition
//   out of device memory                                 -> kResourceExhausted
//   invalid value / configuration / device ordinal       -> kInvalidArgument
//   anything else (kernel faults, launch failures, ...)  -> kInternal
absl::Status CudaErrorToStatus(int cuda_error, std::string_view context);

// Number of CUDA devices visible to this process (honours
// CUDA_VISIBLE_DEVICES). kUnavailable, with the CUDA runtime's reason, when
// there is no device or no usable driver; never returns 0.
absl::StatusOr<int> CudaDeviceCount();

// True when at least one CUDA device can be used.
bool CudaAvailable();

}  // namespace swaserve::model

#endif  // SWASERVE_LIB_MODEL_CUDA_CUDA_DEVICE_H_
