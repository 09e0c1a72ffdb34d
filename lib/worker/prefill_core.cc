#include "lib/worker/prefill_core.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <deque>
#include <thread>

#include "lib/base/clock.h"
#include "lib/base/hash.h"
#include "lib/base/logging.h"
#include "lib/base/status.h"
#include "lib/worker/prefill_core_impl.h"

namespace swaserve::worker {

namespace {

// A request that will not restore (any more): no restore in its result.
void ClearRestore(PrefillResult& result) {
  result.restored_tokens = 0;
  result.restore_saved_tokens = 0;
  result.restore_from_window_safe = false;
}

}  // namespace

void PrefillCore::Impl::MatchPrefix(Req& r) {
  const int n = static_cast<int>(r.job.prompt.size());
  const kv::SequenceOptions so{.pools = options.pools,
                               .cache = options.cache,
                               .swa_slack = 0,
                               .evict_on_demand = true,
                               .swa_checkpoint_tokens = options.swa_checkpoint_tokens,
                               .checkpoints_yield = options.swa_checkpoints_yield};
  ClearRestore(r.result);
  if (options.cache == nullptr) {
    r.seq = std::make_unique<kv::Sequence>(so);
    r.result.cached_tokens = 0;
    return;
  }
  // With MTP layers the hit leaves the last K prompt positions to compute:
  // decode's first draft step reads their main hidden states
  // (PrefillResult::tail_hidden) and the SWA KV K tokens before the window,
  // which a hit's locked window does not always cover otherwise.
  const model::ModelConfig& c = options.engine->config();
  const int K = c.num_mtp_layers;
  kv::MatchOptions mo{.max_tokens = n - std::max(1, K)};
  if (options.cache->has_l2()) {
    const kv::MatchLengths before = options.cache->Match(r.hashes, mo.max_tokens);
    r.l1_end = before.matched_tokens;
    r.l2_end = std::max(r.l1_end,
                        before.matched_tokens + before.lower_tier_tokens - r.l3_attached_tokens);
    LoadBack(r, mo.max_tokens);
  }
  sched::WindowRestoreChoice choice;
  double restore_work = 0;  // a considered restore's work in token-equivalents
  if (options.window_restore_min_saved_work >= 0 && c.sliding_window > 1) {
    const kv::MatchLengths ml = options.cache->Match(r.hashes, mo.max_tokens);
    if (ml.matched_tokens > ml.safe_tokens) {
      const kv::WindowRestoreStretch st = kv::PlanWindowRestoreStretch(
          ml.matched_tokens, ml.safe_tokens, c.sliding_window, options.pools->shape().page_size,
          c.swa_layer_mask(), K, options.window_restore_pyramid,
          options.window_restore_from_window_safe);
      restore_work = st.work;  // the pyramid's, or the stretch M − from without it
      choice = sched::ChooseWindowRestore(
          {.window_safe_tokens = ml.safe_tokens,
           .full_tokens = ml.matched_tokens,
           .restore_from = st.from,
           .restore_tokens = restore_work,
           .context_cost_per_token = options.scheduler.context_cost_per_token,
           .min_saved_work = options.window_restore_min_saved_work});
      mo.full_kv = choice.restore;
      mo.lock_safe_window = choice.restore && st.from_window_safe;
    }
  }
  kv::CacheHit hit = options.cache->MatchAndLock(r.hashes, mo);
  const int safe = hit.window_safe_tokens();
  const bool restore = hit.needs_window_restore();
  // A full-KV hit that also locked L's window restores from L.
  const bool from_window_safe = restore && hit.swa_locked();
  r.seq = std::make_unique<kv::Sequence>(so, std::move(hit));
  if (restore) {
    absl::Status st = r.seq->BeginWindowRestore(choice.compute_from);
    if (!st.ok()) {
      // Cannot happen (the cache answered Match and MatchAndLock alike on
      // this thread); fall back to the window-safe hit rather than fail.
      SWA_LOG(err, "prefill: window restore not possible: {}", st.ToString());
      r.seq->Abort();
      r.seq = std::make_unique<kv::Sequence>(
          so, options.cache->MatchAndLock(r.hashes, mo.max_tokens));
    } else {
      const int m = r.seq->cached_tokens();
      r.result.restored_tokens = m - choice.compute_from;
      // Saved against computing [safe, M): the stretch's tokens, or with
      // the pyramid the tokens' worth of work it computes.
      r.result.restore_saved_tokens = m - safe - static_cast<int>(std::llround(restore_work));
      r.result.restore_from_window_safe = from_window_safe;
    }
  }
  r.result.cached_tokens =
      r.seq->restore_from() >= 0 ? r.seq->restore_from() : r.seq->cached_tokens();
}

namespace {

// The embedding overrides of the job's multimodal placeholders among main
// positions [first, first + count) (offsets relative to `first`).
void MultimodalOverrides(const PrefillJob& job, int first, int count,
                         std::vector<model::EmbeddingOverride>* out) {
  out->clear();
  for (const PrefillMultimodal& m : job.multimodal) {
    const int a = std::max<int>(first, static_cast<int>(m.span.token_offset));
    const int b = std::min<int>(first + count,
                                static_cast<int>(m.span.token_offset + m.span.num_tokens));
    if (a >= b) continue;
    const int hidden = static_cast<int>(m.embeddings->size() / m.span.num_tokens);
    out->push_back({.offset = a - first,
                    .rows = b - a,
                    .data = m.embeddings->data() +
                            static_cast<size_t>(a - m.span.token_offset) * hidden});
  }
}

}  // namespace

void PrefillCore::Impl::Accept(std::unique_ptr<Req> r) {
  const int ps = options.pools->shape().page_size;
  std::vector<base::HashedSpan> spans;
  for (const PrefillMultimodal& m : r->job.multimodal) spans.push_back(m.span);
  r->hashes = base::ChainedPageHashes(
      r->job.prompt, ps, spans,
      r->job.page_hash_seed != 0 ? r->job.page_hash_seed : base::DefaultPageHashSeed());
  if (MaybePark(r)) return;
  Admit(std::move(r));
}

void PrefillCore::Impl::Admit(std::unique_ptr<Req> r) {
  const int n = static_cast<int>(r->job.prompt.size());
  MatchPrefix(*r);
  // Locking a hit makes its pages unevictable. Started requests count on
  // free + evictable pages for the rest of their prompts (committed): a
  // lock that would take pages from under them is not taken — the request
  // queues as a cold prompt instead (its chunks would otherwise fail with
  // ResourceExhausted mid-prompt).
  if (options.cache != nullptr && r->seq->cached_tokens() > 0 &&
      options.pools->full().num_free() + options.cache->EvictableFullPages() <
          committed_full_pages) {
    r->seq->Abort();
    r->seq = std::make_unique<kv::Sequence>(
        kv::SequenceOptions{options.pools, options.cache, 0, true}, kv::CacheHit());
    r->result.cached_tokens = 0;
    ClearRestore(r->result);
    ++released_hits;
  }
  r->result.prompt_tokens = n;
  r->result.computed_tokens = n - r->result.cached_tokens;
  absl::Status st = sched->Add({.id = r->job.id,
                                .prompt_tokens = n,
                                .cached_tokens = r->result.cached_tokens,
                                .arrival_ns = r->arrival_ns,
                                .priority = r->job.priority});
  if (!st.ok()) {
    Req* raw = r.get();
    reqs.emplace(r->job.id, std::move(r));
    Complete(raw, st);
    return;
  }
  reqs.emplace(r->job.id, std::move(r));
}

bool PrefillCore::Impl::ReleaseQueuedHits() {
  Req* oldest = nullptr;
  for (const auto& [id, r] : reqs) {
    if (r->started) continue;
    if (oldest == nullptr || r->arrival_ns < oldest->arrival_ns ||
        (r->arrival_ns == oldest->arrival_ns && r->job.id < oldest->job.id)) {
      oldest = r.get();
    }
  }
  if (oldest == nullptr) return false;
  std::vector<Req*> release;
  for (const auto& [id, r] : reqs) {
    if (!r->started && r.get() != oldest && r->seq->cached_tokens() > 0) release.push_back(r.get());
  }
  // Only the oldest still holds a hit: the scheduler's choice may be another
  // request that the oldest's locked pages keep out, so release it too.
  if (release.empty() && oldest->seq->cached_tokens() > 0) release.push_back(oldest);
  std::sort(release.begin(), release.end(),
            [](const Req* a, const Req* b) { return a->job.id < b->job.id; });
  for (Req* r : release) {
    const int n = static_cast<int>(r->job.prompt.size());
    sched->Cancel(r->job.id);
    r->seq->Abort();  // unlocks the hit: its pages become evictable
    r->seq = std::make_unique<kv::Sequence>(
        kv::SequenceOptions{options.pools, options.cache, 0, true}, kv::CacheHit());
    r->result.cached_tokens = 0;
    r->result.computed_tokens = n;
    ClearRestore(r->result);
    ++released_hits;
    // Same arrival: the request keeps its place by wait time.
    absl::Status st = sched->Add({.id = r->job.id,
                                  .prompt_tokens = n,
                                  .cached_tokens = 0,
                                  .arrival_ns = r->arrival_ns,
                                  .priority = r->job.priority});
    if (!st.ok()) Complete(r, st);
  }
  if (!release.empty()) {
    SWA_LOG(info, "prefill: admission stalled on locked prefix hits; {} queued request(s) "
            "released theirs and were requeued as cold prompts", release.size());
    return true;
  }
  // No queued request holds pages, so every page is free or evictable, and
  // still nothing starts (the pool is held elsewhere): a clear error for
  // the oldest rather than a stall.
  sched->Cancel(oldest->job.id);
  Complete(oldest, absl::ResourceExhaustedError(absl::StrCat(
                       "prompt of ", oldest->job.prompt.size(),
                       " tokens cannot get its KV pages in this prefill worker's pool (",
                       options.pools->full().num_free(), " free, ",
                       options.cache != nullptr ? options.cache->EvictableFullPages() : 0,
                       " evictable)")));
  return true;
}

bool PrefillCore::Impl::CanStart(const sched::PrefillRequestInfo& info) {
  auto it = reqs.find(info.id);
  if (it == reqs.end()) return false;
  Req& r = *it->second;
  // Its hit's pages are still being copied in from L2.
  if (options.cache != nullptr && options.cache->Loading(r.seq->hit())) return false;
  const int64_t need = FullPagesFor(r);
  int64_t available = options.pools->full().num_free();
  if (options.cache != nullptr) available += options.cache->EvictableFullPages();
  if (need + committed_full_pages > available) return false;
  if (!SwaFits(r)) return false;
  r.pending_full_pages = need;
  committed_full_pages += need;
  r.started = true;
  r.start_ns = base::MonotonicNanos();
  return true;
}

int64_t PrefillCore::Impl::SwaPeakPages(const Req& r) const {
  const int ps = options.pools->shape().page_size;
  const int w = options.engine->config().sliding_window;
  if (w <= 1 || options.pools->swa().num_pages() == 0) return 0;
  const int64_t window = (w - 1 + ps - 1) / ps + 1;
  const int64_t chunk = (options.scheduler.chunk_tokens + ps - 1) / ps + 1;
  const int64_t computes =
      (static_cast<int64_t>(r.job.prompt.size()) - r.result.cached_tokens + ps - 1) / ps + 1;
  return std::min(2 * window + chunk, computes + window);
}

bool PrefillCore::Impl::SwaFits(const Req& r) const {
  if (!AnyStarted()) return true;
  int64_t committed = 0;
  for (const auto& [id, o] : reqs) {
    if (!o->started || o->computed || o->seq == nullptr) continue;
    committed += std::max<int64_t>(0, SwaPeakPages(*o) - o->seq->private_swa_pages());
  }
  int64_t available = options.pools->swa().num_free();
  if (options.cache != nullptr) available += options.cache->EvictableSwaPages();
  const int64_t need = std::max<int64_t>(0, SwaPeakPages(r) - r.seq->private_swa_pages());
  return need + committed <= available;
}

int PrefillCore::Impl::PartialKeepTokens(const Req& r) const {
  return options.keep_cancelled_chunks ? ComputedPrefixTokens(r) : 0;
}

void PrefillCore::Impl::MaybeCheckpointToL3(Req& r) {
  kv::PrefixCache* cache = options.cache;
  if (options.l3_checkpoint_tokens <= 0 || cache == nullptr || !cache->has_l3()) return;
  const int end = ComputedPrefixTokens(r);
  const int from = std::max(r.l3_checkpoint_end, r.seq->cached_tokens());
  if (end - from < options.l3_checkpoint_tokens) return;
  const int ps = options.pools->shape().page_size;
  const auto hashes = absl::MakeConstSpan(r.hashes);
  if (!r.l3_hit_queued && r.seq->cached_tokens() >= ps) {
    // The hit's pages are the tree's: written (where not yet) through it,
    // paced by the store's room, ahead of the request's own.
    cache->WriteThroughToL3(hashes.first(static_cast<size_t>(r.seq->cached_tokens() / ps)));
    r.l3_hit_queued = true;
  }
  // Paced by the write-behind queue's room: what does not fit now goes at
  // a later chunk, from where this one stopped (its window then is that
  // chunk's).
  const kv::PrefixCache::L3Checkpoint c = cache->CheckpointToL3(
      hashes, r.seq->full_pages(), r.seq->swa_pages(), from / ps, end / ps);
  const int written_to = c.full_to_page * ps;
  if (written_to > from) {
    if (r.l3_checkpoint_end == 0) r.l3_checkpoint_begin = from;
    r.l3_checkpoint_end = written_to;
    l3_checkpoint_tokens_total.fetch_add(written_to - from, std::memory_order_relaxed);
    if (m.l3_checkpoint_tokens != nullptr) m.l3_checkpoint_tokens->Increment(written_to - from);
  }
  if (written_to < end) {
    l3_checkpoints_skipped_total.fetch_add(1, std::memory_order_relaxed);
    if (m.l3_checkpoints_skipped != nullptr) m.l3_checkpoints_skipped->Increment();
    return;
  }
  l3_checkpoints_total.fetch_add(1, std::memory_order_relaxed);
  if (m.l3_checkpoints != nullptr) m.l3_checkpoints->Increment();
}

int PrefillCore::Impl::ComputedPrefixTokens(const Req& r) const {
  if (!r.started || r.seq == nullptr) return 0;
  int end = r.computed_end;
  if (options.engine->config().num_mtp_layers > 0) {
    // MTP layer k's KV exists below mtp_next[k] (RunMtp); none ran yet: none.
    if (r.mtp_next.empty()) return 0;
    end = std::min(end, *std::min_element(r.mtp_next.begin(), r.mtp_next.end()));
  }
  const int ps = options.pools->shape().page_size;
  const int pages = std::min(end / ps, static_cast<int>(r.hashes.size()));
  // Within the hit, or inside a window restore's stretch (whose SWA KV is
  // not yet exact): nothing new to keep.
  if (pages * ps <= r.seq->cached_tokens()) return 0;
  return pages * ps;
}

void PrefillCore::Impl::PinPrefixes(const Req& r, absl::Span<const uint64_t> cached) {
  if (pins == nullptr || r.job.cache_pins.empty()) return;
  const int ps = options.pools->shape().page_size;
  const int64_t now = base::MonotonicNanos();
  for (const PrefillCachePin& pin : r.job.cache_pins) {
    const size_t pages = std::min(cached.size(), static_cast<size_t>(std::max(0, pin.tokens) / ps));
    if (pages == 0) continue;
    const int tokens = pins->Pin(cached.first(pages), absl::ToInt64Nanoseconds(pin.ttl), now);
    if (m.pinned_tokens != nullptr) m.pinned_tokens->Increment(tokens);
  }
  if (m.pinned_pages != nullptr) m.pinned_pages->Set(static_cast<double>(pins->pinned_pages()));
}

void PrefillCore::Impl::Complete(Req* r, absl::Status status) {
  if (r->started && r->pending_full_pages > 0) {
    committed_full_pages -= r->pending_full_pages;
    r->pending_full_pages = 0;
  }
  if (status.ok() || (r->computed && r->seq != nullptr)) {
    // Prompt pages into the prefix cache: with MTP layers only pages whose
    // every MTP layer's KV was written (layer j at p needs token p + j + 1,
    // known to n: positions <= n - K), so a hit never reads unwritten KV.
    const int K = options.engine->config().num_mtp_layers;
    const int n = static_cast<int>(r->job.prompt.size());
    const int ps = options.pools->shape().page_size;
    const size_t safe = K > 0 ? static_cast<size_t>(std::max(0, n - K + 1) / ps) : r->hashes.size();
    // Its L3 checkpoints' pages are marked as written (not put twice).
    const auto cached = absl::MakeConstSpan(r->hashes).first(std::min(safe, r->hashes.size()));
    r->seq->Finish(cached, r->l3_checkpoint_begin / ps, r->l3_checkpoint_end / ps);
    PinPrefixes(*r, cached);
  } else if (r->seq != nullptr) {
    // Ended before its last chunk (the caller went away, a forward failed):
    // the chunks it computed are valid KV of the prompt's prefix, so they go
    // into the prefix cache, and a retry of the same prompt (the client's,
    // or through another router replica after a router died) resumes there
    // instead of computing a long prompt again from its first token.
    const int keep = PartialKeepTokens(*r);
    if (keep > 0) {
      const int ps = options.pools->shape().page_size;
      const int kept = keep - std::min(keep, r->seq->cached_tokens());
      const auto kept_hashes = absl::MakeConstSpan(r->hashes).first(static_cast<size_t>(keep / ps));
      r->seq->Finish(kept_hashes, r->l3_checkpoint_begin / ps, r->l3_checkpoint_end / ps);
      // The retry may come to another worker (this one stopping, a bucket
      // fallback): with a shared L3 it finds the chunks there.
      if (options.cache != nullptr) options.cache->WriteThroughToL3(kept_hashes);
      partial_kept_total.fetch_add(1, std::memory_order_relaxed);
      partial_kept_tokens_total.fetch_add(kept, std::memory_order_relaxed);
      if (m.partial_kept != nullptr) {
        m.partial_kept->Increment();
        m.partial_kept_tokens->Increment(kept);
      }
      SWA_LOG(info, "prefill {}: ended after {} of {} prompt tokens ({}); kept {} computed "
              "tokens in the prefix cache for a retry", r->job.id, r->computed_end,
              r->job.prompt.size(), status.ToString(), kept);
    } else {
      r->seq->Abort();
    }
  }
  if (r->seq != nullptr && r->seq->checkpoint_pages_yielded() > 0) {
    const int64_t y = r->seq->checkpoint_pages_yielded();
    checkpoint_pages_yielded_total.fetch_add(y, std::memory_order_relaxed);
    if (m.checkpoint_pages_yielded != nullptr) m.checkpoint_pages_yielded->Increment(y);
  }
  // A restore counts once its prompt was computed, whatever happened to the
  // ship (the router cancels the prefill leg when a short decode ends first).
  if (r->computed && r->result.restored_tokens > 0) {
    restores_total.fetch_add(1, std::memory_order_relaxed);
    restored_total.fetch_add(r->result.restored_tokens, std::memory_order_relaxed);
    restore_saved_total.fetch_add(r->result.restore_saved_tokens, std::memory_order_relaxed);
    if (r->result.restore_from_window_safe) {
      restores_from_safe_total.fetch_add(1, std::memory_order_relaxed);
    }
    if (m.restores != nullptr) {
      m.restores->Increment();
      m.restored_tokens->Increment(r->result.restored_tokens);
      m.restore_saved_tokens->Increment(r->result.restore_saved_tokens);
      if (r->result.restore_from_window_safe) m.restores_from_safe->Increment();
    }
  }
  const std::string id = r->job.id;
  auto done = std::move(r->job.done);
  PrefillResult result = std::move(r->result);
  const int l1_end = r->l1_end, l2_end = r->l2_end;
  reqs.erase(id);  // r is gone
  {
    absl::MutexLock lock(&mu);
    ids.erase(id);
  }
  if (status.ok()) {
    completed.fetch_add(1, std::memory_order_relaxed);
    computed_total.fetch_add(result.computed_tokens, std::memory_order_relaxed);
    cached_total.fetch_add(result.cached_tokens, std::memory_order_relaxed);
    // Hit tokens by the tier they were in on arrival (Req::l1_end, l2_end).
    const int hit = result.cached_tokens;
    const int a = std::min(hit, l1_end);
    const int b = std::min(hit, std::max(l2_end, l1_end));
    const int by_tier[3] = {a, b - a, hit - b};
    for (int t = 0; t < 3; ++t) {
      tier_tokens_total[t].fetch_add(by_tier[t], std::memory_order_relaxed);
      if (m.tier_tokens[t] != nullptr) m.tier_tokens[t]->Increment(by_tier[t]);
    }
    if (m.ok != nullptr) {
      m.ok->Increment();
      m.prompt_tokens->Increment(result.prompt_tokens);
      m.cached_tokens->Increment(result.cached_tokens);
      m.computed_tokens->Increment(result.computed_tokens);
    }
    done(std::move(result));
  } else {
    // A drain's hand-back (hold_dones) is no error of the request's either.
    if (m.ok != nullptr) {
      (absl::IsCancelled(status) || hold_dones ? m.cancelled : m.failed)->Increment();
    }
    if (hold_dones) {
      held_dones.emplace_back(std::move(done), std::move(status));
    } else {
      done(status);
    }
  }
}

void PrefillCore::Impl::RunStep(const sched::PrefillStep& step) {
  const int64_t t0 = base::MonotonicNanos();
  items.clear();
  item_reqs.clear();
  item_last.clear();
  item_overrides.resize(std::max(item_overrides.size(), step.chunks.size()));
  for (const sched::PrefillChunk& c : step.chunks) {
    auto it = reqs.find(c.id);
    if (it == reqs.end()) continue;  // cancelled meanwhile
    Req* r = it->second.get();
    const int64_t before = r->seq->full_pages().size();
    // Append, or the next stretch of a window restore.
    absl::Status st = r->seq->Prepare(c.start_token, c.num_tokens);
    if (!st.ok()) {
      sched->Cancel(c.id);
      Complete(r, st);
      continue;
    }
    const int64_t got = static_cast<int64_t>(r->seq->full_pages().size()) - before;
    r->pending_full_pages -= got;
    committed_full_pages -= got;
    items.push_back({.seq = r->seq.get(),
                     .tokens = absl::MakeConstSpan(r->job.prompt).subspan(c.start_token, c.num_tokens),
                     .start = c.start_token});
    items.back().window_restore_end = RestoreEnd(*r, c.start_token);
    std::vector<model::EmbeddingOverride>& ov = item_overrides[items.size() - 1];
    MultimodalOverrides(r->job, c.start_token, c.num_tokens, &ov);
    items.back().embeddings = ov;
    item_reqs.push_back(r);
    item_last.push_back(c.last);
  }
  if (items.empty()) return;
  const int K = options.engine->config().num_mtp_layers;
  absl::Status st = options.engine->Forward(items, &out, /*keep_all_hidden=*/K > 0);
  if (!st.ok()) {
    SWA_LOG(err, "prefill: forward failed: {}", st.ToString());
    for (Req* r : item_reqs) {
      sched->Cancel(r->job.id);
      Complete(r, st);
    }
    return;
  }
  const int64_t t1 = base::MonotonicNanos();
  if (m.step_tokens != nullptr) m.step_tokens->Observe(step.total_tokens());
  const int V = options.engine->config().vocab_size;
  const int H = options.engine->config().hidden_size;
  int row0 = 0;
  std::vector<Req*> failed;
  // Where each request of the step stands, taken before any completes.
  std::vector<std::pair<std::string, PrefillProgress>> progress;
  progress.reserve(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    Req* r = item_reqs[i];
    progress.emplace_back(
        r->job.id,
        PrefillProgress{.state = item_last[i] ? PrefillProgress::State::kShipping
                                              : PrefillProgress::State::kComputing,
                        .cached_tokens = r->result.cached_tokens,
                        .done_tokens = items[i].start + static_cast<int>(items[i].tokens.size())});
    // Hidden rows of the item: from first_position (a restore's pyramid
    // drops the rows below it) to its end.
    const int end = items[i].start + static_cast<int>(items[i].tokens.size());
    const int first_pos = out.first_position[i];
    const int rows = end - first_pos;
    const int first_row = row0;
    row0 += rows;
    r->result.compute_seconds += static_cast<double>(t1 - t0) * 1e-9;
    uint32_t first_token = 0;
    if (item_last[i]) {
      const float* row = out.logits.data() + static_cast<size_t>(out.first_row[i]) * V;
      r->result.first_token = r->sampler->Sample(absl::MakeConstSpan(row, V));
      first_token = r->result.first_token.token;
    }
    if (K > 0) {
      // The main hidden states of the last K prompt positions (decode's MTP
      // layers start there).
      const int n = static_cast<int>(r->job.prompt.size());
      const int from = std::max(first_pos, n - K);
      for (int p = from; p < end; ++p) {
        const float* h = out.all_hidden.data() + static_cast<size_t>(first_row + p - first_pos) * H;
        r->result.tail_hidden.insert(r->result.tail_hidden.end(), h, h + H);
      }
      absl::Status ms = RunMtp(*r, out.all_hidden.data() + static_cast<size_t>(first_row) * H,
                               first_pos, rows, item_last[i] ? end + 1 : end, first_token);
      if (!ms.ok()) {
        SWA_LOG(err, "prefill: MTP forward failed: {}", ms.ToString());
        if (!item_last[i]) sched->Cancel(r->job.id);
        failed.push_back(r);
        continue;
      }
    }
    r->computed_end = end;
    if (!item_last[i]) {
      MaybeCheckpointToL3(*r);  // before the trim: the window at its end is held
      r->seq->TrimWindow();  // release SWA pages behind the window early
      continue;
    }
    r->result.last_hidden.assign(out.last_hidden.begin() + i * H,
                                 out.last_hidden.begin() + (i + 1) * H);
    r->result.queue_seconds = static_cast<double>(r->start_ns - r->arrival_ns) * 1e-9;
    if (m.ttft_seconds != nullptr) {
      m.ttft_seconds->Observe(static_cast<double>(t1 - r->arrival_ns) * 1e-9);
    }
    r->computed = true;
    if (!r->job.ship) {
      Complete(r, absl::OkStatus());
      continue;
    }
    r->shipping = true;
    r->ship_start_ns = t1;
    const std::string id = r->job.id;
    r->job.ship(*r->seq, r->result, [this, id](absl::Status s) {
      absl::MutexLock lock(&mu);
      shipped.emplace_back(id, std::move(s));
      cv.Signal();
    });
  }
  // The whole step, MTP over the prompt included: it ran after the forward
  // (one item at a time) and took ~47% of the prefill worker's time with the
  // tiny model, which the histogram used to leave out.
  const double step_s = static_cast<double>(base::MonotonicNanos() - t0) * 1e-9;
  if (m.step_seconds != nullptr) m.step_seconds->Observe(step_s);
  int step_tokens = 0;
  for (const model::ForwardItem& item : items) step_tokens += static_cast<int>(item.tokens.size());
  rate_tokens = kRateDecay * rate_tokens + step_tokens;
  rate_seconds = kRateDecay * rate_seconds + step_s;
  {
    // Progress of the step's requests (those completed above are gone).
    absl::MutexLock lock(&mu);
    for (const auto& [id, step_progress] : progress) {
      auto it = ids.find(id);
      if (it == ids.end()) continue;
      it->second.state = step_progress.state;
      it->second.cached_tokens = step_progress.cached_tokens;
      it->second.done_tokens = step_progress.done_tokens;
    }
  }
  if (rate_seconds > 0) {
    absl::MutexLock lock(&mu);
    load.prefill_tokens_per_second = MeasuredRate();
  }
  for (Req* r : failed) Complete(r, absl::InternalError("MTP forward over the prompt failed"));
}

absl::Status PrefillCore::Impl::RunMtp(Req& r, const float* hidden, int first, int rows,
                                       int known, uint32_t extra) {
  const int K = options.engine->config().num_mtp_layers;
  const int H = options.engine->config().hidden_size;
  const int n = static_cast<int>(r.job.prompt.size());
  if (r.mtp_rows.empty()) {
    // A restore's pyramid kept no row of this chunk: the MTP layers start at
    // the first chunk that has some (kv::WindowRestorePyramid::mtp_from).
    if (rows == 0) return absl::OkStatus();
    // The first computed position. Positions before it come from a prefix
    // hit, MTP KV included (for the hit's last k + 1 positions that KV was
    // computed with the inserting request's next tokens: MTP drafts from
    // there may differ, which costs acceptance, never correctness, since
    // the main model verifies every draft).
    r.mtp_rows.resize(K);
    r.mtp_next.assign(K, first);
  }
  auto token_at = [&](int idx) { return idx < n ? r.job.prompt[idx] : extra; };
  // Layer 0's inputs: the main hidden states of this chunk.
  if (r.mtp_next[0] + static_cast<int>(r.mtp_rows[0].size() / H) != first) {
    return absl::InternalError("MTP rows out of order");
  }
  r.mtp_rows[0].insert(r.mtp_rows[0].end(), hidden, hidden + static_cast<size_t>(rows) * H);
  for (int k = 0; k < K; ++k) {
    std::vector<float>& pending = r.mtp_rows[k];
    const int have = static_cast<int>(pending.size() / H);
    const int p0 = r.mtp_next[k];
    // Positions p in [p0, p0 + have) with token p + 1 + k known.
    const int ready = std::max(0, std::min(have, known - 1 - k - p0));
    if (ready == 0) continue;
    mtp_tokens.resize(ready);
    for (int j = 0; j < ready; ++j) mtp_tokens[j] = token_at(p0 + j + 1 + k);
    model::ForwardItem item{.seq = r.seq.get(),
                            .tokens = mtp_tokens,
                            .start = p0,
                            .no_logits = true,
                            .window_restore_end = RestoreEnd(r, p0)};
    // MTP row j embeds the token at main position p0 + j + 1 + k.
    MultimodalOverrides(r.job, p0 + 1 + k, std::min(ready, std::max(0, n - (p0 + 1 + k))),
                        &mtp_overrides);
    item.embeddings = mtp_overrides;
    RETURN_IF_ERROR(options.engine->ForwardMtp(
        k, {&item, 1}, absl::MakeConstSpan(pending.data(), static_cast<size_t>(ready) * H),
        &mtp_out));
    if (k + 1 < K) {
      std::vector<float>& next = r.mtp_rows[k + 1];
      if (r.mtp_next[k + 1] + static_cast<int>(next.size() / H) != p0) {
        return absl::InternalError("MTP layer rows out of order");
      }
      next.insert(next.end(), mtp_out.all_hidden.begin(),
                  mtp_out.all_hidden.begin() + static_cast<size_t>(ready) * H);
    }
    pending.erase(pending.begin(), pending.begin() + static_cast<size_t>(ready) * H);
    r.mtp_next[k] = p0 + ready;
  }
  return absl::OkStatus();
}

void PrefillCore::Impl::PublishLoad() {
  int running = 0;
  for (const auto& [id, r] : reqs) running += r->started ? 1 : 0;
  absl::MutexLock lock(&mu);
  load.queued_requests = sched->queued_requests() + static_cast<int>(incoming.size()) +
                        static_cast<int>(parked.size());
  load.queued_uncached_tokens = sched->queued_uncached_tokens();
  load.running_requests = running;
  if (m.running != nullptr) m.running->Set(running);
}

void PrefillCore::Impl::EndShipsAndCancels(
    const std::vector<std::pair<std::string, absl::Status>>& done_ships,
    const std::vector<std::string>& to_cancel) {
  for (const auto& [id, status] : done_ships) {
    auto it = reqs.find(id);
    if (it == reqs.end()) continue;
    Req* r = it->second.get();
    r->shipping = false;
    r->result.transfer_seconds =
        static_cast<double>(base::MonotonicNanos() - r->ship_start_ns) * 1e-9;
    // A cancel that came while the KV shipped: a delivered ship is a
    // prefill that did its work (the router cancels the leg it still holds
    // once the decode leg answered, which can precede this completion), so
    // it ends ok; a failed one failed because of the cancel (the receiver
    // gave up), so it ends cancelled, not as this worker's error.
    Complete(r, r->cancelled && !status.ok() ? absl::CancelledError("cancelled by the caller")
                                            : status);
  }
  for (const std::string& id : to_cancel) {
    FailParked(id, absl::CancelledError("cancelled by the caller"));
    auto it = reqs.find(id);
    if (it == reqs.end()) continue;
    Req* r = it->second.get();
    if (r->shipping) {
      r->cancelled = true;  // the transfer owns the pages until it ends
      continue;
    }
    sched->Cancel(id);
    Complete(r, absl::CancelledError("cancelled by the caller"));
  }
}

void PrefillCore::Impl::Loop() {
  while (true) {
    std::deque<std::unique_ptr<Req>> new_reqs;
    std::vector<std::string> to_cancel;
    std::vector<std::pair<std::string, absl::Status>> done_ships;
    std::vector<Fetched> done_fetches;
    std::vector<kv::PendingLoadBack> done_copies;
    std::optional<DrainEnd> end_all;
    {
      const bool runnable =
          !sched_blocked && (sched->queued_requests() > 0 || sched->in_progress_requests() > 0);
      // Parked requests' waits end only here, after the fetches that landed
      // while the loop was busy are taken below (not before: a result that
      // is already here is never expired).
      int64_t next_deadline = INT64_MAX;
      for (const auto& [id, r] : parked) {
        next_deadline = std::min(next_deadline, r->prefetch_deadline_ns);
      }
      // Paced L3 writes of prompts near the bound go on while idle too.
      if ((options.cache != nullptr && options.cache->l3_writes_pending()) || !held_dones.empty()) {
        next_deadline = std::min(next_deadline, base::MonotonicNanos() + kL3WriteRetryNanos);
      }
      absl::MutexLock lock(&mu);
      while (!stopping && incoming.empty() && cancels.empty() && shipped.empty() &&
             fetched.empty() && copied.empty() && !runnable &&
             !(drain_end.requested && !drain_end.taken)) {
        if (next_deadline == INT64_MAX) {
          cv.Wait(&mu);
          continue;
        }
        const int64_t now = base::MonotonicNanos();
        if (now >= next_deadline) break;  // a parked request's wait is over
        cv.WaitWithTimeout(&mu, absl::Nanoseconds(next_deadline - now));
      }
      if (stopping) break;
      if (drain_end.requested && !drain_end.taken) {
        drain_end.taken = true;
        end_all = drain_end;
      }
      new_reqs.swap(incoming);
      to_cancel.swap(cancels);
      done_ships.swap(shipped);
      done_fetches.swap(fetched);
      done_copies.swap(copied);
    }
    FinishCopied(done_copies);
    if (options.cache != nullptr) options.cache->ContinueL3Writes();
    if (pins != nullptr && pins->pins() > 0) {
      pins->Expire(base::MonotonicNanos());
      if (m.pinned_pages != nullptr) m.pinned_pages->Set(static_cast<double>(pins->pinned_pages()));
    }
    for (Fetched& f : done_fetches) OnFetched(f);
    ExpireParked(base::MonotonicNanos());
    for (auto& r : new_reqs) Accept(std::move(r));
    EndShipsAndCancels(done_ships, to_cancel);
    if (end_all.has_value()) EndAllHeld(end_all->status, end_all->l3_flush_timeout);
    RunHeldDones(/*force=*/false);
    const sched::PrefillStep step = sched->NextStep(
        base::MonotonicNanos(), [this](const sched::PrefillRequestInfo& info) {
          return CanStart(info);
        });
    sched_blocked = step.empty();
    if (step.empty() && sched->queued_requests() + sched->in_progress_requests() > 0) {
      SWA_LOG(debug, "prefill: no step: {} queued, {} in progress, started {}, free {}, evictable {}, committed {}",
              sched->queued_requests(), sched->in_progress_requests(), AnyStarted(),
              options.pools->full().num_free(),
              options.cache != nullptr ? options.cache->EvictableFullPages() : 0, committed_full_pages);
    }
    if (!step.empty()) {
      RunStep(step);
    } else if (sched->queued_requests() > 0 && !AnyStarted() && pending_copies == 0) {
      // (With copies pending, their completion is the event to wait for.)
      // No event will come (nothing computes or ships): unblock now.
      if (ReleaseQueuedHits()) sched_blocked = false;
    }
    PublishLoad();
  }
  // Stopping: fail everything still here. Shipping requests are waited for
  // (their transfer owns the pages). What they computed goes into the cache
  // (PartialKeepTokens), which outlives the core: a worker with an L3 store
  // writes it back on shutdown, so a retry on a worker sharing that store
  // (or this one restarted over its file store) resumes there.
  RunHeldDones(/*force=*/true);
  std::deque<std::unique_ptr<Req>> rest;
  {
    absl::MutexLock lock(&mu);
    rest.swap(incoming);
  }
  for (auto& r : rest) Accept(std::move(r));
  while (!parked.empty()) {
    FailParked(parked.begin()->first, absl::CancelledError("prefill worker stopping"));
  }
  while (true) {
    std::vector<Req*> now;
    bool any_shipping = false;
    for (auto& [id, r] : reqs) {
      if (r->shipping) {
        any_shipping = true;
      } else {
        now.push_back(r.get());
      }
    }
    for (Req* r : now) {
      sched->Cancel(r->job.id);
      Complete(r, absl::CancelledError("prefill worker stopping"));
    }
    if (!any_shipping) break;
    std::vector<std::pair<std::string, absl::Status>> done_ships;
    {
      absl::MutexLock lock(&mu);
      auto have = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return !shipped.empty(); };
      mu.Await(absl::Condition(&have));
      done_ships.swap(shipped);
    }
    for (const auto& [id, status] : done_ships) {
      auto it = reqs.find(id);
      if (it == reqs.end()) continue;
      it->second->shipping = false;
      Complete(it->second.get(), absl::CancelledError("prefill worker stopping"));
    }
  }
  // Load-backs still copying: their path stays locked until finished.
  while (pending_copies > 0) {
    std::vector<kv::PendingLoadBack> done;
    {
      absl::MutexLock lock(&mu);
      auto have = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return !copied.empty(); };
      mu.Await(absl::Condition(&have));
      done.swap(copied);
    }
    FinishCopied(done);
  }
  if (pins != nullptr) pins->UnpinAll();
  PublishLoad();
}

