// lib/transfer/receiver.h: the receive state machine fed forged BEGIN, data
// and COMMIT messages (wire.h) on the test thread, the way UCX's handlers
// would call it for eager messages: validation, commit accounting,
// deadlines, the finished tombstone, failures from outside.
#include "lib/transfer/receiver.h"

#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/transfer/engine_state.h"
#include "lib/transfer/ucx_util.h"
#include "lib/transfer/wire.h"
#include "tests/unit/transfer/engine_state_test_util.h"
#include "tests/unit/transfer/transfer_test_util.h"

namespace swaserve::transfer::internal {
namespace {

using testing::FillPattern;
using ::testing::HasSubstr;
using testing::MakeState;
using testing::MappedBuffer;

constexpr uint64_t kSender = 77;
constexpr uint64_t kSendId = 5;
constexpr uint64_t kRegion = 16 << 10;

class ReceiverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TransferEngineOptions options =
        testing::StateOptions("receiver", testing::kShmTls);
    options.finished_linger = absl::Seconds(30);
    state_ = MakeState(options);
    ASSERT_NE(state_, nullptr);
    staging_ =
        std::make_unique<MappedBuffer>(state_.get(), 1, 4 * kRegion, 0xAB);
    ASSERT_TRUE(staging_->ok());
    FillPattern(src_, sizeof(src_), 3);
  }
  void TearDown() override {
    if (state_ != nullptr) {
      EXPECT_TRUE(testing::ShutDown({state_.get()}));
    }
    staging_.reset();
  }
  Receiver& receiver() { return state_->receiver(); }

  // Expects `id`: two regions of kRegion (at staging offsets kRegion and
  // 3 * kRegion), `expected` bytes.
  Destination Expect(const std::string& id, uint64_t expected,
                     absl::Duration timeout = absl::ZeroDuration()) {
    ReceiveRequest r;
    r.transfer_id = id;
    r.regions = {
        LocalRegion{nullptr, kRegion, kRegion, kv::PoolKind::kFull},
        LocalRegion{nullptr, 3 * kRegion, kRegion, kv::PoolKind::kSwa}};
    r.expected_bytes = expected;
    r.timeout = timeout;
    auto dest = receiver().Expect(r, {RegionRef{1, true}, RegionRef{1, true}},
                                  [this](absl::StatusOr<ReceivedTransfer> t) {
                                    outcome_ = std::move(t);
                                    ++callbacks_;
                                  });
    EXPECT_TRUE(dest.ok()) << dest.status();
    return dest.ok() ? *dest : Destination{};
  }
  static uint64_t TagOf(const Destination& d, int region) {
    auto rkey = wire::UnpackRkey(d.regions[region].rkey);
    EXPECT_TRUE(rkey.ok());
    return rkey.ok() ? rkey->tag : 0;
  }
  static std::vector<uint64_t> Tags(const Destination& d) {
    return {TagOf(d, 0), TagOf(d, 1)};
  }
  // An eager data message: `bytes` of src_ at `offset` in `region`.
  ucs_status_t Data(const Destination& d, uint32_t region, uint64_t offset,
                    uint64_t bytes, uint64_t tag = 0) {
    wire::DataHeader h;
    h.sender_engine = kSender;
    h.send_id = kSendId;
    h.rkey_tag = tag != 0 ? tag : TagOf(d, region);
    h.remote_address = d.regions[region].base_address + offset;
    h.length = bytes;
    h.region = region;
    const std::string header = wire::EncodeData(h, d.transfer_id);
    ucp_am_recv_param_t p{};
    return receiver().OnData(header.data(), header.size(), src_, bytes, &p);
  }
  ucs_status_t Commit(const Destination& d, uint64_t am_bytes,
                      std::string payload, std::vector<uint64_t> tags = {}) {
    wire::CommitHeader h;
    h.sender_engine = kSender;
    h.send_id = kSendId;
    h.am_bytes = am_bytes;
    const std::string header =
        wire::EncodeCommit(h, tags.empty() ? Tags(d) : tags, d.transfer_id);
    ucp_am_recv_param_t p{};
    return receiver().OnCommit(header.data(), header.size(), payload.data(),
                               payload.size(), &p);
  }
  void Begin(const Destination& d, std::vector<uint64_t> tags) {
    wire::CommitHeader h;
    h.sender_engine = kSender;
    h.send_id = kSendId;
    const std::string header = wire::EncodeBegin(h, tags, d.transfer_id);
    ucp_am_recv_param_t p{};
    receiver().OnBegin(header.data(), header.size(), &p);
  }

