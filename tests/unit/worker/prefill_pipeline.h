// The PrefillCore → (local staging) → DecodeCore pipeline fixture shared by
// prefill_core_test.cc and prefill_cut_short_test.cc: Pipeline (one prefill
// core and one decode core on the tiny test model, requests submitted and
// their outcomes collected), straight-line references (StraightLineKv,
// ExpectSameKv) and StalledStore (an L3 that answers nothing until opened).
#pragma once

#include <unistd.h>

#include <filesystem>
#include <map>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "lib/base/hash.h"
#include "lib/kv/file_page_store.h"
#include "lib/kv/memory_page_store.h"
#include "lib/worker/local_ship.h"
#include "lib/worker/prefill_core.h"
#include "tests/unit/worker/test_model.h"

namespace swaserve::worker {

using testing::kPage;

struct Outcome {
  std::vector<uint32_t> tokens;
  FinishReason finish = FinishReason::kNone;
  absl::Status error;
  int cached = -1;
  bool prefill_done = false;
  absl::Status prefill_status;
  int restored_tokens = 0;
  // The KV shipped (with capture_kv_).
  std::shared_ptr<KvStaging> kv;
};

// A straight-line run: the whole prompt in one forward, then each MTP layer
// over every position whose next tokens are known; the KV as staged for a
// decode worker, and the greedy first token.
inline std::unique_ptr<KvStaging> StraightLineKv(const std::vector<uint32_t>& prompt, uint32_t* first) {
  const model::ModelConfig& cfg = testing::TestEngine().config();
  const int n = static_cast<int>(prompt.size());
  auto pools = testing::NewPools(n / kPage + 8, n / kPage + 8);
  kv::Sequence seq(kv::SequenceOptions{pools.get(), nullptr, 0, false});
  EXPECT_TRUE(seq.Append(n).ok());
  model::ForwardOutput out;
  model::ForwardItem item{&seq, prompt, 0, false};
  EXPECT_TRUE(testing::TestEngine().Forward({&item, 1}, &out, true).ok());
  *first = model::Argmax(out.logits);
  std::vector<uint32_t> all = prompt;
  all.push_back(*first);
  std::vector<float> hidden = out.all_hidden;
  for (int k = 0; k < cfg.num_mtp_layers; ++k) {
    const int m = n - k;  // positions [0, n - k): token p + 1 + k <= n known
    std::vector<uint32_t> tokens(all.begin() + 1 + k, all.begin() + 1 + k + m);
    model::ForwardItem mi{&seq, tokens, 0, false};
    model::ForwardOutput mo;
    EXPECT_TRUE(testing::TestEngine()
                    .ForwardMtp(k, {&mi, 1},
                                absl::MakeConstSpan(hidden.data(), static_cast<size_t>(m) * cfg.hidden_size),
                                &mo)
                    .ok());
    hidden = mo.all_hidden;
  }
  auto want = KvStaging::Create(StagedKvLayout::For(pools->shape(), n));
  EXPECT_TRUE(want.ok());
  EXPECT_TRUE(CopySequenceToStaging(seq, *pools, want->get()).ok());
  return std::move(*want);
}

// Compares every (layer, token) slot the prefill computed: all full layers,
// SWA layers and MTP layer 0 for every token, MTP layer k up to n - 1 - k
// (its later positions need drafted tokens). Other slots were never written.
// A prefix hit of `hit` tokens (> 0) brings MTP layer k's KV at [hit − 1 − k,
// hit) computed with the inserting request's next tokens (prefill_core.cc,
// RunMtp: costs acceptance, never correctness), and through the MTP layers'
// attention that reaches the KV of layer k up to hit + k·(W − 1): not
// compared.
inline void ExpectSameKv(const kv::KvShape& shape, const KvStaging& got, const KvStaging& want, int n,
                  const std::string& what, int hit = 0) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const model::ModelConfig& cfg = testing::TestEngine().config();
  const StagedKvLayout& l = got.layout();
  auto compare = [&](const kv::PoolGeometry& g, const uint8_t* a, const uint8_t* b, int layer,
                     int from, int to, int first_token, const char* pool, int skip_from = 0,
                     int skip_to = 0) {
    const size_t k_bytes = static_cast<size_t>(g.num_kv_heads) * g.k_head_dim * kv::DTypeSize(g.dtype);
    const size_t v_bytes = static_cast<size_t>(g.num_kv_heads) * g.v_head_dim * kv::DTypeSize(g.dtype);
    for (int t = from; t < to; ++t) {
      if (t >= skip_from && t < skip_to) continue;
      const size_t page = static_cast<size_t>((t - first_token) / g.page_size) * g.PageBytes();
      const size_t slot = t % g.page_size;
      const size_t ko = page + g.KOffset(layer) + slot * g.KTokenStride();
      const size_t vo = page + g.VOffset(layer) + slot * g.VTokenStride();
      ASSERT_EQ(std::memcmp(a + ko, b + ko, k_bytes), 0) << what << " " << pool << " layer " << layer << " token " << t << " K";
      ASSERT_EQ(std::memcmp(a + vo, b + vo, v_bytes), 0) << what << " " << pool << " layer " << layer << " token " << t << " V";
    }
  };
  const kv::PoolGeometry fg = shape.Full(), sg = shape.Swa();
  for (int layer = 0; layer < fg.num_layers; ++layer) {
    compare(fg, got.full_region(), want.full_region(), layer, 0, n, 0, "full");
  }
  for (int layer = 0; layer < sg.num_layers; ++layer) {
    const int k = layer - cfg.num_swa_layers();  // MTP layer index, or < 0
    const int to = k <= 0 ? n : n - k;
    compare(sg, got.swa_region(), want.swa_region(), layer, l.first_swa_token, to,
            l.first_swa_token, k >= 0 ? "MTP" : "SWA", k >= 0 && hit > 0 ? hit - 1 - k : 0,
            k >= 0 && hit > 0 ? hit + k * (cfg.sliding_window - 1) : 0);
  }
}

