// lib/transfer/sender.h: message planning (pure), and the send state
// machine between two EngineStates in one process, stepped by the test
// thread (so phases and deadlines are observed deterministically).
#include "lib/transfer/sender.h"

#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/transfer/engine_state.h"
#include "lib/transfer/ucx_util.h"
#include "tests/unit/transfer/engine_state_test_util.h"
#include "tests/unit/transfer/transfer_test_util.h"

namespace swaserve::transfer::internal {
namespace {

using testing::DriveUntil;
using testing::FillPattern;
using ::testing::HasSubstr;
using testing::MappedBuffer;

Destination TwoRegions(uint64_t length0, uint64_t length1) {
  Destination d;
  d.transfer_id = "plan";
  d.regions.push_back(RemoteRegion{kv::PoolKind::kFull, 0x100000, length0, ""});
  d.regions.push_back(RemoteRegion{kv::PoolKind::kSwa, 0x900000, length1, ""});
  return d;
}

TEST(PlanMessages, MergesAdjacentCopiesAndSplitsLongRuns) {
  std::vector<uint8_t> src(64 << 10);
  const Destination d = TwoRegions(1 << 20, 1 << 20);
  // Two contiguous copies (local and remote): one message; a third with a
  // remote gap: a new one; an empty copy: nothing.
  std::vector<PageCopy> copies = {{src.data(), 0, 0, 1000},
                                  {src.data() + 1000, 0, 1000, 1000},
                                  {src.data() + 2000, 0, 5000, 100},
                                  {nullptr, 0, 0, 0}};
  auto plan = PlanMessages(d, copies, 4096);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->messages.size(), 2u);
  EXPECT_EQ(plan->total_bytes, 2100u);
  EXPECT_EQ(plan->messages[0].bytes, 2000u);
  EXPECT_EQ(plan->messages[0].remote_address, 0x100000u);
  EXPECT_EQ(plan->messages[0].local, src.data());
  EXPECT_EQ(plan->messages[1].remote_address, 0x100000u + 5000);
  EXPECT_EQ(plan->messages[1].local, src.data() + 2000);
  EXPECT_EQ(plan->messages[1].memh, nullptr);

  // 10000 bytes in 4096-byte messages: 4096 + 4096 + 1808; a following
  // contiguous copy tops up the last message first.
  copies = {{src.data(), 1, 0, 10000}, {src.data() + 10000, 1, 10000, 3000}};
  plan = PlanMessages(d, copies, 4096);
  ASSERT_TRUE(plan.ok());
  std::vector<uint64_t> sizes;
  for (const Message& m : plan->messages) sizes.push_back(m.bytes);
  EXPECT_EQ(sizes, (std::vector<uint64_t>{4096, 4096, 4096, 712}));
  EXPECT_EQ(plan->total_bytes, 13000u);
  for (const Message& m : plan->messages) EXPECT_EQ(m.region, 1u);
}

TEST(PlanMessages, NeverMergesAcrossRegionsOrLocalGaps) {
  std::vector<uint8_t> src(8192);
  const Destination d = TwoRegions(1 << 20, 1 << 20);
  // Local contiguous but different regions.
  auto plan = PlanMessages(
      d, {{src.data(), 0, 0, 100}, {src.data() + 100, 1, 100, 100}}, 4096);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->messages.size(), 2u);
  // Remote contiguous, local not.
  plan = PlanMessages(
      d, {{src.data(), 0, 0, 100}, {src.data() + 200, 0, 100, 100}}, 4096);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->messages.size(), 2u);
}

TEST(PlanMessages, RejectsCopiesThatDoNotFit) {
  std::vector<uint8_t> src(8192);
  const Destination d = TwoRegions(4096, 4096);
  auto null_local = PlanMessages(d, {{nullptr, 0, 0, 16}}, 4096);
  EXPECT_TRUE(absl::IsInvalidArgument(null_local.status()));
  EXPECT_THAT(std::string(null_local.status().message()),
              HasSubstr("null local pointer"));
  auto bad_region = PlanMessages(d, {{src.data(), 2, 0, 16}}, 4096);
  EXPECT_THAT(std::string(bad_region.status().message()),
              HasSubstr("names region 2 but the destination has 2"));
  auto too_long = PlanMessages(d, {{src.data(), 0, 4000, 97}}, 4096);
  EXPECT_TRUE(absl::IsInvalidArgument(too_long.status()));
  EXPECT_THAT(std::string(too_long.status().message()),
              HasSubstr("does not fit region 0"));
  auto past_end = PlanMessages(d, {{src.data(), 1, 4097, 0}}, 4096);
  EXPECT_TRUE(past_end.ok());  // empty copies are skipped, wherever they are
  EXPECT_TRUE(PlanMessages(d, {{src.data(), 1, 0, 4096}}, 4096).ok());
}

// One send's outcome.
struct Outcome {
  std::optional<absl::StatusOr<SendResult>> result;
  SendCallback Callback() {
    return [this](absl::StatusOr<SendResult> r) { result = std::move(r); };
  }
};

