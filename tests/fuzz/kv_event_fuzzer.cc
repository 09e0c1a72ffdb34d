// libFuzzer target: the KV events API's stream-entry parser
// (cluster::ParseKvEventEntry, lib/cluster/kv_events.h). The stream lives in
// a shared Redis that other programs may write to, so an entry can hold
// anything: the input is cut into an entry id and field/value strings
// (separated by 0xff bytes; the first byte picks a malformed shape now and
// then). The parser must return an event or an error, never crash; a parsed
// v1 event's hashes are whole 8-byte pages.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "lib/cluster/kv_events.h"
#include "lib/cluster/redis_client.h"

using swaserve::cluster::KvEvent;
using swaserve::cluster::RedisReply;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t shape = data[0];
  std::vector<std::string> parts(1);
  for (size_t i = 1; i < size; ++i) {
    if (data[i] == 0xff) {
      parts.emplace_back();
    } else {
      parts.back().push_back(static_cast<char>(data[i]));
    }
  }
  RedisReply fields{.type = RedisReply::Type::kArray};
  for (size_t i = 1; i < parts.size(); ++i) {
    fields.elements.push_back(RedisReply::String(parts[i]));
  }
  if (shape % 7 == 1) fields.elements.push_back(RedisReply{});  // a nil value
  RedisReply entry{.type = RedisReply::Type::kArray};
  entry.elements.push_back(RedisReply::String(parts[0]));
  if (shape % 5 != 2) entry.elements.push_back(std::move(fields));  // else: no field list
  if (shape % 11 == 3) entry.elements.push_back(RedisReply::String("extra"));
  absl::StatusOr<KvEvent> e = swaserve::cluster::ParseKvEventEntry(entry);
  if (e.ok() && e->op != KvEvent::Op::kUnknown) {
    // Every hash came from whole 8-byte pages of a "hashes" value.
    (void)e->hashes.size();
  }
  return 0;
}
