#include "lib/cluster/index_mirror.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/memory/memory.h"
#include "absl/strings/str_cat.h"
#include "lib/base/logging.h"
#include "lib/base/status.h"

namespace swaserve::cluster {

absl::Status ValidateIndexMirrorOptions(const IndexMirrorOptions& options) {
  if (options.poll < absl::Milliseconds(1)) {
    return absl::InvalidArgumentError("IndexMirrorOptions.poll must be >= 1 ms");
  }
  if (options.batch < 1) return absl::InvalidArgumentError("IndexMirrorOptions.batch must be >= 1");
  if (options.batch_interval < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("IndexMirrorOptions.batch_interval must be >= 0");
  }
  if (options.refresh < absl::Milliseconds(1)) {
    return absl::InvalidArgumentError("IndexMirrorOptions.refresh must be >= 1 ms");
  }
  if (options.cluster_poll < options.batch_interval) {
    return absl::InvalidArgumentError("IndexMirrorOptions.cluster_poll must be >= batch_interval");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<IndexMirror>> IndexMirror::Start(
    RedisClient* redis, const KeySchema& keys, WorkerList workers,
    const IndexMirrorOptions& options) {
  if (redis == nullptr) return absl::InvalidArgumentError("IndexMirror: redis client is null");
  if (!workers) return absl::InvalidArgumentError("IndexMirror: no worker list");
  RETURN_IF_ERROR(ValidateIndexMirrorOptions(options));
  auto mirror = absl::WrapUnique(new IndexMirror(redis, keys, std::move(workers), options));
  if (options.metrics != nullptr) {
    ASSIGN_OR_RETURN(auto* events, options.metrics->AddCounter(
                                       "swaserve_index_mirror_events_total",
                                       "KV events applied to the router's index mirror.", {}));
    ASSIGN_OR_RETURN(auto* snapshots,
                     options.metrics->AddCounter(
                         "swaserve_index_mirror_snapshots_total",
                         "Snapshots the index mirror took (new workers, gaps).", {}));
    ASSIGN_OR_RETURN(auto* gauge, options.metrics->AddGauge("swaserve_index_mirror_workers",
                                                            "Workers the index mirror holds.", {}));
    mirror->events_ = &events->WithLabels({});
    mirror->snapshots_ = &snapshots->WithLabels({});
    mirror->workers_gauge_ = &gauge->WithLabels({});
    ASSIGN_OR_RETURN(auto* entries,
                     options.metrics->AddGauge(
                         "swaserve_index_mirror_entries",
                         "Page hashes the index mirror holds (every worker's pages, SWA-gone "
                         "and lower-tier pages): about 40 bytes of router memory per indexed "
                         "page.",
                         {}));
    mirror->entries_gauge_ = &entries->WithLabels({});
  }
  mirror->thread_ = std::thread([m = mirror.get()] { m->Run(); });
  return mirror;
}

IndexMirror::IndexMirror(RedisClient* redis, const KeySchema& keys, WorkerList workers,
                         const IndexMirrorOptions& options)
    : redis_(redis), keys_(keys), workers_(std::move(workers)), options_(options),
      reader_(redis, keys) {}

IndexMirror::~IndexMirror() {
  stop_.Notify();
  if (thread_.joinable()) thread_.join();
}

void IndexMirror::Run() {
  absl::Time next_refresh = absl::InfinitePast();
  while (!stop_.HasBeenNotified()) {
    if (absl::Now() >= next_refresh) {
      Refresh();
      next_refresh = absl::Now() + options_.refresh;
    }
    ReadOnce();
  }
}

std::shared_ptr<IndexMirror::Worker> IndexMirror::Find(absl::string_view id) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = mirrored_.find(id);
  return it == mirrored_.end() ? nullptr : it->second;
}

void IndexMirror::Snapshot(const std::string& id) {
  absl::StatusOr<KvSnapshot> snap = reader_.Snapshot(id);
  if (!snap.ok()) {
    SWA_LOG(warn, "index mirror: snapshot of {} failed: {}", id, snap.status().ToString());
    absl::MutexLock lock(&mu_);
    mirrored_.erase(id);  // unmirrored until the next refresh retries it
    return;
  }
  auto w = std::make_shared<Worker>();
  {
    absl::MutexLock lock(&w->mu);
    w->state.Reset(*snap);
  }
  if (snapshots_ != nullptr) snapshots_->Increment();
  absl::MutexLock lock(&mu_);
  mirrored_[id] = std::move(w);
}

void IndexMirror::Refresh() {
  absl::StatusOr<std::vector<std::string>> ids = workers_();
  if (!ids.ok()) {
    SWA_LOG(debug, "index mirror: worker list: {}", ids.status().ToString());
    return;
  }
  const absl::flat_hash_set<std::string> want(ids->begin(), ids->end());
  std::vector<std::string> known;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = mirrored_.begin(); it != mirrored_.end();) {
      if (!want.contains(it->first)) {
        mirrored_.erase(it++);
      } else {
        known.push_back(it->first);
        ++it;
      }
    }
  }
  // A counter behind the copy, or another epoch: Redis lost the stream (a
  // restart without persistence, or it expired) — an XREAD would wait
  // forever, or skip the new stream's first entries (kv_events.h).
  if (!known.empty()) {
    // One GET each: on a Redis Cluster the counters are in different slots.
    std::vector<RedisCommand> gets;
    for (const std::string& id : known) {
      gets.push_back({"GET", keys_.EventSeqKey(id)});
      gets.push_back({"GET", keys_.EventEpochKey(id)});
    }
    absl::StatusOr<std::vector<RedisReply>> got = redis_->Pipeline(gets, "index_mirror");
    if (got.ok() && got->size() == 2 * known.size()) {
      for (size_t i = 0; i < known.size(); ++i) {
        const RedisReply& c = (*got)[2 * i];
        const RedisReply& e = (*got)[2 * i + 1];
        if (c.is_error() || e.is_error()) continue;
        const uint64_t counter =
            c.is_nil() ? 0 : static_cast<uint64_t>(c.AsInteger().value_or(0));
        std::shared_ptr<Worker> w = Find(known[i]);
        if (w == nullptr) continue;
        bool lost = false;
        {
          absl::ReaderMutexLock lock(&w->mu);
          lost = counter < w->state.seq() ||
                 (e.type == RedisReply::Type::kString && KvEpochsDiffer(e.str, w->state.epoch()));
        }
        if (lost) Snapshot(known[i]);
      }
    }
  }
  for (const std::string& id : *ids) {
    if (Find(id) == nullptr) Snapshot(id);
  }
  if (workers_gauge_ != nullptr) {
    absl::ReaderMutexLock lock(&mu_);
    workers_gauge_->Set(static_cast<double>(mirrored_.size()));
    size_t entries = 0;
    for (const auto& [id, w] : mirrored_) {
      absl::ReaderMutexLock worker_lock(&w->mu);
      entries += w->state.pages().size() + w->state.swa_gone().size() + w->state.lower().size();
    }
    entries_gauge_->Set(static_cast<double>(entries));
  }
}