class SenderTest : public ::testing::TestWithParam<Primitive> {
 protected:
  void SetUp() override {
    ASSERT_TRUE(testing::MakeTwoStates(&a_, &b_));
    dst_ = std::make_unique<MappedBuffer>(b_.get(), 1, kBytes, 0xAB);
    src_ = std::make_unique<MappedBuffer>(a_.get(), 1, kBytes);
    ASSERT_TRUE(dst_->ok() && src_->ok());
    FillPattern(src_->data(), kBytes, 7);
  }
  void TearDown() override {
    EXPECT_TRUE(testing::ShutDown(both()));
    src_.reset();
    dst_.reset();
  }
  std::vector<EngineState*> both() { return {a_.get(), b_.get()}; }

  // Expects transfer `id` of kBytes at b; its outcome goes to received_[id]
  // (a fixture member: the callback may run in TearDown).
  Destination Expect(const std::string& id) {
    ReceiveRequest r;
    r.transfer_id = id;
    r.regions = {LocalRegion{nullptr, 0, kBytes, kv::PoolKind::kFull}};
    r.expected_bytes = kBytes;
    auto dest =
        b_->receiver().Expect(r, {RegionRef{1, true}},
                              [this, id](absl::StatusOr<ReceivedTransfer> t) {
                                received_[id] = t.status();
                              });
    EXPECT_TRUE(dest.ok()) << dest.status();
    return dest.ok() ? *dest : Destination{};
  }
  bool Received(const std::string& id) const { return received_.contains(id); }
  SendRequest Request(const Destination& dest) {
    SendRequest s;
    s.destination = dest;
    s.copies = {PageCopy{src_->data(), 0, 0, kBytes}};
    s.commit_payload = "payload";
    s.primitive = GetParam();
    return s;
  }

  static constexpr uint64_t kBytes = 256 << 10;  // 4 messages of 64 KiB
  std::unique_ptr<EngineState> a_;
  std::unique_ptr<EngineState> b_;
  std::unique_ptr<MappedBuffer> dst_;
  std::unique_ptr<MappedBuffer> src_;
  std::map<std::string, absl::Status> received_;
};

TEST_P(SenderTest, WalksItsPhasesToTheAcknowledgedCommit) {
  const Destination dest = Expect("phases");
  Outcome out;
  Sender& sender = a_->sender();
  sender.Start(1, Request(dest), out.Callback());
  const SendState* s = sender.Find(1);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->messages.size(), 4u);
  EXPECT_EQ(s->total_bytes, kBytes);
  EXPECT_EQ(s->primitive, GetParam());
  // The source lies in a registration: its memory handle is used.
  EXPECT_NE(s->messages[0].memh, nullptr);
  EXPECT_EQ(a_->registrations().Find(1)->users, 1);
  const bool put = GetParam() == Primitive::kPut;
  EXPECT_EQ(s->phase, put ? SendPhase::kBegin : SendPhase::kData);
  EXPECT_EQ(s->ucx_rkeys.size(), put ? 1u : 0u);
  // The first pump posts BEGIN (puts) or the first window of messages.
  a_->ProcessDeferred();
  if (put) {
    EXPECT_TRUE(s->begin_posted);
    EXPECT_EQ(s->next, 0u);
    ASSERT_TRUE(DriveUntil(both(), [&] {
      return sender.Find(1) == nullptr || s->phase != SendPhase::kBegin;
    }));
  } else {
    EXPECT_GT(s->next, 0u);
    EXPECT_LE(s->inflight, a_->context().options.max_inflight_messages);
  }
  ASSERT_TRUE(DriveUntil(both(), [&] { return out.result.has_value(); }));
  ASSERT_TRUE(out.result->ok()) << out.result->status();
  EXPECT_EQ((*out.result)->bytes, kBytes);
  EXPECT_EQ((*out.result)->messages, 4u);
  EXPECT_EQ((*out.result)->primitive, GetParam());
  EXPECT_EQ((*out.result)->transport, Transport::kSharedMemory);
  EXPECT_EQ(sender.Find(1), nullptr);
  EXPECT_EQ(sender.active(), 0u);
  EXPECT_EQ(a_->registrations().Find(1)->users, 0);
  ASSERT_TRUE(DriveUntil(both(), [&] { return Received("phases"); }));
  EXPECT_TRUE(received_["phases"].ok()) << received_["phases"];
  EXPECT_EQ(std::memcmp(dst_->data(), src_->data(), kBytes), 0);
}

TEST_P(SenderTest, DeadlinePassedFailsAndNothingLands) {
  const Destination dest = Expect("late");
  Outcome out;
  a_->sender().Start(1, Request(dest), out.Callback());
  // Before anything was posted, the deadline passes.
  a_->sender().CheckDeadlines(NowNanos() + DurationNanos(absl::Hours(1)));
  EXPECT_TRUE(a_->sender().Find(1)->failed);
  EXPECT_FALSE(out.result.has_value());  // the callback runs on the next pump
  a_->ProcessDeferred();
  ASSERT_TRUE(out.result.has_value());
  EXPECT_TRUE(absl::IsDeadlineExceeded(out.result->status()));
  EXPECT_THAT(std::string(out.result->status().message()),
              HasSubstr("no commit acknowledgement within"));
  EXPECT_EQ(dst_->data()[0], 0xAB);
  EXPECT_EQ(b_->receiver().Find("late")->received, 0u);
  EXPECT_FALSE(Received("late"));
  ASSERT_TRUE(b_->receiver().Cancel("late").ok());
}

