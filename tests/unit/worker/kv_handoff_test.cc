// The disaggregation seam without gRPC: PrefillCore → KvSender → UCX (two
// in-process TransferEngines over shared memory) → KvReceiver → DecodeCore,
// against straight-line greedy runs; and the receiver's budget, timeout and
// cancellation paths, the sender's error taxonomy.
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "lib/rpc/status_conversion.h"
#include "lib/transfer/kv_destination.h"
#include "lib/transfer/transfer_engine.h"
#include "lib/worker/decode_core.h"
#include "lib/worker/kv_receiver.h"
#include "lib/worker/kv_sender.h"
#include "lib/worker/prefill_core.h"
#include "tests/unit/worker/test_model.h"

namespace swaserve::worker {
namespace {

// A value set once from any thread, waited for with a bound.
template <typename T>
class Result {
 public:
  void Set(T v) {
    absl::MutexLock lock(&mu_);
    if (!value_.has_value()) value_ = std::move(v);
  }
  std::optional<T> Wait(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto set = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return value_.has_value(); };
    mu_.AwaitWithTimeout(absl::Condition(&set), timeout);
    return value_;
  }
  bool has_value() {
    absl::MutexLock lock(&mu_);
    return value_.has_value();
  }

 private:
  absl::Mutex mu_;
  std::optional<T> value_ ABSL_GUARDED_BY(mu_);
};

struct Outcome {
  std::vector<uint32_t> tokens;
  FinishReason finish = FinishReason::kNone;
  int cached = -1;
  absl::Status prefill_status;
};

class Handoff : public ::testing::Test {
 protected:
  void Start(KvReceiverOptions ro = {}, int decode_pages = 2048) {
    receiver_.reset();  // its gauges leave the registry first
    sender_.reset();
    transfer::TransferEngineOptions to;
    to.ucx_tls = "posix,sysv,self";
    to.name = "prefill";
    auto p = transfer::TransferEngine::Create(to);
    to.name = "decode";
    auto d = transfer::TransferEngine::Create(to);
    ASSERT_TRUE(p.ok() && d.ok());
    prefill_te_ = std::move(*p);
    decode_te_ = std::move(*d);
    prefill_pools_ = testing::NewPools(2048, 2048);
    decode_pools_ = testing::NewPools(decode_pages, decode_pages);
    PrefillCoreOptions po;
    po.engine = &testing::TestEngine();
    po.pools = prefill_pools_.get();
    po.scheduler.chunk_tokens = 32;
    auto pc = PrefillCore::Create(po);
    ASSERT_TRUE(pc.ok()) << pc.status();
    prefill_ = std::move(*pc);
    DecodeCoreOptions dco;
    dco.engine = &testing::TestEngine();
    dco.pools = decode_pools_.get();
    auto dc = DecodeCore::Create(dco);
    ASSERT_TRUE(dc.ok()) << dc.status();
    decode_ = std::move(*dc);
    KvSenderOptions so;
    so.transfer = prefill_te_.get();
    so.pools = prefill_pools_.get();
    so.registry = &registry_;
    auto sender = KvSender::Create(so);
    ASSERT_TRUE(sender.ok()) << sender.status();
    sender_ = std::move(*sender);
    ro.worker_id = "decode-1";
    ro.transfer = decode_te_.get();
    ro.pools = decode_pools_.get();
    ro.registry = &registry_;
    auto receiver = KvReceiver::Create(ro);
    ASSERT_TRUE(receiver.ok()) << receiver.status();
    receiver_ = std::move(*receiver);
  }
  void TearDown() override {
    if (prefill_ != nullptr) prefill_->Stop();
    if (decode_ != nullptr) decode_->Stop();
    if (decode_pools_ != nullptr) {
      EXPECT_EQ(decode_pools_->full().num_free(), decode_pools_->full().num_pages());
    }
    if (prefill_pools_ != nullptr) {
      EXPECT_EQ(prefill_pools_->full().num_in_use(), 0);
    }
  }

  static DecodeJob Job(const std::string& id, const std::vector<uint32_t>& prompt,
                       int max_tokens) {
    DecodeJob j;
    j.id = id;
    j.prompt = prompt;
    j.stop.max_tokens = max_tokens;
    return j;
  }