  std::unique_ptr<EngineState> state_;
  std::unique_ptr<MappedBuffer> staging_;
  uint8_t src_[kRegion];
  std::optional<absl::StatusOr<ReceivedTransfer>> outcome_;
  int callbacks_ = 0;
};

TEST_F(ReceiverTest, DestinationNamesTheRegionsWithFreshTags) {
  const Destination d = Expect("dest", 2 * kRegion);
  EXPECT_EQ(d.worker_address, state_->address());
  ASSERT_EQ(d.regions.size(), 2u);
  EXPECT_EQ(d.regions[0].base_address,
            reinterpret_cast<uint64_t>(staging_->data() + kRegion));
  EXPECT_EQ(d.regions[1].base_address,
            reinterpret_cast<uint64_t>(staging_->data() + 3 * kRegion));
  EXPECT_EQ(d.regions[1].pool, kv::PoolKind::kSwa);
  const std::vector<uint64_t> tags = Tags(d);
  EXPECT_NE(tags[0], 0u);
  EXPECT_NE(tags[0], tags[1]);
  EXPECT_EQ(state_->registrations().Find(1)->users, 2);
  EXPECT_EQ(receiver().pending(), 1);
  EXPECT_EQ(receiver().started(), 0);
  // Another transfer over the same memory gets other tags.
  const Destination other = Expect("other", 0);
  EXPECT_NE(TagOf(other, 0), tags[0]);
  auto dup = receiver().Expect(ReceiveRequest{"dest", {}, 0},
                               std::vector<RegionRef>{}, nullptr);
  EXPECT_TRUE(absl::IsAlreadyExists(dup.status())) << dup.status();
  EXPECT_THAT(std::string(dup.status().message()),
              HasSubstr("already pending"));
  ReceiveRequest foreign;
  foreign.transfer_id = "foreign";
  foreign.regions = {LocalRegion{nullptr, 0, 16}};
  EXPECT_TRUE(absl::IsInvalidArgument(
      receiver().Expect(foreign, {RegionRef{1, false}}, nullptr).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      receiver().Expect(foreign, {RegionRef{99, true}}, nullptr).status()));
}

TEST_F(ReceiverTest, DataThenCommitCompletesWithThePayload) {
  const Destination d = Expect("ok", kRegion + 4096);
  EXPECT_EQ(Data(d, 0, 0, kRegion), UCS_OK);
  EXPECT_EQ(Data(d, 1, 8192, 4096), UCS_OK);
  const ReceiveState* r = receiver().Find("ok");
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->received, kRegion + 4096);
  EXPECT_TRUE(r->started);
  EXPECT_TRUE(r->senders.contains(kSender));
  EXPECT_EQ(receiver().started(), 1);
  EXPECT_EQ(std::memcmp(staging_->data() + kRegion, src_, kRegion), 0);
  EXPECT_EQ(std::memcmp(staging_->data() + 3 * kRegion + 8192, src_, 4096), 0);
  EXPECT_EQ(staging_->data()[3 * kRegion + 8191], 0xAB);  // untouched
  EXPECT_EQ(Commit(d, kRegion + 4096, "first token"), UCS_OK);
  EXPECT_EQ(callbacks_, 0);  // runs when the loop checks the receive
  receiver().CheckDirty();
  ASSERT_EQ(callbacks_, 1);
  ASSERT_TRUE(outcome_->ok()) << outcome_->status();
  EXPECT_EQ((*outcome_)->bytes, kRegion + 4096);
  EXPECT_EQ((*outcome_)->commit_payload, "first token");
  EXPECT_EQ((*outcome_)->transfer_id, "ok");
  EXPECT_EQ(receiver().pending(), 0);
  EXPECT_EQ(receiver().started(), 0);
  EXPECT_EQ(state_->registrations().Find(1)->users, 0);
  // The ACK is queued for the sender.
  EXPECT_TRUE(receiver().HasPendingWork());
  receiver().SendPendingReplies();  // no endpoint back: logged, dropped
  EXPECT_FALSE(receiver().HasPendingWork());
}

