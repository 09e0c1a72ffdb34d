// cudaError_t -> absl::Status, and the CUDA device probe: the one place for
// both, used by swaserve::model_cuda (lib/model/cuda) and
// swaserve::transfer_cuda (lib/transfer/cuda).
//
// Library swaserve::cuda_status, built only when SWASERVE_HAVE_CUDA. This
// header includes no CUDA headers (docs/architecture.md#conventions), so any target may
// include it; only targets that link swaserve::cuda_status can call it. All
// functions are stateless and thread-safe.
#pragma once

#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace swaserve::cuda {

// Converts a cudaError_t value (passed as int so that this header needs no
// CUDA headers) into an absl::Status whose message is
// "<context>: <cudaGetErrorName>: <cudaGetErrorString>". cudaSuccess -> OK.
//
//   no device, no/too old/mismatched driver, stub library, devices busy or
//   prohibited, driver not ready, initialization error  -> kUnavailable
//   binary built for other GPU architectures / newer PTX -> kFailedPrecondition
//                                   (the message names
//                                   CMAKE_CUDA_ARCHITECTURES)
//   out of device memory                                 -> kResourceExhausted
//   invalid value / configuration / device ordinal       -> kInvalidArgument
//   anything else (kernel faults, launch failures, ...)  -> kInternal
absl::Status CudaErrorToStatus(int cuda_error, std::string_view context);

// Number of CUDA devices visible to this process (honours
// CUDA_VISIBLE_DEVICES). kUnavailable, with the CUDA runtime's reason, when
// there is no device or no usable driver; never returns 0. Clears the
// runtime's per-thread last error on failure, so a later, unrelated check
// does not report it again.
absl::StatusOr<int> CudaDeviceCount();

// True when at least one CUDA device can be used (CudaDeviceCount() is OK).
bool CudaDeviceAvailable();

}  // namespace swaserve::cuda
