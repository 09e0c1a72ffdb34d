// TransferEngine in one process: two (or more) engines, each with its own
// UCP context, worker and progress thread, talking over shared memory or
// tcp on loopback. Every byte that lands is checked, and so is every byte
// that must not change.
#include "lib/transfer/transfer_engine.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/metrics/registry.h"
#include "lib/transfer/wire.h"
#include "tests/unit/transfer/transfer_test_util.h"

namespace swaserve::transfer {
namespace {

using testing::FillPattern;
using ::testing::HasSubstr;
using testing::StatsString;
using testing::WaitIdle;

constexpr uint8_t kCanary = 0xAB;

std::unique_ptr<TransferEngine> MakeEngine(
    const std::string& name, const std::string& tls,
    Primitive primitive = Primitive::kAuto,
    metrics::Registry* registry = nullptr) {
  TransferEngineOptions options;
  options.name = name;
  options.ucx_tls = tls;
  options.primitive = primitive;
  options.default_timeout = absl::Seconds(10);
  options.registry = registry;
  // Small messages so that merging, splitting and the in-flight window all
  // get exercised by test-sized transfers.
  options.max_message_bytes = 256 << 10;
  options.max_inflight_messages = 4;
  auto engine = TransferEngine::Create(options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? *std::move(engine) : nullptr;
}

// A page-aligned heap buffer.
struct Buffer {
  explicit Buffer(size_t n, uint8_t fill = 0)
      : size(n),
        data(static_cast<uint8_t*>(std::aligned_alloc(4096, Round(n)))) {
    std::memset(data, fill, Round(n));
  }
  ~Buffer() { std::free(data); }
  static size_t Round(size_t n) { return (n + 4095) / 4096 * 4096; }
  size_t size;
  uint8_t* data;
};

class TransferEngineTest
    : public ::testing::TestWithParam<std::tuple<std::string, Primitive>> {
 protected:
  void SetUp() override {
    tls_ = std::get<0>(GetParam());
    primitive_ = std::get<1>(GetParam());
    sender_ = MakeEngine("sender", tls_, primitive_);
    receiver_ = MakeEngine("receiver", tls_, primitive_);
    ASSERT_NE(sender_, nullptr);
    ASSERT_NE(receiver_, nullptr);
  }

  void TearDown() override {
    // No leak on either side once everything has finished.
    for (TransferEngine* e : {sender_.get(), receiver_.get()}) {
      if (e == nullptr) continue;
      EngineStats s;
      EXPECT_TRUE(WaitIdle(*e, absl::Seconds(5), &s)) << StatsString(s);
    }
  }

  std::string tls_;
  Primitive primitive_;
  std::unique_ptr<TransferEngine> sender_;
  std::unique_ptr<TransferEngine> receiver_;
};

// Random page sizes, random page lists (any source page to any slot, in any
// order), two regions of which only some slots are written (a partial
// window): every written byte equals its source, every other byte keeps the
// canary.
TEST_P(TransferEngineTest, RandomPageListsEveryByteVerified) {
  std::mt19937_64 rng(1234);
  for (int trial = 0; trial < 6; ++trial) {
    const size_t page = 512 + rng() % (96 << 10);
    const int src_pages = 8 + static_cast<int>(rng() % 40);
    const int slots0 = 4 + static_cast<int>(rng() % 40);
    const int slots1 = 4 + static_cast<int>(rng() % 12);
    Buffer src(page * src_pages);
    FillPattern(src.data, src.size, 100 + trial);
    auto src_reg = sender_->Register(src.data, src.size);  // memh path
    ASSERT_TRUE(src_reg.ok()) << src_reg.status();

    const size_t gap = 4096;
    Buffer dst(gap + page * slots0 + gap + page * slots1 + gap, kCanary);
    auto reg = receiver_->Register(dst.data, dst.size);
    ASSERT_TRUE(reg.ok()) << reg.status();

    // Which slots get written, from which source page.
    std::vector<int> order0(slots0), order1(slots1);
    std::iota(order0.begin(), order0.end(), 0);
    std::iota(order1.begin(), order1.end(), 0);
    std::shuffle(order0.begin(), order0.end(), rng);
    const int used0 = 1 + static_cast<int>(rng() % slots0);
    const int used1 = 1 + static_cast<int>(rng() % slots1);
    std::vector<PageCopy> copies;
    std::vector<std::tuple<int, int, int>> written;  // region, slot, src page
    for (int i = 0; i < used0; ++i) {
      const int s = static_cast<int>(rng() % src_pages);
      copies.push_back(PageCopy{src.data + s * page, 0,
                                static_cast<uint64_t>(order0[i]) * page, page});
      written.emplace_back(0, order0[i], s);
    }
    // Region 1: the last `used1` slots, from consecutive source pages (so
    // adjacent copies merge into longer messages).
    const int first_src = static_cast<int>(rng() % (src_pages - 1));
    for (int i = 0; i < used1; ++i) {
      const int slot = slots1 - used1 + i;
      const int s = (first_src + i) % src_pages;
      copies.push_back(PageCopy{src.data + s * page, 1,
                                static_cast<uint64_t>(slot) * page, page});
      written.emplace_back(1, slot, s);
    }
    const uint64_t expected = (used0 + used1) * page;

    Completion<ReceivedTransfer> received;
    ReceiveRequest rr;
    rr.transfer_id = absl::StrCat("random-", trial);
    rr.regions = {
        LocalRegion{reg->get(), gap, page * slots0, kv::PoolKind::kFull},
        LocalRegion{reg->get(), gap + page * slots0 + gap, page * slots1,
                    kv::PoolKind::kSwa}};
    rr.expected_bytes = expected;
    auto dest = receiver_->ExpectTransfer(rr, received.Callback());
    ASSERT_TRUE(dest.ok()) << dest.status();

    SendRequest sr;
    sr.destination = *dest;
    sr.copies = copies;
    sr.commit_payload = absl::StrCat("commit-", trial);
    auto result = sender_->SendAndWait(sr);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->bytes, expected);
    EXPECT_EQ(result->primitive, primitive_ == Primitive::kAuto
                                     ? Primitive::kActiveMessage
                                     : primitive_);
    auto got = received.WaitFor(absl::Seconds(10));
    ASSERT_TRUE(got.has_value());
    ASSERT_TRUE(got->ok()) << got->status();
    EXPECT_EQ((*got)->bytes, expected);
    EXPECT_EQ((*got)->commit_payload, absl::StrCat("commit-", trial));

    // Build the expected image of the destination buffer and compare all.
    std::vector<uint8_t> want(dst.size, kCanary);
    for (auto [region, slot, s] : written) {
      const size_t base = region == 0 ? gap : gap + page * slots0 + gap;
      std::memcpy(want.data() + base + slot * page, src.data + s * page, page);
    }
    const auto mismatch =
        std::mismatch(want.begin(), want.end(), dst.data).first;
    EXPECT_EQ(mismatch, want.end())
        << "trial " << trial << ": byte " << (mismatch - want.begin())
        << " of the destination differs (page " << page << ")";
  }
}

TEST_P(TransferEngineTest, UcxAllocatedStagingReceives) {
  auto staging = receiver_->Allocate(4 << 20);
  ASSERT_TRUE(staging.ok()) << staging.status();
  ASSERT_NE((*staging)->data(), nullptr);
  ASSERT_EQ((*staging)->size(), size_t{4} << 20);
  auto* dst = static_cast<uint8_t*>((*staging)->data());
  std::memset(dst, kCanary, (*staging)->size());
  Buffer src(3 << 20);
  FillPattern(src.data, src.size, 31);
  Completion<ReceivedTransfer> received;
  auto dest = receiver_->ExpectTransfer(
      ReceiveRequest{
          "allocated", {LocalRegion{staging->get(), 4096, src.size}}, src.size},
      received.Callback());
  ASSERT_TRUE(dest.ok()) << dest.status();
  auto sent = sender_->SendAndWait(
      SendRequest{*dest, {PageCopy{src.data, 0, 0, src.size}}, ""});
  ASSERT_TRUE(sent.ok()) << sent.status();
  // kAuto: single-copy puts into UCX-allocated memory over shared memory.
  if (primitive_ == Primitive::kAuto) {
    EXPECT_EQ(sent->primitive, tls_ == testing::kTcpTls
                                   ? Primitive::kActiveMessage
                                   : Primitive::kPut);
  }
  ASSERT_TRUE(received.Wait().ok());
  EXPECT_EQ(std::memcmp(dst + 4096, src.data, src.size), 0);
  // Again into the same staging (the sender reuses its unpacked rkey).
  std::memset(dst, kCanary, (*staging)->size());
  FillPattern(src.data, src.size, 32);
  Completion<ReceivedTransfer> again;
  auto dest2 = receiver_->ExpectTransfer(
      ReceiveRequest{"allocated-again",
                     {LocalRegion{staging->get(), 4096, src.size}},
                     src.size},
      again.Callback());
  ASSERT_TRUE(dest2.ok()) << dest2.status();
  ASSERT_TRUE(sender_
                  ->SendAndWait(SendRequest{
                      *dest2, {PageCopy{src.data, 0, 0, src.size}}, ""})
                  .ok());
  ASSERT_TRUE(again.Wait().ok());
  EXPECT_EQ(std::memcmp(dst + 4096, src.data, src.size), 0);
  for (size_t i = 0; i < 4096; ++i) ASSERT_EQ(dst[i], kCanary) << i;
  for (size_t i = 4096 + src.size; i < (*staging)->size(); ++i) {
    ASSERT_EQ(dst[i], kCanary) << i;
  }
  EXPECT_EQ(receiver_->Stats().registrations, 1);
  staging->reset();
  EXPECT_EQ(receiver_->Stats().registrations, 0);
}

TEST_P(TransferEngineTest, EmptyTransferCommitsOnly) {
  Buffer dst(4096);
  auto reg = receiver_->Register(dst.data, dst.size);
  ASSERT_TRUE(reg.ok());
  Completion<ReceivedTransfer> received;
  auto dest = receiver_->ExpectTransfer(
      ReceiveRequest{"empty", {LocalRegion{reg->get(), 0, 4096}}, 0},
      received.Callback());
  ASSERT_TRUE(dest.ok()) << dest.status();
  auto result = sender_->SendAndWait(SendRequest{*dest, {}, "payload"});
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->bytes, 0u);
  auto got = received.Wait();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->commit_payload, "payload");
}

