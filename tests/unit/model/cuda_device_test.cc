#include "lib/model/cuda/cuda_device.h"

#include <cuda_runtime_api.h>

#include <cstdlib>
#include <iostream>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace swaserve::model {
namespace {

using ::testing::HasSubstr;

TEST(CudaErrorToStatusTest, SuccessIsOk) {
  EXPECT_TRUE(CudaErrorToStatus(cudaSuccess, "anything").ok());
}

TEST(CudaErrorToStatusTest, MessageHasContextNameAndDescription) {
  const absl::Status s = CudaErrorToStatus(cudaErrorNoDevice, "probe");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(s.message()), HasSubstr("probe: cudaErrorNoDevice"));
  EXPECT_THAT(std::string(s.message()),
              HasSubstr(cudaGetErrorString(cudaErrorNoDevice)));
}

TEST(CudaErrorToStatusTest, MissingOrOldDriverIsUnavailable) {
  for (cudaError_t e :
       {cudaErrorInsufficientDriver, cudaErrorCallRequiresNewerDriver,
        cudaErrorStubLibrary, cudaErrorDevicesUnavailable,
        cudaErrorSystemDriverMismatch, cudaErrorInitializationError}) {
    EXPECT_EQ(CudaErrorToStatus(e, "x").code(), absl::StatusCode::kUnavailable)
        << cudaGetErrorName(e);
  }
}

TEST(CudaErrorToStatusTest, OtherCodes) {
  EXPECT_EQ(CudaErrorToStatus(cudaErrorNoKernelImageForDevice, "x").code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(
      std::string(
          CudaErrorToStatus(cudaErrorNoKernelImageForDevice, "x").message()),
      HasSubstr("CMAKE_CUDA_ARCHITECTURES"));
  EXPECT_EQ(CudaErrorToStatus(cudaErrorMemoryAllocation, "x").code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(CudaErrorToStatus(cudaErrorInvalidValue, "x").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CudaErrorToStatus(cudaErrorLaunchFailure, "x").code(),
            absl::StatusCode::kInternal);
  EXPECT_EQ(CudaErrorToStatus(cudaErrorIllegalAddress, "x").code(),
            absl::StatusCode::kInternal);
}

// Holds on every machine: either devices are found or the reason is
// kUnavailable, and CudaAvailable() agrees.
TEST(CudaDeviceCountTest, CountOrUnavailableAndAvailableAgrees) {
  const absl::StatusOr<int> count = CudaDeviceCount();
  if (count.ok()) {
    EXPECT_GT(*count, 0);
    EXPECT_TRUE(CudaAvailable());
    std::cout << "CUDA devices: " << *count << "\n";
  } else {
    EXPECT_EQ(count.status().code(), absl::StatusCode::kUnavailable)
        << count.status();
    EXPECT_FALSE(CudaAvailable());
    std::cout << "no CUDA device: " << count.status().message() << "\n";
    const char* require = std::getenv("SWASERVE_REQUIRE_CUDA_DEVICE");
    EXPECT_FALSE(require != nullptr && std::string(require) == "1")
        << "SWASERVE_REQUIRE_CUDA_DEVICE=1 but " << count.status();
  }
  // A second call gives the same answer (nothing sticky changes it).
  EXPECT_EQ(CudaDeviceCount().ok(), count.ok());
}

}  // namespace
}  // namespace swaserve::model
