// KV transfers between real processes on loopback (shared memory and tcp):
// random page lists and partial windows with every byte verified, several
// senders into one receiver at once, and a peer SIGKILLed mid-transfer —
// the survivor fails within a bounded time and holds nothing afterwards.
#include <signal.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/base/subprocess.h"
#include "lib/transfer/kv_destination.h"
#include "lib/transfer/transfer_engine.h"
#include "tests/integration/transfer/peer_protocol.h"
#include "tests/unit/transfer/transfer_test_util.h"

namespace swaserve::transfer::testing {
namespace {

constexpr uint8_t kCanary = 0xAB;

class MultiProcessTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    auto dir = base::MakeTempDir("transfer_multi_process");
    ASSERT_TRUE(dir.ok()) << dir.status();
    dir_ = *dir;
  }

  void TearDown() override {
    for (auto& [sub, peer] : peers_) {
      (void)WriteFileAtomic(sub + "/done", "");
      if (peer->Running()) (void)peer->Wait(absl::Seconds(5));
    }
    peers_.clear();  // SIGTERM/SIGKILL whatever is left
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }

  // Starts transfer_peer in its own subdirectory; returns that directory.
  std::string StartPeer(const std::string& role, const std::string& name,
                        std::vector<std::string> extra = {}) {
    const std::string sub = absl::StrCat(dir_, "/", name);
    std::filesystem::create_directories(sub);
    base::SubprocessOptions o;
    o.argv = {SWASERVE_TRANSFER_PEER, absl::StrCat("--role=", role),
              absl::StrCat("--dir=", sub), absl::StrCat("--tls=", GetParam()),
              "--idle_exit_ms=30000"};
    o.argv.insert(o.argv.end(), extra.begin(), extra.end());
    o.log_path = sub + "/peer.log";
    o.stop_grace = absl::Seconds(2);
    auto p = base::Subprocess::Start(o);
    EXPECT_TRUE(p.ok()) << p.status();
    if (p.ok()) peers_.emplace_back(sub, *std::move(p));
    return sub;
  }

  base::Subprocess* peer(size_t i) { return peers_[i].second.get(); }

  std::unique_ptr<TransferEngine> Engine(const std::string& name,
                                         uint64_t max_message_bytes = 1 << 20,
                                         int max_inflight = 8) {
    TransferEngineOptions o;
    o.name = name;
    o.ucx_tls = GetParam();
    o.max_message_bytes = max_message_bytes;
    o.max_inflight_messages = max_inflight;
    o.default_timeout = absl::Seconds(20);
    auto e = TransferEngine::Create(o);
    EXPECT_TRUE(e.ok()) << e.status();
    return e.ok() ? *std::move(e) : nullptr;
  }

  std::string dir_;
  std::vector<std::pair<std::string, std::unique_ptr<base::Subprocess>>> peers_;
};

