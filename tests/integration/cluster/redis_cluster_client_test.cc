// RedisClient in cluster mode against a real Redis Cluster (3 masters, 3
// replicas, redis-cli --cluster create): slot routing, pipelines across
// nodes, scripts on every master, MOVED and ASK while a slot migrates, and a
// master killed mid-test (fail fast, then follow the promoted replica).
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "lib/cluster/redis_client.h"
#include "lib/cluster/redis_cluster_protocol.h"
#include "tests/integration/cluster/redis_cluster_server.h"

namespace swaserve::cluster {
namespace {

using testing::RedisClusterServer;

class RedisClusterClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto c = RedisClusterServer::Start(3, 1);
    ASSERT_TRUE(c.ok()) << c.status();
    cluster_ = *std::move(c);
    auto client = RedisClient::Create(cluster_->ClientOptions());
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
  }

  // A client of node i alone (no cluster mode): what that server holds.
  std::unique_ptr<RedisClient> Direct(int i) {
    return *RedisClient::Create(cluster_->node(i).ClientOptions());
  }

  std::string NodeId(int i) {
    return Direct(i)->Command({"CLUSTER", "MYID"})->str;
  }

  std::unique_ptr<RedisClusterServer> cluster_;
  std::unique_ptr<RedisClient> client_;
};

TEST_F(RedisClusterClientTest, CommandsAndPipelinesReachTheMasterOfTheirSlot) {
  std::vector<RedisCommand> sets;
  for (int i = 0; i < 300; ++i) sets.push_back({"SET", absl::StrCat("k", i), absl::StrCat(i)});
  auto replies = client_->Pipeline(sets, "test");
  ASSERT_TRUE(replies.ok()) << replies.status();
  for (const RedisReply& r : *replies) EXPECT_EQ(r.str, "OK") << r.DebugString();
  // Every master holds some of the keys, and each key lives on its slot's
  // master.
  int64_t total = 0;
  auto masters = client_->CommandOnEveryMaster({"DBSIZE"});
  ASSERT_TRUE(masters.ok()) << masters.status();
  ASSERT_EQ(masters->size(), 3u);
  for (auto& [address, r] : *masters) {
    EXPECT_GT(r.integer, 50) << address;
    total += r.integer;
  }
  EXPECT_EQ(total, 300);
  for (int i = 0; i < 300; i += 37) {
    const std::string key = absl::StrCat("k", i);
    auto owner = cluster_->MasterOfSlot(RedisKeySlot(key));
    ASSERT_TRUE(owner.ok()) << owner.status();
    auto direct = Direct(*owner)->Command({"GET", key});
    ASSERT_TRUE(direct.ok()) << direct.status();
    EXPECT_EQ(direct->str, absl::StrCat(i));
    auto via = client_->Command({"GET", key});
    ASSERT_TRUE(via.ok()) << via.status();
    EXPECT_EQ(via->str, absl::StrCat(i));
  }
  // A transaction on one hash tag stays on one node.
  auto tx = client_->Pipeline(
      {{"MULTI"}, {"INCR", "{t}a"}, {"INCR", "{t}b"}, {"EXEC"}, {"GET", "k1"}}, "test");
  ASSERT_TRUE(tx.ok()) << tx.status();
  ASSERT_TRUE((*tx)[3].is_array()) << (*tx)[3].DebugString();
  EXPECT_EQ((*tx)[3].elements.size(), 2u);
  EXPECT_EQ((*tx)[4].str, "1");
  // Keys of two slots in one command: Redis refuses, the caller sees it.
  auto cross = client_->Command({"MGET", "k1", "k2"});
  EXPECT_FALSE(cross.ok());
}

TEST_F(RedisClusterClientTest, ScriptsRunOnEveryMaster) {
  static const RedisScript kScript{"test_incr", "return redis.call('INCRBY', KEYS[1], ARGV[1])"};
  for (int i = 0; i < 30; ++i) {
    auto r = client_->Evalsha(kScript, {absl::StrCat("{s", i, "}n")}, {"5"});
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->integer, 5);
  }
  // After SCRIPT FLUSH on every master the client reloads.
  ASSERT_TRUE(client_->CommandOnEveryMaster({"SCRIPT", "FLUSH"}).ok());
  auto r = client_->Evalsha(kScript, {"{s0}n"}, {"1"});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->integer, 6);
}

