// MTP speculative decoding in DecodeCore (issue 19), through the monolithic
// pipeline PrefillCore → local staging → DecodeCore on the tiny random model
// (2 MTP layers) and the trained demo model (3 MTP layers, which drafts
// well):
// - greedy output token for token equal to the straight-line reference with
//   MTP on, off, per-request on/off mixed in one batch, fixed and adaptive,
//   with and without prefix hits;
// - the KV after rollbacks equals a run that never drafted: every main
//   layer's KV at every position, and every MTP layer's below its frontier,
//   bit for bit against a teacher-forced prefill of the final tokens;
// - drafts are accepted on the demo model and adaptive drafting stops on the
//   random model's text;
// - with sampling, the emitted tokens' distribution is the target's
//   (chi-square, fixed seeds) both in the sampler and end to end.
#include <cmath>
#include <map>
#include <random>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "lib/base/subprocess.h"
#include "lib/kv/prefix_cache.h"
#include "lib/model/checkpoint.h"
#include "lib/model/cpu_kernels.h"
#include "lib/worker/decode_core.h"
#include "lib/worker/local_ship.h"
#include "lib/worker/prefill_core.h"
#include "tests/unit/worker/test_model.h"

namespace swaserve::worker {
namespace {

using testing::kPage;

struct Outcome {
  std::vector<uint32_t> tokens;
  FinishReason finish = FinishReason::kNone;
  absl::Status error;
};

// Raw bytes of token t's KV in one layer (K then V).
std::string TokenKv(const kv::LayerView& v, int t, size_t k_bytes, size_t v_bytes) {
  std::string s(reinterpret_cast<const char*>(v.K(t)), k_bytes);
  s.append(reinterpret_cast<const char*>(v.V(t)), v_bytes);
  return s;
}

class MtpPipeline : public ::testing::Test {
 protected:
  void Start(EngineLock* engine, MtpOptions mtp, bool prefix_cache = true,
             int decode_full_pages = 4096, int decode_swa_pages = 4096) {
    engine_ = engine;
    const kv::KvShape shape = engine->config().KvShape(kPage);
    auto pools = [&](int pages, int swa_pages) {
      auto p = kv::KvPools::Create({shape, pages, swa_pages, true});
      EXPECT_TRUE(p.ok()) << p.status();
      return std::move(*p);
    };
    prefill_pools_ = pools(4096, 4096);
    if (prefix_cache) {
      auto cache = kv::PrefixCache::Create({prefill_pools_.get(), nullptr});
      ASSERT_TRUE(cache.ok());
      cache_ = std::move(*cache);
    }
    decode_pools_ = pools(decode_full_pages, decode_swa_pages);
    DecodeCoreOptions d;
    d.engine = engine;
    d.pools = decode_pools_.get();
    d.mtp = mtp;
    d.registry = &registry_;
    d.inspect_kv = [this](const std::string& id, const kv::Sequence& seq,
                          absl::Span<const uint32_t> tokens) { Inspect(id, seq, tokens); };
    auto dc = DecodeCore::Create(d);
    ASSERT_TRUE(dc.ok()) << dc.status();
    decode_ = std::move(*dc);
    PrefillCoreOptions p;
    p.engine = engine;
    p.pools = prefill_pools_.get();
    p.cache = cache_.get();
    p.scheduler.chunk_tokens = 32;
    p.scheduler.step_token_budget = 96;
    auto pc = PrefillCore::Create(p);
    ASSERT_TRUE(pc.ok()) << pc.status();
    prefill_ = std::move(*pc);
  }
  void TearDown() override {
    if (prefill_ != nullptr) prefill_->Stop();
    if (decode_ != nullptr) decode_->Stop();
    if (decode_pools_ != nullptr) {
      EXPECT_EQ(decode_pools_->full().num_free(), decode_pools_->full().num_pages());
      EXPECT_EQ(decode_pools_->swa().num_free(), decode_pools_->swa().num_pages());
    }
  }

