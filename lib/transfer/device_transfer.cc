#include "lib/transfer/device_transfer.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

#if SWASERVE_HAVE_CUDA
#include "lib/transfer/cuda/device_kv_copier.h"
#endif

namespace swaserve::transfer {
namespace {

// The gathered SendRequest and how long the gather took.
struct Gathered {
  SendRequest send;
  absl::Duration gather;
};

absl::StatusOr<Gathered> Gather(DeviceCopier& copier,
                                DeviceSendRequest& request) {
  if (request.staging == nullptr) {
    return absl::InvalidArgumentError(
        "SendFromDevice: no host staging (DeviceSendRequest::staging)");
  }
  const Registration& staging = *request.staging;
  if (request.staging_offset > staging.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("SendFromDevice: staging_offset ", request.staging_offset,
                     " is past the staging's ", staging.size(), " bytes"));
  }
  absl::StatusOr<DeviceGatherPlan> plan = PlanDeviceGather(
      request.send.copies,
      static_cast<char*>(staging.data()) + request.staging_offset,
      staging.size() - request.staging_offset);
  if (!plan.ok()) {
    return absl::Status(
        plan.status().code(),
        absl::StrCat("SendFromDevice: ", plan.status().message()));
  }
  const absl::Time start = absl::Now();
  if (absl::Status s = copier.GatherToHost(plan->gathers); !s.ok()) {
    return absl::Status(s.code(),
                        absl::StrCat("SendFromDevice: ", s.message()));
  }
  Gathered out;
  out.gather = absl::Now() - start;
  out.send = std::move(request.send);
  out.send.copies = std::move(plan->sends);
  return out;
}

}  // namespace

absl::string_view MemoryKindName(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::kHost:
      return "host";
    case MemoryKind::kPinnedHost:
      return "pinned";
    case MemoryKind::kDevice:
      return "device";
    case MemoryKind::kManaged:
      return "managed";
  }
  return "unknown";
}

absl::string_view HostPathName(DeviceKvCopierOptions::HostPath path) {
  switch (path) {
    case DeviceKvCopierOptions::HostPath::kAuto:
      return "auto";
    case DeviceKvCopierOptions::HostPath::kPinned:
      return "pinned";
    case DeviceKvCopierOptions::HostPath::kBounce:
      return "bounce";
  }
  return "unknown";
}

#if SWASERVE_HAVE_CUDA

bool BuiltWithCuda() { return true; }

bool CudaAvailable() { return CudaDeviceAvailable(); }

absl::StatusOr<std::unique_ptr<DeviceCopier>> CreateDeviceKvCopier(
    const DeviceKvCopierOptions& options) {
  absl::StatusOr<std::unique_ptr<DeviceKvCopier>> copier =
      DeviceKvCopier::Create(options);
  if (!copier.ok()) return copier.status();
  return std::unique_ptr<DeviceCopier>(*std::move(copier));
}

absl::StatusOr<MemoryKind> DeviceMemoryKind(const void* ptr) {
  return CudaMemoryKind(ptr);
}

#else  // !SWASERVE_HAVE_CUDA

bool BuiltWithCuda() { return false; }

bool CudaAvailable() { return false; }

absl::StatusOr<std::unique_ptr<DeviceCopier>> CreateDeviceKvCopier(
    const DeviceKvCopierOptions& options) {
  return absl::UnimplementedError("built without CUDA");
}

absl::StatusOr<MemoryKind> DeviceMemoryKind(const void* ptr) {
  return absl::UnimplementedError("built without CUDA");
}

#endif  // SWASERVE_HAVE_CUDA

absl::StatusOr<DeviceGatherPlan> PlanDeviceGather(
    absl::Span<const PageCopy> device_copies, void* staging,
    size_t staging_size) {
  if (device_copies.empty()) {
    return absl::InvalidArgumentError("no page copies to gather");
  }
  if (staging == nullptr) {
    return absl::InvalidArgumentError("null host staging");
  }
  DeviceGatherPlan plan;
  plan.gathers.reserve(device_copies.size());
  plan.sends.reserve(device_copies.size());
  char* const base = static_cast<char*>(staging);
  for (size_t i = 0; i < device_copies.size(); ++i) {
    const PageCopy& c = device_copies[i];
    if (c.local == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("page copy ", i, " has a null device pointer"));
    }
    if (c.bytes == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("page copy ", i, " has zero bytes"));
    }
    if (c.bytes > staging_size - std::min<uint64_t>(plan.bytes, staging_size)) {
      uint64_t need = 0;
      for (const PageCopy& d : device_copies) need += d.bytes;
      return absl::InvalidArgumentError(absl::StrCat(
          "host staging of ", staging_size, " bytes is too small: ", "the ",
          device_copies.size(), " page copies need ", need));
    }
    char* host = base + plan.bytes;
    // const_cast: a gather only reads the device page.
    char* device = static_cast<char*>(const_cast<void*>(c.local));
    DeviceHostCopy* last =
        plan.gathers.empty() ? nullptr : &plan.gathers.back();
    if (last != nullptr &&
        static_cast<char*>(last->device) + last->bytes == device) {
      last->bytes += c.bytes;  // host side is contiguous by construction
    } else {
      plan.gathers.push_back(DeviceHostCopy{device, host, c.bytes});
    }
    plan.sends.push_back(PageCopy{host, c.region, c.offset, c.bytes});
    plan.bytes += c.bytes;
  }
  return plan;
}