TEST_F(ReceiverTest, FinishedTransferLingersThenIsForgotten) {
  const Destination d = Expect("linger", 4096);
  ASSERT_EQ(Data(d, 0, 0, 4096), UCS_OK);
  ASSERT_EQ(Commit(d, 4096, ""), UCS_OK);
  receiver().CheckDirty();
  ASSERT_EQ(callbacks_, 1);
  const ReceiveState* r = receiver().Find("linger");
  ASSERT_NE(r, nullptr);
  EXPECT_TRUE(r->finished);
  EXPECT_TRUE(r->outcome.ok());
  // Late data and a second commit are answered, change nothing.
  EXPECT_EQ(Data(d, 0, 4096, 4096), UCS_OK);
  EXPECT_EQ(Commit(d, 4096, ""), UCS_OK);
  EXPECT_EQ(staging_->data()[kRegion + 4096], 0xAB);
  receiver().CheckDirty();
  EXPECT_EQ(callbacks_, 1);
  auto again = receiver().Expect(ReceiveRequest{"linger", {}, 0},
                                 std::vector<RegionRef>{}, nullptr);
  EXPECT_THAT(std::string(again.status().message()),
              HasSubstr("recently finished"));
  const int64_t linger = DurationNanos(absl::Seconds(30));
  receiver().CheckDeadlines(r->linger_until_ns - 1);
  ASSERT_NE(receiver().Find("linger"), nullptr);
  receiver().CheckDeadlines(NowNanos() + linger + 1);
  EXPECT_EQ(receiver().Find("linger"), nullptr);
  EXPECT_EQ(receiver().Cancel("linger").code(), absl::StatusCode::kNotFound);
}

TEST_F(ReceiverTest, RejectedDataFailsTheTransfer) {
  struct Case {
    const char* id;
    uint32_t region;
    uint64_t offset, bytes, tag;
    const char* says;
  } cases[] = {
      {"tag", 0, 0, 4096, 12345, "tag mismatch"},
      {"outside", 0, kRegion - 4096, 8192, 0, "outside region 0"},
  };
  for (const Case& c : cases) {
    outcome_.reset();
    const Destination d = Expect(c.id, 8192);
    EXPECT_EQ(Data(d, c.region, c.offset, c.bytes, c.tag), UCS_OK);
    const ReceiveState* r = receiver().Find(c.id);
    ASSERT_TRUE(r->failed) << c.id;
    EXPECT_EQ(r->reason, Reason::kRejected);
    EXPECT_EQ(r->received, 0u);
    receiver().CheckDirty();
    ASSERT_TRUE(outcome_.has_value()) << c.id;
    EXPECT_TRUE(absl::IsInvalidArgument(outcome_->status()));
    EXPECT_THAT(std::string(outcome_->status().message()), HasSubstr(c.says));
  }
  EXPECT_EQ(staging_->data()[kRegion], 0xAB);
  EXPECT_EQ(staging_->data()[2 * kRegion - 1], 0xAB);
  // A region index out of range.
  const Destination d = Expect("region", 8192);
  wire::DataHeader h;
  h.sender_engine = kSender;
  h.rkey_tag = TagOf(d, 0);
  h.remote_address = d.regions[0].base_address;
  h.length = 16;
  h.region = 2;
  const std::string header = wire::EncodeData(h, "region");
  ucp_am_recv_param_t p{};
  receiver().OnData(header.data(), header.size(), src_, 16, &p);
  EXPECT_THAT(receiver().Find("region")->error.message(),
              HasSubstr("names region 2"));
  // Data for an unknown transfer: only answered.
  outcome_.reset();
  Destination unknown = d;
  unknown.transfer_id = "nobody";
  EXPECT_EQ(Data(unknown, 0, 0, 16), UCS_OK);
  EXPECT_EQ(receiver().Find("nobody"), nullptr);
}

