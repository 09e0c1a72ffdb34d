// libFuzzer target: the Redis Cluster replies a client trusts
// (lib/cluster/redis_cluster_protocol.h). The input is a RESP byte stream,
// as a node (or something pretending to be one) would send it; every
// decoded reply goes through the CLUSTER SLOTS parser and the MOVED/ASK
// parser, and its strings through the key-slot and command-key functions.
// They must return a value or an error, never crash; parsed ranges stay in
// 0..16383 and redirections name a slot in range.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "lib/cluster/redis_client.h"
#include "lib/cluster/redis_cluster_protocol.h"

namespace sc = swaserve::cluster;

namespace {

void Strings(const sc::RedisReply& r, sc::RedisCommand* out) {
  if (r.is_array()) {
    for (const sc::RedisReply& e : r.elements) Strings(e, out);
  } else if (out->size() < 64) {
    out->push_back(r.str);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string resp(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<std::vector<sc::RedisReply>> replies = sc::ParseRedisReplies(resp);
  if (!replies.ok()) return 0;
  for (const sc::RedisReply& r : *replies) {
    absl::StatusOr<std::vector<sc::RedisSlotRange>> ranges = sc::ParseClusterSlots(r, "h");
    if (ranges.ok()) {
      for (const sc::RedisSlotRange& range : *ranges) {
        if (range.start < 0 || range.end >= sc::kRedisClusterSlots || range.start > range.end ||
            range.master.empty()) {
          abort();
        }
      }
    }
    std::optional<sc::RedisRedirect> redirect = sc::ParseRedisRedirect(r);
    if (redirect && (redirect->slot < 0 || redirect->slot >= sc::kRedisClusterSlots)) abort();
    sc::RedisCommand words;
    Strings(r, &words);
    for (const std::string& w : words) {
      if (sc::RedisKeySlot(w) >= sc::kRedisClusterSlots) abort();
    }
    std::optional<absl::string_view> key = sc::RedisCommandKey(words);
    if (key && sc::RedisKeySlot(*key) >= sc::kRedisClusterSlots) abort();
  }
  return 0;
}
