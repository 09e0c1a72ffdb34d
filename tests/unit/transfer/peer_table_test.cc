// lib/transfer/peer_table.h with real UCP workers in one process (driven by
// the test thread): endpoint reuse, HELLO -> endpoint back, the rkey
// cache's trimming, liveness of peer processes, closing.
#include "lib/transfer/peer_table.h"

#include <sys/wait.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/transfer/engine_state.h"
#include "lib/transfer/process_identity.h"
#include "tests/unit/transfer/engine_state_test_util.h"
#include "tests/unit/transfer/transfer_test_util.h"

namespace swaserve::transfer::internal {
namespace {

using testing::DriveUntil;
using ::testing::HasSubstr;

struct RecordingObserver : PeerTable::Observer {
  void OnPeerClosing(Peer& peer, const absl::Status& why) override {
    peers.push_back(peer.engine_id);
    statuses.push_back(why);
  }
  void OnBackEpClosing(const BackEp& back, ucp_ep_h ep,
                       const absl::Status& why) override {
    backs.push_back(back.engine_id);
    statuses.push_back(why);
    EXPECT_EQ(back.ep, nullptr);  // cleared before the observer runs
    EXPECT_NE(ep, nullptr);
  }
  std::vector<uint64_t> peers;
  std::vector<uint64_t> backs;
  std::vector<absl::Status> statuses;
};

// The identity of a process that has exited (a reaped child).
wire::ProcessIdentity DeadProcess() {
  wire::ProcessIdentity id = SelfIdentity();
  const pid_t pid = fork();
  if (pid == 0) _exit(0);
  char state = 0;
  ReadProcStat(static_cast<uint64_t>(pid), &state, &id.start_time);
  waitpid(pid, nullptr, 0);
  id.pid = static_cast<uint64_t>(pid);
  return id;
}

class PeerTableTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(testing::MakeTwoStates(&a_, &b_));
    // A table of its own on a's worker, so the test observes the closes.
    table_ = std::make_unique<PeerTable>(&a_->context(), &observer_);
  }
  void TearDown() override {
    if (table_ != nullptr) {
      // Close what the test left open and let the closes complete before
      // the table goes.
      table_->CloseAll(absl::CancelledError("test over"));
      // a's own parts send nothing here: every request of a is the table's.
      EXPECT_TRUE(DriveUntil({a_.get(), b_.get()}, [&] {
        return table_->closing_endpoints() == 0 &&
               a_->context().requests.inflight() == 0;
      }));
      table_.reset();
    }
    EXPECT_TRUE(testing::ShutDown(both()));
  }
  std::vector<EngineState*> both() { return {a_.get(), b_.get()}; }

  std::unique_ptr<EngineState> a_;
  std::unique_ptr<EngineState> b_;
  RecordingObserver observer_;
  std::unique_ptr<PeerTable> table_;
};

TEST_F(PeerTableTest, ReusesTheEndpointAndTheReceiverOpensOneBack) {
  auto p1 = table_->GetPeer(b_->address());
  ASSERT_TRUE(p1.ok()) << p1.status();
  auto p2 = table_->GetPeer(b_->address());
  ASSERT_TRUE(p2.ok());
  EXPECT_EQ(p1->get(), p2->get());
  EXPECT_EQ((*p1)->engine_id, b_->context().engine_id);
  EXPECT_EQ((*p1)->transport, Transport::kSharedMemory);
  EXPECT_EQ(table_->endpoints(), 1);
  EXPECT_EQ(table_->PeerWithEp((*p1)->ep), *p1);
  EXPECT_EQ(table_->PeerWithEp(nullptr), nullptr);
  // The HELLO makes b open an endpoint back to a.
  const uint64_t a_engine = a_->context().engine_id;
  ASSERT_TRUE(DriveUntil(
      both(), [&] { return b_->peers().FindBackEp(a_engine) != nullptr; }));
  std::shared_ptr<BackEp> back = b_->peers().FindBackEp(a_engine);
  EXPECT_EQ(back->process.pid, a_->context().self_process.pid);
  EXPECT_EQ(b_->peers().BackEpWithEp(back->ep), back);
  EXPECT_EQ(b_->peers().endpoints(), 1);
}

