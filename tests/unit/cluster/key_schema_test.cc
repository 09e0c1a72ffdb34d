#include "lib/cluster/key_schema.h"
#include "lib/cluster/redis_cluster_protocol.h"

#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace swaserve::cluster {
namespace {

using ::testing::HasSubstr;
using namespace std::string_literals;

TEST(ValidateName, AcceptsKeySafeNamesOnly) {
  EXPECT_TRUE(ValidateName("prefill-0.bucket_1:a", "worker id").ok());
  EXPECT_TRUE(ValidateName(std::string(200, 'a'), "worker id").ok());
  EXPECT_FALSE(ValidateName("", "worker id").ok());
  EXPECT_FALSE(ValidateName(std::string(201, 'a'), "worker id").ok());
  for (const char* bad : {"a b", "a/b", "a*", "a{b}", "é", "a\nb"}) {
    absl::Status s = ValidateName(bad, "worker id");
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(s.message(), HasSubstr("worker id")) << bad;
  }
}

TEST(KeySchema, VersionedPrefixPerCluster) {
  absl::StatusOr<KeySchema> keys = KeySchema::Create("prod");
  ASSERT_TRUE(keys.ok()) << keys.status();
  EXPECT_EQ(keys->prefix(), "swaserve:v1:prod:");
  EXPECT_EQ(keys->WorkersKey(), "swaserve:v1:prod:{prod}:workers");
  EXPECT_EQ(keys->WorkerKey("w1"), "swaserve:v1:prod:{prod}:worker:w1");
  EXPECT_EQ(keys->WorkerKeyPrefix() + "w1", keys->WorkerKey("w1"));
  EXPECT_EQ(keys->LoadKey("w1"), "swaserve:v1:prod:{prod}:load:w1");
  EXPECT_EQ(keys->PrefixKey("w1"), "swaserve:v1:prod:{prod.ix.0}:prefix:w1");
  EXPECT_EQ(keys->PredictedKey("w1"), "swaserve:v1:prod:{prod.ix.0}:predicted:w1");
  EXPECT_EQ(keys->EventsKey("w1"), "swaserve:v1:prod:{prod.ev.w1}:events:w1");
  EXPECT_EQ(keys->index_shards(), 1);
  EXPECT_EQ(keys->ShardOf(0x123456789abcdefULL), 0);
  EXPECT_EQ(keys->KvPageKey(0xabc, 0x123456789abcdef0ULL),
            "swaserve:v1:prod:kvpage:0000000000000abc:123456789abcdef0");
  EXPECT_FALSE(KeySchema::Create("bad cluster").ok());
  EXPECT_FALSE(KeySchema::Create("").ok());
  EXPECT_FALSE(KeySchema::Create("prod", 0).ok());
  EXPECT_FALSE(KeySchema::Create("prod", 65).ok());
}

// Keys used together share a slot (Redis Cluster), and the index shards
// spread evenly over the slot space.
TEST(KeySchema, HashTagsKeepScriptKeysInOneSlotAndSpreadShards) {
  for (int shards : {1, 3, 16, 64}) {
    absl::StatusOr<KeySchema> keys = KeySchema::Create("prod", shards);
    ASSERT_TRUE(keys.ok()) << keys.status();
    EXPECT_EQ(keys->index_shards(), shards);
    EXPECT_EQ(RedisKeySlot(keys->WorkersKey()), RedisKeySlot(keys->WorkerKey("w1")));
    EXPECT_EQ(RedisKeySlot(keys->WorkersKey()), RedisKeySlot(keys->LoadKey("w2")));
    EXPECT_EQ(RedisKeySlot(keys->EventsKey("w1")), RedisKeySlot(keys->EventSeqKey("w1")));
    EXPECT_EQ(RedisKeySlot(keys->EventsKey("w1")), RedisKeySlot(keys->EventEpochKey("w1")));
    std::vector<int> per_band(shards, 0);
    for (int s = 0; s < shards; ++s) {
      const int slot = RedisKeySlot(keys->PrefixKey("w1", s));
      for (const std::string& k : {keys->PrefixKey("w9", s), keys->PredictedKey("w1", s),
                                   keys->SwaGoneKey("w2", s), keys->LowerTierKey("w3", s),
                                   keys->PredictedUntilKey(s)}) {
        EXPECT_EQ(RedisKeySlot(k), slot) << k;
      }
      if (shards > 1) {
        EXPECT_EQ(slot / (16384 / shards), s) << "shard " << s << " slot " << slot;
      }
    }
    // Anchors spread over the shards.
    std::vector<int> hits(shards, 0);
    for (uint64_t a = 1; a < 64001; ++a) ++hits[keys->ShardOf(a * 0x9e3779b97f4a7c15ULL)];
    for (int h : hits) EXPECT_NEAR(h, 64000.0 / shards, 64000.0 / shards * 0.1);
  }
}

TEST(PageHash, EncodesBigEndianAndRoundTrips) {
  EXPECT_EQ(EncodePageHash(0x0102030405060708ull),
            std::string("\x01\x02\x03\x04\x05\x06\x07\x08", 8));
  EXPECT_EQ(EncodePageHash(0), std::string(8, '\0'));
  std::mt19937_64 rng(7);
  for (int i = 0; i < 1000; ++i) {
    const uint64_t h = rng();
    absl::StatusOr<uint64_t> back = DecodePageHash(EncodePageHash(h));
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, h);
  }
  EXPECT_FALSE(DecodePageHash("1234567").ok());
  EXPECT_FALSE(DecodePageHash("123456789").ok());
  const std::vector<uint64_t> two = {0x0102030405060708ull, 42};
  EXPECT_EQ(PackPageHashes(two), EncodePageHash(two[0]) + EncodePageHash(42));
  EXPECT_EQ(PackPageHashes({}), "");
  EXPECT_EQ(EncodePageHashes({1, 2}),
            (std::vector<std::string>{EncodePageHash(1), EncodePageHash(2)}));
}