// The parent sends, a child receives and dumps its staging memory, the parent
// compares every byte (written ones and the canary around them).
TEST_P(MultiProcessTest, RandomPageListsAndPartialWindowsEveryByteVerified) {
  auto sender = Engine("sender", 128 << 10, 4);
  ASSERT_NE(sender, nullptr);
  const std::string sub = StartPeer("receiver", "receiver");
  std::mt19937_64 rng(42);
  for (int n = 0; n < 6; ++n) {
    const uint64_t page = 256 + rng() % (200 << 10);
    const int src_pages = 4 + static_cast<int>(rng() % 60);
    const int slots0 = 2 + static_cast<int>(rng() % 60);
    const int slots1 = 2 + static_cast<int>(rng() % 10);
    const uint64_t seed = 1000 + n;
    std::vector<uint8_t> src(src_pages * page);
    FillPattern(src.data(), src.size(), seed);

    // Region 0 ("full"): a random subset of slots from random pages, in
    // random order. Region 1 ("swa"): only its last `used1` slots (the
    // window), from consecutive pages.
    SendSpec send;
    std::vector<int> order(slots0);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    const int used0 = 1 + static_cast<int>(rng() % slots0);
    const int used1 = 1 + static_cast<int>(rng() % slots1);
    for (int i = 0; i < used0; ++i) {
      send.copies.push_back(
          {(rng() % src_pages) * page, 0, order[i] * page, page});
    }
    const uint64_t first = rng() % src_pages;
    for (int i = 0; i < used1; ++i) {
      send.copies.push_back({((first + i) % src_pages) * page, 1,
                             (slots1 - used1 + i) * page, page});
    }
    ExpectSpec expect;
    expect.transfer_id = absl::StrCat("mp-", n);
    expect.region0 = slots0 * page;
    expect.region1 = slots1 * page;
    expect.expected_bytes = (used0 + used1) * page;
    ASSERT_TRUE(WriteFileAtomic(absl::StrCat(sub, "/expect_", n, ".req"),
                                FormatExpect(expect))
                    .ok());
    auto dest_text = WaitForFile(absl::StrCat(sub, "/dest_", n, ".pb"),
                                 absl::Seconds(10), peer(0));
    ASSERT_TRUE(dest_text.ok()) << dest_text.status();
    v1::KvDestination proto;
    ASSERT_TRUE(proto.ParseFromString(*dest_text));
    auto dest = DestinationFromProto(proto);
    ASSERT_TRUE(dest.ok()) << dest.status();

    SendRequest sr;
    sr.destination = *dest;
    for (const SendSpec::Copy& c : send.copies) {
      sr.copies.push_back(
          PageCopy{src.data() + c.src_offset, c.region, c.offset, c.bytes});
    }
    sr.commit_payload = absl::StrCat("commit-", n);
    // Alternate the primitives: the auto choice and forced puts.
    sr.primitive = n % 2 == 0 ? Primitive::kAuto : Primitive::kPut;
    auto sent = sender->SendAndWait(sr);
    ASSERT_TRUE(sent.ok()) << sent.status();
    EXPECT_EQ(sent->bytes, expect.expected_bytes);

    auto result_text = WaitForFile(absl::StrCat(sub, "/result_", n, ".txt"),
                                   absl::Seconds(10), peer(0));
    ASSERT_TRUE(result_text.ok()) << result_text.status();
    auto result = ParseResult(*result_text);
    ASSERT_TRUE(result.ok());
    ASSERT_TRUE(result->status.ok()) << result->status;
    EXPECT_EQ(result->bytes, expect.expected_bytes);
    EXPECT_EQ(result->payload, absl::StrCat("commit-", n));

    auto got = ReadFile(absl::StrCat(sub, "/recv_", n, ".bin"));
    ASSERT_TRUE(got.ok());
    std::string want(expect.gap * 3 + expect.region0 + expect.region1,
                     static_cast<char>(kCanary));
    for (const SendSpec::Copy& c : send.copies) {
      const uint64_t base =
          c.region == 0 ? expect.gap : expect.gap * 2 + expect.region0;
      std::memcpy(want.data() + base + c.offset, src.data() + c.src_offset,
                  c.bytes);
    }
    ASSERT_EQ(got->size(), want.size());
    const auto diff = std::mismatch(want.begin(), want.end(), got->begin());
    EXPECT_EQ(diff.first, want.end())
        << "transfer " << n << ": byte " << (diff.first - want.begin())
        << " differs (page " << page << ", primitive "
        << PrimitiveName(sent->primitive) << ")";
  }
  EngineStats s;
  EXPECT_TRUE(WaitIdle(*sender, absl::Seconds(5), &s)) << StatsString(s);
}

TEST_P(MultiProcessTest, SeveralSendersIntoOneReceiverConcurrently) {
  constexpr int kSenders = 3;
  constexpr uint64_t kPage = 96 << 10;
  constexpr int kPages = 40;
  auto receiver = Engine("receiver");
  ASSERT_NE(receiver, nullptr);
  std::vector<std::string> subs;
  for (int i = 0; i < kSenders; ++i) {
    subs.push_back(StartPeer("sender", absl::StrCat("sender", i),
                             {"--max_message_bytes=262144"}));
  }
  const uint64_t per = kPage * kPages;
  std::vector<uint8_t> staging(kSenders * per, kCanary);
  auto reg = receiver->Register(staging.data(), staging.size());
  ASSERT_TRUE(reg.ok());
  std::vector<Completion<ReceivedTransfer>> received(kSenders);
  for (int i = 0; i < kSenders; ++i) {
    auto dest = receiver->ExpectTransfer(
        ReceiveRequest{absl::StrCat("fan-in-", i),
                       {LocalRegion{reg->get(), i * per, per}},
                       per},
        received[i].Callback());
    ASSERT_TRUE(dest.ok());
    v1::KvDestination proto;
    proto.set_transfer_id(dest->transfer_id);
    proto.set_ucx_worker_address(dest->worker_address);
    auto* r = proto.add_regions();
    r->set_pool(v1::KV_POOL_FULL);
    r->set_base_address(dest->regions[0].base_address);
    r->set_length(dest->regions[0].length);
    r->set_rkey(dest->regions[0].rkey);
    const std::string dest_path = subs[i] + "/dest.pb";
    ASSERT_TRUE(WriteFileAtomic(dest_path, proto.SerializeAsString()).ok());
    // Source page p goes to slot kPages-1-p (reversed).
    SendSpec s;
    s.destination_path = dest_path;
    s.seed = 70 + i;
    s.src_bytes = per;
    s.payload = absl::StrCat("sender-", i);
    for (int p = 0; p < kPages; ++p) {
      s.copies.push_back({p * kPage, 0, (kPages - 1 - p) * kPage, kPage});
    }
    ASSERT_TRUE(WriteFileAtomic(subs[i] + "/send_0.req", FormatSend(s)).ok());
  }
  for (int i = 0; i < kSenders; ++i) {
    auto got = received[i].WaitFor(absl::Seconds(20));
    ASSERT_TRUE(got.has_value()) << "sender " << i << " log:\n"
                                 << peer(i)->ReadLog();
    ASSERT_TRUE(got->ok()) << got->status();
    EXPECT_EQ((*got)->commit_payload, absl::StrCat("sender-", i));
    auto sent =
        WaitForFile(subs[i] + "/sent_0.txt", absl::Seconds(10), peer(i));
    ASSERT_TRUE(sent.ok()) << sent.status();
    auto r = ParseResult(*sent);
    ASSERT_TRUE(r.ok() && r->status.ok()) << *sent;
    for (int p = 0; p < kPages; ++p) {
      const uint8_t* slot = staging.data() + i * per + (kPages - 1 - p) * kPage;
      ASSERT_EQ(FirstPatternMismatch(slot, kPage, 70 + i, p * kPage), -1)
          << "sender " << i << " page " << p;
    }
  }
  EngineStats s;
  EXPECT_TRUE(WaitIdle(*receiver, absl::Seconds(5), &s)) << StatsString(s);
}