TEST_F(PeerTableTest, MalformedAddressIsInvalid) {
  std::string blob = b_->address();
  blob[blob.size() / 2] ^= 0x40;
  auto peer = table_->GetPeer(blob);
  EXPECT_TRUE(absl::IsInvalidArgument(peer.status())) << peer.status();
  EXPECT_EQ(table_->endpoints(), 0);
}

TEST_F(PeerTableTest, RkeyCacheKeepsTheMostRecentUnusedOnes) {
  // UCX-allocated memory: each registration's packed rkey names its own
  // segment (those of ordinary memory may all pack alike over posix/sysv).
  std::vector<std::string> keys;
  for (uint64_t id = 1; id <= 6; ++id) {
    ASSERT_TRUE(b_->Register(id, nullptr, 8192, /*allocate=*/true).ok());
    keys.push_back(b_->registrations().Find(id)->ucx_rkey);
  }
  for (size_t i = 1; i < keys.size(); ++i) ASSERT_NE(keys[i], keys[0]);
  auto peer = table_->GetPeer(b_->address());
  ASSERT_TRUE(peer.ok());
  Peer& p = **peer;
  std::vector<ucp_rkey_h> handles;
  for (const std::string& key : keys) {
    ucp_rkey_h h = nullptr;
    ASSERT_EQ(table_->AcquireRkey(p, key, &h), UCS_OK);
    ASSERT_NE(h, nullptr);
    handles.push_back(h);
  }
  // The same key again: the cached handle, one more user, used last.
  ucp_rkey_h again = nullptr;
  ASSERT_EQ(table_->AcquireRkey(p, keys[0], &again), UCS_OK);
  EXPECT_EQ(again, handles[0]);
  EXPECT_EQ(p.rkeys.size(), 6u);
  EXPECT_EQ(p.rkeys[keys[0]].users, 2);
  // All in use: nothing to evict.
  table_->TrimRkeyCache(p);
  EXPECT_EQ(p.rkeys.size(), 6u);
  for (const std::string& key : keys) table_->ReleaseRkey(p, key);
  table_->ReleaseRkey(p, keys[0]);
  table_->ReleaseRkey(p, "not cached");  // no-op
  table_->TrimRkeyCache(p);
  // Keys 1 and 2 (indices 1, 2) were used least recently.
  ASSERT_EQ(p.rkeys.size(), PeerTable::kRkeyCacheSize);
  EXPECT_TRUE(p.rkeys.contains(keys[0]));
  EXPECT_FALSE(p.rkeys.contains(keys[1]));
  EXPECT_FALSE(p.rkeys.contains(keys[2]));
  for (int i : {3, 4, 5}) EXPECT_TRUE(p.rkeys.contains(keys[i])) << i;
  // An evicted key is unpacked again when needed; in use, it stays and the
  // least recently used unused one goes instead.
  ucp_rkey_h h1 = nullptr;
  ASSERT_EQ(table_->AcquireRkey(p, keys[1], &h1), UCS_OK);
  table_->TrimRkeyCache(p);
  ASSERT_EQ(p.rkeys.size(), PeerTable::kRkeyCacheSize);
  EXPECT_TRUE(p.rkeys.contains(keys[1]));
  EXPECT_FALSE(p.rkeys.contains(keys[3]));
  // A closing peer keeps only the rkeys in use.
  table_->ClosePeer(*peer, absl::UnavailableError("gone"));
  EXPECT_TRUE(p.closing);
  EXPECT_EQ(p.ep, nullptr);
  ASSERT_EQ(p.rkeys.size(), 1u);
  EXPECT_TRUE(p.rkeys.contains(keys[1]));
  table_->ReleaseRkey(p, keys[1]);
  table_->TrimRkeyCache(p);
  EXPECT_TRUE(p.rkeys.empty());
}

