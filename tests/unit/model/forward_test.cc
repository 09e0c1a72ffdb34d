// The forward pass against the independent dense reference, and its batch
// invariance: chunking, batch composition and prefix-cache hits must not
// change a single bit of any request's logits.
#include "lib/model/forward.h"

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <limits>
#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/base/hash.h"
#include "lib/base/sanitizers.h"
#include "lib/base/subprocess.h"
#include "lib/kv/prefix_cache.h"
#include "lib/model/sampling.h"
#include "tests/unit/model/dense_reference.h"

// Counts heap allocations, to check that steady-state decode allocates none.
// AddressSanitizer owns operator new/delete, so under it the count is not
// taken (the test skips).
static std::atomic<int64_t> g_allocations{0};
#if SWASERVE_ASAN
constexpr bool kCountingAllocations = false;
#else
constexpr bool kCountingAllocations = true;
// (GCC cannot see that these replacements pair malloc with free.)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
#endif

namespace swaserve::model {
namespace {

constexpr int kPage = 4;

class ForwardTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(*base::MakeTempDir("forward-test"));
    auto config = BuiltinConfig("tiny", 256);
    ASSERT_TRUE(config.ok()) << config.status();
    ASSERT_TRUE(WriteRandomCheckpoint(*config, 7, *dir_).ok());
    auto engine = Engine::Create({*dir_, 2});
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = engine->release();
    auto ckpt = Checkpoint::Open(*dir_);
    ASSERT_TRUE(ckpt.ok()) << ckpt.status();
    ckpt_ = ckpt->release();
  }
  static void TearDownTestSuite() {
    delete engine_;
    delete ckpt_;
    delete dir_;
  }

  void SetUp() override { NewPools(); }

  void NewPools(int full_pages = 512, int swa_pages = 512) {
    cache_.reset();
    pools_ = *kv::KvPools::Create(
        {engine_->config().KvShape(kPage), full_pages, swa_pages, true});
    cache_ = *kv::PrefixCache::Create({pools_.get(), nullptr});
  }

  std::unique_ptr<kv::Sequence> NewSeq(kv::CacheHit hit = kv::CacheHit()) {
    return std::make_unique<kv::Sequence>(
        kv::SequenceOptions{pools_.get(), cache_.get(), 0, false}, std::move(hit));
  }

  static std::vector<uint32_t> RandomTokens(std::mt19937& rng, int n) {
    std::vector<uint32_t> t(n);
    for (auto& x : t) x = rng() % 256;
    return t;
  }

  // Prefills `tokens` into `seq` in the given chunk sizes, returning the
  // logits of every position (rows of vocab floats).
  std::vector<std::vector<float>> Prefill(kv::Sequence* seq, const std::vector<uint32_t>& tokens,
                                          const std::vector<int>& chunks) {
    std::vector<std::vector<float>> rows;
    size_t pos = seq->length();
    size_t ci = 0;
    while (pos < tokens.size()) {
      const int n = std::min<int>(chunks[ci++ % chunks.size()], tokens.size() - pos);
      EXPECT_TRUE(seq->Append(n).ok());
      ForwardItem item{seq, absl::MakeConstSpan(tokens).subspan(pos, n), static_cast<int>(pos), true};
      ForwardOutput out;
      absl::Status s = engine_->Forward({&item, 1}, &out);
      EXPECT_TRUE(s.ok()) << s;
      const int V = engine_->config().vocab_size;
      for (int j = 0; j < n; ++j) {
        rows.emplace_back(out.logits.begin() + static_cast<size_t>(j) * V,
                          out.logits.begin() + static_cast<size_t>(j + 1) * V);
      }
      pos += n;
    }
    return rows;
  }

  static std::string* dir_;
  static Engine* engine_;
  static Checkpoint* ckpt_;
  std::unique_ptr<kv::KvPools> pools_;
  std::unique_ptr<kv::PrefixCache> cache_;
};

std::string* ForwardTest::dir_ = nullptr;
Engine* ForwardTest::engine_ = nullptr;
Checkpoint* ForwardTest::ckpt_ = nullptr;

double MaxRelDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double maxabs = 1e-6, diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    maxabs = std::max(maxabs, std::fabs(static_cast<double>(b[i])));
    diff = std::max(diff, std::fabs(static_cast<double>(a[i]) - b[i]));
  }
  return diff / maxabs;
}

TEST_F(ForwardTest, MatchesDenseReferenceOverManyChunkings) {
  std::mt19937 rng(1);
  const std::vector<uint32_t> tokens = RandomTokens(rng, 70);  // > 4 windows (W=16)
  const testing::DenseResult ref = testing::DenseForward(*ckpt_, tokens);
  const std::vector<std::vector<int>> chunkings = {{70}, {1}, {5, 17, 2}, {16}, {3, 30}};
  for (const auto& chunks : chunkings) {
    NewPools();
    auto seq = NewSeq();
    auto rows = Prefill(seq.get(), tokens, chunks);
    ASSERT_EQ(rows.size(), tokens.size());
    for (size_t p = 0; p < tokens.size(); ++p) {
      EXPECT_LT(MaxRelDiff(rows[p], ref.logits[p]), 1e-4) << "position " << p << " chunk " << chunks[0];
    }
  }
}

TEST_F(ForwardTest, ChunkingAndBatchMixDoNotChangeABit) {
  std::mt19937 rng(2);
  std::vector<std::vector<uint32_t>> prompts;
  for (int i = 0; i < 4; ++i) prompts.push_back(RandomTokens(rng, 20 + rng() % 40));
  // Reference: each prompt alone, one chunk.
  std::vector<std::vector<std::vector<float>>> alone;
  for (const auto& p : prompts) {
    NewPools();
    auto seq = NewSeq();
    alone.push_back(Prefill(seq.get(), p, {static_cast<int>(p.size())}));
  }
  // Mixed: all prompts advance together in random chunks within one batch.
  for (int trial = 0; trial < 5; ++trial) {
    NewPools();
    std::vector<std::unique_ptr<kv::Sequence>> seqs;
    std::vector<size_t> pos(prompts.size(), 0);
    for (size_t i = 0; i < prompts.size(); ++i) seqs.push_back(NewSeq());
    const int V = engine_->config().vocab_size;
    while (true) {
      std::vector<ForwardItem> batch;
      std::vector<size_t> which;
      for (size_t i = 0; i < prompts.size(); ++i) {
        if (pos[i] >= prompts[i].size() || rng() % 3 == 0) continue;
        const int n = std::min<int>(1 + rng() % 9, prompts[i].size() - pos[i]);
        ASSERT_TRUE(seqs[i]->Append(n).ok());
        batch.push_back({seqs[i].get(), absl::MakeConstSpan(prompts[i]).subspan(pos[i], n),
                         static_cast<int>(pos[i]), true});
        which.push_back(i);
      }
      bool done = true;
      for (size_t i = 0; i < prompts.size(); ++i) done &= pos[i] >= prompts[i].size();
      if (done) break;
      if (batch.empty()) continue;
      ForwardOutput out;
      ASSERT_TRUE(engine_->Forward(batch, &out).ok());
      for (size_t b = 0; b < batch.size(); ++b) {
        const size_t i = which[b];
        for (size_t j = 0; j < batch[b].tokens.size(); ++j) {
          const float* got = out.logits.data() + static_cast<size_t>(out.first_row[b] + j) * V;
          ASSERT_EQ(std::memcmp(got, alone[i][pos[i] + j].data(), sizeof(float) * V), 0)
              << "prompt " << i << " position " << pos[i] + j << " trial " << trial;
        }
        pos[i] += batch[b].tokens.size();
      }
    }
  }
}