void IndexMirror::ReadOnce() {
  // A Redis Cluster is polled (no XREAD BLOCK spans two hash slots).
  if (redis_->cluster_mode() && idle_wait_ > absl::ZeroDuration() &&
      stop_.WaitForNotificationWithTimeout(idle_wait_)) {
    return;
  }
  std::vector<std::pair<std::string, std::shared_ptr<Worker>>> workers;
  {
    absl::ReaderMutexLock lock(&mu_);
    for (const auto& [id, w] : mirrored_) workers.emplace_back(id, w);
  }
  if (workers.empty()) {
    stop_.WaitForNotificationWithTimeout(options_.poll);
    return;
  }
  absl::flat_hash_map<std::string, size_t> by_key;
  std::vector<std::string> ids;  // each stream's last id read
  for (size_t i = 0; i < workers.size(); ++i) {
    by_key[keys_.EventsKey(workers[i].first)] = i;
    absl::ReaderMutexLock lock(&workers[i].second->mu);
    ids.push_back(workers[i].second->state.id());
  }
  const std::string count = absl::StrCat(options_.batch);
  // Each reply element: one stream's [key, [entries]].
  std::vector<const RedisReply*> streams;
  absl::StatusOr<RedisReply> single;
  absl::StatusOr<std::vector<RedisReply>> polled;
  absl::Status failed;
  if (!redis_->cluster_mode()) {
    RedisCommand xread = {"XREAD", "COUNT", count, "BLOCK",
                          absl::StrCat(absl::ToInt64Milliseconds(options_.poll)), "STREAMS"};
    for (const auto& [id, w] : workers) xread.push_back(keys_.EventsKey(id));
    xread.insert(xread.end(), ids.begin(), ids.end());
    single = redis_->Command(xread, "index_mirror");
    if (!single.ok() || single->is_error()) {
      failed = single.ok() ? single->ToStatus() : single.status();
    } else if (single->is_array()) {  // nil: nothing new within the poll
      for (const RedisReply& r : single->elements) streams.push_back(&r);
    }
  } else {
    // One XREAD per stream, without BLOCK, pipelined (one round trip per
    // master).
    std::vector<RedisCommand> reads;
    for (size_t i = 0; i < workers.size(); ++i) {
      reads.push_back({"XREAD", "COUNT", count, "STREAMS", keys_.EventsKey(workers[i].first),
                       ids[i]});
    }
    polled = redis_->Pipeline(reads, "index_mirror");
    if (!polled.ok()) {
      failed = polled.status();
    } else {
      for (const RedisReply& r : *polled) {
        if (r.is_error()) failed = r.ToStatus();
        if (r.is_array()) {
          for (const RedisReply& stream : r.elements) streams.push_back(&stream);
        }
      }
    }
  }
  if (!failed.ok()) {
    SWA_LOG(debug, "index mirror: XREAD: {}", failed.ToString());
    if (streams.empty()) {
      stop_.WaitForNotificationWithTimeout(options_.poll);
      return;
    }
  }
  bool applied = false;
  for (const RedisReply* stream : streams) applied |= ApplyStream(*stream, by_key, workers);
  if (redis_->cluster_mode()) {
    // Quiet: poll less often, up to cluster_poll; news: every batch_interval.
    idle_wait_ = applied ? options_.batch_interval
                         : std::min(options_.cluster_poll,
                                    std::max(2 * idle_wait_, absl::Milliseconds(1)));
    return;
  }
  // Applied: let the next events gather before reading again.
  if (applied && options_.batch_interval > absl::ZeroDuration()) {
    stop_.WaitForNotificationWithTimeout(options_.batch_interval);
  }
}

