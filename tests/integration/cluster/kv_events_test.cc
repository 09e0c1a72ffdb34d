// The KV events API (kv_events.h) against a real redis-server: a
// consumer that starts from a snapshot taken mid-way and then follows the
// stream ends with exactly the worker's index state after random tree-shaped
// event batches (stored, evicted leaves, SWA drops and heals, tier moves,
// clears, the bound's clear); every op arrives once, in seq order, with its
// pool and tier; a consumer that falls behind the trimmed stream, or whose
// Redis lost the stream, gets DataLoss and recovers from a new snapshot;
// entries of an unknown version are passed over, their seqs counted.
#include "lib/cluster/kv_events.h"

#include <algorithm>
#include <atomic>
#include <random>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "lib/base/subprocess.h"
#include "gtest/gtest.h"
#include "lib/cluster/key_schema.h"
#include "lib/cluster/prefix_index.h"
#include "lib/cluster/redis_client.h"
#include "tests/integration/cluster/redis_server.h"

namespace swaserve::cluster {
namespace {

using Kind = CacheEventOp::Kind;

class KvEventsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = testing::RedisServer::Start();
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    auto client = RedisClient::Create(server_->ClientOptions());
    ASSERT_TRUE(client.ok()) << client.status();
    redis_ = *std::move(client);
  }
  std::unique_ptr<PrefixIndex> MakeIndex(PrefixIndexOptions o = {}) {
    auto index = PrefixIndex::Create(redis_.get(), keys_, o);
    EXPECT_TRUE(index.ok()) << index.status();
    return *std::move(index);
  }
  absl::flat_hash_set<uint64_t> SetMembers(const std::string& key) {
    absl::StatusOr<RedisReply> r = redis_->Command({"SMEMBERS", key});
    EXPECT_TRUE(r.ok()) << r.status();
    absl::flat_hash_set<uint64_t> out;
    for (const RedisReply& m : r->elements) {
      uint64_t h = 0;
      for (unsigned char c : m.str) h = (h << 8) | c;
      out.insert(h);
    }
    return out;
  }
  // Reads everything after the consumer's position and applies it.
  absl::Status CatchUp(KvEventReader& reader, const std::string& worker, KvWorkerState& state,
                       std::vector<KvEvent>* seen = nullptr) {
    while (true) {
      absl::StatusOr<std::vector<KvEvent>> events =
          reader.Read(worker, state.id(), state.seq(), 50, absl::ZeroDuration(), state.epoch());
      if (!events.ok()) return events.status();
      if (events->empty()) return absl::OkStatus();
      for (const KvEvent& e : *events) {
        if (absl::Status s = state.Apply(e); !s.ok()) return s;
        if (seen != nullptr) seen->push_back(e);
      }
    }
  }

  std::unique_ptr<testing::RedisServer> server_;
  std::unique_ptr<RedisClient> redis_;
  KeySchema keys_ = *KeySchema::Create("test");
};

std::vector<uint64_t> Chain(uint64_t seed, size_t n) {
  std::mt19937_64 rng(seed);
  std::vector<uint64_t> v(n);
  for (uint64_t& h : v) h = rng();
  return v;
}

TEST_F(KvEventsTest, EveryOpArrivesOnceInOrderWithItsPoolAndTier) {
  auto index = MakeIndex();
  const std::vector<uint64_t> c = Chain(1, 10);
  std::vector<CacheEventOp> ops = {
      {Kind::kStored, {c.begin(), c.begin() + 8}},
      {Kind::kSwaRemoved, {c[6], c[7]}},
      {Kind::kTierDown, {c[7]}},
      {Kind::kSwaStored, {c[6]}},
      {Kind::kTierUp, {c[7]}},
      {Kind::kRemoved, {c[7]}},
      {Kind::kCleared, {}},
  };
  ASSERT_TRUE(index->Apply("w", ops).ok());
  KvEventReader reader(redis_.get(), keys_);
  absl::StatusOr<std::vector<KvEvent>> got = reader.Read("w", "0-0", 0, 100);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 7u);
  const struct {
    KvEvent::Op op;
    const char* pool;
    const char* tier;
    size_t pages;
  } want[] = {{KvEvent::Op::kStored, "full", "l1", 8},
              {KvEvent::Op::kSwaRemoved, "swa", "", 2},
              {KvEvent::Op::kTierChanged, "full", "l2", 1},
              {KvEvent::Op::kSwaStored, "swa", "", 1},
              {KvEvent::Op::kTierChanged, "full", "l1", 1},
              {KvEvent::Op::kRemoved, "full", "", 1},
              {KvEvent::Op::kCleared, "", "", 0}};
  for (size_t i = 0; i < 7; ++i) {
    const KvEvent& e = (*got)[i];
    EXPECT_EQ(e.seq, i + 1);
    EXPECT_EQ(e.op, want[i].op) << i;
    EXPECT_EQ(e.pool, want[i].pool) << i;
    EXPECT_EQ(e.tier, want[i].tier) << i;
    EXPECT_EQ(e.hashes.size(), want[i].pages) << i;
  }
  EXPECT_EQ((*got)[0].hashes, std::vector<uint64_t>(c.begin(), c.begin() + 8));
  // Nothing after the last one.
  got = reader.Read("w", got->back().id, 7, 100);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->empty());
  // A stream turned off (event_stream_max_len = 0) writes nothing.
  auto quiet = MakeIndex({.event_stream_max_len = 0});
  ASSERT_TRUE(quiet->Apply("q", ops).ok());
  got = reader.Read("q", "0-0", 0, 100);
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(got->empty());
}

