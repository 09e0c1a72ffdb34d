// The prefix-affinity index against a real redis-server: exact match depths
// (cross-checked with a brute-force model on random data), removal and clear
// events, TTL semantics, the per-worker bound, script reload, and the
// MatchPrefixes latency for a 128K-token prompt (printed, not asserted).
#include "lib/cluster/prefix_index.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <set>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/base/clock.h"
#include "lib/cluster/cluster_view.h"
#include "lib/cluster/key_schema.h"
#include "lib/cluster/redis_client.h"
#include "tests/integration/cluster/redis_server.h"

namespace swaserve::cluster {
namespace {

using Kind = CacheEventOp::Kind;
using ::testing::ElementsAre;

class PrefixIndexTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = testing::RedisServer::Start();
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    auto client = RedisClient::Create(server_->ClientOptions());
    ASSERT_TRUE(client.ok()) << client.status();
    redis_ = *std::move(client);
    auto keys = KeySchema::Create("test");
    ASSERT_TRUE(keys.ok());
    keys_ = *keys;
  }

  std::unique_ptr<PrefixIndex> MakeIndex(PrefixIndexOptions options = {}) {
    auto index = PrefixIndex::Create(redis_.get(), keys_, options);
    EXPECT_TRUE(index.ok()) << index.status();
    return index.ok() ? *std::move(index) : nullptr;
  }

  // One cache event of `worker`; returns its authoritative entry count.
  int64_t Apply(PrefixIndex& index, const std::string& worker, Kind kind,
                std::vector<uint64_t> hashes) {
    CacheEventOp op{kind, std::move(hashes)};
    absl::StatusOr<int64_t> n =
        index.Apply(worker, absl::MakeConstSpan(&op, 1));
    EXPECT_TRUE(n.ok()) << n.status();
    return n.ok() ? *n : -1;
  }

  std::vector<int64_t> Match(PrefixIndex& index,
                             const std::vector<uint64_t>& hashes,
                             const std::vector<std::string>& candidates) {
    absl::StatusOr<std::vector<int64_t>> d = index.Match(hashes, candidates);
    EXPECT_TRUE(d.ok()) << d.status();
    return d.ok() ? *d : std::vector<int64_t>{};
  }

  PrefixIndexSizes Sizes(PrefixIndex& index, const std::string& worker) {
    absl::StatusOr<PrefixIndexSizes> s = index.Sizes(worker);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *s : PrefixIndexSizes{-1, -1};
  }

  int64_t Integer(const RedisCommand& command) {
    absl::StatusOr<RedisReply> r = redis_->Command(command);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->integer : -1;
  }

  std::unique_ptr<testing::RedisServer> server_;
  std::unique_ptr<RedisClient> redis_;
  KeySchema keys_ = *KeySchema::Create("unset");
};

std::vector<uint64_t> Chain(uint64_t seed, size_t n) {
  std::mt19937_64 rng(seed);
  std::vector<uint64_t> v(n);
  for (uint64_t& h : v) h = rng();
  return v;
}

std::vector<uint64_t> Slice(const std::vector<uint64_t>& v, size_t begin,
                            size_t end) {
  return std::vector<uint64_t>(v.begin() + begin, v.begin() + end);
}

