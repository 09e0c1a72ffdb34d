// StartChoiceGroup against a scripted start function: who starts when, what
// the sink sees, how errors and cancellation end the group.
#include "lib/router/choice_group.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"

namespace swaserve::router {
namespace {

// One started choice: its request, sink, cancel flag and done callback.
struct Started {
  v1::GenerateRequest request;
  std::shared_ptr<GenerateSink> sink;
  std::shared_ptr<CancelFlag> cancel;
  GenerateDone done;
};

class RecordingSink final : public GenerateSink {
 public:
  void OnPrompt(const PromptInfo& info) override { ++prompts; }
  bool Write(const v1::GenerateResponse& r) override {
    indexes.push_back(r.index());
    return accept;
  }
  void OnReady(std::function<void()> ready) override {
    ++ready_calls;
    if (defer_ready) {
      EXPECT_EQ(pending, nullptr) << "two OnReady callbacks pending at once";
      pending = std::move(ready);
    } else {
      ready();
    }
  }
  int prompts = 0;
  std::vector<uint32_t> indexes;
  bool accept = true;
  bool defer_ready = false;
  int ready_calls = 0;
  std::function<void()> pending;
};

class ChoiceGroupTest : public ::testing::Test {
 protected:
  void Start(uint32_t n, bool seeded = true) {
    v1::GenerateRequest req;
    req.set_request_id("r");
    req.set_n(n);
    if (seeded) req.mutable_sampling()->set_seed(100);
    StartChoiceGroup(req, sink_, cancel_, [this](absl::Status st) {
      ++done_calls_;
      result_ = std::move(st);
    },
                     [this](const v1::GenerateRequest& one, std::shared_ptr<GenerateSink> s,
                            std::shared_ptr<CancelFlag> c, GenerateDone d) {
                       started_.push_back({one, std::move(s), std::move(c), std::move(d)});
                     });
  }
  static v1::GenerateResponse Tokens(int n) {
    v1::GenerateResponse r;
    for (int i = 0; i < n; ++i) r.add_token_ids(5);
    return r;
  }

  std::shared_ptr<RecordingSink> sink_ = std::make_shared<RecordingSink>();
  std::shared_ptr<CancelFlag> cancel_ = std::make_shared<CancelFlag>();
  std::vector<Started> started_;
  int done_calls_ = 0;
  absl::Status result_ = absl::UnknownError("not done");
};

TEST_F(ChoiceGroupTest, FollowersStartAfterTheLeadersFirstTokenWithTheirOwnSeeds) {
  Start(3);
  ASSERT_EQ(started_.size(), 1u);
  EXPECT_EQ(started_[0].request.n(), 1u);
  EXPECT_EQ(started_[0].request.sampling().seed(), 100u);
  started_[0].sink->OnPrompt({});
  v1::GenerateResponse progress;  // no tokens: the prefill still runs
  progress.mutable_progress()->set_found(true);
  EXPECT_TRUE(started_[0].sink->Write(progress));
  EXPECT_EQ(started_.size(), 1u);
  EXPECT_TRUE(started_[0].sink->Write(Tokens(1)));
  ASSERT_EQ(started_.size(), 3u);
  EXPECT_EQ(started_[1].request.sampling().seed(), 101u);
  EXPECT_EQ(started_[2].request.sampling().seed(), 102u);
  EXPECT_EQ(started_[2].request.request_id(), "r");
  started_[2].sink->OnPrompt({});  // only the leader's prompt reaches the client
  EXPECT_EQ(sink_->prompts, 1);
  EXPECT_TRUE(started_[2].sink->Write(Tokens(2)));
  EXPECT_TRUE(started_[1].sink->Write(Tokens(1)));
  EXPECT_EQ(sink_->indexes, std::vector<uint32_t>({0, 0, 2, 1}));
  started_[0].done(absl::OkStatus());
  started_[2].done(absl::OkStatus());
  EXPECT_EQ(done_calls_, 0);
  started_[1].done(absl::OkStatus());
  EXPECT_EQ(done_calls_, 1);
  EXPECT_TRUE(result_.ok()) << result_;
}

TEST_F(ChoiceGroupTest, UnseededChoicesStayUnseeded) {
  Start(2, /*seeded=*/false);
  started_[0].sink->Write(Tokens(1));
  ASSERT_EQ(started_.size(), 2u);
  EXPECT_FALSE(started_[1].request.sampling().has_seed());
}

TEST_F(ChoiceGroupTest, ALeaderThatFailsBeforeItsFirstTokenStartsNoFollower) {
  Start(4);
  started_[0].done(absl::UnavailableError("no worker"));
  EXPECT_EQ(started_.size(), 1u);
  EXPECT_EQ(done_calls_, 1);
  EXPECT_TRUE(absl::IsUnavailable(result_)) << result_;
}

TEST_F(ChoiceGroupTest, AFailingChoiceCancelsTheOthersAndIsTheResult) {
  Start(3);
  started_[0].sink->Write(Tokens(1));
  ASSERT_EQ(started_.size(), 3u);
  started_[1].done(absl::ResourceExhaustedError("overloaded"));
  EXPECT_TRUE(started_[0].cancel->cancelled());
  EXPECT_TRUE(started_[2].cancel->cancelled());
  started_[0].done(absl::CancelledError("cancelled"));
  EXPECT_EQ(done_calls_, 0);
  started_[2].done(absl::CancelledError("cancelled"));
  EXPECT_EQ(done_calls_, 1);
  EXPECT_TRUE(absl::IsResourceExhausted(result_)) << result_;
}

TEST_F(ChoiceGroupTest, TheClientsCancelReachesEveryChoice) {
  Start(2);
  started_[0].sink->Write(Tokens(1));
  ASSERT_EQ(started_.size(), 2u);
  cancel_->Cancel();
  EXPECT_TRUE(started_[0].cancel->cancelled());
  EXPECT_TRUE(started_[1].cancel->cancelled());
  started_[0].done(absl::CancelledError("client went away"));
  started_[1].done(absl::CancelledError("client went away"));
  EXPECT_EQ(done_calls_, 1);
  EXPECT_TRUE(absl::IsCancelled(result_));
}

TEST_F(ChoiceGroupTest, ChoicesShareTheSinksOneReadyCallback) {
  sink_->defer_ready = true;
  Start(3);
  started_[0].sink->Write(Tokens(1));
  ASSERT_EQ(started_.size(), 3u);
  int woken = 0;
  for (const Started& s : started_) s.sink->OnReady([&woken] { ++woken; });
  EXPECT_EQ(sink_->ready_calls, 1);  // one pending at the sink for all three
  EXPECT_EQ(woken, 0);
  std::function<void()> ready = std::move(sink_->pending);
  sink_->pending = nullptr;
  ready();
  EXPECT_EQ(woken, 3);
  started_[1].sink->OnReady([&woken] { ++woken; });
  EXPECT_EQ(sink_->ready_calls, 2);
  // The sink drops its pending callback (as a closed HTTP call does): it
  // holds the group, which holds the sink.
  sink_->pending = nullptr;
}

}  // namespace
}  // namespace swaserve::router
