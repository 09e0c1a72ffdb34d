// DeviceKvCopier: the CUDA DeviceCopier (lib/transfer/device_transfer.h)
// that moves KV pages between GPU memory and UCX-registered host staging.
// Library swaserve::transfer_cuda, built only when SWASERVE_HAVE_CUDA; most
// callers use CreateDeviceKvCopier() from device_transfer.h instead, which
// exists in every build.
//
// How a copy runs (all cudaMemcpyAsync on the copier's own non-blocking
// streams, then a synchronize of every stream used):
//   * direct: the host side lies inside a region pinned by PinHostRegion
//     (cudaHostRegister with cudaHostRegisterPortable): one DMA per merged
//     copy, straight between the device page and staging; copies are spread
//     round-robin over the streams.
//   * bounce: otherwise. Copies are packed into per-stream pinned bounce
//     slots (cudaHostAlloc); a gather DMAs device -> slot, then memcpys
//     slot -> host once that stream finished; a scatter memcpys host -> slot
//     and DMAs slot -> device. While one slot is being memcpyed the other
//     streams' DMAs run.
// Adjacent copies (contiguous on both sides) are merged first.
//
// Pinning UCX memory: UCX 1.13 here has no CUDA transport, so it treats the
// staging as plain host memory; page-locking it with cudaHostRegister does
// not change what UCX sees. UCX-allocated staging (TransferEngine::Allocate:
// a MAP_SHARED posix segment) can usually be registered too; when the driver
// refuses (kAuto), the region stays unpinned and its copies bounce.
//
// Errors: InvalidArgument for bad options or copies (before any byte
// moves); CUDA failures mapped to absl codes (no device/driver ->
// Unavailable, out of memory -> ResourceExhausted, invalid value ->
// InvalidArgument, other -> Internal) with "<call>: <cudaGetErrorName>:
// <description>". After an error every stream is synchronized before the
// call returns, so no DMA is left writing into caller memory.
//
// Thread-safety: thread-safe; copies from several threads are serialized
// (one copy call at a time uses the streams and bounce slots). Ownership:
// the copier owns its streams and bounce buffers; the caller owns all page
// and staging memory, which must stay valid during a call, and a pinned
// region until UnpinHostRegion (the destructor unpins what is left, which
// needs the memory still mapped). This header includes no CUDA header.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "lib/cuda/cuda_status.h"
#include "lib/transfer/device_transfer.h"

// The CUDA runtime's stream type (cudaStream_t is CUstream_st*), declared so
// that this header needs no CUDA headers.
struct CUstream_st;

namespace swaserve::transfer {

struct DeviceKvCopierStats {
  uint64_t direct_bytes = 0;  // copied straight to/from pinned regions
  uint64_t bounce_bytes = 0;  // copied through bounce buffers
  uint64_t dma_calls = 0;     // cudaMemcpyAsync calls
  int64_t pinned_regions = 0;
  uint64_t pinned_bytes = 0;
};

class DeviceKvCopier final : public DeviceCopier {
 public:
  // Validates the options, selects the device, creates the streams and
  // allocates the bounce buffers. See the header comment for errors.
  static absl::StatusOr<std::unique_ptr<DeviceKvCopier>> Create(
      const DeviceKvCopierOptions& options);
  // Synchronizes and destroys the streams, frees the bounce buffers and
  // unpins every region still pinned.
  ~DeviceKvCopier() override;
  DeviceKvCopier(const DeviceKvCopier&) = delete;
  DeviceKvCopier& operator=(const DeviceKvCopier&) = delete;

  absl::Status GatherToHost(absl::Span<const DeviceHostCopy> copies) override;
  absl::Status ScatterToDevice(
      absl::Span<const DeviceHostCopy> copies) override;

  // kAuto: cudaHostRegister, OK even when the driver refuses (the region
  // then bounces). kPinned: the driver's refusal is the error. kBounce:
  // nothing is pinned. InvalidArgument for null/empty or a region
  // overlapping one already pinned.
  absl::Status PinHostRegion(void* data, size_t size) override;
  // NotFound when `data` does not start a region pinned here.
  absl::Status UnpinHostRegion(void* data) override;
  bool IsHostRegionPinned(const void* data, size_t size) const override;

  const DeviceKvCopierOptions& options() const { return options_; }
  DeviceKvCopierStats Stats() const;

 private:
  enum class Direction : uint8_t { kToHost, kToDevice };
  struct Pinned {
    size_t size = 0;
    bool owned = true;  // false: pinned by someone else before us
  };

  explicit DeviceKvCopier(const DeviceKvCopierOptions& options);
  absl::Status Run(Direction direction,
                   absl::Span<const DeviceHostCopy> copies);
  absl::Status RunLocked(Direction direction,
                         const std::vector<DeviceHostCopy>& direct,
                         const std::vector<DeviceHostCopy>& bounce)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(run_mu_);
  absl::Status RunBounce(Direction direction,
                         const std::vector<DeviceHostCopy>& copies)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(run_mu_);
  bool IsPinnedLocked(const void* data, size_t size) const
      ABSL_SHARED_LOCKS_REQUIRED(pin_mu_);

  const DeviceKvCopierOptions options_;
  size_t slot_bytes_ = 0;

  // Serializes copy calls (they share the streams and bounce slots).
  absl::Mutex run_mu_;
  std::vector<CUstream_st*> streams_;  // set in Create, then read-only
  std::vector<void*> slots_;           // pinned bounce slot per stream
  DeviceKvCopierStats stats_ ABSL_GUARDED_BY(stats_mu_);
  mutable absl::Mutex stats_mu_;

  mutable absl::Mutex pin_mu_;
  // Pinned regions by start address.
  std::map<uintptr_t, Pinned> pinned_ ABSL_GUARDED_BY(pin_mu_);
};

// absl::StatusOr<int> CudaDeviceCount(): number of usable CUDA devices;
// Unavailable (with the runtime's reason) when none, never 0.
// bool CudaDeviceAvailable(): true when at least one CUDA device is usable.
// Both live in lib/cuda/cuda_status.h (swaserve::cuda_status).
using ::swaserve::cuda::CudaDeviceAvailable;
using ::swaserve::cuda::CudaDeviceCount;
// cudaPointerGetAttributes of `ptr`; with no usable device every pointer is
// kHost.
absl::StatusOr<MemoryKind> CudaMemoryKind(const void* ptr);

}  // namespace swaserve::transfer