TEST_P(SenderTest, NextDeadlineIsTheEarliestPending) {
  const Destination d1 = Expect("one");
  const Destination d2 = Expect("two");
  Outcome o1, o2;
  SendRequest s1 = Request(d1);
  s1.timeout = absl::Seconds(30);
  SendRequest s2 = Request(d2);
  s2.timeout = absl::Seconds(5);
  a_->sender().Start(1, std::move(s1), o1.Callback());
  a_->sender().Start(2, std::move(s2), o2.Callback());
  a_->context().next_deadline_ns = std::numeric_limits<int64_t>::max();
  a_->sender().CheckDeadlines(NowNanos());
  EXPECT_EQ(a_->context().next_deadline_ns, a_->sender().Find(2)->deadline_ns);
  a_->sender().Cancel(1);
  a_->sender().Cancel(2);
  a_->sender().Cancel(3);  // unknown: no-op
  a_->ProcessDeferred();
  ASSERT_TRUE(DriveUntil(
      both(), [&] { return o1.result.has_value() && o2.result.has_value(); }));
  EXPECT_TRUE(absl::IsCancelled(o1.result->status()));
  EXPECT_THAT(std::string(o2.result->status().message()),
              HasSubstr("cancelled by the sender"));
  ASSERT_TRUE(b_->receiver().Cancel("one").ok());
  ASSERT_TRUE(b_->receiver().Cancel("two").ok());
}

TEST_P(SenderTest, ClosedPeerAndReleasedRegistrationFailTheirSends) {
  const Destination d1 = Expect("peer");
  const Destination d2 = Expect("registration");
  Outcome o1, o2;
  a_->sender().Start(1, Request(d1), o1.Callback());
  std::shared_ptr<Peer> peer = a_->sender().Find(1)->peer;
  ASSERT_NE(peer, nullptr);
  EXPECT_TRUE(peer->sends.contains(1));
  a_->peers().ClosePeer(peer, absl::UnavailableError("peer went away"));
  EXPECT_TRUE(a_->sender().Find(1)->failed);
  a_->ProcessDeferred();
  ASSERT_TRUE(o1.result.has_value());
  EXPECT_TRUE(absl::IsUnavailable(o1.result->status()));
  EXPECT_THAT(std::string(o1.result->status().message()),
              HasSubstr("peer went away"));
  EXPECT_TRUE(peer->sends.empty());

  a_->sender().Start(2, Request(d2), o2.Callback());
  a_->sender().FailSendsUsing(1, absl::CancelledError("released"));
  ASSERT_TRUE(DriveUntil(both(), [&] { return o2.result.has_value(); }));
  EXPECT_TRUE(absl::IsCancelled(o2.result->status()));
  // The receives: failed by b when it noticed a's closed endpoint, or else
  // cancelled here.
  b_->receiver().Cancel("peer").IgnoreError();
  b_->receiver().Cancel("registration").IgnoreError();
  ASSERT_TRUE(DriveUntil(
      both(), [&] { return Received("peer") && Received("registration"); }));
}

TEST_P(SenderTest, InvalidRequestsAndShutdownFailThroughTheCallback) {
  const Destination dest = Expect("invalid");
  Outcome bad_address, outside, after_shutdown;
  SendRequest r = Request(dest);
  r.destination.worker_address = "not an address";
  a_->sender().Start(1, r, bad_address.Callback());
  r = Request(dest);
  r.copies = {PageCopy{src_->data(), 0, 1, kBytes}};
  a_->sender().Start(2, r, outside.Callback());
  a_->ProcessDeferred();
  ASSERT_TRUE(bad_address.result.has_value());
  EXPECT_TRUE(absl::IsInvalidArgument(bad_address.result->status()));
  ASSERT_TRUE(outside.result.has_value());
  EXPECT_THAT(std::string(outside.result->status().message()),
              HasSubstr("does not fit region 0"));
  ASSERT_TRUE(b_->receiver().Cancel("invalid").ok());
  a_->BeginShutdown();
  a_->sender().Start(3, Request(dest), after_shutdown.Callback());
  a_->ProcessDeferred();
  ASSERT_TRUE(after_shutdown.result.has_value());
  EXPECT_THAT(std::string(after_shutdown.result->status().message()),
              HasSubstr("shutting down"));
}

INSTANTIATE_TEST_SUITE_P(Primitives, SenderTest,
                         ::testing::Values(Primitive::kActiveMessage,
                                           Primitive::kPut),
                         [](const auto& info) {
                           return std::string(PrimitiveName(info.param));
                         });

}  // namespace
}  // namespace swaserve::transfer::internal