TEST_F(ReceiverTest, CommitAccountingMustMatch) {
  const Destination short_total = Expect("short", 8192);
  ASSERT_EQ(Data(short_total, 0, 0, 4096), UCS_OK);
  ASSERT_EQ(Commit(short_total, 4096, ""), UCS_OK);
  receiver().CheckDirty();
  ASSERT_TRUE(outcome_.has_value());
  EXPECT_TRUE(absl::IsFailedPrecondition(outcome_->status()));
  EXPECT_THAT(std::string(outcome_->status().message()),
              HasSubstr("wrote 4096 bytes but the receiver expects 8192"));

  outcome_.reset();
  const Destination missing = Expect("missing", 8192);
  ASSERT_EQ(Data(missing, 0, 0, 4096), UCS_OK);
  ASSERT_EQ(Commit(missing, 8192, ""), UCS_OK);
  receiver().CheckDirty();
  ASSERT_TRUE(outcome_.has_value());
  EXPECT_THAT(std::string(outcome_->status().message()),
              HasSubstr("committed 8192 bytes of data messages but 4096"));

  outcome_.reset();
  const Destination foreign = Expect("foreign", 0);
  ASSERT_EQ(Commit(foreign, 0, "", {1, 2}), UCS_OK);
  const ReceiveState* r = receiver().Find("foreign");
  EXPECT_TRUE(r->failed);
  EXPECT_TRUE(r->committed);  // so that the error is acknowledged
  receiver().CheckDirty();
  ASSERT_TRUE(outcome_.has_value());
  EXPECT_THAT(std::string(outcome_->status().message()),
              HasSubstr("do not belong to this transfer"));
}

TEST_F(ReceiverTest, BeginChecksTheTagsBeforeAnyPut) {
  const Destination good = Expect("good", 0);
  Begin(good, Tags(good));
  const ReceiveState* r = receiver().Find("good");
  EXPECT_FALSE(r->failed);
  EXPECT_TRUE(r->started);
  EXPECT_EQ(receiver().started(), 1);
  EXPECT_TRUE(receiver().HasPendingWork());  // READY queued

  const Destination bad = Expect("bad", 0);
  Begin(bad, {Tags(bad)[0], Tags(good)[1]});
  EXPECT_TRUE(receiver().Find("bad")->failed);
  EXPECT_EQ(receiver().Find("bad")->reason, Reason::kRejected);
  EXPECT_FALSE(receiver().Find("bad")->started);
  receiver().SendPendingReplies();
  ASSERT_TRUE(receiver().Cancel("good").ok());
  receiver().CheckDirty();
}

