// RedisPageStore (lib/cluster/redis_page_store.h) against a real
// redis-server: round trip; FLUSHALL reads as misses; values overwritten
// with garbage, another key's blob, a truncated blob or a non-string read as
// counted corrupt misses and are deleted; a killed Redis gives Unavailable
// within a bound and the store works again once it is back; under a small
// maxmemory with allkeys-lru the store keeps working while Redis evicts;
// the start-up eviction-policy check; concurrent callers.
#include "lib/cluster/redis_page_store.h"

#include <atomic>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/kv/memory_page_store.h"
#include "lib/kv/page_blob.h"
#include "tests/integration/cluster/redis_server.h"
#include "tests/unit/kv/l3_test_harness.h"
#include "tests/unit/kv/page_store_test_util.h"

namespace swaserve::cluster {
namespace {

using kv::testing::IsSomeVersion;
using kv::testing::Payload;
using ::testing::HasSubstr;

kv::PageKey Key(uint64_t i) {
  return kv::PageKey{.hash = 0x5000 + i, .layout = 0x77};
}

class RedisPageStoreTest : public ::testing::Test {
 protected:
  void StartRedis(std::vector<std::string> args = {}) {
    auto server = testing::RedisServer::Start(std::move(args));
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    auto raw = RedisClient::Create(server_->ClientOptions());
    ASSERT_TRUE(raw.ok()) << raw.status();
    raw_ = *std::move(raw);
  }

  std::unique_ptr<RedisPageStore> NewStore(int pool_size = 1,
                                           absl::Duration ttl = {}) {
    RedisOptions redis = server_->ClientOptions();
    redis.pool_size = pool_size;
    auto store = RedisPageStore::Create(
        {.redis = redis, .cluster = "l3test", .ttl = ttl});
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? *std::move(store) : nullptr;
  }

  // Get of `key` into a `size`-byte buffer; on OK checks the bytes are
  // version `version`'s.
  static absl::Status GetAndCheck(RedisPageStore& store, uint64_t key,
                                  uint64_t version, size_t size) {
    std::vector<uint8_t> out(size);
    absl::Status s = store.Get(Key(key), absl::MakeSpan(out));
    if (s.ok()) {
      EXPECT_EQ(out, Payload(key, version, size)) << key;
    }
    return s;
  }

  void RawSet(const std::string& key, std::string value) {
    absl::StatusOr<RedisReply> r =
        raw_->Command({"SET", key, std::move(value)});
    ASSERT_TRUE(r.ok() && r->ToStatus().ok());
  }
  bool RawExists(const std::string& key) {
    absl::StatusOr<RedisReply> r = raw_->Command({"EXISTS", key});
    return r.ok() && r->integer == 1;
  }
  int64_t InfoField(const std::string& section, const std::string& field) {
    absl::StatusOr<RedisReply> r = raw_->Command({"INFO", section});
    if (!r.ok()) return -1;
    for (absl::string_view line : absl::StrSplit(r->str, "\r\n")) {
      if (absl::ConsumePrefix(&line, field + ":")) {
        int64_t v = -1;
        return absl::SimpleAtoi(line, &v) ? v : -1;
      }
    }
    return -1;
  }

  std::unique_ptr<testing::RedisServer> server_;
  std::unique_ptr<RedisClient> raw_;
};

TEST_F(RedisPageStoreTest, PutGetEraseRoundTrip) {
  StartRedis();
  auto store = NewStore();
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->backend(), "redis");
  EXPECT_EQ(store->KeyOf(Key(1)),
            "swaserve:v1:l3test:kvpage:0000000000000077:0000000000005001");
  ASSERT_TRUE(store->Put(Key(1), Payload(1, 3, 20000)).ok());
  EXPECT_TRUE(store->Contains(Key(1)));
  EXPECT_FALSE(store->Contains(Key(2)));
  EXPECT_TRUE(GetAndCheck(*store, 1, 3, 20000).ok());
  EXPECT_TRUE(absl::IsNotFound(GetAndCheck(*store, 2, 0, 20000)));

  // The stored value is the blob format, readable by any backend's code.
  absl::StatusOr<RedisReply> raw = raw_->Command({"GET", store->KeyOf(Key(1))});
  ASSERT_TRUE(raw.ok());
  ASSERT_EQ(raw->str.size(), kv::kPageBlobHeaderBytes + 20000);
  EXPECT_TRUE(absl::StartsWith(raw->str, "SWKVPAGE"));