TEST_P(TransferEngineTest, LargeCommitPayloadArrivesIntact) {
  // A last hidden state of a big model: larger than UCX's eager limit, so
  // the commit payload itself goes by rendezvous.
  std::string payload(300 << 10, '\0');
  FillPattern(payload.data(), payload.size(), 77);
  Buffer src(64 << 10), dst(64 << 10);
  FillPattern(src.data, src.size, 78);
  auto reg = receiver_->Register(dst.data, dst.size);
  ASSERT_TRUE(reg.ok());
  Completion<ReceivedTransfer> received;
  auto dest = receiver_->ExpectTransfer(
      ReceiveRequest{
          "big-commit", {LocalRegion{reg->get(), 0, dst.size}}, src.size},
      received.Callback());
  ASSERT_TRUE(dest.ok());
  auto result = sender_->SendAndWait(
      SendRequest{*dest, {PageCopy{src.data, 0, 0, src.size}}, payload});
  ASSERT_TRUE(result.ok()) << result.status();
  auto got = received.Wait();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->commit_payload == payload);
  EXPECT_EQ(std::memcmp(src.data, dst.data, src.size), 0);
}

// --- Rejections: wrong rkey, wrong size, unknown transfer id --------------

TEST_P(TransferEngineTest, UnknownTransferIdIsRejected) {
  Buffer src(8192), dst(8192, kCanary);
  auto reg = receiver_->Register(dst.data, dst.size);
  ASSERT_TRUE(reg.ok());
  Completion<ReceivedTransfer> received;
  auto dest = receiver_->ExpectTransfer(
      ReceiveRequest{"known", {LocalRegion{reg->get(), 0, dst.size}}, src.size},
      received.Callback());
  ASSERT_TRUE(dest.ok());
  Destination wrong = *dest;
  wrong.transfer_id = "unknown";
  auto result = sender_->SendAndWait(
      SendRequest{wrong, {PageCopy{src.data, 0, 0, src.size}}, ""});
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kNotFound)
      << result.status();
  EXPECT_THAT(result.status().message(),
              HasSubstr("expects no transfer 'unknown'"));
  // Nothing landed: AM messages are checked one by one, puts only start
  // after the receiver answered BEGIN with READY.
  for (size_t i = 0; i < dst.size; ++i) ASSERT_EQ(dst.data[i], kCanary) << i;
  // The real transfer is still pending and unharmed.
  EXPECT_FALSE(received.HasCompleted());
  ASSERT_TRUE(receiver_->CancelReceive("known").ok());
  auto got = received.Wait();
  EXPECT_EQ(got.status().code(), absl::StatusCode::kCancelled);
}

