#include "lib/transfer/cuda/device_kv_copier.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <iterator>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "lib/base/logging.h"
#include "lib/cuda/cuda_status.h"

namespace swaserve::transfer {
namespace {

constexpr size_t kMinSlotBytes = size_t{64} << 10;
constexpr int kMaxStreams = 64;

using ::swaserve::cuda::CudaErrorToStatus;

// Makes options.device current for a scope and restores the previous one.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) {
      cudaGetLastError();
      previous_ = -1;
    }
    status_ = CudaErrorToStatus(cudaSetDevice(device), "cudaSetDevice");
  }
  ~DeviceScope() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;
  const absl::Status& status() const { return status_; }

 private:
  int previous_ = -1;
  absl::Status status_;
};

absl::Status ValidateCopies(absl::Span<const DeviceHostCopy> copies) {
  for (size_t i = 0; i < copies.size(); ++i) {
    const DeviceHostCopy& c = copies[i];
    if (c.device == nullptr || c.host == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("copy ", i, " has a null ",
                       c.device == nullptr ? "device" : "host", " pointer"));
    }
    if (c.bytes == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("copy ", i, " has zero bytes"));
    }
    const uint64_t max = std::numeric_limits<uintptr_t>::max();
    if (c.bytes > max - reinterpret_cast<uintptr_t>(c.device) ||
        c.bytes > max - reinterpret_cast<uintptr_t>(c.host)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "copy ", i, " of ", c.bytes, " bytes overflows the address space"));
    }
  }
  return absl::OkStatus();
}

// Merges copies that are contiguous on both sides.
std::vector<DeviceHostCopy> Merge(absl::Span<const DeviceHostCopy> copies) {
  std::vector<DeviceHostCopy> merged;
  merged.reserve(copies.size());
  for (const DeviceHostCopy& c : copies) {
    if (!merged.empty()) {
      DeviceHostCopy& last = merged.back();
      if (static_cast<char*>(last.device) + last.bytes == c.device &&
          static_cast<char*>(last.host) + last.bytes == c.host) {
        last.bytes += c.bytes;
        continue;
      }
    }
    merged.push_back(c);
  }
  return merged;
}

// One piece of a bounce batch: `bytes` at `slot_offset` of the slot.
struct Piece {
  char* device;
  char* host;
  size_t bytes;
  size_t slot_offset;
};

// Splits copies into batches of at most slot_bytes each.
std::vector<std::vector<Piece>> Batches(
    const std::vector<DeviceHostCopy>& copies, size_t slot_bytes) {
  std::vector<std::vector<Piece>> batches;
  size_t fill = slot_bytes;  // forces a new batch first
  for (const DeviceHostCopy& c : copies) {
    char* device = static_cast<char*>(c.device);
    char* host = static_cast<char*>(c.host);
    uint64_t left = c.bytes;
    while (left > 0) {
      if (fill == slot_bytes) {
        batches.emplace_back();
        fill = 0;
      }
      const size_t take =
          static_cast<size_t>(std::min<uint64_t>(left, slot_bytes - fill));
      batches.back().push_back(Piece{device, host, take, fill});
      fill += take;
      device += take;
      host += take;
      left -= take;
    }
  }
  return batches;
}

}  // namespace

absl::StatusOr<MemoryKind> CudaMemoryKind(const void* ptr) {
  if (!CudaDeviceAvailable()) return MemoryKind::kHost;
  cudaPointerAttributes attributes{};
  const cudaError_t error = cudaPointerGetAttributes(&attributes, ptr);
  if (error != cudaSuccess) {
    cudaGetLastError();
    return CudaErrorToStatus(error, "cudaPointerGetAttributes");
  }
  switch (attributes.type) {
    case cudaMemoryTypeHost:
      return MemoryKind::kPinnedHost;
    case cudaMemoryTypeDevice:
      return MemoryKind::kDevice;
    case cudaMemoryTypeManaged:
      return MemoryKind::kManaged;
    case cudaMemoryTypeUnregistered:
    default:
      return MemoryKind::kHost;
  }
}

