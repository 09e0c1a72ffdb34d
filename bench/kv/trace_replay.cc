#include "bench/kv/trace_replay.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <utility>

#include "bench/common/bench_util.h"
#include "bench/common/prompt_synth.h"
#include "bench/common/swa_pattern.h"
#include "bench/common/window_restore_plan.h"
#include "bench/kv/layer_group_shadow.h"
#include "lib/base/hash.h"
#include "lib/kv/l3_prefetch.h"
#include "lib/kv/memory_page_store.h"
#include "lib/kv/page_pool.h"
#include "lib/kv/prefix_cache.h"
#include "lib/kv/sequence.h"
#include "lib/sched/prefill_scheduler.h"

namespace swaserve::kv::replay {

namespace {
constexpr int kBlockTokens = bench::kTraceBlockTokens;
using bench::Die;

// The cache's counters and contents at the end of a replay, into `res`;
// ends the process when a page is still in use or reserved (a leak).
void CollectCacheStats(const PrefixCache& cache, const KvPools& pools, ReplayResult* res) {
  const PrefixCacheStats& st = cache.stats();
  res->evicted_full_pages = st.evicted_full_pages.load();
  res->evicted_swa_pages = st.evicted_swa_pages.load();
  res->tombstoned_nodes = st.tombstoned_nodes.load();
  res->nodes = st.nodes.load();
  res->tombstone_nodes = st.tombstone_nodes.load();
  res->demoted_pages = st.demoted_pages.load();
  res->l3_written_pages = st.l3_written_pages.load();
  res->cached_full_pages = cache.cached_full_pages();
  res->cached_swa_pages = cache.cached_swa_pages();
  res->cached_bytes = static_cast<double>(res->cached_full_pages) * pools.full().page_bytes() +
                      static_cast<double>(res->cached_swa_pages) * pools.swa().page_bytes();
  if (pools.full().num_in_use() != 0 || pools.swa().num_in_use() != 0 ||
      pools.full().num_reserved() != 0 || pools.swa().num_reserved() != 0) {
    Die("pages still in use or reserved after the replay (" + res->spec.name + ")");
  }
}
}  // namespace

std::vector<TraceRequest> LoadTrace(const std::string& path, int64_t limit) {
  std::ifstream in(path);
  if (!in) Die("cannot open trace " + path);
  std::vector<TraceRequest> out;
  std::string line;
  int64_t lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.empty()) continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) Die("trace line " + std::to_string(lineno) + ": bad JSON");
    TraceRequest r;
    r.timestamp = j.value("timestamp", int64_t{0});
    r.input_length = j.value("input_length", 0);
    r.output_length = j.value("output_length", 0);
    r.hash_ids = j.value("hash_ids", std::vector<int64_t>{});
    if (r.input_length <= 0 ||
        static_cast<int64_t>(r.hash_ids.size()) !=
            (r.input_length + kBlockTokens - 1) / kBlockTokens) {
      Die("trace line " + std::to_string(lineno) + ": hash_ids do not match input_length");
    }
    out.push_back(std::move(r));
  }
  std::stable_sort(out.begin(), out.end(), [](const TraceRequest& a, const TraceRequest& b) {
    return a.timestamp < b.timestamp;
  });
  if (limit > 0 && static_cast<int64_t>(out.size()) > limit) out.resize(limit);
  return out;
}

Prompts BuildPrompts(const std::vector<TraceRequest>& trace, int page_size, bool reconstruct) {
  const auto t0 = std::chrono::steady_clock::now();
  Prompts p;
  bench::PromptSynthesizer synth(reconstruct);
  std::vector<uint32_t> tokens;
  p.offset.push_back(0);
  for (const TraceRequest& r : trace) {
    int recon = 0;
    synth.Tokens(r.hash_ids, r.input_length, &tokens, &recon);
    if (recon > 0) {
      ++p.reconstructed_requests;
      p.reconstructed_tokens += recon;
    }
    std::vector<uint64_t> h = base::ChainedPageHashes(tokens, page_size);
    p.hashes.insert(p.hashes.end(), h.begin(), h.end());
    p.offset.push_back(static_cast<int64_t>(p.hashes.size()));
    p.length.push_back(r.input_length);
    p.total_tokens += r.input_length;
    p.total_pages_upper += (r.input_length + page_size - 1) / page_size;
    p.max_length = std::max(p.max_length, r.input_length);
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr,
               "synthesized %zu prompts (%s), %lld tokens, %zu page hashes in %.1f s; "
               "%lld continuations reconstructed (%lld tokens)\n",
               p.size(), reconstruct ? "continuations reconstructed" : "plain",
               static_cast<long long>(p.total_tokens), p.hashes.size(), s,
               static_cast<long long>(p.reconstructed_requests),
               static_cast<long long>(p.reconstructed_tokens));
  return p;
}