class Pipeline : public ::testing::Test {
 protected:
  void Start(int prefill_pages, int decode_pages, sched::PrefillSchedulerOptions so = {},
             int prefill_swa_pages = -1, double window_restore_min_saved_work = 64,
             int swa_checkpoint_tokens = 0) {
    prefill_pools_ = testing::NewPools(
        prefill_pages, prefill_swa_pages < 0 ? prefill_pages : prefill_swa_pages);
    // As a worker does: restorable tombstones wherever windows are restored.
    if (l3_ != nullptr || with_l2_) l2_pools_ = testing::NewPools(l2_pages_, l2_pages_);
    auto cache = kv::PrefixCache::Create(
        {.pools = prefill_pools_.get(),
         .keep_restorable_tombstones = window_restore_min_saved_work >= 0,
         .l2 = l2_pools_.get(),
         .l3 = l3_,
         .l3_write_through_hits = 1});
    ASSERT_TRUE(cache.ok());
    cache_ = std::move(*cache);
    decode_pools_ = testing::NewPools(decode_pages, decode_pages);
    DecodeCoreOptions d;
    d.engine = &testing::TestEngine();
    d.pools = decode_pools_.get();
    d.registry = registry_.get();
    auto dc = DecodeCore::Create(d);
    ASSERT_TRUE(dc.ok()) << dc.status();
    decode_ = std::move(*dc);
    PrefillCoreOptions p;
    p.engine = &testing::TestEngine();
    p.pools = prefill_pools_.get();
    p.cache = cache_.get();
    so.chunk_tokens = 16;
    so.step_token_budget = 48;
    p.scheduler = so;
    p.registry = registry_.get();
    p.window_restore_min_saved_work = window_restore_min_saved_work;
    p.swa_checkpoint_tokens = swa_checkpoint_tokens;
    p.window_restore_from_window_safe = restore_from_window_safe_;
    p.l3 = l3_;
    p.l3_prefetch_min_tokens = 64;
    p.l3_prefetch_max_wait_ms = l3_max_wait_ms_;
    p.l3_prefetch_wait_fraction = l3_wait_fraction_;
    p.l3_prefetch_assumed_tokens_per_second = l3_assumed_rate_;
    p.async_load_back_min_bytes = async_load_back_min_bytes_;
    p.l3_checkpoint_tokens = l3_checkpoint_tokens_;
    auto pc = PrefillCore::Create(p);
    ASSERT_TRUE(pc.ok()) << pc.status();
    prefill_ = std::move(*pc);
  }
  bool restore_from_window_safe_ = true;  // PrefillCoreOptions' default
  void TearDown() override {
    if (prefill_ != nullptr) prefill_->Stop();
    if (decode_ != nullptr) decode_->Stop();
    if (decode_pools_ != nullptr) {
      EXPECT_EQ(decode_pools_->full().num_free(), decode_pools_->full().num_pages());
      EXPECT_EQ(decode_pools_->swa().num_free(), decode_pools_->swa().num_pages());
    }
    if (prefill_pools_ != nullptr) {
      // Everything left is the prefix cache's.
      EXPECT_EQ(prefill_pools_->full().num_in_use(), 0);
      EXPECT_EQ(prefill_pools_->swa().num_in_use(), 0);
      EXPECT_EQ(prefill_pools_->full().num_reserved(), 0);
      EXPECT_TRUE(cache_->CheckInvariants().ok());
    }
  }