bool IndexMirror::ApplyStream(
    const RedisReply& stream, const absl::flat_hash_map<std::string, size_t>& by_key,
    const std::vector<std::pair<std::string, std::shared_ptr<Worker>>>& workers) {
  if (!stream.is_array() || stream.elements.size() != 2 || !stream.elements[1].is_array()) {
    return false;
  }
  auto it = by_key.find(stream.elements[0].str);
  if (it == by_key.end()) return false;
  const auto& [id, w] = workers[it->second];
  bool gap = false;
  int64_t applied = 0;
  {
    absl::MutexLock lock(&w->mu);
    for (const RedisReply& entry : stream.elements[1].elements) {
      absl::StatusOr<KvEvent> e = ParseKvEventEntry(entry);
      // A malformed entry or a seq that does not follow: resynchronize.
      if (!e.ok() || !w->state.Apply(*e).ok()) {
        gap = true;
        break;
      }
      ++applied;
    }
  }
  if (events_ != nullptr) events_->Increment(static_cast<double>(applied));
  if (gap) Snapshot(id);
  return applied > 0 || gap;
}

std::optional<uint64_t> IndexMirror::Seq(absl::string_view worker_id) const {
  std::shared_ptr<Worker> w = Find(worker_id);
  if (w == nullptr) return std::nullopt;
  absl::ReaderMutexLock lock(&w->mu);
  return w->state.seq();
}

bool IndexMirror::Depths(absl::Span<const uint64_t> hashes,
                         absl::Span<const std::string> candidates,
                         std::vector<int64_t>* depths) const {
  depths->assign(candidates.size(), 0);
  for (size_t c = 0; c < candidates.size(); ++c) {
    std::shared_ptr<Worker> w = Find(candidates[c]);
    if (w == nullptr) return false;
    absl::ReaderMutexLock lock(&w->mu);
    (*depths)[c] = w->state.Depth(hashes);
  }
  return true;
}

bool IndexMirror::WindowAndTier(absl::Span<const uint64_t> hashes,
                                absl::Span<const std::string> candidates,
                                absl::Span<const int64_t> depths, int window_pages,
                                absl::Span<const int64_t> window_scan_pages,
                                std::vector<int64_t>* safe_pages,
                                std::vector<int64_t>* l1_pages) const {
  safe_pages->assign(candidates.size(), 0);
  l1_pages->assign(candidates.size(), 0);
  const int64_t wp = std::max(0, window_pages);
  for (size_t c = 0; c < candidates.size(); ++c) {
    std::shared_ptr<Worker> w = Find(candidates[c]);
    if (w == nullptr) return false;
    absl::ReaderMutexLock lock(&w->mu);
    const int64_t d = std::min<int64_t>(depths[c], static_cast<int64_t>(hashes.size()));
    // Page p (1-based) is hashes[p - 1].
    const auto& gone = w->state.swa_gone();
    int64_t safe = d;
    if (wp > 0 && d > 0 && !gone.empty()) {
      // The match script's downward search (prefix_index_scripts.cc): the
      // largest top <= d whose last wp pages (or all down to page 1) are
      // intact; -1 once top falls below d - scan.
      const int64_t scan = c < window_scan_pages.size() ? std::max<int64_t>(0, window_scan_pages[c])
                                                        : d;
      const int64_t lowest = std::max<int64_t>(0, d - scan);
      int64_t top = d;
      for (int64_t page = d; page >= 1; --page) {
        if (gone.contains(hashes[page - 1])) {
          top = page - 1;
          if (top < lowest) {
            top = -1;
            break;
          }
        } else if (top - page + 1 >= wp || page == 1) {
          break;
        }
      }
      safe = top;
    }
    (*safe_pages)[c] = safe;
    // L1: the first matched page in the lower tier, by the script's binary
    // search (the lower-tier pages of a match are a suffix of it).
    const auto& lower = w->state.lower();
    int64_t l1 = d;
    if (d > 0 && !lower.empty()) {
      int64_t lo = 1, hi = d + 1;
      while (lo < hi) {
        const int64_t mid = (lo + hi) / 2;
        if (lower.contains(hashes[mid - 1])) hi = mid; else lo = mid + 1;
      }
      l1 = lo - 1;
    }
    (*l1_pages)[c] = l1;
  }
  return true;
}

}  // namespace swaserve::cluster
