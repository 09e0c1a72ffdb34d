// The prefix-affinity index on a real Redis Cluster:
// 3 masters + 3 replicas (redis-cli --cluster create), the index split into
// 64 shards by anchor page (prefix_index.h, index_shard_mapper.h), fed by
// real WorkerRegistrations. A random workload of conversations sharing a
// system prompt is published identically to a single Redis and to the
// cluster; every match the router would make must agree (exactly when the
// match reaches the anchor page, never more otherwise), the shards must
// spread over the masters, the KV events snapshot must be the worker's
// cache, and a killed master must make the match fail fast (the router then
// routes by load) until its replica is promoted, when affinity returns.
#include <cstdio>
#include <map>
#include <random>
#include <set>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "lib/cluster/cluster_view.h"
#include "lib/cluster/index_mirror.h"
#include "lib/cluster/kv_events.h"
#include "lib/cluster/redis_client.h"
#include "lib/cluster/redis_cluster_protocol.h"
#include "lib/cluster/worker_registration.h"
#include "lib/metrics/registry.h"
#include "tests/integration/cluster/redis_cluster_server.h"
#include "tests/integration/cluster/redis_server.h"

namespace swaserve::cluster {
namespace {

using Kind = CacheEventOp::Kind;

constexpr int kAnchor = 4;          // anchor page K (small: short prompts cross it)
constexpr int kSystemPages = 3;     // shared by every prompt, below K
constexpr int kConversations = 24;
constexpr int kMaxTurnPages = 40;
constexpr int kWindowPages = 2;

uint64_t Mix(uint64_t prev, uint64_t content) {
  uint64_t z = prev * 0x9E3779B97F4A7C15ull + content + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return (z ^ (z >> 31)) | 1;
}

// The chained page hashes of conversation `c`'s first `pages` pages after
// the system prompt; `fork` > 0 switches to conversation c + 1 after that
// many of them (a prompt diverging mid-way).
std::vector<uint64_t> Prompt(int c, int pages, int fork = 0) {
  std::vector<uint64_t> out;
  uint64_t h = 0;
  for (int i = 0; i < kSystemPages; ++i) out.push_back(h = Mix(h, 1000 + i));
  for (int i = 0; i < pages; ++i) {
    const int conv = fork > 0 && i >= fork ? c + 1 : c;
    out.push_back(h = Mix(h, (static_cast<uint64_t>(conv) << 20) + i));
  }
  return out;
}

// A worker's prefix cache as a trie of page hashes (what kv::PrefixCache
// emits events for), publishing every change to several registrations.
class FakeWorker {
 public:
  explicit FakeWorker(std::vector<WorkerRegistration*> regs) : regs_(std::move(regs)) {}

  void Store(const std::vector<uint64_t>& prompt) {
    size_t first = 0;
    while (first < prompt.size() && pages_.contains(prompt[first])) ++first;
    if (first == prompt.size()) return;
    for (size_t i = first; i < prompt.size(); ++i) {
      const uint64_t parent = i == 0 ? 0 : prompt[i - 1];
      pages_[prompt[i]] = Page{.parent = parent, .depth = static_cast<int>(i)};
      if (parent != 0) ++pages_[parent].children;
    }
    Publish(Kind::kStored, {prompt.begin() + first, prompt.end()});
  }

  // Evicts a run of up to 3 pages ending at a random leaf.
  void EvictLeaf(std::mt19937_64& rng) {
    std::vector<uint64_t> leaves;
    for (const auto& [h, p] : pages_) {
      if (p.children == 0) leaves.push_back(h);
    }
    if (leaves.empty()) return;
    std::sort(leaves.begin(), leaves.end());
    std::vector<uint64_t> run = {leaves[rng() % leaves.size()]};
    while (run.size() < 3) {
      const uint64_t up = pages_.at(run.back()).parent;
      if (up == 0 || pages_.at(up).children != 1) break;
      run.push_back(up);
    }
    std::reverse(run.begin(), run.end());
    Publish(Kind::kRemoved, run);
    for (auto it = run.rbegin(); it != run.rend(); ++it) {
      const uint64_t parent = pages_.at(*it).parent;
      if (parent != 0) --pages_.at(parent).children;
      pages_.erase(*it);
    }
  }

