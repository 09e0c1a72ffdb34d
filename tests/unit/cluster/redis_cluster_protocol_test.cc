// Tests of the Redis Cluster protocol helpers (lib/cluster/
// redis_cluster_protocol.h) against values from the cluster specification
// and replies in the shape redis-server 7 sends.
#include "lib/cluster/redis_cluster_protocol.h"

#include <random>
#include <string>

#include "gtest/gtest.h"

namespace swaserve::cluster {
namespace {

using Type = RedisReply::Type;

RedisReply Str(std::string s) { return RedisReply::String(std::move(s)); }
RedisReply Int(int64_t v) { return RedisReply::Integer(v); }
RedisReply Arr(std::vector<RedisReply> e) { return RedisReply::Array(std::move(e)); }

TEST(RedisKeySlotTest, MatchesTheSpecsCrc16AndKnownSlots) {
  // The cluster spec: CRC16 of "123456789" is 0x31C3.
  EXPECT_EQ(RedisKeySlot("123456789"), 0x31C3 & 16383);
  // CLUSTER KEYSLOT on a redis-server 7.0.
  EXPECT_EQ(RedisKeySlot("foo"), 12182);
  EXPECT_EQ(RedisKeySlot("bar"), 5061);
  EXPECT_EQ(RedisKeySlot("hello"), 866);
  EXPECT_EQ(RedisKeySlot(""), 0);
}

TEST(RedisKeySlotTest, HashTagsDecideTheSlot) {
  EXPECT_EQ(RedisKeySlot("{user1000}.following"), RedisKeySlot("{user1000}.followers"));
  EXPECT_EQ(RedisKeySlot("a{user1000}b"), RedisKeySlot("user1000"));
  // Only the first '{' counts, and an empty tag hashes the whole key.
  EXPECT_EQ(RedisKeySlot("foo{}{bar}"), RedisKeySlot("foo{}{bar}"));
  EXPECT_NE(RedisKeySlot("foo{}{bar}"), RedisKeySlot("bar"));
  EXPECT_EQ(RedisKeySlot("foo{{bar}}zap"), RedisKeySlot("{bar"));
  EXPECT_EQ(RedisKeySlot("foo{bar}{zap}"), RedisKeySlot("bar"));
  // An unclosed tag hashes the whole key.
  EXPECT_EQ(RedisKeySlot("foo{bar"), RedisKeySlot("foo{bar"));
  EXPECT_NE(RedisKeySlot("x{bar"), RedisKeySlot("bar"));
}

TEST(RedisKeySlotTest, SlotsAreInRangeForRandomKeys) {
  std::mt19937_64 rng(7);
  for (int i = 0; i < 10000; ++i) {
    std::string key(rng() % 40, '\0');
    for (char& c : key) c = static_cast<char>(rng());
    EXPECT_LT(RedisKeySlot(key), 16384);
  }
}

TEST(RedisCommandKeyTest, FindsTheKeyThatRoutes) {
  EXPECT_EQ(RedisCommandKey({"GET", "k"}), "k");
  EXPECT_EQ(RedisCommandKey({"set", "k", "v"}), "k");
  EXPECT_EQ(RedisCommandKey({"EVALSHA", "abc", "2", "k1", "k2", "a"}), "k1");
  EXPECT_EQ(RedisCommandKey({"EVALSHA", "abc", "0", "a"}), std::nullopt);
  EXPECT_EQ(RedisCommandKey({"EVAL", "return 1", "x"}), std::nullopt);
  EXPECT_EQ(RedisCommandKey({"XREAD", "COUNT", "5", "BLOCK", "10", "STREAMS", "s", "0"}), "s");
  EXPECT_EQ(RedisCommandKey({"PING"}), std::nullopt);
  EXPECT_EQ(RedisCommandKey({"MULTI"}), std::nullopt);
  EXPECT_EQ(RedisCommandKey({"SCRIPT", "LOAD", "return 1"}), std::nullopt);
  EXPECT_EQ(RedisCommandKey({"INFO", "commandstats"}), std::nullopt);
  EXPECT_EQ(RedisCommandKey({}), std::nullopt);
}

TEST(ParseClusterSlotsTest, ParsesMastersAndReplicas) {
  const RedisReply reply = Arr({
      Arr({Int(0), Int(5460), Arr({Str("127.0.0.1"), Int(7000), Str("id1")}),
           Arr({Str("127.0.0.1"), Int(7003), Str("id4")})}),
      Arr({Int(5461), Int(16383), Arr({Str(""), Int(7001), Str("id2")})}),
  });
  absl::StatusOr<std::vector<RedisSlotRange>> r = ParseClusterSlots(reply, "10.0.0.5");
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 2u);
  EXPECT_EQ((*r)[0].start, 0);
  EXPECT_EQ((*r)[0].end, 5460);
  EXPECT_EQ((*r)[0].master, "127.0.0.1:7000");
  EXPECT_EQ((*r)[0].replicas, std::vector<std::string>{"127.0.0.1:7003"});
  // A node that does not know its host gets the queried one.
  EXPECT_EQ((*r)[1].master, "10.0.0.5:7001");
  // IPv6 hosts get brackets.
  r = ParseClusterSlots(Arr({Arr({Int(0), Int(1), Arr({Str("::1"), Int(7000)})})}), "x");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)[0].master, "[::1]:7000");
}

