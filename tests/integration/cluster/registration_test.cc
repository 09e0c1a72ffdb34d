// WorkerRegistration and ClusterView against a real redis-server: register,
// heartbeat, expiry, load reports, cache events into the prefix index, a
// second router replica seeing the same state, and Redis being killed and
// restarted on the same port while a worker keeps publishing.
#include <signal.h>

#include <cstdio>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/cluster/cluster_view.h"
#include "lib/cluster/redis_client.h"
#include "lib/cluster/worker_registration.h"
#include "lib/metrics/registry.h"
#include "tests/integration/cluster/redis_server.h"

namespace swaserve::cluster {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using namespace std::string_literals;

// Polls `cond` every 10 ms until it holds or `timeout` passes.
bool Eventually(const std::function<bool()>& cond, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (cond()) return true;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return cond();
}

std::vector<uint64_t> Chain(uint64_t seed, size_t n) {
  std::mt19937_64 rng(seed);
  std::vector<uint64_t> v(n);
  for (uint64_t& h : v) h = rng();
  return v;
}

WorkerInfo Info(const std::string& id) {
  WorkerInfo info;
  info.id = id;
  info.role = swaserve::v1::ROLE_PREFILL;
  info.model = "mimo-tiny";
  info.bucket = 1;
  info.bucket_min_tokens = 65536;
  info.bucket_max_tokens = 262144;
  info.grpc_address = "127.0.0.1:50051";
  info.ucx_address = "\x00\x7f\xff ucx\r\n"s;  // NUL included
  info.page_size = 16;
  info.full_pages = 4096;
  info.swa_pages = 512;
  info.max_running_requests = 32;
  return info;
}

class RegistrationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = testing::RedisServer::Start();
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    worker_redis_ = NewClient();
    router_redis_ = NewClient();
    auto view =
        ClusterView::Create({.redis = router_redis_.get(), .cluster = "itest"});
    ASSERT_TRUE(view.ok()) << view.status();
    view_ = *std::move(view);
  }

  void TearDown() override {
    if (HasFailure() && server_ != nullptr) {
      std::fprintf(stderr, "redis log:\n%s\n", server_->ReadLog().c_str());
    }
  }

  std::unique_ptr<RedisClient> NewClient() {
    auto client = RedisClient::Create(server_->ClientOptions());
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }

  // Fast timings so that expiry and recovery take well under a second.
  WorkerRegistrationOptions FastOptions(const std::string& id) {
    WorkerRegistrationOptions o;
    o.redis = worker_redis_.get();
    o.cluster = "itest";
    o.info = Info(id);
    o.record_ttl = absl::Milliseconds(600);
    o.heartbeat_interval = absl::Milliseconds(100);
    o.load_interval = absl::Milliseconds(50);
    o.load_ttl = absl::Milliseconds(300);
    o.event_flush_interval = absl::Milliseconds(10);
    return o;
  }

  std::unique_ptr<WorkerRegistration> Start(WorkerRegistrationOptions o) {
    auto reg = WorkerRegistration::Create(std::move(o));
    EXPECT_TRUE(reg.ok()) << reg.status();
    return reg.ok() ? *std::move(reg) : nullptr;
  }

  std::vector<std::string> ListedIds(ClusterView& view) {
    absl::StatusOr<std::vector<WorkerInfo>> workers = view.ListWorkers();
    EXPECT_TRUE(workers.ok()) << workers.status();
    std::vector<std::string> ids;
    if (workers.ok()) {
      for (const WorkerInfo& w : *workers) ids.push_back(w.id);
    }
    return ids;
  }

  int64_t Depth(ClusterView& view, const std::vector<uint64_t>& hashes,
                const std::string& id) {
    absl::StatusOr<std::vector<int64_t>> d = view.MatchPrefixes(hashes, {id});
    return d.ok() ? (*d)[0] : -1;
  }

  std::unique_ptr<testing::RedisServer> server_;
  std::unique_ptr<RedisClient> worker_redis_;
  std::unique_ptr<RedisClient> router_redis_;
  std::unique_ptr<ClusterView> view_;
};