ReplayResult Replay(const CacheSpec& spec, const Prompts& prompts, int chunk,
                    const ReplayKnobs& knobs) {
  ReplayResult res;
  res.spec = spec;
  KvPoolsOptions po;
  po.shape = spec.shape;
  po.full_pages = spec.full_pages;
  po.swa_pages = spec.swa_pages;
  po.allocate_memory = false;
  auto pools_or = KvPools::Create(po);
  if (!pools_or.ok()) Die(std::string(pools_or.status().message()));
  std::unique_ptr<KvPools> pools = *std::move(pools_or);
  std::unique_ptr<KvPools> l2;
  if (spec.l2_full_pages > 0) {
    po.full_pages = spec.l2_full_pages;
    po.swa_pages = spec.l2_swa_pages;
    auto l2_or = KvPools::Create(po);
    if (!l2_or.ok()) Die(std::string(l2_or.status().message()));
    l2 = *std::move(l2_or);
  }
  std::unique_ptr<MemoryPageStore> l3;
  if (spec.l3_pages > 0) {
    l3 = std::make_unique<MemoryPageStore>(spec.l3_pages * MemoryPageStore::kEntryOverhead);
  }
  PrefixCacheOptions co;
  co.pools = pools.get();
  co.l2 = l2.get();
  co.l3 = l3.get();
  co.keep_restorable_tombstones = spec.restore;
  co.cold_superseded_windows = spec.restore && knobs.cold_superseded;
  const std::vector<bool> swa_pattern = bench::SwaPattern(spec.shape);
  std::unique_ptr<LayerGroupModel> groups;
  if (spec.group_bottom_layers > 0) {
    if (!spec.restore || l2 != nullptr) Die("layer groups need restore and no tiers");
    groups = std::make_unique<LayerGroupModel>(spec.shape, swa_pattern, spec.group_bottom_layers,
                                               spec.bottom_pages);
    co.on_event = groups->Listener();
  }
  auto cache_or = PrefixCache::Create(co);
  if (!cache_or.ok()) Die(std::string(cache_or.status().message()));
  std::unique_ptr<PrefixCache> cache = *std::move(cache_or);
  SequenceOptions so;
  so.pools = pools.get();
  so.cache = cache.get();
  so.evict_on_demand = true;
  so.keep_divergence_window = knobs.keep_divergence_window;
  so.swa_checkpoint_tokens = spec.restore ? knobs.checkpoint_tokens : 0;
  so.checkpoints_yield = knobs.checkpoints_yield;
  res.pool_bytes = static_cast<double>(pools->full().total_bytes()) +
                   static_cast<double>(pools->swa().total_bytes());

  const auto t0 = std::chrono::steady_clock::now();
  const size_t n = prompts.size();
  const size_t progress_every = std::max<size_t>(1, n / 4);
  int64_t lost_before = 0;  // window-lost tokens before --measure-from
  for (size_t i = 0; i < n; ++i) {
    const int len = prompts.length[i];
    absl::Span<const uint64_t> hashes = prompts.Hashes(i);
    MatchOptions mo{.max_tokens = len - 1};
    if (l3 != nullptr) {
      const int ps = spec.shape.page_size;
      const MatchLengths ml = cache->Match(hashes, mo.max_tokens);
      const L3Fetch f = FetchFromL3(*l3, cache->l3_fetch_options(),
                                    hashes.subspan(0, std::min<size_t>(hashes.size(), mo.max_tokens / ps)),
                                    (ml.matched_tokens + ml.lower_tier_tokens) / ps,
                                    ml.safe_tokens / ps);
      res.l3_attached_pages += cache->AttachFromL3(hashes, f);
    }
    if (l2 != nullptr) res.loaded_back_pages += cache->LoadBack(hashes, mo.max_tokens).pages;
    bench::RestorePlan plan;
    if (spec.restore) {
      plan = bench::PlanWindowRestore(*cache, hashes, spec.shape, swa_pattern, knobs.pyramid,
                                      knobs.safe_start, &mo);
    }
    const sched::WindowRestoreChoice& choice = plan.choice;
    const double restore_work = plan.work;  // token-equivalents a restore computes
    if (i == knobs.measure_from) lost_before = cache->stats().window_lost_tokens.load();
    CacheHit hit = cache->MatchAndLock(hashes, mo);
    const bool counted = i >= knobs.measure_from;
    if (counted) {
      res.hit_tokens += hit.window_safe_tokens();
      res.matched_tokens += hit.matched_tokens();
      res.prompt_tokens += len;
    }
    const bool restoring = hit.needs_window_restore();
    const int full_hit = hit.tokens();
    // Layer groups: the bottom half of the window the request reads.
    const double bottom =
        groups != nullptr ? groups->Begin(hashes, hit, restoring, mo.lock_safe_window) : 0;
    if (counted && bottom > 0) {
      ++res.bottom_restores;
      res.bottom_restore_work += bottom;
    }
    Sequence seq(so, std::move(hit));
    int next = seq.length();  // the next token to compute
    if (restoring) {
      absl::Status s = seq.BeginWindowRestore(choice.compute_from);
      if (!s.ok()) Die(std::string(s.message()));
      next = choice.compute_from;
      if (counted) {
        ++res.restores;
        res.restored_tokens += full_hit - next;
      }
    }
    if (counted) {
      res.effective_hit_tokens +=
          (restoring ? full_hit - std::llround(restore_work) : next) - std::llround(bottom);
    }
    bool ok = true;
    while (next < len) {
      const int c = std::min(chunk, len - next);
      absl::Status s = seq.Prepare(next, c);
      next += c;
      if (groups != nullptr) groups->Running(pools->swa().num_in_use(), *cache);
      if (!s.ok()) {
        if (res.failed == 0) {
          std::fprintf(stderr, "  [%s %s] request %zu (%d tokens) failed: %s\n",
                       spec.name.c_str(), spec.budget.c_str(), i, len,
                       std::string(s.message()).c_str());
        }
        ok = false;
        break;
      }
    }
    if (!ok) {
      ++res.failed;
      seq.Abort();
    } else {
      seq.Finish(hashes);
    }
    if (groups != nullptr) groups->Finished(hashes, len, ok, *cache);
    ++res.requests;
    res.peak_cached_full_pages = std::max(res.peak_cached_full_pages, cache->cached_full_pages());
    if ((i + 1) % progress_every == 0 || i + 1 == n) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::fprintf(stderr, "  [%-9s %6s r=%-6g] %6zu/%zu requests  hit %5.1f%%  %.1f s\n",
                   spec.name.c_str(), spec.budget.c_str(), spec.ratio, i + 1, n,
                   100.0 * res.HitRate(), s);
    }
  }
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  res.window_lost_tokens = cache->stats().window_lost_tokens.load() - lost_before;
  if (groups != nullptr) {
    res.bottom_evicted_pages = groups->shadow().evicted();
    res.bottom_peak_pages = groups->shadow().peak();
  }
  CollectCacheStats(*cache, *pools, &res);
  return res;
}