// Greedy generation: `steps` tokens after the prompt, decoding in batches
// with other requests; returns the generated ids.
std::vector<uint32_t> GreedyDecode(Engine* engine, kv::Sequence* seq, std::vector<uint32_t> tokens,
                                   const std::vector<float>& last_logits, int steps,
                                   std::vector<kv::Sequence*> others,
                                   std::vector<std::vector<uint32_t>>* other_tokens) {
  std::vector<uint32_t> out;
  uint32_t next = Argmax(last_logits);
  for (int s = 0; s < steps; ++s) {
    out.push_back(next);
    tokens.push_back(next);
    EXPECT_TRUE(seq->Append(1).ok());
    std::vector<ForwardItem> batch;
    batch.push_back({seq, absl::MakeConstSpan(tokens).subspan(tokens.size() - 1, 1),
                     static_cast<int>(tokens.size() - 1), false});
    for (size_t o = 0; o < others.size(); ++o) {
      auto& ot = (*other_tokens)[o];
      ot.push_back(static_cast<uint32_t>((ot.back() * 31 + 7) % 256));
      EXPECT_TRUE(others[o]->Append(1).ok());
      batch.push_back({others[o], absl::MakeConstSpan(ot).subspan(ot.size() - 1, 1),
                       static_cast<int>(ot.size() - 1), false});
    }
    ForwardOutput fo;
    EXPECT_TRUE(engine->Forward(batch, &fo).ok());
    next = Argmax(absl::MakeConstSpan(fo.logits).subspan(0, engine->config().vocab_size));
  }
  return out;
}

TEST_F(ForwardTest, GreedyGenerationIdenticalAcrossChunksAndBatches) {
  std::mt19937 rng(3);
  const std::vector<uint32_t> prompt = RandomTokens(rng, 37);
  std::vector<uint32_t> first;
  for (int variant = 0; variant < 4; ++variant) {
    NewPools();
    auto seq = NewSeq();
    std::vector<int> chunks = variant == 0 ? std::vector<int>{37} : std::vector<int>{1 + variant * 3};
    auto rows = Prefill(seq.get(), prompt, chunks);
    std::vector<std::unique_ptr<kv::Sequence>> others;
    std::vector<kv::Sequence*> other_ptrs;
    std::vector<std::vector<uint32_t>> other_tokens;
    for (int o = 0; o < variant; ++o) {
      others.push_back(NewSeq());
      other_tokens.push_back(RandomTokens(rng, 5 + o));
      Prefill(others.back().get(), other_tokens.back(), {3});
      other_ptrs.push_back(others.back().get());
    }
    auto gen = GreedyDecode(engine_, seq.get(), prompt, rows.back(), 30, other_ptrs, &other_tokens);
    if (variant == 0) {
      first = gen;
    } else {
      EXPECT_EQ(gen, first) << "variant " << variant;
    }
  }
  // And against the dense reference.
  std::vector<uint32_t> full = prompt;
  full.insert(full.end(), first.begin(), first.end() - 1);
  const testing::DenseResult ref = testing::DenseForward(*ckpt_, full);
  for (size_t i = 0; i < first.size(); ++i) {
    EXPECT_EQ(Argmax(ref.logits[prompt.size() - 1 + i]), first[i]) << "step " << i;
  }
}

TEST_F(ForwardTest, PrefixHitGivesBitIdenticalLogits) {
  std::mt19937 rng(4);
  const std::vector<uint32_t> first = RandomTokens(rng, 41);
  std::vector<uint32_t> second = first;
  for (uint32_t t : RandomTokens(rng, 19)) second.push_back(t);
  // Without any cache.
  auto plain_seq = NewSeq();
  auto plain = Prefill(plain_seq.get(), second, {60});
  plain_seq->Abort();
  // First request fills the cache; the second hits it.
  NewPools();
  auto s1 = NewSeq();
  Prefill(s1.get(), first, {41});
  s1->Finish(base::ChainedPageHashes(first, kPage));
  auto hashes = base::ChainedPageHashes(second, kPage);
  kv::CacheHit hit = cache_->MatchAndLock(hashes, static_cast<int>(second.size()) - 1);
  ASSERT_GT(hit.tokens(), 0) << cache_->DebugString();
  EXPECT_EQ(hit.tokens(), 40);  // the last complete page of the first prompt
  auto s2 = NewSeq(std::move(hit));
  auto rows = Prefill(s2.get(), second, {7});
  ASSERT_EQ(rows.size(), second.size() - 40);
  for (size_t j = 0; j < rows.size(); ++j) {
    ASSERT_EQ(std::memcmp(rows[j].data(), plain[40 + j].data(), sizeof(float) * rows[j].size()), 0)
        << "position " << 40 + j;
  }
}