absl::StatusOr<std::unique_ptr<PrefillCore>> PrefillCore::Create(const PrefillCoreOptions& options) {
  RETURN_IF_ERROR(CheckEngineAndPools("PrefillCore", options.engine, options.pools));
  if (!(options.l3_prefetch_wait_fraction >= 0) ||
      !(options.l3_prefetch_assumed_tokens_per_second > 0) || options.l3_prefetch_max_wait_ms < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PrefillCore: l3_prefetch_wait_fraction must be >= 0, "
        "l3_prefetch_assumed_tokens_per_second > 0 and l3_prefetch_max_wait_ms >= 0, got ",
        options.l3_prefetch_wait_fraction, ", ", options.l3_prefetch_assumed_tokens_per_second,
        ", ", options.l3_prefetch_max_wait_ms));
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  sched::PrefillSchedulerOptions so = options.scheduler;
  so.registry = options.registry;
  ASSIGN_OR_RETURN(impl->sched, sched::PrefillScheduler::Create(so));
  RETURN_IF_ERROR(impl->m.Init(options.registry));
  if (options.cache != nullptr && options.cache_pin_max_fraction > 0) {
    const double pages = static_cast<double>(options.pools->full().num_pages());
    impl->pins = std::make_unique<kv::CachePins>(
        options.cache,
        kv::CachePinsOptions{.max_pinned_pages = static_cast<int64_t>(
                                 std::min(1.0, options.cache_pin_max_fraction) * pages)});
  }
  Impl* p = impl.get();
  if (options.l3 != nullptr && options.cache != nullptr && options.cache->has_l3()) {
    impl->prefetcher = std::make_unique<kv::L3Prefetcher>(
        options.l3, options.cache->l3_fetch_options(),
        [p](std::string id, std::vector<uint64_t> hashes, kv::L3Fetch fetch) {
          absl::MutexLock lock(&p->mu);
          p->fetched.push_back(Impl::Fetched{std::move(id), std::move(hashes), std::move(fetch)});
          p->cv.Signal();
        });
  }
  if (options.cache != nullptr && options.cache->has_l2()) {
    impl->copier = std::make_unique<kv::LoadBackCopier>([p](kv::PendingLoadBack done) {
      absl::MutexLock lock(&p->mu);
      p->copied.push_back(std::move(done));
      p->cv.Signal();
    });
  }
  impl->thread = std::thread([p] { p->Loop(); });
  return std::unique_ptr<PrefillCore>(new PrefillCore(std::move(impl)));
}