TEST(ParseClusterSlotsTest, RejectsMalformedReplies) {
  for (const RedisReply& bad : {
           Str("no"),
           Arr({Str("x")}),
           Arr({Arr({Int(0), Int(16384), Arr({Str("h"), Int(1)})})}),
           Arr({Arr({Int(5), Int(4), Arr({Str("h"), Int(1)})})}),
           // 54000000061 narrows to an int below 16383; found by the fuzzer.
           Arr({Arr({Int(54000000061), Int(16383), Arr({Str("h"), Int(1)})})}),
           Arr({Arr({Int(0), Int(1), Arr({Str("h"), Int(0)})})}),
           Arr({Arr({Int(0), Int(1), Arr({Str("h")})})}),
           Arr({Arr({Int(0), Int(1)})}),
       }) {
    EXPECT_FALSE(ParseClusterSlots(bad, "h").ok()) << bad.DebugString();
  }
}

TEST(ParseRedisRedirectTest, ParsesMovedAndAsk) {
  RedisReply moved{.type = Type::kError, .str = "MOVED 3999 127.0.0.1:6381"};
  std::optional<RedisRedirect> r = ParseRedisRedirect(moved);
  ASSERT_TRUE(r.has_value());
  EXPECT_FALSE(r->ask);
  EXPECT_EQ(r->slot, 3999);
  EXPECT_EQ(r->address, "127.0.0.1:6381");
  r = ParseRedisRedirect(RedisReply{.type = Type::kError, .str = "ASK 12 [::1]:7000"});
  ASSERT_TRUE(r.has_value());
  EXPECT_TRUE(r->ask);
  EXPECT_EQ(r->address, "[::1]:7000");
  r = ParseRedisRedirect(RedisReply{.type = Type::kError, .str = "MOVED 1 :7002"});
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->address, ":7002");
  for (const char* bad : {"ERR foo", "MOVED", "MOVED x h:1", "MOVED 16384 h:1", "MOVED 1 h",
                          "MOVED 1 h:0", "ASK 1 h:1 extra"}) {
    EXPECT_FALSE(ParseRedisRedirect(RedisReply{.type = Type::kError, .str = bad}).has_value())
        << bad;
  }
  EXPECT_FALSE(ParseRedisRedirect(Str("MOVED 1 h:1")).has_value());  // not an error reply
}

TEST(ParseRedisAddressTest, ClusterSeedLists) {
  RedisOptions o;
  ASSERT_TRUE(ParseRedisAddress("redis-cluster://u:pw@10.0.0.1:7000,10.0.0.2:7001", &o).ok());
  EXPECT_EQ(o.cluster_seeds, (std::vector<std::string>{"10.0.0.1:7000", "10.0.0.2:7001"}));
  EXPECT_EQ(o.username, "u");
  EXPECT_EQ(o.password, "pw");
  EXPECT_EQ(o.host, "10.0.0.1");
  EXPECT_EQ(o.port, 7000);
  ASSERT_TRUE(ParseRedisAddress("a:1,b:2,[::1]:3", &o).ok());
  EXPECT_EQ(o.cluster_seeds.size(), 3u);
  EXPECT_TRUE(o.password.empty());
  ASSERT_TRUE(ParseRedisAddress("redis-cluster://h:7000", &o).ok());
  EXPECT_EQ(o.cluster_seeds, std::vector<std::string>{"h:7000"});
  // A single server clears the seeds again.
  ASSERT_TRUE(ParseRedisAddress("redis://h:6379/2", &o).ok());
  EXPECT_TRUE(o.cluster_seeds.empty());
  EXPECT_EQ(o.db, 2);
  for (const char* bad : {"redis-cluster://", "a:1,b", "redis-cluster://h:1/0", "a:1,,b:2",
                          "redis-cluster://h"}) {
    absl::Status s = ParseRedisAddress(bad, &o);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << bad << ": " << s;
  }
}

}  // namespace
}  // namespace swaserve::cluster
