// The parts of the Redis Cluster protocol a client needs (the cluster spec,
// https://redis.io/docs/reference/cluster-spec/): which hash slot a key
// lives in, which key of a command decides its slot, the CLUSTER SLOTS
// reply, and MOVED / ASK redirections. RedisClient (redis_client.h) uses
// them in cluster mode; they are pure functions, tested and fuzzed on their
// own because the slot map and redirections come from the network.
//
// Pure functions and value types; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "lib/cluster/redis_client.h"

namespace swaserve::cluster {

// Redis Cluster has 16,384 hash slots.
inline constexpr int kRedisClusterSlots = 16384;

// The hash slot of `key`: CRC16 (XMODEM) of its hash tag — the text between
// the first '{' and the first '}' after it, when that is non-empty — or of
// the whole key, modulo 16,384.
uint16_t RedisKeySlot(absl::string_view key);

// The key that decides where `command` runs: the first key of EVAL/EVALSHA
// (and their _RO forms, FCALL) when numkeys > 0, the first stream of
// XREAD/XREADGROUP, nothing for commands without keys (PING, INFO, SCRIPT,
// CLUSTER, MULTI, EXEC, ...), and the first argument otherwise. Commands
// with several keys must keep them in one slot (hash tags): Redis answers
// CROSSSLOT otherwise.
std::optional<absl::string_view> RedisCommandKey(const RedisCommand& command);

// One slot range of a CLUSTER SLOTS reply: its master and replicas.
struct RedisSlotRange {
  int start = 0;
  int end = 0;  // inclusive
  std::string master;  // "host:port"
  std::vector<std::string> replicas;
};

// Parses a CLUSTER SLOTS reply. A node announced without a host (an empty
// string or "?": the node does not know its own address) gets
// `queried_host`, the host the reply came from. InvalidArgument names what
// is malformed.
absl::StatusOr<std::vector<RedisSlotRange>> ParseClusterSlots(
    const RedisReply& reply, absl::string_view queried_host);

// A MOVED or ASK error reply ("MOVED 3999 127.0.0.1:6381").
struct RedisRedirect {
  bool ask = false;  // ASK: this command only, after ASKING; MOVED: for good
  int slot = 0;
  std::string address;  // "host:port", or ":port" when the node did not know its host
};

// The redirection an error reply asks for; nullopt for any other reply.
std::optional<RedisRedirect> ParseRedisRedirect(const RedisReply& reply);

// Splits "host:port" (IPv6 hosts in [brackets]); false when malformed.
bool SplitHostPort(absl::string_view address, std::string* host, int* port);

}  // namespace swaserve::cluster