TEST_F(RegistrationTest, RegistersTheRecordAndDeregistersOnStop) {
  metrics::Registry registry;
  RedisOptions redis_options = server_->ClientOptions();
  redis_options.metrics = &registry;
  auto redis = RedisClient::Create(redis_options);
  ASSERT_TRUE(redis.ok()) << redis.status();
  WorkerRegistrationOptions o = FastOptions("prefill-a");
  o.redis = redis->get();
  o.metrics = &registry;
  auto reg = Start(o);
  ASSERT_TRUE(reg->WaitRegistered(absl::Seconds(5)));
  absl::StatusOr<std::vector<WorkerInfo>> workers = view_->ListWorkers();
  ASSERT_TRUE(workers.ok()) << workers.status();
  ASSERT_EQ(workers->size(), 1u);
  const WorkerInfo& w = (*workers)[0];
  WorkerInfo expected = Info("prefill-a");
  expected.started_at_ms = reg->info().started_at_ms;
  expected.incarnation = reg->info().incarnation;
  EXPECT_NE(expected.incarnation, 0u);
  EXPECT_NEAR(static_cast<double>(expected.started_at_ms),
              static_cast<double>(absl::ToUnixMillis(absl::Now())), 10000);
  EXPECT_EQ(w, expected);  // every field, the binary UCX address included
  absl::StatusOr<RedisReply> pttl =
      router_redis_->Command({"PTTL", view_->keys().WorkerKey("prefill-a")});
  ASSERT_TRUE(pttl.ok());
  EXPECT_GT(pttl->integer, 0);
  EXPECT_LE(pttl->integer, 600);
  EXPECT_THAT(registry.RenderText(),
              HasSubstr("swaserve_cluster_registered 1\n"));

  reg->Stop();
  EXPECT_TRUE(ListedIds(*view_).empty());
  absl::StatusOr<RedisReply> keys =
      router_redis_->Command({"KEYS", "swaserve:v1:itest:*"});
  ASSERT_TRUE(keys.ok());
  EXPECT_TRUE(keys->elements.empty()) << keys->DebugString();
  EXPECT_THAT(registry.RenderText(),
              HasSubstr("swaserve_cluster_registered 0\n"));
  EXPECT_THAT(registry.RenderText(),
              HasSubstr("swaserve_redis_seconds_count{op=\"register\"}"));
}

TEST_F(RegistrationTest, HeartbeatKeepsTheRecordAndItExpiresWithinTtlAfter) {
  WorkerRegistrationOptions o = FastOptions("decode-a");
  o.info.role = swaserve::v1::ROLE_DECODE;
  o.deregister_on_stop = false;  // a crash: nobody deletes the record
  auto reg = Start(o);
  ASSERT_TRUE(reg->WaitRegistered(absl::Seconds(5)));
  // Alive for well beyond one TTL thanks to the heartbeat.
  absl::SleepFor(absl::Milliseconds(1500));
  EXPECT_THAT(ListedIds(*view_), ElementsAre("decode-a"));
  EXPECT_GE(reg->stats().heartbeats, 5u);
  EXPECT_EQ(reg->stats().registrations, 1u);

  reg->Stop();
  const absl::Time stopped = absl::Now();
  EXPECT_TRUE(
      Eventually([&] { return ListedIds(*view_).empty(); }, absl::Seconds(3)));
  const absl::Duration gone_after = absl::Now() - stopped;
  EXPECT_LE(gone_after, absl::Milliseconds(600 + 300));  // TTL + slack
  // ListWorkers also removed the dead id from the worker set.
  absl::StatusOr<RedisReply> members =
      router_redis_->Command({"SMEMBERS", view_->keys().WorkersKey()});
  ASSERT_TRUE(members.ok());
  EXPECT_TRUE(members->elements.empty()) << members->DebugString();
}

