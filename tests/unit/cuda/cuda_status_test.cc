#include "lib/cuda/cuda_status.h"

#include <cuda_runtime_api.h>

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace swaserve::cuda {
namespace {

using ::testing::HasSubstr;

absl::StatusCode CodeOf(cudaError_t e) {
  return CudaErrorToStatus(e, "call").code();
}

TEST(CudaErrorToStatusTest, SuccessIsOk) {
  EXPECT_TRUE(CudaErrorToStatus(cudaSuccess, "anything").ok());
}

TEST(CudaErrorToStatusTest, MessageIsContextNameAndDescription) {
  const absl::Status s =
      CudaErrorToStatus(cudaErrorMemoryAllocation, "cudaMalloc");
  EXPECT_EQ(std::string(s.message()),
            std::string("cudaMalloc: cudaErrorMemoryAllocation: ") +
                cudaGetErrorString(cudaErrorMemoryAllocation));
}

TEST(CudaErrorToStatusTest, NoUsableDeviceOrDriverIsUnavailable) {
  for (cudaError_t e :
       {cudaErrorNoDevice, cudaErrorInsufficientDriver,
        cudaErrorCallRequiresNewerDriver, cudaErrorStubLibrary,
        cudaErrorDevicesUnavailable, cudaErrorSystemNotReady,
        cudaErrorSystemDriverMismatch, cudaErrorCompatNotSupportedOnDevice,
        cudaErrorInitializationError}) {
    EXPECT_EQ(CodeOf(e), absl::StatusCode::kUnavailable) << cudaGetErrorName(e);
  }
}

TEST(CudaErrorToStatusTest, WrongArchitectureNamesTheBuildOption) {
  for (cudaError_t e :
       {cudaErrorNoKernelImageForDevice, cudaErrorUnsupportedPtxVersion}) {
    const absl::Status s = CudaErrorToStatus(e, "launch");
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(s.message()),
                HasSubstr("-DCMAKE_CUDA_ARCHITECTURES="));
  }
}

TEST(CudaErrorToStatusTest, MemoryArgumentsAndFaults) {
  EXPECT_EQ(CodeOf(cudaErrorMemoryAllocation),
            absl::StatusCode::kResourceExhausted);
  for (cudaError_t e : {cudaErrorInvalidValue, cudaErrorInvalidConfiguration,
                        cudaErrorInvalidDevice}) {
    EXPECT_EQ(CodeOf(e), absl::StatusCode::kInvalidArgument)
        << cudaGetErrorName(e);
  }
  for (cudaError_t e : {cudaErrorLaunchFailure, cudaErrorIllegalAddress,
                        cudaErrorHostMemoryAlreadyRegistered}) {
    EXPECT_EQ(CodeOf(e), absl::StatusCode::kInternal) << cudaGetErrorName(e);
  }
}

// Holds on every machine: a positive count, or kUnavailable; the
// availability probe agrees, and the answer does not change.
TEST(CudaDeviceCountTest, CountOrUnavailable) {
  const absl::StatusOr<int> count = CudaDeviceCount();
  if (count.ok()) {
    EXPECT_GT(*count, 0);
  } else {
    EXPECT_EQ(count.status().code(), absl::StatusCode::kUnavailable)
        << count.status();
    EXPECT_THAT(std::string(count.status().message()),
                HasSubstr("cudaGetDeviceCount: "));
  }
  EXPECT_EQ(CudaDeviceAvailable(), count.ok());
  EXPECT_EQ(CudaDeviceCount().ok(), count.ok());
}

}  // namespace
}  // namespace swaserve::cuda