  // Drops (or heals) the SWA KV of a run of up to 3 pages ending at a
  // random cached page.
  void SwaChange(std::mt19937_64& rng) {
    if (pages_.empty()) return;
    std::vector<uint64_t> all;
    for (const auto& [h, p] : pages_) all.push_back(h);
    std::sort(all.begin(), all.end());
    std::vector<uint64_t> run;
    for (uint64_t h = all[rng() % all.size()]; h != 0 && run.size() < 3; h = pages_.at(h).parent) {
      run.push_back(h);
    }
    std::reverse(run.begin(), run.end());
    Publish(rng() % 3 == 0 ? Kind::kSwaStored : Kind::kSwaRemoved, run);
  }

  std::set<uint64_t> Cached() const {
    std::set<uint64_t> out;
    for (const auto& [h, p] : pages_) out.insert(h);
    return out;
  }

 private:
  struct Page {
    uint64_t parent = 0;
    int depth = 0;
    int children = 0;
  };

  // `run` is a path segment in prefix order.
  void Publish(Kind kind, const std::vector<uint64_t>& run) {
    const Page& first = pages_.at(run.front());
    const int end = first.depth + static_cast<int>(run.size());
    uint64_t anchor = 0;
    if (end > kAnchor) {
      uint64_t h = run.back();
      while (pages_.at(h).depth > kAnchor) h = pages_.at(h).parent;
      anchor = h;
    }
    for (WorkerRegistration* reg : regs_) {
      reg->PublishCacheEvent(kind, run, first.depth, first.parent, anchor);
    }
  }

  std::vector<WorkerRegistration*> regs_;
  absl::flat_hash_map<uint64_t, Page> pages_;
};

WorkerInfo Info(const std::string& id) {
  WorkerInfo info;
  info.id = id;
  info.role = swaserve::v1::ROLE_PREFILL;
  info.model = "mimo-tiny";
  info.grpc_address = absl::StrCat("127.0.0.1:", 50000 + id.back());
  info.page_size = 16;
  info.full_pages = 4096;
  info.swa_pages = 512;
  info.max_running_requests = 8;
  return info;
}

bool Eventually(const std::function<bool()>& cond, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (cond()) return true;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return cond();
}

class ShardedIndexTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto cluster = testing::RedisClusterServer::Start(3, 1);
    if (absl::IsFailedPrecondition(cluster.status())) GTEST_SKIP() << cluster.status();
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = *std::move(cluster);
    auto single = testing::RedisServer::Start();
    ASSERT_TRUE(single.ok()) << single.status();
    single_ = *std::move(single);
    for (auto* redis : {&cluster_redis_, &cluster_router_redis_}) {
      auto c = RedisClient::Create(cluster_->ClientOptions());
      ASSERT_TRUE(c.ok()) << c.status();
      *redis = *std::move(c);
    }
    auto s = RedisClient::Create(single_->ClientOptions());
    ASSERT_TRUE(s.ok()) << s.status();
    single_redis_ = *std::move(s);
    index_.anchor_page = kAnchor;
    for (auto [redis, view] : {std::pair{cluster_router_redis_.get(), &cluster_view_},
                               std::pair{single_redis_.get(), &single_view_}}) {
      auto v = ClusterView::Create(
          {.redis = redis, .cluster = "shard", .index = index_,
           .sharded_load_max_age = absl::ZeroDuration()});
      ASSERT_TRUE(v.ok()) << v.status();
      *view = *std::move(v);
    }
    ASSERT_TRUE(cluster_view_->index().sharded());
    ASSERT_FALSE(single_view_->index().sharded());
  }