// Random tree-shaped workloads; a consumer joins mid-way from a snapshot.
TEST_F(KvEventsTest, SnapshotPlusStreamEqualsTheIndexAfterRandomWorkloads) {
  auto index = MakeIndex({.max_entries_per_worker = 3000});
  KvEventReader reader(redis_.get(), keys_);
  std::mt19937_64 rng(20261202);
  std::vector<std::vector<uint64_t>> chains;
  absl::flat_hash_map<uint64_t, uint64_t> parent;
  for (int i = 0; i < 30; ++i) {
    std::vector<uint64_t> chain;
    if (!chains.empty() && rng() % 3 != 0) {
      const auto& base = chains[rng() % chains.size()];
      chain.assign(base.begin(), base.begin() + rng() % (base.size() + 1));
    }
    for (size_t k = 0, n = 1 + rng() % 150; k < n; ++k) chain.push_back(rng());
    for (size_t k = 1; k < chain.size(); ++k) parent[chain[k]] = chain[k - 1];
    chains.push_back(std::move(chain));
  }
  for (const char* w : {"w1", "w2"}) {
    absl::flat_hash_set<uint64_t> stored;  // to evict leaves only
    KvWorkerState consumer;
    bool joined = false;
    int64_t clears = 0;
    for (int round = 0; round < 60; ++round) {
      std::vector<CacheEventOp> ops;
      for (int k = 0, n = 1 + static_cast<int>(rng() % 4); k < n; ++k) {
        const auto& chain = chains[rng() % chains.size()];
        const int what = static_cast<int>(rng() % 20);
        const size_t len = rng() % (chain.size() + 1);
        std::vector<uint64_t> prefix(chain.begin(), chain.begin() + len);
        if (what < 8) {
          ops.push_back({Kind::kStored, prefix});
          stored.insert(prefix.begin(), prefix.end());
        } else if (what < 13) {
          absl::flat_hash_map<uint64_t, int> children;
          for (uint64_t h : stored) {
            if (auto p = parent.find(h); p != parent.end()) ++children[p->second];
          }
          std::vector<uint64_t> removed;
          for (size_t i = chain.size(); i > len; --i) {
            const uint64_t h = chain[i - 1];
            if (!stored.contains(h)) continue;
            if (children[h] > 0) break;
            stored.erase(h);
            if (auto p = parent.find(h); p != parent.end()) --children[p->second];
            removed.push_back(h);
          }
          ops.push_back({Kind::kRemoved, removed});
        } else if (what < 15) {
          ops.push_back({Kind::kSwaRemoved, prefix});
        } else if (what < 16) {
          ops.push_back({Kind::kSwaStored, prefix});
        } else if (what < 18) {
          ops.push_back({rng() % 2 ? Kind::kTierDown : Kind::kTierUp, prefix});
        } else if (what < 19) {
          ops.push_back({Kind::kCleared, {}});
          stored.clear();
          ++clears;
        }
      }
      absl::StatusOr<int64_t> size = index->Apply(w, ops);
      ASSERT_TRUE(size.ok()) << size.status();
      if (*size == 0) stored.clear();  // the bound's clear (or a real one)
      if (round == 20) {
        absl::StatusOr<KvSnapshot> snap = reader.Snapshot(w);
        ASSERT_TRUE(snap.ok()) << snap.status();
        consumer.Reset(*snap);
        joined = true;
      }
      if (joined && round % 7 == 0) ASSERT_TRUE(CatchUp(reader, w, consumer).ok());
    }
    ASSERT_TRUE(CatchUp(reader, w, consumer).ok());
    EXPECT_EQ(consumer.pages(), SetMembers(keys_.PrefixKey(w))) << w;
    EXPECT_EQ(consumer.swa_gone(), SetMembers(keys_.SwaGoneKey(w))) << w;
    EXPECT_EQ(consumer.lower(), SetMembers(keys_.LowerTierKey(w))) << w;
    // The consumer's depths are the index's (no predictions here).
    for (const auto& chain : chains) {
      absl::StatusOr<std::vector<int64_t>> d = index->Match(chain, {std::string(w)});
      ASSERT_TRUE(d.ok());
      EXPECT_EQ(consumer.Depth(chain), (*d)[0]);
    }
    RecordProperty(absl::StrCat(w, "_clears"), static_cast<int>(clears));
  }
}