TEST_F(RegistrationTest, LoadReportsAreReadBackAndExpire) {
  std::atomic<uint32_t> queued{7};
  WorkerRegistrationOptions o = FastOptions("prefill-load");
  o.deregister_on_stop = false;
  o.load_fn = [&] {
    swaserve::v1::WorkerLoad load;
    load.set_queued_requests(queued.load());
    load.set_queued_uncached_tokens(123456);
    load.set_running_requests(3);
    load.set_free_full_pages(1000);
    load.set_total_full_pages(4096);
    load.set_free_swa_pages(100);
    load.set_total_swa_pages(512);
    return load;
  };
  auto reg = Start(o);
  ASSERT_TRUE(reg->WaitRegistered(absl::Seconds(5)));
  std::optional<swaserve::v1::WorkerLoad> load;
  ASSERT_TRUE(Eventually(
      [&] {
        auto loads = view_->GetLoads({"prefill-load", "nobody"});
        if (!loads.ok() || loads->size() != 2 || (*loads)[1].has_value()) {
          return false;
        }
        load = (*loads)[0];
        return load.has_value();
      },
      absl::Seconds(3)));
  EXPECT_EQ(load->worker_id(), "prefill-load");
  EXPECT_EQ(load->role(), swaserve::v1::ROLE_PREFILL);
  EXPECT_EQ(load->queued_requests(), 7u);
  EXPECT_EQ(load->queued_uncached_tokens(), 123456u);
  EXPECT_EQ(load->free_swa_pages(), 100u);
  EXPECT_NEAR(static_cast<double>(load->timestamp_ms()),
              static_cast<double>(absl::ToUnixMillis(absl::Now())), 5000);
  // Reports follow the worker's state several times a second.
  queued = 9;
  EXPECT_TRUE(Eventually(
      [&] {
        auto loads = view_->GetLoads({"prefill-load"});
        return loads.ok() && (*loads)[0].has_value() &&
               (*loads)[0]->queued_requests() == 9;
      },
      absl::Seconds(2)));
  reg->Stop();
  // Without reports the last one expires (load_ttl = 300 ms).
  EXPECT_TRUE(Eventually(
      [&] {
        auto loads = view_->GetLoads({"prefill-load"});
        return loads.ok() && !(*loads)[0].has_value();
      },
      absl::Seconds(2)));
}

TEST_F(RegistrationTest, CacheEventsReachThePrefixIndex) {
  auto reg = Start(FastOptions("prefill-ev"));
  ASSERT_TRUE(reg->WaitRegistered(absl::Seconds(5)));
  const std::vector<uint64_t> chain = Chain(1, 64);
  reg->PublishCacheEvent(true, {chain.begin(), chain.begin() + 40});
  reg->PublishCacheEvent(true, {chain.begin() + 40, chain.end()});
  // Evicted leaves first, as a prefix cache does (prefix_index.h: a
  // worker's pages stay prefix-closed).
  reg->PublishCacheEvent(false, {chain.begin() + 50, chain.end()});
  ASSERT_TRUE(reg->WaitEventsFlushed(absl::Seconds(5)));
  EXPECT_EQ(Depth(*view_, chain, "prefill-ev"), 50);
  reg->PublishCacheEvent(true, {chain.begin() + 50, chain.end()});
  ASSERT_TRUE(reg->WaitEventsFlushed(absl::Seconds(5)));
  EXPECT_EQ(Depth(*view_, chain, "prefill-ev"), 64);
  reg->PublishCacheCleared();
  ASSERT_TRUE(reg->WaitEventsFlushed(absl::Seconds(5)));
  EXPECT_EQ(Depth(*view_, chain, "prefill-ev"), 0);
  EXPECT_EQ(reg->stats().event_hashes_written, 92u);
  EXPECT_EQ(reg->stats().event_hashes_dropped, 0u);
}