TEST_F(ForwardTest, SwaLayersNeverReadOutsideTheWindow) {
  std::mt19937 rng(5);
  const std::vector<uint32_t> prompt = RandomTokens(rng, 50);
  const int W = engine_->config().sliding_window;
  auto run = [&](bool poison) -> std::vector<std::vector<float>> {
    NewPools();
    auto seq = NewSeq();
    auto rows = Prefill(seq.get(), prompt, {50});
    std::vector<uint32_t> tokens = prompt;
    std::vector<std::vector<float>> out;
    uint32_t next = Argmax(rows.back());
    for (int step = 0; step < 12; ++step) {
      tokens.push_back(next);
      EXPECT_TRUE(seq->Append(1).ok());
      if (poison) {
        const float nan = std::numeric_limits<float>::quiet_NaN();
        // Every free page of both pools...
        for (kv::PagePool* pool : {&pools_->full(), &pools_->swa()}) {
          for (kv::PageId p = 0; p < pool->num_pages(); ++p) {
            if (pool->state(p) != kv::PageState::kFree) continue;
            float* f = reinterpret_cast<float*>(pool->PageData(p));
            std::fill(f, f + pool->page_bytes() / 4, nan);
          }
        }
        // ...and, in retained SWA pages, every token the next query must
        // not see (k <= q - W).
        const int q = static_cast<int>(tokens.size()) - 1;
        const kv::PoolGeometry& g = pools_->swa().geometry();
        for (int t = seq->swa_first_page() * kPage; t <= q - W; ++t) {
          for (int l = 0; l < g.num_layers; ++l) {
            kv::LayerView v = seq->SwaLayer(l);
            float* k = reinterpret_cast<float*>(v.K(t));
            float* vv = reinterpret_cast<float*>(v.V(t));
            std::fill(k, k + g.KTokenStride() / 4, nan);
            std::fill(vv, vv + g.VTokenStride() / 4, nan);
          }
        }
      }
      ForwardItem item{seq.get(), absl::MakeConstSpan(tokens).subspan(tokens.size() - 1, 1),
                       static_cast<int>(tokens.size() - 1), false};
      ForwardOutput fo;
      EXPECT_TRUE(engine_->Forward({&item, 1}, &fo).ok());
      out.push_back(fo.logits);
      next = Argmax(fo.logits);
    }
    return out;
  };
  auto clean = run(false);
  auto poisoned = run(true);
  ASSERT_EQ(clean.size(), poisoned.size());
  for (size_t i = 0; i < clean.size(); ++i) {
    for (float f : poisoned[i]) ASSERT_FALSE(std::isnan(f)) << "step " << i;
    ASSERT_EQ(std::memcmp(clean[i].data(), poisoned[i].data(), sizeof(float) * clean[i].size()), 0)
        << "step " << i;
  }
}

TEST_F(ForwardTest, MtpLayersMatchDenseReference) {
  const ModelConfig& c = engine_->config();
  ASSERT_GE(c.num_mtp_layers, 1);
  std::mt19937 rng(6);
  const std::vector<uint32_t> tokens = RandomTokens(rng, 40);
  const testing::DenseResult ref = testing::DenseForward(*ckpt_, tokens);
  auto seq = NewSeq();
  ASSERT_TRUE(seq->Append(static_cast<int>(tokens.size())).ok());
  ForwardItem item{seq.get(), tokens, 0, true};
  ForwardOutput out;
  ASSERT_TRUE(engine_->Forward({&item, 1}, &out, /*keep_all_hidden=*/true).ok());
  std::vector<float> hidden = out.all_hidden;
  std::vector<std::vector<float>> ref_hidden = ref.hidden;
  for (int k = 0; k < c.num_mtp_layers; ++k) {
    const testing::DenseResult mref = testing::DenseMtp(*ckpt_, k, tokens, ref_hidden);
    // Layer k's position p takes main token p + 1 + k and hidden row p.
    const int n = static_cast<int>(tokens.size()) - 1 - k;
    ForwardItem mi{seq.get(), absl::MakeConstSpan(tokens).subspan(1 + k, n), 0, true};
    std::vector<float> h(hidden.begin(), hidden.begin() + static_cast<size_t>(n) * c.hidden_size);
    ForwardOutput mo;
    ASSERT_TRUE(engine_->ForwardMtp(k, {&mi, 1}, h, &mo).ok());
    ASSERT_EQ(mref.logits.size(), static_cast<size_t>(n));
    for (int p = 0; p < n; ++p) {
      std::vector<float> row(mo.logits.begin() + static_cast<size_t>(p) * c.vocab_size,
                             mo.logits.begin() + static_cast<size_t>(p + 1) * c.vocab_size);
      EXPECT_LT(MaxRelDiff(row, mref.logits[p]), 1e-4) << "MTP layer " << k << " position " << p;
    }
    hidden = mo.all_hidden;
    ref_hidden = mref.hidden;
  }
}

