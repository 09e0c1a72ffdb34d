#include "lib/cluster/prefix_index.h"

#include <utility>

#include "absl/memory/memory.h"
#include "absl/strings/str_cat.h"
#include "lib/base/status.h"
#include "lib/cluster/index_shard_mapper.h"
#include "lib/cluster/prefix_index_scripts.h"

// The scripts (prefix_index_scripts.h).
using swaserve::cluster::prefix_scripts::ApplyScript;
using swaserve::cluster::prefix_scripts::DispatchScript;
using swaserve::cluster::prefix_scripts::ExtendScript;
using swaserve::cluster::prefix_scripts::MatchScript;
using swaserve::cluster::prefix_scripts::SizesScript;
using swaserve::cluster::prefix_scripts::StreamScript;

namespace swaserve::cluster {
namespace {
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
                         .keys = {keys_.EventsKey(worker_id), keys_.EventSeqKey(worker_id),
                                  keys_.EventEpochKey(worker_id)},
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
      // KEYS[5..6] and [8] (the stream) stay in the shard's slot: MAXLEN 0
      // leaves them alone.
      calls.push_back(RedisScriptCall{
          .script = &ApplyScript(),
          .keys = {set, keys_.PredictedKey(worker_id, e.shard),
                   keys_.SwaGoneKey(worker_id, e.shard), keys_.LowerTierKey(worker_id, e.shard),
                   set, set, keys_.TierSummaryKey(worker_id, e.shard), set},
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
                                         keys_.EventSeqKey(worker_id),
                                         keys_.TierSummaryKey(worker_id),
                                         keys_.EventEpochKey(worker_id)};
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
    absl::Span<const int64_t> window_scan_pages, absl::Span<const int64_t> given_depths) const {
  if (!window_scan_pages.empty() && window_scan_pages.size() != candidates.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PrefixIndex::Match: ", window_scan_pages.size(), " window scan bounds for ",
        candidates.size(), " candidates"));
  }
  if (!given_depths.empty() && given_depths.size() != candidates.size()) {
    return absl::InvalidArgumentError(absl::StrCat("PrefixIndex::Match: ", given_depths.size(),
                                                   " given depths for ", candidates.size(),
                                                   " candidates"));
  }
  if (sharded() && !value_keys.empty()) {
    return absl::InvalidArgumentError(
        "PrefixIndex::Match: a sharded index (Redis Cluster) reads no value keys: they live "
        "in another hash slot");
  }
  for (const std::string& id : candidates) RETURN_IF_ERROR(ValidateName(id, "candidate worker id"));
  const int shard = MatchShard(hashes);
  if (!given_depths.empty()) return ExtendCall(hashes, candidates, value_keys, given_depths, shard);
  RedisScriptCall call{.script = &MatchScript()};
  call.keys.reserve(5 * candidates.size() + 1 + value_keys.size());
  for (const std::string& id : candidates) {
    call.keys.push_back(keys_.PrefixKey(id, shard));
    call.keys.push_back(keys_.PredictedKey(id, shard));
    call.keys.push_back(keys_.SwaGoneKey(id, shard));
    call.keys.push_back(keys_.LowerTierKey(id, shard));
    call.keys.push_back(keys_.TierSummaryKey(id, shard));
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

RedisScriptCall PrefixIndex::ExtendCall(absl::Span<const uint64_t> hashes,
                                        absl::Span<const std::string> candidates,
                                        absl::Span<const std::string> value_keys,
                                        absl::Span<const int64_t> given_depths,
                                        int shard) const {
  const int64_t n = static_cast<int64_t>(hashes.size());
  int64_t base = n;
  for (const int64_t d : given_depths) base = std::min(base, std::max<int64_t>(0, d));
  RedisScriptCall call{.script = &ExtendScript()};
  call.keys.reserve(1 + candidates.size() + value_keys.size());
  call.keys.push_back(keys_.PredictedUntilKey(shard));
  for (const std::string& id : candidates) call.keys.push_back(keys_.PredictedKey(id, shard));
  for (const std::string& k : value_keys) call.keys.push_back(k);
  call.args.reserve(3 + 2 * candidates.size());
  call.args = {PackPageHashes(hashes.subspan(static_cast<size_t>(base))), absl::StrCat(base),
               absl::StrCat(candidates.size())};
  call.args.insert(call.args.end(), candidates.begin(), candidates.end());
  for (const int64_t d : given_depths) call.args.push_back(absl::StrCat(std::max<int64_t>(0, d)));
  return call;
}

absl::StatusOr<PrefixIndex::MatchReply> PrefixIndex::ParseMatchReply(const RedisReply& reply,
                                                                     size_t candidates,
                                                                     size_t value_keys,
                                                                     bool given_depths) {
  if (reply.is_error()) return reply.ToStatus();
  // prefix_extend (given depths) answers no window-safe and L1 depths.
  const size_t answers = given_depths ? 0 : 2;
  const size_t want = candidates + answers + (value_keys == 0 ? 0 : 1);
  if (!reply.is_array() || reply.elements.size() != want) {
    return absl::InternalError(absl::StrCat("prefix_match: expected ", want,
                                            " elements, got ", reply.DebugString()));
  }
  MatchReply out;
  out.depths.resize(candidates);
  for (size_t i = 0; i < candidates; ++i) {
    ASSIGN_OR_RETURN(out.depths[i], reply.elements[i].AsInteger());
  }
  out.values.assign(value_keys, std::nullopt);
  if (value_keys != 0) {
    const RedisReply& v = reply.elements[candidates + answers];
    if (!v.is_array() || v.elements.size() != value_keys) {
      return absl::InternalError(
          absl::StrCat("prefix_match: bad values reply ", v.DebugString()));
    }
    for (size_t i = 0; i < value_keys; ++i) {
      if (v.elements[i].type == RedisReply::Type::kString) out.values[i] = v.elements[i].str;
    }
  }
  if (given_depths) {
    out.safe_pages = out.l1_pages = out.depths;
    return out;
  }
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
  return out;
}

absl::StatusOr<std::vector<int64_t>> PrefixIndex::Match(
    absl::Span<const uint64_t> hashes, absl::Span<const std::string> candidates,
    absl::Span<const std::string> value_keys,
    std::vector<std::optional<std::string>>* values, int window_pages,
    std::vector<int64_t>* safe_pages, std::vector<int64_t>* l1_pages,
    absl::Span<const int64_t> window_scan_pages, absl::Span<const int64_t> given_depths) {
  ASSIGN_OR_RETURN(RedisScriptCall call, MatchCall(hashes, candidates, value_keys, window_pages,
                                                   window_scan_pages, given_depths));
  if (values != nullptr) values->assign(value_keys.size(), std::nullopt);
  if (safe_pages != nullptr) safe_pages->assign(candidates.size(), 0);
  if (l1_pages != nullptr) l1_pages->assign(candidates.size(), 0);
  if ((candidates.empty() || hashes.empty()) && value_keys.empty()) {
    return std::vector<int64_t>(candidates.size(), 0);
  }
  ASSIGN_OR_RETURN(RedisReply reply,
                   redis_->Evalsha(*call.script, call.keys, call.args, "match_prefixes"));
  ASSIGN_OR_RETURN(MatchReply parsed,
                   ParseMatchReply(reply, candidates.size(), value_keys.size(),
                                   !given_depths.empty()));
  if (values != nullptr) *values = std::move(parsed.values);
  if (safe_pages != nullptr) *safe_pages = std::move(parsed.safe_pages);
  if (l1_pages != nullptr) *l1_pages = std::move(parsed.l1_pages);
  return std::move(parsed.depths);
}

std::vector<RedisCommand> PrefixIndex::ClearCommands(absl::string_view worker_id) const {
  std::vector<RedisCommand> commands;
  for (int s = 0; s < keys_.index_shards(); ++s) {
    commands.push_back({"DEL", keys_.PrefixKey(worker_id, s), keys_.PredictedKey(worker_id, s),
                        keys_.SwaGoneKey(worker_id, s), keys_.LowerTierKey(worker_id, s),
                        keys_.TierSummaryKey(worker_id, s)});
  }
  return commands;
}

std::vector<RedisCommand> PrefixIndex::ExpireCommands(absl::string_view worker_id,
                                                      uint64_t shard_mask) const {
  const std::string ttl = absl::StrCat(absl::ToInt64Milliseconds(options_.index_ttl));
  std::vector<RedisCommand> commands;
  for (int s = 0; s < keys_.index_shards(); ++s) {
    if ((shard_mask >> s & 1) == 0) continue;
    for (const std::string& key :
         {keys_.PrefixKey(worker_id, s), keys_.SwaGoneKey(worker_id, s),
          keys_.LowerTierKey(worker_id, s), keys_.TierSummaryKey(worker_id, s)}) {
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