// A live worker's index entries do not expire (its heartbeat refreshes
// index_ttl); a dead worker's vanish index_ttl after its last heartbeat.
TEST_F(RegistrationTest, HeartbeatKeepsTheIndexOfALiveWorkerOnly) {
  WorkerRegistrationOptions o = FastOptions("prefill-idx");
  o.index.index_ttl = absl::Milliseconds(400);
  o.deregister_on_stop = false;
  auto reg = Start(o);
  ASSERT_TRUE(reg->WaitRegistered(absl::Seconds(5)));
  const std::vector<uint64_t> chain = Chain(6, 16);
  reg->PublishCacheEvent(true, chain);
  ASSERT_TRUE(reg->WaitEventsFlushed(absl::Seconds(5)));
  absl::SleepFor(absl::Milliseconds(1000));  // 2.5 x index_ttl, no events
  EXPECT_EQ(Depth(*view_, chain, "prefill-idx"), 16);
  reg->Stop();
  const absl::Time stopped = absl::Now();
  EXPECT_TRUE(
      Eventually([&] { return Depth(*view_, chain, "prefill-idx") == 0; },
                 absl::Seconds(3)));
  EXPECT_LE(absl::Now() - stopped, absl::Milliseconds(400 + 300));
}

TEST_F(RegistrationTest,
       FirstRegistrationClearsStaleEntriesReRegistrationKeepsThem) {
  const std::vector<uint64_t> chain = Chain(2, 10);
  // Entries left over from a previous incarnation of the worker.
  ASSERT_TRUE(view_->RecordDispatch("prefill-re", chain).ok());
  ASSERT_EQ(Depth(*view_, chain, "prefill-re"), 10);
  auto reg = Start(FastOptions("prefill-re"));
  ASSERT_TRUE(reg->WaitRegistered(absl::Seconds(5)));
  EXPECT_EQ(Depth(*view_, chain, "prefill-re"), 0);

  reg->PublishCacheEvent(true, chain);
  ASSERT_TRUE(reg->WaitEventsFlushed(absl::Seconds(5)));
  // The record vanishes (e.g. a partition longer than the TTL): the worker
  // registers again at its next heartbeat, keeping its index entries.
  ASSERT_TRUE(
      router_redis_->Command({"DEL", view_->keys().WorkerKey("prefill-re")})
          .ok());
  EXPECT_TRUE(Eventually([&] { return reg->stats().registrations == 2; },
                         absl::Seconds(3)));
  EXPECT_THAT(ListedIds(*view_), ElementsAre("prefill-re"));
  EXPECT_EQ(Depth(*view_, chain, "prefill-re"), 10);
}

TEST_F(RegistrationTest, SecondRouterReplicaSeesTheSameState) {
  auto reg_a = Start(FastOptions("prefill-0"));
  WorkerRegistrationOptions ob = FastOptions("decode-0");
  ob.info.role = swaserve::v1::ROLE_DECODE;
  ob.load_fn = [] {
    swaserve::v1::WorkerLoad l;
    l.set_running_requests(5);
    return l;
  };
  auto reg_b = Start(ob);
  ASSERT_TRUE(reg_a->WaitRegistered(absl::Seconds(5)));
  ASSERT_TRUE(reg_b->WaitRegistered(absl::Seconds(5)));
  // Replica 2: its own client and view; it shares nothing but Redis.
  std::unique_ptr<RedisClient> other_redis = NewClient();
  auto replica =
      ClusterView::Create({.redis = other_redis.get(), .cluster = "itest"});
  ASSERT_TRUE(replica.ok());
  const std::vector<uint64_t> chain = Chain(3, 32);
  // Replica 1 dispatches; replica 2 routes the sibling request the same way.
  ASSERT_TRUE(view_->RecordDispatch("prefill-0", chain).ok());
  absl::StatusOr<std::vector<int64_t>> d =
      (*replica)->MatchPrefixes(chain, {"prefill-0", "decode-0"});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_THAT(*d, ElementsAre(32, 0));
  EXPECT_EQ(ListedIds(**replica), ListedIds(*view_));
  EXPECT_THAT(ListedIds(**replica), ElementsAre("decode-0", "prefill-0"));
  ASSERT_TRUE(Eventually(
      [&] {
        auto loads = (*replica)->GetLoads({"decode-0"});
        return loads.ok() && (*loads)[0].has_value() &&
               (*loads)[0]->running_requests() == 5;
      },
      absl::Seconds(3)));
  // ForgetWorker from one replica is seen by the other.
  ASSERT_TRUE((*replica)->ForgetWorker("prefill-0").ok());
  EXPECT_EQ(Depth(*view_, chain, "prefill-0"), 0);
  reg_a->Stop();
  reg_b->Stop();
}