  store->Erase(Key(1));
  EXPECT_FALSE(store->Contains(Key(1)));
  EXPECT_TRUE(absl::IsNotFound(GetAndCheck(*store, 1, 3, 20000)));
  const kv::PageStoreStats& st = store->stats();
  EXPECT_EQ(st.puts.load(), 1);
  EXPECT_EQ(st.put_bytes.load(), 20000);
  EXPECT_EQ(st.gets.load(), 3);
  EXPECT_EQ(st.hits.load(), 1);
  EXPECT_EQ(st.get_bytes.load(), 20000);
  EXPECT_EQ(st.misses.load(), 2);
  EXPECT_EQ(st.corrupt.load(), 0);
  EXPECT_EQ(st.get_errors.load(), 0);
}

TEST_F(RedisPageStoreTest, TtlExpiresPages) {
  StartRedis();
  auto store = NewStore(1, absl::Milliseconds(200));
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Put(Key(1), Payload(1, 1, 100)).ok());
  absl::StatusOr<RedisReply> ttl =
      raw_->Command({"PTTL", store->KeyOf(Key(1))});
  ASSERT_TRUE(ttl.ok());
  EXPECT_GT(ttl->integer, 0);
  EXPECT_LE(ttl->integer, 200);
  absl::SleepFor(absl::Milliseconds(400));
  EXPECT_TRUE(absl::IsNotFound(GetAndCheck(*store, 1, 1, 100)));
}

TEST_F(RedisPageStoreTest, FlushAllMidRunReadsAsMisses) {
  StartRedis();
  auto store = NewStore();
  ASSERT_NE(store, nullptr);
  for (uint64_t k = 0; k < 10; ++k) {
    ASSERT_TRUE(store->Put(Key(k), Payload(k, 1, 4096)).ok());
  }
  ASSERT_TRUE(GetAndCheck(*store, 3, 1, 4096).ok());
  ASSERT_TRUE(raw_->Command({"FLUSHALL"}).ok());
  for (uint64_t k = 0; k < 10; ++k) {
    absl::Status s = GetAndCheck(*store, k, 1, 4096);
    EXPECT_TRUE(absl::IsNotFound(s)) << k << ": " << s;
    EXPECT_FALSE(store->Contains(Key(k)));
  }
  EXPECT_EQ(store->stats().misses.load(), 10);
  EXPECT_EQ(store->stats().corrupt.load(), 0);
  EXPECT_EQ(store->stats().get_errors.load(), 0);
  // And it is written again.
  ASSERT_TRUE(store->Put(Key(3), Payload(3, 2, 4096)).ok());
  EXPECT_TRUE(GetAndCheck(*store, 3, 2, 4096).ok());
}

TEST_F(RedisPageStoreTest, ForeignValuesAreCorruptMissesAndDeleted) {
  StartRedis();
  auto store = NewStore();
  ASSERT_NE(store, nullptr);
  const std::string key1 = store->KeyOf(Key(1));
  const std::vector<uint8_t> page = Payload(1, 1, 1000);
  const std::string good = kv::EncodePageBlob(Key(1), page);
  std::string flipped = good;
  flipped[kv::kPageBlobHeaderBytes + 500] ^= 0x04;
  const std::vector<std::pair<std::string, std::string>> values = {
      {"garbage", "not a page at all"},
      {"empty", ""},
      {"another key's blob", kv::EncodePageBlob(Key(2), page)},
      {"truncated", good.substr(0, good.size() - 1)},
      {"flipped payload bit", flipped},
      {"header only", good.substr(0, kv::kPageBlobHeaderBytes)},
  };
  int64_t corrupt = 0;
  for (const auto& [what, value] : values) {
    SCOPED_TRACE(what);
    RawSet(key1, value);
    absl::Status s = GetAndCheck(*store, 1, 1, page.size());
    EXPECT_TRUE(absl::IsNotFound(s)) << s;
    EXPECT_EQ(store->stats().corrupt.load(), ++corrupt);
    EXPECT_FALSE(RawExists(key1));
  }
  // A key of another type (WRONGTYPE).
  ASSERT_TRUE(raw_->Command({"HSET", key1, "f", "v"}).ok());
  EXPECT_TRUE(absl::IsNotFound(GetAndCheck(*store, 1, 1, page.size())));
  EXPECT_EQ(store->stats().corrupt.load(), ++corrupt);
  EXPECT_FALSE(RawExists(key1));

  // The real blob set by hand reads fine; a wrong out size is the caller's
  // error and leaves it.
  RawSet(key1, good);
  EXPECT_TRUE(GetAndCheck(*store, 1, 1, page.size()).ok());
  EXPECT_TRUE(absl::IsInvalidArgument(GetAndCheck(*store, 1, 1, 999)));
  EXPECT_TRUE(RawExists(key1));
  EXPECT_EQ(store->stats().get_errors.load(), 1);
}