DeviceKvCopier::DeviceKvCopier(const DeviceKvCopierOptions& options)
    : options_(options) {}

absl::StatusOr<std::unique_ptr<DeviceKvCopier>> DeviceKvCopier::Create(
    const DeviceKvCopierOptions& options) {
  if (options.device < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DeviceKvCopier: device must be >= 0, got ", options.device));
  }
  if (options.streams < 1 || options.streams > kMaxStreams) {
    return absl::InvalidArgumentError(
        absl::StrCat("DeviceKvCopier: streams must be in [1, ", kMaxStreams,
                     "], got ", options.streams));
  }
  const size_t slot_bytes = options.bounce_bytes / options.streams;
  if (slot_bytes < kMinSlotBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DeviceKvCopier: bounce_bytes ", options.bounce_bytes,
        " gives each of the ", options.streams, " streams ", slot_bytes,
        " bytes; give at least ", kMinSlotBytes * options.streams));
  }
  absl::StatusOr<int> count = CudaDeviceCount();
  if (!count.ok()) {
    return absl::Status(
        count.status().code(),
        absl::StrCat("DeviceKvCopier: ", count.status().message()));
  }
  if (options.device >= *count) {
    return absl::InvalidArgumentError(
        absl::StrCat("DeviceKvCopier: device ", options.device,
                     " does not exist (", *count, " visible)"));
  }
  std::unique_ptr<DeviceKvCopier> copier(new DeviceKvCopier(options));
  copier->slot_bytes_ = slot_bytes;
  DeviceScope scope(options.device);
  if (!scope.status().ok()) return scope.status();
  for (int i = 0; i < options.streams; ++i) {
    cudaStream_t stream = nullptr;
    if (absl::Status s = CudaErrorToStatus(
            cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
            "cudaStreamCreateWithFlags");
        !s.ok()) {
      return s;  // the destructor releases what was created
    }
    copier->streams_.push_back(stream);
    void* slot = nullptr;
    if (absl::Status s =
            CudaErrorToStatus(cudaHostAlloc(&slot, slot_bytes, cudaHostAllocPortable),
                       "cudaHostAlloc (bounce buffer)");
        !s.ok()) {
      return s;
    }
    copier->slots_.push_back(slot);
  }
  return copier;
}

DeviceKvCopier::~DeviceKvCopier() {
  DeviceScope scope(options_.device);
  for (cudaStream_t stream : streams_) {
    cudaStreamSynchronize(stream);
    cudaStreamDestroy(stream);
  }
  for (void* slot : slots_) cudaFreeHost(slot);
  absl::MutexLock lock(&pin_mu_);
  for (const auto& [address, pinned] : pinned_) {
    if (pinned.owned) cudaHostUnregister(reinterpret_cast<void*>(address));
  }
  cudaGetLastError();
}

bool DeviceKvCopier::IsPinnedLocked(const void* data, size_t size) const {
  const auto address = reinterpret_cast<uintptr_t>(data);
  auto it = pinned_.upper_bound(address);
  if (it == pinned_.begin()) return false;
  --it;
  return address - it->first <= it->second.size &&
         size <= it->second.size - (address - it->first);
}

bool DeviceKvCopier::IsHostRegionPinned(const void* data, size_t size) const {
  absl::ReaderMutexLock lock(&pin_mu_);
  return IsPinnedLocked(data, size);
}

