// Asynchronous L2 -> L1 load-back (PrefixCache::BeginLoadBack /
// FinishLoadBack, kv::LoadBackCopier): while the copies are pending the tree
// shows the moved nodes in L1 but holds them (locked, Loading() for every hit
// that covers them, not written to L3), the cache's invariants hold with the
// L2 source pages still allocated, and once finished every byte a hit reads
// is the writer's.
#include "lib/kv/load_back_copier.h"

#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "tests/unit/kv/l3_test_harness.h"

namespace swaserve::kv {
namespace {

using testing::Hashes;

class LoadBackTest : public ::testing::Test, public testing::L3Harness {
 protected:
  void SetUp() override { Init(/*l3=*/nullptr, 0, /*l1_pages=*/16, /*l2_pages=*/16); }
  // Inserts h and pushes it out of L1 into L2.
  void InsertInL2(const Hashes& h) {
    Insert(h);
    cache_->Evict(static_cast<int64_t>(h.size()), 0);
    Check();
    ASSERT_EQ(cache_->Match(h).lower_tier_tokens, static_cast<int>(h.size()) * 4);
  }
};

TEST_F(LoadBackTest, PendingLoadBackShowsL1ButHoldsItsReadersUntilFinished) {
  const Hashes a = H(1, 6);
  InsertInL2(a);
  PendingLoadBack p = cache_->BeginLoadBack(a);
  ASSERT_FALSE(p.empty());
  EXPECT_EQ(p.result.pages, 6);
  EXPECT_EQ(p.result.swa_pages, 2);  // the trailing window went down with it
  EXPECT_EQ(p.copies().size(), 8u);
  EXPECT_EQ(cache_->pending_load_backs(), 1);
  Check();  // the L2 source pages are still allocated, no node's
  EXPECT_EQ(l2_->full().num_cached(), 6);
  const MatchLengths m = cache_->Match(a);
  EXPECT_EQ(m.matched_tokens, 24);
  EXPECT_EQ(m.lower_tier_tokens, 0);
  CacheHit hit = cache_->MatchAndLock(a);
  EXPECT_EQ(hit.tokens(), 24);
  EXPECT_TRUE(cache_->Loading(hit));
  // Pressure on L1 cannot take the moved path meanwhile.
  cache_->Evict(1 << 20, 1 << 20);
  Check();
  EXPECT_EQ(cache_->Match(a).matched_tokens, 24);
  // A prompt sharing a's first 3 pages splits the moved node: a hit through
  // the split-off part is loading too.
  Hashes b(a.begin(), a.begin() + 3);
  const Hashes tail = H(2, 3);
  b.insert(b.end(), tail.begin(), tail.end());
  Insert(b);
  EXPECT_TRUE(cache_->Loading(hit));
  CacheHit prefix = cache_->MatchAndLock(b);
  EXPECT_EQ(prefix.tokens(), 24);
  EXPECT_TRUE(cache_->Loading(prefix));
  p.result.seconds = p.RunCopies();
  cache_->FinishLoadBack(p);
  EXPECT_TRUE(p.empty());
  EXPECT_FALSE(cache_->Loading(hit));
  EXPECT_FALSE(cache_->Loading(prefix));
  EXPECT_EQ(cache_->pending_load_backs(), 0);
  EXPECT_EQ(l2_->full().num_cached(), 0);
  EXPECT_EQ(l2_->full().num_free(), l2_->full().num_pages());
  cache_->Unlock(hit);
  cache_->Unlock(prefix);
  Check();
  EXPECT_EQ(VerifyHit(a), 24);
  EXPECT_EQ(cache_->stats().loaded_back_pages.load(), 6);
}

TEST_F(LoadBackTest, SynchronousLoadBackIsBeginCopyFinish) {
  const Hashes a = H(3, 5);
  InsertInL2(a);
  const LoadBackResult r = cache_->LoadBack(a, INT32_MAX, 0);
  EXPECT_EQ(r.pages, 5);
  EXPECT_GT(r.bytes, 0);
  EXPECT_EQ(cache_->pending_load_backs(), 0);
  Check();
  EXPECT_EQ(VerifyHit(a), 20);
}

TEST_F(LoadBackTest, CopierRunsEveryJobAndHandsItBack) {
  std::vector<Hashes> prompts = {H(4, 3), H(5, 3), H(6, 3)};
  for (const Hashes& h : prompts) InsertInL2(h);
  absl::Mutex mu;
  std::vector<PendingLoadBack> done;
  {
    LoadBackCopier copier([&](PendingLoadBack p) {
      absl::MutexLock lock(&mu);
      done.push_back(std::move(p));
    });
    for (const Hashes& h : prompts) {
      PendingLoadBack p = cache_->BeginLoadBack(h);
      ASSERT_FALSE(p.empty());
      copier.Submit(std::move(p));
    }
    Check();
  }  // the destructor runs what is still queued
  ASSERT_EQ(done.size(), 3u);
  for (PendingLoadBack& p : done) {
    EXPECT_GE(p.result.seconds, 0);
    cache_->FinishLoadBack(p);
  }
  Check();
  for (const Hashes& h : prompts) EXPECT_EQ(VerifyHit(h), 12);
}

}  // namespace
}  // namespace swaserve::kv
