// Prefills cut short: a prefill that ends before
// its last chunk — its caller cancelled, the core stopped, a draining worker
// handed it back — keeps the chunks it computed in the prefix cache and L3,
// and the retry resumes there with the KV and output of a straight run. A
// worker killed -9 runs none of that: its long prefills' L3 checkpoints
// (PrefillCoreOptions::l3_checkpoint_tokens) are what the retry finds.
#include <unistd.h>

#include <filesystem>
#include <thread>

#include "lib/kv/memory_page_store.h"
#include "tests/unit/worker/prefill_pipeline.h"

namespace swaserve::worker {
namespace {

using testing::kPage;

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
  const Outcome b = StartAndRun("b", prompt);
  EXPECT_EQ(b.cached, kept);
  EXPECT_EQ(b.tokens, testing::ReferenceGreedy(prompt, 4));
  StopAll();
}

// A store that takes puts until the test freezes it, then drops every put:
// what a worker killed -9 leaves in a shared L3 (nothing written after).
class FreezableStore final : public kv::PageStore {
 public:
  absl::Status Put(const kv::PageKey& k, absl::Span<const uint8_t> b) override {
    if (frozen_.load()) return absl::UnavailableError("frozen");
    return inner_.Put(k, b);
  }
  absl::Status Get(const kv::PageKey& k, absl::Span<uint8_t> out) override {
    return inner_.Get(k, out);
  }
  bool Contains(const kv::PageKey& k) override { return inner_.Contains(k); }
  void Erase(const kv::PageKey& k) override { inner_.Erase(k); }
  std::string_view backend() const override { return "freezable"; }
  const kv::PageStoreStats& stats() const override { return inner_.stats(); }
  std::atomic<bool> frozen_{false};

