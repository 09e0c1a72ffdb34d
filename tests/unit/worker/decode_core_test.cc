// DecodeCore against straight-line greedy generation of the same engine:
// identical tokens whatever the batch composition, admission order,
// preemption (recompute) or staging; cancellation and stop conditions; every
// page free afterwards.
#include "lib/worker/decode_core.h"

#include <map>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/test_model.h"

namespace swaserve::worker {
namespace {

using testing::kPage;

// Collects the events of many requests; thread-safe.
class Collector {
 public:
  TokenSink SinkFor(const std::string& id) {
    return [this, id](const TokenEvent& e) {
      absl::MutexLock lock(&mu_);
      Result& r = results_[id];
      for (const auto& t : e.tokens) r.tokens.push_back(t.token);
      if (e.finish != FinishReason::kNone) {
        r.finish = e.finish;
        r.error = e.error;
        ++done_;
      }
    };
  }
  void WaitFor(int n) {
    absl::MutexLock lock(&mu_);
    auto enough = [&] { return done_ >= n; };
    ASSERT_TRUE(mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(120)))
        << done_ << " of " << n << " finished";
  }
  struct Result {
    std::vector<uint32_t> tokens;
    FinishReason finish = FinishReason::kNone;
    absl::Status error;
  };
  Result Get(const std::string& id) {
    absl::MutexLock lock(&mu_);
    return results_[id];
  }
  int tokens_so_far(const std::string& id) {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(results_[id].tokens.size());
  }

 private:
  absl::Mutex mu_;
  std::map<std::string, Result> results_ ABSL_GUARDED_BY(mu_);
  int done_ ABSL_GUARDED_BY(mu_) = 0;
};

class DecodeCoreTest : public ::testing::Test {
 protected:
  // `mtp`: MTP speculation as a worker runs it (default); off where a test
  // counts pages step by step (mtp_decode_test.cc covers MTP under pressure).
  void Start(int full_pages, int swa_pages, int max_batch = 32, bool mtp = true) {
    pools_ = testing::NewPools(full_pages, swa_pages);
    DecodeCoreOptions o;
    if (!mtp) o.mtp.draft_tokens = 0;
    o.engine = &testing::TestEngine();
    o.pools = pools_.get();
    o.max_batch_size = max_batch;
    o.recompute_chunk = 16;
    o.registry = &registry_;
    auto core = DecodeCore::Create(o);
    ASSERT_TRUE(core.ok()) << core.status();
    core_ = std::move(*core);
  }
  void TearDown() override {
    if (core_ != nullptr) core_->Stop();
    if (pools_ != nullptr) {
      EXPECT_EQ(pools_->full().num_free(), pools_->full().num_pages()) << "full pages leaked";
      EXPECT_EQ(pools_->swa().num_free(), pools_->swa().num_pages()) << "SWA pages leaked";
    }
  }
  DecodeJob Job(const std::string& id, const std::vector<uint32_t>& prompt, int max_tokens,
                Collector& c) {
    testing::Prefilled p = testing::PrefillAndStage(*prefill_pools_, prompt, 8);
    DecodeJob j;
    j.id = id;
    j.prompt = prompt;
    j.first_token.token = p.first_token;
    j.staging = std::move(p.staging);
    j.stop.max_tokens = max_tokens;
    j.sink = c.SinkFor(id);
    return j;
  }