  // The decode leg as the decode service runs it: Expect, then on commit
  // submit to the core with a sink recording the outcome.
  absl::Status ExpectAndDecode(const std::string& id, const std::vector<uint32_t>& prompt,
                               int max_tokens) {
    return receiver_->Expect(id, Job(id, prompt, max_tokens),
                             [this, id](absl::StatusOr<ReceivedKv> got) {
                               if (!got.ok()) return Finish(id, FinishReason::kError, -1);
                               got->job.sink = [this, id](const TokenEvent& e) {
                                 {
                                   absl::MutexLock lock(&mu_);
                                   for (const auto& t : e.tokens) {
                                     out_[id].tokens.push_back(t.token);
                                   }
                                 }
                                 if (e.finish != FinishReason::kNone) {
                                   Finish(id, e.finish, e.cached_tokens);
                                 }
                               };
                               absl::Status st = decode_->Submit(std::move(got->job));
                               if (!st.ok()) Finish(id, FinishReason::kError, -1);
                             });
  }
  void Finish(const std::string& id, FinishReason why, int cached) {
    absl::MutexLock lock(&mu_);
    out_[id].finish = why;
    out_[id].cached = cached;
    ++finished_;
  }

  // The prefill leg: the ship asks the receiver directly (the service's
  // Decode.GetKvDestination call).
  absl::Status Prefill(const std::string& id, const std::vector<uint32_t>& prompt,
                       DestinationSource source = nullptr) {
    if (source == nullptr) {
      source = [this, id](absl::Duration, DestinationFn done) {
        receiver_->GetDestination(id, std::move(done));
      };
    }
    PrefillJob j;
    j.id = id;
    j.prompt = prompt;
    j.ship = sender_->MakeShip(id, "decode-1", std::move(source), &bytes_);
    j.done = [this, id](absl::StatusOr<PrefillResult> r) {
      absl::MutexLock lock(&mu_);
      out_[id].prefill_status = r.status();
      ++prefilled_;
    };
    return prefill_->Submit(std::move(j));
  }

  void WaitFinished(int n) {
    absl::MutexLock lock(&mu_);
    auto enough = [&] { return finished_ >= n; };
    ASSERT_TRUE(mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(120)))
        << finished_ << " of " << n;
  }
  void WaitPrefilled(int n) {
    absl::MutexLock lock(&mu_);
    auto enough = [&] { return prefilled_ >= n; };
    ASSERT_TRUE(mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(120)));
  }
  Outcome Get(const std::string& id) {
    absl::MutexLock lock(&mu_);
    return out_[id];
  }

  metrics::Registry registry_;
  std::unique_ptr<transfer::TransferEngine> prefill_te_, decode_te_;
  std::unique_ptr<kv::KvPools> prefill_pools_, decode_pools_;
  std::unique_ptr<PrefillCore> prefill_;
  std::unique_ptr<DecodeCore> decode_;
  std::unique_ptr<KvSender> sender_;
  std::unique_ptr<KvReceiver> receiver_;
  std::atomic<uint64_t> bytes_{0};
  absl::Mutex mu_;
  std::map<std::string, Outcome> out_ ABSL_GUARDED_BY(mu_);
  int finished_ ABSL_GUARDED_BY(mu_) = 0;
  int prefilled_ ABSL_GUARDED_BY(mu_) = 0;
};