TEST_P(TransferEngineTest, CorruptRkeyIsRejectedBySender) {
  Buffer src(8192), dst(8192, kCanary);
  auto reg = receiver_->Register(dst.data, dst.size);
  ASSERT_TRUE(reg.ok());
  Completion<ReceivedTransfer> received;
  auto dest = receiver_->ExpectTransfer(
      ReceiveRequest{"corrupt-rkey",
                     {LocalRegion{reg->get(), 0, dst.size}},
                     src.size,
                     absl::Milliseconds(300)},
      received.Callback());
  ASSERT_TRUE(dest.ok());
  for (int variant = 0; variant < 3; ++variant) {
    Destination wrong = *dest;
    std::string& rkey = wrong.regions[0].rkey;
    if (variant == 0) rkey[rkey.size() / 2] ^= 0x5a;  // flipped bit
    if (variant == 1) rkey.resize(rkey.size() - 3);   // truncated
    if (variant == 2) rkey = "not an rkey";           // garbage
    auto result = sender_->SendAndWait(
        SendRequest{wrong, {PageCopy{src.data, 0, 0, src.size}}, ""});
    ASSERT_FALSE(result.ok()) << "variant " << variant;
    EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument)
        << result.status();
    EXPECT_THAT(result.status().message(), HasSubstr("rkey"));
  }
  for (size_t i = 0; i < dst.size; ++i) ASSERT_EQ(dst.data[i], kCanary) << i;
  // The receive times out on its own.
  auto got = received.Wait();
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST_P(TransferEngineTest, ForeignRkeyIsRejectedByReceiver) {
  // An rkey that is well-formed and consistent with its region but belongs
  // to another transfer (another tag): the receiver refuses every byte.
  Buffer src(64 << 10), dst(64 << 10, kCanary);
  FillPattern(src.data, src.size, 5);
  auto reg = receiver_->Register(dst.data, dst.size);
  ASSERT_TRUE(reg.ok());
  Completion<ReceivedTransfer> received;
  auto dest = receiver_->ExpectTransfer(
      ReceiveRequest{
          "foreign-rkey", {LocalRegion{reg->get(), 0, dst.size}}, src.size},
      received.Callback());
  ASSERT_TRUE(dest.ok());
  auto rkey = wire::UnpackRkey(dest->regions[0].rkey);
  ASSERT_TRUE(rkey.ok());
  rkey->tag ^= 1;
  Destination wrong = *dest;
  wrong.regions[0].rkey = wire::PackRkey(*rkey);
  auto result = sender_->SendAndWait(
      SendRequest{wrong, {PageCopy{src.data, 0, 0, src.size}}, ""});
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument)
      << result.status();
  EXPECT_THAT(result.status().message(), HasSubstr("belong to this transfer"));
  auto got = received.Wait();
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument)
      << got.status();
  // Validated before a byte landed (AM: every message; put: BEGIN).
  for (size_t i = 0; i < dst.size; ++i) ASSERT_EQ(dst.data[i], kCanary) << i;
}