TEST_F(PeerTableTest, ClosePeerTellsTheObserverOnceAndCompletes) {
  auto peer = table_->GetPeer(b_->address());
  ASSERT_TRUE(peer.ok());
  table_->ClosePeer(*peer, absl::UnavailableError("test close"));
  table_->ClosePeer(*peer, absl::UnavailableError("again"));  // idempotent
  ASSERT_EQ(observer_.peers.size(), 1u);
  EXPECT_EQ(observer_.peers[0], b_->context().engine_id);
  EXPECT_EQ(observer_.statuses[0].message(), "test close");
  // Out of the table: the next GetPeer opens a new endpoint.
  auto fresh = table_->GetPeer(b_->address());
  ASSERT_TRUE(fresh.ok());
  EXPECT_NE(fresh->get(), peer->get());
  ASSERT_TRUE(
      DriveUntil(both(), [&] { return table_->closing_endpoints() == 0; }));
  EXPECT_EQ(table_->endpoints(), 1);
}

TEST_F(PeerTableTest, LivenessClosesEndpointsOfExitedProcesses) {
  absl::StatusOr<wire::WorkerAddress> b_address =
      wire::UnpackWorkerAddress(b_->address());
  ASSERT_TRUE(b_address.ok());
  wire::WorkerAddress dead = *b_address;
  dead.process = DeadProcess();
  dead.engine_id = 42;
  auto peer = table_->GetPeer(wire::PackWorkerAddress(dead));
  ASSERT_TRUE(peer.ok()) << peer.status();
  wire::WorkerAddress dead_sender = dead;
  dead_sender.engine_id = 43;
  table_->OpenBackEp(dead_sender);
  ASSERT_NE(table_->FindBackEp(43), nullptr);
  auto live = table_->GetPeer(b_->address());  // b's process: this one
  ASSERT_TRUE(live.ok());
  EXPECT_EQ(table_->endpoints(), 3);

  table_->CheckLiveness();
  EXPECT_EQ(observer_.peers, std::vector<uint64_t>{42});
  EXPECT_EQ(observer_.backs, std::vector<uint64_t>{43});
  ASSERT_EQ(observer_.statuses.size(), 2u);
  for (const absl::Status& s : observer_.statuses) {
    EXPECT_TRUE(absl::IsUnavailable(s)) << s;
    EXPECT_THAT(std::string(s.message()),
                HasSubstr(absl::StrCat("(pid ", dead.process.pid, ")")));
  }
  EXPECT_TRUE((*peer)->closing);
  EXPECT_EQ(table_->FindBackEp(43), nullptr);
  EXPECT_FALSE((*live)->closing);
}

TEST_F(PeerTableTest, ASecondHelloReplacesTheEndpointBack) {
  absl::StatusOr<wire::WorkerAddress> b_address =
      wire::UnpackWorkerAddress(b_->address());
  ASSERT_TRUE(b_address.ok());
  table_->OpenBackEp(*b_address);
  std::shared_ptr<BackEp> first = table_->FindBackEp(b_address->engine_id);
  ASSERT_NE(first, nullptr);
  table_->OpenBackEp(*b_address);
  std::shared_ptr<BackEp> second = table_->FindBackEp(b_address->engine_id);
  ASSERT_NE(second, nullptr);
  EXPECT_NE(first, second);
  EXPECT_TRUE(first->closing);
  ASSERT_EQ(observer_.backs.size(), 1u);
  EXPECT_TRUE(absl::IsCancelled(observer_.statuses[0]));
  // None once shutting down.
  a_->context().shutting_down = true;
  table_->CloseBackEp(second, absl::CancelledError("x"));
  table_->OpenBackEp(*b_address);
  EXPECT_EQ(table_->FindBackEp(b_address->engine_id), nullptr);
  a_->context().shutting_down = false;
}

}  // namespace
}  // namespace swaserve::transfer::internal