PrefillCore::PrefillCore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
PrefillCore::~PrefillCore() { Stop(); }

void PrefillCore::Stop() { StopLoop(&impl_->mu, &impl_->cv, &impl_->stopping, &impl_->thread); }

absl::Status PrefillCore::Submit(PrefillJob job) {
  const Impl& s = *impl_;
  if (!job.done) return absl::InvalidArgumentError("prefill job without a completion callback");
  if (job.id.empty()) return absl::InvalidArgumentError("prefill job without an id");
  if (job.prompt.empty()) return absl::InvalidArgumentError("empty prompt");
  const int n = static_cast<int>(job.prompt.size());
  if (s.options.max_prompt_tokens > 0 && n > s.options.max_prompt_tokens) {
    return absl::OutOfRangeError(absl::StrCat("prompt of ", n, " tokens exceeds this worker's ",
                                              s.options.max_prompt_tokens, "-token bucket"));
  }
  const int V = s.options.engine->config().vocab_size;
  for (uint32_t t : job.prompt) {
    if (t >= static_cast<uint32_t>(V)) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", t, " >= vocab size ", V));
    }
  }
  RETURN_IF_ERROR(model::Sampler::Validate(job.sampling));
  const size_t H = static_cast<size_t>(s.options.engine->config().hidden_size);
  int64_t next = 0;
  for (size_t i = 0; i < job.multimodal.size(); ++i) {
    const PrefillMultimodal& m = job.multimodal[i];
    const int64_t at = m.span.token_offset, len = m.span.num_tokens;
    if (len <= 0 || at < next || at + len > n) {
      return absl::InvalidArgumentError(absl::StrCat(
          "multimodal item ", i, ": placeholders [", at, ", ", at + len,
          ") are empty, overlap the previous item or leave the ", n, "-token prompt"));
    }
    if (m.embeddings == nullptr || m.embeddings->size() != static_cast<size_t>(len) * H) {
      return absl::InvalidArgumentError(absl::StrCat(
          "multimodal item ", i, ": ", m.embeddings == nullptr ? 0 : m.embeddings->size(),
          " embedding values for ", len, " placeholders of hidden size ", H));
    }
    next = at + len;
  }
  const int ps = s.options.pools->shape().page_size;
  const int64_t pages = (n + ps - 1) / ps;
  if (pages > s.options.pools->full().num_pages()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "prompt of ", n, " tokens needs ", pages, " full KV pages; this worker has ",
        s.options.pools->full().num_pages()));
  }
  auto r = std::make_unique<Req>();
  r->arrival_ns = base::MonotonicNanos();
  r->sampler = std::make_unique<model::Sampler>(job.sampling);
  r->job = std::move(job);
  absl::MutexLock lock(&impl_->mu);
  if (impl_->stopping) return absl::FailedPreconditionError("prefill core is stopping");
  if (!impl_->ids.try_emplace(r->job.id, PrefillProgress{.prompt_tokens = n}).second) {
    return absl::AlreadyExistsError(absl::StrCat("request ", r->job.id, " is already here"));
  }
  impl_->incoming.push_back(std::move(r));
  impl_->cv.Signal();
  return absl::OkStatus();
}

