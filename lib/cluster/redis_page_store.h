// RedisPageStore: the Redis L3 backend of kv::PageStore (lib/kv/page_store.h,
// docs/architecture.md#kv-cache), shared by every worker of a cluster. Here and
// not in lib/kv because lib/kv must not depend on Redis.
//
// One STRING per page under KeySchema(cluster).KvPageKey(layout, hash)
// ("swaserve:v1:<cluster>:kvpage:<layout hex>:<hash hex>"); the value is the
// kv/page_blob.h blob (header with key, length, checksums, then the page),
// so a value that was flushed, evicted, overwritten with garbage or with
// another key's blob reads as a miss, never as wrong bytes:
//   Put       SET key blob [PX ttl]
//   Get       GET key; nil -> NotFound (a miss); a value failing verification
//             (or a key of another type) -> DEL, counted corrupt, NotFound
//   Contains  EXISTS key
//   Erase     DEL key
//
// Bound: Redis's own. Run it with `maxmemory <bytes>` and
// `maxmemory-policy allkeys-lru` (or allkeys-lfu): Redis then evicts pages
// (and, sharing the instance, nothing else of the cluster state is safe from
// it — give the L3 its own Redis or database, RedisOptions::db). With
// `noeviction` a full Redis refuses writes (Put returns ResourceExhausted,
// reads keep working); with volatile-* and no ttl it cannot evict pages at
// all. Create() checks the policy (check_eviction_policy) and logs a warning
// for those settings. The store does not know Redis's bytes or entries: the
// gauges in stats() stay 0, and `evictions` counts nothing (Redis's
// evicted_keys in INFO stats does).
//
// Availability: a Redis that is down, restarting or unreachable makes Put
// and Get return Unavailable (counted put_errors / get_errors; callers treat
// it as a miss) without blocking long: RedisClient fails the first call
// within connect_timeout (a refused connection on loopback: at once) or
// command_timeout, then fails fast with no network I/O during its reconnect
// backoff, and reconnects by itself once Redis is back (redis_client.h).
// Contains returns false and Erase does nothing then.
//
// Ownership: owns its RedisClient (its own connections: page values are
// large, so they do not queue behind the cluster-state calls of the
// worker's other client). Thread-safety: thread-safe; concurrent calls use
// up to redis.pool_size connections.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "lib/cluster/key_schema.h"
#include "lib/cluster/redis_client.h"
#include "lib/kv/page_blob.h"
#include "lib/kv/page_store.h"

namespace swaserve::cluster {

struct RedisPageStoreOptions {
  // Server and client settings (address, timeouts, pool, metrics). The
  // client's default pool_size of 1 serializes calls: give the prefetcher
  // and the write-back their own connections with pool_size >= 2.
  RedisOptions redis;
  // Cluster name: the key prefix (KeySchema). Default "default".
  std::string cluster = "default";
  // Expiry of each page (SET PX), refreshed only by a new Put. Default
  // zero: none, the maxmemory policy alone bounds the store.
  absl::Duration ttl = absl::ZeroDuration();
  // At Create, read maxmemory and maxmemory-policy (CONFIG GET) and log a
  // warning when Redis cannot evict pages (see the file comment). Skipped,
  // with an info line, when Redis is unreachable or CONFIG is disabled.
  // Default true.
  bool check_eviction_policy = true;
  // Pages carry a MAC under this key and only pages whose MAC verifies are
  // read (kv::PageBlobMac): whoever can write to this Redis but does not
  // hold the key cannot plant KV. Null (default): XXH3 checksums only.
  std::shared_ptr<const kv::PageBlobMac> mac;
};

class RedisPageStore final : public kv::PageStore {
 public:
  // Validates the options (InvalidArgument names the field: a bad cluster
  // name, a negative ttl, RedisClient's own checks). Never needs Redis up.
  static absl::StatusOr<std::unique_ptr<RedisPageStore>> Create(
      const RedisPageStoreOptions& options);

  ~RedisPageStore() override;
  RedisPageStore(const RedisPageStore&) = delete;
  RedisPageStore& operator=(const RedisPageStore&) = delete;

  // kv::PageStore. Put errors: Unavailable (Redis down), ResourceExhausted
  // (Redis full under noeviction: OOM), others as RedisReply::ToStatus maps
  // them.
  absl::Status Put(const kv::PageKey& key,
                   absl::Span<const uint8_t> bytes) override;
  absl::Status Get(const kv::PageKey& key, absl::Span<uint8_t> out) override;
  bool Contains(const kv::PageKey& key) override;
  // Pipelined EXISTS, 512 keys per round trip.
  std::vector<bool> ContainsEach(absl::Span<const kv::PageKey> keys) override;
  void Erase(const kv::PageKey& key) override;
  std::string_view backend() const override { return "redis"; }
  const kv::PageStoreStats& stats() const override { return stats_; }

  // The Redis key of `key`.
  std::string KeyOf(const kv::PageKey& key) const;

  // Reads maxmemory and maxmemory-policy; returns "" when Redis can evict
  // pages, else a warning saying why not. Errors: Unavailable (Redis down),
  // an error reply's status (CONFIG disabled or not permitted).
  absl::StatusOr<std::string> CheckEvictionPolicy();

 private:
  RedisPageStore(const RedisPageStoreOptions& options, KeySchema keys,
                 std::unique_ptr<RedisClient> client);

  // GET and verification; DataLoss when the value is not a valid blob of
  // `key` (the caller erases it).
  absl::Status Read(const std::string& redis_key, const kv::PageKey& key,
                    absl::Span<uint8_t> out);

  const RedisPageStoreOptions options_;
  const KeySchema keys_;
  std::unique_ptr<RedisClient> client_;
  kv::PageStoreStats stats_;
};

}  // namespace swaserve::cluster