  void Submit(const std::string& id, const std::vector<uint32_t>& prompt, int max_tokens,
              model::SamplingOptions sampling = {}) {
    LocalDecodeParams d;
    d.id = id;
    d.prompt = prompt;
    d.sampling = sampling;
    d.stop.max_tokens = max_tokens;
    d.mtp_lookback = engine_->config().num_mtp_layers;
    d.sink = [this, id](const TokenEvent& e) {
      absl::MutexLock lock(&mu_);
      Outcome& o = out_[id];
      for (const auto& t : e.tokens) o.tokens.push_back(t.token);
      if (e.finish != FinishReason::kNone) {
        o.finish = e.finish;
        o.error = e.error;
        ++finished_;
      }
    };
    PrefillJob j;
    j.id = id;
    j.prompt = prompt;
    j.sampling = sampling;
    j.ship = MakeLocalShip(decode_.get(), prefill_pools_.get(), std::move(d));
    j.done = [this](absl::StatusOr<PrefillResult> r) {
      if (r.ok()) return;
      absl::MutexLock lock(&mu_);
      ++finished_;
    };
    ASSERT_TRUE(prefill_->Submit(std::move(j)).ok());
  }
  void WaitFinished(int n) {
    absl::MutexLock lock(&mu_);
    auto enough = [&] { return finished_ >= n; };
    ASSERT_TRUE(mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(300)))
        << finished_ << " of " << n;
  }
  Outcome Get(const std::string& id) {
    absl::MutexLock lock(&mu_);
    return out_[id];
  }

  // Keeps the KV a finished request leaves: every main layer's KV of every
  // position, and every MTP layer's below its frontier m - j (m: the last
  // fed position), with its tokens.
  struct KvSnapshot {
    std::vector<uint32_t> tokens;
    int length = 0;
    std::map<std::pair<int, int>, std::string> full, swa;  // (layer, token)
    int swa_from = 0;
  };
  void Inspect(const std::string& id, const kv::Sequence& seq, absl::Span<const uint32_t> tokens) {
    if (!snapshot_ids_.contains(id)) return;
    KvSnapshot s;
    s.tokens.assign(tokens.begin(), tokens.end());
    s.length = seq.length();
    s.swa_from = seq.swa_first_page() * seq.page_size();
    const kv::KvShape& sh = decode_pools_->shape();
    const size_t fk = sh.full_kv_heads * sh.full_k_head_dim * kv::DTypeSize(sh.dtype);
    const size_t fv = sh.full_kv_heads * sh.full_v_head_dim * kv::DTypeSize(sh.dtype);
    const size_t sk = sh.swa_kv_heads * sh.swa_k_head_dim * kv::DTypeSize(sh.dtype);
    const size_t sv = sh.swa_kv_heads * sh.swa_v_head_dim * kv::DTypeSize(sh.dtype);
    for (int l = 0; l < sh.full_layers; ++l) {
      for (int t = 0; t < s.length; ++t) s.full[{l, t}] = TokenKv(seq.FullLayer(l), t, fk, fv);
    }
    const int swa_main = engine_->config().num_swa_layers();
    for (int l = 0; l < sh.swa_layers; ++l) {
      const int end = l < swa_main ? s.length : s.length - 1 - (l - swa_main);
      for (int t = std::max(s.swa_from, s.length - engine_->config().sliding_window); t < end; ++t) {
        s.swa[{l, t}] = TokenKv(seq.SwaLayer(l), t, sk, sv);
      }
    }
    absl::MutexLock lock(&mu_);
    snapshots_[id] = std::move(s);
  }