// A snapshot of large SETs is scanned (SSCAN, a step at a time) while the
// worker keeps writing; caught up from its position it equals the index:
// what the scan saw or missed of the writes meanwhile are events after the
// position, which the catch-up replays.
TEST_F(KvEventsTest, AScannedSnapshotTakenDuringWritesCatchesUpExactly) {
  auto index = MakeIndex();
  const std::vector<uint64_t> base = Chain(11, 30000);
  for (size_t i = 0; i < base.size(); i += 5000) {
    const CacheEventOp op{Kind::kStored, {base.begin() + i, base.begin() + i + 5000}};
    ASSERT_TRUE(index->Apply("w", absl::MakeConstSpan(&op, 1)).ok());
  }
  const CacheEventOp gone{Kind::kSwaRemoved, {base.begin(), base.begin() + 12000}};
  ASSERT_TRUE(index->Apply("w", absl::MakeConstSpan(&gone, 1)).ok());
  std::atomic<int> ops{0};
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    std::mt19937_64 rng(5);
    // At most 500 ops: the stream keeps the last 1,000 (event_stream_max_len).
    while (!stop.load() && ops.load() < 500) {
      const size_t at = rng() % base.size();
      const size_t len = 1 + rng() % 300;
      std::vector<uint64_t> run(base.begin() + at,
                                base.begin() + std::min(base.size(), at + len));
      const Kind kinds[] = {Kind::kRemoved, Kind::kStored, Kind::kSwaRemoved, Kind::kSwaStored,
                            Kind::kTierDown, Kind::kTierUp};
      if (rng() % 5 == 0) run = Chain(rng(), len);  // fresh pages
      const CacheEventOp op{kinds[rng() % 6], run};
      ASSERT_TRUE(index->Apply("w", absl::MakeConstSpan(&op, 1)).ok());
      ops.fetch_add(1);
    }
  });
  while (ops.load() < 20) absl::SleepFor(absl::Milliseconds(1));
  KvEventReader reader(redis_.get(), keys_, /*smembers_max=*/1000);
  const int before = ops.load();
  absl::StatusOr<KvSnapshot> snap = reader.Snapshot("w");
  const int after = ops.load();
  stop = true;
  writer.join();
  ASSERT_TRUE(snap.ok()) << snap.status();
  EXPECT_GT(after, before) << "no write landed during the scan";
  EXPECT_GT(snap->pages.size(), 20000u);
  KvWorkerState consumer;
  consumer.Reset(*snap);
  ASSERT_TRUE(CatchUp(reader, "w", consumer).ok());
  EXPECT_EQ(consumer.pages(), SetMembers(keys_.PrefixKey("w")));
  EXPECT_EQ(consumer.swa_gone(), SetMembers(keys_.SwaGoneKey("w")));
  EXPECT_EQ(consumer.lower(), SetMembers(keys_.LowerTierKey("w")));
  // The same snapshot through SMEMBERS alone (no write now) holds the same.
  KvEventReader whole(redis_.get(), keys_);
  absl::StatusOr<KvSnapshot> a = whole.Snapshot("w");
  absl::StatusOr<KvSnapshot> b = reader.Snapshot("w");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(absl::flat_hash_set<uint64_t>(a->pages.begin(), a->pages.end()),
            absl::flat_hash_set<uint64_t>(b->pages.begin(), b->pages.end()));
  EXPECT_EQ(a->swa_gone.size(), b->swa_gone.size());
  EXPECT_EQ(a->lower.size(), b->lower.size());
}