TEST_F(RegistrationTest, SurvivesRedisRestartAndDeliversQueuedEvents) {
  metrics::Registry registry;
  WorkerRegistrationOptions o = FastOptions("prefill-r");
  o.metrics = &registry;
  o.load_fn = [] { return swaserve::v1::WorkerLoad(); };
  auto reg = Start(o);
  ASSERT_TRUE(reg->WaitRegistered(absl::Seconds(5)));
  const std::vector<uint64_t> chain = Chain(4, 100);
  reg->PublishCacheEvent(true, {chain.begin(), chain.begin() + 30});
  ASSERT_TRUE(reg->WaitEventsFlushed(absl::Seconds(5)));

  ASSERT_TRUE(server_->Kill().ok());
  // The worker keeps going: publishing never blocks, events queue up.
  const absl::Time t0 = absl::Now();
  reg->PublishCacheEvent(true, chain);  // the whole chain, cached meanwhile
  reg->PublishCacheEvent(false, {chain.begin() + 80, chain.end()});
  EXPECT_LT(absl::Now() - t0, absl::Milliseconds(50));
  EXPECT_TRUE(
      Eventually([&] { return reg->stats().failures >= 3; }, absl::Seconds(3)));
  EXPECT_FALSE(reg->WaitEventsFlushed(absl::Milliseconds(100)));
  // (a batch may be in flight, failing, at any instant: poll)
  EXPECT_TRUE(
      Eventually([&] { return reg->stats().event_hashes_queued == 120; },
                 absl::Seconds(2)));

  ASSERT_TRUE(server_->Restart().ok());
  const absl::Time restarted = absl::Now();
  // The restarted Redis is empty; the worker notices at its next heartbeat,
  // registers again and then delivers what it queued.
  ASSERT_TRUE(Eventually(
      [&] {
        return ListedIds(*view_) == std::vector<std::string>{"prefill-r"};
      },
      absl::Seconds(5)));
  const absl::Duration reregistered = absl::Now() - restarted;
  ASSERT_TRUE(
      Eventually([&] { return Depth(*view_, chain, "prefill-r") == 80; },
                 absl::Seconds(5)));
  const absl::Duration delivered = absl::Now() - restarted;
  std::printf(
      "after redis restart: worker listed again in %s, queued "
      "events delivered in %s\n",
      absl::FormatDuration(reregistered).c_str(),
      absl::FormatDuration(delivered).c_str());
  EXPECT_EQ(reg->stats().registrations, 2u);
  EXPECT_EQ(reg->stats().event_hashes_dropped, 0u);
  EXPECT_THAT(registry.RenderText(),
              HasSubstr("swaserve_cluster_registrations_total 2\n"));
  EXPECT_TRUE(Eventually(
      [&] {
        auto loads = view_->GetLoads({"prefill-r"});
        return loads.ok() && (*loads)[0].has_value();
      },
      absl::Seconds(2)));
  reg->Stop();
  EXPECT_TRUE(ListedIds(*view_).empty());
}