TEST_F(RedisClusterClientTest, FollowsAskWhileASlotMigratesAndMovedAfter) {
  const std::string key = "{mig}old";
  const std::string fresh = "{mig}new";
  const int slot = RedisKeySlot(key);
  ASSERT_TRUE(client_->Command({"SET", key, "v"}).ok());
  auto src = cluster_->MasterOfSlot(slot);
  ASSERT_TRUE(src.ok()) << src.status();
  int dst = -1;
  for (int i = 0; i < cluster_->size(); ++i) {
    auto role = Direct(i)->Command({"ROLE"});
    if (i != *src && role.ok() && role->elements[0].str == "master") dst = i;
  }
  ASSERT_GE(dst, 0);
  const std::string src_id = NodeId(*src), dst_id = NodeId(dst);
  ASSERT_TRUE(Direct(dst)->Command({"CLUSTER", "SETSLOT", absl::StrCat(slot), "IMPORTING", src_id})
                  .ok());
  ASSERT_TRUE(Direct(*src)->Command({"CLUSTER", "SETSLOT", absl::StrCat(slot), "MIGRATING", dst_id})
                  .ok());
  // A key not in the source yet: the source answers ASK, the client asks the
  // target with ASKING.
  auto set = client_->Command({"SET", fresh, "n"});
  ASSERT_TRUE(set.ok()) << set.status();
  // It went to the target (visible there with ASKING while importing), not
  // to the source.
  auto on_dst = Direct(dst)->Pipeline({{"ASKING"}, {"EXISTS", fresh}}, "test");
  ASSERT_TRUE(on_dst.ok()) << on_dst.status();
  EXPECT_EQ((*on_dst)[1].integer, 1) << (*on_dst)[1].DebugString();
  auto on_src = Direct(*src)->Pipeline({{"EXISTS", fresh}}, "test");
  ASSERT_TRUE(on_src.ok()) << on_src.status();
  EXPECT_TRUE((*on_src)[0].is_error()) << "the source sends it on: " << (*on_src)[0].DebugString();
  // The old key is still served by the source.
  EXPECT_EQ(client_->Command({"GET", key})->str, "v");
  // Finish the migration: move the key, assign the slot everywhere.
  ASSERT_TRUE(Direct(*src)
                  ->Command({"MIGRATE", "127.0.0.1", absl::StrCat(cluster_->node(dst).port()), "",
                             "0", "5000", "KEYS", key})
                  .ok());
  for (int i : {dst, *src}) {  // masters only; the bus tells the rest
    auto r = Direct(i)->Command({"CLUSTER", "SETSLOT", absl::StrCat(slot), "NODE", dst_id});
    ASSERT_TRUE(r.ok()) << r.status();
  }
  // The client's map still names the source: it gets MOVED and follows.
  auto got = client_->Command({"GET", key});
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->str, "v");
  EXPECT_EQ(client_->Command({"GET", fresh})->str, "n");
  EXPECT_EQ(Direct(dst)->Command({"GET", key})->str, "v");
}

TEST_F(RedisClusterClientTest, KilledMasterFailsFastThenTheReplicaTakesOver) {
  const std::string key = "{fo}k";
  // SET, then WAIT (keyless: it goes with the SET) until the replica has it.
  auto set = client_->Pipeline({{"SET", key, "before"}, {"WAIT", "1", "2000"}}, "test");
  ASSERT_TRUE(set.ok()) << set.status();
  ASSERT_EQ((*set)[1].integer, 1) << (*set)[1].DebugString();
  auto master = cluster_->MasterOfSlot(RedisKeySlot(key));
  ASSERT_TRUE(master.ok()) << master.status();
  ASSERT_TRUE(cluster_->node(*master).Kill().ok());
  // Until a replica is promoted, calls for the slot fail, and fast.
  const absl::Time t0 = absl::Now();
  auto down = client_->Command({"GET", key});
  EXPECT_FALSE(down.ok());
  EXPECT_LT(absl::Now() - t0, absl::Seconds(3));
  // Keys on other masters keep working meanwhile.
  for (int i = 0; i < 20; ++i) {
    const std::string other = absl::StrCat("other", i);
    auto owner = cluster_->MasterOfSlot(RedisKeySlot(other));
    if (owner.ok() && *owner != *master) {
      auto r = client_->Command({"SET", other, "x"});
      EXPECT_TRUE(r.ok()) << r.status();
    }
  }
  // The replica is promoted (cluster-node-timeout 1 s); the client follows.
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  absl::StatusOr<RedisReply> after = absl::UnavailableError("not tried");
  while (absl::Now() < deadline) {
    after = client_->Command({"GET", key});
    if (after.ok()) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->str, "before");
  auto now_master = cluster_->MasterOfSlot(RedisKeySlot(key));
  ASSERT_TRUE(now_master.ok());
  EXPECT_NE(*now_master, *master);
}

TEST(RedisClusterClientSetupTest, ASingleServerIsNotACluster) {
  auto single = testing::RedisServer::Start();
  ASSERT_TRUE(single.ok()) << single.status();
  RedisOptions o = (*single)->ClientOptions();
  o.cluster_seeds = {absl::StrCat("127.0.0.1:", (*single)->port())};
  auto client = RedisClient::Create(o);
  ASSERT_TRUE(client.ok());
  absl::Status s = (*client)->Ping();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("cluster support disabled"), std::string::npos) << s;
}

}  // namespace
}  // namespace swaserve::cluster
