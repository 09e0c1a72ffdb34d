#include "lib/cluster/redis_page_store.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "absl/memory/memory.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "lib/base/logging.h"
#include "lib/base/status.h"
#include "lib/kv/page_blob.h"

namespace swaserve::cluster {
namespace {

absl::Span<const uint8_t> AsBytes(const std::string& s) {
  return absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(s.data()),
                             s.size());
}

// CONFIG GET <name> -> its value ([name, value] in RESP2).
absl::StatusOr<std::string> ConfigGet(RedisClient& client,
                                      const std::string& name) {
  ASSIGN_OR_RETURN(RedisReply reply,
                   client.Command({"CONFIG", "GET", name}, "kvpage_config"));
  if (!reply.is_array() || reply.elements.size() != 2) {
    return absl::InternalError(
        absl::StrCat("CONFIG GET ", name, ": ", reply.DebugString()));
  }
  return reply.elements[1].AsString();
}

}  // namespace

absl::StatusOr<std::unique_ptr<RedisPageStore>> RedisPageStore::Create(
    const RedisPageStoreOptions& options) {
  if (options.ttl < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "RedisPageStoreOptions.ttl must be >= 0 (0: no expiry)");
  }
  ASSIGN_OR_RETURN(KeySchema keys, KeySchema::Create(options.cluster));
  ASSIGN_OR_RETURN(std::unique_ptr<RedisClient> client,
                   RedisClient::Create(options.redis));
  auto store = absl::WrapUnique(
      new RedisPageStore(options, std::move(keys), std::move(client)));
  if (options.check_eviction_policy) {
    absl::StatusOr<std::string> warning = store->CheckEvictionPolicy();
    if (!warning.ok()) {
      SWA_LOG(info, "L3 Redis store {}: eviction policy not checked: {}",
              store->client_->address(), warning.status().ToString());
    } else if (!warning->empty()) {
      SWA_LOG(warn, "L3 Redis store {}: {}", store->client_->address(),
              *warning);
    }
  }
  return store;
}

RedisPageStore::RedisPageStore(const RedisPageStoreOptions& options,
                               KeySchema keys,
                               std::unique_ptr<RedisClient> client)
    : options_(options), keys_(std::move(keys)), client_(std::move(client)) {}

RedisPageStore::~RedisPageStore() = default;

std::string RedisPageStore::KeyOf(const kv::PageKey& key) const {
  return keys_.KvPageKey(key.layout, key.hash);
}

absl::StatusOr<std::string> RedisPageStore::CheckEvictionPolicy() {
  ASSIGN_OR_RETURN(std::string policy, ConfigGet(*client_, "maxmemory-policy"));
  ASSIGN_OR_RETURN(std::string maxmemory, ConfigGet(*client_, "maxmemory"));
  if (maxmemory == "0") {
    return std::string(
        "maxmemory is 0 (unbounded): L3 pages grow until the host runs out "
        "of memory; set maxmemory and maxmemory-policy allkeys-lru");
  }
  if (absl::StartsWith(policy, "allkeys-")) return std::string();
  if (absl::StartsWith(policy, "volatile-") &&
      options_.ttl > absl::ZeroDuration()) {
    return std::string();  // pages carry a ttl, so they are evictable
  }
  return absl::StrCat("maxmemory-policy is ", policy,
                      ": Redis cannot evict L3 pages",
                      policy == "noeviction" ? " (Puts fail once it is full)"
                                             : " (they have no ttl)",
                      "; use allkeys-lru");
}

absl::Status RedisPageStore::Put(const kv::PageKey& key,
                                 absl::Span<const uint8_t> bytes) {
  RedisCommand command = {"SET", KeyOf(key), kv::EncodePageBlob(key, bytes, options_.mac.get())};
  if (options_.ttl > absl::ZeroDuration()) {
    command.push_back("PX");
    command.push_back(absl::StrCat(
        std::max<int64_t>(1, absl::ToInt64Milliseconds(options_.ttl))));
  }
  absl::StatusOr<RedisReply> reply = client_->Command(command, "kvpage_put");
  absl::Status status = reply.ok() ? reply->ToStatus() : reply.status();
  if (!status.ok()) {
    stats_.put_errors.fetch_add(1, std::memory_order_relaxed);
    return base::Annotate(status, "L3 Redis put");
  }
  stats_.puts.fetch_add(1, std::memory_order_relaxed);
  stats_.put_bytes.fetch_add(static_cast<int64_t>(bytes.size()),
                             std::memory_order_relaxed);
  return absl::OkStatus();
}

absl::Status RedisPageStore::Read(const std::string& redis_key,
                                  const kv::PageKey& key,
                                  absl::Span<uint8_t> out) {
  absl::StatusOr<RedisReply> reply =
      client_->Command({"GET", redis_key}, "kvpage_get");
  if (!reply.ok()) {
    // WRONGTYPE: the key holds something that is not a string, so not ours.
    if (absl::IsFailedPrecondition(reply.status())) {
      return absl::DataLossError(
          absl::StrCat("page blob: ", reply.status().message()));
    }
    return base::Annotate(reply.status(), "L3 Redis get");
  }
  if (reply->is_nil()) return absl::NotFoundError("not in the L3 Redis store");
  if (reply->type != RedisReply::Type::kString) {
    return absl::InternalError(
        absl::StrCat("L3 Redis get: unexpected reply ", reply->DebugString()));
  }
  return kv::ReadPageBlob(AsBytes(reply->str), key, out, options_.mac.get());
}

absl::Status RedisPageStore::Get(const kv::PageKey& key,
                                 absl::Span<uint8_t> out) {
  const std::string redis_key = KeyOf(key);
  absl::Status status = Read(redis_key, key, out);
  if (absl::IsDataLoss(status)) {
    // Best effort: a failed DEL only leaves the bad value for the next Get.
    (void)client_->Command({"DEL", redis_key}, "kvpage_del");
  }
  return kv::CountGet(stats_, std::move(status), out.size());
}

bool RedisPageStore::Contains(const kv::PageKey& key) {
  absl::StatusOr<RedisReply> reply =
      client_->Command({"EXISTS", KeyOf(key)}, "kvpage_exists");
  if (!reply.ok()) return false;
  absl::StatusOr<int64_t> n = reply->AsInteger();
  return n.ok() && *n > 0;
}

std::vector<bool> RedisPageStore::ContainsEach(absl::Span<const kv::PageKey> keys) {
  std::vector<bool> out(keys.size(), false);
  constexpr size_t kChunk = 512;
  for (size_t done = 0; done < keys.size(); done += kChunk) {
    const size_t n = std::min(kChunk, keys.size() - done);
    std::vector<RedisCommand> commands;
    commands.reserve(n);
    for (size_t i = 0; i < n; ++i) commands.push_back({"EXISTS", KeyOf(keys[done + i])});
    absl::StatusOr<std::vector<RedisReply>> replies =
        client_->Pipeline(commands, "kvpage_exists");
    if (!replies.ok() || replies->size() != n) break;  // unreachable: misses
    for (size_t i = 0; i < n; ++i) {
      absl::StatusOr<int64_t> present = (*replies)[i].AsInteger();
      out[done + i] = present.ok() && *present > 0;
    }
  }
  return out;
}

void RedisPageStore::Erase(const kv::PageKey& key) {
  (void)client_->Command({"DEL", KeyOf(key)}, "kvpage_del");
}

}  // namespace swaserve::cluster