// Prompts shorter and longer than the SWA window, heap staging and the UCX
// arena: the decode output equals the straight-line greedy run, the bytes
// are acknowledged, and nothing stays pending or staged.
TEST_F(Handoff, ShipsPromptsToDecodeAndGeneratesTheReferenceTokens) {
  for (size_t arena : {size_t{0}, size_t{8} << 20}) {
    KvReceiverOptions ro;
    ro.staging_arena_bytes = arena;
    Start(ro);
    const std::vector<int> lengths = {1, 7, 33, 150, 301};
    for (size_t i = 0; i < lengths.size(); ++i) {
      const std::string id = absl::StrCat("r", i);
      const auto prompt = testing::RandomPrompt(100 + i, lengths[i]);
      ASSERT_TRUE(ExpectAndDecode(id, prompt, 6).ok());
      ASSERT_TRUE(Prefill(id, prompt).ok());
    }
    WaitFinished(static_cast<int>(lengths.size()));
    WaitPrefilled(static_cast<int>(lengths.size()));
    for (size_t i = 0; i < lengths.size(); ++i) {
      const Outcome o = Get(absl::StrCat("r", i));
      EXPECT_TRUE(o.prefill_status.ok()) << o.prefill_status;
      EXPECT_EQ(o.finish, FinishReason::kLength);
      EXPECT_EQ(o.cached, 0);
      EXPECT_EQ(o.tokens, testing::ReferenceGreedy(testing::RandomPrompt(100 + i, lengths[i]), 6))
          << "prompt of " << lengths[i] << " tokens, arena " << arena;
    }
    EXPECT_GT(bytes_.load(), 0u);
    for (size_t i = 0; i < lengths.size(); ++i) receiver_->Forget(absl::StrCat("r", i), "done");
    EXPECT_EQ(receiver_->pending(), 0u);
    if (arena > 0) {
      ASSERT_NE(receiver_->staging_arena(), nullptr);
      EXPECT_EQ(receiver_->staging_arena()->bytes_in_use(), 0u);
    }
    TearDown();
    prefill_.reset();
    decode_.reset();
    decode_pools_.reset();
    prefill_pools_.reset();
    out_.clear();
    finished_ = prefilled_ = 0;
  }
}

TEST_F(Handoff, PromptsThatCouldNeverRunHereFailAtExpect) {
  KvReceiverOptions ro;
  const kv::KvShape shape = testing::TestEngine().config().KvShape(testing::kPage);
  ro.staging_budget_bytes =
      StagedKvLayout::For(shape, 60, transfer::FirstSwaToken(shape, 60)).total_bytes() - 1;
  Start(ro, /*decode_pages=*/16);
  // 16 pages of 4 tokens: 64 tokens + the first generated one do not fit.
  absl::Status pages = receiver_->Expect("a", Job("a", testing::RandomPrompt(1, 64), 4), nullptr);
  EXPECT_EQ(pages.code(), absl::StatusCode::kResourceExhausted);
  std::optional<v1::ErrorDetail> d = rpc::GetErrorDetail(pages);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->code(), v1::ERROR_CODE_TOO_LARGE_FOR_WORKER);
  EXPECT_FALSE(d->retryable());
  EXPECT_EQ(d->worker_id(), "decode-1");
  // Fits the pools, not the staging budget (one byte short).
  absl::Status budget =
      receiver_->Expect("b", Job("b", testing::RandomPrompt(2, 60), 4), nullptr);
  EXPECT_EQ(budget.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(budget.message().find("staging budget"), absl::string_view::npos) << budget;
  EXPECT_EQ(receiver_->pending(), 0u);
  ASSERT_TRUE(receiver_->Expect("c", Job("c", testing::RandomPrompt(3, 8), 4), nullptr).ok());
  EXPECT_EQ(receiver_->Expect("c", Job("c", testing::RandomPrompt(3, 8), 4), nullptr).code(),
            absl::StatusCode::kAlreadyExists);
  receiver_->Forget("c", "test");
}

