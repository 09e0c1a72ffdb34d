#include "lib/cluster/prefix_index.h"

#include <utility>

#include "absl/memory/memory.h"
#include "absl/strings/str_cat.h"
#include "lib/base/status.h"
#include "lib/cluster/index_shard_mapper.h"

namespace swaserve::cluster {
namespace {

// Every script takes page hashes packed: one ARGV string of 8-byte members
// (PackPageHashes). One 64 KiB argument instead of 8192 small ones is far
// cheaper to format, send and parse, and members are cut out with
// string.sub only as far as a script needs them. Commands get at most 4000
// members at a time (Lua's unpack limit is about 8000 values).

// KEYS[1] = the worker's authoritative SET, KEYS[2] = its predicted ZSET,
// KEYS[3] = its SWA-gone SET, KEYS[4] = its lower-tier SET, KEYS[5] = its
// KV event stream, KEYS[6] = the stream's sequence counter. ARGV[1] =
// index_ttl ms, ARGV[2] = cap of the SETs (0 = none), ARGV[3] = the
// stream's MAXLEN (0: no stream), then one pair per op: kind ("S" stored,
// "R" removed, "C" cleared, "T" SWA KV dropped (tombstoned), "H" SWA KV
// stored again (healed), "D" down to the lower tier, "U" up to L1), packed
// hashes. Each op is also appended to the stream (kv_events.h, v1) in the
// same script, so a snapshot of the SETs and the stream position agree.
// Returns the SET's size afterwards.
const RedisScript& ApplyScript() {
  static const RedisScript* script = new RedisScript{"prefix_apply_v5", R"lua(
local set, pred, gone, lower = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local stream, seqkey = KEYS[5], KEYS[6]
local cap = tonumber(ARGV[2])
local maxlen = tonumber(ARGV[3])
local sub = string.sub
local names = {S = {'stored', 'full', 'l1'}, R = {'removed', 'full', ''},
               C = {'cleared', '', ''}, T = {'swa_removed', 'swa', ''},
               H = {'swa_stored', 'swa', ''}, D = {'tier_changed', 'full', 'l2'},
               U = {'tier_changed', 'full', 'l1'}}
for i = 4, #ARGV, 2 do
  local kind = ARGV[i]
  local packed = ARGV[i + 1]
  local n = #packed / 8
  local name = names[kind]
  if name and maxlen > 0 then
    local seq = redis.call('INCR', seqkey)
    redis.call('XADD', stream, 'MAXLEN', '~', maxlen, '*', 'v', '1', 'seq', seq,
               'op', name[1], 'pool', name[2], 'tier', name[3], 'hashes', packed)
  end
  if kind == 'C' then
    redis.call('DEL', set, pred, gone, lower)
  elseif kind == 'S' or kind == 'R' or kind == 'T' or kind == 'H' or kind == 'D' or
         kind == 'U' then
    local j = 1
    while j <= n do
      local last = math.min(n, j + 3999)
      local members = {}
      for m = j, last do members[#members + 1] = sub(packed, m * 8 - 7, m * 8) end
      if kind == 'S' then
        redis.call('SADD', set, unpack(members))
        redis.call('SREM', gone, unpack(members))
        redis.call('SREM', lower, unpack(members))
      elseif kind == 'R' then
        redis.call('SREM', set, unpack(members))
        redis.call('ZREM', pred, unpack(members))
        redis.call('SREM', gone, unpack(members))
        redis.call('SREM', lower, unpack(members))
      elseif kind == 'T' then
        redis.call('SADD', gone, unpack(members))
      elseif kind == 'H' then
        redis.call('SREM', gone, unpack(members))
      elseif kind == 'D' then
        redis.call('SADD', lower, unpack(members))
      else
        redis.call('SREM', lower, unpack(members))
      end
      j = last + 1
    end
  else
    return redis.error_reply('prefix_apply: unknown op kind ' .. kind)
  end
end
local size = redis.call('SCARD', set)
if cap > 0 and size > cap then
  -- Only lost removal events can push a worker past the bound. Random
  -- eviction would leave holes inside prefixes (the match's search needs
  -- prefix-closed SETs): drop the worker's entries instead, as on a clear.
  redis.call('DEL', set, pred, gone, lower)
  size = 0
  if maxlen > 0 then
    local seq = redis.call('INCR', seqkey)
    redis.call('XADD', stream, 'MAXLEN', '~', maxlen, '*', 'v', '1', 'seq', seq,
               'op', 'cleared', 'pool', '', 'tier', '', 'hashes', '')
  end
end
if size > 0 then
  redis.call('PEXPIRE', set, ARGV[1])
end
if maxlen > 0 then
  redis.call('PEXPIRE', stream, ARGV[1])
  redis.call('PEXPIRE', seqkey, ARGV[1])
end
for _, aux in ipairs({gone, lower}) do
  local naux = redis.call('SCARD', aux)
  if cap > 0 and naux > cap then
    redis.call('SPOP', aux, naux - cap)
  end
  if naux > 0 then
    redis.call('PEXPIRE', aux, ARGV[1])
  end
end
return size
)lua"};
  return *script;
}

// A sharded index's event stream (kv_events.h, v1), written after the
// shards: KEYS[1] = the worker's stream, KEYS[2] = its sequence counter;
// ARGV[1] = index_ttl ms, ARGV[2] = MAXLEN, then kind/packed pairs as in
// ApplyScript. Returns the last sequence number.
const RedisScript& StreamScript() {
  static const RedisScript* script = new RedisScript{"prefix_stream_v1", R"lua(
local stream, seqkey = KEYS[1], KEYS[2]
local maxlen = tonumber(ARGV[2])
local names = {S = {'stored', 'full', 'l1'}, R = {'removed', 'full', ''},
               C = {'cleared', '', ''}, T = {'swa_removed', 'swa', ''},
               H = {'swa_stored', 'swa', ''}, D = {'tier_changed', 'full', 'l2'},
               U = {'tier_changed', 'full', 'l1'}}
local seq = 0
for i = 3, #ARGV, 2 do
  local name = names[ARGV[i]]
  if not name then return redis.error_reply('prefix_stream: unknown op kind ' .. ARGV[i]) end
  seq = redis.call('INCR', seqkey)
  redis.call('XADD', stream, 'MAXLEN', '~', maxlen, '*', 'v', '1', 'seq', seq,
             'op', name[1], 'pool', name[2], 'tier', name[3], 'hashes', ARGV[i + 1])
end
redis.call('PEXPIRE', stream, ARGV[1])
redis.call('PEXPIRE', seqkey, ARGV[1])
return seq
)lua"};
  return *script;
}

// Appends an op's kind letter and packed hashes (ApplyScript's ARGV pairs).
void AppendOpArgs(const CacheEventOp& e, std::vector<std::string>* args) {
  const char* kind = "C";
  switch (e.kind) {
    case CacheEventOp::Kind::kStored: kind = "S"; break;
    case CacheEventOp::Kind::kRemoved: kind = "R"; break;
    case CacheEventOp::Kind::kCleared: kind = "C"; break;
    case CacheEventOp::Kind::kSwaRemoved: kind = "T"; break;
    case CacheEventOp::Kind::kSwaStored: kind = "H"; break;
    case CacheEventOp::Kind::kTierDown: kind = "D"; break;
    case CacheEventOp::Kind::kTierUp: kind = "U"; break;
  }
  args->push_back(kind);
  args->push_back(e.kind == CacheEventOp::Kind::kCleared ? "" : PackPageHashes(e.hashes));
}

// KEYS[1] = the worker's authoritative SET, KEYS[2] = its predicted ZSET.
// KEYS[3] = the cluster's predicted-until HASH.
// ARGV[1] = predicted_ttl ms, ARGV[2] = cap of the ZSET (0 = none),
// ARGV[3] = packed hashes, ARGV[4] = the worker id. Returns the ZSET's size
// afterwards.
const RedisScript& DispatchScript() {
  static const RedisScript* script = new RedisScript{"prefix_dispatch_v2", R"lua(
local set, pred = KEYS[1], KEYS[2]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local expiry = tostring(now + tonumber(ARGV[1]))
local cap = tonumber(ARGV[2])
local packed = ARGV[3]
local n = #packed / 8
local sub = string.sub
redis.call('ZREMRANGEBYSCORE', pred, '-inf', now)
local j = 1
while j <= n do
  local last = math.min(n, j + 1999)
  local members = {}
  for m = j, last do members[#members + 1] = sub(packed, m * 8 - 7, m * 8) end
  local held = redis.call('SMISMEMBER', set, unpack(members))
  local args = {}
  for k = 1, #members do
    if held[k] == 0 then
      args[#args + 1] = expiry
      args[#args + 1] = members[k]
    end
  end
  if #args > 0 then
    redis.call('ZADD', pred, 'GT', unpack(args))
  end
  j = last + 1
end
local size = redis.call('ZCARD', pred)
if cap > 0 and size > cap then
  redis.call('ZPOPMIN', pred, size - cap)
  size = cap
end
local top = redis.call('ZRANGE', pred, -1, -1, 'WITHSCORES')
if top[2] then
  redis.call('PEXPIREAT', pred, top[2])
  -- Every dispatch lives predicted_ttl, so no field outlives this one.
  redis.call('HSET', KEYS[3], ARGV[4], top[2])
  redis.call('PEXPIRE', KEYS[3], ARGV[1])
end
return size
)lua"};
  return *script;
}

// KEYS = per candidate its SET, ZSET, SWA-gone SET and lower-tier SET (4
// keys each), then the predicted-until HASH, then optional value keys;
// ARGV[1] = the prompt's packed page hashes in prefix order, ARGV[2] = the
// number of candidates, ARGV[3] = window pages wp (the pages whose SWA KV a
// hit at a page boundary needs: ceil((W - 1) / page); 0: do not check),
// ARGV[4..3+n] = the candidates' ids, ARGV[4+n..3+2n] (optional) = per candidate
// how far below its depth d the window-safe search looks (S pages; absent:
// down to page 0). Returns, per candidate, the number of leading pages it
// holds; then a table with, per candidate, its window-safe depth L: the
// largest p <= d such that none of pages max(1, p - wp + 1)..p is in the
// SWA-gone SET (pages held only by a prediction count as live; p = 0 always
// qualifies), or -1 when L < d - S; = d without the check; then a table with, per candidate, how
// many of its matched pages are in L1: the first matched page in its
// lower-tier SET, found by binary search (a worker's tiers only go down a
// path, so its L2 pages are a suffix of any match: O(log depth) SISMEMBER),
// = depth when the SET is absent; then (with value keys) MGET of the value
// keys — so a router reads loads and prefix depths in one round trip.
//
// The depth (prefix_index.h "Match"): the authoritative SET is closed under
// prefixes, so the prompt's pages in it are exactly pages 1..d for some d,
// found by search instead of a scan: page 1 (a miss ends there), then the
// depths already found for this decision's earlier candidates (up to 4, the
// latest first) as hints — page h, then page h + 1 — then page n (a
// whole-prompt hit ends there) while the bracket is open, and a binary
// search in the bracket left: one
// SISMEMBER per probe, as a member costs about what a call does on a large
// SET (measured: bench/RESULTS.md "Router decision latency"). Every probe
// only narrows [lo, hi], so a wrong hint costs probes, never exactness. On
// the Mooncake trace (bench/router/policy_sim: most candidates hold the
// shared system prompt and nothing more) this costs 5.3 probes per
// candidate, against 10.4 for a plain binary search and 16.6 for v8's search
// from the prompt's end. Then, when the worker has predictions (its predicted-until time,
// read for all candidates in one HMGET, is in the future), pages d+1.. are scanned
// through the ZSET in growing chunks (none of them is in the SET). Members
// are cut out of ARGV[1] on demand and shared by the candidates.
const RedisScript& MatchScript() {
  static const RedisScript* script = new RedisScript{"prefix_match_v10", R"lua(
local now = nil
local function clock()
  if not now then
    local t = redis.call('TIME')
    now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return now
end
local packed = ARGV[1]
local n = #packed / 8
local sub = string.sub
local floor = math.floor
local members = {}
local function m(i)
  local v = members[i]
  if not v then
    v = sub(packed, i * 8 - 7, i * 8)
    members[i] = v
  end
  return v
end
-- The largest d with pages 1..d in `set`, given that they form a prefix:
-- page 1 (a miss ends here), then the depths found for this decision's
-- earlier candidates as hints (page h, then page h + 1: two probes settle a
-- candidate that shares the same cached prefix, e.g. a system prompt every
-- worker holds; a wrong hint still narrows the bracket), then page n (a
-- whole-prompt hit ends here) when still open, then a binary search in the
-- bracket left. One member per call: on a large SET a member
-- costs about as much as a call.
local hints = {}
local function auth_depth(set)
  if redis.call('SISMEMBER', set, m(1)) == 0 then return 0 end
  if n == 1 then return 1 end
  local lo, hi = 1, n  -- page lo is held, page hi + 1 is not (none past n)
  for _, h in ipairs(hints) do
    if lo == hi then break end
    if h >= lo and h <= hi then
      local held = true
      if h > lo then
        if redis.call('SISMEMBER', set, m(h)) == 1 then lo = h else hi = h - 1; held = false end
      end
      if held and h + 1 <= hi then
        if redis.call('SISMEMBER', set, m(h + 1)) == 1 then lo = h + 1 else hi = h end
      end
    end
  end
  if lo < hi and hi == n then
    if redis.call('SISMEMBER', set, m(n)) == 1 then return n end
    hi = n - 1
  end
  while lo < hi do
    local mid = floor((lo + hi + 1) / 2)
    if redis.call('SISMEMBER', set, m(mid)) == 1 then lo = mid else hi = mid - 1 end
  end
  if lo < n and #hints < 4 then
    local seen = false
    for _, h in ipairs(hints) do if h == lo then seen = true end end
    if not seen then table.insert(hints, 1, lo) end
  end
  return lo
end
local result = {}
local ncand = tonumber(ARGV[2])
local wp = tonumber(ARGV[3]) or 0
-- The window-safe depth L <= d (see above), searched downwards from d in
-- growing chunks of SMISMEMBER (wp pages first: a match whose last window is
-- intact costs one call, as before): `top` is the best candidate so far;
-- each dropped page moves it below that page; it is the answer once wp
-- intact pages (or every page down to page 1) lie under it. -1 once top
-- falls below d - scan.
local function safe_depth(gone, d, scan)
  local lowest = d - scan
  if lowest < 0 then lowest = 0 end
  local top = d
  local i = d
  local chunk = wp
  while i >= 1 do
    local lo = math.max(1, i - chunk + 1)
    local args = {}
    for k = i, lo, -1 do args[#args + 1] = m(k) end
    local dropped = redis.call('SMISMEMBER', gone, unpack(args))
    for k = 1, #dropped do
      local page = i - k + 1
      if dropped[k] == 1 then
        top = page - 1
        if top < lowest then return -1 end
      elseif top - page + 1 >= wp or page == 1 then
        return top
      end
    end
    i = lo - 1
    if chunk < 1024 then chunk = chunk * 2 end
  end
  return top
end
local safe = {}
local upper = {}
local pred_until = {}
if ncand > 0 and n > 0 then
  pred_until = redis.call('HMGET', KEYS[4 * ncand + 1], unpack(ARGV, 4, 3 + ncand))
end
for c = 1, ncand do
  local set, pred, gone, lower = KEYS[4 * c - 3], KEYS[4 * c - 2], KEYS[4 * c - 1], KEYS[4 * c]
  local depth = 0
  if n > 0 then depth = auth_depth(set) end
  local pu = pred_until[c]
  if depth < n and pu and tonumber(pu) > clock() then
    -- Beyond the SET's part: live predicted entries, in prefix order.
    local chunk = 8
    local open = true
    while open and depth < n do
      local first = depth + 1
      local last = math.min(n, depth + chunk)
      local args = {}
      for i = first, last do args[#args + 1] = m(i) end
      local scores = redis.call('ZMSCORE', pred, unpack(args))
      local k = 1
      local len = last - first + 1
      while k <= len do
        local s = scores[k]
        if s and tonumber(s) > clock() then k = k + 1 else break end
      end
      if k <= len then open = false end
      depth = depth + k - 1
      if chunk < 2048 then chunk = chunk * 4 end
    end
  end
  result[c] = depth
  safe[c] = depth
  if wp > 0 and depth > 0 and redis.call('EXISTS', gone) == 1 then
    safe[c] = safe_depth(gone, depth, tonumber(ARGV[3 + ncand + c]) or depth)
  end
  upper[c] = depth
  if depth > 0 and redis.call('EXISTS', lower) == 1 then
    local lo, hi = 1, depth + 1
    while lo < hi do
      local mid = floor((lo + hi) / 2)
      if redis.call('SISMEMBER', lower, m(mid)) == 1 then hi = mid else lo = mid + 1 end
    end
    upper[c] = lo - 1
  end
end
result[ncand + 1] = safe
result[ncand + 2] = upper
if #KEYS > 4 * ncand + 1 then
  result[ncand + 3] = redis.call('MGET', unpack(KEYS, 4 * ncand + 2, #KEYS))
end
return result
)lua"};
  return *script;
}

// KEYS[1] = SET, KEYS[2] = ZSET; returns {SET size, live ZSET entries}.
const RedisScript& SizesScript() {
  static const RedisScript* script = new RedisScript{"prefix_sizes", R"lua(
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return {redis.call('SCARD', KEYS[1]),
        redis.call('ZCOUNT', KEYS[2], '(' .. now, '+inf')}
)lua"};
  return *script;
}

}  // namespace

absl::Status ValidatePrefixIndexOptions(const PrefixIndexOptions& options) {
  if (options.index_ttl < absl::Milliseconds(1)) {
    return absl::InvalidArgumentError(
        "PrefixIndexOptions.index_ttl must be >= 1 ms");
  }
  if (options.predicted_ttl < absl::Milliseconds(1)) {
    return absl::InvalidArgumentError(
        "PrefixIndexOptions.predicted_ttl must be >= 1 ms");
  }
  if (options.max_entries_per_worker < 0 ||
      options.max_predicted_per_worker < 0) {
    return absl::InvalidArgumentError(
        "PrefixIndexOptions.max_entries_per_worker and "
        "max_predicted_per_worker must be >= 0 (0: unbounded)");
  }
  if (options.cluster_index_shards < 1 || options.cluster_index_shards > 64) {
    return absl::InvalidArgumentError("PrefixIndexOptions.cluster_index_shards must be in 1..64");
  }
  if (options.anchor_page < 1) {
    return absl::InvalidArgumentError("PrefixIndexOptions.anchor_page must be >= 1");
  }
  if (options.event_stream_max_len < 0) {
    return absl::InvalidArgumentError(
        "PrefixIndexOptions.event_stream_max_len must be >= 0 (0: no event stream)");
  }
  return absl::OkStatus();
}

int IndexShardCount(const RedisClient& redis, const PrefixIndexOptions& options) {
  return redis.cluster_mode() ? options.cluster_index_shards : 1;
}

int PrefixIndex::MatchShard(absl::Span<const uint64_t> hashes) const {
  if (!sharded()) return 0;
  const size_t k = static_cast<size_t>(options_.anchor_page);
  return hashes.size() > k ? keys_.ShardOf(hashes[k]) : IndexShardMapper::kHomeShard;
}

absl::StatusOr<int64_t> PrefixIndex::ApplySharded(absl::string_view worker_id,
                                                  absl::Span<const CacheEventOp> ops,
                                                  absl::string_view op) {
  const std::string ttl = absl::StrCat(absl::ToInt64Milliseconds(options_.index_ttl));
  const std::string cap = absl::StrCat(options_.max_entries_per_worker);
  std::vector<RedisScriptCall> calls;
  std::vector<int> open(keys_.index_shards(), -1);  // shard -> its call
  RedisScriptCall stream{.script = &StreamScript(),
                         .keys = {keys_.EventsKey(worker_id), keys_.EventSeqKey(worker_id)},
                         .args = {ttl, absl::StrCat(options_.event_stream_max_len)}};
  int64_t size = 0;
  // The shards first (a snapshot reads the stream position, then the
  // shards: kv_events.h), each in order; ops after a clear after the DELs.
  auto flush = [&]() -> absl::Status {
    if (calls.empty()) return absl::OkStatus();
    ASSIGN_OR_RETURN(std::vector<RedisReply> replies, redis_->EvalshaPipeline(calls, op));
    for (const RedisReply& r : replies) {
      if (r.is_error()) {
        const absl::Status e = r.ToStatus();
        return absl::Status(e.code(), absl::StrCat("script prefix_apply: ", e.message()));
      }
      ASSIGN_OR_RETURN(const int64_t n, r.AsInteger());
      size += n;
    }
    calls.clear();
    open.assign(open.size(), -1);
    return absl::OkStatus();
  };
  for (const CacheEventOp& e : ops) {
    if (e.kind == CacheEventOp::Kind::kCleared) {
      RETURN_IF_ERROR(flush());
      RETURN_IF_ERROR(Clear(worker_id));
      size = 0;
      AppendOpArgs(e, &stream.args);
      continue;
    }
    if (e.stream) AppendOpArgs(e, &stream.args);
    if (!e.index) continue;
    if (e.shard < 0 || e.shard >= keys_.index_shards()) {
      return absl::InvalidArgumentError(absl::StrCat("PrefixIndex::Apply: shard ", e.shard,
                                                     " of ", keys_.index_shards()));
    }
    int& k = open[e.shard];
    if (k < 0) {
      k = static_cast<int>(calls.size());
      const std::string set = keys_.PrefixKey(worker_id, e.shard);
      // KEYS[5..6] (the stream) stay in the shard's slot: MAXLEN 0 leaves
      // them alone.
      calls.push_back(RedisScriptCall{
          .script = &ApplyScript(),
          .keys = {set, keys_.PredictedKey(worker_id, e.shard),
                   keys_.SwaGoneKey(worker_id, e.shard), keys_.LowerTierKey(worker_id, e.shard),
                   set, set},
          .args = {ttl, cap, "0"}});
    }
    AppendOpArgs(e, &calls[k].args);
  }
  RETURN_IF_ERROR(flush());
  if (options_.event_stream_max_len > 0 && stream.args.size() > 2) {
    ASSIGN_OR_RETURN(std::vector<RedisReply> replies,
                     redis_->EvalshaPipeline(absl::MakeConstSpan(&stream, 1), op));
    RETURN_IF_ERROR(replies[0].ToStatus());
  }
  return size;
}

absl::StatusOr<std::unique_ptr<PrefixIndex>> PrefixIndex::Create(
    RedisClient* redis, const KeySchema& keys,
    const PrefixIndexOptions& options) {
  if (redis == nullptr) {
    return absl::InvalidArgumentError("PrefixIndex: redis client is null");
  }
  RETURN_IF_ERROR(ValidatePrefixIndexOptions(options));
  return absl::WrapUnique(new PrefixIndex(redis, keys, options));
}

absl::StatusOr<int64_t> PrefixIndex::Apply(absl::string_view worker_id,
                                           absl::Span<const CacheEventOp> ops,
                                           absl::string_view op) {
  RETURN_IF_ERROR(ValidateName(worker_id, "worker id"));
  if (sharded()) return ApplySharded(worker_id, ops, op);
  std::vector<std::string> args;
  args.reserve(3 + 2 * ops.size());
  args.push_back(absl::StrCat(absl::ToInt64Milliseconds(options_.index_ttl)));
  args.push_back(absl::StrCat(options_.max_entries_per_worker));
  args.push_back(absl::StrCat(options_.event_stream_max_len));
  for (const CacheEventOp& e : ops) AppendOpArgs(e, &args);
  const std::vector<std::string> keys = {keys_.PrefixKey(worker_id),
                                         keys_.PredictedKey(worker_id),
                                         keys_.SwaGoneKey(worker_id),
                                         keys_.LowerTierKey(worker_id),
                                         keys_.EventsKey(worker_id),
                                         keys_.EventSeqKey(worker_id)};
  ASSIGN_OR_RETURN(RedisReply reply,
                   redis_->Evalsha(ApplyScript(), keys, args, op));
  return reply.AsInteger();
}

absl::Status PrefixIndex::RecordDispatch(absl::string_view worker_id,
                                         absl::Span<const uint64_t> hashes) {
  RETURN_IF_ERROR(ValidateName(worker_id, "worker id"));
  if (hashes.empty()) return absl::OkStatus();
  const int shard = MatchShard(hashes);
  const std::vector<std::string> keys = {keys_.PrefixKey(worker_id, shard),
                                         keys_.PredictedKey(worker_id, shard),
                                         keys_.PredictedUntilKey(shard)};
  const std::vector<std::string> args = {
      absl::StrCat(absl::ToInt64Milliseconds(options_.predicted_ttl)),
      absl::StrCat(options_.max_predicted_per_worker), PackPageHashes(hashes),
      std::string(worker_id)};
  return redis_->Evalsha(DispatchScript(), keys, args, "record_dispatch")
      .status();
}

absl::StatusOr<std::vector<int64_t>> PrefixIndex::Match(
    absl::Span<const uint64_t> hashes,
    absl::Span<const std::string> candidates) {
  return Match(hashes, candidates, {}, nullptr);
}

absl::StatusOr<RedisScriptCall> PrefixIndex::MatchCall(
    absl::Span<const uint64_t> hashes, absl::Span<const std::string> candidates,
    absl::Span<const std::string> value_keys, int window_pages,
    absl::Span<const int64_t> window_scan_pages) const {
  if (!window_scan_pages.empty() && window_scan_pages.size() != candidates.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PrefixIndex::Match: ", window_scan_pages.size(), " window scan bounds for ",
        candidates.size(), " candidates"));
  }
  if (sharded() && !value_keys.empty()) {
    return absl::InvalidArgumentError(
        "PrefixIndex::Match: a sharded index (Redis Cluster) reads no value keys: they live "
        "in another hash slot");
  }
  const int shard = MatchShard(hashes);
  RedisScriptCall call{.script = &MatchScript()};
  call.keys.reserve(4 * candidates.size() + 1 + value_keys.size());
  for (const std::string& id : candidates) {
    RETURN_IF_ERROR(ValidateName(id, "candidate worker id"));
    call.keys.push_back(keys_.PrefixKey(id, shard));
    call.keys.push_back(keys_.PredictedKey(id, shard));
    call.keys.push_back(keys_.SwaGoneKey(id, shard));
    call.keys.push_back(keys_.LowerTierKey(id, shard));
  }
  call.keys.push_back(keys_.PredictedUntilKey(shard));
  for (const std::string& k : value_keys) call.keys.push_back(k);
  call.args = {PackPageHashes(hashes), absl::StrCat(candidates.size()),
               absl::StrCat(std::max(0, window_pages))};
  call.args.insert(call.args.end(), candidates.begin(), candidates.end());
  for (const int64_t s : window_scan_pages) {
    call.args.push_back(absl::StrCat(std::max<int64_t>(0, s)));
  }
  return call;
}

absl::StatusOr<PrefixIndex::MatchReply> PrefixIndex::ParseMatchReply(const RedisReply& reply,
                                                                     size_t candidates,
                                                                     size_t value_keys) {
  if (reply.is_error()) return reply.ToStatus();
  const size_t want = candidates + 2 + (value_keys == 0 ? 0 : 1);
  if (!reply.is_array() || reply.elements.size() != want) {
    return absl::InternalError(absl::StrCat("prefix_match: expected ", want,
                                            " elements, got ", reply.DebugString()));
  }
  MatchReply out;
  out.depths.resize(candidates);
  for (size_t i = 0; i < candidates; ++i) {
    ASSIGN_OR_RETURN(out.depths[i], reply.elements[i].AsInteger());
  }
  // An empty Lua table comes back as an empty array (no candidates).
  auto per_candidate = [&](const RedisReply& r, absl::string_view what,
                           std::vector<int64_t>* into) -> absl::Status {
    if (!r.is_array() || r.elements.size() != candidates) {
      return absl::InternalError(
          absl::StrCat("prefix_match: bad ", what, " reply ", r.DebugString()));
    }
    into->resize(candidates);
    for (size_t i = 0; i < candidates; ++i) {
      ASSIGN_OR_RETURN((*into)[i], r.elements[i].AsInteger());
    }
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(per_candidate(reply.elements[candidates], "window-safe", &out.safe_pages));
  RETURN_IF_ERROR(per_candidate(reply.elements[candidates + 1], "tier", &out.l1_pages));
  out.values.assign(value_keys, std::nullopt);
  if (value_keys != 0) {
    const RedisReply& v = reply.elements[candidates + 2];
    if (!v.is_array() || v.elements.size() != value_keys) {
      return absl::InternalError(
          absl::StrCat("prefix_match: bad values reply ", v.DebugString()));
    }
    for (size_t i = 0; i < value_keys; ++i) {
      if (v.elements[i].type == RedisReply::Type::kString) out.values[i] = v.elements[i].str;
    }
  }
  return out;
}

absl::StatusOr<std::vector<int64_t>> PrefixIndex::Match(
    absl::Span<const uint64_t> hashes, absl::Span<const std::string> candidates,
    absl::Span<const std::string> value_keys,
    std::vector<std::optional<std::string>>* values, int window_pages,
    std::vector<int64_t>* safe_pages, std::vector<int64_t>* l1_pages,
    absl::Span<const int64_t> window_scan_pages) {
  ASSIGN_OR_RETURN(RedisScriptCall call, MatchCall(hashes, candidates, value_keys, window_pages,
                                                   window_scan_pages));
  if (values != nullptr) values->assign(value_keys.size(), std::nullopt);
  if (safe_pages != nullptr) safe_pages->assign(candidates.size(), 0);
  if (l1_pages != nullptr) l1_pages->assign(candidates.size(), 0);
  if ((candidates.empty() || hashes.empty()) && value_keys.empty()) {
    return std::vector<int64_t>(candidates.size(), 0);
  }
  ASSIGN_OR_RETURN(RedisReply reply,
                   redis_->Evalsha(*call.script, call.keys, call.args, "match_prefixes"));
  ASSIGN_OR_RETURN(MatchReply parsed,
                   ParseMatchReply(reply, candidates.size(), value_keys.size()));
  if (values != nullptr) *values = std::move(parsed.values);
  if (safe_pages != nullptr) *safe_pages = std::move(parsed.safe_pages);
  if (l1_pages != nullptr) *l1_pages = std::move(parsed.l1_pages);
  return std::move(parsed.depths);
}

std::vector<RedisCommand> PrefixIndex::ClearCommands(absl::string_view worker_id) const {
  std::vector<RedisCommand> commands;
  for (int s = 0; s < keys_.index_shards(); ++s) {
    commands.push_back({"DEL", keys_.PrefixKey(worker_id, s), keys_.PredictedKey(worker_id, s),
                        keys_.SwaGoneKey(worker_id, s), keys_.LowerTierKey(worker_id, s)});
  }
  return commands;
}

std::vector<RedisCommand> PrefixIndex::ExpireCommands(absl::string_view worker_id,
                                                      uint64_t shard_mask) const {
  const std::string ttl = absl::StrCat(absl::ToInt64Milliseconds(options_.index_ttl));
  std::vector<RedisCommand> commands;
  for (int s = 0; s < keys_.index_shards(); ++s) {
    if ((shard_mask >> s & 1) == 0) continue;
    for (const std::string& key : {keys_.PrefixKey(worker_id, s), keys_.SwaGoneKey(worker_id, s),
                                   keys_.LowerTierKey(worker_id, s)}) {
      commands.push_back({"PEXPIRE", key, ttl});
    }
  }
  return commands;
}

absl::Status PrefixIndex::Clear(absl::string_view worker_id) {
  RETURN_IF_ERROR(ValidateName(worker_id, "worker id"));
  ASSIGN_OR_RETURN(std::vector<RedisReply> replies,
                   redis_->Pipeline(ClearCommands(worker_id), "prefix_clear"));
  for (const RedisReply& r : replies) RETURN_IF_ERROR(r.ToStatus());
  return absl::OkStatus();
}

absl::StatusOr<PrefixIndexSizes> PrefixIndex::Sizes(
    absl::string_view worker_id) {
  RETURN_IF_ERROR(ValidateName(worker_id, "worker id"));
  std::vector<RedisScriptCall> calls;
  for (int s = 0; s < keys_.index_shards(); ++s) {
    calls.push_back(RedisScriptCall{
        .script = &SizesScript(),
        .keys = {keys_.PrefixKey(worker_id, s), keys_.PredictedKey(worker_id, s)}});
  }
  ASSIGN_OR_RETURN(std::vector<RedisReply> replies,
                   redis_->EvalshaPipeline(calls, "prefix_sizes"));
  PrefixIndexSizes sizes;
  for (const RedisReply& reply : replies) {
    if (!reply.is_array() || reply.elements.size() != 2) {
      return absl::InternalError(
          absl::StrCat("prefix_sizes: unexpected reply ", reply.DebugString()));
    }
    ASSIGN_OR_RETURN(const int64_t authoritative, reply.elements[0].AsInteger());
    ASSIGN_OR_RETURN(const int64_t predicted, reply.elements[1].AsInteger());
    sizes.authoritative += authoritative;
    sizes.predicted += predicted;
  }
  return sizes;
}

}  // namespace swaserve::cluster