// A store with a MAC key: whoever can write to its Redis but lacks the key
// cannot plant a page. A plain blob with a valid checksum, and a keyed blob
// made with another key, are corrupt misses (and deleted); the store's own
// pages read back.
TEST_F(RedisPageStoreTest, ForgedPagesAreRefusedByAKeyedStore) {
  StartRedis();
  auto mac = kv::PageBlobMac::FromKey(std::string(40, 's'));
  auto forger = kv::PageBlobMac::FromKey(std::string(40, 'f'));
  ASSERT_TRUE(mac.ok() && forger.ok());
  auto created = RedisPageStore::Create(
      {.redis = server_->ClientOptions(), .cluster = "l3test", .mac = *mac});
  ASSERT_TRUE(created.ok()) << created.status();
  RedisPageStore& store = **created;
  const std::vector<uint8_t> page = Payload(1, 1, 1000);
  ASSERT_TRUE(store.Put(Key(1), page).ok());
  EXPECT_TRUE(GetAndCheck(store, 1, 1, page.size()).ok());
  const std::string key1 = store.KeyOf(Key(1));
  int64_t corrupt = 0;
  for (const std::string& forged :
       {kv::EncodePageBlob(Key(1), Payload(1, 2, 1000)),
        kv::EncodePageBlob(Key(1), Payload(1, 2, 1000), forger->get())}) {
    RawSet(key1, forged);
    EXPECT_TRUE(absl::IsNotFound(GetAndCheck(store, 1, 1, page.size())));
    EXPECT_EQ(store.stats().corrupt.load(), ++corrupt);
    EXPECT_FALSE(RawExists(key1));
  }
}

TEST_F(RedisPageStoreTest, KilledRedisIsUnavailableQuicklyThenRecovers) {
  StartRedis();
  auto store = NewStore();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Put(Key(1), Payload(1, 1, 800 * 1024)).ok());
  ASSERT_TRUE(server_->Kill().ok());

  std::vector<uint8_t> out(800 * 1024);
  for (int i = 0; i < 5; ++i) {  // the first call finds the dead connection
    const absl::Time start = absl::Now();
    absl::Status put = store->Put(Key(2), Payload(2, 1, 800 * 1024));
    absl::Status get = store->Get(Key(1), absl::MakeSpan(out));
    const bool contains = store->Contains(Key(1));
    store->Erase(Key(1));
    const absl::Duration took = absl::Now() - start;
    EXPECT_TRUE(absl::IsUnavailable(put)) << put;
    EXPECT_TRUE(absl::IsUnavailable(get)) << get;
    EXPECT_FALSE(contains);
    EXPECT_LT(took, absl::Seconds(1)) << i;
  }
  EXPECT_EQ(store->stats().put_errors.load(), 5);
  EXPECT_EQ(store->stats().get_errors.load(), 5);
  EXPECT_EQ(store->stats().hits.load(), 0);

  ASSERT_TRUE(server_->Restart().ok());
  // Back within the client's reconnect backoff (200 ms at most here).
  absl::Status put;
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  do {
    put = store->Put(Key(2), Payload(2, 2, 800 * 1024));
    if (!put.ok()) absl::SleepFor(absl::Milliseconds(20));
  } while (!put.ok() && absl::Now() < deadline);
  ASSERT_TRUE(put.ok()) << put;
  EXPECT_TRUE(GetAndCheck(*store, 2, 2, 800 * 1024).ok());
  // The restarted Redis is empty: the old page is a plain miss.
  EXPECT_TRUE(absl::IsNotFound(GetAndCheck(*store, 1, 1, 800 * 1024)));
  EXPECT_EQ(store->stats().corrupt.load(), 0);
}