WorkerInfo SampleInfo() {
  WorkerInfo info;
  info.id = "prefill-1";
  info.role = swaserve::v1::ROLE_PREFILL;
  info.model = "mimo-v2";
  info.bucket = 1;
  info.bucket_min_tokens = 65536;
  info.bucket_max_tokens = 262144;
  info.grpc_address = "10.0.0.7:50051";
  info.ucx_address = "\x00\x01\xff\r\n binary"s;  // NUL included
  info.page_size = 16;
  info.full_pages = 123456;
  info.swa_pages = 7890;
  info.max_running_requests = 64;
  info.sliding_window = 128;
  info.swa_chain_layers = 61;
  info.window_restore = true;
  info.window_restore_work = 3905;
  info.started_at_ms = 1'700'000'000'123;
  info.incarnation = 0xfedcba9876543210ull;
  return info;
}

TEST(WorkerInfo, RoundTripsThroughHashFields) {
  const WorkerInfo info = SampleInfo();
  auto fields = EncodeWorkerInfo(info);
  absl::StatusOr<WorkerInfo> back = DecodeWorkerInfo(fields);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, info);
  // Field names are the documented schema.
  std::vector<std::string> names;
  for (const auto& [f, v] : fields) names.push_back(f);
  EXPECT_THAT(
      names, ::testing::ElementsAre(
                 "id", "role", "model", "bucket", "bucket_min_tokens",
                 "bucket_max_tokens", "grpc_address", "ucx_address",
                 "page_size", "full_pages", "swa_pages", "max_running_requests",
                 "sliding_window", "swa_chain_layers", "window_restore",
                 "window_restore_work", "started_at_ms", "incarnation"));
  EXPECT_EQ(fields[1].second, "ROLE_PREFILL");
  EXPECT_EQ(fields[17].second, "fedcba9876543210");
}

TEST(WorkerInfo, DecodeIgnoresUnknownAndDefaultsMissingOptionalFields) {
  absl::StatusOr<WorkerInfo> info = DecodeWorkerInfo(
      {{"id", "d0"}, {"role", "ROLE_DECODE"}, {"from_the_future", "x"}});
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->id, "d0");
  EXPECT_EQ(info->role, swaserve::v1::ROLE_DECODE);
  EXPECT_EQ(info->page_size, 0);
  EXPECT_EQ(info->grpc_address, "");
}

TEST(WorkerInfo, DecodeErrorsNameTheField) {
  absl::Status s =
      DecodeWorkerInfo(
          {{"id", "d0"}, {"role", "ROLE_DECODE"}, {"full_pages", "12x"}})
          .status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("full_pages"));
  s = DecodeWorkerInfo({{"id", "d0"}, {"role", "ROLE_NOPE"}}).status();
  EXPECT_THAT(s.message(), HasSubstr("ROLE_NOPE"));
  s = DecodeWorkerInfo({{"role", "ROLE_DECODE"}}).status();
  EXPECT_THAT(s.message(), HasSubstr("'id'"));
  s = DecodeWorkerInfo({{"id", "d0"}}).status();
  EXPECT_THAT(s.message(), HasSubstr("'role'"));
  s = DecodeWorkerInfo(
          {{"id", "d0"}, {"role", "ROLE_DECODE"}, {"incarnation", "xyz"}})
          .status();
  EXPECT_THAT(s.message(), HasSubstr("incarnation"));
}

}  // namespace
}  // namespace swaserve::cluster
