// The prefix index's Lua scripts (prefix_index_scripts.h, prefix_index.h).
#include "lib/cluster/prefix_index_scripts.h"

#include "absl/strings/str_cat.h"

namespace swaserve::cluster::prefix_scripts {

// Lua shared by the scripts that append to a worker's KV event stream
// (kv_events.h), given locals `seqkey` and `epochkey`: next_seq() returns
// the stream's next seq and leaves its epoch in `epoch` — a new one when the
// counter starts over at 1 (or the stream has none yet: written before
// epochs).
constexpr char kNextSeqLua[] = R"lua(
local epoch = nil
local function next_seq()
  local seq = redis.call('INCR', seqkey)
  if not epoch then
    epoch = redis.call('GET', epochkey)
    if seq == 1 or not epoch then
      local t = redis.call('TIME')
      epoch = t[1] .. '.' .. t[2]
      redis.call('SET', epochkey, epoch)
    end
  end
  return seq
end
)lua";

// Every script takes page hashes packed: one ARGV string of 8-byte members
// (PackPageHashes). One 64 KiB argument instead of 8192 small ones is far
// cheaper to format, send and parse, and members are cut out with
// string.sub only as far as a script needs them. Commands get at most 4000
// members at a time (Lua's unpack limit is about 8000 values).