// A draft head (the MTP draft vocabulary): the logits of its tokens are the
// whole lm_head's bit for bit, every other token's -infinity, and the KV and
// hidden states are untouched. Bad sets are rejected.
TEST_F(ForwardTest, DraftHeadLogitsAreTheWholeHeadsOnItsTokens) {
  const ModelConfig& c = engine_->config();
  ASSERT_GE(c.num_mtp_layers, 1);
  std::mt19937 rng(8);
  const std::vector<uint32_t> tokens = RandomTokens(rng, 30);
  auto seq = NewSeq();
  ASSERT_TRUE(seq->Append(static_cast<int>(tokens.size())).ok());
  ForwardItem item{seq.get(), tokens, 0, true};
  ForwardOutput out;
  ASSERT_TRUE(engine_->Forward({&item, 1}, &out, /*keep_all_hidden=*/true).ok());
  const int n = static_cast<int>(tokens.size()) - 1;
  const std::vector<float> h(out.all_hidden.begin(),
                             out.all_hidden.begin() + static_cast<size_t>(n) * c.hidden_size);
  ForwardItem mi{seq.get(), absl::MakeConstSpan(tokens).subspan(1, n), 0, true};
  ForwardOutput whole, narrow;
  ASSERT_TRUE(engine_->ForwardMtp(0, {&mi, 1}, h, &whole).ok());
  std::vector<int32_t> ids = {c.vocab_size - 1, 3, 0, 77, 3, 150};  // unsorted, a duplicate
  auto head = engine_->MakeDraftHead(ids);
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_EQ((*head)->ids(), (std::vector<int32_t>{0, 3, 77, 150, c.vocab_size - 1}));
  ASSERT_TRUE(engine_->ForwardMtp(0, {&mi, 1}, h, &narrow, head->get()).ok());
  ASSERT_EQ(narrow.logits.size(), whole.logits.size());
  EXPECT_EQ(narrow.all_hidden, whole.all_hidden);
  for (int p = 0; p < n; ++p) {
    for (int t = 0; t < c.vocab_size; ++t) {
      const size_t i = static_cast<size_t>(p) * c.vocab_size + t;
      if (std::binary_search((*head)->ids().begin(), (*head)->ids().end(), t)) {
        ASSERT_EQ(std::memcmp(&narrow.logits[i], &whole.logits[i], 4), 0) << p << " " << t;
      } else {
        ASSERT_EQ(narrow.logits[i], -std::numeric_limits<float>::infinity()) << p << " " << t;
      }
    }
  }
  // Refilled in place with another set: the same logits as a fresh head.
  DraftHead reused;
  ASSERT_TRUE(engine_->FillDraftHead((*head)->ids(), &reused).ok());
  const std::vector<int32_t> other = {1, 2, 5, 90, 200};
  ASSERT_TRUE(engine_->FillDraftHead(other, &reused).ok());
  EXPECT_EQ(reused.ids(), other);
  auto fresh = engine_->MakeDraftHead(other);
  ASSERT_TRUE(fresh.ok());
  ForwardOutput a, b;
  ASSERT_TRUE(engine_->ForwardMtp(0, {&mi, 1}, h, &a, &reused).ok());
  ASSERT_TRUE(engine_->ForwardMtp(0, {&mi, 1}, h, &b, fresh->get()).ok());
  EXPECT_EQ(std::memcmp(a.logits.data(), b.logits.data(), a.logits.size() * 4), 0);
  EXPECT_FALSE(engine_->FillDraftHead(std::vector<int32_t>{5, 2}, &reused).ok());  // unsorted
  EXPECT_EQ(reused.ids(), other);  // a rejected fill changes nothing
  EXPECT_FALSE(engine_->MakeDraftHead({}).ok());
  EXPECT_FALSE(engine_->MakeDraftHead({0, c.vocab_size}).ok());
  EXPECT_FALSE(engine_->MakeDraftHead({-1, 2}).ok());
}

