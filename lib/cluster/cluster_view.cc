#include "lib/cluster/cluster_view.h"

#include <algorithm>
#include <utility>

#include "absl/memory/memory.h"
#include "absl/strings/str_cat.h"
#include "lib/base/logging.h"
#include "lib/base/status.h"

namespace swaserve::cluster {
namespace {

// Decodes raw load reports (aligned with `ids`); absent or undecodable ones
// stay nullopt (the latter with a warning).
std::vector<std::optional<swaserve::v1::WorkerLoad>> DecodeLoads(
    const std::vector<std::optional<std::string>>& raw, absl::Span<const std::string> ids) {
  std::vector<std::optional<swaserve::v1::WorkerLoad>> loads(ids.size());
  for (size_t i = 0; i < raw.size() && i < ids.size(); ++i) {
    if (!raw[i]) continue;
    swaserve::v1::WorkerLoad load;
    if (!load.ParseFromString(*raw[i])) {
      SWA_LOG(warn, "cluster: undecodable load report of worker {}", ids[i]);
      continue;
    }
    loads[i] = std::move(load);
  }
  return loads;
}

// KEYS[1] = the worker set; ARGV[1] = the record key prefix.
// Returns {id1, {field, value, ...}, id2, {...}, ...} for live records and
// removes ids whose record has expired from the set.
const RedisScript& ListWorkersScript() {
  static const RedisScript* script = new RedisScript{"list_workers", R"lua(
local ids = redis.call('SMEMBERS', KEYS[1])
local out = {}
for _, id in ipairs(ids) do
  local record = redis.call('HGETALL', ARGV[1] .. id)
  if #record == 0 then
    redis.call('SREM', KEYS[1], id)
  else
    out[#out + 1] = id
    out[#out + 1] = record
  end
end
return out
)lua"};
  return *script;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ClusterView>> ClusterView::Create(
    const ClusterViewOptions& options) {
  if (options.redis == nullptr) {
    return absl::InvalidArgumentError("ClusterViewOptions: redis is required");
  }
  ASSIGN_OR_RETURN(KeySchema keys, KeySchema::Create(options.cluster,
                                                     IndexShardCount(*options.redis,
                                                                     options.index)));
  ASSIGN_OR_RETURN(std::unique_ptr<PrefixIndex> index,
                   PrefixIndex::Create(options.redis, keys, options.index));
  return absl::WrapUnique(new ClusterView(options.redis, std::move(keys), std::move(index),
                                          options.sharded_load_max_age));
}

absl::StatusOr<std::vector<WorkerInfo>> ClusterView::ListWorkers() {
  const std::string set_key = keys_.WorkersKey();
  const std::string record_prefix = keys_.WorkerKeyPrefix();
  ASSIGN_OR_RETURN(
      RedisReply reply,
      redis_->Evalsha(ListWorkersScript(), absl::MakeConstSpan(&set_key, 1),
                      absl::MakeConstSpan(&record_prefix, 1), "list_workers"));
  if (!reply.is_array() || reply.elements.size() % 2 != 0) {
    return absl::InternalError(
        absl::StrCat("list_workers: unexpected reply ", reply.DebugString()));
  }
  std::vector<WorkerInfo> workers;
  for (size_t i = 0; i < reply.elements.size(); i += 2) {
    const RedisReply& id = reply.elements[i];
    const RedisReply& record = reply.elements[i + 1];
    if (!record.is_array() || record.elements.size() % 2 != 0) {
      return absl::InternalError(absl::StrCat(
          "list_workers: unexpected record ", record.DebugString()));
    }
    std::vector<std::pair<std::string, std::string>> fields;
    for (size_t j = 0; j < record.elements.size(); j += 2) {
      fields.emplace_back(record.elements[j].str, record.elements[j + 1].str);
    }
    absl::StatusOr<WorkerInfo> info = DecodeWorkerInfo(fields);
    if (!info.ok()) {
      SWA_LOG(warn, "cluster: skipping worker record {}: {}", id.str,
              info.status().ToString());
      continue;
    }
    workers.push_back(*std::move(info));
  }
  std::sort(
      workers.begin(), workers.end(),
      [](const WorkerInfo& a, const WorkerInfo& b) { return a.id < b.id; });
  return workers;
}

absl::StatusOr<std::vector<std::optional<swaserve::v1::WorkerLoad>>>
ClusterView::GetLoads(absl::Span<const std::string> ids) {
  std::vector<std::string> load_keys;
  load_keys.reserve(ids.size());
  for (const std::string& id : ids) {
    RETURN_IF_ERROR(ValidateName(id, "worker id"));
    load_keys.push_back(keys_.LoadKey(id));
  }
  ASSIGN_OR_RETURN(std::vector<std::optional<std::string>> raw, ReadLoads(load_keys));
  return DecodeLoads(raw, ids);
}

absl::StatusOr<std::vector<std::optional<std::string>>> ClusterView::ReadLoads(
    const std::vector<std::string>& load_keys) {
  std::vector<std::optional<std::string>> out(load_keys.size());
  if (load_keys.empty()) return out;
  RedisCommand mget = {"MGET"};
  mget.insert(mget.end(), load_keys.begin(), load_keys.end());
  ASSIGN_OR_RETURN(RedisReply reply, redis_->Command(mget, "get_loads"));
  if (!reply.is_array() || reply.elements.size() != load_keys.size()) {
    return absl::InternalError(absl::StrCat("get_loads: unexpected reply ", reply.DebugString()));
  }
  for (size_t i = 0; i < load_keys.size(); ++i) {
    if (reply.elements[i].type == RedisReply::Type::kString) out[i] = reply.elements[i].str;
  }
  return out;
}

absl::StatusOr<std::vector<int64_t>> ClusterView::MatchPrefixes(
    absl::Span<const uint64_t> hashes,
    absl::Span<const std::string> candidates) {
  return index_->Match(hashes, candidates);
}

absl::StatusOr<ClusterView::PrefixesAndLoads> ClusterView::MatchPrefixesAndLoads(
    absl::Span<const uint64_t> hashes, absl::Span<const std::string> candidates,
    absl::Span<const std::string> load_ids, int window_pages,
    absl::Span<const int64_t> window_scan_pages) {
  std::vector<std::string> load_keys;
  load_keys.reserve(load_ids.size());
  for (const std::string& id : load_ids) {
    RETURN_IF_ERROR(ValidateName(id, "worker id"));
    load_keys.push_back(keys_.LoadKey(id));
  }
  std::vector<std::optional<std::string>> raw;
  PrefixesAndLoads out;
  IndexMirror* mirror = mirror_.load(std::memory_order_acquire);
  std::vector<int64_t> held;
  if (mirror != nullptr && mirror->Depths(hashes, candidates, &held)) {
    const absl::Status redis = ExtendMirrored(hashes, candidates, held, load_keys, &out, &raw);
    if (!redis.ok()) {
      if (!absl::IsUnavailable(redis) && !absl::IsDeadlineExceeded(redis)) return redis;
      // Redis unreadable: the mirror's depths stand without predictions
      // (they only add pages a worker is about to hold), so a killed master
      // or a restart costs the router its load reports, not its affinity.
      SWA_LOG(debug, "cluster view: Redis unreadable, routing on the index mirror: {}",
              redis.ToString());
      out.depths = held;
      out.redis_unreadable = true;
      // A cluster's load reports may live on a master that still answers.
      absl::StatusOr<std::vector<std::optional<std::string>>> loads =
          index_->sharded() ? CachedLoads(load_keys) : absl::UnavailableError("");
      raw = loads.ok() ? *std::move(loads) : LastLoads(load_keys);
    }
    if (mirror->WindowAndTier(hashes, candidates, out.depths, window_pages, window_scan_pages,
                              &out.safe_pages, &out.l1_pages)) {
      out.loads = DecodeLoads(raw, load_ids);
      return out;
    }
    // A candidate left the mirror meanwhile (a resnapshot): the script.
    if (!redis.ok()) return redis;
  }
  if (index_->sharded()) {
    // The load reports live in the registry's slot, not the prompt's shard.
    ASSIGN_OR_RETURN(out.depths, index_->Match(hashes, candidates, {}, nullptr, window_pages,
                                               &out.safe_pages, &out.l1_pages,
                                               window_scan_pages));
    ASSIGN_OR_RETURN(raw, CachedLoads(load_keys));
  } else {
    ASSIGN_OR_RETURN(out.depths,
                     index_->Match(hashes, candidates, load_keys, &raw, window_pages,
                                   &out.safe_pages, &out.l1_pages, window_scan_pages));
  }
  out.loads = DecodeLoads(raw, load_ids);
  return out;
}

absl::Status ClusterView::ExtendMirrored(absl::Span<const uint64_t> hashes,
                                         absl::Span<const std::string> candidates,
                                         absl::Span<const int64_t> held,
                                         const std::vector<std::string>& load_keys,
                                         PrefixesAndLoads* out,
                                         std::vector<std::optional<std::string>>* raw) {
  // Redis adds predictions (the prompt's shard on a cluster) and reads the
  // loads (a cluster: from the view's cache, they live in another slot).
  if (index_->sharded()) {
    ASSIGN_OR_RETURN(out->depths, index_->Match(hashes, candidates, {}, nullptr, 0, nullptr,
                                                nullptr, {}, held));
    ASSIGN_OR_RETURN(*raw, CachedLoads(load_keys));
  } else {
    ASSIGN_OR_RETURN(out->depths, index_->Match(hashes, candidates, load_keys, raw, 0, nullptr,
                                                nullptr, {}, held));
    RememberLoads(load_keys, *raw);
  }
  return absl::OkStatus();
}

void ClusterView::RememberLoads(const std::vector<std::string>& load_keys,
                                const std::vector<std::optional<std::string>>& raw) {
  absl::MutexLock lock(&loads_mu_);
  // Bounded: ids of long-gone workers (pods replaced over months) go in one
  // sweep; the next decisions fill it again.
  if (loads_.size() > kMaxRememberedLoads) loads_.clear();
  for (size_t i = 0; i < load_keys.size() && i < raw.size(); ++i) {
    if (raw[i].has_value()) loads_[load_keys[i]] = raw[i];
  }
}

std::vector<std::optional<std::string>> ClusterView::LastLoads(
    const std::vector<std::string>& load_keys) {
  std::vector<std::optional<std::string>> out(load_keys.size());
  absl::MutexLock lock(&loads_mu_);
  for (size_t i = 0; i < load_keys.size(); ++i) {
    auto it = loads_.find(load_keys[i]);
    if (it != loads_.end()) out[i] = it->second;
  }
  return out;
}

absl::StatusOr<std::vector<std::optional<std::string>>> ClusterView::CachedLoads(
    const std::vector<std::string>& load_keys) {
  const absl::Time now = absl::Now();
  {
    absl::MutexLock lock(&loads_mu_);
    if (now - loads_at_ <= load_max_age_) {
      std::vector<std::optional<std::string>> out(load_keys.size());
      bool all = true;
      for (size_t i = 0; i < load_keys.size() && all; ++i) {
        auto it = loads_.find(load_keys[i]);
        if (it == loads_.end()) {
          all = false;
        } else {
          out[i] = it->second;
        }
      }
      if (all) return out;
    }
  }
  ASSIGN_OR_RETURN(std::vector<std::optional<std::string>> out, ReadLoads(load_keys));
  absl::MutexLock lock(&loads_mu_);
  loads_.clear();
  loads_at_ = now;
  for (size_t i = 0; i < load_keys.size(); ++i) loads_[load_keys[i]] = out[i];
  return out;
}

absl::Status ClusterView::RecordDispatch(absl::string_view worker_id,
                                         absl::Span<const uint64_t> hashes) {
  return index_->RecordDispatch(worker_id, hashes);
}

absl::Status ClusterView::ForgetWorker(absl::string_view worker_id) {
  RETURN_IF_ERROR(ValidateName(worker_id, "worker id"));
  // One DEL per hash tag (a Redis Cluster refuses keys of several slots).
  std::vector<RedisCommand> commands = {
      {"DEL", keys_.WorkerKey(worker_id), keys_.LoadKey(worker_id)},
      {"SREM", keys_.WorkersKey(), std::string(worker_id)},
  };
  for (RedisCommand& c : index_->ClearCommands(worker_id)) commands.push_back(std::move(c));
  ASSIGN_OR_RETURN(std::vector<RedisReply> replies,
                   redis_->Pipeline(commands, "forget_worker"));
  for (const RedisReply& r : replies) RETURN_IF_ERROR(r.ToStatus());
  absl::MutexLock lock(&loads_mu_);
  loads_.erase(keys_.LoadKey(worker_id));
  return absl::OkStatus();
}

}  // namespace swaserve::cluster