TEST_F(PrefixIndexTest, MatchesLeadingPagesPerCandidate) {
  auto index = MakeIndex();
  const std::vector<uint64_t> chain = Chain(1, 10);
  Apply(*index, "a", Kind::kStored, Slice(chain, 0, 7));
  Apply(*index, "b", Kind::kStored, Slice(chain, 0, 3));
  // c held all 10 pages and evicted 2..9 (leaves first, as a cache does).
  Apply(*index, "c", Kind::kStored, chain);
  Apply(*index, "c", Kind::kRemoved, Slice(chain, 2, 10));
  // d holds 0..3 by its own events and 4..5 predicted (dispatched to it).
  Apply(*index, "d", Kind::kStored, Slice(chain, 0, 4));
  ASSERT_TRUE(index->RecordDispatch("d", Slice(chain, 0, 6)).ok());
  EXPECT_THAT(Match(*index, chain, {"a", "b", "c", "d", "nobody"}),
              ElementsAre(7, 3, 2, 6, 0));
  // Order of candidates is the order of results; duplicates allowed.
  EXPECT_THAT(Match(*index, chain, {"b", "a", "b"}), ElementsAre(3, 7, 3));
  // A prompt diverging after page 4 matches at most 4 pages (its later
  // pages have other hashes: each hash chains over the whole prefix).
  std::vector<uint64_t> other = Slice(chain, 0, 4);
  other.push_back(12345);
  other.push_back(67890);
  EXPECT_THAT(Match(*index, other, {"a", "b", "d"}), ElementsAre(4, 3, 4));
  // Empty inputs cost nothing and are well defined.
  EXPECT_THAT(Match(*index, {}, {"a", "b"}), ElementsAre(0, 0));
  EXPECT_TRUE(Match(*index, chain, {}).empty());
  // Bad ids are rejected before any round trip.
  EXPECT_EQ(index->Match(chain, {"bad id"}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(index->RecordDispatch("", chain).code(),
            absl::StatusCode::kInvalidArgument);
}

// The depth search (prefix_index.h) finds every possible depth of prompts
// of several lengths, with and without predicted pages beyond it.
TEST_F(PrefixIndexTest, TheSearchFindsEveryDepth) {
  auto index = MakeIndex();
  for (size_t n : {1u, 2u, 3u, 17u, 64u, 100u}) {
    const std::vector<uint64_t> chain = Chain(100 + n, n);
    for (size_t d = 0; d <= n; ++d) {
      const std::string w = absl::StrCat("w", n, "_", d);
      if (d > 0) Apply(*index, w, Kind::kStored, Slice(chain, 0, d));
      ASSERT_THAT(Match(*index, chain, {w}), ElementsAre(static_cast<int64_t>(d))) << n;
      // A prefix of the prompt, and the prompt grown by fresh pages.
      ASSERT_THAT(Match(*index, Slice(chain, 0, (n + 1) / 2), {w}),
                  ElementsAre(static_cast<int64_t>(std::min(d, (n + 1) / 2))));
      std::vector<uint64_t> grown = chain;
      for (int k = 0; k < 7; ++k) grown.push_back(1000 + k);
      ASSERT_THAT(Match(*index, grown, {w}), ElementsAre(static_cast<int64_t>(d)));
      // Predicted pages continue the match from where the SET ends.
      if (d < n) {
        ASSERT_TRUE(index->RecordDispatch(w, Slice(chain, 0, std::min(n, d + 3))).ok());
        ASSERT_THAT(Match(*index, chain, {w}),
                    ElementsAre(static_cast<int64_t>(std::min(n, d + 3))));
      }
    }
  }
}

// A caller's own SET depths (its index mirror) go through prefix_extend:
// the answer is the given depth extended by live predictions, equal to the
// full match's, whatever the smallest depth (the pages it packs start
// after it), across the scan's chunk ends (8, 32, 128 pages), and with the
// value keys read in the same call.
TEST_F(PrefixIndexTest, GivenDepthsAreExtendedByLivePredictionsLikeTheMatch) {
  auto index = MakeIndex();
  std::mt19937 rng(7);
  ASSERT_TRUE(redis_->Command({"SET", "load-key", "42"}).ok());
  for (size_t n : {1u, 9u, 41u, 300u}) {
    const std::vector<uint64_t> chain = Chain(500 + n, n);
    for (int round = 0; round < 6; ++round) {
      std::vector<std::string> ids;
      std::vector<int64_t> set_depths;
      for (int w = 0; w < 4; ++w) {
        const std::string id = absl::StrCat("g", n, "_", round, "_", w);
        const size_t d = std::uniform_int_distribution<size_t>(0, n)(rng);
        if (d > 0) Apply(*index, id, Kind::kStored, Slice(chain, 0, d));
        // Predictions from d on (up to the whole prompt), or none.
        if (d < n && rng() % 3 != 0) {
          const size_t p = std::uniform_int_distribution<size_t>(d + 1, n)(rng);
          ASSERT_TRUE(index->RecordDispatch(id, Slice(chain, 0, p)).ok());
        }
        ids.push_back(id);
        set_depths.push_back(static_cast<int64_t>(d));
      }
      const std::vector<int64_t> want = Match(*index, chain, ids);
      std::vector<std::optional<std::string>> values;
      std::vector<int64_t> safe, l1;
      absl::StatusOr<std::vector<int64_t>> got =
          index->Match(chain, ids, {"load-key", "no-such-key"}, &values, 8, &safe, &l1, {},
                       set_depths);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(*got, want) << n << " " << round;
      // The window-safe and L1 answers are the depths (the mirror has its own).
      EXPECT_EQ(safe, *got);
      EXPECT_EQ(l1, *got);
      EXPECT_THAT(values, ElementsAre(std::optional<std::string>("42"), std::nullopt));
    }
  }
  // Given depths beyond the prompt are clamped; a wrong count is rejected.
  const std::vector<uint64_t> chain = Chain(9, 5);
  Apply(*index, "clamp", Kind::kStored, chain);
  absl::StatusOr<std::vector<int64_t>> clamped =
      index->Match(chain, {"clamp"}, {}, nullptr, 0, nullptr, nullptr, {}, {99});
  ASSERT_TRUE(clamped.ok()) << clamped.status();
  EXPECT_THAT(*clamped, ElementsAre(5));
  EXPECT_EQ(index->Match(chain, {"clamp"}, {}, nullptr, 0, nullptr, nullptr, {}, {1, 2})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// Several candidates in one call: each depth found is a hint for the later
// candidates (pages h and h + 1), so depths equal to, next to, just below,
// above and far from an earlier one must all come out exact, in any order.
TEST_F(PrefixIndexTest, HintsFromEarlierCandidatesKeepEveryDepthExact) {
  auto index = MakeIndex();
  const size_t n = 64;
  const std::vector<uint64_t> chain = Chain(777, n);
  const std::vector<int64_t> depths = {32, 32, 33, 31, 0, 64, 1, 63, 2, 30, 34, 17, 48, 32};
  std::vector<std::string> workers;
  for (size_t k = 0; k < depths.size(); ++k) {
    workers.push_back(absl::StrCat("h", k));
    if (depths[k] > 0) {
      Apply(*index, workers.back(), Kind::kStored, Slice(chain, 0, depths[k]));
    }
  }
  std::mt19937_64 rng(99);
  for (int round = 0; round < 20; ++round) {
    std::vector<size_t> order(workers.size());
    for (size_t k = 0; k < order.size(); ++k) order[k] = k;
    if (round > 0) std::shuffle(order.begin(), order.end(), rng);
    std::vector<std::string> candidates;
    std::vector<int64_t> want;
    for (size_t k : order) {
      candidates.push_back(workers[k]);
      want.push_back(depths[k]);
    }
    ASSERT_EQ(Match(*index, chain, candidates), want) << "round " << round;
    // A shorter prompt (hints past its end) and a grown one.
    std::vector<int64_t> want_short;
    for (int64_t d : want) want_short.push_back(std::min<int64_t>(d, 40));
    ASSERT_EQ(Match(*index, Slice(chain, 0, 40), candidates), want_short) << "round " << round;
    std::vector<uint64_t> grown = chain;
    for (int k = 0; k < 9; ++k) grown.push_back(5000 + k);
    ASSERT_EQ(Match(*index, grown, candidates), want) << "round " << round;
  }
}

// Window-safe depths: SWA-removed events mark pages; a
// match's window-safe depth L is the largest p <= d whose last wp pages are
// all unmarked; healing, re-storing, removing and clearing unmark them.
TEST_F(PrefixIndexTest, MatchReportsTheWindowSafeDepth) {
  auto index = MakeIndex();
  const std::vector<uint64_t> chain = Chain(1, 12);
  Apply(*index, "a", Kind::kStored, chain);
  Apply(*index, "b", Kind::kStored, Slice(chain, 0, 8));
  auto match = [&](int wp, const std::vector<uint64_t>& hashes,
                   std::vector<int64_t> scan = {}) {
    std::vector<int64_t> safe;
    absl::StatusOr<std::vector<int64_t>> d = index->Match(
        hashes, {"a", "b", "none"}, {}, nullptr, wp, &safe, nullptr, scan);
    EXPECT_TRUE(d.ok()) << d.status();
    EXPECT_EQ(*d, (std::vector<int64_t>{static_cast<int64_t>(std::min<size_t>(12, hashes.size())),
                                        static_cast<int64_t>(std::min<size_t>(8, hashes.size())), 0}));
    return safe;
  };
  using V = std::vector<int64_t>;
  EXPECT_EQ(match(3, chain), (V{12, 8, 0}));
  // "a" dropped the SWA KV of pages 0..9 (0-based; 1..10 as the script
  // counts): its match of 12 pages needs pages 9..11 (wp = 3): L = 0 (no
  // page boundary has 3 intact pages under it); with wp = 2 the last two
  // are intact. "b" is unaffected.
  Apply(*index, "a", Kind::kSwaRemoved, Slice(chain, 0, 10));
  EXPECT_EQ(match(3, chain), (V{0, 8, 0}));
  EXPECT_EQ(match(2, chain), (V{12, 8, 0}));
  EXPECT_EQ(match(3, Slice(chain, 0, 8)), (V{0, 8, 0}));
  EXPECT_EQ(match(0, chain), (V{12, 8, 0}));  // no check
  // Pages 0..3 heal: L = 4 for wp <= 4 (pages 0..3 intact, page 4 dropped).
  Apply(*index, "a", Kind::kSwaStored, Slice(chain, 0, 4));
  EXPECT_EQ(match(3, chain), (V{4, 8, 0}));
  EXPECT_EQ(match(4, chain), (V{4, 8, 0}));
  EXPECT_EQ(match(5, chain), (V{4, 8, 0}));  // the window reaches page 0
  // Bounded search: with S = 7 below d = 12, L = 4 < 5 is reported as -1;
  // with S = 8 it is found. Per candidate.
  EXPECT_EQ(match(3, chain, {7, 7, 7}), (V{-1, 8, 0}));
  EXPECT_EQ(match(3, chain, {8, 0, 0}), (V{4, 8, 0}));
  // Healing page 9 makes 12 window-safe again for wp = 3.
  Apply(*index, "a", Kind::kSwaStored, {chain[9]});
  EXPECT_EQ(match(3, chain), (V{12, 8, 0}));
  EXPECT_EQ(match(4, chain), (V{4, 8, 0}));
  // A removed page leaves the SWA-gone set too; re-stored pages are live.
  Apply(*index, "a", Kind::kRemoved, Slice(chain, 5, 12));
  Apply(*index, "a", Kind::kStored, Slice(chain, 5, 12));
  EXPECT_EQ(match(4, chain), (V{12, 8, 0}));
  EXPECT_EQ(Integer({"SCARD", keys_.SwaGoneKey("a")}), 1);  // page 4
  // Clearing the worker drops everything, the SWA-gone set included.
  CacheEventOp clear{Kind::kCleared, {}};
  ASSERT_TRUE(index->Apply("a", absl::MakeConstSpan(&clear, 1)).ok());
  EXPECT_EQ(Integer({"EXISTS", keys_.SwaGoneKey("a")}), 0);
  // The set expires with the index.
  Apply(*index, "b", Kind::kSwaRemoved, {chain[7]});
  EXPECT_GT(Integer({"PTTL", keys_.SwaGoneKey("b")}), 0);
  // A scan bound per candidate or none.
  std::vector<int64_t> safe;
  const std::vector<int64_t> two = {1, 2};
  EXPECT_EQ(index->Match(chain, {"a", "b", "none"}, {}, nullptr, 3, &safe, nullptr, two)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// The window-safe depth against brute force: random SWA drops and heals over
// long chains, random window sizes and scan bounds (the chunked downward
// search crosses chunk boundaries).
TEST_F(PrefixIndexTest, RandomizedWindowSafeDepthEqualsBruteForce) {
  auto index = MakeIndex();
  std::mt19937_64 rng(20261202);
  const std::vector<uint64_t> chain = Chain(7, 3000);
  Apply(*index, "w", Kind::kStored, chain);
  std::vector<bool> gone(chain.size(), false);
  int cases = 0, unsafe = 0, bounded = 0;
  for (int round = 0; round < 60; ++round) {
    // Drop or heal a few random runs of pages (a tombstoned radix node is a
    // run).
    for (int k = 0; k < 3; ++k) {
      const size_t from = rng() % chain.size();
      const size_t len = 1 + rng() % (rng() % 4 == 0 ? 400 : 20);
      const size_t to = std::min(chain.size(), from + len);
      const bool drop = rng() % 3 != 0;
      Apply(*index, "w", drop ? Kind::kSwaRemoved : Kind::kSwaStored, Slice(chain, from, to));
      for (size_t p = from; p < to; ++p) gone[p] = drop;
    }
    for (int q = 0; q < 10; ++q, ++cases) {
      const int64_t d = 1 + static_cast<int64_t>(rng() % chain.size());
      const int wp = 1 + static_cast<int>(rng() % 40);
      const int64_t scan = rng() % 2 == 0 ? static_cast<int64_t>(rng() % 3000) : d;
      // Brute force: the largest p <= d with pages max(0, p - wp)..p-1
      // (0-based) intact; p = 0 qualifies.
      int64_t l = 0;
      for (int64_t p = d; p > 0; --p) {
        bool ok = true;
        for (int64_t x = std::max<int64_t>(0, p - wp); x < p && ok; ++x) ok = !gone[x];
        if (ok) {
          l = p;
          break;
        }
      }
      const int64_t want = l < d - scan ? -1 : l;
      std::vector<int64_t> safe;
      const std::vector<int64_t> bound = {scan};
      absl::StatusOr<std::vector<int64_t>> got =
          index->Match(Slice(chain, 0, d), {"w"}, {}, nullptr, wp, &safe, nullptr, bound);
      ASSERT_TRUE(got.ok()) << got.status();
      ASSERT_EQ((*got)[0], d);
      ASSERT_EQ(safe, std::vector<int64_t>{want})
          << "round " << round << " d " << d << " wp " << wp << " scan " << scan;
      unsafe += l < d;
      bounded += want < 0;
    }
  }
  EXPECT_EQ(cases, 600);
  // The cases exercised every branch.
  EXPECT_GT(unsafe, 100);
  EXPECT_GT(bounded, 10);
}

// Tiers: pages a worker moved to L2 (kTierDown) are a suffix of
// its matches; the match reports how many matched pages are still in L1.
TEST_F(PrefixIndexTest, MatchReportsHowManyMatchedPagesAreInL1) {
  auto index = MakeIndex();
  const std::vector<uint64_t> chain = Chain(5, 12);
  Apply(*index, "a", Kind::kStored, chain);
  Apply(*index, "b", Kind::kStored, Slice(chain, 0, 6));
  auto l1 = [&](const std::vector<uint64_t>& hashes) {
    std::vector<int64_t> l1_pages;
    absl::StatusOr<std::vector<int64_t>> d =
        index->Match(hashes, {"a", "b", "none"}, {}, nullptr, 0, nullptr, &l1_pages);
    EXPECT_TRUE(d.ok()) << d.status();
    return l1_pages;
  };
  EXPECT_EQ(l1(chain), (std::vector<int64_t>{12, 6, 0}));
  // "a" demoted its pages 7..11 to L2 (leaves first, as eviction does).
  Apply(*index, "a", Kind::kTierDown, Slice(chain, 9, 12));
  Apply(*index, "a", Kind::kTierDown, Slice(chain, 7, 9));
  EXPECT_EQ(l1(chain), (std::vector<int64_t>{7, 6, 0}));
  EXPECT_EQ(l1(Slice(chain, 0, 5)), (std::vector<int64_t>{5, 5, 0}));  // all in L1
  // Every binary-search outcome: the boundary at each page.
  for (int b = 0; b <= 12; ++b) {
    Apply(*index, "a", Kind::kTierUp, chain);
    if (b < 12) Apply(*index, "a", Kind::kTierDown, Slice(chain, b, 12));
    EXPECT_EQ(l1(chain)[0], b) << b;
  }
  // Loaded back, re-stored or removed pages leave the lower-tier set.
  Apply(*index, "a", Kind::kTierUp, Slice(chain, 0, 6));
  Apply(*index, "a", Kind::kStored, Slice(chain, 6, 8));
  Apply(*index, "a", Kind::kRemoved, Slice(chain, 8, 12));
  EXPECT_EQ(l1(chain), (std::vector<int64_t>{8, 6, 0}));
  EXPECT_EQ(Integer({"EXISTS", keys_.LowerTierKey("a")}), 0);
  Apply(*index, "b", Kind::kTierDown, Slice(chain, 3, 6));
  EXPECT_GT(Integer({"PTTL", keys_.LowerTierKey("b")}), 0);
  CacheEventOp clear{Kind::kCleared, {}};
  ASSERT_TRUE(index->Apply("b", absl::MakeConstSpan(&clear, 1)).ok());
  EXPECT_EQ(Integer({"EXISTS", keys_.LowerTierKey("b")}), 0);
}

// The tier summary (prefix_match_v11): Apply writes, with the SETs, whether
// a worker has SWA-gone and lower-tier pages, so a match reads it for all
// candidates in one MGET. A missing summary falls back to EXISTS and a stale
// "has" only costs the search: the answers never change.
TEST_F(PrefixIndexTest, TierSummaryMirrorsTheSetsAndOnlySpeedsTheMatchUp) {
  auto index = MakeIndex();
  const std::vector<uint64_t> chain = Chain(11, 40);
  Apply(*index, "a", Kind::kStored, chain);
  Apply(*index, "b", Kind::kStored, Slice(chain, 0, 20));
  auto summary = [&](const std::string& w) {
    absl::StatusOr<RedisReply> r = redis_->Command({"GET", keys_.TierSummaryKey(w)});
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() && r->type == RedisReply::Type::kString ? r->str : std::string("(none)");
  };
  struct Answer {
    std::vector<int64_t> depth, safe, l1;
    bool operator==(const Answer& o) const {
      return depth == o.depth && safe == o.safe && l1 == o.l1;
    }
  };
  auto match = [&] {
    Answer a;
    absl::StatusOr<std::vector<int64_t>> d = index->Match(
        chain, {"a", "b", "none"}, {}, nullptr, /*window_pages=*/4, &a.safe, &a.l1);
    EXPECT_TRUE(d.ok()) << d.status();
    if (d.ok()) a.depth = *d;
    return a;
  };
  EXPECT_EQ(summary("a"), "0");
  const Answer clean = match();
  EXPECT_EQ(clean.depth, (std::vector<int64_t>{40, 20, 0}));
  EXPECT_EQ(clean.safe, (std::vector<int64_t>{40, 20, 0}));
  EXPECT_EQ(clean.l1, (std::vector<int64_t>{40, 20, 0}));
  Apply(*index, "a", Kind::kSwaRemoved, Slice(chain, 37, 38));
  EXPECT_EQ(summary("a"), "2");
  Apply(*index, "a", Kind::kTierDown, Slice(chain, 30, 40));
  EXPECT_EQ(summary("a"), "6");
  Apply(*index, "b", Kind::kTierDown, Slice(chain, 15, 20));
  EXPECT_EQ(summary("b"), "4");
  const Answer marked = match();
  EXPECT_EQ(marked.depth, (std::vector<int64_t>{40, 20, 0}));
  EXPECT_EQ(marked.safe, (std::vector<int64_t>{37, 20, 0}));
  EXPECT_EQ(marked.l1, (std::vector<int64_t>{30, 15, 0}));
  // Without summaries (expired, or an index written before v11), and with a
  // stale "has both": the same answers.
  ASSERT_EQ(Integer({"DEL", keys_.TierSummaryKey("a"), keys_.TierSummaryKey("b")}), 2);
  EXPECT_TRUE(match() == marked);
  ASSERT_TRUE(redis_->Command({"SET", keys_.TierSummaryKey("a"), "6"}).ok());
  ASSERT_TRUE(redis_->Command({"SET", keys_.TierSummaryKey("b"), "6"}).ok());
  EXPECT_TRUE(match() == marked);
  // Healed and loaded back: "0" again, and the clean answers.
  Apply(*index, "a", Kind::kSwaStored, Slice(chain, 37, 38));
  Apply(*index, "a", Kind::kTierUp, Slice(chain, 30, 40));
  Apply(*index, "b", Kind::kTierUp, Slice(chain, 15, 20));
  EXPECT_EQ(summary("a"), "0");
  EXPECT_EQ(summary("b"), "0");
  EXPECT_TRUE(match() == clean);
  // It lives as long as the SETs: Apply and the heartbeat's expiry refresh
  // it, a clear deletes it.
  EXPECT_GT(Integer({"PTTL", keys_.TierSummaryKey("a")}), 0);
  bool refreshed = false;
  for (const RedisCommand& c : index->ExpireCommands("a", 1)) {
    refreshed |= c.size() > 1 && c[1] == keys_.TierSummaryKey("a");
  }
  EXPECT_TRUE(refreshed);
  ASSERT_TRUE(index->Clear("a").ok());
  EXPECT_EQ(summary("a"), "(none)");
}

TEST_F(PrefixIndexTest, MatchAlsoReadsValuesInTheSameRoundTrip) {
  auto index = MakeIndex();
  const std::vector<uint64_t> chain = Chain(3, 12);
  Apply(*index, "a", Kind::kStored, Slice(chain, 0, 9));
  Apply(*index, "b", Kind::kStored, Slice(chain, 0, 2));
  ASSERT_TRUE(redis_->Command({"SET", "test:v1", std::string("\x00\x01load", 6)}).ok());
  ASSERT_TRUE(redis_->Command({"SET", "test:v3", "three"}).ok());
  std::vector<std::optional<std::string>> values;
  absl::StatusOr<std::vector<int64_t>> d =
      index->Match(chain, {"a", "b"}, {"test:v1", "test:v2", "test:v3"}, &values);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_THAT(*d, ElementsAre(9, 2));
  ASSERT_EQ(values.size(), 3u);
  EXPECT_EQ(values[0], std::string("\x00\x01load", 6));  // binary-safe
  EXPECT_FALSE(values[1].has_value());
  EXPECT_EQ(values[2], "three");
  // No hashes: depths 0, values still read.
  d = index->Match({}, {"a"}, {"test:v3"}, &values);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_THAT(*d, ElementsAre(0));
  EXPECT_EQ(values[0], "three");
  // The view's combined call decodes load reports.
  auto view = ClusterView::Create({.redis = redis_.get(), .cluster = "test"});
  ASSERT_TRUE(view.ok());
  swaserve::v1::WorkerLoad load;
  load.set_worker_id("a");
  load.set_queued_uncached_tokens(777);
  ASSERT_TRUE(
      redis_->Command({"SET", (*view)->keys().LoadKey("a"), load.SerializeAsString()}).ok());
  auto both = (*view)->MatchPrefixesAndLoads(chain, {"a", "b"}, {"a", "b", "c"});
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_THAT(both->depths, ElementsAre(9, 2));
  ASSERT_EQ(both->loads.size(), 3u);
  ASSERT_TRUE(both->loads[0].has_value());
  EXPECT_EQ(both->loads[0]->queued_uncached_tokens(), 777u);
  EXPECT_FALSE(both->loads[1].has_value());
  EXPECT_FALSE(both->loads[2].has_value());
}

// Random chains with shared prefixes; per worker random batches of stored
// prefixes, evictions of leaves (chain tails and random leaves, as a radix
// tree evicts: a worker's pages stay prefix-closed, which the match's search
// relies on), removals of pages never stored, clears, and router dispatches
// (predicted entries, which need not be prefix-closed); every query's
// depths must equal a brute-force computation over a local model.
TEST_F(PrefixIndexTest, RandomizedMatchEqualsBruteForce) {
  auto index = MakeIndex();
  std::mt19937_64 rng(20240601);
  // Chains: each shares a random prefix with an earlier one.
  std::vector<std::vector<uint64_t>> chains;
  for (int c = 0; c < 40; ++c) {
    std::vector<uint64_t> chain;
    if (!chains.empty() && rng() % 4 != 0) {
      const auto& base = chains[rng() % chains.size()];
      chain.assign(base.begin(), base.begin() + rng() % (base.size() + 1));
    }
    const size_t extra = 1 + rng() % 200;
    for (size_t i = 0; i < extra; ++i) chain.push_back(rng());
    chains.push_back(std::move(chain));
  }
  // Each page's parent (the page before it in its chains: shared prefixes
  // are identical, so it is unique).
  absl::flat_hash_map<uint64_t, uint64_t> parent;
  for (const auto& chain : chains) {
    for (size_t i = 1; i < chain.size(); ++i) parent[chain[i]] = chain[i - 1];
  }
  const std::vector<std::string> workers = {"w0", "w1", "w2", "w3",
                                            "w4", "w5", "w6", "w7"};
  struct Model {
    absl::flat_hash_set<uint64_t> stored, predicted;
  };
  absl::flat_hash_map<std::string, Model> model;
  int cases = 0;
  for (int round = 0; round < 30; ++round) {
    for (const std::string& w : workers) {
      Model& m = model[w];
      // A batch of the worker's cache events (one script call).
      std::vector<CacheEventOp> ops;
      const int n_ops = static_cast<int>(rng() % 4);
      for (int k = 0; k < n_ops; ++k) {
        const auto& chain = chains[rng() % chains.size()];
        const int what = static_cast<int>(rng() % 10);
        if (what < 6) {  // store a prefix (what a prefix cache does)
          const size_t len = rng() % (chain.size() + 1);
          ops.push_back({Kind::kStored, Slice(chain, 0, len)});
          m.stored.insert(chain.begin(), chain.begin() + len);
        } else if (what < 9) {  // evict leaves: a chain's tail, or random ones
          // A cache evicts only pages no cached page descends from (the
          // radix tree's leaves), so a worker's pages stay prefix-closed.
          absl::flat_hash_map<uint64_t, int> children;
          for (uint64_t h : m.stored) {
            auto p = parent.find(h);
            if (p != parent.end()) ++children[p->second];
          }
          std::vector<uint64_t> removed;
          auto evict = [&](uint64_t h) {
            if (!m.stored.contains(h) || children[h] > 0) return false;
            m.stored.erase(h);
            m.predicted.erase(h);
            auto p = parent.find(h);
            if (p != parent.end()) --children[p->second];
            removed.push_back(h);
            return true;
          };
          if (rng() % 2 == 0) {
            const size_t from = rng() % (chain.size() + 1);
            for (size_t i = chain.size(); i > from; --i) {
              if (m.stored.contains(chain[i - 1]) && !evict(chain[i - 1])) break;
            }
          } else {
            std::vector<uint64_t> pages(m.stored.begin(), m.stored.end());
            std::sort(pages.begin(), pages.end());
            for (int k = 0; k < 8 && !pages.empty(); ++k) evict(pages[rng() % pages.size()]);
          }
          // A removal may also name pages the worker never stored (e.g.
          // after a clear): they only drop predictions.
          if (rng() % 4 == 0) {
            const uint64_t h = chain[rng() % chain.size()];
            if (!m.stored.contains(h)) {
              m.predicted.erase(h);
              removed.push_back(h);
            }
          }
          ops.push_back({Kind::kRemoved, std::move(removed)});
        } else if (rng() % 3 == 0) {
          ops.push_back({Kind::kCleared, {}});
          m.stored.clear();
          m.predicted.clear();
        }
      }
      if (!ops.empty()) {
        absl::StatusOr<int64_t> size = index->Apply(w, ops);
        ASSERT_TRUE(size.ok()) << size.status();
        ASSERT_EQ(*size, static_cast<int64_t>(m.stored.size())) << w;
      }
      // Sometimes a router dispatches a prompt (with a random tail) to it.
      if (rng() % 3 == 0) {
        std::vector<uint64_t> prompt = chains[rng() % chains.size()];
        prompt.resize(rng() % (prompt.size() + 1));
        for (int i = 0; i < 3; ++i) prompt.push_back(rng());
        ASSERT_TRUE(index->RecordDispatch(w, prompt).ok());
        for (uint64_t h : prompt) {
          if (!m.stored.contains(h)) m.predicted.insert(h);
        }
      }
      ASSERT_EQ(Sizes(*index, w).predicted,
                static_cast<int64_t>(m.predicted.size()))
          << w;
    }
    // Queries: chains, chain prefixes, chains with a divergent tail, for a
    // random subset of candidates (plus one unknown worker).
    for (int q = 0; q < 10; ++q, ++cases) {
      std::vector<uint64_t> prompt = chains[rng() % chains.size()];
      if (rng() % 3 == 0) prompt.resize(rng() % (prompt.size() + 1));
      if (rng() % 3 == 0) {
        for (int i = 0; i < 5; ++i) prompt.push_back(rng());
      }
      std::vector<std::string> candidates;
      for (const std::string& w : workers) {
        if (rng() % 3 != 0) candidates.push_back(w);
      }
      candidates.push_back("unknown");
      std::vector<int64_t> expected;
      for (const std::string& c : candidates) {
        int64_t d = 0;
        auto it = model.find(c);
        while (it != model.end() && d < static_cast<int64_t>(prompt.size()) &&
               (it->second.stored.contains(prompt[d]) ||
                it->second.predicted.contains(prompt[d]))) {
          ++d;
        }
        expected.push_back(d);
      }
      ASSERT_EQ(Match(*index, prompt, candidates), expected)
          << "round " << round << " query " << q;
    }
  }
  EXPECT_EQ(cases, 300);
}

TEST_F(PrefixIndexTest, PredictedEntriesExpireAndSkipHeldPages) {
  auto index = MakeIndex({.predicted_ttl = absl::Milliseconds(300)});
  const std::vector<uint64_t> chain = Chain(2, 6);
  // b holds the first 3 pages itself: only 3 predictions are written.
  Apply(*index, "b", Kind::kStored, Slice(chain, 0, 3));
  ASSERT_TRUE(index->RecordDispatch("a", chain).ok());
  ASSERT_TRUE(index->RecordDispatch("b", chain).ok());
  EXPECT_EQ(Sizes(*index, "a").predicted, 6);
  EXPECT_EQ(Sizes(*index, "b").predicted, 3);
  EXPECT_THAT(Match(*index, chain, {"a", "b"}), ElementsAre(6, 6));
  const int64_t pttl = Integer({"PTTL", keys_.PredictedKey("a")});
  EXPECT_GT(pttl, 0);
  EXPECT_LE(pttl, 300);
  absl::SleepFor(absl::Milliseconds(400));
  // Predictions expired; b's own entries did not.
  EXPECT_THAT(Match(*index, chain, {"a", "b"}), ElementsAre(0, 3));
  EXPECT_EQ(Integer({"EXISTS", keys_.PredictedKey("a")}), 0);
  // A new dispatch extends a prediction's life.
  ASSERT_TRUE(index->RecordDispatch("c", chain).ok());
  absl::SleepFor(absl::Milliseconds(200));
  ASSERT_TRUE(index->RecordDispatch("c", Slice(chain, 0, 2)).ok());
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_THAT(Match(*index, chain, {"c"}), ElementsAre(2));
}

TEST_F(PrefixIndexTest, RemovalAndClearAreAuthoritative) {
  auto index = MakeIndex();
  const std::vector<uint64_t> chain = Chain(3, 8);
  Apply(*index, "w", Kind::kStored, Slice(chain, 0, 5));
  ASSERT_TRUE(index->RecordDispatch("w", chain).ok());
  EXPECT_THAT(Match(*index, chain, {"w"}), ElementsAre(8));
  // A removal deletes predicted entries too.
  Apply(*index, "w", Kind::kRemoved, {chain[4], chain[6]});
  EXPECT_THAT(Match(*index, chain, {"w"}), ElementsAre(4));
  EXPECT_EQ(Sizes(*index, "w").predicted, 2);  // pages 5 and 7
  // Ops in one batch apply in order: remove then store again -> present.
  std::vector<CacheEventOp> ops = {{Kind::kRemoved, {chain[3]}},
                                   {Kind::kStored, {chain[3]}},
                                   {Kind::kStored, {chain[4], chain[5], chain[6]}}};
  ASSERT_TRUE(index->Apply("w", ops).ok());
  EXPECT_THAT(Match(*index, chain, {"w"}), ElementsAre(8));
  ops = {{Kind::kStored, {chain[7]}},
         {Kind::kCleared, {}},
         {Kind::kStored, {chain[0]}}};
  absl::StatusOr<int64_t> size = index->Apply("w", ops);
  ASSERT_TRUE(size.ok()) << size.status();
  EXPECT_EQ(*size, 1);
  EXPECT_EQ(Sizes(*index, "w").predicted, 0);  // a clear drops predictions
  EXPECT_THAT(Match(*index, chain, {"w"}), ElementsAre(1));
  ASSERT_TRUE(index->Clear("w").ok());
  EXPECT_THAT(Match(*index, chain, {"w"}), ElementsAre(0));
  EXPECT_EQ(Sizes(*index, "w").authoritative, 0);
}

TEST_F(PrefixIndexTest, EntryBoundsPerWorker) {
  auto index = MakeIndex(
      {.max_entries_per_worker = 100, .max_predicted_per_worker = 50});
  // Authoritative: a safety valve against lost removal events. Beyond the
  // bound the worker's entries are dropped (random eviction would leave
  // holes in its prefixes), as on a clear.
  EXPECT_EQ(Apply(*index, "w", Kind::kStored, Chain(4, 90)), 90);
  EXPECT_EQ(Apply(*index, "w", Kind::kStored, Chain(7, 20)), 0);
  EXPECT_EQ(Sizes(*index, "w").authoritative, 0);
  EXPECT_THAT(Match(*index, Chain(4, 90), {"w"}), ElementsAre(0));
  EXPECT_EQ(Apply(*index, "w", Kind::kStored, Chain(4, 90)), 90);  // re-stored
  Apply(*index, "v", Kind::kStored, Chain(4, 80));  // others unaffected
  EXPECT_EQ(Sizes(*index, "v").authoritative, 80);
  // Predicted: the entries closest to expiry go first.
  const std::vector<uint64_t> old_chain = Chain(5, 30);
  const std::vector<uint64_t> new_chain = Chain(6, 40);
  ASSERT_TRUE(index->RecordDispatch("p", old_chain).ok());
  absl::SleepFor(absl::Milliseconds(5));
  ASSERT_TRUE(index->RecordDispatch("p", new_chain).ok());
  EXPECT_EQ(Sizes(*index, "p").predicted, 50);
  EXPECT_THAT(Match(*index, new_chain, {"p"}), ElementsAre(40));
  int old_left = 0;
  for (uint64_t h : old_chain) old_left += Match(*index, {h}, {"p"})[0];
  EXPECT_EQ(old_left, 10);
}

TEST_F(PrefixIndexTest, AWorkersEntriesVanishIndexTtlAfterItsLastWrite) {
  auto index = MakeIndex({.index_ttl = absl::Milliseconds(300)});
  const std::vector<uint64_t> chain = Chain(7, 4);
  Apply(*index, "w", Kind::kStored, chain);
  const int64_t pttl = Integer({"PTTL", keys_.PrefixKey("w")});
  EXPECT_GT(pttl, 0);
  EXPECT_LE(pttl, 300);
  absl::SleepFor(absl::Milliseconds(200));
  Apply(*index, "w", Kind::kStored, {chain[0]});  // refreshes the key
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_THAT(Match(*index, chain, {"w"}), ElementsAre(4));
  absl::SleepFor(absl::Milliseconds(250));
  EXPECT_THAT(Match(*index, chain, {"w"}), ElementsAre(0));
  EXPECT_EQ(Integer({"EXISTS", keys_.PrefixKey("w")}), 0);
}

TEST_F(PrefixIndexTest, BatchesLargerThanLuaUnpackLimitsWork) {
  auto index = MakeIndex();
  const std::vector<uint64_t> chain = Chain(8, 20000);
  EXPECT_EQ(Apply(*index, "w", Kind::kStored, chain), 20000);
  EXPECT_THAT(Match(*index, chain, {"w"}), ElementsAre(20000));
  EXPECT_EQ(Apply(*index, "w", Kind::kRemoved, Slice(chain, 10000, 20000)),
            10000);
  EXPECT_THAT(Match(*index, chain, {"w"}), ElementsAre(10000));
  ASSERT_TRUE(index->RecordDispatch("w", chain).ok());
  EXPECT_EQ(Sizes(*index, "w").predicted, 10000);
  EXPECT_THAT(Match(*index, chain, {"w"}), ElementsAre(20000));
}

TEST_F(PrefixIndexTest, ScriptsReloadAfterScriptFlush) {
  auto index = MakeIndex();
  const std::vector<uint64_t> chain = Chain(9, 5);
  Apply(*index, "w", Kind::kStored, chain);
  EXPECT_THAT(Match(*index, chain, {"w"}), ElementsAre(5));
  ASSERT_TRUE(redis_->Command({"SCRIPT", "FLUSH"}).ok());
  // Every script is gone from the server; the next calls reload them.
  EXPECT_THAT(Match(*index, chain, {"w"}), ElementsAre(5));
  Apply(*index, "w", Kind::kRemoved, {chain[4]});
  EXPECT_THAT(Match(*index, chain, {"w"}), ElementsAre(4));
}

// The figure the router cares about: one MatchPrefixes round trip for a
// 128K-token prompt (8192 pages of 16 tokens) over 8 candidates. Printed
// (with a PING round trip as the baseline), not asserted; the depths are.
TEST_F(PrefixIndexTest, MatchLatencyFor128KTokenPrompt) {
  constexpr size_t kPages = 8192;
  constexpr int kIterations = 25;
  auto index = MakeIndex();
  auto view = ClusterView::Create({.redis = redis_.get(), .cluster = "test"});
  ASSERT_TRUE(view.ok());
  const std::vector<uint64_t> prompt = Chain(8, kPages);
  std::vector<std::string> candidates;
  for (int i = 0; i < 8; ++i) candidates.push_back(absl::StrCat("prefill-", i));

  // Server-side time per call of the command family `cmd` since the last
  // CONFIG RESETSTAT, from INFO commandstats (ms).
  auto server_ms = [&](const std::string& cmd) {
    absl::StatusOr<RedisReply> info = redis_->Command({"INFO", "commandstats"});
    if (!info.ok()) return -1.0;
    const std::string tag = absl::StrCat("cmdstat_", cmd, ":");
    const size_t at = info->str.find(tag);
    if (at == std::string::npos) return 0.0;
    const size_t u = info->str.find("usec_per_call=", at);
    return std::atof(info->str.c_str() + u + 14) / 1000;
  };
  struct Row {
    double p50, p95, server;
  };
  auto time_it = [&](const std::function<void()>& fn) {
    std::vector<double> ms;
    EXPECT_TRUE(redis_->Command({"CONFIG", "RESETSTAT"}).ok());
    for (int i = 0; i < kIterations; ++i) {
      const int64_t t0 = base::MonotonicNanos();
      fn();
      ms.push_back(static_cast<double>(base::MonotonicNanos() - t0) / 1e6);
    }
    std::sort(ms.begin(), ms.end());
    const double server = std::max(server_ms("evalsha"), server_ms("ping"));
    return Row{ms[ms.size() / 2], ms[ms.size() * 95 / 100], server};
  };
  std::vector<std::pair<std::string, Row>> rows;
  rows.emplace_back("PING round trip (baseline)",
                    time_it([&] { ASSERT_TRUE(redis_->Ping().ok()); }));
  auto expect_depths = [&](const std::vector<int64_t>& expected) {
    absl::StatusOr<std::vector<int64_t>> d =
        (*view)->MatchPrefixes(prompt, candidates);
    ASSERT_TRUE(d.ok()) << d.status();
    ASSERT_EQ(*d, expected);
  };
  // Nothing cached anywhere: EXISTS + one SMISMEMBER of 32 per candidate.
  rows.emplace_back("match, nothing cached", time_it([&] {
                      expect_depths(std::vector<int64_t>(8, 0));
                    }));
  // The typical affinity case: one worker holds the prefix (its events).
  Apply(*index, candidates[0], Kind::kStored, prompt);
  std::vector<int64_t> one(8, 0);
  one[0] = kPages;
  rows.emplace_back("match, 1 of 8 holds all (typical)",
                    time_it([&] { expect_depths(one); }));
  // Candidate i holds the first (i+1)/8 of the prompt: 36K page lookups.
  std::vector<int64_t> stairs;
  for (int i = 0; i < 8; ++i) {
    ASSERT_TRUE(index->Clear(candidates[i]).ok());
    Apply(*index, candidates[i], Kind::kStored,
          Slice(prompt, 0, kPages * (i + 1) / 8));
    stairs.push_back(static_cast<int64_t>(kPages * (i + 1) / 8));
  }
  rows.emplace_back("match, holding 1/8, 2/8 .. 8/8",
                    time_it([&] { expect_depths(stairs); }));
  // Worst case: every candidate holds the whole prompt (65536 lookups).
  for (int i = 0; i < 8; ++i)
    Apply(*index, candidates[i], Kind::kStored, prompt);
  rows.emplace_back("match, all 8 hold all (worst case)", time_it([&] {
                      expect_depths(std::vector<int64_t>(8, kPages));
                    }));
  // Dispatch to a worker that holds the prompt: SMISMEMBER only.
  rows.emplace_back(
      "RecordDispatch 8192, worker holds them", time_it([&] {
        ASSERT_TRUE((*view)->RecordDispatch(candidates[0], prompt).ok());
      }));
  // Dispatch to workers that hold nothing: 8192 predictions each (the first
  // 8 calls create them, later ones extend them).
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(index->Clear(candidates[i]).ok());
  int next = 0;
  rows.emplace_back(
      "RecordDispatch 8192, worker holds none", time_it([&] {
        ASSERT_TRUE(
            (*view)->RecordDispatch(candidates[next++ % 8], prompt).ok());
      }));
  // Every candidate holds the prompt only as predictions (ZMSCORE path).
  rows.emplace_back("match, all 8 predicted (dispatched)", time_it([&] {
                      expect_depths(std::vector<int64_t>(8, kPages));
                    }));
  // A worker's stored event for a whole new prompt.
  int ev = 0;
  rows.emplace_back("worker stored event, 8192 new pages", time_it([&] {
                      ASSERT_EQ(Apply(*index, absl::StrCat("ev-", ev++),
                                      Kind::kStored, prompt),
                                static_cast<int64_t>(kPages));
                    }));
  std::printf(
      "\nMatchPrefixes latency, 128K-token prompt = %zu pages, "
      "8 candidates, %d iterations, loopback redis-server 7:\n",
      kPages, kIterations);
  std::printf("  %-40s %10s %10s %14s\n", "case", "p50 ms", "p95 ms",
              "server ms/call");
  for (const auto& [name, t] : rows) {
    std::printf("  %-40s %10.3f %10.3f %14.3f\n", name.c_str(), t.p50, t.p95,
                t.server);
  }
  std::fflush(stdout);
}

}  // namespace
}  // namespace swaserve::cluster