  absl::Status Submit(const std::string& id, const std::vector<uint32_t>& prompt, int max_tokens,
                      std::vector<PrefillMultimodal> multimodal = {}) {
    LocalDecodeParams d;
    d.id = id;
    d.prompt = prompt;
    d.stop.max_tokens = max_tokens;
    d.sink = [this, id](const TokenEvent& e) {
      absl::MutexLock lock(&mu_);
      Outcome& o = out_[id];
      for (const auto& t : e.tokens) o.tokens.push_back(t.token);
      if (e.finish != FinishReason::kNone) {
        o.finish = e.finish;
        o.error = e.error;
        o.cached = e.cached_tokens;
        ++finished_;
      }
    };
    PrefillJob j;
    j.id = id;
    j.prompt = prompt;
    j.multimodal = std::move(multimodal);
    ShipFn local = MakeLocalShip(decode_.get(), prefill_pools_.get(), std::move(d));
    j.ship = [this, id, local, n = static_cast<int>(prompt.size())](
                 const kv::Sequence& s, const PrefillResult& r,
                 std::function<void(absl::Status)> shipped) {
      if (capture_kv_) {
        std::shared_ptr<KvStaging> kv =
            *KvStaging::Create(StagedKvLayout::For(prefill_pools_->shape(), n));
        EXPECT_TRUE(CopySequenceToStaging(s, *prefill_pools_, kv.get()).ok());
        absl::MutexLock lock(&mu_);
        out_[id].kv = std::move(kv);
      }
      local(s, r, std::move(shipped));
    };
    j.done = [this, id](absl::StatusOr<PrefillResult> r) {
      absl::MutexLock lock(&mu_);
      out_[id].prefill_done = true;
      ++prefill_dones_;
      out_[id].prefill_status = r.status();
      if (r.ok()) out_[id].restored_tokens = r->restored_tokens;
      if (!r.ok()) ++finished_;  // no decode leg
    };
    return prefill_->Submit(std::move(j));
  }
  // Until n requests finished (decode leg done, or prefill failed) and n
  // prefill legs ended: a prefill leg ends (its done callback, after the
  // worker's counters took it in) once its ship is acknowledged, which can
  // come after the decode leg finished.
  void WaitFinished(int n) {
    absl::MutexLock lock(&mu_);
    auto enough = [&] { return finished_ >= n && prefill_dones_ >= n; };
    ASSERT_TRUE(mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(240)))
        << finished_ << " of " << n;
  }
  // Until `id`'s decode leg finished and its prefill leg ended (WaitFinished
  // counts a prefill leg that ends in an error too, e.g. cancelled after a
  // short decode won the race).
  void WaitDone(const std::string& id) {
    absl::MutexLock lock(&mu_);
    auto done = [&] { return out_[id].finish != FinishReason::kNone && out_[id].prefill_done; };
    ASSERT_TRUE(mu_.AwaitWithTimeout(absl::Condition(&done), absl::Seconds(240))) << id;
  }
  Outcome Get(const std::string& id) {
    absl::MutexLock lock(&mu_);
    return out_[id];
  }
  // Until `id`'s prefill has computed at least `tokens` prompt tokens; what
  // it had then (0: never got there within 2 minutes).
  int WaitProgress(const std::string& id, int tokens) {
    for (const absl::Time until = absl::Now() + absl::Seconds(120); absl::Now() < until;
         absl::SleepFor(absl::Microseconds(200))) {
      const std::optional<PrefillProgress> p = prefill_->Progress(id);
      if (p.has_value() && p->done_tokens >= tokens) return p->done_tokens;
    }
    return 0;
  }

  // A new worker (Start) runs `prompt` as `id` to its end; its outcome,
  // whose prefill must have succeeded.
  Outcome StartAndRun(const std::string& id, const std::vector<uint32_t>& prompt) {
    Start(4096, 4096);
    EXPECT_TRUE(Submit(id, prompt, 4).ok());
    WaitDone(id);
    Outcome o = Get(id);
    EXPECT_TRUE(o.prefill_status.ok()) << o.prefill_status;
    return o;
  }
  void ClearOutcomes() {
    absl::MutexLock lock(&mu_);
    out_.clear();
    finished_ = prefill_dones_ = 0;
  }

  // A worker restart: everything stops and is destroyed (the cache writes
  // back to L3 first, as the worker does on shutdown), then Start again.
  void StopAll() {
    prefill_->Stop();
    decode_->Stop();
    if (l3_ != nullptr) cache_->Clear();
    prefill_.reset();
    decode_.reset();
    cache_.reset();
    prefill_pools_.reset();
    decode_pools_.reset();
    l2_pools_.reset();
    registry_ = std::make_unique<metrics::Registry>();
  }

  // L3 (set before Start): the store, L2 pages, how long a request waits.
  kv::PageStore* l3_ = nullptr;
  int l2_pages_ = 512;  // 2x the tests' L1, as a worker sizes it
  int64_t l3_max_wait_ms_ = 10000;
  double l3_wait_fraction_ = 0.5;    // PrefillCoreOptions' defaults
  double l3_assumed_rate_ = 2000;
  int l3_checkpoint_tokens_ = 16384;  // PrefillCoreOptions' default
  // L2 without L3 (set before Start), and the async load-back threshold.
  bool with_l2_ = false;
  int64_t async_load_back_min_bytes_ = int64_t{1} << 20;
  std::unique_ptr<kv::KvPools> l2_pools_;
  // Replaced on a restart (the cores register their metrics again).
  std::unique_ptr<metrics::Registry> registry_ = std::make_unique<metrics::Registry>();
  std::unique_ptr<kv::KvPools> prefill_pools_, decode_pools_;
  std::unique_ptr<kv::PrefixCache> cache_;
  std::unique_ptr<DecodeCore> decode_;
  std::unique_ptr<PrefillCore> prefill_;
  bool capture_kv_ = false;  // set before Start
  absl::Mutex mu_;
  std::map<std::string, Outcome> out_ ABSL_GUARDED_BY(mu_);
  int finished_ ABSL_GUARDED_BY(mu_) = 0;
  int prefill_dones_ ABSL_GUARDED_BY(mu_) = 0;
};

// A store that answers nothing until the test opens it (a slow L3).
class StalledStore final : public kv::PageStore {
 public:
  absl::Status Put(const kv::PageKey& k, absl::Span<const uint8_t> b) override {
    Wait();
    return inner_.Put(k, b);
  }
  absl::Status Get(const kv::PageKey& k, absl::Span<uint8_t> out) override {
    Wait();
    return inner_.Get(k, out);
  }
  bool Contains(const kv::PageKey& k) override {
    Wait();
    return inner_.Contains(k);
  }
  void Erase(const kv::PageKey& k) override { inner_.Erase(k); }
  std::string_view backend() const override { return "stalled"; }
  const kv::PageStoreStats& stats() const override { return inner_.stats(); }
  void Open() {
    absl::MutexLock lock(&mu_);
    open_ = true;
  }

 private:
  void Wait() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&open_));
  }
  kv::MemoryPageStore inner_{64 << 20};
  absl::Mutex mu_;
  bool open_ = false;
};

}  // namespace swaserve::worker
