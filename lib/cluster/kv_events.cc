#include "lib/cluster/kv_events.h"

#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "lib/base/status.h"

namespace swaserve::cluster {
namespace {

// KEYS = the worker's SET, SWA-gone SET, lower-tier SET, sequence counter,
// event stream. Returns {seq, last stream id, pages, swa_gone, lower}.
// KEYS[1] = the sequence counter, KEYS[2] = the stream, KEYS[3] = its
// epoch (one hash tag). Returns {seq, id of the last entry, epoch}, read
// together.
const RedisScript& StreamPositionScript() {
  static const RedisScript* script = new RedisScript{"kv_events_position_v2", R"lua(
local seq = redis.call('GET', KEYS[1])
if not seq then seq = '0' end
local last = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', 1)
local id = '0-0'
if last[1] then id = last[1][1] end
local epoch = redis.call('GET', KEYS[3])
if not epoch then epoch = '' end
return {seq, id, epoch}
)lua"};
  return *script;
}

absl::StatusOr<uint64_t> ParseHash(absl::string_view b) {
  if (b.size() != 8) return absl::InternalError("a page hash is not 8 bytes");
  uint64_t h = 0;
  for (unsigned char c : b) h = (h << 8) | c;
  return h;
}

absl::StatusOr<std::vector<uint64_t>> ParseHashes(absl::string_view packed) {
  if (packed.size() % 8 != 0) return absl::InternalError("packed hashes not a multiple of 8");
  std::vector<uint64_t> out;
  out.reserve(packed.size() / 8);
  for (size_t i = 0; i < packed.size(); i += 8) {
    ASSIGN_OR_RETURN(uint64_t h, ParseHash(packed.substr(i, 8)));
    out.push_back(h);
  }
  return out;
}

absl::StatusOr<std::vector<uint64_t>> Members(const RedisReply& r) {
  if (!r.is_array()) return absl::InternalError("snapshot: expected a member list");
  std::vector<uint64_t> out;
  out.reserve(r.elements.size());
  for (const RedisReply& m : r.elements) {
    ASSIGN_OR_RETURN(uint64_t h, ParseHash(m.str));
    out.push_back(h);
  }
  return out;
}

bool ParseOp(absl::string_view name, KvEvent::Op* op) {
  for (KvEvent::Op o : {KvEvent::Op::kStored, KvEvent::Op::kRemoved, KvEvent::Op::kCleared,
                        KvEvent::Op::kSwaRemoved, KvEvent::Op::kSwaStored,
                        KvEvent::Op::kTierChanged}) {  // not kUnknown: never in a v1 entry
    if (KvEventOpName(o) == name) {
      *op = o;
      return true;
    }
  }
  return false;
}

// One stream entry ([id, [field, value, ...]]); of another version: kUnknown.
absl::Status ParseEntry(const RedisReply& entry, KvEvent* e) {
  if (!entry.is_array() || entry.elements.size() != 2 || !entry.elements[1].is_array()) {
    return absl::InternalError(absl::StrCat("kv events: bad entry ", entry.DebugString()));
  }
  e->id = entry.elements[0].str;
  const std::vector<RedisReply>& f = entry.elements[1].elements;
  std::string version, op;
  bool has_seq = false;
  for (size_t i = 0; i + 1 < f.size(); i += 2) {
    const std::string& k = f[i].str;
    const std::string& v = f[i + 1].str;
    if (k == "v") {
      version = v;
    } else if (k == "seq") {
      has_seq = absl::SimpleAtoi(v, &e->seq);
    } else if (k == "epoch") {
      e->epoch = v;
    } else if (k == "op") {
      op = v;
    } else if (k == "pool") {
      e->pool = v;
    } else if (k == "tier") {
      e->tier = v;
    } else if (k == "hashes" && version == "1") {
      ASSIGN_OR_RETURN(e->hashes, ParseHashes(v));
    }
  }
  if (!has_seq) return absl::InternalError(absl::StrCat("kv events: entry ", e->id, " lacks seq"));
  if (version != "1") {
    *e = KvEvent{.op = KvEvent::Op::kUnknown, .seq = e->seq, .id = e->id, .epoch = e->epoch};
    return absl::OkStatus();
  }
  if (!ParseOp(op, &e->op)) {
    return absl::InternalError(absl::StrCat("kv events: entry ", e->id, " has op '", op, "'"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<KvEvent> ParseKvEventEntry(const RedisReply& entry) {
  KvEvent e;
  RETURN_IF_ERROR(ParseEntry(entry, &e));
  return e;
}

absl::string_view KvEventOpName(KvEvent::Op op) {
  switch (op) {
    case KvEvent::Op::kStored: return "stored";
    case KvEvent::Op::kRemoved: return "removed";
    case KvEvent::Op::kCleared: return "cleared";
    case KvEvent::Op::kSwaRemoved: return "swa_removed";
    case KvEvent::Op::kSwaStored: return "swa_stored";
    case KvEvent::Op::kTierChanged: return "tier_changed";
    case KvEvent::Op::kUnknown: return "unknown";
  }
  return "";
}

absl::StatusOr<KvSnapshot> KvEventReader::Snapshot(absl::string_view worker_id) {
  // The stream position first, then the index SETs (every shard; on a
  // Redis Cluster they are in other hash slots, so this is not atomic). The
  // index is written before the stream (PrefixIndex::Apply), so the SETs
  // include every event up to the position, and perhaps some after it;
  // replaying those again is harmless: each event sets its pages' state, so
  // the state after the replay is that of the last event.
  const std::vector<std::string> position_keys = {
      keys_.EventSeqKey(worker_id), keys_.EventsKey(worker_id), keys_.EventEpochKey(worker_id)};
  ASSIGN_OR_RETURN(RedisReply p, redis_->Evalsha(StreamPositionScript(), position_keys, {},
                                                 "kv_snapshot"));
  if (!p.is_array() || p.elements.size() != 3) {
    return absl::InternalError(absl::StrCat("kv snapshot: bad reply ", p.DebugString()));
  }
  KvSnapshot s;
  ASSIGN_OR_RETURN(const int64_t seq, p.elements[0].AsInteger());
  s.seq = static_cast<uint64_t>(seq);
  s.id = p.elements[1].str;
  s.epoch = p.elements[2].str;
  std::vector<std::string> keys;
  for (int shard = 0; shard < keys_.index_shards(); ++shard) {
    keys.push_back(keys_.PrefixKey(worker_id, shard));
    keys.push_back(keys_.SwaGoneKey(worker_id, shard));
    keys.push_back(keys_.LowerTierKey(worker_id, shard));
  }
  // Sizes first: small SETs in one pipelined SMEMBERS, large ones scanned.
  std::vector<RedisCommand> cards;
  for (const std::string& key : keys) cards.push_back({"SCARD", key});
  ASSIGN_OR_RETURN(std::vector<RedisReply> sizes, redis_->Pipeline(cards, "kv_snapshot"));
  std::vector<RedisCommand> small;
  std::vector<size_t> small_at;
  std::vector<std::vector<RedisReply>> sets(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSIGN_OR_RETURN(const int64_t n, sizes[i].AsInteger());
    if (n > smembers_max_) {
      RETURN_IF_ERROR(Scan(keys[i], &sets[i]));
    } else if (n > 0) {
      small.push_back({"SMEMBERS", keys[i]});
      small_at.push_back(i);
    }
  }
  if (!small.empty()) {
    ASSIGN_OR_RETURN(std::vector<RedisReply> got, redis_->Pipeline(small, "kv_snapshot"));
    for (size_t j = 0; j < got.size(); ++j) {
      RETURN_IF_ERROR(got[j].ToStatus());
      sets[small_at[j]].push_back(std::move(got[j]));
    }
  }
  // A head page is in several shards (index_shard_mapper.h): the union.
  absl::flat_hash_set<uint64_t> seen[3];
  std::vector<uint64_t>* out[3] = {&s.pages, &s.swa_gone, &s.lower};
  for (size_t i = 0; i < sets.size(); ++i) {
    for (const RedisReply& part : sets[i]) {
      ASSIGN_OR_RETURN(std::vector<uint64_t> members, Members(part));
      for (uint64_t h : members) {
        if (seen[i % 3].insert(h).second) out[i % 3]->push_back(h);
      }
    }
  }
  return s;
}

absl::Status KvEventReader::Scan(const std::string& key, std::vector<RedisReply>* out) {
  std::string cursor = "0";
  do {
    ASSIGN_OR_RETURN(RedisReply r,
                     redis_->Command({"SSCAN", key, cursor, "COUNT", "1000"}, "kv_snapshot"));
    if (!r.is_array() || r.elements.size() != 2 || !r.elements[1].is_array()) {
      return absl::InternalError(absl::StrCat("kv snapshot: bad SSCAN reply ", r.DebugString()));
    }
    cursor = r.elements[0].str;
    out->push_back(std::move(r.elements[1]));
  } while (cursor != "0");
  return absl::OkStatus();
}

absl::StatusOr<std::vector<KvEvent>> KvEventReader::Read(absl::string_view worker_id,
                                                         absl::string_view after_id,
                                                         uint64_t after_seq, int count,
                                                         absl::Duration block,
                                                         absl::string_view after_epoch) {
  RedisCommand xread = {"XREAD", "COUNT", absl::StrCat(std::max(1, count))};
  if (block > absl::ZeroDuration()) {
    xread.push_back("BLOCK");
    xread.push_back(absl::StrCat(std::max<int64_t>(1, absl::ToInt64Milliseconds(block))));
  }
  xread.push_back("STREAMS");
  xread.push_back(keys_.EventsKey(worker_id));
  xread.push_back(std::string(after_id));
  const std::vector<RedisCommand> commands = {xread, {"GET", keys_.EventSeqKey(worker_id)},
                                              {"GET", keys_.EventEpochKey(worker_id)}};
  ASSIGN_OR_RETURN(std::vector<RedisReply> replies, redis_->Pipeline(commands, "kv_events"));
  RETURN_IF_ERROR(replies[0].ToStatus());
  std::vector<KvEvent> out;
  if (replies[0].is_array()) {
    for (const RedisReply& stream : replies[0].elements) {
      if (!stream.is_array() || stream.elements.size() != 2 || !stream.elements[1].is_array()) {
        return absl::InternalError(absl::StrCat("kv events: bad reply ", stream.DebugString()));
      }
      for (const RedisReply& entry : stream.elements[1].elements) {
        ASSIGN_OR_RETURN(KvEvent e, ParseKvEventEntry(entry));
        out.push_back(std::move(e));
      }
    }
  }
  if (!out.empty() && out.front().seq != after_seq + 1) {
    return absl::DataLossError(absl::StrCat("kv events of ", worker_id, ": expected seq ",
                                            after_seq + 1, ", the stream continues at ",
                                            out.front().seq, " (take a snapshot)"));
  }
  if (!out.empty() && KvEpochsDiffer(out.front().epoch, after_epoch)) {
    return absl::DataLossError(absl::StrCat("kv events of ", worker_id, ": the stream restarted ",
                                            "(epoch ", out.front().epoch, ", was ", after_epoch,
                                            "; take a snapshot)"));
  }
  if (out.empty()) {
    // Nothing new: a counter behind what was applied, or another epoch,
    // means Redis lost the stream (a restart without persistence) or it
    // expired.
    const int64_t counter = replies[1].is_nil() ? 0 : replies[1].AsInteger().value_or(0);
    if (static_cast<uint64_t>(counter) < after_seq ||
        (replies[2].type == RedisReply::Type::kString && KvEpochsDiffer(replies[2].str, after_epoch))) {
      return absl::DataLossError(absl::StrCat("kv events of ", worker_id, ": the stream was reset (",
                                              counter, " < ", after_seq, " or a new epoch; take a "
                                              "snapshot)"));
    }
  }
  return out;
}

void KvWorkerState::Reset(const KvSnapshot& snapshot) {
  seq_ = snapshot.seq;
  id_ = snapshot.id;
  epoch_ = snapshot.epoch;
  pages_ = {snapshot.pages.begin(), snapshot.pages.end()};
  swa_gone_ = {snapshot.swa_gone.begin(), snapshot.swa_gone.end()};
  lower_ = {snapshot.lower.begin(), snapshot.lower.end()};
}

absl::Status KvWorkerState::Apply(const KvEvent& e) {
  if (e.seq != seq_ + 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("event seq ", e.seq, " does not follow ", seq_));
  }
  if (KvEpochsDiffer(e.epoch, epoch_)) {
    return absl::InvalidArgumentError(
        absl::StrCat("event epoch ", e.epoch, " is not the stream's ", epoch_));
  }
  switch (e.op) {
    case KvEvent::Op::kStored:
      for (uint64_t h : e.hashes) {
        pages_.insert(h);
        swa_gone_.erase(h);
        lower_.erase(h);
      }
      break;
    case KvEvent::Op::kRemoved:
      for (uint64_t h : e.hashes) {
        pages_.erase(h);
        swa_gone_.erase(h);
        lower_.erase(h);
      }
      break;
    case KvEvent::Op::kCleared:
      pages_.clear();
      swa_gone_.clear();
      lower_.clear();
      break;
    case KvEvent::Op::kSwaRemoved:
      swa_gone_.insert(e.hashes.begin(), e.hashes.end());
      break;
    case KvEvent::Op::kSwaStored:
      for (uint64_t h : e.hashes) swa_gone_.erase(h);
      break;
    case KvEvent::Op::kTierChanged:
      for (uint64_t h : e.hashes) {
        if (e.tier == "l2") {
          lower_.insert(h);
        } else {
          lower_.erase(h);
        }
      }
      break;
    case KvEvent::Op::kUnknown:
      break;  // a later version's entry: its seq is consumed, nothing else
  }
  seq_ = e.seq;
  id_ = e.id;
  if (!e.epoch.empty()) epoch_ = e.epoch;
  return absl::OkStatus();
}

int64_t KvWorkerState::Depth(absl::Span<const uint64_t> hashes) const {
  int64_t lo = 0, hi = static_cast<int64_t>(hashes.size());  // pages 1..lo held, hi + 1 not
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (pages_.contains(hashes[mid - 1])) lo = mid; else hi = mid - 1;
  }
  return lo;
}

}  // namespace swaserve::cluster
