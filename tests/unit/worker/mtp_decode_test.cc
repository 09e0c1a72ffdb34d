// MTP speculative decoding in DecodeCore, through the monolithic
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
  int cached = 0;
  // TokenEvent's MTP counts as the last event said (cumulative).
  int drafted = 0;
  int accepted = 0;
  bool counts_monotone = true;
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
    // A test may start several pipelines: the old one goes first, users of
    // the pools before the pools.
    prefill_.reset();
    decode_.reset();
    cache_.reset();
    prefill_pools_.reset();
    decode_pools_.reset();
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
                          absl::Span<const uint32_t> tokens,
                          const MtpState* mtp) { Inspect(id, seq, tokens, mtp); };
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
      o.counts_monotone &= e.draft_tokens >= o.drafted && e.accepted_draft_tokens >= o.accepted &&
                           e.accepted_draft_tokens <= e.draft_tokens;
      o.drafted = e.draft_tokens;
      o.accepted = e.accepted_draft_tokens;
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
  void Inspect(const std::string& id, const kv::Sequence& seq, absl::Span<const uint32_t> tokens,
               const MtpState* mtp) {
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
      // MTP layer j is exact below its frontier.
      const int end = l < swa_main ? s.length
                      : mtp != nullptr && mtp->active() ? mtp->frontier(l - swa_main)
                                                         : 0;
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
  std::map<std::string, KvSnapshot> snapshots_ ABSL_GUARDED_BY(mu_);
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

// Greedy generation of n tokens after `prompt` with `engine`, alone.
[[maybe_unused]] std::vector<uint32_t> Greedy(EngineLock& engine, const std::vector<uint32_t>& prompt, int n) {
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

#ifndef SWASERVE_MTP_STATISTICS  // the unit tests (label decode;unit)

// Drafts from a learnt draft vocabulary: on the demo model, a quarter of its
// 4,096 tokens, built early and rebuilt as the run goes. Greedy output is
// token for token the whole-vocabulary run's, and the drafts are accepted
// nearly as often (the tokens the model emits are the ones it drafts).
TEST_F(MtpPipeline, GreedyIsUnchangedWithADraftVocabulary) {
  EngineLock& engine = DemoEngine();
  std::mt19937 rng(12);
  std::vector<std::vector<uint32_t>> prompts;
  for (int i = 0; i < 12; ++i) {
    std::vector<uint32_t> p;
    for (int t = 0; t < 10 + i * 5; ++t) p.push_back(rng() % engine.config().vocab_size);
    prompts.push_back(p);
  }
  std::vector<std::vector<uint32_t>> outs[2];
  DecodeLoad loads[2];
  for (int arm = 0; arm < 2; ++arm) {
    {
      absl::MutexLock lock(&mu_);
      out_.clear();
      finished_ = 0;
    }
    MtpOptions o = Fixed(-1);
    o.draft_vocab_tokens = arm == 0 ? 0 : 1024;
    o.draft_vocab_first_tokens = 64;
    Start(&engine, o);
    for (int i = 0; i < 12; ++i) Submit(absl::StrCat("v", i), prompts[i], 40);
    WaitFinished(12);
    for (int i = 0; i < 12; ++i) {
      const Outcome got = Get(absl::StrCat("v", i));
      ASSERT_TRUE(got.error.ok()) << got.error;
      outs[arm].push_back(got.tokens);
    }
    loads[arm] = decode_->GetLoad();
    prefill_->Stop();
    decode_->Stop();
  }
  for (int i = 0; i < 12; ++i) EXPECT_EQ(outs[1][i], outs[0][i]) << "request " << i;
  EXPECT_EQ(loads[0].mtp_draft_vocab_builds_total, 0);
  EXPECT_GE(loads[1].mtp_draft_vocab_builds_total, 2);
  EXPECT_EQ(loads[1].mtp_draft_vocab_tokens, 1024);
  const double acc[2] = {
      static_cast<double>(loads[0].mtp_accepted_total) / loads[0].mtp_drafted_total,
      static_cast<double>(loads[1].mtp_accepted_total) / loads[1].mtp_drafted_total};
  std::printf("draft acceptance: whole vocabulary %.3f, draft vocabulary %.3f (%lld builds)\n",
              acc[0], acc[1], static_cast<long long>(loads[1].mtp_draft_vocab_builds_total));
  EXPECT_GT(acc[0], 0.3);
  EXPECT_GT(acc[1], 0.8 * acc[0]);
}

// Roomy decode pools, then pools small enough that requests are preempted
// (their MTP state restarts after the recompute) and drafts must give way
// to pages. The small pool holds two of the longest requests (prompt +
// generation: ~18 pages each) and no third, so preemption does not depend
// on how many requests prefill hands over at once (120 pages needed ~7 at
// once, which a slower prefill on a busy CI machine once did not reach).
TEST_F(MtpPipeline, GreedyEqualsTheReferenceWithMixedDraftLengthsAndPrefixHits) {
  for (const auto& [full_pages, swa_pages] : {std::pair{4096, 4096}, std::pair{48, 100}}) {
    SCOPED_TRACE(absl::StrCat(full_pages, " full and ", swa_pages, " SWA decode pages"));
    {
      absl::MutexLock lock(&mu_);
      out_.clear();
      finished_ = 0;
    }
    Start(&testing::TestEngine(), Fixed(-1), true, full_pages, swa_pages);
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
      // Small pools: long generations, so that running requests outgrow them.
      max_tokens.push_back(full_pages == 48 ? 50 + rng() % 30 : 2 + rng() % 30);
      model::SamplingOptions s;
      s.speculative_tokens = i % 4 == 3 ? 0 : (i % 4 == 2 ? 1 : -1);  // off, 1, all
      Submit(absl::StrCat("r", i), p, max_tokens.back(), s);
    }
    WaitFinished(24);
    int64_t drafted = 0, accepted = 0;
    for (int i = 0; i < 24; ++i) {
      SCOPED_TRACE(absl::StrCat("request ", i));
      const Outcome o = Get(absl::StrCat("r", i));
      ASSERT_TRUE(o.error.ok()) << o.error;
      EXPECT_EQ(o.tokens, testing::ReferenceGreedy(prompts[i], max_tokens[i]));
      // Each request's own draft counts (what usage reports), preemptions
      // and all: cumulative, none where it asked for no drafts.
      EXPECT_TRUE(o.counts_monotone);
      if (i % 4 == 3) EXPECT_EQ(o.drafted, 0);
      drafted += o.drafted;
      accepted += o.accepted;
    }
    const DecodeLoad l = decode_->GetLoad();
    EXPECT_EQ(drafted, l.mtp_drafted_total);
    EXPECT_EQ(accepted, l.mtp_accepted_total);
    EXPECT_GT(l.mtp_steps_total, 50);
    EXPECT_GT(l.mtp_drafted_total, l.mtp_steps_total);  // 2 drafts per step mostly
    if (full_pages == 48) {
      EXPECT_GT(l.preempted_total, 0);
    }
    prefill_->Stop();
    decode_->Stop();
  }
}

TEST_F(MtpPipeline, DemoModelDraftsAreAcceptedAndGreedyIsUnchanged) {
  EngineLock& engine = DemoEngine();
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
  EXPECT_GT(l.mtp_accepted_total, l.mtp_steps_total / 2);
}

// Teacher-forced KV of `tokens`' first `length` positions in fresh pools:
// the main model over them in one forward, then each MTP layer over every
// position whose input token is known (as prefill runs them).
struct ReferenceKv {
  std::unique_ptr<kv::KvPools> pools;
  std::unique_ptr<kv::Sequence> seq;
};
ReferenceKv TeacherForced(EngineLock& engine, const std::vector<uint32_t>& tokens, int length) {
  ReferenceKv r;
  r.pools = *kv::KvPools::Create({engine.config().KvShape(kPage), 1024, 1024, true});
  r.seq = std::make_unique<kv::Sequence>(kv::SequenceOptions{.pools = r.pools.get()});
  EXPECT_TRUE(r.seq->Append(length).ok());
  model::ForwardOutput out;
  model::ForwardItem item{.seq = r.seq.get(), .tokens = absl::MakeConstSpan(tokens).first(length)};
  EXPECT_TRUE(engine.Forward({&item, 1}, &out, /*keep_all_hidden=*/true).ok());
  std::vector<float> hidden = out.all_hidden;
  const int H = engine.config().hidden_size;
  for (int j = 0; j < engine.config().num_mtp_layers; ++j) {
    const int n = static_cast<int>(tokens.size()) - 1 - j;  // p + j + 1 < tokens.size()
    const int rows = std::min(n, length);
    std::vector<uint32_t> t(tokens.begin() + j + 1, tokens.begin() + j + 1 + rows);
    model::ForwardItem m{.seq = r.seq.get(), .tokens = t, .no_logits = true};
    EXPECT_TRUE(engine.ForwardMtp(j, {&m, 1}, absl::MakeConstSpan(hidden).first(rows * H), &out).ok());
    hidden = out.all_hidden;
  }
  return r;
}

void ExpectKvEqualsTeacherForced(EngineLock& engine, const kv::KvShape& sh,
                                 const std::map<std::pair<int, int>, std::string>& full,
                                 const std::map<std::pair<int, int>, std::string>& swa,
                                 const std::vector<uint32_t>& tokens, int length) {
  ReferenceKv ref = TeacherForced(engine, tokens, length);
  const size_t es = kv::DTypeSize(sh.dtype);
  int compared = 0, mtp_compared = 0;
  for (const auto& [key, bytes] : full) {
    const std::string want = TokenKv(ref.seq->FullLayer(key.first), key.second,
                                     sh.full_kv_heads * sh.full_k_head_dim * es,
                                     sh.full_kv_heads * sh.full_v_head_dim * es);
    ASSERT_EQ(bytes, want) << "full layer " << key.first << " token " << key.second;
    ++compared;
  }
  for (const auto& [key, bytes] : swa) {
    const std::string want = TokenKv(ref.seq->SwaLayer(key.first), key.second,
                                     sh.swa_kv_heads * sh.swa_k_head_dim * es,
                                     sh.swa_kv_heads * sh.swa_v_head_dim * es);
    ASSERT_EQ(bytes, want) << "SWA pool layer " << key.first << " token " << key.second;
    ++compared;
    if (key.first >= engine.config().num_swa_layers()) ++mtp_compared;
  }
  EXPECT_GT(compared, 100);
  EXPECT_GT(mtp_compared, 10);
}

TEST_F(MtpPipeline, KvAfterRollbacksEqualsARunThatNeverDrafted) {
  for (EngineLock* engine : {&DemoEngine(), &testing::TestEngine()}) {
    SCOPED_TRACE(engine == &DemoEngine() ? "demo model" : "tiny model");
    TearDown();
    snapshot_ids_ = {"k0", "k1", "k2"};
    {
      absl::MutexLock lock(&mu_);
      out_.clear();
      snapshots_.clear();
      finished_ = 0;
    }
    Start(engine, Fixed(-1));
    std::mt19937 rng(21);
    for (int i = 0; i < 3; ++i) {
      std::vector<uint32_t> p;
      for (int t = 0; t < 30 + 25 * i; ++t) p.push_back(rng() % engine->config().vocab_size);
      Submit(absl::StrCat("k", i), p, 50 + 10 * i);
    }
    WaitFinished(3);
    const DecodeLoad l = decode_->GetLoad();
    EXPECT_GT(l.mtp_drafted_total, l.mtp_accepted_total);  // rollbacks happened
    for (int i = 0; i < 3; ++i) {
      absl::MutexLock lock(&mu_);
      const KvSnapshot& s = snapshots_.at(absl::StrCat("k", i));
      ASSERT_EQ(s.length + 1, static_cast<int>(s.tokens.size()));
      ExpectKvEqualsTeacherForced(*engine, decode_pools_->shape(), s.full, s.swa, s.tokens,
                                  s.length);
    }
    prefill_->Stop();
    decode_->Stop();
  }
}

#else  // the statistics test (its own binary, label decode;model)

// Two-sample chi-square homogeneity of the token at one output position,
// MTP off against on; cells with fewer than 10 expected draws pooled. True
// when below the 0.9999 quantile (Wilson–Hilferty).
bool SameDistribution(const std::map<uint32_t, int>& a, const std::map<uint32_t, int>& b,
                      std::string* why) {
  std::map<uint32_t, std::pair<double, double>> cells;
  double na = 0, nb = 0;
  for (const auto& [t, c] : a) cells[t].first += c, na += c;
  for (const auto& [t, c] : b) cells[t].second += c, nb += c;
  std::vector<std::pair<double, double>> pooled(1, {0, 0});
  for (const auto& [t, c] : cells) {
    if ((c.first + c.second) * std::min(na, nb) / (na + nb) < 10) {
      pooled[0].first += c.first;
      pooled[0].second += c.second;
    } else {
      pooled.push_back(c);
    }
  }
  if (pooled[0].first + pooled[0].second == 0) pooled.erase(pooled.begin());
  double chi = 0;
  for (const auto& [x, y] : pooled) {
    const double ex = (x + y) * na / (na + nb), ey = (x + y) * nb / (na + nb);
    chi += (x - ex) * (x - ex) / ex + (y - ey) * (y - ey) / ey;
  }
  const double df = static_cast<double>(pooled.size()) - 1;
  const double z = 3.719;  // one-sided 1e-4
  const double bound = df * std::pow(1 - 2 / (9 * df) + z * std::sqrt(2 / (9 * df)), 3);
  *why = absl::StrCat("chi-square ", chi, " with ", df, " degrees of freedom (bound ", bound, ")");
  return chi < bound;
}

// With sampling, MTP leaves the output distribution unchanged: the same
// prompt with 1,000 seeds, MTP off and on (the demo model, whose drafts are
// accepted about half the time), and the tokens at output positions 1-3
// (drafted and verified with MTP on) compared position by position.
// In its own binary and ctest label ("model", not "unit": 25 s here, too
// slow for the sanitizer build).
using MtpPipelineStatistics = MtpPipeline;
TEST_F(MtpPipelineStatistics, SamplingDistributionIsUnchangedByMtp) {
  std::map<uint32_t, int> hist[2][3];
  int64_t drafted = 0, accepted = 0;
  std::vector<uint32_t> prompt;
  std::mt19937 rng(3);
  for (int t = 0; t < 16; ++t) prompt.push_back(rng() % 4000);
  const int n = 1000;
  for (int arm = 0; arm < 2; ++arm) {
    TearDown();
    {
      absl::MutexLock lock(&mu_);
      out_.clear();
      finished_ = 0;
    }
    Start(&DemoEngine(), arm == 0 ? Fixed(0) : Fixed(-1), /*prefix_cache=*/true);
    for (int i = 0; i < n; ++i) {
      model::SamplingOptions s;
      s.temperature = 0.8f;
      s.top_k = 40;
      s.top_p = 0.95f;
      s.seed = 1000 + i;
      Submit(absl::StrCat("s", i), prompt, 4, s);
    }
    WaitFinished(n);
    for (int i = 0; i < n; ++i) {
      const Outcome o = Get(absl::StrCat("s", i));
      ASSERT_TRUE(o.error.ok()) << o.error;
      ASSERT_EQ(o.tokens.size(), 4u);
      for (int k = 0; k < 3; ++k) ++hist[arm][k][o.tokens[k + 1]];
    }
    const DecodeLoad l = decode_->GetLoad();
    if (arm == 1) {
      drafted = l.mtp_drafted_total;
      accepted = l.mtp_accepted_total;
    }
    prefill_->Stop();
    decode_->Stop();
  }
  EXPECT_GT(accepted, drafted / 5);
  EXPECT_LT(accepted, drafted - drafted / 5);
  for (int k = 0; k < 3; ++k) {
    std::string why;
    EXPECT_TRUE(SameDistribution(hist[0][k], hist[1][k], &why)) << "position " << k + 1 << ": " << why;
    std::printf("position %d: %s\n", k + 1, why.c_str());
  }
}

#endif  // SWASERVE_MTP_STATISTICS
#ifndef SWASERVE_MTP_STATISTICS

// The cost model: plain steps give T0 per batch size; a step where all R of
// the B requests that could draft drafted about k each gives
// C(k) = (T / T0 - 1) * B / R; steps where some that could draft did not
// (probes) are not measured; an unmeasured k costs initial * k; plain steps
// are asked for every 4 steps until T0 is known, then every 32; a measuring
// step after 64 steps without a measured one.
TEST(MtpCostModel, MeasuresTheCostOfEachDraftLengthPerBatchSize) {
  MtpCostModel c(0.3, true);
  EXPECT_DOUBLE_EQ(c.StepCost(1, 2), 0.6);
  EXPECT_FALSE(c.WantPlainStep(1));
  for (int i = 0; i < 4; ++i) c.Observe(1, 2e-3, 2, 1, 1);  // drafts before any plain step
  EXPECT_TRUE(c.WantPlainStep(1));
  EXPECT_DOUBLE_EQ(c.StepCost(1, 2), 0.6);  // nothing to compare with yet
  for (int i = 0; i < 3; ++i) c.Observe(1, 1e-3, 0, 0, 1);  // plain, batch 1
  for (int i = 0; i < 10; ++i) c.Observe(1, 2e-3, 2, 1, 1);  // k = 2: twice a plain step
  EXPECT_NEAR(c.StepCost(1, 2), 1.0, 1e-9);
  EXPECT_DOUBLE_EQ(c.StepCost(1, 1), 0.3);  // k = 1 never ran
  EXPECT_DOUBLE_EQ(c.StepCost(1, 0), 0);
  for (int i = 0; i < 3; ++i) c.Observe(16, 4e-3, 0, 0, 16);   // batch 16
  for (int i = 0; i < 40; ++i) c.Observe(16, 6e-3, 48, 16, 16);  // all draft 3: +50%
  EXPECT_NEAR(c.StepCost(16, 3), 0.5, 1e-9);
  EXPECT_NEAR(c.StepCost(31, 3), 0.5, 1e-9);  // same bucket
  EXPECT_DOUBLE_EQ(c.StepCost(1, 3), 0.9);    // other bucket, unmeasured
  // Half the batch drafts while the other half could: the fixed part of the
  // step (the MTP weights, read once) would be charged twice over. Not
  // measured; nor is one request probing with one draft (+20%: 3.2 plain
  // request-steps had it been divided by R = 1).
  for (int i = 0; i < 40; ++i) c.Observe(16, 5.5e-3, 24, 8, 16);
  for (int i = 0; i < 10; ++i) c.Observe(16, 4.8e-3, 1, 1, 16);
  EXPECT_NEAR(c.StepCost(16, 3), 0.5, 1e-9);
  EXPECT_DOUBLE_EQ(c.StepCost(16, 1), 0.3);
  // Half the batch drafts and only that half can (the others asked for no
  // MTP): measured per drafting request, (5 / 4 - 1) * 16 / 8.
  for (int i = 0; i < 40; ++i) c.Observe(16, 5e-3, 24, 8, 8);
  EXPECT_NEAR(c.StepCost(16, 3), 0.5, 1e-9);
  EXPECT_TRUE(c.WantPlainStep(16));  // 90 draft steps since the last plain one
  c.Observe(16, 4e-3, 0, 0, 16);
  EXPECT_FALSE(c.WantPlainStep(17));
  MtpCostModel fixed(0.3, false);
  fixed.Observe(1, 1e-3, 0, 0, 1);
  fixed.Observe(1, 5e-3, 1, 1, 1);
  EXPECT_DOUBLE_EQ(fixed.StepCost(1, 1), 0.3);
  EXPECT_FALSE(fixed.WantPlainStep(1));
  EXPECT_FALSE(fixed.TakeDraftStep(1));
}

// The draft vocabulary: the most emitted tokens (ties: the lower id), built
// first after first_tokens emitted tokens, then each time the count doubles
// (at most max_interval apart), every count halving at each build; unchanged
// sets build nothing new.
TEST(DraftVocabulary, KeepsTheMostEmittedTokensAndRebuildsAsTheCountDoubles) {
  const int vocab = testing::TestEngine().config().vocab_size;  // 256
  const model::Engine& engine = testing::TestEngine().engine();
  DraftVocabulary v(vocab, 3, 10, 25);
  for (uint32_t t : {9u, 9u, 9u, 4u, 4u, 200u, 7u, 7u, 1u}) v.Observe(t);  // 9 tokens
  absl::StatusOr<bool> built = v.MaybeRebuild(engine);
  ASSERT_TRUE(built.ok());
  EXPECT_FALSE(*built);
  EXPECT_EQ(v.head(), nullptr);
  v.Observe(1);  // 10: due; 4, 7 and 1 tie at 2: the lower ids win
  built = v.MaybeRebuild(engine);
  ASSERT_TRUE(built.ok() && *built);
  ASSERT_NE(v.head(), nullptr);
  EXPECT_EQ(v.head()->ids(), (std::vector<int32_t>{1, 4, 9}));
  // Counts now 9: 1, 4: 1, 7: 1, 1: 1, 200: 0.
  for (int i = 0; i < 9; ++i) v.Observe(250);  // 19: next build at 20
  built = v.MaybeRebuild(engine);
  EXPECT_FALSE(*built);
  v.Observe(250);
  built = v.MaybeRebuild(engine);
  ASSERT_TRUE(built.ok() && *built);
  // 250: 10, then 1, 4, 7, 9 tie at 1 (9's three halved): the lower ids.
  EXPECT_EQ(v.head()->ids(), (std::vector<int32_t>{1, 4, 250}));
  // Counts now 250: 5, the rest 0.
  for (int i = 0; i < 10; ++i) v.Observe(9);
  for (int i = 0; i < 10; ++i) v.Observe(4);  // 40: due (20 + 20)
  built = v.MaybeRebuild(engine);
  ASSERT_TRUE(built.ok() && *built);
  EXPECT_EQ(v.head()->ids(), (std::vector<int32_t>{4, 9, 250}));
  EXPECT_EQ(v.builds(), 3);
  // Counts now 4: 5, 9: 5, 250: 2.
  for (int i = 0; i < 24; ++i) v.Observe(i % 2 == 0 ? 4 : 9);  // 64 < 40 + min(40, 25) = 65
  EXPECT_FALSE(*v.MaybeRebuild(engine));
  v.Observe(250);
  EXPECT_FALSE(*v.MaybeRebuild(engine));  // due, the same set: nothing new built
  EXPECT_EQ(v.builds(), 3);
  // Sizes: explicit, off, and the default (a quarter from 32K tokens on).
  MtpOptions o;
  EXPECT_EQ(DraftVocabularySize(o, 4096), 0);
  EXPECT_EQ(DraftVocabularySize(o, 152064), 38016);
  o.draft_vocab_tokens = 64;
  EXPECT_EQ(DraftVocabularySize(o, 256), 64);
  EXPECT_EQ(DraftVocabularySize(o, 64), 0);
  o.draft_vocab_tokens = 0;
  EXPECT_EQ(DraftVocabularySize(o, 152064), 0);
}

// Traffic shifts (say, from prose to code): the head follows within about two
// intervals of the new traffic, not after as many tokens as the history
// holds. With plain counts the old set (500 each) would outweigh the new
// one (38 each) for 2,000 more tokens.
TEST(DraftVocabulary, FollowsAShiftInWhatTheWorkerEmits) {
  const model::Engine& engine = testing::TestEngine().engine();
  DraftVocabulary v(testing::TestEngine().config().vocab_size, 4, 8, 100);
  auto emit = [&](uint32_t first, int n) {
    for (int i = 0; i < n; ++i) {
      v.Observe(first + static_cast<uint32_t>(i % 4));
      ASSERT_TRUE(v.MaybeRebuild(engine).ok());
    }
  };
  emit(1, 2000);
  ASSERT_NE(v.head(), nullptr);
  EXPECT_EQ(v.head()->ids(), (std::vector<int32_t>{1, 2, 3, 4}));
  emit(10, 150);
  EXPECT_EQ(v.head()->ids(), (std::vector<int32_t>{10, 11, 12, 13}));
}

TEST(MtpCostModel, AsksForAMeasuringStepWhenNoDraftStepWasMeasuredFor64Steps) {
  MtpCostModel c(0.3, true);
  for (int i = 0; i < 100; ++i) c.Observe(8, 2e-3, 1, 1, 8);  // probes only, T0 unknown
  EXPECT_FALSE(c.TakeDraftStep(8));                           // nothing to compare with
  for (int i = 0; i < 3; ++i) c.Observe(8, 2e-3, 0, 0, 8);
  for (int i = 0; i < 60; ++i) c.Observe(8, 2.2e-3, 1, 1, 8);  // probes: not measured
  EXPECT_FALSE(c.TakeDraftStep(8));
  for (int i = 0; i < 4; ++i) c.Observe(8, 2e-3, 0, 0, 8);
  EXPECT_TRUE(c.TakeDraftStep(8));   // 64 steps since T0 without a measured draft step
  EXPECT_FALSE(c.TakeDraftStep(8));  // once
  EXPECT_FALSE(c.TakeDraftStep(4));  // per bucket: batch 4 has no T0
  for (int i = 0; i < 63; ++i) c.Observe(8, 2.2e-3, 1, 1, 8);
  c.Observe(8, 3e-3, 16, 8, 8);  // everyone drafted: measured
  for (int i = 0; i < 63; ++i) c.Observe(8, 2.2e-3, 1, 1, 8);
  EXPECT_FALSE(c.TakeDraftStep(8));
  c.Observe(8, 2.2e-3, 1, 1, 8);
  EXPECT_TRUE(c.TakeDraftStep(8));
}

// Where drafting does not look like it pays, a request probes every
// probe_interval steps with the length that looks best (here 3, not 1), and
// a measuring step drafts that length at once.
TEST(MtpState, ProbesAndMeasuringStepsDraftTheLengthThatLooksBest) {
  MtpOptions o;  // adaptive, probe interval 8
  MtpCostModel c(0.3, true);
  for (int i = 0; i < 3; ++i) c.Observe(1, 1e-3, 0, 0, 1);
  for (int k = 1; k <= 3; ++k) c.Observe(1, 6e-3, k, 1, 1);  // C(k) = 5 for k = 1..3
  const std::vector<double> prior = {0.9, 0.9, 0.9};
  std::vector<float> rows(3 * 4, 0.5f);
  MtpState s(o, 3, 4, 3, prior);
  s.Reset(10, rows);
  int drafts = 0, steps = 0;
  for (; steps < 8; ++steps) {
    const int k = s.ChooseDraftLength(10, c, 1);
    if (k > 0) {
      EXPECT_EQ(k, 3) << "step " << steps;
      ++drafts;
    }
  }
  EXPECT_EQ(drafts, 1);  // the 8th step probes
  s.Observe(3, 0);       // rejected: the interval doubles
  EXPECT_EQ(s.probe_interval(), 16);
  EXPECT_EQ(s.ChooseDraftLength(10, c, 1, /*measure=*/true), 3);
  // Cheap drafts: plain steps lose to drafting.
  MtpCostModel cheap(0.1, false);
  MtpState t(o, 3, 4, 3, prior);
  t.Reset(10, rows);
  EXPECT_EQ(t.ChooseDraftLength(10, cheap, 1), 3);
}

// A prefix hit keeps a cold run's draft quality: B = base + its own tail
// after A = base + another tail, against B alone on a fresh worker (fixed
// draft length, so both runs draft alike). The MTP KV that B reuses from A's
// cached pages equals what B computes cold, so the drafts, and the
// acceptance, are identical. (The divergence is at least K tokens after the
// hit's page boundary: closer, the cached MTP KV of the last K − 1 positions
// carries A's continuation — see prefill_core.cc Accept.)
TEST_F(MtpPipeline, PrefixHitKeepsTheDraftsOfAColdRun) {
  std::mt19937 rng(31);
  auto random = [&](int n) {
    std::vector<uint32_t> v;
    for (int i = 0; i < n; ++i) v.push_back(rng() % 4000);
    return v;
  };
  const std::vector<uint32_t> base = random(103);  // hit at 100, divergence at 103
  for (int trial = 0; trial < 3; ++trial) {
    std::vector<uint32_t> a = base, b = base;
    const auto ta = random(20), tb = random(20);
    a.insert(a.end(), ta.begin(), ta.end());
    b.insert(b.end(), tb.begin(), tb.end());
    int64_t drafted[2], accepted[2];
    std::vector<uint32_t> tokens[2];
    for (int warm = 0; warm < 2; ++warm) {
      {
        absl::MutexLock lock(&mu_);
        out_.clear();
        finished_ = 0;
      }
      Start(&DemoEngine(), Fixed(-1));
      if (warm == 1) {
        Submit("a", a, 40);
        WaitFinished(1);
      }
      const DecodeLoad before = decode_->GetLoad();
      Submit("b", b, 40);
      WaitFinished(warm + 1);
      const DecodeLoad after = decode_->GetLoad();
      const Outcome o = Get("b");
      ASSERT_TRUE(o.error.ok()) << o.error;
      EXPECT_EQ(o.cached, warm == 1 ? 100 : 0);
      drafted[warm] = after.mtp_drafted_total - before.mtp_drafted_total;
      accepted[warm] = after.mtp_accepted_total - before.mtp_accepted_total;
      tokens[warm] = o.tokens;
      prefill_->Stop();
      decode_->Stop();
    }
    SCOPED_TRACE(absl::StrCat("trial ", trial));
    EXPECT_EQ(tokens[1], tokens[0]);
    EXPECT_GT(accepted[0], 0);
    EXPECT_EQ(drafted[1], drafted[0]);
    EXPECT_EQ(accepted[1], accepted[0]);
  }
}

// Adaptive drafting on text where drafts are never accepted (the tiny
// random model): after the first few steps the requests decode plainly,
// drafting only in rare probes, and greedy output is unchanged.
TEST_F(MtpPipeline, AdaptiveDraftingStopsWhereDraftsAreRejected) {
  // The fixed cost model: a measured one follows this machine's step times,
  // which on a loaded machine (CI runs two test suites at once) can make
  // drafting look cheap enough to keep drafting past the bound below — the
  // likely cause of one failure in a full local ctest run (not reproduced
  // in 3 reruns alone).
  MtpOptions o;
  o.measure_cost = false;
  Start(&testing::TestEngine(), o);
  std::vector<std::vector<uint32_t>> prompts;
  for (int i = 0; i < 4; ++i) {
    prompts.push_back(testing::RandomPrompt(500 + i, 20));
    Submit(absl::StrCat("a", i), prompts.back(), 200);
  }
  WaitFinished(4);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(Get(absl::StrCat("a", i)).tokens, testing::ReferenceGreedy(prompts[i], 200));
  }
  const DecodeLoad l = decode_->GetLoad();
  // 4 x 199 decode tokens: a few dozen drafts at most (initial steps, probes).
  EXPECT_LT(l.mtp_drafted_total, 4 * 199 / 8) << l.mtp_drafted_total;
  EXPECT_GT(l.mtp_drafted_total, 0);
}

#endif  // !SWASERVE_MTP_STATISTICS

}  // namespace
}  // namespace swaserve::worker
