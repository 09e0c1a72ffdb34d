// lib/transfer/device_transfer.h: KV pages in (GPU) device memory shipped
// through UCX-registered host staging.
//
// Everywhere: planning, argument checks, the build's CUDA answer
// (Unimplemented without CUDA), and the whole gather -> send -> scatter path
// between two engines over shared memory with a copier that memcpys host
// memory (so the wiring runs without a GPU). With CUDA and a device (run
// tests/unit/transfer/run_cuda_transfer_check.sh where one is lent): memory
// kinds, the CUDA copier on both host paths, and device pages -> gather ->
// UCX shm -> scatter -> device pages, every byte compared, bandwidth printed.
// Without a device those cases are skipped ("no CUDA device"), or fail with
// SWASERVE_REQUIRE_CUDA_DEVICE=1.
#include "lib/transfer/device_transfer.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/transfer/transfer_engine.h"
#include "tests/unit/transfer/transfer_test_util.h"

#if SWASERVE_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "lib/transfer/cuda/device_kv_copier.h"
#endif

namespace swaserve::transfer {
namespace {

using testing::FillPattern;
using ::testing::HasSubstr;
using testing::kShmTls;
using testing::StatsString;
using testing::WaitIdle;

using HostPath = DeviceKvCopierOptions::HostPath;

std::unique_ptr<TransferEngine> MakeEngine(const std::string& name) {
  TransferEngineOptions options;
  options.name = name;
  options.ucx_tls = kShmTls;
  options.default_timeout = absl::Seconds(30);
  auto engine = TransferEngine::Create(options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? *std::move(engine) : nullptr;
}

// A DeviceCopier whose "device" is host memory: memcpy both ways. Counts
// calls; can be told to fail.
class HostCopier : public DeviceCopier {
 public:
  absl::Status GatherToHost(absl::Span<const DeviceHostCopy> copies) override {
    ++gathers;
    if (fail) return absl::InternalError("injected gather failure");
    for (const DeviceHostCopy& c : copies) {
      std::memcpy(c.host, c.device, c.bytes);
    }
    return absl::OkStatus();
  }
  absl::Status ScatterToDevice(
      absl::Span<const DeviceHostCopy> copies) override {
    ++scatters;
    for (const DeviceHostCopy& c : copies) {
      std::memcpy(c.device, c.host, c.bytes);
    }
    return absl::OkStatus();
  }
  int gathers = 0;
  int scatters = 0;
  bool fail = false;
};

// Fake device addresses for planning (never dereferenced).
const void* Fake(uintptr_t address) {
  return reinterpret_cast<const void*>(address);
}

// ---------------------------------------------------------------------------
// Planning and argument checks
// ---------------------------------------------------------------------------

TEST(PlanDeviceGatherTest, PacksInListOrderAndMergesDeviceRuns) {
  std::vector<char> staging(10000);
  // Pages 0-2 contiguous on the device, page 3 elsewhere, page 4 follows
  // page 3 on the device.
  const std::vector<PageCopy> copies = {{Fake(0x10000), 0, 3000, 1000},
                                        {Fake(0x10000 + 1000), 0, 0, 1000},
                                        {Fake(0x10000 + 2000), 1, 0, 500},
                                        {Fake(0x90000), 0, 1000, 1000},
                                        {Fake(0x90000 + 1000), 0, 2000, 1000}};
  auto plan = PlanDeviceGather(copies, staging.data(), staging.size());
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->bytes, 4500u);
  ASSERT_EQ(plan->gathers.size(), 2u);
  EXPECT_EQ(plan->gathers[0].device, Fake(0x10000));
  EXPECT_EQ(plan->gathers[0].host, staging.data());
  EXPECT_EQ(plan->gathers[0].bytes, 2500u);
  EXPECT_EQ(plan->gathers[1].device, Fake(0x90000));
  EXPECT_EQ(plan->gathers[1].host, staging.data() + 2500);
  EXPECT_EQ(plan->gathers[1].bytes, 2000u);
  ASSERT_EQ(plan->sends.size(), copies.size());
  uint64_t at = 0;
  for (size_t i = 0; i < copies.size(); ++i) {
    EXPECT_EQ(plan->sends[i].local, staging.data() + at) << i;
    EXPECT_EQ(plan->sends[i].region, copies[i].region) << i;
    EXPECT_EQ(plan->sends[i].offset, copies[i].offset) << i;
    EXPECT_EQ(plan->sends[i].bytes, copies[i].bytes) << i;
    at += copies[i].bytes;
  }
}

TEST(PlanDeviceGatherTest, RejectsBadInput) {
  std::vector<char> staging(4096);
  const PageCopy ok{Fake(0x1000), 0, 0, 1024};
  EXPECT_EQ(
      PlanDeviceGather({}, staging.data(), staging.size()).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanDeviceGather({ok}, nullptr, 4096).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanDeviceGather({PageCopy{nullptr, 0, 0, 1024}}, staging.data(),
                             staging.size())
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanDeviceGather({PageCopy{Fake(0x1000), 0, 0, 0}}, staging.data(),
                             staging.size())
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  const std::vector<PageCopy> five(5, ok);
  auto small = PlanDeviceGather(five, staging.data(), staging.size());
  EXPECT_EQ(small.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(small.status().message()), HasSubstr("need 5120"));
  // Exactly full is fine.
  EXPECT_TRUE(
      PlanDeviceGather(std::vector<PageCopy>(4, ok), staging.data(), 4096)
          .ok());
}

TEST(PlanKvScatterTest, FullRegionThenSwaRegion) {
  KvStagingPlan plan;
  plan.full_pages = 3;
  plan.swa_pages = 2;
  plan.full_page_bytes = 100;
  plan.swa_page_bytes = 40;
  std::vector<char> full(300), swa(80);
  std::vector<void*> full_pages = {full.data() + 200, full.data(),
                                   full.data() + 100};
  std::vector<void*> swa_pages = {swa.data() + 40, swa.data()};
  auto pages = PlanKvScatter(plan, 64, full_pages, swa_pages);
  ASSERT_TRUE(pages.ok()) << pages.status();
  ASSERT_EQ(pages->size(), 5u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ((*pages)[i].staging_offset, 64u + 100u * i);
    EXPECT_EQ((*pages)[i].device, full_pages[i]);
    EXPECT_EQ((*pages)[i].bytes, 100u);
  }
  for (int j = 0; j < 2; ++j) {
    EXPECT_EQ((*pages)[3 + j].staging_offset, 64u + 300u + 40u * j);
    EXPECT_EQ((*pages)[3 + j].device, swa_pages[j]);
    EXPECT_EQ((*pages)[3 + j].bytes, 40u);
  }
  EXPECT_EQ(PlanKvScatter(plan, 0, swa_pages, swa_pages).status().code(),
            absl::StatusCode::kInvalidArgument);
  full_pages[1] = nullptr;
  EXPECT_EQ(PlanKvScatter(plan, 0, full_pages, swa_pages).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ScatterToDeviceTest, ChecksPagesBeforeCopying) {
  HostCopier copier;
  std::vector<char> staging(1000), device(1000);
  auto scatter = [&](StagedPage page) {
    return ScatterToDevice(copier, staging.data(), staging.size(), {page});
  };
  EXPECT_EQ(scatter({900, device.data(), 200}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(scatter({2000, device.data(), 1}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(scatter({0, nullptr, 10}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(scatter({0, device.data(), 0}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ScatterToDevice(copier, nullptr, 10, {}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(copier.scatters, 0);
  staging[950] = 7;
  EXPECT_TRUE(scatter({900, device.data(), 100}).ok());
  EXPECT_EQ(device[50], 7);
  EXPECT_EQ(copier.scatters, 1);
}

TEST(DeviceTransferNamesTest, Names) {
  EXPECT_EQ(MemoryKindName(MemoryKind::kHost), "host");
  EXPECT_EQ(MemoryKindName(MemoryKind::kPinnedHost), "pinned");
  EXPECT_EQ(MemoryKindName(MemoryKind::kDevice), "device");
  EXPECT_EQ(MemoryKindName(MemoryKind::kManaged), "managed");
  EXPECT_EQ(HostPathName(HostPath::kAuto), "auto");
  EXPECT_EQ(HostPathName(HostPath::kPinned), "pinned");
  EXPECT_EQ(HostPathName(HostPath::kBounce), "bounce");
}

// ---------------------------------------------------------------------------
// What the build offers
// ---------------------------------------------------------------------------

TEST(DeviceTransferBuildTest, CudaFactoriesMatchTheBuild) {
  int host_value = 0;
  if (!BuiltWithCuda()) {
    EXPECT_FALSE(CudaAvailable());
    auto copier = CreateDeviceKvCopier({});
    EXPECT_EQ(copier.status().code(), absl::StatusCode::kUnimplemented);
    EXPECT_EQ(copier.status().message(), "built without CUDA");
    auto kind = DeviceMemoryKind(&host_value);
    EXPECT_EQ(kind.status().code(), absl::StatusCode::kUnimplemented);
    EXPECT_EQ(kind.status().message(), "built without CUDA");
    std::cout << "built without CUDA\n";
    return;
  }
  // Bad options are refused before the driver is touched, device or not.
  DeviceKvCopierOptions bad;
  bad.streams = 0;
  EXPECT_EQ(CreateDeviceKvCopier(bad).status().code(),
            absl::StatusCode::kInvalidArgument);
  bad = {};
  bad.device = -1;
  EXPECT_EQ(CreateDeviceKvCopier(bad).status().code(),
            absl::StatusCode::kInvalidArgument);
  bad = {};
  bad.streams = 4;
  bad.bounce_bytes = 4 * (64 << 10) - 1;
  auto small = CreateDeviceKvCopier(bad);
  EXPECT_EQ(small.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(small.status().message()), HasSubstr("at least"));
  if (!CudaAvailable()) {
    auto copier = CreateDeviceKvCopier({});
    EXPECT_EQ(copier.status().code(), absl::StatusCode::kUnavailable)
        << copier.status();
    auto kind = DeviceMemoryKind(&host_value);
    ASSERT_TRUE(kind.ok()) << kind.status();
    EXPECT_EQ(*kind, MemoryKind::kHost);
    std::cout << "built with CUDA, no device: " << copier.status() << "\n";
  }
}

// ---------------------------------------------------------------------------
// The whole path with a host "device" (no GPU needed)
// ---------------------------------------------------------------------------

class HostDeviceTransferTest : public ::testing::Test {
 protected:
  void SetUp() override {
    sender_ = MakeEngine("device-sender");
    receiver_ = MakeEngine("device-receiver");
    ASSERT_NE(sender_, nullptr);
    ASSERT_NE(receiver_, nullptr);
  }
  void TearDown() override {
    for (TransferEngine* e : {sender_.get(), receiver_.get()}) {
      if (e == nullptr) continue;
      EngineStats s;
      EXPECT_TRUE(WaitIdle(*e, absl::Seconds(5), &s)) << StatsString(s);
    }
  }
  std::unique_ptr<TransferEngine> sender_;
  std::unique_ptr<TransferEngine> receiver_;
};

// Source pages in random order into a full and a SWA region; the receiver
// scatters them into destination "device" pages in another random order.
TEST_F(HostDeviceTransferTest, GatherSendScatterEveryByte) {
  std::mt19937_64 rng(77);
  KvStagingPlan plan;
  plan.full_pages = 37;
  plan.swa_pages = 5;
  plan.full_page_bytes = 12288 + 64;
  plan.swa_page_bytes = 4096 + 8;
  const int src_full = 50, src_swa = 9;
  std::vector<uint8_t> src(src_full * plan.full_page_bytes +
                           src_swa * plan.swa_page_bytes);
  FillPattern(src.data(), src.size(), 5);
  uint8_t* const src_swa_base = src.data() + src_full * plan.full_page_bytes;

  std::vector<PageCopy> copies;
  std::vector<const uint8_t*> expected;  // per staged page, its source
  for (int i = 0; i < plan.full_pages; ++i) {
    const uint8_t* page =
        src.data() + (rng() % src_full) * plan.full_page_bytes;
    copies.push_back(
        PageCopy{page, 0, i * plan.full_page_bytes, plan.full_page_bytes});
    expected.push_back(page);
  }
  for (int j = 0; j < plan.swa_pages; ++j) {
    const uint8_t* page = src_swa_base + (j + 2) * plan.swa_page_bytes;
    copies.push_back(
        PageCopy{page, 1, j * plan.swa_page_bytes, plan.swa_page_bytes});
    expected.push_back(page);
  }

  auto send_staging = sender_->Allocate(plan.total_bytes() + 4096);
  ASSERT_TRUE(send_staging.ok()) << send_staging.status();
  auto recv_staging = receiver_->Allocate(plan.total_bytes() + 8192);
  ASSERT_TRUE(recv_staging.ok()) << recv_staging.status();
  const size_t recv_offset = 4096;

  Completion<ReceivedTransfer> received;
  ReceiveRequest rr;
  rr.transfer_id = "host-device";
  rr.regions = {
      LocalRegion{recv_staging->get(), recv_offset, plan.full_bytes(),
                  kv::PoolKind::kFull},
      LocalRegion{recv_staging->get(), recv_offset + plan.full_bytes(),
                  plan.swa_bytes(), kv::PoolKind::kSwa}};
  rr.expected_bytes = plan.total_bytes();
  auto dest = receiver_->ExpectTransfer(rr, received.Callback());
  ASSERT_TRUE(dest.ok()) << dest.status();

  HostCopier copier;
  DeviceSendRequest request;
  request.send.destination = *dest;
  request.send.copies = copies;
  request.send.commit_payload = "commit";
  request.staging = send_staging->get();
  request.staging_offset = 4096;
  auto sent = SendFromDeviceAndWait(*sender_, copier, request);
  ASSERT_TRUE(sent.ok()) << sent.status();
  EXPECT_EQ(sent->send.bytes, plan.total_bytes());
  EXPECT_EQ(copier.gathers, 1);
  auto got = received.WaitFor(absl::Seconds(10));
  ASSERT_TRUE(got.has_value());
  ASSERT_TRUE(got->ok()) << got->status();
  EXPECT_EQ((*got)->commit_payload, "commit");

  // Scatter into destination pages in a shuffled order.
  std::vector<uint8_t> dst(plan.total_bytes(), 0xCD);
  std::vector<int> full_order(plan.full_pages), swa_order(plan.swa_pages);
  std::iota(full_order.begin(), full_order.end(), 0);
  std::iota(swa_order.begin(), swa_order.end(), 0);
  std::shuffle(full_order.begin(), full_order.end(), rng);
  std::shuffle(swa_order.begin(), swa_order.end(), rng);
  uint8_t* const dst_swa = dst.data() + plan.full_bytes();
  std::vector<void*> full_pages, swa_pages;
  for (int i : full_order) {
    full_pages.push_back(dst.data() + i * plan.full_page_bytes);
  }
  for (int j : swa_order)
    swa_pages.push_back(dst_swa + j * plan.swa_page_bytes);
  auto pages = PlanKvScatter(plan, recv_offset, full_pages, swa_pages);
  ASSERT_TRUE(pages.ok()) << pages.status();
  ASSERT_TRUE(ScatterToDevice(copier, **recv_staging, *pages).ok());
  EXPECT_EQ(copier.scatters, 1);

  for (int i = 0; i < plan.full_pages; ++i) {
    EXPECT_EQ(std::memcmp(full_pages[i], expected[i], plan.full_page_bytes), 0)
        << "full page " << i;
  }
  for (int j = 0; j < plan.swa_pages; ++j) {
    EXPECT_EQ(std::memcmp(swa_pages[j], expected[plan.full_pages + j],
                          plan.swa_page_bytes),
              0)
        << "SWA page " << j;
  }
}

TEST_F(HostDeviceTransferTest, GatherFailureReachesCallbackAndSendsNothing) {
  std::vector<uint8_t> page(8192, 1);
  auto staging = sender_->Allocate(16384);
  ASSERT_TRUE(staging.ok()) << staging.status();
  auto recv = receiver_->Allocate(16384);
  ASSERT_TRUE(recv.ok()) << recv.status();
  Completion<ReceivedTransfer> received;
  auto dest = receiver_->ExpectTransfer(
      ReceiveRequest{
          "fails", {LocalRegion{recv->get(), 0, 8192}}, 8192, absl::Seconds(2)},
      received.Callback());
  ASSERT_TRUE(dest.ok()) << dest.status();

  HostCopier copier;
  copier.fail = true;
  DeviceSendRequest request;
  request.send.destination = *dest;
  request.send.copies = {PageCopy{page.data(), 0, 0, 8192}};
  request.staging = staging->get();
  Completion<SendResult> sent;
  SendFromDevice(*sender_, copier, request, sent.Callback());
  ASSERT_TRUE(sent.HasCompleted());  // before SendFromDevice returned
  auto result = sent.Wait();
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(result.status().message()),
              HasSubstr("injected gather failure"));
  EXPECT_EQ(sender_->Stats().active_sends, 0);

  // No staging, staging too small: InvalidArgument, nothing gathered.
  copier.fail = false;
  request.staging = nullptr;
  EXPECT_EQ(SendFromDeviceAndWait(*sender_, copier, request).status().code(),
            absl::StatusCode::kInvalidArgument);
  request.staging = staging->get();
  request.staging_offset = 16384 - 4096;
  EXPECT_EQ(SendFromDeviceAndWait(*sender_, copier, request).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(copier.gathers, 1);
  ASSERT_TRUE(receiver_->CancelReceive("fails").ok());
  ASSERT_TRUE(received.WaitFor(absl::Seconds(10)).has_value());
}

// ---------------------------------------------------------------------------
// With a CUDA device
// ---------------------------------------------------------------------------

#if SWASERVE_HAVE_CUDA

bool RequireCudaDevice() {
  const char* v = std::getenv("SWASERVE_REQUIRE_CUDA_DEVICE");
  return v != nullptr && std::string(v) == "1";
}

#define SKIP_WITHOUT_CUDA_DEVICE()                                      \
  do {                                                                  \
    if (!CudaAvailable()) {                                             \
      const absl::Status why = CudaDeviceCount().status();              \
      if (RequireCudaDevice()) {                                        \
        FAIL() << "SWASERVE_REQUIRE_CUDA_DEVICE=1 but no CUDA device: " \
               << why;                                                  \
      }                                                                 \
      GTEST_SKIP() << "no CUDA device: " << why.message();              \
    }                                                                   \
  } while (0)

#define ASSERT_CUDA(call)                                   \
  do {                                                      \
    const cudaError_t cuda_error = (call);                  \
    ASSERT_EQ(cuda_error, cudaSuccess)                      \
        << #call << ": " << cudaGetErrorString(cuda_error); \
  } while (0)

// cudaMalloc'ed bytes, freed on destruction.
struct DeviceBuffer {
  explicit DeviceBuffer(size_t n) : size(n) {
    if (cudaMalloc(&data, n) != cudaSuccess) data = nullptr;
  }
  ~DeviceBuffer() {
    if (data != nullptr) cudaFree(data);
  }
  uint8_t* bytes() const { return static_cast<uint8_t*>(data); }
  void* data = nullptr;
  size_t size;
};

double GBps(uint64_t bytes, absl::Duration d) {
  return static_cast<double>(bytes) / absl::ToDoubleSeconds(d) / 1e9;
}

TEST(CudaMemoryKindTest, TellsHostFromDevice) {
  SKIP_WITHOUT_CUDA_DEVICE();
  DeviceBuffer device(4096);
  ASSERT_NE(device.data, nullptr);
  std::vector<char> host(4096);
  void* pinned = nullptr;
  ASSERT_EQ(cudaMallocHost(&pinned, 4096), cudaSuccess);
  void* managed = nullptr;
  ASSERT_EQ(cudaMallocManaged(&managed, 4096), cudaSuccess);
  EXPECT_EQ(*DeviceMemoryKind(device.data), MemoryKind::kDevice);
  EXPECT_EQ(*DeviceMemoryKind(device.bytes() + 100), MemoryKind::kDevice);
  EXPECT_EQ(*DeviceMemoryKind(host.data()), MemoryKind::kHost);
  EXPECT_EQ(*DeviceMemoryKind(pinned), MemoryKind::kPinnedHost);
  EXPECT_EQ(*DeviceMemoryKind(managed), MemoryKind::kManaged);
  cudaFreeHost(pinned);
  cudaFree(managed);
}

class CudaCopierTest : public ::testing::TestWithParam<HostPath> {};

// Random odd-sized pages, device -> host staging -> other device pages, in
// shuffled orders, with bounce slots smaller than some pages.
TEST_P(CudaCopierTest, GatherScatterRoundTrip) {
  SKIP_WITHOUT_CUDA_DEVICE();
  DeviceKvCopierOptions options;
  options.host_path = GetParam();
  options.streams = 3;
  options.bounce_bytes = 3 * (128 << 10);
  auto made = DeviceKvCopier::Create(options);
  ASSERT_TRUE(made.ok()) << made.status();
  DeviceKvCopier& copier = **made;
  std::mt19937_64 rng(9);
  for (int trial = 0; trial < 4; ++trial) {
    const size_t page = 1 + rng() % (300 << 10);
    const int pages = 8 + static_cast<int>(rng() % 40);
    const size_t bytes = page * pages;
    std::vector<uint8_t> host_src(bytes);
    FillPattern(host_src.data(), bytes, 40 + trial);
    DeviceBuffer src(bytes), dst(bytes);
    ASSERT_NE(src.data, nullptr);
    ASSERT_NE(dst.data, nullptr);
    ASSERT_CUDA(
        cudaMemcpy(src.data, host_src.data(), bytes, cudaMemcpyHostToDevice));
    ASSERT_CUDA(cudaMemset(dst.data, 0, bytes));
    std::vector<uint8_t> staging(bytes + 1);  // +1: unaligned staging
    uint8_t* const stage = staging.data() + 1;
    ASSERT_TRUE(copier.PinHostRegion(stage, bytes).ok());
    std::vector<int> order(pages);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<DeviceHostCopy> gathers, scatters;
    for (int i = 0; i < pages; ++i) {
      gathers.push_back(
          {src.bytes() + order[i] * page, stage + i * page, page});
      scatters.push_back(
          {dst.bytes() + order[i] * page, stage + i * page, page});
    }
    ASSERT_TRUE(copier.GatherToHost(gathers).ok());
    for (int i = 0; i < pages; ++i) {
      ASSERT_EQ(std::memcmp(stage + i * page, host_src.data() + order[i] * page,
                            page),
                0)
          << "trial " << trial << " staged page " << i;
    }
    ASSERT_TRUE(copier.ScatterToDevice(scatters).ok());
    std::vector<uint8_t> back(bytes);
    ASSERT_CUDA(
        cudaMemcpy(back.data(), dst.data, bytes, cudaMemcpyDeviceToHost));
    EXPECT_EQ(back, host_src) << "trial " << trial;
    if (copier.IsHostRegionPinned(stage, bytes)) {
      EXPECT_TRUE(copier.UnpinHostRegion(stage).ok());
    }
  }
  const DeviceKvCopierStats stats = copier.Stats();
  std::cout << "copier [" << HostPathName(GetParam())
            << "]: direct=" << stats.direct_bytes
            << " bounce=" << stats.bounce_bytes << " dma=" << stats.dma_calls
            << "\n";
  if (GetParam() == HostPath::kBounce) {
    EXPECT_EQ(stats.direct_bytes, 0u);
  } else {
    EXPECT_GT(stats.direct_bytes, 0u);  // heap memory can be registered
  }
  EXPECT_EQ(stats.pinned_regions, 0);
  // Bad copies are refused.
  const std::vector<DeviceHostCopy> bad = {{nullptr, nullptr, 1}};
  EXPECT_EQ(copier.GatherToHost(bad).code(),
            absl::StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(HostPaths, CudaCopierTest,
                         ::testing::Values(HostPath::kAuto, HostPath::kBounce),
                         [](const auto& info) {
                           return std::string(HostPathName(info.param));
                         });

// Device pages -> gather -> two engines over UCX shm -> scatter -> device
// pages; every byte compared; bandwidth printed. Params: host path, and
// whether the staging on both sides is UCX-allocated (Allocate) or heap
// memory registered with Register. SWASERVE_DEVICE_TRANSFER_MIB sets the
// size (default 256).
class CudaDeviceTransferTest
    : public ::testing::TestWithParam<std::tuple<HostPath, bool>> {};

TEST_P(CudaDeviceTransferTest, DevicePagesEndToEnd) {
  SKIP_WITHOUT_CUDA_DEVICE();
  const HostPath path = std::get<0>(GetParam());
  const bool ucx_allocated = std::get<1>(GetParam());
  const char* mib_env = std::getenv("SWASERVE_DEVICE_TRANSFER_MIB");
  const size_t mib = mib_env != nullptr ? std::atoi(mib_env) : 256;
  KvStagingPlan plan;
  plan.full_page_bytes = 800 << 10;  // MiMo-V2.5-Pro full-pool page
  plan.swa_page_bytes = 200 << 10;
  plan.swa_pages = 8;
  plan.full_pages = static_cast<int>(std::max<size_t>(
      1, ((mib << 20) - plan.swa_bytes()) / plan.full_page_bytes));
  const uint64_t total = plan.total_bytes();

  auto sender = MakeEngine("cuda-sender");
  auto receiver = MakeEngine("cuda-receiver");
  ASSERT_NE(sender, nullptr);
  ASSERT_NE(receiver, nullptr);
  DeviceKvCopierOptions options;
  options.host_path = path;
  auto send_copier = CreateDeviceKvCopier(options);
  ASSERT_TRUE(send_copier.ok()) << send_copier.status();
  auto recv_copier = CreateDeviceKvCopier(options);
  ASSERT_TRUE(recv_copier.ok()) << recv_copier.status();

  // Staging on both sides.
  std::vector<uint8_t> send_heap, recv_heap;
  absl::StatusOr<std::unique_ptr<Registration>> send_staging, recv_staging;
  if (ucx_allocated) {
    send_staging = sender->Allocate(total);
    recv_staging = receiver->Allocate(total);
  } else {
    send_heap.resize(total);
    recv_heap.resize(total);
    send_staging = sender->Register(send_heap.data(), total);
    recv_staging = receiver->Register(recv_heap.data(), total);
  }
  ASSERT_TRUE(send_staging.ok()) << send_staging.status();
  ASSERT_TRUE(recv_staging.ok()) << recv_staging.status();
  ASSERT_TRUE(
      (*send_copier)->PinHostRegion((*send_staging)->data(), total).ok());
  ASSERT_TRUE(
      (*recv_copier)->PinHostRegion((*recv_staging)->data(), total).ok());
  const bool pinned =
      (*send_copier)->IsHostRegionPinned((*send_staging)->data(), total) &&
      (*recv_copier)->IsHostRegionPinned((*recv_staging)->data(), total);

  // Source device pool (more pages than shipped), random pattern.
  const size_t src_full = plan.full_pages + 16;
  const size_t src_bytes = src_full * plan.full_page_bytes + plan.swa_bytes();
  std::vector<uint8_t> host_src(src_bytes);
  FillPattern(host_src.data(), src_bytes, 2024);
  DeviceBuffer src(src_bytes), dst(total);
  ASSERT_NE(src.data, nullptr);
  ASSERT_NE(dst.data, nullptr);
  ASSERT_CUDA(
      cudaMemcpy(src.data, host_src.data(), src_bytes, cudaMemcpyHostToDevice));
  std::mt19937_64 rng(3);
  std::vector<size_t> src_order(src_full);
  std::iota(src_order.begin(), src_order.end(), 0);

  for (int round = 0; round < 3; ++round) {
    ASSERT_CUDA(cudaMemset(dst.data, 0, total));
    std::shuffle(src_order.begin(), src_order.end(), rng);
    std::vector<PageCopy> copies;
    std::vector<size_t> expected_offset;  // per staged page, offset in src
    for (int i = 0; i < plan.full_pages; ++i) {
      const size_t off = src_order[i] * plan.full_page_bytes;
      copies.push_back(PageCopy{src.bytes() + off, 0, i * plan.full_page_bytes,
                                plan.full_page_bytes});
      expected_offset.push_back(off);
    }
    for (int j = 0; j < plan.swa_pages; ++j) {
      const size_t off = src_full * plan.full_page_bytes +
                         ((j * 5) % plan.swa_pages) * plan.swa_page_bytes;
      copies.push_back(PageCopy{src.bytes() + off, 1, j * plan.swa_page_bytes,
                                plan.swa_page_bytes});
      expected_offset.push_back(off);
    }
    Completion<ReceivedTransfer> received;
    ReceiveRequest rr;
    rr.transfer_id = absl::StrCat("cuda-", round);
    rr.regions = {LocalRegion{recv_staging->get(), 0, plan.full_bytes(),
                              kv::PoolKind::kFull},
                  LocalRegion{recv_staging->get(), plan.full_bytes(),
                              plan.swa_bytes(), kv::PoolKind::kSwa}};
    rr.expected_bytes = total;
    auto dest = receiver->ExpectTransfer(rr, received.Callback());
    ASSERT_TRUE(dest.ok()) << dest.status();

    const absl::Time start = absl::Now();
    DeviceSendRequest request;
    request.send.destination = *dest;
    request.send.copies = copies;
    request.staging = send_staging->get();
    auto sent = SendFromDeviceAndWait(*sender, **send_copier, request);
    ASSERT_TRUE(sent.ok()) << sent.status();
    auto got = received.WaitFor(absl::Seconds(60));
    ASSERT_TRUE(got.has_value());
    ASSERT_TRUE(got->ok()) << got->status();

    // Destination device pages in shuffled order.
    std::vector<int> order(plan.full_pages);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<void*> full_pages, swa_pages;
    for (int i : order)
      full_pages.push_back(dst.bytes() + i * plan.full_page_bytes);
    for (int j = 0; j < plan.swa_pages; ++j) {
      swa_pages.push_back(dst.bytes() + plan.full_bytes() +
                          (plan.swa_pages - 1 - j) * plan.swa_page_bytes);
    }
    auto pages = PlanKvScatter(plan, 0, full_pages, swa_pages);
    ASSERT_TRUE(pages.ok()) << pages.status();
    const absl::Time scatter_start = absl::Now();
    ASSERT_TRUE(ScatterToDevice(**recv_copier, **recv_staging, *pages).ok());
    const absl::Time end = absl::Now();

    std::vector<uint8_t> back(total);
    ASSERT_CUDA(
        cudaMemcpy(back.data(), dst.data, total, cudaMemcpyDeviceToHost));
    for (size_t p = 0; p < pages->size(); ++p) {
      const StagedPage& sp = (*pages)[p];
      const size_t at = static_cast<uint8_t*>(sp.device) - dst.bytes();
      ASSERT_EQ(std::memcmp(back.data() + at,
                            host_src.data() + expected_offset[p], sp.bytes),
                0)
          << "round " << round << ": page " << p << " differs";
    }
    const absl::Duration send = sent->send.elapsed;
    const absl::Duration scatter = end - scatter_start;
    std::cout << absl::StrFormat(
        "device transfer [%s, %s staging, %s, %s]: %.1f MiB in %d+%d pages: "
        "gather %.2f GB/s (%.1f ms), send %.2f GB/s (%.1f ms), scatter %.2f "
        "GB/s (%.1f ms), end-to-end %.2f GB/s (%.1f ms), round %d\n",
        HostPathName(path), ucx_allocated ? "ucx" : "heap",
        pinned ? "pinned" : "bounce", PrimitiveName(sent->send.primitive),
        total / 1048576.0, plan.full_pages, plan.swa_pages,
        GBps(total, sent->gather), absl::ToDoubleMilliseconds(sent->gather),
        GBps(total, send), absl::ToDoubleMilliseconds(send),
        GBps(total, scatter), absl::ToDoubleMilliseconds(scatter),
        GBps(total, end - start), absl::ToDoubleMilliseconds(end - start),
        round);
  }
  ASSERT_TRUE((*send_copier)->UnpinHostRegion((*send_staging)->data()).ok() ||
              !pinned);
  ASSERT_TRUE((*recv_copier)->UnpinHostRegion((*recv_staging)->data()).ok() ||
              !pinned);
}

INSTANTIATE_TEST_SUITE_P(
    PathsAndStaging, CudaDeviceTransferTest,
    ::testing::Combine(::testing::Values(HostPath::kAuto, HostPath::kBounce),
                       ::testing::Bool()),
    [](const auto& info) {
      return absl::StrCat(HostPathName(std::get<0>(info.param)), "_",
                          std::get<1>(info.param) ? "ucx" : "heap");
    });

#endif  // SWASERVE_HAVE_CUDA

}  // namespace
}  // namespace swaserve::transfer