TEST_P(TransferEngineTest, CopyOutsideRegionIsRejectedBySender) {
  Buffer src(16384), dst(16384, kCanary);
  auto reg = receiver_->Register(dst.data, dst.size);
  ASSERT_TRUE(reg.ok());
  Completion<ReceivedTransfer> received;
  auto dest = receiver_->ExpectTransfer(
      ReceiveRequest{"outside",
                     {LocalRegion{reg->get(), 0, 8192}},
                     8192,
                     absl::Milliseconds(300)},
      received.Callback());
  ASSERT_TRUE(dest.ok());
  auto result = sender_->SendAndWait(SendRequest{
      *dest,
      {PageCopy{src.data, 0, 0, 4096}, PageCopy{src.data, 0, 8000, 4096}},
      ""});
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(result.status().message(), HasSubstr("does not fit region 0"));
  for (size_t i = 0; i < dst.size; ++i) ASSERT_EQ(dst.data[i], kCanary) << i;
  EXPECT_EQ(received.Wait().status().code(),
            absl::StatusCode::kDeadlineExceeded);
}

TEST_P(TransferEngineTest, WriteOutsideRegionIsRejectedByReceiver) {
  if (primitive_ == Primitive::kPut) {
    GTEST_SKIP() << "puts are bounds-checked by the sender only";
  }
  // A forged destination that claims a longer region (rkey re-packed to
  // match): the sender's own check passes, the receiver's must not.
  Buffer src(16384), dst(32768, kCanary);
  auto reg = receiver_->Register(dst.data, dst.size);
  ASSERT_TRUE(reg.ok());
  Completion<ReceivedTransfer> received;
  auto dest = receiver_->ExpectTransfer(
      ReceiveRequest{"forged-length", {LocalRegion{reg->get(), 0, 8192}}, 8192},
      received.Callback());
  ASSERT_TRUE(dest.ok());
  auto rkey = wire::UnpackRkey(dest->regions[0].rkey);
  ASSERT_TRUE(rkey.ok());
  rkey->length = 16384;
  Destination forged = *dest;
  forged.regions[0].length = 16384;
  forged.regions[0].rkey = wire::PackRkey(*rkey);
  auto result = sender_->SendAndWait(
      SendRequest{forged, {PageCopy{src.data, 0, 8192, 8192}}, ""});
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument)
      << result.status();
  EXPECT_THAT(result.status().message(), HasSubstr("outside region 0"));
  for (size_t i = 0; i < dst.size; ++i) ASSERT_EQ(dst.data[i], kCanary) << i;
  EXPECT_EQ(received.Wait().status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_P(TransferEngineTest, WrongTotalSizeIsRejected) {
  Buffer src(3 * 8192), dst(3 * 8192, kCanary);
  FillPattern(src.data, src.size, 9);
  auto reg = receiver_->Register(dst.data, dst.size);
  ASSERT_TRUE(reg.ok());
  Completion<ReceivedTransfer> received;
  auto dest = receiver_->ExpectTransfer(
      ReceiveRequest{"short", {LocalRegion{reg->get(), 0, dst.size}}, dst.size},
      received.Callback());
  ASSERT_TRUE(dest.ok());
  // Two of the three pages.
  auto result = sender_->SendAndWait(
      SendRequest{*dest, {PageCopy{src.data, 0, 0, 2 * 8192}}, ""});
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kFailedPrecondition)
      << result.status();
  EXPECT_THAT(result.status().message(),
              HasSubstr("the receiver expects 24576"));
  auto got = received.Wait();
  EXPECT_EQ(got.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(got.status().message(), HasSubstr("wrote 16384 bytes"));
}

TEST_P(TransferEngineTest, SecondCommitIsRejected) {
  Buffer src(8192), dst(8192);
  auto reg = receiver_->Register(dst.data, dst.size);
  ASSERT_TRUE(reg.ok());
  Completion<ReceivedTransfer> received;
  auto dest = receiver_->ExpectTransfer(
      ReceiveRequest{"once", {LocalRegion{reg->get(), 0, dst.size}}, 8192},
      received.Callback());
  ASSERT_TRUE(dest.ok());
  SendRequest sr{*dest, {PageCopy{src.data, 0, 0, 8192}}, ""};
  ASSERT_TRUE(sender_->SendAndWait(sr).ok());
  ASSERT_TRUE(received.Wait().ok());
  auto again = sender_->SendAndWait(sr);
  ASSERT_FALSE(again.ok());
  EXPECT_THAT(again.status().message(), HasSubstr("already"));
}

// --- Time bounds, cancellation, cleanup ----------------------------------

TEST_P(TransferEngineTest, ReceiveTimesOutWithinBound) {
  Buffer dst(8192);
  auto reg = receiver_->Register(dst.data, dst.size);
  ASSERT_TRUE(reg.ok());
  Completion<ReceivedTransfer> received;
  const absl::Time start = absl::Now();
  auto dest = receiver_->ExpectTransfer(
      ReceiveRequest{"nobody",
                     {LocalRegion{reg->get(), 0, dst.size}},
                     8192,
                     absl::Milliseconds(200)},
      received.Callback());
  ASSERT_TRUE(dest.ok());
  auto got = received.WaitFor(absl::Seconds(5));
  ASSERT_TRUE(got.has_value());
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(got->status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(got->status().message(), HasSubstr("was not committed within"));
  EXPECT_GE(took, absl::Milliseconds(200));
  EXPECT_LT(took, absl::Seconds(2));
}

TEST_P(TransferEngineTest, SendToVanishedPeerFailsWithinBound) {
  Buffer src(1 << 20), dst(1 << 20);
  Destination dest;
  {
    auto other = MakeEngine("vanishing", tls_, primitive_);
    ASSERT_NE(other, nullptr);
    auto reg = other->Register(dst.data, dst.size);
    ASSERT_TRUE(reg.ok());
    auto d = other->ExpectTransfer(
        ReceiveRequest{
            "gone", {LocalRegion{reg->get(), 0, dst.size}}, dst.size},
        [](absl::StatusOr<ReceivedTransfer>) {});
    ASSERT_TRUE(d.ok());
    dest = *d;
    // Engine destroyed (its worker with it), registration released.
  }
  const absl::Time start = absl::Now();
  SendRequest sr{dest, {PageCopy{src.data, 0, 0, src.size}}, ""};
  sr.timeout = absl::Seconds(2);
  auto result = sender_->SendAndWait(sr);
  const absl::Duration took = absl::Now() - start;
  ASSERT_FALSE(result.ok());
  EXPECT_TRUE(absl::IsUnavailable(result.status()) ||
              absl::IsDeadlineExceeded(result.status()))
      << result.status();
  EXPECT_LT(took, absl::Seconds(4)) << result.status();
}

TEST_P(TransferEngineTest, CancelledReceiveReportsCancelled) {
  Buffer dst(8192);
  auto reg = receiver_->Register(dst.data, dst.size);
  ASSERT_TRUE(reg.ok());
  Completion<ReceivedTransfer> received;
  ASSERT_TRUE(
      receiver_
          ->ExpectTransfer(
              ReceiveRequest{
                  "cancel-me", {LocalRegion{reg->get(), 0, dst.size}}, 8192},
              received.Callback())
          .ok());
  EXPECT_TRUE(receiver_->CancelReceive("cancel-me").ok());
  EXPECT_EQ(received.Wait().status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(receiver_->CancelReceive("cancel-me").code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(receiver_->CancelReceive("never").code(),
            absl::StatusCode::kNotFound);
}

TEST_P(TransferEngineTest, ReleasingRegistrationCancelsPendingReceive) {
  Buffer dst(8192);
  auto reg = receiver_->Register(dst.data, dst.size);
  ASSERT_TRUE(reg.ok());
  Completion<ReceivedTransfer> received;
  ASSERT_TRUE(
      receiver_
          ->ExpectTransfer(
              ReceiveRequest{
                  "released", {LocalRegion{reg->get(), 0, dst.size}}, 8192},
              received.Callback())
          .ok());
  EXPECT_EQ(receiver_->Stats().registrations, 1);
  reg->reset();  // blocks until deregistered
  EXPECT_EQ(received.Wait().status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(receiver_->Stats().registrations, 0);
  EXPECT_EQ(receiver_->Stats().registered_bytes, 0);
}

// The decode service's pattern: the receive callback releases the staging
// registration and frees the memory right there.
TEST_P(TransferEngineTest, RegistrationReleasedInsideTheCallback) {
  Buffer src(1 << 20);
  FillPattern(src.data, src.size, 12);
  auto dst = std::make_unique<Buffer>(1 << 20);
  auto reg = receiver_->Register(dst->data, dst->size);
  ASSERT_TRUE(reg.ok());
  struct Held {
    std::unique_ptr<Registration> reg;
    std::unique_ptr<Buffer> memory;
    bool matched = false;
  };
  auto held = std::make_shared<Held>();
  const Registration* raw = reg->get();
  held->reg = *std::move(reg);
  held->memory = std::move(dst);
  absl::Notification done;
  int64_t registrations_after = -1;
  auto dest = receiver_->ExpectTransfer(
      ReceiveRequest{
          "release-in-callback", {LocalRegion{raw, 0, 1 << 20}}, 1 << 20},
      [&, held](absl::StatusOr<ReceivedTransfer> got) {
        held->matched = got.ok() && std::memcmp(held->memory->data, src.data,
                                                src.size) == 0;
        held->reg.reset();     // deregisters now: nothing uses it any more
        held->memory.reset();  // and the memory can go right away
        registrations_after = receiver_->Stats().registrations;
        done.Notify();
      });
  ASSERT_TRUE(dest.ok());
  ASSERT_TRUE(sender_
                  ->SendAndWait(SendRequest{
                      *dest, {PageCopy{src.data, 0, 0, src.size}}, ""})
                  .ok());
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_TRUE(held->matched);
  EXPECT_EQ(registrations_after, 0);
}

TEST_P(TransferEngineTest, DuplicateAndInvalidExpectationsAreRejected) {
  Buffer dst(8192);
  auto reg = receiver_->Register(dst.data, dst.size);
  ASSERT_TRUE(reg.ok());
  ReceiveRequest rr{"dup",
                    {LocalRegion{reg->get(), 0, dst.size}},
                    8192,
                    absl::Milliseconds(100)};
  ASSERT_TRUE(receiver_->ExpectTransfer(rr, nullptr).ok());
  EXPECT_EQ(receiver_->ExpectTransfer(rr, nullptr).status().code(),
            absl::StatusCode::kAlreadyExists);
  ReceiveRequest too_big = rr;
  too_big.transfer_id = "too-big";
  too_big.expected_bytes = 8193;
  EXPECT_EQ(receiver_->ExpectTransfer(too_big, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  ReceiveRequest outside = rr;
  outside.transfer_id = "outside";
  outside.regions[0].offset = 4096;
  EXPECT_EQ(receiver_->ExpectTransfer(outside, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  ReceiveRequest no_id = rr;
  no_id.transfer_id = "";
  EXPECT_EQ(receiver_->ExpectTransfer(no_id, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A registration of another engine.
  auto foreign = sender_->Register(dst.data, dst.size);
  ASSERT_TRUE(foreign.ok());
  ReceiveRequest other = rr;
  other.transfer_id = "foreign";
  other.regions[0].registration = foreign->get();
  EXPECT_EQ(receiver_->ExpectTransfer(other, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_P(TransferEngineTest, SeveralSendersToOneReceiverConcurrently) {
  constexpr int kSenders = 3;
  constexpr size_t kBytes = 3 << 20;
  std::vector<std::unique_ptr<TransferEngine>> senders;
  std::vector<std::unique_ptr<Buffer>> sources;
  for (int i = 0; i < kSenders; ++i) {
    senders.push_back(MakeEngine(absl::StrCat("sender", i), tls_, primitive_));
    ASSERT_NE(senders.back(), nullptr);
    sources.push_back(std::make_unique<Buffer>(kBytes));
    FillPattern(sources.back()->data, kBytes, 500 + i);
  }
  Buffer dst(kSenders * kBytes, kCanary);
  auto reg = receiver_->Register(dst.data, dst.size);
  ASSERT_TRUE(reg.ok());
  std::vector<Completion<ReceivedTransfer>> received(kSenders);
  std::vector<Destination> dests;
  for (int i = 0; i < kSenders; ++i) {
    auto d = receiver_->ExpectTransfer(
        ReceiveRequest{absl::StrCat("multi-", i),
                       {LocalRegion{reg->get(), i * kBytes, kBytes}},
                       kBytes},
        received[i].Callback());
    ASSERT_TRUE(d.ok());
    dests.push_back(*d);
  }
  std::vector<Completion<SendResult>> sent(kSenders);
  for (int i = 0; i < kSenders; ++i) {
    // Pages in reverse order, 64 KiB each.
    std::vector<PageCopy> copies;
    for (size_t off = kBytes; off > 0; off -= 64 << 10) {
      const size_t o = off - (64 << 10);
      copies.push_back(PageCopy{sources[i]->data + o, 0, o, 64 << 10});
    }
    senders[i]->Send(SendRequest{dests[i], copies, absl::StrCat("from ", i)},
                     sent[i].Callback());
  }
  for (int i = 0; i < kSenders; ++i) {
    auto s = sent[i].Wait();
    ASSERT_TRUE(s.ok()) << s.status();
    auto r = received[i].Wait();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->commit_payload, absl::StrCat("from ", i));
    EXPECT_EQ(
        testing::FirstPatternMismatch(dst.data + i * kBytes, kBytes, 500 + i),
        -1)
        << "sender " << i;
  }
  for (auto& s : senders) {
    EngineStats st;
    EXPECT_TRUE(WaitIdle(*s, absl::Seconds(5), &st)) << StatsString(st);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Transports, TransferEngineTest,
    ::testing::Combine(::testing::Values(std::string(testing::kShmTls),
                                         std::string(testing::kTcpTls)),
                       ::testing::Values(Primitive::kAuto, Primitive::kPut)),
    [](const auto& info) {
      std::string tls =
          std::get<0>(info.param) == testing::kTcpTls ? "tcp" : "shm";
      return tls + "_" + std::string(PrimitiveName(std::get<1>(info.param)));
    });

// --- Engine-level behaviour --------------------------------------------------

TEST(TransferEngine, DetectsTransportAndUsesAmOnBoth) {
  for (const char* tls : {testing::kShmTls, testing::kTcpTls}) {
    auto a = MakeEngine("a", tls);
    auto b = MakeEngine("b", tls);
    ASSERT_NE(a, nullptr);
    ASSERT_NE(b, nullptr);
    Buffer src(4096), dst(4096);
    auto reg = b->Register(dst.data, dst.size);
    ASSERT_TRUE(reg.ok());
    auto dest = b->ExpectTransfer(
        ReceiveRequest{"t", {LocalRegion{reg->get(), 0, 4096}}, 4096}, nullptr);
    ASSERT_TRUE(dest.ok());
    auto r =
        a->SendAndWait(SendRequest{*dest, {PageCopy{src.data, 0, 0, 4096}}});
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->transport, tls == testing::kTcpTls ? Transport::kTcp
                                                    : Transport::kSharedMemory)
        << tls;
    EXPECT_EQ(r->primitive, AutoPrimitive(r->transport));
    EXPECT_EQ(r->primitive, Primitive::kActiveMessage);  // ordinary memory
  }
}

TEST(TransferEngine, MetricsCountBytesTransfersAndFailures) {
  metrics::Registry registry;
  auto a = MakeEngine("a", testing::kShmTls, Primitive::kAuto, &registry);
  auto b = MakeEngine("b", testing::kShmTls, Primitive::kAuto, &registry);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  Buffer src(1 << 20), dst(1 << 20);
  auto reg = b->Register(dst.data, dst.size);
  ASSERT_TRUE(reg.ok());
  Completion<ReceivedTransfer> ok_received;
  auto dest = b->ExpectTransfer(
      ReceiveRequest{"ok", {LocalRegion{reg->get(), 0, dst.size}}, dst.size},
      ok_received.Callback());
  ASSERT_TRUE(dest.ok());
  ASSERT_TRUE(
      a->SendAndWait(SendRequest{*dest, {PageCopy{src.data, 0, 0, src.size}}})
          .ok());
  ASSERT_TRUE(ok_received.Wait().ok());
  Destination unknown = *dest;
  unknown.transfer_id = "nope";
  ASSERT_FALSE(
      a->SendAndWait(SendRequest{unknown, {PageCopy{src.data, 0, 0, 4096}}})
          .ok());
  Completion<ReceivedTransfer> timed_out;
  ASSERT_TRUE(
      b->ExpectTransfer(ReceiveRequest{"late",
                                       {LocalRegion{reg->get(), 0, dst.size}},
                                       dst.size,
                                       absl::Milliseconds(50)},
                        timed_out.Callback())
          .ok());
  ASSERT_FALSE(timed_out.Wait().ok());

  const std::string text = registry.RenderText();
  EXPECT_THAT(text, HasSubstr("swaserve_kv_transfer_bytes_total{direction="
                              "\"send\"} 1048576"));
  EXPECT_THAT(text, HasSubstr("swaserve_kv_transfer_bytes_total{direction="
                              "\"receive\"} 1048576"));
  EXPECT_THAT(text, HasSubstr("swaserve_kv_transfers_total{direction=\"send\","
                              "result=\"ok\"} 1"));
  EXPECT_THAT(text, HasSubstr("swaserve_kv_transfers_total{direction=\"send\","
                              "result=\"failed\"} 1"));
  EXPECT_THAT(text, HasSubstr("swaserve_kv_transfer_failures_total{direction="
                              "\"send\",reason=\"rejected\"} 1"));
  EXPECT_THAT(text, HasSubstr("swaserve_kv_transfer_failures_total{direction="
                              "\"receive\",reason=\"timeout\"} 1"));
  EXPECT_THAT(text, HasSubstr("swaserve_kv_transfer_seconds_count{direction="
                              "\"receive\"} 1"));
  EXPECT_THAT(text, HasSubstr("swaserve_kv_transfers_in_flight{direction="
                              "\"send\"} 0"));
}

TEST(TransferEngine, EngineDestroyedWithPendingWorkCancelsIt) {
  auto a = MakeEngine("a", testing::kShmTls);
  ASSERT_NE(a, nullptr);
  Buffer dst(8192);
  auto reg = a->Register(dst.data, dst.size);
  ASSERT_TRUE(reg.ok());
  Completion<ReceivedTransfer> received;
  ASSERT_TRUE(a->ExpectTransfer(
                   ReceiveRequest{
                       "pending", {LocalRegion{reg->get(), 0, dst.size}}, 8192},
                   received.Callback())
                  .ok());
  a.reset();
  auto got = received.WaitFor(absl::Seconds(1));
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->status().code(), absl::StatusCode::kCancelled);
  reg->reset();  // outlives the engine; deregisters inline
}

TEST(TransferEngine, RejectsBadOptions) {
  TransferEngineOptions o;
  o.max_message_bytes = 0;
  EXPECT_EQ(TransferEngine::Create(o).status().code(),
            absl::StatusCode::kInvalidArgument);
  o = TransferEngineOptions();
  o.max_inflight_messages = 0;
  EXPECT_EQ(TransferEngine::Create(o).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(TransferEngine, SendAndWaitFromCallbackIsRefused) {
  auto a = MakeEngine("a", testing::kShmTls);
  ASSERT_NE(a, nullptr);
  Buffer dst(4096);
  auto reg = a->Register(dst.data, dst.size);
  ASSERT_TRUE(reg.ok());
  absl::Notification ran;
  absl::Status inner;
  ASSERT_TRUE(
      a->ExpectTransfer(ReceiveRequest{"cb",
                                       {LocalRegion{reg->get(), 0, 4096}},
                                       4096,
                                       absl::Milliseconds(10)},
                        [&](absl::StatusOr<ReceivedTransfer>) {
                          inner = a->SendAndWait(SendRequest{}).status();
                          ran.Notify();
                        })
          .ok());
  ASSERT_TRUE(ran.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_EQ(inner.code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace swaserve::transfer
