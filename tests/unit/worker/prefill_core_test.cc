// PrefillCore → (local staging) → DecodeCore, the monolithic pipeline,
// against straight-line greedy runs: identical outputs with and without
// prefix-cache hits, under concurrency, for mixed lengths and batch
// compositions; cancellation; every page free or cached afterwards.
#include "lib/worker/prefill_core.h"

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
#include "tests/unit/worker/test_model.h"

namespace swaserve::worker {
namespace {

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
std::unique_ptr<KvStaging> StraightLineKv(const std::vector<uint32_t>& prompt, uint32_t* first) {
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
void ExpectSameKv(const kv::KvShape& shape, const KvStaging& got, const KvStaging& want, int n,
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

TEST_F(Pipeline, GreedyOutputsEqualTheReferenceWithAndWithoutPrefixHits) {
  Start(4096, 4096);
  std::mt19937 rng(17);
  // Shared prefixes (system-prompt-like) so later requests hit the cache.
  std::vector<std::vector<uint32_t>> bases = {testing::RandomPrompt(1, 40),
                                              testing::RandomPrompt(2, 90)};
  std::vector<std::vector<uint32_t>> prompts;
  std::vector<int> max_tokens;
  // Three waves: later waves continue earlier prompts (multi-turn: a hit at
  // the earlier prompt's end) or share a base (a hit once a divergence
  // window has been kept there).
  for (int i = 0; i < 50; ++i) {
    std::vector<uint32_t> p;
    if (i >= 20 && rng() % 2 == 0) {
      p = prompts[rng() % (i < 35 ? 20 : 35)];
    } else if (rng() % 3 != 0) {
      p = bases[rng() % 2];
    }
    const auto tail = testing::RandomPrompt(1000 + i, 1 + rng() % 50);
    p.insert(p.end(), tail.begin(), tail.end());
    prompts.push_back(p);
    max_tokens.push_back(1 + rng() % 12);
  }
  const int waves[] = {0, 20, 35, 50};
  for (int w = 0; w < 3; ++w) {
    for (int i = waves[w]; i < waves[w + 1]; ++i) {
      ASSERT_TRUE(Submit("q" + std::to_string(i), prompts[i], max_tokens[i]).ok());
    }
    WaitFinished(waves[w + 1]);
  }
  int with_hits = 0;
  for (int i = 0; i < 50; ++i) {
    const Outcome o = Get("q" + std::to_string(i));
    ASSERT_TRUE(o.prefill_status.ok()) << o.prefill_status;
    EXPECT_EQ(o.finish, FinishReason::kLength) << o.error;
    EXPECT_EQ(o.tokens, testing::ReferenceGreedy(prompts[i], max_tokens[i])) << "request " << i;
    with_hits += o.cached > 0;
  }
  EXPECT_GT(with_hits, 10) << "the test did not exercise prefix hits";
  EXPECT_EQ(prefill_->GetLoad().completed_total, 50);
}

// The MTP layers run over the prompt chunk by chunk; the KV shipped (SWA
// region: SWA and MTP layers; full region) equals a straight-line run that
// prefills the whole prompt at once and then runs each MTP layer over every
// position whose next tokens are known.
TEST_F(Pipeline, MtpKvOverThePromptMatchesAStraightLineRun) {
  capture_kv_ = true;
  Start(4096, 4096);
  ASSERT_GE(testing::TestEngine().config().num_mtp_layers, 2);
  const std::vector<uint32_t> prompt = testing::RandomPrompt(77, 61);
  uint32_t first = 0;
  const std::unique_ptr<KvStaging> want = StraightLineKv(prompt, &first);
  // Through PrefillCore, 16-token chunks.
  ASSERT_TRUE(Submit("mtp", prompt, 1).ok());
  WaitFinished(1);
  const Outcome o = Get("mtp");
  ASSERT_TRUE(o.prefill_status.ok()) << o.prefill_status;
  ASSERT_EQ(o.tokens.size(), 1u);
  EXPECT_EQ(o.tokens[0], first);
  ASSERT_NE(o.kv, nullptr);
  ExpectSameKv(prefill_pools_->shape(), *o.kv, *want, static_cast<int>(prompt.size()), "mtp");
}

// Window restore under SWA-pool pressure: prompts share long prefixes whose
// SWA KV the small SWA pool keeps evicting (in whatever pattern LRU gives)
// while their full KV stays; later prompts diverge inside those prefixes.
// With restore on, many requests restore a window, and every request's KV
// (shipped: full, SWA and MTP layers) and greedy output equal a straight-line
// run's; with restore off the same workload restores nothing and gives the
// same outputs.
// Restore off, on, on only from the stretch's start (never from the
// window-safe hit itself), and on with SWA checkpoints every 32 tokens.
enum class RestoreMode { kOff, kOn, kOnFromStretchStart, kOnWithCheckpoints };
class WindowRestorePipeline : public Pipeline, public ::testing::WithParamInterface<RestoreMode> {};

TEST_P(WindowRestorePipeline, OutputsAndKvEqualAStraightLineRun) {
  const bool restore = GetParam() != RestoreMode::kOff;
  const int checkpoint = GetParam() == RestoreMode::kOnWithCheckpoints ? 32 : 0;
  restore_from_window_safe_ = GetParam() != RestoreMode::kOnFromStretchStart;
  capture_kv_ = true;
  // 96 SWA pages of 4 tokens: about three requests' windows and chunks.
  Start(4096, 4096, {}, 96, restore ? 0 : -1, checkpoint);
  std::mt19937 rng(41);
  std::vector<std::vector<uint32_t>> bases;
  for (int b = 0; b < 3; ++b) bases.push_back(testing::RandomPrompt(300 + b, 240 + 40 * b));
  std::vector<std::vector<uint32_t>> prompts;
  std::vector<int> cuts;  // where each prompt leaves its base
  for (int i = 0; i < 36; ++i) {
    const auto& base = bases[rng() % bases.size()];
    // Diverge at a random point past the first ~100 tokens (a full-KV match
    // long enough for a restore start past 0), or continue the whole base.
    const int cut = i < 3 ? static_cast<int>(base.size())
                          : 100 + static_cast<int>(rng() % (base.size() - 100));
    cuts.push_back(cut);
    std::vector<uint32_t> p(base.begin(), base.begin() + cut);
    const auto tail = testing::RandomPrompt(2000 + i, 3 + rng() % 20);
    p.insert(p.end(), tail.begin(), tail.end());
    prompts.push_back(std::move(p));
  }
  // Waves of 4 so that the cache state (and its evictions) evolves.
  for (int i = 0; i < 36; ++i) {
    ASSERT_TRUE(Submit("w" + std::to_string(i), prompts[i], 3).ok());
    if (i % 4 == 3) WaitFinished(i + 1);
  }
  WaitFinished(36);
  int restored = 0, at_checkpoint = 0;
  for (int i = 0; i < 36; ++i) {
    const std::string id = "w" + std::to_string(i);
    const Outcome o = Get(id);
    ASSERT_TRUE(o.prefill_status.ok()) << id << " " << o.prefill_status;
    EXPECT_EQ(o.tokens, testing::ReferenceGreedy(prompts[i], 3)) << id;
    uint32_t first = 0;
    const std::unique_ptr<KvStaging> want = StraightLineKv(prompts[i], &first);
    ASSERT_NE(o.kv, nullptr) << id;
    ExpectSameKv(prefill_pools_->shape(), *o.kv, *want, static_cast<int>(prompts[i].size()), id,
                 o.cached);
    restored += o.restored_tokens > 0;
    // A hit inside a base prompt (not at its end), at a checkpoint.
    at_checkpoint += checkpoint > 0 && o.restored_tokens == 0 && o.cached > 0 &&
                     o.cached % checkpoint == 0 && o.cached + kPage < cuts[i];
  }
  const PrefillLoad load = prefill_->GetLoad();
  EXPECT_EQ(load.window_restores_total, restored);
  std::printf("restores %d (from the window-safe hit %lld), hits at a checkpoint %d, cached "
              "tokens %lld\n", restored,
              static_cast<long long>(load.window_restores_from_window_safe_total), at_checkpoint,
              static_cast<long long>(load.cached_tokens_total));
  if (GetParam() == RestoreMode::kOnFromStretchStart || !restore) {
    EXPECT_EQ(load.window_restores_from_window_safe_total, 0);
  } else if (GetParam() == RestoreMode::kOn) {
    EXPECT_GE(load.window_restores_from_window_safe_total, 3)
        << "the workload did not exercise restores from the window-safe hit";
  }
  if (checkpoint > 0) {
    EXPECT_GE(at_checkpoint, 3) << "the workload did not hit checkpoint windows";
    EXPECT_GE(restored, 1) << "the workload did not exercise window restore";
  } else if (restore) {
    EXPECT_GE(restored, 5) << "the workload did not exercise window restore";
    EXPECT_GT(load.restore_saved_tokens_total, 0);
  } else {
    EXPECT_EQ(restored, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(RestoreOnOff, WindowRestorePipeline,
                         ::testing::Values(RestoreMode::kOn, RestoreMode::kOff,
                                           RestoreMode::kOnFromStretchStart,
                                           RestoreMode::kOnWithCheckpoints),
                         [](const ::testing::TestParamInfo<RestoreMode>& p) {
                           switch (p.param) {
                             case RestoreMode::kOff: return std::string("Off");
                             case RestoreMode::kOn: return std::string("On");
                             case RestoreMode::kOnFromStretchStart:
                               return std::string("OnFromStretchStart");
                             case RestoreMode::kOnWithCheckpoints: break;
                           }
                           return std::string("OnWithCheckpoints");
                         });

TEST_F(Pipeline, TwoHundredConcurrentRequestsComplete) {
  Start(2048, 512);
  std::mt19937 rng(23);
  for (int i = 0; i < 200; ++i) {
    ASSERT_TRUE(Submit("c" + std::to_string(i), testing::RandomPrompt(5000 + i, 4 + rng() % 60),
                       1 + rng() % 8)
                    .ok());
  }
  WaitFinished(200);
  for (int i = 0; i < 200; ++i) {
    const Outcome o = Get("c" + std::to_string(i));
    EXPECT_TRUE(o.prefill_status.ok()) << i << " " << o.prefill_status;
    EXPECT_EQ(o.finish, FinishReason::kLength) << i << " " << o.error;
  }
}

TEST_F(Pipeline, CancelAndBadInput) {
  sched::PrefillSchedulerOptions so;
  Start(4096, 4096, so);
  EXPECT_EQ(Submit("empty", {}, 4).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Submit("oov", {1, 2, 999}, 4).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Submit("huge", testing::RandomPrompt(3, 4096 * kPage + 1), 4).code(),
            absl::StatusCode::kResourceExhausted);
  // Many long requests, then cancel them all: each ends exactly once, either
  // cancelled at prefill or (if it got that far) at decode.
  for (int i = 0; i < 10; ++i) {
    ASSERT_TRUE(Submit("x" + std::to_string(i), testing::RandomPrompt(70 + i, 400), 100000).ok());
  }
  EXPECT_EQ(Submit("x0", testing::RandomPrompt(1, 5), 4).code(), absl::StatusCode::kAlreadyExists);
  for (int i = 0; i < 10; ++i) {
    prefill_->Cancel("x" + std::to_string(i));
    decode_->Cancel("x" + std::to_string(i));
  }
  WaitFinished(10);
  for (int i = 0; i < 10; ++i) {
    const Outcome o = Get("x" + std::to_string(i));
    EXPECT_TRUE(absl::IsCancelled(o.prefill_status) || o.finish == FinishReason::kCancelled)
        << i << " prefill " << o.prefill_status << " finish " << static_cast<int>(o.finish);
  }
}

// The router cancels the prefill leg it still holds once the decode leg has
// answered, and the worker may not yet have seen its ship end (the decode
// worker acknowledges the KV before the sender's completion runs). A prefill
// whose KV was delivered did its work: it ends ok, counted as such. A ship
// that fails after the caller's cancel ends cancelled (the receiver gave up
// because of that cancel), not as a worker error.
TEST_F(Pipeline, ACancelWhileTheKvShipsLeavesADeliveredPrefillOk) {
  Start(256, 256);
  for (const bool delivered : {true, false}) {
    SCOPED_TRACE(delivered ? "delivered" : "ship failed");
    const std::string id = delivered ? "d" : "f";
    absl::Mutex m;
    std::function<void(absl::Status)> shipped;
    absl::Notification done;
    absl::Status status;
    PrefillJob j;
    j.id = id;
    j.prompt = testing::RandomPrompt(delivered ? 7 : 8, 100);
    j.ship = [&](const kv::Sequence&, const PrefillResult&, std::function<void(absl::Status)> s) {
      absl::MutexLock lock(&m);
      shipped = std::move(s);
    };
    j.done = [&](absl::StatusOr<PrefillResult> r) {
      status = r.status();
      done.Notify();
    };
    ASSERT_TRUE(prefill_->Submit(std::move(j)).ok());
    {
      absl::MutexLock lock(&m);
      auto shipping = [&] { return shipped != nullptr; };
      ASSERT_TRUE(m.AwaitWithTimeout(absl::Condition(&shipping), absl::Seconds(60)));
    }
    prefill_->Cancel(id);
    // The loop takes a cancel and a new request in the same round: once this
    // warm-only request (no ship) ended, the cancel above was seen while the
    // first request was still shipping.
    absl::Notification marker;
    PrefillJob w;
    w.id = id + "-marker";
    w.prompt = testing::RandomPrompt(9, 3);
    w.done = [&](absl::StatusOr<PrefillResult>) { marker.Notify(); };
    ASSERT_TRUE(prefill_->Submit(std::move(w)).ok());
    ASSERT_TRUE(marker.WaitForNotificationWithTimeout(absl::Seconds(60)));
    EXPECT_FALSE(done.HasBeenNotified());  // the transfer owns the pages until it ends
    std::function<void(absl::Status)> s;
    {
      absl::MutexLock lock(&m);
      s = std::move(shipped);
    }
    s(delivered ? absl::OkStatus() : absl::UnavailableError("receiver cancelled the transfer"));
    ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(60)));
    if (delivered) {
      EXPECT_TRUE(status.ok()) << status;
    } else {
      EXPECT_TRUE(absl::IsCancelled(status)) << status;
    }
  }
  const std::string text = registry_->RenderText();
  EXPECT_TRUE(absl::StrContains(text, "swaserve_prefill_requests_total{result=\"ok\"} 3")) << text;
  EXPECT_TRUE(absl::StrContains(text, "swaserve_prefill_requests_total{result=\"cancelled\"} 1"))
      << text;
  EXPECT_TRUE(absl::StrContains(text, "swaserve_prefill_requests_total{result=\"error\"} 0"))
      << text;
  // Either way the computed prompt went into the prefix cache.
  ASSERT_TRUE(Submit("again", testing::RandomPrompt(8, 100), 2).ok());
  WaitDone("again");
  EXPECT_GT(Get("again").cached, 0);
}

// A prefill whose caller goes away mid-prompt (a client timeout, a router
// that died) leaves the chunks it computed in the prefix cache: the retry of
// the same prompt resumes there, and its KV — MTP layers included — and its
// output are those of a straight run. Without the keep, the retry computes
// the whole prompt again (cached 0).
TEST_F(Pipeline, ACancelledPrefillKeepsItsComputedChunksAndTheRetryResumesThere) {
  capture_kv_ = true;
  Start(4096, 4096);
  const int K = testing::TestEngine().config().num_mtp_layers;
  const std::vector<uint32_t> prompt = testing::RandomPrompt(41, 3000);
  const int n = static_cast<int>(prompt.size());
  ASSERT_TRUE(Submit("first", prompt, 4).ok());
  const int done_at_cancel = WaitProgress("first", 1000);
  ASSERT_GE(done_at_cancel, 1000) << "never saw the prefill a third of the way in";
  ASSERT_LT(done_at_cancel, n - 200) << "the prefill ran too far before the cancel";
  prefill_->Cancel("first");
  WaitFinished(1);
  ASSERT_TRUE(absl::IsCancelled(Get("first").prefill_status)) << Get("first").prefill_status;
  const PrefillLoad load = prefill_->GetLoad();
  EXPECT_EQ(load.partial_kept_total, 1);
  // At least what was done when it was cancelled (whole pages that every MTP
  // layer reached), at most the prompt.
  const int64_t kept = load.partial_kept_tokens_total;
  EXPECT_GE(kept, (done_at_cancel - K) / kPage * kPage);
  EXPECT_LT(kept, n);
  EXPECT_EQ(kept % kPage, 0);

  // A prompt ending just past the kept chunks: its shipped window covers
  // the resumption point, so every slot there is compared, the MTP layers'
  // included (kept only where every MTP layer had run, with the prompt's
  // own next tokens: a keep up to the last chunk's end fails this).
  const std::vector<uint32_t> head(prompt.begin(), prompt.begin() + kept + 6);
  ASSERT_TRUE(Submit("head", head, 4).ok());
  WaitDone("head");
  const Outcome h = Get("head");
  ASSERT_TRUE(h.prefill_status.ok()) << h.prefill_status;
  EXPECT_EQ(h.cached, kept) << "the retry did not resume where the cancelled prefill stopped";
  EXPECT_EQ(h.tokens, testing::ReferenceGreedy(head, 4));
  uint32_t first = 0;
  ASSERT_NE(h.kv, nullptr);
  ExpectSameKv(prefill_pools_->shape(), *h.kv, *StraightLineKv(head, &first),
               static_cast<int>(head.size()), "head");
  // The whole prompt again: resumes at least there, same output and KV.
  ASSERT_TRUE(Submit("retry", prompt, 4).ok());
  WaitDone("retry");
  const Outcome o = Get("retry");
  ASSERT_TRUE(o.prefill_status.ok()) << o.prefill_status;
  EXPECT_GE(o.cached, kept);
  EXPECT_EQ(o.tokens, testing::ReferenceGreedy(prompt, 4));
  ASSERT_NE(o.kv, nullptr);
  ExpectSameKv(prefill_pools_->shape(), *o.kv, *StraightLineKv(prompt, &first), n, "resumed");
  const std::string text = registry_->RenderText();
  EXPECT_TRUE(absl::StrContains(text, "swaserve_prefill_partial_kept_requests_total 1")) << text;
  EXPECT_TRUE(absl::StrContains(
      text, absl::StrCat("swaserve_prefill_partial_kept_tokens_total ", kept)))
      << text;
}

// The L3 tier at the engine level (issue 21): a prompt computed before a
// worker restart comes back from a warm file store after it, as a prefix
// hit, with the same greedy output.
TEST_F(Pipeline, L3FileStoreMakesARestartedWorkerWarm) {
  // Per process: CI runs this test in two builds at once, sharing TMPDIR.
  const std::string dir = ::testing::TempDir() + "/prefill_l3_restart_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  const std::vector<uint32_t> prompt = testing::RandomPrompt(91, 300);
  std::vector<uint32_t> before;
  int warm_hit = 0;
  {
    auto store = *kv::FilePageStore::Open({.dir = dir, .capacity_bytes = 64 << 20});
    l3_ = store.get();
    Start(256, 256);
    ASSERT_TRUE(Submit("a", prompt, 8).ok());
    WaitDone("a");
    before = Get("a").tokens;
    EXPECT_EQ(Get("a").cached, 0);
    ASSERT_TRUE(Submit("a2", prompt, 8).ok());  // the hit an L1 gives
    WaitDone("a2");
    warm_hit = Get("a2").cached;
    EXPECT_EQ(Get("a2").tokens, before);
    StopAll();
  }
  auto store = *kv::FilePageStore::Open({.dir = dir, .capacity_bytes = 64 << 20});
  l3_ = store.get();
  Start(256, 256);
  ASSERT_TRUE(Submit("b", prompt, 8).ok());
  WaitDone("b");
  const Outcome b = Get("b");
  EXPECT_EQ(b.tokens, before) << "the same greedy output from KV read back from L3";
  EXPECT_GT(warm_hit, 200);
  EXPECT_EQ(b.cached, warm_hit) << "the hit the worker gave before its restart";
  const PrefillLoad load = prefill_->GetLoad();
  EXPECT_EQ(load.l3_prefetch_hits, 1) << "misses " << load.l3_prefetch_misses << ", unused "
                                      << load.l3_prefetch_unused << ", timeouts "
                                      << load.l3_prefetch_timeouts;
  EXPECT_GT(load.l3_attached_pages, 0);
  // The restarted worker's tree was empty: the whole hit came from L3.
  EXPECT_EQ(load.l3_cached_tokens_total, b.cached);
  EXPECT_EQ(load.l1_cached_tokens_total + load.l2_cached_tokens_total, 0);
  StopAll();
}

// A prefill cut short leaves its chunks in L3 for a retry on another worker
// sharing the store (or this one restarted over it), in both ways it can end:
//   * cancel: the chunks are written through to L3 at once (the worker here
//     is then replaced WITHOUT its shutdown write-back);
//   * stop (a SIGTERM whose drain ran out): the worker writes its cache back
//     on shutdown.
// The new worker resumes from them, read back from L3, with the same greedy
// output.
TEST_F(Pipeline, APrefillCutShortLeavesItsChunksInL3ForTheRetry) {
  for (const bool stop : {false, true}) {
    SCOPED_TRACE(stop ? "stop" : "cancel");
    const std::string dir = ::testing::TempDir() + "/prefill_l3_cut_" +
                            std::to_string(getpid()) + (stop ? "_stop" : "_cancel");
    std::filesystem::remove_all(dir);
    const std::vector<uint32_t> prompt = testing::RandomPrompt(stop ? 92 : 93, 3000);
    int64_t kept = 0;
    int done = 0;
    {
      auto store = *kv::FilePageStore::Open({.dir = dir, .capacity_bytes = 64 << 20});
      l3_ = store.get();
      Start(4096, 4096);
      ASSERT_TRUE(Submit("a", prompt, 4).ok());
      done = WaitProgress("a", 1000);
      ASSERT_GE(done, 1000);
      if (stop) {
        prefill_->Stop();
      } else {
        prefill_->Cancel("a");
        WaitFinished(1);
      }
      EXPECT_TRUE(absl::IsCancelled(Get("a").prefill_status)) << Get("a").prefill_status;
      kept = prefill_->GetLoad().partial_kept_tokens_total;
      ASSERT_LT(kept, static_cast<int64_t>(prompt.size())) << "the prompt finished first";
      if (!stop) {
        EXPECT_GE(cache_->stats().l3_write_through_bound_pages.load(), kept / kPage);
        l3_ = nullptr;  // StopAll without the shutdown write-back
      }
      StopAll();
    }  // the store's destructor finishes its write queue
    EXPECT_GE(kept, done - testing::TestEngine().config().num_mtp_layers - kPage);
    auto store = *kv::FilePageStore::Open({.dir = dir, .capacity_bytes = 64 << 20});
    l3_ = store.get();
    Start(4096, 4096);
    ASSERT_TRUE(Submit("b", prompt, 4).ok());
    WaitDone("b");
    const Outcome b = Get("b");
    ASSERT_TRUE(b.prefill_status.ok()) << b.prefill_status;
    EXPECT_EQ(b.cached, kept) << "the new worker did not resume where the first one stood";
    EXPECT_EQ(b.tokens, testing::ReferenceGreedy(prompt, 4));
    EXPECT_EQ(prefill_->GetLoad().l3_cached_tokens_total, b.cached);
    StopAll();
    l3_ = nullptr;
    {
      absl::MutexLock lock(&mu_);
      out_.clear();
      finished_ = prefill_dones_ = 0;
    }
    std::filesystem::remove_all(dir);
  }
}

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

// A draining worker ends its long prefills itself a little before its drain
// deadline (EndAllForDrain): each keeps what it computed and writes it to L3,
// and its answer (the status given: the worker says DRAINING, so the router
// retries elsewhere) waits until those writes are stored, so that the retry
// on another worker sharing the store finds them. Here the store holds its
// writes until the test opens it: no answer before, the answer right after,
// and a new worker over the store resumes where the first one stood.
TEST_F(Pipeline, EndAllForDrainAnswersOnceTheKeptChunksAreInL3) {
  auto owned = std::make_unique<StalledStore>();
  StalledStore* stalled = owned.get();
  kv::AsyncPageStore store(std::move(owned));
  l3_ = &store;
  l3_max_wait_ms_ = 50;  // its own L3 probe stalls too: compute without it
  Start(4096, 4096);
  const std::vector<uint32_t> prompt = testing::RandomPrompt(94, 3000);
  ASSERT_TRUE(Submit("a", prompt, 4).ok());
  const int done = WaitProgress("a", 1000);
  ASSERT_GE(done, 1000);
  absl::Notification ended;
  std::thread drain([&] {
    prefill_->EndAllForDrain(absl::UnavailableError("draining"), absl::Seconds(60));
    ended.Notify();
  });
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_FALSE(Get("a").prefill_done) << "answered before its chunks were stored in L3";
  EXPECT_FALSE(ended.HasBeenNotified());
  EXPECT_GT(store.queued_bytes(), 0);
  stalled->Open();
  ASSERT_TRUE(ended.WaitForNotificationWithTimeout(absl::Seconds(60)));
  drain.join();
  EXPECT_EQ(store.queued_bytes(), 0);
  const Outcome a = Get("a");
  ASSERT_TRUE(a.prefill_done);
  EXPECT_TRUE(absl::IsUnavailable(a.prefill_status)) << a.prefill_status;
  // Handed back, not failed: no error of this worker's.
  const std::string text = registry_->RenderText();
  EXPECT_TRUE(absl::StrContains(text, "swaserve_prefill_requests_total{result=\"cancelled\"} 1"))
      << text;
  EXPECT_TRUE(absl::StrContains(text, "swaserve_prefill_requests_total{result=\"error\"} 0"))
      << text;
  const int64_t kept = prefill_->GetLoad().partial_kept_tokens_total;
  ASSERT_GE(kept, done - testing::TestEngine().config().num_mtp_layers - kPage);
  ASSERT_LT(kept, static_cast<int64_t>(prompt.size())) << "the prompt finished first";
  // Another worker over the same store (this one replaced without its
  // shutdown write-back): it resumes from L3.
  l3_ = nullptr;
  StopAll();
  l3_ = &store;
  Start(4096, 4096);
  ASSERT_TRUE(Submit("b", prompt, 4).ok());
  WaitDone("b");
  const Outcome b = Get("b");
  ASSERT_TRUE(b.prefill_status.ok()) << b.prefill_status;
  EXPECT_EQ(b.cached, kept);
  EXPECT_EQ(b.tokens, testing::ReferenceGreedy(prompt, 4));
  StopAll();
}

TEST_F(Pipeline, L3PrefetchPastItsWaitComputesWithoutIt) {
  // Behind AsyncPageStore as in a worker: write-backs queue, reads stall.
  auto owned = std::make_unique<StalledStore>();
  StalledStore* stalled = owned.get();
  kv::AsyncPageStore store(std::move(owned));
  l3_ = &store;
  l3_max_wait_ms_ = 50;
  Start(256, 256);
  const std::vector<uint32_t> prompt = testing::RandomPrompt(92, 300);
  ASSERT_TRUE(Submit("a", prompt, 4).ok());
  WaitDone("a");  // the request did not wait for the stalled prefetch
  EXPECT_EQ(Get("a").finish, FinishReason::kLength) << Get("a").error;
  EXPECT_EQ(Get("a").cached, 0);
  EXPECT_EQ(prefill_->GetLoad().l3_prefetch_timeouts, 1);
  stalled->Open();  // the late fetch lands (and write-backs proceed)
  StopAll();
}

// An L3 store whose next read takes `delay` once armed (a remote store
// under load).
class SlowStore final : public kv::PageStore {
 public:
  absl::Status Put(const kv::PageKey& k, absl::Span<const uint8_t> b) override {
    return inner_.Put(k, b);
  }
  absl::Status Get(const kv::PageKey& k, absl::Span<uint8_t> out) override {
    absl::Duration d;
    {
      absl::MutexLock lock(&mu_);
      std::swap(d, delay_);
    }
    absl::SleepFor(d);
    return inner_.Get(k, out);
  }
  bool Contains(const kv::PageKey& k) override { return inner_.Contains(k); }
  void Erase(const kv::PageKey& k) override { inner_.Erase(k); }
  std::string_view backend() const override { return "slow"; }
  const kv::PageStoreStats& stats() const override { return inner_.stats(); }
  void Arm(absl::Duration delay) {
    absl::MutexLock lock(&mu_);
    delay_ = delay;
  }

 private:
  kv::MemoryPageStore inner_{64 << 20};
  absl::Mutex mu_;
  absl::Duration delay_ ABSL_GUARDED_BY(mu_);
};

// The wait for a prefetch grows with what it may save (L3PrefetchWait): a
// 400 ms fetch of a ~300-token prefix is waited for when computing it would
// take longer (here an assumed 100 tokens/s: ~1.4 s of wait allowed), and
// given up at the 50 ms floor with the fraction 0 (the old fixed wait).
TEST_F(Pipeline, AnL3PrefetchIsWaitedForInProportionToWhatItSaves) {
  auto store = std::make_unique<SlowStore>();
  const std::vector<uint32_t> prompt = testing::RandomPrompt(95, 300);
  for (const double fraction : {0.5, 0.0}) {
    SCOPED_TRACE(absl::StrCat("fraction ", fraction));
    l3_ = store.get();
    l3_max_wait_ms_ = 50;
    l3_wait_fraction_ = fraction;
    l3_assumed_rate_ = 100;
    Start(256, 256);
    ASSERT_TRUE(Submit("w", prompt, 4).ok());
    WaitDone("w");
    StopAll();  // writes the cache back to L3: a restarted worker finds it there
    Start(256, 256);
    store->Arm(absl::Milliseconds(400));
    ASSERT_TRUE(Submit("r", prompt, 4).ok());
    WaitDone("r");
    const PrefillLoad load = prefill_->GetLoad();
    if (fraction > 0) {
      EXPECT_GT(Get("r").cached, 200) << "the prefetch was not waited for";
      EXPECT_EQ(load.l3_prefetch_hits, 1);
      EXPECT_EQ(load.l3_prefetch_timeouts, 0);
    } else {
      EXPECT_EQ(Get("r").cached, 0);
      EXPECT_EQ(load.l3_prefetch_timeouts, 1);
    }
    StopAll();
    absl::MutexLock lock(&mu_);
    out_.clear();
    finished_ = prefill_dones_ = 0;
  }
}

TEST(L3PrefetchWaitTest, GrowsWithTheTokensAtStakeOverTheRate) {
  PrefillCoreOptions o;  // floor 200 ms, fraction 0.5, assumed 2,000 tokens/s
  EXPECT_EQ(L3PrefetchWait(o, 0, 0), absl::Milliseconds(200));
  EXPECT_EQ(L3PrefetchWait(o, 400, 0), absl::Milliseconds(200));  // 100 ms < floor
  EXPECT_EQ(L3PrefetchWait(o, 54000, 0), absl::Milliseconds(13500));  // assumed rate
  EXPECT_EQ(L3PrefetchWait(o, 54000, 27000), absl::Seconds(1));  // measured rate wins
  o.l3_prefetch_wait_fraction = 0;
  EXPECT_EQ(L3PrefetchWait(o, 54000, 0), absl::Milliseconds(200));  // the floor alone
}

// A prompt evicted from L1 into L2 comes back by an asynchronous load-back:
// the copies run on the copier thread while the loop goes on, the request
// (and one sharing its prefix, submitted with it) starts only when they are
// done, and the greedy outputs are those of the cold runs.
TEST_F(Pipeline, AsyncL2LoadBackKeepsGreedyOutputs) {
  with_l2_ = true;
  async_load_back_min_bytes_ = 0;  // every load-back on the copier thread
  // L1: two 300-token prompts (75 pages each) and a bit: the others push a
  // out, and a's load-back fits beside the one still finishing.
  Start(/*prefill_pages=*/200, /*decode_pages=*/256);
  const std::vector<uint32_t> a = testing::RandomPrompt(93, 300);
  std::vector<uint32_t> a_longer = a;
  for (uint32_t t : testing::RandomPrompt(94, 40)) a_longer.push_back(t);
  ASSERT_TRUE(Submit("a", a, 6).ok());
  WaitDone("a");
  ASSERT_TRUE(Submit("a_longer", a_longer, 6).ok());
  WaitDone("a_longer");
  for (int i = 0; i < 3; ++i) {  // push a out of L1 into L2
    const std::string id = "other" + std::to_string(i);
    ASSERT_TRUE(Submit(id, testing::RandomPrompt(95 + i, 300), 2).ok());
    WaitDone(id);
  }
  ASSERT_GT(cache_->Match(base::ChainedPageHashes(a, testing::kPage)).lower_tier_tokens, 200)
      << "the test needs a's prefix in L2";
  ASSERT_TRUE(Submit("a2", a, 6).ok());
  ASSERT_TRUE(Submit("a_longer2", a_longer, 6).ok());
  WaitDone("a2");
  WaitDone("a_longer2");
  EXPECT_EQ(Get("a2").tokens, Get("a").tokens);
  EXPECT_EQ(Get("a_longer2").tokens, Get("a_longer").tokens);
  EXPECT_GT(Get("a2").cached, 200);
  EXPECT_GT(Get("a_longer2").cached, 200);
  const PrefillLoad load = prefill_->GetLoad();
  EXPECT_GE(load.async_load_backs, 1);
  EXPECT_EQ(load.sync_load_backs, 0);
  // a2's hit came from L2 (a_longer2's a-part may count as L1: a2's
  // load-back had put it there, loading, when a_longer2 was matched).
  EXPECT_GE(load.l2_cached_tokens_total, Get("a2").cached);
  EXPECT_EQ(load.l3_cached_tokens_total, 0);
  EXPECT_EQ(load.l1_cached_tokens_total + load.l2_cached_tokens_total, load.cached_tokens_total);
  EXPECT_EQ(cache_->pending_load_backs(), 0);
}

}  // namespace
}  // namespace swaserve::worker

namespace swaserve::worker {
namespace {

// Issue 23: a job's multimodal placeholders take the given embeddings (the
// output equals a prompt whose placeholders are the tokens those embeddings
// are the table rows of), and the item's content hash keys the prefix cache:
// the same image hits through it, another image only up to it.
TEST_F(Pipeline, MultimodalEmbeddingsArePlacedAndKeyTheCache) {
  Start(256, 256);
  const int H = testing::TestEngine().config().hidden_size;
  const int at = 90, len = 24;  // inside the last tokens' SWA windows too
  std::vector<uint32_t> prompt = testing::RandomPrompt(2301, 120);
  for (int i = at; i < at + len; ++i) prompt[i] = 7;  // the placeholder id
  auto image = [&](uint64_t seed, std::vector<uint32_t>* substituted) {
    const std::vector<uint32_t> rows = testing::RandomPrompt(seed, len);
    auto e = std::make_shared<std::vector<float>>(static_cast<size_t>(len) * H);
    for (int j = 0; j < len; ++j) {
      testing::TestEngine().engine().Embedding(rows[j], e->data() + static_cast<size_t>(j) * H);
    }
    *substituted = prompt;
    std::copy(rows.begin(), rows.end(), substituted->begin() + at);
    return PrefillMultimodal{.span = {.token_offset = at, .num_tokens = len,
                                      .content = base::Hash128Of(absl::StrCat("image", seed))},
                             .embeddings = std::move(e)};
  };
  std::vector<uint32_t> as_tokens_a, as_tokens_b;
  const PrefillMultimodal a = image(1, &as_tokens_a);
  const PrefillMultimodal b = image(2, &as_tokens_b);
  ASSERT_TRUE(Submit("tokens_a", as_tokens_a, 6).ok());
  ASSERT_TRUE(Submit("tokens_b", as_tokens_b, 6).ok());
  WaitFinished(2);
  ASSERT_TRUE(Submit("image_a", prompt, 6, {a}).ok());
  WaitFinished(3);
  {  // its prefill leg done too: its pages are in the cache (the decode leg
     // may finish first)
    absl::MutexLock lock(&mu_);
    auto done = [&] { return out_["image_a"].prefill_done; };
    ASSERT_TRUE(mu_.AwaitWithTimeout(absl::Condition(&done), absl::Seconds(60)));
  }
  ASSERT_TRUE(Submit("image_a_again", prompt, 6, {a}).ok());
  ASSERT_TRUE(Submit("image_b", prompt, 6, {b}).ok());
  WaitFinished(5);
  const Outcome ta = Get("tokens_a"), tb = Get("tokens_b");
  ASSERT_EQ(ta.tokens.size(), 6u);
  EXPECT_NE(ta.tokens, tb.tokens);  // the images matter
  EXPECT_EQ(Get("image_a").tokens, ta.tokens);
  EXPECT_EQ(Get("image_a_again").tokens, ta.tokens);
  EXPECT_EQ(Get("image_b").tokens, tb.tokens);
  // Cache: image_a shares no page with tokens_a from the image's page on
  // (different keys), image_a_again hits through the image, image_b at most
  // the pages before it (a mid-prompt hit also needs its SWA window, which
  // the cache keeps only at prompt ends: 0 here).
  EXPECT_LE(Get("image_a").cached, at);
  EXPECT_GE(Get("image_a_again").cached, at + len);
  EXPECT_LE(Get("image_b").cached, at);
  // Malformed items are refused at Submit.
  auto bad = [&](std::vector<PrefillMultimodal> mm) {
    return Submit("bad" + std::to_string(mm.size()), prompt, 2, std::move(mm)).code();
  };
  PrefillMultimodal overlapping = b;
  overlapping.span.token_offset = at + 4;
  EXPECT_EQ(bad({a, overlapping}), absl::StatusCode::kInvalidArgument);
  PrefillMultimodal outside = a;
  outside.span.token_offset = 110;
  EXPECT_EQ(bad({outside}), absl::StatusCode::kInvalidArgument);
  PrefillMultimodal short_rows = a;
  short_rows.embeddings = std::make_shared<std::vector<float>>(static_cast<size_t>(H));
  EXPECT_EQ(bad({short_rows}), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace swaserve::worker
