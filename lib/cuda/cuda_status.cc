#include "lib/cuda/cuda_status.h"

#include <cuda_runtime_api.h>

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace swaserve::cuda {

absl::Status CudaErrorToStatus(int cuda_error, std::string_view context) {
  const auto error = static_cast<cudaError_t>(cuda_error);
  if (error == cudaSuccess) return absl::OkStatus();
  std::string message(context);
  message += ": ";
  message += cudaGetErrorName(error);
  message += ": ";
  message += cudaGetErrorString(error);
  switch (error) {
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorCallRequiresNewerDriver:
    case cudaErrorStubLibrary:
    case cudaErrorDevicesUnavailable:
    case cudaErrorSystemNotReady:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
    case cudaErrorInitializationError:
      return absl::UnavailableError(message);
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorUnsupportedPtxVersion:
      return absl::FailedPreconditionError(
          message +
          " (rebuild with -DCMAKE_CUDA_ARCHITECTURES=<this GPU's sm>)");
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(message);
    case cudaErrorInvalidValue:
    case cudaErrorInvalidConfiguration:
    case cudaErrorInvalidDevice:
      return absl::InvalidArgumentError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::StatusOr<int> CudaDeviceCount() {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    // Initialization errors are sticky in the runtime; clear the per-thread
    // last error so a later, unrelated check does not report it again.
    cudaGetLastError();
    return CudaErrorToStatus(error, "cudaGetDeviceCount");
  }
  if (count <= 0) {
    return CudaErrorToStatus(cudaErrorNoDevice, "cudaGetDeviceCount");
  }
  return count;
}

bool CudaDeviceAvailable() { return CudaDeviceCount().ok(); }

}  // namespace swaserve::cuda