  std::unique_ptr<WorkerRegistration> Register(RedisClient* redis, const std::string& id) {
    WorkerRegistrationOptions o;
    o.redis = redis;
    o.cluster = "shard";
    o.info = Info(id);
    o.index = index_;
    o.record_ttl = absl::Seconds(3);
    o.heartbeat_interval = absl::Milliseconds(200);
    o.load_interval = absl::Milliseconds(50);
    o.event_flush_interval = absl::Milliseconds(10);
    o.load_fn = [] { return swaserve::v1::WorkerLoad(); };
    auto reg = WorkerRegistration::Create(std::move(o));
    EXPECT_TRUE(reg.ok()) << reg.status();
    if (!reg.ok()) return nullptr;
    EXPECT_TRUE((*reg)->WaitRegistered(absl::Seconds(10)));
    return *std::move(reg);
  }

  // A router's index mirror on the cluster (its own client: the mirror's
  // reads) and a view deciding from it.
  void StartClusterMirror(const std::vector<std::string>& ids) {
    RedisOptions o = cluster_->ClientOptions();
    o.command_timeout = std::max(o.command_timeout, absl::Seconds(2));
    auto c = RedisClient::Create(o);
    ASSERT_TRUE(c.ok()) << c.status();
    mirror_redis_ = *std::move(c);
    auto v = ClusterView::Create({.redis = cluster_router_redis_.get(), .cluster = "shard",
                                  .index = index_,
                                  .sharded_load_max_age = absl::ZeroDuration()});
    ASSERT_TRUE(v.ok()) << v.status();
    mirrored_view_ = *std::move(v);
    IndexMirrorOptions mo;
    mo.poll = absl::Milliseconds(50);
    mo.refresh = absl::Milliseconds(100);
    mo.metrics = &registry_;
    auto m = IndexMirror::Start(
        mirror_redis_.get(), mirrored_view_->keys(),
        [ids]() -> absl::StatusOr<std::vector<std::string>> { return ids; }, mo);
    ASSERT_TRUE(m.ok()) << m.status();
    mirror_ = *std::move(m);
    mirrored_view_->SetIndexMirror(mirror_.get());
  }

  // True once the mirror has applied every event of `ids` in the cluster.
  bool MirrorCaughtUp(const std::vector<std::string>& ids) {
    for (const std::string& id : ids) {
      auto r = cluster_router_redis_->Command({"GET", mirrored_view_->keys().EventSeqKey(id)});
      if (!r.ok()) return false;
      const uint64_t counter = r->is_nil() ? 0 : std::stoull(r->str);  // nil: no events yet
      if (mirror_->Seq(id) != counter) return false;
    }
    return true;
  }

  PrefixIndexOptions index_;
  std::unique_ptr<testing::RedisClusterServer> cluster_;
  metrics::Registry registry_;
  std::unique_ptr<RedisClient> mirror_redis_;
  std::unique_ptr<ClusterView> mirrored_view_;
  std::unique_ptr<IndexMirror> mirror_;
  std::unique_ptr<testing::RedisServer> single_;
  std::unique_ptr<RedisClient> cluster_redis_, cluster_router_redis_, single_redis_;
  std::unique_ptr<ClusterView> cluster_view_, single_view_;
};