TEST_F(RedisPageStoreTest, KeepsWorkingWhileRedisEvictsUnderMaxmemory) {
  StartRedis({"--maxmemory", "4mb", "--maxmemory-policy", "allkeys-lru"});
  auto store = NewStore();
  ASSERT_NE(store, nullptr);
  absl::StatusOr<std::string> warning = store->CheckEvictionPolicy();
  ASSERT_TRUE(warning.ok()) << warning.status();
  EXPECT_EQ(*warning, "");
  constexpr size_t kSize = 64 * 1024;
  constexpr uint64_t kPages = 160;  // 10 MiB of pages into 4 MB
  for (uint64_t k = 0; k < kPages; ++k) {
    absl::Status s = store->Put(Key(k), Payload(k, 1, kSize));
    ASSERT_TRUE(s.ok()) << k << ": " << s;
  }
  int hits = 0;
  for (uint64_t k = 0; k < kPages; ++k) {
    absl::Status s = GetAndCheck(*store, k, 1, kSize);
    ASSERT_TRUE(s.ok() || absl::IsNotFound(s)) << k << ": " << s;
    hits += s.ok();
  }
  EXPECT_GT(InfoField("stats", "evicted_keys"), 0);
  EXPECT_GT(hits, 10);
  EXPECT_LT(hits, static_cast<int>(kPages));
  EXPECT_EQ(store->stats().corrupt.load(), 0);
  EXPECT_EQ(store->stats().put_errors.load(), 0);
  // The most recent page survived.
  EXPECT_TRUE(GetAndCheck(*store, kPages - 1, 1, kSize).ok());
}

TEST_F(RedisPageStoreTest, EvictionPolicyCheckWarnsWhenRedisCannotEvict) {
  StartRedis({"--maxmemory", "3mb", "--maxmemory-policy", "noeviction"});
  auto store = NewStore();
  ASSERT_NE(store, nullptr);
  absl::StatusOr<std::string> warning = store->CheckEvictionPolicy();
  ASSERT_TRUE(warning.ok()) << warning.status();
  EXPECT_THAT(*warning, HasSubstr("noeviction"));
  // Full under noeviction: Puts fail (ResourceExhausted), reads still work.
  absl::Status put;
  uint64_t k = 0;
  for (; k < 100 && put.ok(); ++k) {
    put = store->Put(Key(k), Payload(k, 1, 64 * 1024));
  }
  EXPECT_TRUE(absl::IsResourceExhausted(put)) << put;
  EXPECT_EQ(store->stats().put_errors.load(), 1);
  EXPECT_TRUE(GetAndCheck(*store, 0, 1, 64 * 1024).ok());

  ASSERT_TRUE(
      raw_->Command({"CONFIG", "SET", "maxmemory-policy", "volatile-lru"})
          .ok());
  EXPECT_THAT(*store->CheckEvictionPolicy(), HasSubstr("no ttl"));
  EXPECT_EQ(*NewStore(1, absl::Seconds(60))->CheckEvictionPolicy(), "");
  ASSERT_TRUE(raw_->Command({"CONFIG", "SET", "maxmemory", "0"}).ok());
  EXPECT_THAT(*store->CheckEvictionPolicy(), HasSubstr("unbounded"));
}

TEST_F(RedisPageStoreTest, CreateNeedsNoRedisAndValidatesOptions) {
  RedisOptions nowhere{.host = "127.0.0.1", .port = 1};
  auto store = RedisPageStore::Create({.redis = nowhere});
  ASSERT_TRUE(store.ok()) << store.status();
  std::vector<uint8_t> out(10);
  EXPECT_TRUE(absl::IsUnavailable((*store)->Get(Key(1), absl::MakeSpan(out))));
  EXPECT_TRUE(absl::IsInvalidArgument(
      RedisPageStore::Create({.redis = nowhere, .cluster = "bad name"})
          .status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      RedisPageStore::Create({.redis = nowhere, .ttl = absl::Seconds(-1)})
          .status()));
}