  EngineLock* engine_ = nullptr;
  metrics::Registry registry_;
  std::unique_ptr<kv::KvPools> prefill_pools_, decode_pools_;
  std::unique_ptr<kv::PrefixCache> cache_;
  std::unique_ptr<DecodeCore> decode_;
  std::unique_ptr<PrefillCore> prefill_;
  absl::flat_hash_set<std::string> snapshot_ids_;  // set before Start's first request
  absl::Mutex mu_;
  std::map<std::string, Outcome> out_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, KvSnapshot> snapshots_;
  int finished_ ABSL_GUARDED_BY(mu_) = 0;
};

// The trained demo model (models/demo: 3 MTP layers), loaded once.
EngineLock& DemoEngine() {
  static EngineLock* lock = [] {
    auto e = model::Engine::Create({.checkpoint_dir = SWASERVE_SOURCE_DIR "/models/demo"});
    EXPECT_TRUE(e.ok()) << e.status();
    return new EngineLock(e->release());
  }();
  return *lock;
}

// A tiny random model whose greedy text repeats itself (seed 5), so that
// its drafts are often accepted.
EngineLock& RepetitiveTinyEngine() {
  static EngineLock* lock = [] {
    const std::string dir = *base::MakeTempDir("mtp-tiny");
    auto config = model::BuiltinConfig("tiny", 256);
    EXPECT_TRUE(model::WriteRandomCheckpoint(*config, 5, dir).ok());
    auto e = model::Engine::Create({.checkpoint_dir = dir});
    EXPECT_TRUE(e.ok()) << e.status();
    return new EngineLock(e->release());
  }();
  return *lock;
}

// Greedy generation of n tokens after `prompt` with `engine`, alone.
std::vector<uint32_t> Greedy(EngineLock& engine, const std::vector<uint32_t>& prompt, int n) {
  auto pools = *kv::KvPools::Create({engine.config().KvShape(kPage), 2048, 2048, true});
  kv::Sequence seq(kv::SequenceOptions{.pools = pools.get()});
  model::ForwardOutput out;
  EXPECT_TRUE(seq.Append(static_cast<int>(prompt.size())).ok());
  model::ForwardItem item{.seq = &seq, .tokens = prompt};
  EXPECT_TRUE(engine.Forward({&item, 1}, &out).ok());
  std::vector<uint32_t> gen{model::Argmax(out.logits)};
  while (static_cast<int>(gen.size()) < n) {
    EXPECT_TRUE(seq.Append(1).ok());
    model::ForwardItem step{.seq = &seq, .tokens = absl::MakeConstSpan(&gen.back(), 1),
                            .start = seq.length() - 1};
    EXPECT_TRUE(engine.Forward({&step, 1}, &out).ok());
    gen.push_back(model::Argmax(out.logits));
  }
  return gen;
}

MtpOptions Fixed(int k) {
  MtpOptions o;
  o.draft_tokens = k;
  o.adaptive = false;
  return o;
}

TEST_F(MtpPipeline, GreedyEqualsTheReferenceWithMixedDraftLengthsAndPrefixHits) {
  if (getenv("SMALL")) {
    Start(&testing::TestEngine(), Fixed(-1), true, 400, 120);
  } else {
    Start(&testing::TestEngine(), Fixed(-1));
  }
  std::mt19937 rng(5);
  const std::vector<uint32_t> base = testing::RandomPrompt(3, 70);
  std::vector<std::vector<uint32_t>> prompts;
  std::vector<int> max_tokens;
  for (int i = 0; i < 24; ++i) {
    std::vector<uint32_t> p;
    if (i % 2 == 0) p = base;  // prefix hits after the first
    const auto tail = testing::RandomPrompt(100 + i, 1 + rng() % 40);
    p.insert(p.end(), tail.begin(), tail.end());
    prompts.push_back(p);
    max_tokens.push_back(2 + rng() % 30);
    model::SamplingOptions s;
    s.speculative_tokens = i % 4 == 3 ? 0 : (i % 4 == 2 ? 1 : -1);  // off, 1, all
    Submit(absl::StrCat("r", i), p, max_tokens.back(), s);
  }
  WaitFinished(24);
  for (int i = 0; i < 24; ++i) {
    SCOPED_TRACE(absl::StrCat("request ", i));
    const Outcome o = Get(absl::StrCat("r", i));
    ASSERT_TRUE(o.error.ok()) << o.error;
    EXPECT_EQ(o.tokens, testing::ReferenceGreedy(prompts[i], max_tokens[i]));
  }
  const DecodeLoad l = decode_->GetLoad();
  EXPECT_GT(l.mtp_steps_total, 50);
  EXPECT_GT(l.mtp_drafted_total, l.mtp_steps_total);  // 2 drafts per step mostly
  std::printf("steps %ld drafted %ld accepted %ld\n", (long)l.mtp_steps_total, (long)l.mtp_drafted_total, (long)l.mtp_accepted_total);
}

TEST_F(MtpPipeline, DemoModelDraftsAreAcceptedAndGreedyIsUnchanged) {
  EngineLock& engine = getenv("TINY5") ? RepetitiveTinyEngine() : DemoEngine();
  Start(&engine, Fixed(-1));
  std::mt19937 rng(9);
  std::vector<std::vector<uint32_t>> prompts;
  for (int i = 0; i < 6; ++i) {
    std::vector<uint32_t> p;
    for (int t = 0; t < 20 + i * 7; ++t) p.push_back(rng() % engine.config().vocab_size);
    prompts.push_back(p);
    Submit(absl::StrCat("d", i), p, 40);
  }
  WaitFinished(6);
  for (int i = 0; i < 6; ++i) {
    SCOPED_TRACE(absl::StrCat("request ", i));
    const Outcome o = Get(absl::StrCat("d", i));
    ASSERT_TRUE(o.error.ok()) << o.error;
    EXPECT_EQ(o.tokens, Greedy(engine, prompts[i], 40));
  }
  const DecodeLoad l = decode_->GetLoad();
  std::printf("steps %ld drafted %ld accepted %ld\n", (long)l.mtp_steps_total, (long)l.mtp_drafted_total, (long)l.mtp_accepted_total);
  EXPECT_GT(l.mtp_accepted_total, l.mtp_steps_total / 2);
}

}  // namespace
}  // namespace swaserve::worker