 private:
  kv::MemoryPageStore inner_{64 << 20};
};

// A worker killed -9 in the middle of a long prompt: nothing of the
// cancellation path runs, so only the L3 checkpoints its prefill wrote as it
// went survive (here: a store that takes no put after the "kill", and the
// dead worker's cache never writes back). A new worker over the same store
// resumes at the last checkpoint — at most one interval (plus a window
// restore's stretch, for a checkpoint the kill cut in two) behind where the
// prefill stood — with the output of a straight run; without checkpoints it
// computes the whole prompt again. A prompt that completes is not written to
// L3 twice: its checkpointed pages are marked as written in the cache.
TEST_F(Pipeline, AKilledWorkersLongPrefillResumesFromItsL3Checkpoints) {
  constexpr int kInterval = 256;
  for (const bool checkpoints : {true, false}) {
    SCOPED_TRACE(checkpoints ? "checkpoints" : "no checkpoints");
    const std::vector<uint32_t> prompt = testing::RandomPrompt(checkpoints ? 95 : 96, 3000);
    FreezableStore store;
    l3_ = &store;
    l3_checkpoint_tokens_ = checkpoints ? kInterval : 0;
    Start(4096, 4096);
    ASSERT_TRUE(Submit("a", prompt, 4).ok());
    const int done = WaitProgress("a", 1500);
    store.frozen_ = true;  // the kill: nothing reaches the store from here on
    ASSERT_GE(done, 1500);
    const PrefillLoad at_kill = prefill_->GetLoad();
    ASSERT_LT(at_kill.completed_total, 1) << "the prompt finished first";
    if (checkpoints) {
      EXPECT_GE(at_kill.l3_checkpoints_total, (1500 - kInterval) / kInterval);
      EXPECT_EQ(at_kill.l3_checkpoints_skipped_total, 0);
    } else {
      EXPECT_EQ(at_kill.l3_checkpoints_total, 0);
    }
    const int64_t checkpointed = at_kill.l3_checkpoint_tokens_total;
    l3_ = nullptr;  // StopAll without the shutdown write-back
    StopAll();
    ClearOutcomes();
    store.frozen_ = false;
    l3_ = &store;
    const Outcome b = StartAndRun("b", prompt);
    EXPECT_EQ(b.tokens, testing::ReferenceGreedy(prompt, 4));
    if (checkpoints) {
      EXPECT_GE(b.cached, checkpointed - 2 * kInterval) << "resumed far behind the checkpoints";
      EXPECT_LE(b.cached, done);
      EXPECT_GT(b.cached, 0);
      // b completed: its checkpointed pages are not written back again.
      const int64_t written_before = cache_->stats().l3_written_pages.load();
      const int64_t b_checkpointed = prefill_->GetLoad().l3_checkpoint_tokens_total;
      EXPECT_GT(b_checkpointed, 0);
      cache_->Clear();  // write-back of everything
      const int64_t pages = static_cast<int64_t>(prompt.size()) / kPage;
      EXPECT_LE(cache_->stats().l3_written_pages.load() - written_before + b_checkpointed / kPage,
                pages - b.cached / kPage + 1)
          << "checkpointed pages written to L3 twice";
    } else {
      EXPECT_EQ(b.cached, 0);
    }
    StopAll();
    l3_ = nullptr;
    ClearOutcomes();
  }
}

// A checkpoint larger than the store's write-behind queue (a MiMo-V2.5-Pro
// checkpoint of 16K tokens is ~800 MB of full KV against the default
// 256 MiB queue) is written as the queue drains, from where the previous
// write stopped, chunk by chunk: nothing is dropped, and the killed worker's
// retry resumes near where the prefill stood. (All or nothing, as the first
// version did, wrote none of it here: every checkpoint was put off.)
TEST_F(Pipeline, CheckpointsLargerThanTheWriteQueueAreWrittenAsItDrains) {
  constexpr int kInterval = 256;  // 16 pages against a queue of 4
  const std::vector<uint32_t> prompt = testing::RandomPrompt(97, 3000);
  const int64_t full_page = static_cast<int64_t>(testing::NewPools(1, 1)->full().page_bytes());
  auto frozen = std::make_unique<FreezableStore>();
  FreezableStore* inner = frozen.get();
  kv::AsyncPageStore store(std::move(frozen), {.max_queued_bytes = 4 * full_page});
  l3_ = &store;
  l3_checkpoint_tokens_ = kInterval;
  Start(4096, 4096);
  ASSERT_TRUE(Submit("a", prompt, 4).ok());
  const int done = WaitProgress("a", 1500);
  inner->frozen_ = true;  // the kill: what is queued now is lost too
  ASSERT_GE(done, 1500);
  const PrefillLoad at_kill = prefill_->GetLoad();
  ASSERT_LT(at_kill.completed_total, 1) << "the prompt finished first";
  EXPECT_GT(at_kill.l3_checkpoints_skipped_total, 0) << "every checkpoint fit: nothing paced";
  const int64_t checkpointed = at_kill.l3_checkpoint_tokens_total;
  EXPECT_GE(checkpointed, 2 * kInterval);
  EXPECT_EQ(store.dropped(), 0);
  l3_ = nullptr;  // StopAll without the shutdown write-back
  StopAll();
  ClearOutcomes();
  store.Flush();  // the queue at the kill went nowhere
  inner->frozen_ = false;
  l3_ = &store;
  const Outcome b = StartAndRun("b", prompt);
  EXPECT_EQ(b.tokens, testing::ReferenceGreedy(prompt, 4));
  // Behind the checkpointed tokens by at most the lost queue (4 pages), a
  // window restore's stretch and a checkpoint's interval.
  EXPECT_GE(b.cached, checkpointed - 4 * kPage - 2 * kInterval) << "resumed far behind";
  EXPECT_LE(b.cached, done);
  EXPECT_EQ(store.dropped(), 0);
  StopAll();
  l3_ = nullptr;
  ClearOutcomes();
}

}  // namespace
}  // namespace swaserve::worker
