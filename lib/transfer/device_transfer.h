// KV pages in GPU memory over the host-memory transfer engine
// (docs/architecture.md#request-path steps 3–4).
//
// Debian 12's UCX 1.13 is built without CUDA support (no libuct_cuda*), so
// UCX can neither register nor move device memory. Pages that live in GPU
// memory therefore travel through host memory that UCX has registered:
//
//   sender (prefill):   device pages --D2H gather--> registered host staging
//                       --TransferEngine::Send--> receiver's host staging
//   receiver (decode):  host staging --H2D scatter--> device pages
//
// The device side is a small interface, DeviceCopier (docs/architecture.md#conventions:
// optional backends behind interfaces chosen at run time). The CUDA
// implementation (lib/transfer/cuda/device_kv_copier.h, swaserve::
// transfer_cuda) is only built when SWASERVE_HAVE_CUDA; CreateDeviceKvCopier
// below returns it, or Unimplemented("built without CUDA") in a build
// without CUDA, so callers need no #if. Everything else here (planning,
// SendFromDevice, ScatterToDevice) works with any DeviceCopier, which is how
// the tests run the whole path on a machine without a GPU (a copier that
// memcpys host memory).
//
// Host staging and pinning: a DMA between a GPU and host memory needs the
// host pages locked. The CUDA copier either pins the staging itself
// (cudaHostRegister of the UCX-registered or UCX-allocated region, once, via
// DeviceCopier::PinHostRegion; copies then go straight between device pages
// and staging) or, when that is refused or disabled, copies through its own
// pinned bounce buffers plus a host memcpy. Which is faster on a real GPU
// host is to be measured (bench/RESULTS.md, "CUDA device memory").
//
// This header includes no CUDA or UCX header. Free functions are
// thread-safe; a DeviceCopier's thread-safety is its implementation's (the
// CUDA one is thread-safe).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "lib/transfer/kv_destination.h"
#include "lib/transfer/transfer_engine.h"

namespace swaserve::transfer {

// ---------------------------------------------------------------------------
// The device-side interface
// ---------------------------------------------------------------------------

// One contiguous copy between device memory and host memory. Gathers read
// `device` and write `host`; scatters read `host` and write `device`.
struct DeviceHostCopy {
  void* device = nullptr;
  void* host = nullptr;
  uint64_t bytes = 0;
};

// What a memory address is, as the CUDA runtime sees it.
enum class MemoryKind : uint8_t {
  kHost,        // ordinary (pageable) host memory, unknown to CUDA
  kPinnedHost,  // page-locked host memory (cudaHostRegister/cudaMallocHost)
  kDevice,      // device memory (cudaMalloc)
  kManaged,     // unified memory (cudaMallocManaged)
};
absl::string_view MemoryKindName(MemoryKind kind);  // "host", "pinned", ...

// Moves bytes between device memory and host memory. Both methods return
// when every byte has arrived (or on the first error, once no copy they
// started can still write anywhere), so the caller may reuse the memory
// right away. Copies are validated before any byte moves (InvalidArgument:
// null pointer, zero length, overflowing range).
class DeviceCopier {
 public:
  virtual ~DeviceCopier() = default;

  // Device -> host.
  virtual absl::Status GatherToHost(
      absl::Span<const DeviceHostCopy> copies) = 0;
  // Host -> device.
  virtual absl::Status ScatterToDevice(
      absl::Span<const DeviceHostCopy> copies) = 0;

