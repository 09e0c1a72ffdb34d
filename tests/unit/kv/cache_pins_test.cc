// CachePins: a pinned prefix survives eviction until its deadline, a repeat
// pin moves the deadline, the page bound releases the pins due soonest, and
// everything is unlocked at the end (the fixture checks no page leaks).
#include "lib/kv/cache_pins.h"

#include "gtest/gtest.h"
#include "tests/unit/kv/prefix_cache_test_fixture.h"

namespace swaserve::kv::prefix_cache_testing {
namespace {

constexpr int64_t kSec = 1'000'000'000;

class CachePinsTest : public PrefixCacheTest {};

TEST_F(CachePinsTest, PinnedPrefixSurvivesEvictionUntilItsDeadline) {
  Init(/*window=*/8, /*page_size=*/4);
  const Hashes a = H({1, 2, 3, 4});
  const Hashes b = H({5, 6, 7, 8});
  Insert(a);
  Insert(b);
  CachePins pins(cache_.get(), {.max_pinned_pages = 16});
  EXPECT_EQ(pins.Pin(absl::MakeConstSpan(a).first(3), 10 * kSec, 0), 12);
  EXPECT_EQ(pins.pinned_pages(), 3);
  cache_->Evict(64, 64);  // as much as it can
  Check();
  EXPECT_EQ(cache_->Match(a).matched_tokens, 12);  // the pinned three pages stay
  EXPECT_EQ(cache_->Match(b).matched_tokens, 0);
  pins.Expire(5 * kSec);
  EXPECT_EQ(pins.pins(), 1);
  pins.Expire(10 * kSec);
  EXPECT_EQ(pins.pins(), 0);
  EXPECT_EQ(pins.pinned_pages(), 0);
  cache_->Evict(64, 64);
  EXPECT_EQ(cache_->Match(a).matched_tokens, 0);
}

TEST_F(CachePinsTest, RepinMovesTheDeadlineAndTheBoundReleasesTheSoonest) {
  Init(/*window=*/8, /*page_size=*/4);
  const Hashes a = H({1, 2});
  const Hashes b = H({3, 4});
  const Hashes c = H({5, 6, 7});
  Insert(a);
  Insert(b);
  Insert(c);
  CachePins pins(cache_.get(), {.max_pinned_pages = 4});
  EXPECT_EQ(pins.Pin(a, 10 * kSec, 0), 8);
  EXPECT_EQ(pins.Pin(b, 5 * kSec, 0), 8);
  EXPECT_EQ(pins.Pin(a, 10 * kSec, 4 * kSec), 8);  // a now due at 14 s
  EXPECT_EQ(pins.pins(), 2);
  EXPECT_EQ(pins.pinned_pages(), 4);
  // c (3 pages) needs room: b (due at 5 s) goes first, then a.
  EXPECT_EQ(pins.Pin(c, 1 * kSec, 4 * kSec), 12);
  EXPECT_EQ(pins.pins(), 1);
  EXPECT_EQ(pins.pinned_pages(), 3);
  // Larger than the bound alone: refused, nothing released.
  EXPECT_EQ(pins.Pin(H({5, 6, 7, 8, 9}), kSec, 4 * kSec), 0);
  EXPECT_EQ(pins.pins(), 1);
  // A prefix the cache does not hold whole is not pinned.
  EXPECT_EQ(pins.Pin(H({9, 9}), kSec, 0), 0);
  pins.UnpinAll();
  EXPECT_EQ(pins.pinned_pages(), 0);
}

TEST_F(CachePinsTest, OffWithoutRoom) {
  Init(/*window=*/8, /*page_size=*/4);
  const Hashes a = H({1, 2});
  Insert(a);
  CachePins pins(cache_.get(), {});
  EXPECT_EQ(pins.Pin(a, kSec, 0), 0);
}

}  // namespace
}  // namespace swaserve::kv::prefix_cache_testing