// KEYS[1] = the worker's authoritative SET, KEYS[2] = its predicted ZSET,
// KEYS[3] = its SWA-gone SET, KEYS[4] = its lower-tier SET, KEYS[5] = its
// KV event stream, KEYS[6] = the stream's sequence counter, KEYS[8] = its
// epoch (kv_events.h), KEYS[7] = its tier summary (written last: "0".."6", bit 2 = it has SWA-gone pages, bit 4
// = lower-tier pages, so a match reads every candidate's in one MGET instead
// of two EXISTS each; exact after every call, as only this script fills
// those SETs, and conservative when they shrink by DEL or expiry). ARGV[1] =
// index_ttl ms, ARGV[2] = cap of the SETs (0 = none), ARGV[3] = the
// stream's MAXLEN (0: no stream), then one pair per op: kind ("S" stored,
// "R" removed, "C" cleared, "T" SWA KV dropped (tombstoned), "H" SWA KV
// stored again (healed), "D" down to the lower tier, "U" up to L1), packed
// hashes. Each op is also appended to the stream (kv_events.h, v1) in the
// same script, so a snapshot of the SETs and the stream position agree.
// Returns the SET's size afterwards.
const RedisScript& ApplyScript() {
  static const RedisScript* script = new RedisScript{"prefix_apply_v7", absl::StrCat(R"lua(
local set, pred, gone, lower = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local stream, seqkey, epochkey = KEYS[5], KEYS[6], KEYS[8]
)lua", kNextSeqLua, R"lua(local cap = tonumber(ARGV[2])
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
    local seq = next_seq()
    redis.call('XADD', stream, 'MAXLEN', '~', maxlen, '*', 'v', '1', 'seq', seq,
               'epoch', epoch, 'op', name[1], 'pool', name[2], 'tier', name[3],
               'hashes', packed)
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
    local seq = next_seq()
    redis.call('XADD', stream, 'MAXLEN', '~', maxlen, '*', 'v', '1', 'seq', seq,
               'epoch', epoch, 'op', 'cleared', 'pool', '', 'tier', '', 'hashes', '')
  end
end
if size > 0 then
  redis.call('PEXPIRE', set, ARGV[1])
end
if maxlen > 0 then
  redis.call('PEXPIRE', stream, ARGV[1])
  redis.call('PEXPIRE', seqkey, ARGV[1])
  redis.call('PEXPIRE', epochkey, ARGV[1])
end
local summary = 0
for b, aux in ipairs({gone, lower}) do
  local naux = redis.call('SCARD', aux)
  if cap > 0 and naux > cap then
    redis.call('SPOP', aux, naux - cap)
  end
  if naux > 0 then
    redis.call('PEXPIRE', aux, ARGV[1])
    summary = summary + 2 * b
  end
end
redis.call('SET', KEYS[7], summary, 'PX', ARGV[1])
return size
)lua")};
  return *script;
}

// A sharded index's event stream (kv_events.h, v1), written after the
// shards: KEYS[1] = the worker's stream, KEYS[2] = its sequence counter,
// KEYS[3] = its epoch;
// ARGV[1] = index_ttl ms, ARGV[2] = MAXLEN, then kind/packed pairs as in
// ApplyScript. Returns the last sequence number.
const RedisScript& StreamScript() {
  static const RedisScript* script = new RedisScript{"prefix_stream_v2", absl::StrCat(R"lua(
local stream, seqkey, epochkey = KEYS[1], KEYS[2], KEYS[3]
)lua", kNextSeqLua, R"lua(local maxlen = tonumber(ARGV[2])
local names = {S = {'stored', 'full', 'l1'}, R = {'removed', 'full', ''},
               C = {'cleared', '', ''}, T = {'swa_removed', 'swa', ''},
               H = {'swa_stored', 'swa', ''}, D = {'tier_changed', 'full', 'l2'},
               U = {'tier_changed', 'full', 'l1'}}
local seq = 0
for i = 3, #ARGV, 2 do
  local name = names[ARGV[i]]
  if not name then return redis.error_reply('prefix_stream: unknown op kind ' .. ARGV[i]) end
  seq = next_seq()
  redis.call('XADD', stream, 'MAXLEN', '~', maxlen, '*', 'v', '1', 'seq', seq,
             'epoch', epoch, 'op', name[1], 'pool', name[2], 'tier', name[3],
             'hashes', ARGV[i + 1])
end
redis.call('PEXPIRE', stream, ARGV[1])
redis.call('PEXPIRE', seqkey, ARGV[1])
if epoch then redis.call('PEXPIRE', epochkey, ARGV[1]) end
return seq
)lua")};
  return *script;
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

// KEYS = per candidate its SET, ZSET, SWA-gone SET, lower-tier SET and
// tier summary (5 keys each), then the predicted-until HASH, then optional
// value keys;
// ARGV[1] = the prompt's packed page hashes in prefix order, ARGV[2] = the
// number of candidates, ARGV[3] = window pages wp (the pages whose SWA KV a
// hit at a page boundary needs: ceil((W - 1) / page); 0: do not check),
// ARGV[4..3+n] = the candidates' ids, ARGV[4+n..3+2n] (optional) = per candidate
// how far below its depth d the window-safe search looks (S pages; absent:
// down to page 0) (a caller whose index mirror found the depths sends
// prefix_extend below instead). Returns, per candidate, the number of
// leading pages it holds; then a table with, per candidate, its window-safe depth L: the
// largest p <= d such that none of pages max(1, p - wp + 1)..p is in the
// SWA-gone SET (pages held only by a prediction count as live; p = 0 always
// qualifies), or -1 when L < d - S; = d without the check; then a table with, per candidate, how
// many of its matched pages are in L1: the first matched page in its
// lower-tier SET, found by binary search (a worker's tiers only go down a
// path, so its L2 pages are a suffix of any match: O(log depth) SISMEMBER),
// = depth when it has none; then (with value keys) MGET of the value
// keys — so a router reads loads and prefix depths in one round trip.
//
// The depth (prefix_index.h "Match"): the authoritative SET is closed under
// prefixes, so the prompt's pages in it are exactly pages 1..d for some d,
// found by search instead of a scan: the depths already found for this
// decision's earlier candidates (up to 4, the latest first) as hints — page
// h, then page h + 1 (held: pages 1..h are too) — then page 1 if no hint was
// held, page n (a whole-prompt hit ends there) while the bracket is open,
// and a binary search in the bracket left. Page 1 goes first instead (a miss
// ends there in one probe) while there are no hints or an earlier
// candidate missed it (a prompt without a shared prefix). One
// SISMEMBER per probe, as a member costs about what a call does on a large
// SET (measured: bench/RESULTS.md "Router decision latency"). Every probe
// only narrows [lo, hi], so a wrong hint costs probes, never exactness. On
// the Mooncake trace (bench/router/policy_sim: most candidates hold the
// shared system prompt and nothing more) this costs 4.5 probes per
// candidate (v11; v10, page 1 always first: 5.3), against 10.4 for a plain
// binary search and 16.6 for v8's search from the prompt's end. Whether a
// candidate has SWA-gone or lower-tier pages at all comes from its tier
// summary (one MGET for all candidates; EXISTS only where it is missing).
// Then, when the worker has predictions (its predicted-until time,
// read for all candidates in one HMGET, is in the future), pages d+1.. are scanned
// through the ZSET in growing chunks (none of them is in the SET). Members
// are cut out of ARGV[1] on demand and shared by the candidates.
const RedisScript& MatchScript() {
  static const RedisScript* script = new RedisScript{"prefix_match_v11", R"lua(
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
-- the depths found for this decision's earlier candidates as hints (page h,
-- then page h + 1: two probes settle a candidate that shares the same cached
-- prefix, e.g. a system prompt every worker holds; a wrong hint still
-- narrows the bracket), page 1 when no hint was held (first, while there are
-- no hints or an earlier candidate missed it), then page n (a whole-prompt
-- hit ends here) when still open, then a binary search in the bracket left.
-- One member per call: on a large SET a member costs about as much as a
-- call.
local hints = {}
local page1_missed = false
local function auth_depth(set)
  local lo, hi = 0, n  -- pages 1..lo are held, page hi + 1 is not (none past n)
  if #hints == 0 or page1_missed then
    if redis.call('SISMEMBER', set, m(1)) == 0 then
      page1_missed = true
      return 0
    end
    lo = 1
  end
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
  if lo == 0 then
    -- Every hint was missed: page 1 decides whether anything is held.
    if hi == 0 or redis.call('SISMEMBER', set, m(1)) == 0 then
      page1_missed = true
      return 0
    end
    lo = 1
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
local tiers = {}
if ncand > 0 and n > 0 then
  pred_until = redis.call('HMGET', KEYS[5 * ncand + 1], unpack(ARGV, 4, 3 + ncand))
  local tkeys = {}
  for c = 1, ncand do tkeys[c] = KEYS[5 * c] end
  tiers = redis.call('MGET', unpack(tkeys))
end
-- Whether candidate c may have pages in `key` (its SWA-gone SET: bit 2,
-- lower-tier SET: bit 4): its tier summary says so (Apply writes it with the
-- SETs), or EXISTS when it has none (expired, or written before v6).
local function may_have(c, bit, key)
  local t = tiers[c]
  if t then return tonumber(t) % (bit + bit) >= bit end
  return redis.call('EXISTS', key) == 1
end
for c = 1, ncand do
  local set, pred, gone, lower = KEYS[5 * c - 4], KEYS[5 * c - 3], KEYS[5 * c - 2], KEYS[5 * c - 1]
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
  if wp > 0 and depth > 0 and may_have(c, 2, gone) then
    safe[c] = safe_depth(gone, depth, tonumber(ARGV[3 + ncand + c]) or depth)
  end
  upper[c] = depth
  if depth > 0 and may_have(c, 4, lower) then
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
if #KEYS > 5 * ncand + 1 then
  result[ncand + 3] = redis.call('MGET', unpack(KEYS, 5 * ncand + 2, #KEYS))
end
return result
)lua"};
  return *script;
}

// The match of a router whose index mirror (index_mirror.h) found each
// candidate's depth in its SET: only live predictions are added here, and
// the value keys read. KEYS[1] = the predicted-until HASH, KEYS[1 + c] =
// candidate c's predicted ZSET, then the value keys. ARGV[1] = the prompt's
// page hashes from page base + 1 on (packed), ARGV[2] = base (at most the
// smallest given depth: pages up to it are never read), ARGV[3] = ncand,
// ARGV[4..3+ncand] = the candidates' ids, ARGV[4+ncand..3+2ncand] = their
// given depths. Returns {depth of each candidate..., {values}} (the values
// only with value keys). The predicted part as in prefix_match (its scan in
// growing chunks, stopping at the first page not live); one key per
// candidate and no searches, which halves the keys and arguments Redis
// parses and a third of the script's time (bench/RESULTS.md).
const RedisScript& ExtendScript() {
  static const RedisScript* script = new RedisScript{"prefix_extend_v1", R"lua(
local ncand = tonumber(ARGV[3])
local base = tonumber(ARGV[2])
local packed = ARGV[1]
local n = base + #packed / 8
local result = {}
if ncand > 0 then
  local pu = redis.call('HMGET', KEYS[1], unpack(ARGV, 4, 3 + ncand))
  local now = nil
  local sub = string.sub
  for c = 1, ncand do
    local depth = tonumber(ARGV[3 + ncand + c])
    if depth > n then depth = n end
    local until_ms = pu[c]
    if until_ms and depth < n and depth >= base then
      if not now then
        local t = redis.call('TIME')
        now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
      end
      if tonumber(until_ms) > now then
        local chunk = 8
        local open = true
        while open and depth < n do
          local last = depth + chunk
          if last > n then last = n end
          local args = {}
          for i = depth + 1 - base, last - base do
            args[#args + 1] = sub(packed, i * 8 - 7, i * 8)
          end
          local scores = redis.call('ZMSCORE', KEYS[1 + c], unpack(args))
          local k = 1
          local len = #args
          while k <= len do
            local s = scores[k]
            if s and tonumber(s) > now then k = k + 1 else break end
          end
          if k <= len then open = false end
          depth = depth + k - 1
          if chunk < 2048 then chunk = chunk * 4 end
        end
      end
    end
    result[c] = depth
  end
end
if #KEYS > ncand + 1 then
  result[ncand + 1] = redis.call('MGET', unpack(KEYS, ncand + 2, #KEYS))
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

}  // namespace swaserve::cluster::prefix_scripts