absl::Status DeviceKvCopier::PinHostRegion(void* data, size_t size) {
  if (data == nullptr || size == 0) {
    return absl::InvalidArgumentError(
        "PinHostRegion: null or empty host region");
  }
  if (options_.host_path == DeviceKvCopierOptions::HostPath::kBounce) {
    return absl::OkStatus();
  }
  absl::MutexLock lock(&pin_mu_);
  const auto address = reinterpret_cast<uintptr_t>(data);
  auto next = pinned_.lower_bound(address);
  const bool overlaps_next =
      next != pinned_.end() && next->first - address < size;
  bool overlaps_prev = false;
  if (next != pinned_.begin()) {
    auto prev = std::prev(next);
    overlaps_prev = address - prev->first < prev->second.size;
  }
  if (overlaps_next || overlaps_prev) {
    return absl::InvalidArgumentError(
        absl::StrCat("PinHostRegion: [", absl::Hex(address), ", +", size,
                     ") overlaps a region already pinned by this copier"));
  }
  DeviceScope scope(options_.device);
  if (!scope.status().ok()) return scope.status();
  const cudaError_t error =
      cudaHostRegister(data, size, cudaHostRegisterPortable);
  bool owned = true;
  if (error == cudaErrorHostMemoryAlreadyRegistered) {
    cudaGetLastError();
    owned = false;  // page-locked by someone else: direct copies work
  } else if (error != cudaSuccess) {
    cudaGetLastError();
    absl::Status status =
        CudaErrorToStatus(error, absl::StrCat("cudaHostRegister of ", size, " bytes"));
    if (options_.host_path == DeviceKvCopierOptions::HostPath::kPinned) {
      return status;
    }
    SWA_LOG(warn,
            "DeviceKvCopier: {}; copies to this region use bounce buffers",
            std::string(status.message()));
    return absl::OkStatus();
  }
  pinned_[address] = Pinned{size, owned};
  absl::MutexLock stats_lock(&stats_mu_);
  ++stats_.pinned_regions;
  stats_.pinned_bytes += size;
  return absl::OkStatus();
}

absl::Status DeviceKvCopier::UnpinHostRegion(void* data) {
  absl::MutexLock lock(&pin_mu_);
  auto it = pinned_.find(reinterpret_cast<uintptr_t>(data));
  if (it == pinned_.end()) {
    return absl::NotFoundError(
        "UnpinHostRegion: no region pinned by this copier starts there");
  }
  const Pinned pinned = it->second;
  pinned_.erase(it);
  {
    absl::MutexLock stats_lock(&stats_mu_);
    --stats_.pinned_regions;
    stats_.pinned_bytes -= pinned.size;
  }
  if (!pinned.owned) return absl::OkStatus();
  // Copies in flight into this region finish before the unregister: a copy
  // call holds run_mu_ until its streams are synchronized.
  absl::MutexLock run_lock(&run_mu_);
  DeviceScope scope(options_.device);
  if (!scope.status().ok()) return scope.status();
  const cudaError_t error = cudaHostUnregister(data);
  if (error != cudaSuccess) cudaGetLastError();
  return CudaErrorToStatus(error, "cudaHostUnregister");
}

DeviceKvCopierStats DeviceKvCopier::Stats() const {
  absl::MutexLock lock(&stats_mu_);
  return stats_;
}

absl::Status DeviceKvCopier::GatherToHost(
    absl::Span<const DeviceHostCopy> copies) {
  return Run(Direction::kToHost, copies);
}

absl::Status DeviceKvCopier::ScatterToDevice(
    absl::Span<const DeviceHostCopy> copies) {
  return Run(Direction::kToDevice, copies);
}

absl::Status DeviceKvCopier::Run(Direction direction,
                                 absl::Span<const DeviceHostCopy> copies) {
  const char* what =
      direction == Direction::kToHost ? "GatherToHost" : "ScatterToDevice";
  if (absl::Status s = ValidateCopies(copies); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", s.message()));
  }
  if (copies.empty()) return absl::OkStatus();
  std::vector<DeviceHostCopy> direct, bounce;
  {
    absl::ReaderMutexLock lock(&pin_mu_);
    for (const DeviceHostCopy& c : Merge(copies)) {
      (IsPinnedLocked(c.host, c.bytes) ? direct : bounce).push_back(c);
    }
  }
  absl::MutexLock lock(&run_mu_);
  absl::Status status = RunLocked(direction, direct, bounce);
  if (!status.ok()) {
    return absl::Status(status.code(),
                        absl::StrCat(what, ": ", status.message()));
  }
  return status;
}