// The receiver dies (SIGKILL, by itself, as the first byte lands): the
// sender's transfer fails with Unavailable well before its 20 s deadline,
// and the sender ends with nothing in flight and no endpoint.
TEST_P(MultiProcessTest, ReceiverKilledMidTransferFailsSenderInBoundedTime) {
  // Small messages, one at a time: the transfer takes far longer than the
  // child needs to notice the first byte.
  auto sender = Engine("sender", 16 << 10, 1);
  ASSERT_NE(sender, nullptr);
  const std::string sub =
      StartPeer("receiver", "receiver", {"--die_on_first_byte"});
  constexpr uint64_t kBytes = 64 << 20;
  ExpectSpec expect{"doomed", kBytes, 0, kBytes, 60000, 4096};
  ASSERT_TRUE(
      WriteFileAtomic(sub + "/expect_0.req", FormatExpect(expect)).ok());
  auto dest_text = WaitForFile(sub + "/dest_0.pb", absl::Seconds(10), peer(0));
  ASSERT_TRUE(dest_text.ok()) << dest_text.status();
  v1::KvDestination proto;
  ASSERT_TRUE(proto.ParseFromString(*dest_text));
  auto dest = DestinationFromProto(proto);
  ASSERT_TRUE(dest.ok());
  std::vector<uint8_t> src(kBytes);
  FillPattern(src.data(), src.size(), 3);
  {
    auto reg = sender->Register(src.data(), src.size());
    ASSERT_TRUE(reg.ok());
    SendRequest sr{*dest, {PageCopy{src.data(), 0, 0, kBytes}}, ""};
    sr.timeout = absl::Seconds(20);
    const absl::Time start = absl::Now();
    auto result = sender->SendAndWait(sr);
    const absl::Duration took = absl::Now() - start;
    ASSERT_FALSE(result.ok()) << "the transfer finished before the receiver "
                                 "died; peer log:\n"
                              << peer(0)->ReadLog();
    EXPECT_EQ(result.status().code(), absl::StatusCode::kUnavailable)
        << result.status();
    EXPECT_LT(took, absl::Seconds(8)) << result.status();
    auto exit_code = peer(0)->Wait(absl::Seconds(5));
    ASSERT_TRUE(exit_code.ok());
    EXPECT_EQ(*exit_code, 128 + SIGKILL) << peer(0)->ReadLog();
  }
  EngineStats s;
  EXPECT_TRUE(WaitIdle(*sender, absl::Seconds(5), &s)) << StatsString(s);
  const absl::Time give_up = absl::Now() + absl::Seconds(5);
  while (sender->Stats().endpoints > 0 && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  s = sender->Stats();
  EXPECT_EQ(s.endpoints, 0) << StatsString(s);
  EXPECT_EQ(s.registrations, 0) << StatsString(s);
}

// The sender dies (SIGKILL from here, as soon as its first byte lands in
// our staging memory): the receive fails well before its 20 s deadline and
// the staging memory is released (nothing in flight, registration gone).
TEST_P(MultiProcessTest, SenderKilledMidTransferFailsReceiverInBoundedTime) {
  auto receiver = Engine("receiver");
  ASSERT_NE(receiver, nullptr);
  const std::string sub = StartPeer(
      "sender", "sender", {"--max_message_bytes=16384", "--max_inflight=1"});
  constexpr uint64_t kBytes = 64 << 20;
  std::vector<uint8_t> staging(kBytes, kCanary);
  auto reg = receiver->Register(staging.data(), staging.size());
  ASSERT_TRUE(reg.ok());
  Completion<ReceivedTransfer> received;
  auto dest = receiver->ExpectTransfer(
      ReceiveRequest{"orphaned",
                     {LocalRegion{reg->get(), 0, kBytes}},
                     kBytes,
                     absl::Seconds(20)},
      received.Callback());
  ASSERT_TRUE(dest.ok());
  v1::KvDestination proto;
  proto.set_transfer_id(dest->transfer_id);
  proto.set_ucx_worker_address(dest->worker_address);
  auto* r = proto.add_regions();
  r->set_pool(v1::KV_POOL_FULL);
  r->set_base_address(dest->regions[0].base_address);
  r->set_length(dest->regions[0].length);
  r->set_rkey(dest->regions[0].rkey);
  ASSERT_TRUE(
      WriteFileAtomic(sub + "/dest.pb", proto.SerializeAsString()).ok());
  SendSpec s{sub + "/dest.pb", 9, kBytes, 20000, "", {{0, 0, 0, kBytes}}};
  ASSERT_TRUE(WriteFileAtomic(sub + "/send_0.req", FormatSend(s)).ok());

  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  volatile const uint8_t* p = staging.data();
  while (p[0] == kCanary && absl::Now() < give_up) {
  }
  ASSERT_NE(p[0], kCanary) << "no byte arrived; peer log:\n"
                           << peer(0)->ReadLog();
  ASSERT_TRUE(peer(0)->Signal(SIGKILL).ok());
  const absl::Time killed = absl::Now();
  auto got = received.WaitFor(absl::Seconds(15));
  ASSERT_TRUE(got.has_value()) << "receive still pending 15 s after the kill";
  const absl::Duration took = absl::Now() - killed;
  ASSERT_FALSE(got->ok()) << "completed although the sender was killed";
  EXPECT_EQ(got->status().code(), absl::StatusCode::kUnavailable)
      << got->status();
  EXPECT_LT(took, absl::Seconds(8)) << got->status();
  EngineStats st;
  EXPECT_TRUE(WaitIdle(*receiver, absl::Seconds(5), &st)) << StatsString(st);
  reg->reset();
  st = receiver->Stats();
  EXPECT_EQ(st.registrations, 0) << StatsString(st);
  EXPECT_EQ(st.registered_bytes, 0) << StatsString(st);
}

// A destination whose process has exited: the send fails fast.
TEST_P(MultiProcessTest, SendToExitedProcessFailsFast) {
  auto sender = Engine("sender");
  ASSERT_NE(sender, nullptr);
  const std::string sub = StartPeer("receiver", "receiver");
  ExpectSpec expect{"never", 1 << 20, 0, 1 << 20, 60000, 4096};
  ASSERT_TRUE(
      WriteFileAtomic(sub + "/expect_0.req", FormatExpect(expect)).ok());
  auto dest_text = WaitForFile(sub + "/dest_0.pb", absl::Seconds(10), peer(0));
  ASSERT_TRUE(dest_text.ok()) << dest_text.status();
  ASSERT_TRUE(peer(0)->Signal(SIGKILL).ok());
  ASSERT_TRUE(peer(0)->Wait(absl::Seconds(5)).ok());
  v1::KvDestination proto;
  ASSERT_TRUE(proto.ParseFromString(*dest_text));
  auto dest = DestinationFromProto(proto);
  ASSERT_TRUE(dest.ok());
  std::vector<uint8_t> src(1 << 20);
  SendRequest sr{*dest, {PageCopy{src.data(), 0, 0, src.size()}}, ""};
  sr.timeout = absl::Seconds(20);
  const absl::Time start = absl::Now();
  auto result = sender->SendAndWait(sr);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kUnavailable)
      << result.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(8)) << result.status();
  EngineStats s;
  EXPECT_TRUE(WaitIdle(*sender, absl::Seconds(5), &s)) << StatsString(s);
}

INSTANTIATE_TEST_SUITE_P(Transports, MultiProcessTest,
                         ::testing::Values(std::string(kShmTls),
                                           std::string(kTcpTls)),
                         [](const auto& info) {
                           return info.param == kTcpTls ? std::string("tcp")
                                                        : std::string("shm");
                         });

}  // namespace
}  // namespace swaserve::transfer::testing