TEST_F(ShardedIndexTest, MatchesAgreeWithASingleRedisAndTheShardsSpread) {
  const std::vector<std::string> ids = {"w0", "w1", "w2"};
  std::vector<std::unique_ptr<WorkerRegistration>> regs;
  std::vector<FakeWorker> workers;
  for (const std::string& id : ids) {
    regs.push_back(Register(cluster_redis_.get(), id));
    regs.push_back(Register(single_redis_.get(), id));
    ASSERT_NE(regs[regs.size() - 2], nullptr);
    ASSERT_NE(regs.back(), nullptr);
    workers.emplace_back(std::vector<WorkerRegistration*>{regs[regs.size() - 2].get(),
                                                          regs.back().get()});
  }
  std::mt19937_64 rng(7);
  for (int step = 0; step < 600; ++step) {
    FakeWorker& w = workers[rng() % workers.size()];
    const int r = static_cast<int>(rng() % 100);
    if (r < 50) {
      w.Store(Prompt(static_cast<int>(rng() % kConversations),
                     1 + static_cast<int>(rng() % kMaxTurnPages)));
    } else if (r < 80) {
      w.EvictLeaf(rng);
    } else {
      w.SwaChange(rng);
    }
  }
  for (auto& reg : regs) ASSERT_TRUE(reg->WaitEventsFlushed(absl::Seconds(20)));
  StartClusterMirror(ids);
  ASSERT_TRUE(Eventually([&] { return MirrorCaughtUp(ids); }, absl::Seconds(20)));

  int past_anchor = 0, exact_short = 0, mirror_deeper = 0;
  for (int q = 0; q < 300; ++q) {
    const int c = static_cast<int>(rng() % kConversations);
    const int pages = static_cast<int>(rng() % (kMaxTurnPages + 5));
    const int fork = rng() % 4 == 0 ? 1 + static_cast<int>(rng() % (kMaxTurnPages / 2)) : 0;
    const std::vector<uint64_t> prompt = Prompt(c, pages, fork);
    SCOPED_TRACE(absl::StrCat("query ", q, ": conversation ", c, ", ", prompt.size(),
                              " pages, fork ", fork));
    auto want = single_view_->MatchPrefixesAndLoads(prompt, ids, ids, kWindowPages);
    auto got = cluster_view_->MatchPrefixesAndLoads(prompt, ids, ids, kWindowPages);
    auto mirrored = mirrored_view_->MatchPrefixesAndLoads(prompt, ids, ids, kWindowPages);
    ASSERT_TRUE(want.ok()) << want.status();
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_TRUE(mirrored.ok()) << mirrored.status();
    // The cluster's mirror (the union of the shards) is exact: the single
    // Redis' answers, shallow matches included.
    ASSERT_EQ(mirrored->depths, want->depths);
    ASSERT_EQ(mirrored->safe_pages, want->safe_pages);
    ASSERT_EQ(mirrored->l1_pages, want->l1_pages);
    for (size_t i = 0; i < ids.size(); ++i) {
      ASSERT_TRUE(mirrored->loads[i].has_value());
      mirror_deeper += mirrored->depths[i] > got->depths[i];
    }
    for (size_t i = 0; i < ids.size(); ++i) {
      SCOPED_TRACE(ids[i]);
      ASSERT_TRUE(got->loads[i].has_value()) << "load report missing";
      if (want->depths[i] > kAnchor || prompt.size() <= static_cast<size_t>(kAnchor)) {
        // Past the anchor (or a prompt matched in the home shard): exact.
        ASSERT_EQ(got->depths[i], want->depths[i]);
        ASSERT_EQ(got->safe_pages[i], want->safe_pages[i]);
        ASSERT_EQ(got->l1_pages[i], want->l1_pages[i]);
        if (want->depths[i] > kAnchor) {
          ++past_anchor;
        } else {
          ++exact_short;
        }
      } else {
        // A shallow match may miss heads not copied to this shard: never
        // more than the truth.
        ASSERT_LE(got->depths[i], want->depths[i]);
        ASSERT_LE(got->safe_pages[i], want->safe_pages[i]);
      }
    }
  }
  EXPECT_GT(past_anchor, 100);
  EXPECT_GT(exact_short, 5);
  // Shallow matches whose heads were not in the prompt's shard: the sharded
  // script answered less, the mirror the truth.
  EXPECT_GT(mirror_deeper, 5);

  // Dispatches (predicted entries in the prompt's shard) extend the
  // mirror's depths as the single Redis' match extends its own — when the
  // prompt asked is in the dispatched one's shard (a prompt grown past the
  // anchor page moves from the home shard to its anchor's, which does not
  // hold the home shard's predictions: never more than the truth then).
  int predicted = 0, same_shard = 0;
  for (int q = 0; q < 60; ++q) {
    const int c = static_cast<int>(rng() % kConversations);
    const std::vector<uint64_t> prompt =
        Prompt(c, 1 + static_cast<int>(rng() % (kMaxTurnPages + 5)));
    const std::string& to = ids[rng() % ids.size()];
    ASSERT_TRUE(single_view_->RecordDispatch(to, prompt).ok());
    ASSERT_TRUE(cluster_view_->RecordDispatch(to, prompt).ok());
    std::vector<uint64_t> asked = prompt;
    if (rng() % 2 == 0) asked.push_back(Mix(asked.back(), 99));  // grown past it
    auto want = single_view_->MatchPrefixesAndLoads(asked, ids, ids, kWindowPages);
    auto mirrored = mirrored_view_->MatchPrefixesAndLoads(asked, ids, ids, kWindowPages);
    ASSERT_TRUE(want.ok()) << want.status();
    ASSERT_TRUE(mirrored.ok()) << mirrored.status();
    if (cluster_view_->index().MatchShard(asked) != cluster_view_->index().MatchShard(prompt)) {
      for (size_t i = 0; i < ids.size(); ++i) ASSERT_LE(mirrored->depths[i], want->depths[i]);
      continue;
    }
    ASSERT_EQ(mirrored->depths, want->depths) << "dispatch " << q;
    ++same_shard;
    std::vector<int64_t> held;
    ASSERT_TRUE(mirror_->Depths(asked, ids, &held));
    for (size_t i = 0; i < ids.size(); ++i) predicted += want->depths[i] > held[i];
  }
  EXPECT_GT(predicted, 20);
  EXPECT_GT(same_shard, 40);
  EXPECT_NE(registry_.RenderText().find("swaserve_index_mirror_workers 3"), std::string::npos);

  // The KV events snapshot (the union of the shards) is the worker's cache.
  KvEventReader reader(cluster_router_redis_.get(), cluster_view_->keys());
  for (size_t w = 0; w < ids.size(); ++w) {
    auto snapshot = reader.Snapshot(ids[w]);
    ASSERT_TRUE(snapshot.ok()) << snapshot.status();
    EXPECT_EQ(std::set<uint64_t>(snapshot->pages.begin(), snapshot->pages.end()),
              workers[w].Cached())
        << ids[w];
    EXPECT_GT(snapshot->seq, 0u);
  }

  // The shards spread over the three masters.
  auto sizes = cluster_redis_->CommandOnEveryMaster({"DBSIZE"});
  ASSERT_TRUE(sizes.ok()) << sizes.status();
  ASSERT_EQ(sizes->size(), 3u);
  for (const auto& [address, reply] : *sizes) {
    auto n = reply.AsInteger();
    ASSERT_TRUE(n.ok()) << n.status();
    EXPECT_GT(*n, 20) << address << " holds almost none of the index";
  }
}