void PrefillCore::EndAllForDrain(absl::Status status, absl::Duration l3_flush_timeout) {
  Impl& i = *impl_;
  absl::MutexLock lock(&i.mu);
  if (i.stopping || i.drain_end.requested) return;
  i.drain_end.requested = true;
  i.drain_end.status = std::move(status);
  i.drain_end.l3_flush_timeout = l3_flush_timeout;
  i.cv.Signal();
  auto over = [&i]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(i.mu) {
    return i.drain_end.done || i.stopping;
  };
  i.mu.AwaitWithTimeout(absl::Condition(&over), l3_flush_timeout + absl::Seconds(5));
}

void PrefillCore::Cancel(const std::string& id) {
  absl::MutexLock lock(&impl_->mu);
  if (!impl_->ids.contains(id)) return;
  impl_->cancels.push_back(id);
  impl_->cv.Signal();
}

std::optional<PrefillProgress> PrefillCore::Progress(const std::string& id) const {
  absl::MutexLock lock(&impl_->mu);
  auto it = impl_->ids.find(id);
  if (it == impl_->ids.end()) return std::nullopt;
  PrefillProgress p = it->second;
  p.tokens_per_second = impl_->load.prefill_tokens_per_second;
  if (p.state == PrefillProgress::State::kQueued) {
    for (const auto& [other, q] : impl_->ids) {
      p.queued_requests += q.state == PrefillProgress::State::kQueued;
    }
  }
  return p;
}