void SendFromDevice(TransferEngine& engine, DeviceCopier& copier,
                    DeviceSendRequest request, SendCallback done) {
  absl::StatusOr<Gathered> gathered = Gather(copier, request);
  if (!gathered.ok()) {
    done(gathered.status());
    return;
  }
  engine.Send(std::move(gathered->send), std::move(done));
}

absl::StatusOr<DeviceSendResult> SendFromDeviceAndWait(
    TransferEngine& engine, DeviceCopier& copier, DeviceSendRequest request) {
  absl::StatusOr<Gathered> gathered = Gather(copier, request);
  if (!gathered.ok()) return gathered.status();
  absl::StatusOr<SendResult> sent =
      engine.SendAndWait(std::move(gathered->send));
  if (!sent.ok()) return sent.status();
  return DeviceSendResult{*std::move(sent), gathered->gather};
}

absl::StatusOr<std::vector<StagedPage>> PlanKvScatter(
    const KvStagingPlan& plan, size_t staging_offset,
    absl::Span<void* const> full_device_pages,
    absl::Span<void* const> swa_device_pages) {
  if (full_device_pages.size() != static_cast<size_t>(plan.full_pages) ||
      swa_device_pages.size() != static_cast<size_t>(plan.swa_pages)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the staging plan has ", plan.full_pages, " full and ", plan.swa_pages,
        " SWA pages, got ", full_device_pages.size(), " and ",
        swa_device_pages.size(), " device pages"));
  }
  if ((plan.full_pages > 0 && plan.full_page_bytes == 0) ||
      (plan.swa_pages > 0 && plan.swa_page_bytes == 0)) {
    return absl::InvalidArgumentError("the staging plan has zero-byte pages");
  }
  std::vector<StagedPage> pages;
  pages.reserve(full_device_pages.size() + swa_device_pages.size());
  for (size_t i = 0; i < full_device_pages.size(); ++i) {
    if (full_device_pages[i] == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("full device page ", i, " is null"));
    }
    pages.push_back(StagedPage{staging_offset + i * plan.full_page_bytes,
                               full_device_pages[i], plan.full_page_bytes});
  }
  const uint64_t swa_base = staging_offset + plan.full_bytes();
  for (size_t j = 0; j < swa_device_pages.size(); ++j) {
    if (swa_device_pages[j] == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("SWA device page ", j, " is null"));
    }
    pages.push_back(StagedPage{swa_base + j * plan.swa_page_bytes,
                               swa_device_pages[j], plan.swa_page_bytes});
  }
  return pages;
}

absl::Status ScatterToDevice(DeviceCopier& copier, const void* staging,
                             size_t staging_size,
                             absl::Span<const StagedPage> pages) {
  if (staging == nullptr) {
    return absl::InvalidArgumentError("ScatterToDevice: null host staging");
  }
  std::vector<DeviceHostCopy> copies;
  copies.reserve(pages.size());
  // const_cast: a scatter only reads the host staging.
  char* const base = static_cast<char*>(const_cast<void*>(staging));
  for (size_t i = 0; i < pages.size(); ++i) {
    const StagedPage& p = pages[i];
    if (p.device == nullptr || p.bytes == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ScatterToDevice: page ", i, " has a ",
          p.device == nullptr ? "null device pointer" : "zero length"));
    }
    if (p.staging_offset > staging_size ||
        p.bytes > staging_size - p.staging_offset) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ScatterToDevice: page ", i, " [", p.staging_offset, ", +", p.bytes,
          ") lies outside the staging's ", staging_size, " bytes"));
    }
    copies.push_back(
        DeviceHostCopy{p.device, base + p.staging_offset, p.bytes});
  }
  if (copies.empty()) return absl::OkStatus();
  return copier.ScatterToDevice(copies);
}

absl::Status ScatterToDevice(DeviceCopier& copier, const Registration& staging,
                             absl::Span<const StagedPage> pages) {
  return ScatterToDevice(copier, staging.data(), staging.size(), pages);
}

}  // namespace swaserve::transfer