absl::Status DeviceKvCopier::RunLocked(
    Direction direction, const std::vector<DeviceHostCopy>& direct,
    const std::vector<DeviceHostCopy>& bounce) {
  DeviceScope scope(options_.device);
  if (!scope.status().ok()) return scope.status();
  const int n = static_cast<int>(streams_.size());
  absl::Status status;
  uint64_t calls = 0, direct_bytes = 0, bounce_bytes = 0;
  for (size_t i = 0; i < direct.size() && status.ok(); ++i) {
    const DeviceHostCopy& c = direct[i];
    cudaStream_t stream = streams_[i % n];
    const cudaError_t error =
        direction == Direction::kToHost
            ? cudaMemcpyAsync(c.host, c.device, c.bytes, cudaMemcpyDeviceToHost,
                              stream)
            : cudaMemcpyAsync(c.device, c.host, c.bytes, cudaMemcpyHostToDevice,
                              stream);
    status = CudaErrorToStatus(error, "cudaMemcpyAsync (pinned staging)");
    ++calls;
    direct_bytes += c.bytes;
  }
  if (status.ok() && !bounce.empty()) {
    status = RunBounce(direction, bounce);
    for (const DeviceHostCopy& c : bounce) bounce_bytes += c.bytes;
  }
  // Every stream is synchronized, error or not: nothing may still write
  // into caller memory after we return.
  for (cudaStream_t stream : streams_) {
    absl::Status s =
        CudaErrorToStatus(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    if (status.ok()) status = s;
  }
  if (!status.ok()) {
    cudaGetLastError();
    return status;
  }
  absl::MutexLock lock(&stats_mu_);
  stats_.direct_bytes += direct_bytes;
  stats_.bounce_bytes += bounce_bytes;
  stats_.dma_calls += calls;
  return status;
}

absl::Status DeviceKvCopier::RunBounce(
    Direction direction, const std::vector<DeviceHostCopy>& copies) {
  const int n = static_cast<int>(streams_.size());
  const std::vector<std::vector<Piece>> batches = Batches(copies, slot_bytes_);
  // pending[k]: the batch slot k last received, -1 when none.
  std::vector<int> pending(n, -1);
  uint64_t calls = 0;
  // Gather: once slot k's DMA finished, copy it out to its host targets.
  auto drain = [&](int k) -> absl::Status {
    if (pending[k] < 0) return absl::OkStatus();
    absl::Status s = CudaErrorToStatus(cudaStreamSynchronize(streams_[k]),
                                "cudaStreamSynchronize (bounce)");
    if (s.ok() && direction == Direction::kToHost) {
      const char* slot = static_cast<const char*>(slots_[k]);
      for (const Piece& p : batches[pending[k]]) {
        std::memcpy(p.host, slot + p.slot_offset, p.bytes);
      }
    }
    pending[k] = -1;
    return s;
  };
  absl::Status status;
  for (size_t b = 0; b < batches.size() && status.ok(); ++b) {
    const int k = static_cast<int>(b % n);
    status = drain(k);
    if (!status.ok()) break;
    char* slot = static_cast<char*>(slots_[k]);
    for (const Piece& p : batches[b]) {
      cudaError_t error;
      if (direction == Direction::kToHost) {
        error = cudaMemcpyAsync(slot + p.slot_offset, p.device, p.bytes,
                                cudaMemcpyDeviceToHost, streams_[k]);
      } else {
        std::memcpy(slot + p.slot_offset, p.host, p.bytes);
        error = cudaMemcpyAsync(p.device, slot + p.slot_offset, p.bytes,
                                cudaMemcpyHostToDevice, streams_[k]);
      }
      ++calls;
      status = CudaErrorToStatus(error, "cudaMemcpyAsync (bounce buffer)");
      if (!status.ok()) break;
    }
    pending[k] = static_cast<int>(b);
  }
  // The oldest batches first (for a gather the order does not matter for
  // correctness: batches never overlap at the host).
  for (int k = 0; k < n; ++k) {
    absl::Status s = status.ok() ? drain(k) : absl::OkStatus();
    if (status.ok()) status = s;
  }
  absl::MutexLock lock(&stats_mu_);
  stats_.dma_calls += calls;
  return status;
}

}  // namespace swaserve::transfer