TEST_F(ForwardTest, SteadyStateDecodeDoesNotAllocate) {
  if (!kCountingAllocations) GTEST_SKIP() << "allocation counting is off under AddressSanitizer";
  std::mt19937 rng(8);
  std::vector<std::vector<uint32_t>> prompts = {RandomTokens(rng, 30), RandomTokens(rng, 45)};
  std::vector<std::unique_ptr<kv::Sequence>> seqs;
  for (auto& p : prompts) {
    seqs.push_back(NewSeq());
    Prefill(seqs.back().get(), p, {64});
  }
  ForwardOutput out;
  std::vector<ForwardItem> batch(prompts.size());
  int64_t during = 0;
  for (int step = 0; step < 20; ++step) {
    for (size_t i = 0; i < prompts.size(); ++i) {
      prompts[i].push_back(static_cast<uint32_t>(step * 7 + i) % 256);
      ASSERT_TRUE(seqs[i]->Append(1).ok());
      batch[i] = {seqs[i].get(), absl::MakeConstSpan(prompts[i]).subspan(prompts[i].size() - 1, 1),
                  static_cast<int>(prompts[i].size()) - 1, false};
    }
    const int64_t before = g_allocations.load();
    ASSERT_TRUE(engine_->Forward(batch, &out).ok());
    if (step >= 2) during += g_allocations.load() - before;  // after warm-up
  }
  EXPECT_EQ(during, 0) << "heap allocations in 18 steady-state decode steps";
}