TEST_F(ShardedIndexTest, AKilledMasterFailsFastThenAffinityReturnsAfterPromotion) {
  auto a = Register(cluster_redis_.get(), "wa");
  auto b = Register(cluster_redis_.get(), "wb");
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  FakeWorker wa({a.get()});
  const std::vector<uint64_t> prompt = Prompt(3, 20);
  wa.Store(prompt);
  ASSERT_TRUE(a->WaitEventsFlushed(absl::Seconds(10)));
  const std::vector<std::string> ids = {"wa", "wb"};
  auto before = cluster_view_->MatchPrefixesAndLoads(prompt, ids, ids, kWindowPages);
  ASSERT_TRUE(before.ok()) << before.status();
  ASSERT_EQ(before->depths, (std::vector<int64_t>{static_cast<int64_t>(prompt.size()), 0}));
  StartClusterMirror(ids);
  ASSERT_TRUE(Eventually([&] { return MirrorCaughtUp(ids); }, absl::Seconds(10)));
  auto mirrored = mirrored_view_->MatchPrefixesAndLoads(prompt, ids, ids, kWindowPages);
  ASSERT_TRUE(mirrored.ok()) << mirrored.status();
  ASSERT_EQ(mirrored->depths, before->depths);

  // Let the replica catch up (WAIT on the shard's master), then kill it.
  const int shard = cluster_view_->index().MatchShard(prompt);
  const std::string key = cluster_view_->keys().PrefixKey("wa", shard);
  auto synced = cluster_redis_->Pipeline({{"EXISTS", key}, {"WAIT", "1", "2000"}}, "test");
  ASSERT_TRUE(synced.ok()) << synced.status();
  ASSERT_EQ((*synced)[1].integer, 1) << "the replica did not acknowledge";
  auto master = cluster_->MasterOfSlot(RedisKeySlot(key));
  ASSERT_TRUE(master.ok()) << master.status();
  const absl::Time killed = absl::Now();
  ASSERT_TRUE(cluster_->node(*master).Kill().ok());

  // The match fails (Unavailable: the router routes by load alone) and
  // fails fast, not after a long timeout.
  ASSERT_TRUE(Eventually(
      [&] {
        auto r = cluster_view_->MatchPrefixesAndLoads(prompt, ids, ids, kWindowPages);
        return !r.ok() && absl::IsUnavailable(r.status());
      },
      absl::Seconds(5)));
  const absl::Time t0 = absl::Now();
  auto during = cluster_view_->MatchPrefixesAndLoads(prompt, ids, ids, kWindowPages);
  const absl::Duration fail_time = absl::Now() - t0;
  if (!during.ok()) {
    EXPECT_LT(fail_time, absl::Milliseconds(600)) << during.status();
  }
  // Meanwhile the mirrored view keeps the affinity: the mirror's depths,
  // without the dead shard's predictions.
  if (!during.ok()) {
    auto kept = mirrored_view_->MatchPrefixesAndLoads(prompt, ids, ids, kWindowPages);
    ASSERT_TRUE(kept.ok()) << kept.status();
    EXPECT_TRUE(kept->redis_unreadable);
    EXPECT_EQ(kept->depths, before->depths);
    EXPECT_EQ(kept->safe_pages, mirrored->safe_pages);
    EXPECT_EQ(kept->l1_pages, mirrored->l1_pages);
  }

  // The replica is promoted; the same match finds worker wa again.
  ASSERT_TRUE(Eventually(
      [&] {
        auto r = cluster_view_->MatchPrefixesAndLoads(prompt, ids, ids, kWindowPages);
        return r.ok() && r->depths[0] == static_cast<int64_t>(prompt.size());
      },
      absl::Seconds(30)))
      << "affinity did not return after failover";
  std::fprintf(stderr, "affinity back %.1f s after the master was killed\n",
               absl::ToDoubleSeconds(absl::Now() - killed));
  // And the worker keeps publishing into the promoted shard.
  wa.Store(Prompt(3, 30));
  ASSERT_TRUE(a->WaitEventsFlushed(absl::Seconds(10)));
  auto after = cluster_view_->MatchPrefixesAndLoads(Prompt(3, 30), ids, ids, kWindowPages);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->depths[0], kSystemPages + 30);
  // The mirror reads the streams again (on the promoted replica) and sees
  // the new store.
  EXPECT_TRUE(Eventually(
      [&] {
        auto r = mirrored_view_->MatchPrefixesAndLoads(Prompt(3, 30), ids, ids, kWindowPages);
        return r.ok() && r->depths[0] == kSystemPages + 30 && MirrorCaughtUp(ids);
      },
      absl::Seconds(20)))
      << "the mirror did not recover after failover";
}

}  // namespace
}  // namespace swaserve::cluster