// A full budget: the second staging waits in line; a second call for it is
// refused; the caller giving up leaves the line; a freed staging admits
// the next; an unknown or forgotten id is NotFound.
TEST_F(Handoff, AFullBudgetQueuesStagingsInOrder) {
  Start();
  const auto prompt = testing::RandomPrompt(5, 40);
  // Size the budget to one request's staging.
  {
    KvReceiverOptions probe;
    probe.staging_budget_bytes = 1;
    probe.transfer = decode_te_.get();
    probe.pools = decode_pools_.get();
    auto r = KvReceiver::Create(probe);
    ASSERT_TRUE(r.ok());
    absl::Status too_big = (*r)->Expect("x", Job("x", prompt, 4), nullptr);
    ASSERT_EQ(too_big.code(), absl::StatusCode::kResourceExhausted);
  }
  KvReceiverOptions ro;
  ro.staging_budget_bytes = StagedKvLayout::For(decode_pools_->shape(), 40,
                                                transfer::FirstSwaToken(decode_pools_->shape(), 40))
                                .total_bytes();
  receiver_.reset();
  ro.worker_id = "decode-1";
  ro.transfer = decode_te_.get();
  ro.pools = decode_pools_.get();
  auto rc = KvReceiver::Create(ro);
  ASSERT_TRUE(rc.ok()) << rc.status();
  receiver_ = std::move(*rc);

  Result<absl::Status> a_received;
  ASSERT_TRUE(receiver_
                  ->Expect("a", Job("a", prompt, 4),
                           [&](absl::StatusOr<ReceivedKv> r) { a_received.Set(r.status()); })
                  .ok());
  ASSERT_TRUE(receiver_->Expect("b", Job("b", prompt, 4), nullptr).ok());
  Result<absl::StatusOr<v1::KvDestination>> a, b, b2, b3, again, unknown;
  receiver_->GetDestination("a", [&](auto d) { a.Set(std::move(d)); });
  ASSERT_TRUE(a.Wait(absl::Seconds(5)).has_value());
  ASSERT_TRUE(a.Wait(absl::ZeroDuration())->ok());
  // Idempotent once staged.
  receiver_->GetDestination("a", [&](auto d) { again.Set(std::move(d)); });
  ASSERT_TRUE(again.Wait(absl::Seconds(5)).has_value());
  ASSERT_TRUE(again.Wait(absl::ZeroDuration())->ok());
  EXPECT_EQ(again.Wait(absl::ZeroDuration())->value().SerializeAsString(),
            a.Wait(absl::ZeroDuration())->value().SerializeAsString());

  receiver_->GetDestination("b", [&](auto d) { b.Set(std::move(d)); });
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_FALSE(b.has_value()) << "b should wait for the budget";
  receiver_->GetDestination("b", [&](auto d) { b2.Set(std::move(d)); });
  ASSERT_TRUE(b2.Wait(absl::Seconds(5)).has_value());
  EXPECT_EQ(b2.Wait(absl::ZeroDuration())->status().code(), absl::StatusCode::kAborted);
  receiver_->CancelDestination("b");
  ASSERT_TRUE(b.Wait(absl::Seconds(5)).has_value());
  EXPECT_EQ(b.Wait(absl::ZeroDuration())->status().code(), absl::StatusCode::kCancelled);

  // In line again; a's stream ends (its receive is cancelled, its staging
  // freed), so b is staged.
  receiver_->GetDestination("b", [&](auto d) { b3.Set(std::move(d)); });
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_FALSE(b3.has_value());
  receiver_->Forget("a", "stream ended");
  ASSERT_TRUE(a_received.Wait(absl::Seconds(5)).has_value());
  EXPECT_FALSE(a_received.Wait(absl::ZeroDuration())->ok());
  ASSERT_TRUE(b3.Wait(absl::Seconds(5)).has_value());
  EXPECT_TRUE(b3.Wait(absl::ZeroDuration())->ok()) << b3.Wait(absl::ZeroDuration())->status();
  receiver_->Forget("b", "stream ended");
  receiver_->GetDestination("b", [&](auto d) { unknown.Set(std::move(d)); });
  ASSERT_TRUE(unknown.Wait(absl::Seconds(5)).has_value());
  EXPECT_EQ(unknown.Wait(absl::ZeroDuration())->status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(receiver_->pending(), 0u);
}

TEST_F(Handoff, ForgettingAWaitingStagingAnswersNotFound) {
  KvReceiverOptions ro;
  Start(ro);
  const auto prompt = testing::RandomPrompt(6, 20);
  ro.staging_budget_bytes = StagedKvLayout::For(decode_pools_->shape(), 20,
                                                transfer::FirstSwaToken(decode_pools_->shape(), 20))
                                .total_bytes();
  ro.worker_id = "decode-1";
  ro.transfer = decode_te_.get();
  ro.pools = decode_pools_.get();
  receiver_.reset();
  receiver_ = std::move(*KvReceiver::Create(ro));
  ASSERT_TRUE(receiver_->Expect("a", Job("a", prompt, 4), nullptr).ok());
  ASSERT_TRUE(receiver_->Expect("b", Job("b", prompt, 4), nullptr).ok());
  Result<absl::StatusOr<v1::KvDestination>> a, b;
  receiver_->GetDestination("a", [&](auto d) { a.Set(std::move(d)); });
  ASSERT_TRUE(a.Wait(absl::Seconds(5)).has_value());
  receiver_->GetDestination("b", [&](auto d) { b.Set(std::move(d)); });
  receiver_->Forget("b", "the decode stream was cancelled");
  ASSERT_TRUE(b.Wait(absl::Seconds(5)).has_value());
  EXPECT_EQ(b.Wait(absl::ZeroDuration())->status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(b.Wait(absl::ZeroDuration())->status().message().find("cancelled"),
            absl::string_view::npos);
  receiver_->Forget("a", "done");
}

// The transfer timer counts from GetDestination: nobody sends, the receive
// fails retryable with TRANSFER_FAILED naming the decode worker.
TEST_F(Handoff, ACommitThatNeverComesTimesOut) {
  KvReceiverOptions ro;
  ro.commit_timeout = absl::Milliseconds(300);
  Start(ro);
  Result<absl::Status> got;
  ASSERT_TRUE(receiver_
                  ->Expect("a", Job("a", testing::RandomPrompt(7, 12), 4),
                           [&](absl::StatusOr<ReceivedKv> r) { got.Set(r.status()); })
                  .ok());
  absl::SleepFor(absl::Milliseconds(500));  // no timer before staging
  EXPECT_FALSE(got.has_value());
  Result<absl::StatusOr<v1::KvDestination>> dest;
  receiver_->GetDestination("a", [&](auto d) { dest.Set(std::move(d)); });
  ASSERT_TRUE(dest.Wait(absl::Seconds(5)).has_value());
  ASSERT_TRUE(got.Wait(absl::Seconds(10)).has_value());
  const absl::Status st = *got.Wait(absl::ZeroDuration());
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
  std::optional<v1::ErrorDetail> d = rpc::GetErrorDetail(st);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->code(), v1::ERROR_CODE_TRANSFER_FAILED);
  EXPECT_TRUE(d->retryable());
  EXPECT_EQ(d->worker_id(), "decode-1");
  receiver_->Forget("a", "done");
}

// No staging from the decode worker: a full budget (deadline) is overload,
// anything else a failed transfer; both name the decode worker, retryable,
// and the prefill's KV goes back (to the pools here: no prefix cache).
TEST_F(Handoff, TheSenderClassifiesMissingStaging) {
  Start();
  const std::vector<std::pair<absl::Status, v1::ErrorCode>> cases = {
      {absl::DeadlineExceededError("budget full"), v1::ERROR_CODE_OVERLOADED},
      {absl::ResourceExhaustedError("budget full"), v1::ERROR_CODE_OVERLOADED},
      {absl::NotFoundError("no pending transfer"), v1::ERROR_CODE_TRANSFER_FAILED}};
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string id = absl::StrCat("s", i);
    absl::Duration asked_timeout;
    ASSERT_TRUE(Prefill(id, testing::RandomPrompt(8, 10),
                        [&, i](absl::Duration timeout, DestinationFn done) {
                          asked_timeout = timeout;
                          done(cases[i].first);
                        })
                    .ok());
    WaitPrefilled(static_cast<int>(i) + 1);
    const absl::Status st = Get(id).prefill_status;
    EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
    std::optional<v1::ErrorDetail> d = rpc::GetErrorDetail(st);
    ASSERT_TRUE(d.has_value()) << st;
    EXPECT_EQ(d->code(), cases[i].second) << st;
    EXPECT_TRUE(d->retryable());
    EXPECT_EQ(d->worker_id(), "decode-1");
    EXPECT_EQ(asked_timeout, KvSenderOptions{}.transfer_timeout);
  }
}

TEST(KvHandoffOptions, CreateRejectsMissingParts) {
  EXPECT_EQ(KvSender::Create({}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(KvReceiver::Create({}).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace swaserve::worker