TEST_F(ReceiverTest, DeadlineFailsAndSetsTheNextOne) {
  const Destination fast = Expect("fast", 4096, absl::Milliseconds(50));
  const Destination slow = Expect("slow", 4096, absl::Seconds(20));
  state_->context().next_deadline_ns = std::numeric_limits<int64_t>::max();
  receiver().CheckDeadlines(NowNanos());
  EXPECT_EQ(state_->context().next_deadline_ns,
            receiver().Find("fast")->deadline_ns);
  state_->context().next_deadline_ns = std::numeric_limits<int64_t>::max();
  receiver().CheckDeadlines(receiver().Find("fast")->deadline_ns);
  EXPECT_TRUE(receiver().Find("fast")->failed);
  EXPECT_EQ(receiver().Find("fast")->reason, Reason::kTimeout);
  EXPECT_FALSE(receiver().Find("slow")->failed);
  EXPECT_EQ(state_->context().next_deadline_ns,
            receiver().Find("slow")->deadline_ns);
  receiver().CheckDirty();
  ASSERT_EQ(callbacks_, 1);
  EXPECT_TRUE(absl::IsDeadlineExceeded(outcome_->status()));
  EXPECT_THAT(std::string(outcome_->status().message()),
              HasSubstr("was not committed within"));
  ASSERT_TRUE(receiver().Cancel("slow").ok());
  receiver().CheckDirty();
  EXPECT_EQ(callbacks_, 2);
  EXPECT_TRUE(absl::IsCancelled(outcome_->status()));
}

TEST_F(ReceiverTest, ClosedSenderAndReleasedMemoryFailReceives) {
  const Destination from_sender = Expect("from-sender", 8192);
  const Destination other = Expect("other", 8192);
  ASSERT_EQ(Data(from_sender, 0, 0, 4096), UCS_OK);
  // A cancelled close (a replaced endpoint) fails nothing.
  receiver().OnSenderClosed(kSender, nullptr, absl::CancelledError("new ep"));
  EXPECT_FALSE(receiver().Find("from-sender")->failed);
  receiver().OnSenderClosed(kSender + 1, nullptr,
                            absl::UnavailableError("someone else"));
  EXPECT_FALSE(receiver().Find("from-sender")->failed);
  receiver().OnSenderClosed(kSender, nullptr,
                            absl::UnavailableError("sender died"));
  EXPECT_TRUE(receiver().Find("from-sender")->failed);
  EXPECT_EQ(receiver().Find("from-sender")->reason, Reason::kPeerFailure);
  EXPECT_FALSE(receiver().Find("other")->failed);  // never heard from it
  receiver().CheckDirty();
  ASSERT_TRUE(outcome_.has_value());
  EXPECT_THAT(std::string(outcome_->status().message()),
              HasSubstr("sender died"));
  receiver().FailReceivesUsing(1, absl::CancelledError("released"));
  EXPECT_EQ(receiver().Find("other")->reason, Reason::kCancelled);
  receiver().CheckDirty();
  EXPECT_EQ(callbacks_, 2);
  EXPECT_EQ(receiver().pending(), 0);
}

TEST_F(ReceiverTest, ValidateChecksTheRequestAlone) {
  ReceiveRequest r;
  r.transfer_id = "";
  EXPECT_THAT(std::string(Receiver::Validate(r).message()),
              HasSubstr("transfer id must be 1..128 bytes"));
  r.transfer_id = std::string(129, 'x');
  EXPECT_TRUE(absl::IsInvalidArgument(Receiver::Validate(r)));
  r.transfer_id = "v";
  EXPECT_THAT(std::string(Receiver::Validate(r).message()),
              HasSubstr("0 regions"));
  r.regions.resize(9);
  EXPECT_THAT(std::string(Receiver::Validate(r).message()),
              HasSubstr("9 regions"));
  r.regions.resize(1);
  EXPECT_THAT(std::string(Receiver::Validate(r).message()),
              HasSubstr("has no registration"));
}

TEST_F(ReceiverTest, ShutdownCancelsPendingAndRefusesNew) {
  Expect("pending", 8192);
  receiver().FailAll(absl::CancelledError("shutting down"));
  receiver().CheckDirty();
  ASSERT_TRUE(outcome_.has_value());
  EXPECT_TRUE(absl::IsCancelled(outcome_->status()));
  state_->context().shutting_down = true;
  auto refused = receiver().Expect(ReceiveRequest{"new", {}, 0},
                                   std::vector<RegionRef>{}, nullptr);
  EXPECT_TRUE(absl::IsFailedPrecondition(refused.status()));
  state_->context().shutting_down = false;
}

}  // namespace
}  // namespace swaserve::transfer::internal
