#include "lib/cluster/cache_event_queue.h"

#include <random>
#include <set>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace swaserve::cluster {
namespace {

using Kind = CacheEventOp::Kind;
using ::testing::ElementsAre;

std::vector<uint64_t> Range(uint64_t begin, uint64_t end) {
  std::vector<uint64_t> v;
  for (uint64_t i = begin; i < end; ++i) v.push_back(i);
  return v;
}

TEST(CacheEventQueue, CoalescesSameKindAndKeepsOrder) {
  CacheEventQueue q(100);
  q.Push(Kind::kStored, {1, 2});
  q.Push(Kind::kStored, {3});
  q.Push(Kind::kRemoved, {2});
  q.Push(Kind::kStored, {2});
  q.Push(Kind::kStored, {});  // ignored
  EXPECT_EQ(q.queued_ops(), 3u);
  EXPECT_EQ(q.queued_hashes(), 5u);
  std::vector<CacheEventOp> batch = q.TakeBatch(100);
  EXPECT_THAT(batch, ElementsAre(CacheEventOp{Kind::kStored, {1, 2, 3}},
                                 CacheEventOp{Kind::kRemoved, {2}},
                                 CacheEventOp{Kind::kStored, {2}}));
  EXPECT_TRUE(q.empty());
  EXPECT_EQ(q.queued_hashes(), 0u);
  EXPECT_TRUE(q.TakeBatch(100).empty());
}

TEST(CacheEventQueue, TakeBatchSplitsAtTheLimit) {
  CacheEventQueue q(100);
  q.Push(Kind::kStored, {1, 2, 3});
  q.Push(Kind::kRemoved, {4, 5, 6});
  EXPECT_THAT(q.TakeBatch(4),
              ElementsAre(CacheEventOp{Kind::kStored, {1, 2, 3}},
                          CacheEventOp{Kind::kRemoved, {4}}));
  EXPECT_EQ(q.queued_hashes(), 2u);
  EXPECT_THAT(q.TakeBatch(1), ElementsAre(CacheEventOp{Kind::kRemoved, {5}}));
  EXPECT_THAT(q.TakeBatch(10), ElementsAre(CacheEventOp{Kind::kRemoved, {6}}));
}

TEST(CacheEventQueue, LargePushesAreSplitIntoBoundedOps) {
  CacheEventQueue q(1 << 20);
  const size_t n = CacheEventQueue::kMaxOpHashes * 2 + 10;
  q.Push(Kind::kStored, Range(0, n));
  EXPECT_EQ(q.queued_ops(), 3u);
  EXPECT_EQ(q.queued_hashes(), n);
  std::vector<CacheEventOp> batch = q.TakeBatch(n);
  std::vector<uint64_t> all;
  for (const CacheEventOp& op : batch) {
    EXPECT_EQ(op.kind, Kind::kStored);
    EXPECT_LE(op.hashes.size(), CacheEventQueue::kMaxOpHashes);
    all.insert(all.end(), op.hashes.begin(), op.hashes.end());
  }
  EXPECT_EQ(all, Range(0, n));
}

TEST(CacheEventQueue, BoundDropsOldestAndCounts) {
  CacheEventQueue q(5);
  q.Push(Kind::kStored, {1, 2, 3});
  q.Push(Kind::kRemoved, {4, 5});
  EXPECT_EQ(q.dropped_hashes(), 0u);
  q.Push(Kind::kStored, {6, 7, 8});
  EXPECT_EQ(q.queued_hashes(), 5u);
  EXPECT_EQ(q.dropped_hashes(), 3u);
  // The index is rebuilt from what was kept: a clear comes first.
  EXPECT_THAT(q.TakeBatch(100),
              ElementsAre(CacheEventOp{Kind::kCleared, {}},
                          CacheEventOp{Kind::kRemoved, {4, 5}},
                          CacheEventOp{Kind::kStored, {6, 7, 8}}));
  // A push bigger than the bound keeps only its newest hashes.
  q.Push(Kind::kStored, Range(100, 112));
  EXPECT_EQ(q.dropped_hashes(), 10u);
  EXPECT_THAT(q.TakeBatch(100),
              ElementsAre(CacheEventOp{Kind::kCleared, {}},
                          CacheEventOp{Kind::kStored, Range(107, 112)}));
}

TEST(CacheEventQueue, ClearSupersedesWhatWasQueuedAndIsNeverDropped) {
  CacheEventQueue q(3);
  q.Push(Kind::kStored, {1, 2});
  q.PushCleared();
  EXPECT_EQ(q.dropped_hashes(), 0u);  // superseded, not lost
  q.Push(Kind::kStored, {3, 4, 5, 6});
  EXPECT_EQ(q.dropped_hashes(), 1u);
  EXPECT_THAT(q.TakeBatch(100),
              ElementsAre(CacheEventOp{Kind::kCleared, {}},
                          CacheEventOp{Kind::kStored, {4, 5, 6}}));
  // Push(kCleared) is PushCleared.
  q.Push(Kind::kStored, {9});
  q.Push(Kind::kCleared, {});
  EXPECT_THAT(q.TakeBatch(100), ElementsAre(CacheEventOp{Kind::kCleared, {}}));
}

TEST(CacheEventQueue, RequeuePutsAFailedBatchBackFirst) {
  CacheEventQueue q(100);
  q.Push(Kind::kStored, {1, 2});
  q.Push(Kind::kRemoved, {1});
  std::vector<CacheEventOp> batch = q.TakeBatch(100);
  q.Push(Kind::kRemoved, {2});
  q.Push(Kind::kStored, {3});
  q.Requeue(batch);
  EXPECT_EQ(q.queued_hashes(), 5u);
  EXPECT_THAT(q.TakeBatch(100), ElementsAre(CacheEventOp{Kind::kStored, {1, 2}},
                                            CacheEventOp{Kind::kRemoved, {1}},
                                            CacheEventOp{Kind::kRemoved, {2}},
                                            CacheEventOp{Kind::kStored, {3}}));
}

TEST(CacheEventQueue, RequeueAppliesTheBoundToTheOldest) {
  CacheEventQueue q(4);
  q.Push(Kind::kStored, {1, 2, 3});
  std::vector<CacheEventOp> batch = q.TakeBatch(100);
  q.Push(Kind::kRemoved, {7, 8});
  q.Requeue(batch);
  EXPECT_EQ(q.dropped_hashes(), 1u);
  EXPECT_THAT(q.TakeBatch(100),
              ElementsAre(CacheEventOp{Kind::kCleared, {}},
                          CacheEventOp{Kind::kStored, {2, 3}},
                          CacheEventOp{Kind::kRemoved, {7, 8}}));
}

TEST(CacheEventQueue, RequeueAfterAClearIsDiscarded) {
  CacheEventQueue q(100);
  q.Push(Kind::kStored, {1, 2});
  std::vector<CacheEventOp> batch = q.TakeBatch(100);
  q.PushCleared();
  q.Push(Kind::kStored, {5});
  q.Requeue(batch);
  EXPECT_EQ(q.dropped_hashes(), 0u);
  EXPECT_THAT(q.TakeBatch(100), ElementsAre(CacheEventOp{Kind::kCleared, {}},
                                            CacheEventOp{Kind::kStored, {5}}));
}

// The set of hashes the index would hold after applying `ops` in order.
void Apply(const std::vector<CacheEventOp>& ops, std::set<uint64_t>* index) {
  for (const CacheEventOp& op : ops) {
    switch (op.kind) {
      case Kind::kStored:
        index->insert(op.hashes.begin(), op.hashes.end());
        break;
      case Kind::kRemoved:
        for (uint64_t h : op.hashes) index->erase(h);
        break;
      case Kind::kCleared:
        index->clear();
        break;
      case Kind::kSwaRemoved:
      case Kind::kSwaStored:
      case Kind::kTierDown:
      case Kind::kTierUp:
        break;  // full-KV membership unchanged
    }
  }
}

// Random pushes, partial takes and failed writes (requeue, then later
// replay): as long as nothing is dropped, the index built from the delivered
// batches equals the one built from the events directly — including the
// replays of batches that were "half applied" before failing.
TEST(CacheEventQueue, RandomizedDeliveryMatchesDirectApplication) {
  std::mt19937_64 rng(42);
  for (int round = 0; round < 200; ++round) {
    CacheEventQueue q(1 << 20);
    std::set<uint64_t> direct, delivered;
    for (int step = 0; step < 200; ++step) {
      const int what = static_cast<int>(rng() % 10);
      if (what < 6) {
        const Kind kind = (rng() % 3 == 0) ? Kind::kRemoved : Kind::kStored;
        std::vector<uint64_t> hashes;
        const int n = 1 + static_cast<int>(rng() % 5);
        for (int i = 0; i < n; ++i) hashes.push_back(rng() % 20);
        q.Push(kind, hashes);
        Apply({CacheEventOp{kind, hashes}}, &direct);
      } else if (what == 6) {
        q.PushCleared();
        direct.clear();
      } else {
        std::vector<CacheEventOp> batch = q.TakeBatch(1 + rng() % 8);
        if (rng() % 3 == 0) {
          // A failed write that may have partly run on the server.
          std::vector<CacheEventOp> prefix(
              batch.begin(), batch.begin() + rng() % (batch.size() + 1));
          Apply(prefix, &delivered);
          q.Requeue(std::move(batch));
        } else {
          Apply(batch, &delivered);
        }
      }
    }
    Apply(q.TakeBatch(1 << 20), &delivered);
    ASSERT_EQ(delivered, direct) << "round " << round;
    EXPECT_EQ(q.dropped_hashes(), 0u);
  }
}

}  // namespace
}  // namespace swaserve::cluster