nlohmann::json ToJson(const ReplayResult& r, int ps) {
  return {
      {"cache", r.spec.name},
      {"budget_single_pool_tokens", r.spec.budget},
      {"synthesis", r.spec.synthesis},
      {"swa_full_ratio", r.spec.ratio},
      {"sliding_window", r.spec.shape.sliding_window},
      {"full_pages", r.spec.full_pages},
      {"swa_pages", r.spec.swa_pages},
      {"pool_bytes", r.pool_bytes},
      {"requests", r.requests},
      {"failed_requests", r.failed},
      {"prompt_tokens", r.prompt_tokens},
      {"hit_tokens", r.hit_tokens},
      {"hit_rate", r.HitRate()},
      {"window_restore", r.spec.restore},
      {"effective_hit_tokens", r.effective_hit_tokens},
      {"effective_hit_rate", r.EffectiveHitRate()},
      {"window_restores", r.restores},
      {"restored_tokens", r.restored_tokens},
      {"matched_tokens", r.matched_tokens},
      {"window_lost_tokens", r.window_lost_tokens},
      {"cached_tokens", r.CachedTokens(ps)},
      {"cached_swa_pages", r.cached_swa_pages},
      {"peak_cached_tokens", r.peak_cached_full_pages * ps},
      {"cached_bytes", r.cached_bytes},
      {"cached_tokens_per_gib_budget", r.TokensPerGiBBudget(ps)},
      {"cached_tokens_per_gib_used", r.TokensPerGiBUsed(ps)},
      {"evicted_full_pages", r.evicted_full_pages},
      {"evicted_swa_pages", r.evicted_swa_pages},
      {"tombstoned_nodes", r.tombstoned_nodes},
      {"nodes_at_end", r.nodes},
      {"tombstone_nodes_at_end", r.tombstone_nodes},
      {"l2_full_pages", r.spec.l2_full_pages},
      {"l2_swa_pages", r.spec.l2_swa_pages},
      {"l3_pages", r.spec.l3_pages},
      {"l3_attached_pages", r.l3_attached_pages},
      {"l3_written_pages", r.l3_written_pages},
      {"demoted_pages", r.demoted_pages},
      {"loaded_back_pages", r.loaded_back_pages},
      {"seconds", r.seconds},
  };
}

}  // namespace swaserve::kv::replay