// A hung Redis (SIGSTOP: the connection stays open, nothing answers):
// heartbeats time out, and once none has reached Redis for a whole TTL the
// worker knows its record expired (stats, swaserve_cluster_registered 0)
// instead of believing it present until Redis answers again; then it
// registers again at once.
TEST_F(RegistrationTest, AWorkerWhoseHeartbeatsFailForATtlKnowsItsRecordExpired) {
  metrics::Registry registry;
  WorkerRegistrationOptions o = FastOptions("decode-h");
  o.metrics = &registry;
  auto reg = Start(o);
  ASSERT_TRUE(reg->WaitRegistered(absl::Seconds(5)));
  ASSERT_EQ(kill(server_->pid(), SIGSTOP), 0);
  const absl::Time stopped = absl::Now();
  EXPECT_TRUE(Eventually([&] { return !reg->stats().registered; }, absl::Seconds(10)));
  const absl::Duration noticed = absl::Now() - stopped;
  EXPECT_THAT(registry.RenderText(), HasSubstr("swaserve_cluster_registered 0\n"));
  ASSERT_EQ(kill(server_->pid(), SIGCONT), 0);
  EXPECT_TRUE(Eventually([&] { return reg->stats().registered; }, absl::Seconds(5)));
  EXPECT_EQ(reg->stats().registrations, 2u);
  EXPECT_THAT(registry.RenderText(), HasSubstr("swaserve_cluster_registered 1\n"));
  EXPECT_TRUE(Eventually(
      [&] { return ListedIds(*view_) == std::vector<std::string>{"decode-h"}; },
      absl::Seconds(5)));
  std::printf("hung Redis: record known expired after %s (TTL 600ms, command timeout 2s)\n",
              absl::FormatDuration(noticed).c_str());
}

TEST_F(RegistrationTest, BoundedQueueDropsOldestEventsWhileRedisIsDown) {
  metrics::Registry registry;
  WorkerRegistrationOptions o = FastOptions("prefill-q");
  o.max_queued_hashes = 50;
  o.metrics = &registry;
  auto reg = Start(o);
  ASSERT_TRUE(reg->WaitRegistered(absl::Seconds(5)));
  ASSERT_TRUE(server_->Kill().ok());
  const std::vector<uint64_t> chain = Chain(5, 120);
  for (size_t i = 0; i < chain.size(); i += 10) {
    reg->PublishCacheEvent(true, {chain.begin() + i, chain.begin() + i + 10});
  }
  EXPECT_TRUE(Eventually(
      [&] {
        const WorkerRegistration::Stats st = reg->stats();
        return st.event_hashes_queued == 50 && st.event_hashes_dropped == 70;
      },
      absl::Seconds(2)))
      << reg->stats().event_hashes_queued << " queued, "
      << reg->stats().event_hashes_dropped << " dropped";
  ASSERT_TRUE(server_->Restart().ok());
  ASSERT_TRUE(reg->WaitRegistered(absl::Seconds(5)));
  ASSERT_TRUE(Eventually(
      [&] {
        std::vector<uint64_t> newest(chain.begin() + 70, chain.end());
        return Depth(*view_, newest, "prefill-q") == 50;
      },
      absl::Seconds(5)));
  // The oldest 70 were dropped, so the prompt matches nothing from page 0.
  EXPECT_EQ(Depth(*view_, chain, "prefill-q"), 0);
  EXPECT_TRUE(Eventually(
      [&] {
        return absl::StrContains(
            registry.RenderText(),
            "swaserve_cluster_cache_event_hashes_total{outcome=\"dropped\"} "
            "70\n");
      },
      absl::Seconds(2)));
}

TEST_F(RegistrationTest, CreateRejectsBadOptions) {
  WorkerRegistrationOptions o = FastOptions("bad id");
  EXPECT_EQ(WorkerRegistration::Create(o).status().code(),
            absl::StatusCode::kInvalidArgument);
  o = FastOptions("ok");
  o.info.role = swaserve::v1::ROLE_UNSPECIFIED;
  EXPECT_THAT(WorkerRegistration::Create(o).status().message(),
              HasSubstr("role"));
  o = FastOptions("ok");
  o.heartbeat_interval = o.record_ttl;
  EXPECT_THAT(WorkerRegistration::Create(o).status().message(),
              HasSubstr("heartbeat_interval"));
  o = FastOptions("ok");
  o.redis = nullptr;
  EXPECT_FALSE(WorkerRegistration::Create(o).ok());
  EXPECT_FALSE(ClusterView::Create({.redis = nullptr}).ok());
  EXPECT_FALSE(
      ClusterView::Create({.redis = router_redis_.get(), .cluster = "a b"})
          .ok());
}

}  // namespace
}  // namespace swaserve::cluster
