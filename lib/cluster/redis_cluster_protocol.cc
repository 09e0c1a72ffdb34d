#include "lib/cluster/redis_cluster_protocol.h"

#include <array>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace swaserve::cluster {
namespace {

// CRC16-CCITT (XMODEM: polynomial 0x1021, initial value 0), the cluster
// spec's key hash.
constexpr std::array<uint16_t, 256> MakeCrc16Table() {
  std::array<uint16_t, 256> table{};
  for (int i = 0; i < 256; ++i) {
    uint16_t crc = static_cast<uint16_t>(i << 8);
    for (int bit = 0; bit < 8; ++bit) {
      crc = (crc & 0x8000) != 0 ? static_cast<uint16_t>((crc << 1) ^ 0x1021)
                                : static_cast<uint16_t>(crc << 1);
    }
    table[i] = crc;
  }
  return table;
}

constexpr std::array<uint16_t, 256> kCrc16Table = MakeCrc16Table();

uint16_t Crc16(absl::string_view data) {
  uint16_t crc = 0;
  for (unsigned char c : data) {
    crc = static_cast<uint16_t>((crc << 8) ^ kCrc16Table[((crc >> 8) ^ c) & 0xff]);
  }
  return crc;
}

bool IsKeyless(absl::string_view name) {
  static constexpr absl::string_view kKeyless[] = {
      "ping",     "info",   "script",  "cluster",  "multi",   "exec",     "discard",
      "time",     "dbsize", "flushall", "flushdb", "config",  "client",   "auth",
      "select",   "echo",   "keys",    "scan",     "wait",    "readonly", "readwrite",
      "asking",   "command", "slowlog", "lastsave", "debug",  "hello",    "quit",
      "function", "memory", "latency", "role",     "save",    "bgsave",   "shutdown"};
  for (absl::string_view k : kKeyless) {
    if (absl::EqualsIgnoreCase(name, k)) return true;
  }
  return false;
}

}  // namespace

uint16_t RedisKeySlot(absl::string_view key) {
  const size_t open = key.find('{');
  if (open != absl::string_view::npos) {
    const size_t close = key.find('}', open + 1);
    if (close != absl::string_view::npos && close > open + 1) {
      key = key.substr(open + 1, close - open - 1);
    }
  }
  return Crc16(key) & (kRedisClusterSlots - 1);
}

std::optional<absl::string_view> RedisCommandKey(const RedisCommand& command) {
  if (command.empty()) return std::nullopt;
  const absl::string_view name = command[0];
  if (absl::EqualsIgnoreCase(name, "evalsha") || absl::EqualsIgnoreCase(name, "eval") ||
      absl::EqualsIgnoreCase(name, "evalsha_ro") || absl::EqualsIgnoreCase(name, "eval_ro") ||
      absl::EqualsIgnoreCase(name, "fcall") || absl::EqualsIgnoreCase(name, "fcall_ro")) {
    int numkeys = 0;
    if (command.size() < 4 || !absl::SimpleAtoi(command[2], &numkeys) || numkeys <= 0) {
      return std::nullopt;
    }
    return absl::string_view(command[3]);
  }
  if (absl::EqualsIgnoreCase(name, "xread") || absl::EqualsIgnoreCase(name, "xreadgroup")) {
    for (size_t i = 1; i + 1 < command.size(); ++i) {
      if (absl::EqualsIgnoreCase(command[i], "streams")) return absl::string_view(command[i + 1]);
    }
    return std::nullopt;
  }
  if (IsKeyless(name) || command.size() < 2) return std::nullopt;
  return absl::string_view(command[1]);
}

bool SplitHostPort(absl::string_view address, std::string* host, int* port) {
  size_t colon;
  if (absl::StartsWith(address, "[")) {
    const size_t close = address.find(']');
    if (close == absl::string_view::npos || close + 1 >= address.size() ||
        address[close + 1] != ':') {
      return false;
    }
    *host = std::string(address.substr(1, close - 1));
    colon = close + 1;
  } else {
    colon = address.rfind(':');
    if (colon == absl::string_view::npos) return false;
    *host = std::string(address.substr(0, colon));
  }
  int p = 0;
  if (host->empty() || !absl::SimpleAtoi(address.substr(colon + 1), &p) || p <= 0 ||
      p > 65535) {
    return false;
  }
  *port = p;
  return true;
}

absl::StatusOr<std::vector<RedisSlotRange>> ParseClusterSlots(
    const RedisReply& reply, absl::string_view queried_host) {
  auto bad = [&](absl::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrCat("CLUSTER SLOTS: ", what, " in ", reply.DebugString()));
  };
  if (!reply.is_array()) return bad("not an array");
  auto node = [&](const RedisReply& n, std::string* address) -> bool {
    if (!n.is_array() || n.elements.size() < 2 ||
        n.elements[0].type != RedisReply::Type::kString ||
        n.elements[1].type != RedisReply::Type::kInteger || n.elements[1].integer <= 0 ||
        n.elements[1].integer > 65535) {
      return false;
    }
    std::string host = n.elements[0].str;
    if (host.empty() || host == "?") host = std::string(queried_host);
    const bool v6 = absl::StrContains(host, ':');
    *address = v6 ? absl::StrCat("[", host, "]:", n.elements[1].integer)
                  : absl::StrCat(host, ":", n.elements[1].integer);
    return true;
  };
  std::vector<RedisSlotRange> out;
  for (const RedisReply& r : reply.elements) {
    if (!r.is_array() || r.elements.size() < 3 ||
        r.elements[0].type != RedisReply::Type::kInteger ||
        r.elements[1].type != RedisReply::Type::kInteger) {
      return bad("a range is not [start, end, master, ...]");
    }
    // Compare as 64-bit before narrowing: a start of 54000000061 truncates
    // to an int inside 0..16383 (found by redis_cluster_fuzzer).
    const int64_t start = r.elements[0].integer;
    const int64_t end = r.elements[1].integer;
    if (start < 0 || end >= kRedisClusterSlots || start > end) {
      return bad("a slot range outside 0..16383");
    }
    RedisSlotRange range;
    range.start = static_cast<int>(start);
    range.end = static_cast<int>(end);
    if (!node(r.elements[2], &range.master)) return bad("a malformed master");
    for (size_t i = 3; i < r.elements.size(); ++i) {
      std::string replica;
      if (!node(r.elements[i], &replica)) return bad("a malformed replica");
      range.replicas.push_back(std::move(replica));
    }
    out.push_back(std::move(range));
  }
  return out;
}

std::optional<RedisRedirect> ParseRedisRedirect(const RedisReply& reply) {
  if (!reply.is_error()) return std::nullopt;
  const std::vector<absl::string_view> parts =
      absl::StrSplit(reply.str, ' ', absl::SkipEmpty());
  if (parts.size() != 3 || (parts[0] != "MOVED" && parts[0] != "ASK")) return std::nullopt;
  RedisRedirect r;
  r.ask = parts[0] == "ASK";
  if (!absl::SimpleAtoi(parts[1], &r.slot) || r.slot < 0 || r.slot >= kRedisClusterSlots) {
    return std::nullopt;
  }
  std::string host;
  int port = 0;
  // ":6381": the node does not know its own address (the caller uses the
  // host it asked).
  const bool no_host = absl::StartsWith(parts[2], ":") &&
                       absl::SimpleAtoi(parts[2].substr(1), &port) && port > 0 && port <= 65535;
  if (!no_host && !SplitHostPort(parts[2], &host, &port)) return std::nullopt;
  r.address = std::string(parts[2]);
  return r;
}

}  // namespace swaserve::cluster