TEST_F(KvEventsTest, AConsumerBehindTheTrimmedStreamGetsDataLossAndResyncs) {
  auto index = MakeIndex({.event_stream_max_len = 5});
  KvEventReader reader(redis_.get(), keys_);
  KvWorkerState consumer;
  const std::vector<uint64_t> c = Chain(3, 400);
  ASSERT_TRUE(index->Apply("w", {{CacheEventOp{Kind::kStored, {c[0]}}}}).ok());
  ASSERT_TRUE(CatchUp(reader, "w", consumer).ok());
  EXPECT_EQ(consumer.seq(), 1u);
  // 300 more ops, one by one: the approximate trim (whole macro nodes of
  // 100 entries) drops the early ones.
  for (size_t i = 1; i < 300; ++i) {
    ASSERT_TRUE(index->Apply("w", {{CacheEventOp{Kind::kStored, {c[i]}}}}).ok());
  }
  absl::Status s = CatchUp(reader, "w", consumer);
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  absl::StatusOr<KvSnapshot> snap = reader.Snapshot("w");
  ASSERT_TRUE(snap.ok()) << snap.status();
  EXPECT_EQ(snap->seq, 300u);
  consumer.Reset(*snap);
  ASSERT_TRUE(index->Apply("w", {{CacheEventOp{Kind::kStored, {c[300]}}}}).ok());
  ASSERT_TRUE(CatchUp(reader, "w", consumer).ok());
  EXPECT_EQ(consumer.seq(), 301u);
  EXPECT_EQ(consumer.Depth(c), 301);
  // Redis loses everything (a flush stands for a restart without
  // persistence): the counter is behind the consumer -> DataLoss.
  ASSERT_TRUE(redis_->Command({"FLUSHALL"}).ok());
  s = CatchUp(reader, "w", consumer);
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  snap = reader.Snapshot("w");
  ASSERT_TRUE(snap.ok());
  EXPECT_EQ(snap->seq, 0u);
  EXPECT_TRUE(snap->pages.empty());
}

TEST_F(KvEventsTest, AStreamRestartedBehindTheConsumersPositionIsAGap) {
  auto index = MakeIndex();
  KvEventReader reader(redis_.get(), keys_);
  const std::vector<uint64_t> c = Chain(6, 8);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(index->Apply("w", {{CacheEventOp{Kind::kStored, {c[i]}}}}).ok());
  }
  KvWorkerState consumer;
  ASSERT_TRUE(CatchUp(reader, "w", consumer).ok());
  ASSERT_EQ(consumer.seq(), 3u);
  const std::string epoch = consumer.epoch();
  ASSERT_FALSE(epoch.empty());
  // Redis loses the stream, and the worker writes 4 more events: seq 1..4
  // of a new stream, with a new epoch.
  ASSERT_TRUE(redis_->Command({"DEL", keys_.EventsKey("w"), keys_.EventSeqKey("w"),
                               keys_.EventEpochKey("w")})
                  .ok());
  for (int i = 3; i < 7; ++i) {
    ASSERT_TRUE(index->Apply("w", {{CacheEventOp{Kind::kStored, {c[i]}}}}).ok());
  }
  // New entries 1..3 at or below the consumer's position (a Redis whose
  // clock is behind, or the same millisecond) are skipped by XREAD: the
  // XDEL shows the consumer what it then sees, seq 4, right after its 3.
  absl::StatusOr<RedisReply> entries =
      redis_->Command({"XRANGE", keys_.EventsKey("w"), "-", "+", "COUNT", "3"});
  ASSERT_TRUE(entries.ok() && entries->elements.size() == 3u);
  for (const RedisReply& e : entries->elements) {
    ASSERT_TRUE(redis_->Command({"XDEL", keys_.EventsKey("w"), e.elements[0].str}).ok());
  }
  // Without the epoch the seq looks continuous; with it, it is a gap.
  absl::StatusOr<std::vector<KvEvent>> blind = reader.Read("w", consumer.id(), 3, 10);
  ASSERT_TRUE(blind.ok()) << blind.status();
  ASSERT_EQ(blind->size(), 1u);
  EXPECT_EQ(blind->front().seq, 4u);
  EXPECT_NE(blind->front().epoch, epoch);
  EXPECT_FALSE(KvWorkerState(consumer).Apply(blind->front()).ok());
  absl::Status s = CatchUp(reader, "w", consumer);
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  // Nothing new after the last entry, but the epoch key changed: a gap too.
  absl::StatusOr<std::vector<KvEvent>> quiet =
      reader.Read("w", blind->front().id, 4, 10, absl::ZeroDuration(), epoch);
  EXPECT_TRUE(absl::IsDataLoss(quiet.status())) << quiet.status();
  // The snapshot takes the new epoch, and reading on from it is in order.
  absl::StatusOr<KvSnapshot> snap = reader.Snapshot("w");
  ASSERT_TRUE(snap.ok()) << snap.status();
  EXPECT_EQ(snap->epoch, blind->front().epoch);
  consumer.Reset(*snap);
  ASSERT_TRUE(index->Apply("w", {{CacheEventOp{Kind::kStored, {c[7]}}}}).ok());
  ASSERT_TRUE(CatchUp(reader, "w", consumer).ok());
  EXPECT_EQ(consumer.seq(), 5u);
  EXPECT_EQ(consumer.Depth(c), 8);
}

