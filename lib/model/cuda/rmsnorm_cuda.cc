#include "lib/model/cuda/rmsnorm_cuda.h"

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "lib/model/cuda/cuda_device.h"
#include "lib/model/cuda/rmsnorm_kernel.cuh"

namespace swaserve::model {
namespace {

absl::Status ValidateArgs(std::string_view fn, const void* x,
                          const float* weight, const float* y, int rows,
                          int hidden, float eps) {
  std::string prefix(fn);
  prefix += ": ";
  if (rows < 0) {
    return absl::InvalidArgumentError(prefix + "rows must be >= 0, got " +
                                      std::to_string(rows));
  }
  if (hidden <= 0) {
    return absl::InvalidArgumentError(prefix + "hidden must be > 0, got " +
                                      std::to_string(hidden));
  }
  if (!std::isfinite(eps) || eps < 0.0f) {
    return absl::InvalidArgumentError(
        prefix + "eps must be finite and >= 0, got " + std::to_string(eps));
  }
  if (rows > 0 && (x == nullptr || weight == nullptr || y == nullptr)) {
    return absl::InvalidArgumentError(prefix + "null pointer argument");
  }
  return absl::OkStatus();
}

absl::Status Annotate(std::string_view fn, const absl::Status& status) {
  if (status.ok()) return status;
  std::string message(fn);
  message += ": ";
  message.append(status.message().data(), status.message().size());
  return absl::Status(status.code(), message);
}

// Owns one cudaMalloc allocation on the current device.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }

  absl::Status Allocate(size_t bytes) {
    const cudaError_t error = cudaMalloc(&ptr_, bytes);
    if (error != cudaSuccess) ptr_ = nullptr;
    return CudaErrorToStatus(error, "cudaMalloc");
  }
  void* get() const { return ptr_; }

 private:
  void* ptr_ = nullptr;
};

absl::Status Launch(const float* x, const float* weight, float* y, int rows,
                    int hidden, float eps, cudaStream_t stream) {
  return CudaErrorToStatus(
      internal::LaunchRmsNormKernelF32(x, weight, y, rows, hidden, eps, stream),
      "RmsNorm f32 kernel launch");
}

absl::Status Launch(const uint16_t* x, const float* weight, float* y, int rows,
                    int hidden, float eps, cudaStream_t stream) {
  return CudaErrorToStatus(internal::LaunchRmsNormKernelBf16(
                               x, weight, y, rows, hidden, eps, stream),
                           "RmsNorm bf16 kernel launch");
}

template <typename T>
absl::Status RunFromHost(const T* x_host, const float* weight_host,
                         float* y_host, int rows, int hidden, float eps) {
  if (absl::StatusOr<int> devices = CudaDeviceCount(); !devices.ok()) {
    return devices.status();
  }
  const size_t elements = static_cast<size_t>(rows) * hidden;
  const size_t x_bytes = elements * sizeof(T);
  const size_t y_bytes = elements * sizeof(float);
  const size_t w_bytes = static_cast<size_t>(hidden) * sizeof(float);

  DeviceBuffer x, weight, y;
  if (absl::Status s = x.Allocate(x_bytes); !s.ok()) return s;
  if (absl::Status s = weight.Allocate(w_bytes); !s.ok()) return s;
  if (absl::Status s = y.Allocate(y_bytes); !s.ok()) return s;
  if (absl::Status s = CudaErrorToStatus(
          cudaMemcpy(x.get(), x_host, x_bytes, cudaMemcpyHostToDevice),
          "cudaMemcpy x");
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          CudaErrorToStatus(cudaMemcpy(weight.get(), weight_host, w_bytes,
                                       cudaMemcpyHostToDevice),
                            "cudaMemcpy weight");
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          Launch(static_cast<const T*>(x.get()),
                 static_cast<const float*>(weight.get()),
                 static_cast<float*>(y.get()), rows, hidden, eps, nullptr);
      !s.ok()) {
    return s;
  }
  // A blocking copy on the legacy default stream waits for the kernel and
  // reports any fault that happened while it ran.
  return CudaErrorToStatus(
      cudaMemcpy(y_host, y.get(), y_bytes, cudaMemcpyDeviceToHost),
      "cudaMemcpy y (after RmsNorm kernel)");
}

// The entry points' common frame: validates the arguments, does nothing for
// rows == 0, else runs `run()` and prefixes its error with `fn`.
template <typename T, typename Run>
absl::Status Checked(std::string_view fn, const T* x, const float* weight,
                     const float* y, int rows, int hidden, float eps,
                     const Run& run) {
  if (absl::Status s = ValidateArgs(fn, x, weight, y, rows, hidden, eps);
      !s.ok() || rows == 0) {
    return s;
  }
  return Annotate(fn, run());
}

}  // namespace

absl::Status RmsNormCuda(const float* x_host, const float* weight_host,
                         float* y_host, int rows, int hidden, float eps) {
  return Checked(
      "RmsNormCuda", x_host, weight_host, y_host, rows, hidden, eps, [&] {
        return RunFromHost(x_host, weight_host, y_host, rows, hidden, eps);
      });
}

absl::Status RmsNormBf16Cuda(const uint16_t* x_bf16_host,
                             const float* weight_host, float* y_host, int rows,
                             int hidden, float eps) {
  return Checked("RmsNormBf16Cuda", x_bf16_host, weight_host, y_host, rows,
                 hidden, eps, [&] {
                   return RunFromHost(x_bf16_host, weight_host, y_host, rows,
                                      hidden, eps);
                 });
}

absl::Status LaunchRmsNormCuda(const float* x_device,
                               const float* weight_device, float* y_device,
                               int rows, int hidden, float eps,
                               CUstream_st* stream) {
  return Checked("LaunchRmsNormCuda", x_device, weight_device, y_device, rows,
                 hidden, eps, [&] {
                   return Launch(x_device, weight_device, y_device, rows,
                                 hidden, eps, stream);
                 });
}

absl::Status LaunchRmsNormBf16Cuda(const uint16_t* x_bf16_device,
                                   const float* weight_device, float* y_device,
                                   int rows, int hidden, float eps,
                                   CUstream_st* stream) {
  return Checked("LaunchRmsNormBf16Cuda", x_bf16_device, weight_device,
                 y_device, rows, hidden, eps, [&] {
                   return Launch(x_bf16_device, weight_device, y_device, rows,
                                 hidden, eps, stream);
                 });
}

}  // namespace swaserve::model