TEST_F(ForwardTest, RejectsMalformedBatches) {
  auto seq = NewSeq();
  ASSERT_TRUE(seq->Append(3).ok());
  std::vector<uint32_t> bad = {1, 2, 999};
  ForwardItem item{seq.get(), bad, 0, false};
  ForwardOutput out;
  absl::Status s = engine_->Forward({&item, 1}, &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), ::testing::HasSubstr("token id 999"));
  std::vector<uint32_t> four = {1, 2, 3, 4};
  ForwardItem too_long{seq.get(), four, 0, false};
  s = engine_->Forward({&too_long, 1}, &out);
  EXPECT_THAT(s.message(), ::testing::HasSubstr("exceed the sequence"));
  EXPECT_EQ(engine_->Forward({}, &out).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace swaserve::model

namespace swaserve::model {
namespace {

// Embedding overrides (a multimodal placeholder's encoder output)
// are placed exactly where they say, in the main model and the MTP layers,
// and chunking splits them without changing a bit.
TEST_F(ForwardTest, EmbeddingOverridesArePlacedExactlyAndChunkInvariant) {
  const ModelConfig& c = engine_->config();
  const int H = c.hidden_size, V = c.vocab_size;
  std::mt19937 rng(23);
  const std::vector<uint32_t> tokens = RandomTokens(rng, 50);
  const int off = 10, rows = 12;
  // 1. Overrides that hold the table rows of other tokens give exactly the
  // logits of those tokens.
  std::vector<uint32_t> swapped = tokens;
  std::vector<float> table(static_cast<size_t>(rows) * H);
  for (int j = 0; j < rows; ++j) {
    swapped[off + j] = (tokens[off + j] + 1 + rng() % 200) % 256;
    engine_->Embedding(swapped[off + j], table.data() + static_cast<size_t>(j) * H);
  }
  auto run = [&](const std::vector<uint32_t>& t, const std::vector<EmbeddingOverride>& e,
                 kv::Sequence* seq, ForwardOutput* out) {
    ForwardItem item{seq, t, 0, true};
    item.embeddings = e;
    return engine_->Forward({&item, 1}, out, /*keep_all_hidden=*/true);
  };
  NewPools();
  {  // s1, s2 share the pools and die before NewPools replaces them
    auto s1 = NewSeq();
    ASSERT_TRUE(s1->Append(50).ok());
    ForwardOutput want;
    ASSERT_TRUE(run(swapped, {}, s1.get(), &want).ok());
    auto s2 = NewSeq();
    ASSERT_TRUE(s2->Append(50).ok());
    ForwardOutput got;
    ASSERT_TRUE(run(tokens, {{.offset = off, .rows = rows, .data = table.data()}}, s2.get(), &got)
                    .ok());
    ASSERT_EQ(got.logits, want.logits);
    // The MTP layer's input embedding follows the override too.
    ASSERT_GE(c.num_mtp_layers, 1);
    const int n = 49;
    std::vector<float> h(got.all_hidden.begin(), got.all_hidden.begin() + static_cast<size_t>(n) * H);
    ForwardItem mw{s1.get(), absl::MakeConstSpan(swapped).subspan(1, n), 0, true};
    ForwardOutput mwant, mgot;
    ASSERT_TRUE(engine_->ForwardMtp(0, {&mw, 1}, h, &mwant).ok());
    ForwardItem mg{s2.get(), absl::MakeConstSpan(tokens).subspan(1, n), 0, true};
    const EmbeddingOverride mo{.offset = off - 1, .rows = rows, .data = table.data()};
    mg.embeddings = {&mo, 1};
    ASSERT_TRUE(engine_->ForwardMtp(0, {&mg, 1}, h, &mgot).ok());
    EXPECT_EQ(mgot.logits, mwant.logits);
  }
  // 2. Arbitrary embeddings, split across chunks: bit-identical to one chunk,
  // and they matter.
  std::vector<float> image(static_cast<size_t>(rows) * H);
  std::normal_distribution<float> nd(0.0f, 0.5f);
  for (float& v : image) v = nd(rng);
  auto chunked = [&](const std::vector<int>& chunks, bool with) {
    NewPools();
    auto seq = NewSeq();
    std::vector<float> all;
    int pos = 0;
    size_t ci = 0;
    while (pos < 50) {
      const int len = std::min(chunks[ci++ % chunks.size()], 50 - pos);
      EXPECT_TRUE(seq->Append(len).ok());
      ForwardItem item{seq.get(), absl::MakeConstSpan(tokens).subspan(pos, len), pos, true};
      EmbeddingOverride e;
      const int a = std::max(pos, off), b = std::min(pos + len, off + rows);
      if (with && a < b) {
        e = {.offset = a - pos, .rows = b - a,
             .data = image.data() + static_cast<size_t>(a - off) * H};
        item.embeddings = {&e, 1};
      }
      ForwardOutput out;
      EXPECT_TRUE(engine_->Forward({&item, 1}, &out).ok());
      all.insert(all.end(), out.logits.begin(), out.logits.end());
      pos += len;
    }
    return all;
  };
  const std::vector<float> one = chunked({50}, true);
  ASSERT_EQ(one.size(), static_cast<size_t>(50) * V);
  EXPECT_EQ(chunked({7, 3, 16}, true), one);
  EXPECT_EQ(chunked({1}, true), one);
  const std::vector<float> plain = chunked({50}, false);
  // Positions before the image are unchanged; from it on they differ.
  EXPECT_TRUE(std::equal(one.begin(), one.begin() + static_cast<size_t>(off) * V, plain.begin()));
  EXPECT_FALSE(std::equal(one.begin() + static_cast<size_t>(off) * V, one.end(),
                          plain.begin() + static_cast<size_t>(off) * V));
  // 3. Malformed overrides are rejected.
  NewPools();
  auto s3 = NewSeq();
  ASSERT_TRUE(s3->Append(50).ok());
  ForwardOutput bad;
  for (const std::vector<EmbeddingOverride>& e :
       std::vector<std::vector<EmbeddingOverride>>{
           {{.offset = 45, .rows = 6, .data = image.data()}},
           {{.offset = 0, .rows = 0, .data = image.data()}},
           {{.offset = 5, .rows = 4, .data = image.data()},
            {.offset = 8, .rows = 2, .data = image.data()}},
           {{.offset = 3, .rows = 1, .data = nullptr}}}) {
    EXPECT_EQ(run(tokens, e, s3.get(), &bad).code(), absl::StatusCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace swaserve::model