  std::unique_ptr<kv::KvPools> prefill_pools_ = testing::NewPools(2048, 2048);
  metrics::Registry registry_;
  std::unique_ptr<kv::KvPools> pools_;
  std::unique_ptr<DecodeCore> core_;
};

TEST_F(DecodeCoreTest, BatchedOutputsEqualTheReference) {
  Start(1024, 1024);
  Collector c;
  std::mt19937 rng(5);
  std::vector<std::vector<uint32_t>> prompts;
  std::vector<int> lengths;
  for (int i = 0; i < 12; ++i) {
    prompts.push_back(testing::RandomPrompt(100 + i, 5 + rng() % 60));
    lengths.push_back(1 + rng() % 24);
    ASSERT_TRUE(core_->Submit(Job("r" + std::to_string(i), prompts[i], lengths[i], c)).ok());
  }
  c.WaitFor(12);
  for (int i = 0; i < 12; ++i) {
    const auto r = c.Get("r" + std::to_string(i));
    EXPECT_EQ(r.finish, FinishReason::kLength) << i << " " << r.error;
    EXPECT_EQ(r.tokens, testing::ReferenceGreedy(prompts[i], lengths[i])) << "request " << i;
  }
  const DecodeLoad load = core_->GetLoad();
  EXPECT_EQ(load.running, 0);
  EXPECT_EQ(load.staged, 0);
  EXPECT_EQ(load.admitted_total, 12);
}

TEST_F(DecodeCoreTest, PreemptionRecomputesAndKeepsOutputsIdentical) {
  // Room for about two requests' worth of full pages: later tokens force
  // preemption of the most recently admitted ones.
  Start(/*full_pages=*/40, /*swa_pages=*/256);
  Collector c;
  std::vector<std::vector<uint32_t>> prompts;
  std::vector<DecodeJob> jobs;  // queued at once: they contend from the start
  for (int i = 0; i < 6; ++i) {
    prompts.push_back(testing::RandomPrompt(200 + i, 30 + 3 * i));
    jobs.push_back(Job("p" + std::to_string(i), prompts[i], 40, c));
  }
  ASSERT_TRUE(core_->SubmitAll(std::move(jobs)).ok());
  c.WaitFor(6);
  for (int i = 0; i < 6; ++i) {
    const auto r = c.Get("p" + std::to_string(i));
    ASSERT_EQ(r.finish, FinishReason::kLength) << i << " " << r.error;
    EXPECT_EQ(r.tokens, testing::ReferenceGreedy(prompts[i], 40)) << "request " << i;
  }
  EXPECT_GT(core_->GetLoad().preempted_total, 0) << "the test did not exercise preemption";
  // The policy is sched::DecodeScheduler's: its role="decode" metrics agree
  // with the core's own counters, and nothing is left queued or running.
  const std::string text = registry_.RenderText();
  const DecodeLoad load = core_->GetLoad();
  EXPECT_NE(text.find(absl::StrCat("swaserve_sched_preempted_total{role=\"decode\"} ",
                                   load.preempted_total)),
            std::string::npos)
      << text;
  EXPECT_NE(text.find(absl::StrCat("swaserve_sched_admitted_total{role=\"decode\"} ",
                                   load.admitted_total)),
            std::string::npos);
  EXPECT_NE(text.find("swaserve_sched_queue_depth{role=\"decode\"} 0"), std::string::npos);
  EXPECT_NE(text.find("swaserve_sched_running_requests{role=\"decode\"} 0"), std::string::npos);
}

// Preemption does not stall the batch: a preempted request's
// recompute runs chunk by chunk in the same forwards as the other requests'
// decode tokens (before, it ran whole inside admission while everyone else
// waited), and outputs stay identical to the reference.
TEST_F(DecodeCoreTest, PreemptedRecomputeIsInterleavedWithTheRunningBatch) {
  // Without MTP: drafts would change how fast the pool fills, and with it
  // which requests are admitted together (the premise below).
  Start(/*full_pages=*/48, /*swa_pages=*/256, /*max_batch=*/32, /*mtp=*/false);
  Collector c;
  // Two short requests with long generations admitted first; a long prompt
  // last (the youngest: the preemption victim). When a short one finishes
  // the long one is readmitted while the other short one still decodes.
  std::vector<std::vector<uint32_t>> prompts = {testing::RandomPrompt(300, 12),
                                                testing::RandomPrompt(301, 12),
                                                testing::RandomPrompt(302, 100)};
  const std::vector<int> lengths = {40, 90, 40};
  // Staged first, then submitted together: admitted in this order, in one
  // iteration (4 + 4 + 26 of 48 pages); growing, they fill the pool and the
  // youngest (the long one) is preempted; when i0 ends it is readmitted and
  // recomputes while i1 still decodes.
  std::vector<DecodeJob> jobs;
  for (int i = 0; i < 3; ++i) jobs.push_back(Job("i" + std::to_string(i), prompts[i], lengths[i], c));
  ASSERT_TRUE(core_->SubmitAll(std::move(jobs)).ok());
  c.WaitFor(3);
  for (int i = 0; i < 3; ++i) {
    const auto r = c.Get("i" + std::to_string(i));
    ASSERT_EQ(r.finish, FinishReason::kLength) << i << " " << r.error;
    EXPECT_EQ(r.tokens, testing::ReferenceGreedy(prompts[i], lengths[i])) << "request " << i;
  }
  const DecodeLoad load = core_->GetLoad();
  ASSERT_GT(load.preempted_total, 0) << "the test did not exercise preemption";
  // 100+ tokens in 16-token chunks: several chunks, most beside decodes.
  EXPECT_GE(load.recompute_chunks_total, 6);
  EXPECT_GT(load.recompute_chunks_with_decode_total, 0)
      << "the recompute never shared a forward with the running batch";
}

TEST_F(DecodeCoreTest, CancelMidStreamFreesEverything) {
  Start(1024, 1024);
  Collector c;
  ASSERT_TRUE(core_->Submit(Job("long", testing::RandomPrompt(7, 20), 100000, c)).ok());
  ASSERT_TRUE(core_->Submit(Job("staged-forever", testing::RandomPrompt(8, 20), 100000, c)).ok());
  while (c.tokens_so_far("long") < 5) absl::SleepFor(absl::Milliseconds(1));
  core_->Cancel("long");
  core_->Cancel("staged-forever");
  core_->Cancel("unknown");  // no-op
  c.WaitFor(2);
  EXPECT_EQ(c.Get("long").finish, FinishReason::kCancelled);
  EXPECT_EQ(c.Get("staged-forever").finish, FinishReason::kCancelled);
  // The loop is idle now; TearDown checks that no page is in use.
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_EQ(core_->GetLoad().running, 0);
}

TEST_F(DecodeCoreTest, StopIdsAndMaxTokens) {
  Start(1024, 1024);
  Collector c;
  const std::vector<uint32_t> prompt = testing::RandomPrompt(9, 33);
  const std::vector<uint32_t> ref = testing::ReferenceGreedy(prompt, 12);
  DecodeJob j = Job("stop", prompt, 12, c);
  j.stop.stop_ids = {ref[5]};
  const auto first = std::find(ref.begin(), ref.end(), ref[5]) - ref.begin();
  ASSERT_TRUE(core_->Submit(std::move(j)).ok());
  DecodeJob eos = Job("eos", prompt, 12, c);
  eos.stop.eos_ids = {ref[0]};
  ASSERT_TRUE(core_->Submit(std::move(eos)).ok());
  c.WaitFor(2);
  EXPECT_EQ(c.Get("stop").finish, FinishReason::kStop);
  EXPECT_EQ(c.Get("stop").tokens, std::vector<uint32_t>(ref.begin(), ref.begin() + first + 1));
  EXPECT_EQ(c.Get("eos").finish, FinishReason::kStop);
  EXPECT_EQ(c.Get("eos").tokens, std::vector<uint32_t>{ref[0]});
}

TEST_F(DecodeCoreTest, RejectsMalformedJobsAndTooBigRequests) {
  Start(/*full_pages=*/8, /*swa_pages=*/64);
  Collector c;
  DecodeJob no_sink = Job("a", testing::RandomPrompt(1, 10), 4, c);
  no_sink.sink = nullptr;
  EXPECT_EQ(core_->Submit(std::move(no_sink)).code(), absl::StatusCode::kInvalidArgument);
  DecodeJob wrong = Job("b", testing::RandomPrompt(1, 10), 4, c);
  wrong.prompt.push_back(1);  // staging covers 10 tokens, prompt has 11
  EXPECT_EQ(core_->Submit(std::move(wrong)).code(), absl::StatusCode::kInvalidArgument);
  DecodeJob bad_sampling = Job("c", testing::RandomPrompt(1, 10), 4, c);
  bad_sampling.sampling.temperature = -1;
  EXPECT_EQ(core_->Submit(std::move(bad_sampling)).code(), absl::StatusCode::kInvalidArgument);
  DecodeJob stop_strings = Job("d", testing::RandomPrompt(1, 10), 4, c);
  stop_strings.stop.stop_strings = {"x"};  // no tokenizer
  EXPECT_EQ(core_->Submit(std::move(stop_strings)).code(), absl::StatusCode::kInvalidArgument);
  // A duplicate of a live request is refused. The first one may already
  // have ended (it outgrows the 8 pages within a few ms): then its id is
  // free again and the check is retried under a new id.
  bool refused = false;
  int jobs = 0;  // accepted, each ends (cancelled, or out of pages)
  for (int attempt = 0; attempt < 20 && !refused; ++attempt) {
    const std::string id = absl::StrCat("dup", attempt);
    ASSERT_TRUE(core_->Submit(Job(id, testing::RandomPrompt(1, 10), 1000, c)).ok());
    ++jobs;
    const absl::Status again = core_->Submit(Job(id, testing::RandomPrompt(1, 10), 4, c));
    refused = again.code() == absl::StatusCode::kAlreadyExists;
    if (!refused) {
      ASSERT_TRUE(again.ok()) << again;
      ++jobs;
    }
    core_->Cancel(id);
  }
  EXPECT_TRUE(refused);
  // 8 full pages hold 32 tokens: a 60-token prompt can never be admitted.
  ASSERT_TRUE(core_->Submit(Job("huge", testing::RandomPrompt(2, 60), 4, c)).ok());
  c.WaitFor(jobs + 1);
  EXPECT_EQ(c.Get("huge").finish, FinishReason::kError);
  EXPECT_EQ(c.Get("huge").error.code(), absl::StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace swaserve::worker
