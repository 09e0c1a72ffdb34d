// PrefillCore → (local staging) → DecodeCore, the monolithic pipeline,
// against straight-line greedy runs: identical outputs with and without
// prefix-cache hits, under concurrency, for mixed lengths and batch
// compositions; cancellation; every page free or cached afterwards.
#include "tests/unit/worker/prefill_pipeline.h"

namespace swaserve::worker {
namespace {

using testing::kPage;

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
              "tokens %lld, checkpoint pages yielded %lld\n", restored,
              static_cast<long long>(load.window_restores_from_window_safe_total), at_checkpoint,
              static_cast<long long>(load.cached_tokens_total),
              static_cast<long long>(load.swa_checkpoint_pages_yielded_total));
  if (GetParam() == RestoreMode::kOnFromStretchStart || !restore) {
    EXPECT_EQ(load.window_restores_from_window_safe_total, 0);
  } else if (GetParam() == RestoreMode::kOn) {
    EXPECT_GE(load.window_restores_from_window_safe_total, 3)
        << "the workload did not exercise restores from the window-safe hit";
  }
  if (checkpoint > 0) {
    EXPECT_GE(at_checkpoint, 3) << "the workload did not hit checkpoint windows";
    // 96 SWA pages: running prompts give checkpoint windows up before hot
    // ones (the default), and outputs and KV stay exact.
    EXPECT_GT(load.swa_checkpoint_pages_yielded_total, 0);
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

// The L3 tier at the engine level: a prompt computed before a
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

// A job's multimodal placeholders take the given embeddings (the
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