TEST_F(KvEventsTest, EntriesOfAnUnknownVersionArePassedOverInSequence) {
  auto index = MakeIndex();
  KvEventReader reader(redis_.get(), keys_);
  const std::vector<uint64_t> c = Chain(4, 3);
  ASSERT_TRUE(index->Apply("w", {{CacheEventOp{Kind::kStored, {c[0]}}}}).ok());
  // A future producer's entry (the counter moves with it).
  ASSERT_TRUE(redis_->Command({"INCR", keys_.EventSeqKey("w")}).ok());
  ASSERT_TRUE(redis_->Command({"XADD", keys_.EventsKey("w"), "*", "v", "2", "seq", "2", "op",
                               "something_new"})
                  .ok());
  ASSERT_TRUE(index->Apply("w", {{CacheEventOp{Kind::kStored, {c[1]}}}}).ok());
  KvWorkerState consumer;
  ASSERT_TRUE(CatchUp(reader, "w", consumer).ok());
  EXPECT_EQ(consumer.seq(), 3u);
  EXPECT_EQ(consumer.Depth(c), 2);
  absl::StatusOr<std::vector<KvEvent>> got = reader.Read("w", "0-0", 0, 10);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 3u);
  EXPECT_EQ((*got)[1].op, KvEvent::Op::kUnknown);
  EXPECT_EQ((*got)[1].seq, 2u);
}

#ifdef SWASERVE_CLI_BIN
// `swaserve kv-events` prints a worker's snapshot and events, and lists the
// registered workers with their last seq.
TEST_F(KvEventsTest, TheCliPrintsSnapshotAndEvents) {
  auto index = MakeIndex();
  const std::vector<uint64_t> c = Chain(9, 5);
  ASSERT_TRUE(index->Apply("w", {{CacheEventOp{Kind::kStored, c}},
                                 {CacheEventOp{Kind::kSwaRemoved, {c[4]}}}})
                  .ok());
  const std::string redis = absl::StrCat("127.0.0.1:", server_->port());
  std::string out;
  absl::StatusOr<int> rc = base::RunCommand(
      {SWASERVE_CLI_BIN, "kv-events", "--redis=" + redis, "--cluster=test", "--worker=w"}, &out,
      absl::Seconds(30));
  ASSERT_TRUE(rc.ok()) << rc.status();
  EXPECT_EQ(*rc, 0) << out;
  EXPECT_NE(out.find("snapshot seq 2 "), std::string::npos) << out;
  EXPECT_NE(out.find("in L2; epoch "), std::string::npos) << out;
  EXPECT_EQ(out.find("epoch -"), std::string::npos) << "the stream's epoch is not printed: " << out;
  EXPECT_NE(out.find("5 pages, 1 without SWA KV, 0 in L2"), std::string::npos) << out;
  out.clear();
  rc = base::RunCommand({SWASERVE_CLI_BIN, "kv-events", "--redis=" + redis, "--cluster=test",
                         "--worker=w", "--history"},
                        &out, absl::Seconds(30));
  ASSERT_TRUE(rc.ok()) << rc.status();
  EXPECT_EQ(*rc, 0) << out;
  EXPECT_NE(out.find(absl::StrFormat("seq 1 stored pool=full tier=l1 pages=5 first=%016x", c[0])),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("seq 2 swa_removed pool=swa tier= pages=1"), std::string::npos) << out;
  out.clear();
  rc = base::RunCommand({SWASERVE_CLI_BIN, "kv-events", "--redis=127.0.0.1:1"}, &out,
                        absl::Seconds(30));
  ASSERT_TRUE(rc.ok());
  EXPECT_EQ(*rc, 1) << out;
  EXPECT_NE(out.find("cannot read the registry"), std::string::npos) << out;
}
#endif

}  // namespace
}  // namespace swaserve::cluster