  // Offers [data, data + size) (host staging that will be copied to or from
  // often, e.g. a Registration's memory) for page-locking, so copies that
  // fall inside it need no bounce buffer. OK also when the implementation
  // chose not to lock it (it then keeps using bounce buffers); call
  // IsHostRegionPinned to know. Unpin before the memory is freed or
  // unmapped. The defaults do nothing (host-only copiers).
  virtual absl::Status PinHostRegion(void* data, size_t size) {
    return absl::OkStatus();
  }
  virtual absl::Status UnpinHostRegion(void* data) { return absl::OkStatus(); }
  virtual bool IsHostRegionPinned(const void* data, size_t size) const {
    return false;
  }
};

// Options of the CUDA copier (lib/transfer/cuda/device_kv_copier.h).
struct DeviceKvCopierOptions {
  // CUDA device ordinal the pages live on (copies run on it; the calling
  // thread's current device is restored afterwards).
  int device = 0;
  // Copy streams (cudaStreamNonBlocking) used round-robin; with bounce
  // buffers, one bounce slot per stream, so the host memcpy of one slot
  // overlaps the DMA of the others. 1..64.
  int streams = 2;
  // Total pinned bounce memory (cudaHostAlloc), split evenly over the
  // streams; each slot at least 64 KiB. Allocated at Create.
  size_t bounce_bytes = size_t{16} << 20;
  // How copies reach host memory:
  //   kAuto:   PinHostRegion tries cudaHostRegister; copies inside a pinned
  //            region go direct, all others through bounce buffers.
  //   kPinned: as kAuto, but PinHostRegion fails when cudaHostRegister does
  //            (and copies outside pinned regions still bounce).
  //   kBounce: never pin; every copy goes through bounce buffers.
  enum class HostPath : uint8_t { kAuto, kPinned, kBounce };
  HostPath host_path = HostPath::kAuto;
};
absl::string_view HostPathName(DeviceKvCopierOptions::HostPath path);

// True when this binary was built with CUDA (SWASERVE_HAVE_CUDA).
bool BuiltWithCuda();
// True when built with CUDA and at least one device is usable. Tests skip
// their device cases when this is false.
bool CudaAvailable();
// The CUDA copier. Errors: Unimplemented("built without CUDA") in a build
// without CUDA; InvalidArgument for bad options (checked before touching the
// driver); Unavailable when no device or driver is usable; others from CUDA.
absl::StatusOr<std::unique_ptr<DeviceCopier>> CreateDeviceKvCopier(
    const DeviceKvCopierOptions& options);
// What `ptr` is (cudaPointerGetAttributes). Unimplemented in a build without
// CUDA; with CUDA but no usable device every pointer is kHost.
absl::StatusOr<MemoryKind> DeviceMemoryKind(const void* ptr);

// ---------------------------------------------------------------------------
// Sender: gather device pages into host staging, then Send
// ---------------------------------------------------------------------------

// Where each device page goes in the sender's host staging, and the page
// copies TransferEngine::Send then ships from there. Pages are packed in
// list order without padding, so pages adjacent at the destination stay
// adjacent in staging and the engine merges them into long messages;
// device-contiguous runs become one gather.
struct DeviceGatherPlan {
  std::vector<DeviceHostCopy> gathers;  // device page -> staging
  std::vector<PageCopy> sends;          // staging -> destination
  uint64_t bytes = 0;                   // staging bytes used
};

// Plans `device_copies` (PageCopy::local are device pointers) into host
// staging [staging, staging + staging_size). InvalidArgument for an empty
// list, a null pointer, a zero-length copy, or staging too small (the
// message says how much is needed).
absl::StatusOr<DeviceGatherPlan> PlanDeviceGather(
    absl::Span<const PageCopy> device_copies, void* staging,
    size_t staging_size);

struct DeviceSendRequest {
  // As for TransferEngine::Send, but copies[i].local are device pointers.
  SendRequest send;
  // Sender-side host staging, registered with the sending engine (Register
  // or Allocate); the gather writes [staging_offset, + TotalBytes(copies)).
  // Offer it to the copier once with PinHostRegion for the direct path.
  // It must stay untouched until the send's callback has run.
  const Registration* staging = nullptr;
  size_t staging_offset = 0;
};

struct DeviceSendResult {
  SendResult send;
  absl::Duration gather;  // device -> staging, before Send started
};

// Gathers the pages (blocking the calling thread until they are in staging)
// and then starts engine.Send of the staged copies. `done` runs exactly
// once: with the gather's or the plan's error (before this returns), or with
// Send's outcome. Do not call it on the engine's progress thread (from a
// transfer callback): the gather blocks.
void SendFromDevice(TransferEngine& engine, DeviceCopier& copier,
                    DeviceSendRequest request, SendCallback done);
// The same, waiting for the outcome; reports the gather time as well.
absl::StatusOr<DeviceSendResult> SendFromDeviceAndWait(
    TransferEngine& engine, DeviceCopier& copier, DeviceSendRequest request);

// ---------------------------------------------------------------------------
// Receiver: scatter host staging into device pages after the commit
// ---------------------------------------------------------------------------

// One page of a received staging area and the device page it goes to.
struct StagedPage {
  uint64_t staging_offset = 0;  // from the start of the staging memory
  void* device = nullptr;
  uint64_t bytes = 0;
};

// The scatter of a KvStagingPlan laid out at `staging_offset` (full region,
// then SWA region, as ExpectKvTransfer lays it out): full page i ->
// full_device_pages[i], SWA page j -> swa_device_pages[j]. InvalidArgument
// when the page lists' lengths differ from the plan's page counts or a page
// is null.
absl::StatusOr<std::vector<StagedPage>> PlanKvScatter(
    const KvStagingPlan& plan, size_t staging_offset,
    absl::Span<void* const> full_device_pages,
    absl::Span<void* const> swa_device_pages);

// Copies received pages from host staging [staging, staging + staging_size)
// into device memory and returns when they are there. Call it once the
// receive callback reported OK (the staging then holds every byte), from a
// thread of your own — never from the callback itself (it runs on the
// engine's progress thread and this blocks), e.g. when decode admits the
// request (docs/architecture.md#request-path step 4). InvalidArgument for a page outside the
// staging, a null device pointer or a zero length.
absl::Status ScatterToDevice(DeviceCopier& copier, const void* staging,
                             size_t staging_size,
                             absl::Span<const StagedPage> pages);
// The same for a Registration's memory.
absl::Status ScatterToDevice(DeviceCopier& copier, const Registration& staging,
                             absl::Span<const StagedPage> pages);

}  // namespace swaserve::transfer