PrefillLoad PrefillCore::GetLoad() const {
  PrefillLoad l;
  {
    absl::MutexLock lock(&impl_->mu);
    l = impl_->load;
  }
  l.completed_total = impl_->completed.load();
  l.computed_tokens_total = impl_->computed_total.load();
  l.cached_tokens_total = impl_->cached_total.load();
  l.released_hits_total = impl_->released_hits.load();
  l.window_restores_total = impl_->restores_total.load();
  l.restored_tokens_total = impl_->restored_total.load();
  l.restore_saved_tokens_total = impl_->restore_saved_total.load();
  l.window_restores_from_window_safe_total = impl_->restores_from_safe_total.load();
  l.partial_kept_total = impl_->partial_kept_total.load();
  l.partial_kept_tokens_total = impl_->partial_kept_tokens_total.load();
  l.l3_checkpoints_total = impl_->l3_checkpoints_total.load();
  l.l3_checkpoint_tokens_total = impl_->l3_checkpoint_tokens_total.load();
  l.l3_checkpoints_skipped_total = impl_->l3_checkpoints_skipped_total.load();
  l.swa_checkpoint_pages_yielded_total = impl_->checkpoint_pages_yielded_total.load();
  l.l3_prefetch_hits = impl_->prefetch_hits.load();
  l.l3_prefetch_misses = impl_->prefetch_misses.load();
  l.l3_prefetch_unused = impl_->prefetch_unused.load();
  l.l3_prefetch_timeouts = impl_->prefetch_timeouts.load();
  l.l3_attached_pages = impl_->l3_attached.load();
  l.async_load_backs = impl_->async_load_backs.load();
  l.sync_load_backs = impl_->sync_load_backs.load();
  l.l1_cached_tokens_total = impl_->tier_tokens_total[0].load();
  l.l2_cached_tokens_total = impl_->tier_tokens_total[1].load();
  l.l3_cached_tokens_total = impl_->tier_tokens_total[2].load();
  return l;
}

}  // namespace swaserve::worker