// Several threads over a pool of connections: every successful Get returns
// the bytes of some Put of that key, and the counters add up.
TEST_F(RedisPageStoreTest, ConcurrentCallersNeverSeeWrongBytes) {
  StartRedis({"--maxmemory", "8mb", "--maxmemory-policy", "allkeys-lru"});
  auto store = NewStore(/*pool_size=*/4);
  ASSERT_NE(store, nullptr);
  constexpr uint64_t kKeys = 32;
  constexpr size_t kSize = 32 * 1024;
  std::atomic<uint64_t> versions[kKeys];
  for (auto& v : versions) v.store(0);
  std::atomic<int> wrong{0}, hits{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(t);
      for (int i = 0; i < 400; ++i) {
        const uint64_t key = rng() % kKeys;
        if (rng() % 2 == 0) {
          const uint64_t v = versions[key].fetch_add(1) + 1;
          (void)store->Put(Key(key), Payload(key, v, kSize));
        } else {
          std::vector<uint8_t> out(kSize);
          if (store->Get(Key(key), absl::MakeSpan(out)).ok()) {
            ++hits;
            if (!IsSomeVersion(out, key, versions[key].load())) ++wrong;
          }
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_GT(hits.load(), 100);
  const kv::PageStoreStats& st = store->stats();
  EXPECT_EQ(st.gets.load(), st.hits.load() + st.misses.load() +
                                st.corrupt.load() + st.get_errors.load());
  EXPECT_EQ(st.get_errors.load(), 0);
  EXPECT_EQ(st.put_errors.load(), 0);
}

}  // namespace
}  // namespace swaserve::cluster

namespace swaserve::cluster {
namespace {

// Consistency case "Redis L3 flushed mid-replay": a prefix cache
// whose L3 is a RedisPageStore behind AsyncPageStore (as in a worker)
// replays prompts of a few shared-prefix families through small L1/L2 pools,
// fetching and attaching from L3 before every lookup; halfway Redis is
// flushed. Every byte every hit reads is the writer's throughout; L3
// supplies pages before the flush and again once they are re-written after
// it, and the flush itself reads as misses.
TEST_F(RedisPageStoreTest, PrefixCacheReplaySurvivesAFlushMidReplay) {
  StartRedis({"--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru"});
  std::unique_ptr<RedisPageStore> redis_store = NewStore(/*pool_size=*/2);
  ASSERT_NE(redis_store, nullptr);
  const RedisPageStore* backend = redis_store.get();
  kv::AsyncPageStore l3(std::move(redis_store));
  kv::testing::L3Harness h;
  h.Init(&l3, /*write_through_hits=*/1, /*l1_pages=*/24, /*l2_pages=*/8);
  std::mt19937 rng(7);
  int64_t attached_before_flush = 0;
  for (int step = 0; step < 160; ++step) {
    if (step == 80) {
      l3.Flush();
      attached_before_flush = h.cache_->stats().l3_attached_pages.load();
      const kv::testing::Hashes any = h.H(1, 9);
      const kv::L3FetchOptions fo = h.cache_->l3_fetch_options();
      ASSERT_TRUE(raw_->Command({"FLUSHALL"}).ok());
      EXPECT_TRUE(kv::FetchFromL3(l3, fo, any, 0, 0).empty()) << "a flushed L3 is a miss";
    }
    const uint32_t family = 1 + rng() % 6;
    const int pages = 4 + static_cast<int>(rng() % 6);
    const kv::testing::Hashes prompt = h.H(family, pages);  // a family shares its prefix
    l3.Flush();  // the write-behind queue lands before the next fetch
    h.FetchAttach(l3, prompt);
    ASSERT_NO_FATAL_FAILURE(h.Check());
    const int hit = h.VerifyHit(prompt);  // every byte against the writer's
    ASSERT_FALSE(::testing::Test::HasFailure()) << "step " << step;
    if (hit < pages * 4) {
      h.cache_->Evict(pages, 2);
      h.Insert(prompt);  // "computes" the prompt; cached pages are duplicates
    }
    ASSERT_NO_FATAL_FAILURE(h.Check());
  }
  l3.Flush();
  const int64_t attached_after_flush =
      h.cache_->stats().l3_attached_pages.load() - attached_before_flush;
  EXPECT_GT(attached_before_flush, 20);
  EXPECT_GT(attached_after_flush, 20) << "re-written pages come back after the flush";
  EXPECT_EQ(backend->stats().corrupt.load(), 0);
  EXPECT_EQ(backend->stats().get_errors.load(), 0);
}

}  // namespace
}  // namespace swaserve::cluster
