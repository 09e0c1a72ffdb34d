// Replays small traces against a fake Router (callback API, paced with
// grpc::Alarm, never blocking in a reactor) and checks the report.
//
// The fake streams max_tokens tokens, one per message, the first after
// kFirstTokenDelay and the others kTokenInterval apart; the last message
// carries finish_reason and usage (cached_tokens = prompt_tokens / 4, MTP
// drafts 3 per output token but the first, one of them accepted, and
// prefill_queue_seconds = prompt_tokens * 1e-4 for even prompts only). Prompt
// lengths are markers: 7 fails with INVALID_ARGUMENT, 9 with
// RESOURCE_EXHAUSTED, 11 never answers (until the client's deadline).
#include "lib/loadgen/replay.h"

#include <gmock/gmock.h>
#include <grpcpp/alarm.h>
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "lib/base/subprocess.h"
#include "lib/rpc/grpc_server.h"
#include "swaserve/v1/router.grpc.pb.h"

namespace swaserve::loadgen {
namespace {

using ::testing::HasSubstr;
using v1::GenerateRequest;
using v1::GenerateResponse;

constexpr absl::Duration kFirstTokenDelay = absl::Milliseconds(20);
constexpr absl::Duration kTokenInterval = absl::Milliseconds(2);

class FakeRouter final : public v1::Router::CallbackService {
 public:
  // Called by the streams.
  void Started(const GenerateRequest& req) {
    absl::MutexLock lock(&mu_);
    arrivals_[req.request_id()] = absl::Now();
    ++active_;
    max_active_ = std::max(max_active_, active_);
  }
  void Finishing() {
    absl::MutexLock lock(&mu_);
    --active_;
  }
  void Done() { done_.fetch_add(1); }

  int max_active() {
    absl::MutexLock lock(&mu_);
    return max_active_;
  }
  std::map<std::string, absl::Time> arrivals() {
    absl::MutexLock lock(&mu_);
    return arrivals_;
  }

 private:
  grpc::ServerWriteReactor<GenerateResponse>* Generate(
      grpc::CallbackServerContext* context,
      const GenerateRequest* request) override;

  absl::Mutex mu_;
  std::map<std::string, absl::Time> arrivals_ ABSL_GUARDED_BY(mu_);
  int active_ ABSL_GUARDED_BY(mu_) = 0;
  int max_active_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<int> done_{0};
};

class FakeStream final : public grpc::ServerWriteReactor<GenerateResponse> {
 public:
  FakeStream(FakeRouter* router, const GenerateRequest& req)
      : router_(router), request_(req) {
    router_->Started(req);
    const int n = req.token_ids().ids_size();
    if (n == 7) {
      FinishOnce(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "marker 7"));
      return;
    }
    if (n == 9) {
      FinishOnce(
          grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "marker 9"));
      return;
    }
    if (n == 11) return;  // Hangs until cancelled.
    total_ = std::max<int>(1, static_cast<int>(req.sampling().max_tokens()));
    Schedule(kFirstTokenDelay);
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      FinishOnce(grpc::Status(grpc::StatusCode::UNKNOWN, "write failed"));
      return;
    }
    if (++sent_ == total_) {
      FinishOnce(grpc::Status::OK);
      return;
    }
    Schedule(kTokenInterval);
  }

  void OnCancel() override {
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
      if (alarm_ != nullptr) alarm_->Cancel();
    }
    FinishOnce(grpc::Status::CANCELLED);
  }

  void OnDone() override {
    router_->Done();
    Unref();
  }

 private:
  void Schedule(absl::Duration delay) {
    absl::MutexLock lock(&mu_);
    if (cancelled_) return;
    refs_.fetch_add(1);
    alarm_ = std::make_unique<grpc::Alarm>();
    alarm_->Set(absl::ToChronoTime(absl::Now() + delay), [this](bool fired) {
      if (fired) Write();
      Unref();
    });
  }

  void Write() {
    if (finished_.load()) return;
    response_.Clear();
    response_.set_request_id(request_.request_id());
    response_.add_token_ids(static_cast<uint32_t>(sent_));
    if (sent_ + 1 == total_) {
      const uint32_t prompt = request_.token_ids().ids_size();
      response_.set_finish_reason(v1::FINISH_REASON_LENGTH);
      response_.mutable_usage()->set_prompt_tokens(prompt);
      response_.mutable_usage()->set_completion_tokens(total_);
      response_.mutable_usage()->set_cached_tokens(prompt / 4);
      response_.mutable_usage()->set_draft_tokens(3 * (total_ - 1));
      response_.mutable_usage()->set_accepted_draft_tokens(total_ - 1);
      if (prompt % 2 == 0) response_.mutable_usage()->set_prefill_queue_seconds(prompt * 1e-4);
    }
    StartWrite(&response_);
  }

  void FinishOnce(grpc::Status status) {
    if (finished_.exchange(true)) return;
    router_->Finishing();
    Finish(std::move(status));
  }
  void Unref() {
    if (refs_.fetch_sub(1) == 1) delete this;
  }

  FakeRouter* const router_;
  const GenerateRequest request_;
  GenerateResponse response_;
  int total_ = 0;
  int sent_ = 0;  // Writes are serialized.
  absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::unique_ptr<grpc::Alarm> alarm_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> finished_{false};
  std::atomic<int> refs_{1};
};

grpc::ServerWriteReactor<GenerateResponse>* FakeRouter::Generate(
    grpc::CallbackServerContext* context, const GenerateRequest* request) {
  return new FakeStream(this, *request);
}

TraceRequest Req(int64_t ts, int64_t input, int64_t output,
                 std::vector<int64_t> ids) {
  TraceRequest r;
  r.timestamp_ms = ts;
  r.input_length = input;
  r.output_length = output;
  r.hash_ids = std::move(ids);
  return r;
}

class ReplayTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = rpc::GrpcServer::Create(
        {.listen_address = "127.0.0.1:0", .services = {&fake_}});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown(absl::Seconds(2));
  }
  ReplayOptions Options() {
    ReplayOptions o;
    o.router = server_->local_target();
    o.vocab_size = 1000;
    o.first_token_id = 10;
    o.request_deadline = absl::Seconds(30);
    return o;
  }

  FakeRouter fake_;
  std::unique_ptr<rpc::GrpcServer> server_;
};

TEST_F(ReplayTest, CountsErrorsTokensAndHitRate) {
  std::vector<TraceRequest> trace;
  int64_t ok_prompt = 0, ok_cached = 0, ok_output = 0, all_prompt = 0, ok_accepted = 0;
  for (int i = 0; i < 30; ++i) {
    const int64_t input = 100 + 37 * i;  // up to 1173: 1-3 blocks
    const int64_t output = 1 + i % 12;
    std::vector<int64_t> ids;
    for (int64_t b = 0; b * 512 < input; ++b) ids.push_back(i % 3 + 100 * b);
    trace.push_back(Req(0, input, output, ids));
    ok_prompt += input;
    ok_cached += input / 4;
    ok_output += output;
    ok_accepted += output - 1;
    all_prompt += input;
  }
  for (int i = 0; i < 3; ++i) trace.push_back(Req(0, 7, 5, {1000 + i}));
  for (int i = 0; i < 2; ++i) trace.push_back(Req(0, 9, 5, {2000 + i}));
  all_prompt += 3 * 7 + 2 * 9;

  ReplayOptions o = Options();
  o.concurrency = 8;
  o.scale.time_scale = 0;
  int progress_calls = 0;
  ReplayProgress last;
  o.on_progress = [&](const ReplayProgress& p) {
    ++progress_calls;
    last = p;
  };
  o.progress_interval = absl::Milliseconds(50);
  auto rep = Replay(trace, o);
  ASSERT_TRUE(rep.ok()) << rep.status();

  EXPECT_EQ(rep->requests, 35);
  EXPECT_EQ(rep->succeeded, 30);
  EXPECT_EQ(rep->failed, 5);
  EXPECT_EQ(rep->errors_by_code,
            (std::map<std::string, int64_t>{{"INVALID_ARGUMENT", 3},
                                            {"RESOURCE_EXHAUSTED", 2}}));
  ASSERT_FALSE(rep->error_samples.empty());
  EXPECT_THAT(rep->error_samples[0], HasSubstr("marker"));
  EXPECT_EQ(rep->output_tokens, ok_output);
  EXPECT_EQ(rep->prompt_tokens, ok_prompt);
  EXPECT_EQ(rep->prompt_tokens_sent, all_prompt);
  EXPECT_EQ(rep->cached_tokens, ok_cached);
  EXPECT_EQ(rep->draft_tokens, 3 * ok_accepted);
  EXPECT_EQ(rep->accepted_draft_tokens, ok_accepted);
  EXPECT_DOUBLE_EQ(rep->cache_hit_rate, static_cast<double>(ok_cached) /
                                            static_cast<double>(ok_prompt));

  // Distributions: counts, order, plausible values.
  EXPECT_EQ(rep->queue_wait_s.count, 35);
  EXPECT_EQ(rep->ttft_s.count, 30);
  EXPECT_EQ(rep->e2e_s.count, 30);
  EXPECT_EQ(rep->tpot_s.count, 30 - 3);  // output 1 for i = 0, 12, 24
  for (const Distribution* d :
       {&rep->queue_wait_s, &rep->ttft_s, &rep->tpot_s, &rep->e2e_s}) {
    EXPECT_LE(d->min, d->p50);
    EXPECT_LE(d->p50, d->p90);
    EXPECT_LE(d->p90, d->p99);
    EXPECT_LE(d->p99, d->max);
  }
  EXPECT_GE(rep->ttft_s.min, absl::ToDoubleSeconds(kFirstTokenDelay) * 0.9);
  // TPOT per request is (e2e - ttft) / (n - 1): a first token the client
  // reads late (a loaded or ASan machine) shortens it, so its floor is loose.
  // The server-side delays are a hard floor for every request's end-to-end.
  EXPECT_GE(rep->tpot_s.p50, absl::ToDoubleSeconds(kTokenInterval) * 0.5);
  for (const RequestResult& r : rep->results) {
    if (!r.ok) continue;
    EXPECT_GE(r.e2e_s, absl::ToDoubleSeconds(kFirstTokenDelay +
                                             (r.output_tokens - 1) * kTokenInterval))
        << r.index;
  }
  EXPECT_LE(rep->ttft_s.p50, rep->e2e_s.p50);
  // 35 requests at t=0 through 8 slots: later ones waited at the client.
  EXPECT_GT(rep->queue_wait_s.max, absl::ToDoubleSeconds(kFirstTokenDelay));
  EXPECT_LE(fake_.max_active(), 8);
  EXPECT_EQ(fake_.max_active(), 8);
  EXPECT_GT(rep->duration_s, 0);
  EXPECT_NEAR(rep->output_tokens_per_s,
              static_cast<double>(ok_output) / rep->duration_s, 1e-6);
  EXPECT_NEAR(rep->requests_per_s, 30 / rep->duration_s, 1e-6);

  // Per-request results in trace order.
  ASSERT_EQ(rep->results.size(), 35u);
  for (int i = 0; i < 35; ++i) EXPECT_EQ(rep->results[i].index, i);
  EXPECT_EQ(rep->results[0].max_tokens, 1);
  EXPECT_EQ(rep->results[31].code, "INVALID_ARGUMENT");
  EXPECT_FALSE(rep->results[31].ok);
  // The prefill scheduling wait, where Usage carried it (even prompts:
  // input 100 + 37 i is even for even i).
  for (int i = 0; i < 30; ++i) {
    if (i % 2 == 0) {
      EXPECT_DOUBLE_EQ(rep->results[i].prefill_queue_s, (100 + 37 * i) * 1e-4) << i;
    } else {
      EXPECT_EQ(rep->results[i].prefill_queue_s, -1) << i;
    }
  }
  EXPECT_EQ(rep->prefill_queue_s.count, 15);
  EXPECT_DOUBLE_EQ(rep->prefill_queue_s.min, 100e-4);
  EXPECT_DOUBLE_EQ(rep->prefill_queue_s.max, (100 + 37 * 28) * 1e-4);

  // Progress ended with everything done.
  EXPECT_GE(progress_calls, 1);
  EXPECT_EQ(last.done, 35);
  EXPECT_EQ(last.total, 35);
  EXPECT_EQ(last.errors, 5);
  EXPECT_EQ(last.in_flight, 0);
  EXPECT_THAT(FormatProgress(last), HasSubstr("35/35 done, 5 errors"));

  // Text and JSON.
  const std::string text = rep->ToText();
  EXPECT_THAT(text, HasSubstr("TTFT"));
  EXPECT_THAT(text, HasSubstr("INVALID_ARGUMENT 3"));
  EXPECT_THAT(text, HasSubstr("hit rate"));
  EXPECT_THAT(text, HasSubstr(absl::StrCat("MTP drafts accepted    ", ok_accepted, " of ",
                                           3 * ok_accepted, " drafted (33.3%)")));
  const nlohmann::json j = nlohmann::json::parse(rep->ToJson(true));
  EXPECT_EQ(j["succeeded"], 30);
  EXPECT_EQ(j["errors_by_code"]["RESOURCE_EXHAUSTED"], 2);
  EXPECT_DOUBLE_EQ(j["cache_hit_rate"].get<double>(), rep->cache_hit_rate);
  EXPECT_DOUBLE_EQ(j["ttft_s"]["p99"].get<double>(), rep->ttft_s.p99);
  EXPECT_EQ(j["results"].size(), 35u);
  EXPECT_DOUBLE_EQ(j["results"][2]["prefill_queue_s"].get<double>(), 174e-4);
  EXPECT_EQ(j["prefill_queue_s"]["count"], 15);
  EXPECT_EQ(j["accepted_draft_tokens"], ok_accepted);
  EXPECT_EQ(j["results"][2]["draft_tokens"], 3 * 2);  // 3 output tokens
  EXPECT_THAT(text, HasSubstr("prefill sched. wait"));
  EXPECT_EQ(j["options"]["concurrency"], 8);
}

TEST_F(ReplayTest, HonorsScaledTiming) {
  std::vector<TraceRequest> trace;
  // Timestamps start at 1000: times are relative to the first request.
  for (int i = 0; i < 5; ++i) trace.push_back(Req(1000 + 200 * i, 50, 2, {i}));
  ReplayOptions o = Options();
  o.scale.time_scale = 0.5;  // 100 ms apart
  const absl::Time before = absl::Now();
  auto rep = Replay(trace, o);
  ASSERT_TRUE(rep.ok()) << rep.status();
  EXPECT_EQ(rep->succeeded, 5);
  const auto arrivals = fake_.arrivals();
  ASSERT_EQ(arrivals.size(), 5u);
  for (int i = 0; i < 5; ++i) {
    EXPECT_DOUBLE_EQ(rep->results[i].due_s, 0.1 * i);
    EXPECT_LT(rep->results[i].queue_wait_s, 0.05) << i;
    // Never before its due time (the replay starts after `before`); not
    // much after it (generous: sanitizer builds connect slowly).
    const double at = absl::ToDoubleSeconds(arrivals.at(absl::StrCat("replay-", i)) - before);
    EXPECT_GE(at, 0.1 * i) << i;
    EXPECT_LT(at, 0.1 * i + 0.3) << i;
  }
  EXPECT_GE(rep->duration_s, 0.4);
}

TEST_F(ReplayTest, SustainsSixtyFourStreams) {
  std::vector<TraceRequest> trace;
  for (int i = 0; i < 192; ++i) trace.push_back(Req(0, 600, 40, {i, 1000 + i}));
  ReplayOptions o = Options();
  o.concurrency = 64;
  o.scale.time_scale = 0;
  auto rep = Replay(trace, o);
  ASSERT_TRUE(rep.ok()) << rep.status();
  EXPECT_EQ(rep->succeeded, 192);
  EXPECT_EQ(rep->output_tokens, 192 * 40);
  EXPECT_EQ(fake_.max_active(), 64);
}

TEST_F(ReplayTest, DeadlineExceededIsCounted) {
  std::vector<TraceRequest> trace = {Req(0, 11, 5, {1}), Req(0, 30, 3, {2})};
  ReplayOptions o = Options();
  o.request_deadline = absl::Milliseconds(300);
  auto rep = Replay(trace, o);
  ASSERT_TRUE(rep.ok()) << rep.status();
  EXPECT_EQ(rep->succeeded, 1);
  EXPECT_EQ(rep->errors_by_code,
            (std::map<std::string, int64_t>{{"DEADLINE_EXCEEDED", 1}}));
  EXPECT_GE(rep->results[0].e2e_s, 0.29);
  EXPECT_EQ(rep->results[0].ttft_s, -1);
}

TEST_F(ReplayTest, EmptyTrace) {
  auto rep = Replay({}, Options());
  ASSERT_TRUE(rep.ok()) << rep.status();
  EXPECT_EQ(rep->requests, 0);
  EXPECT_EQ(rep->cache_hit_rate, 0);
}

TEST(Replay, UnreachableRouter) {
  const absl::StatusOr<int> port = base::PickFreePort();
  ASSERT_TRUE(port.ok()) << port.status();
  ReplayOptions o;
  o.router = absl::StrCat("127.0.0.1:", *port);
  o.connect_timeout = absl::Milliseconds(500);
  auto rep = Replay({Req(0, 10, 1, {1})}, o);
  ASSERT_FALSE(rep.ok());
  EXPECT_EQ(rep.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(rep.status().message()), HasSubstr(o.router));
}

TEST(Replay, BadOptions) {
  ReplayOptions o;
  o.router = "127.0.0.1:1";
  o.concurrency = 0;
  EXPECT_EQ(Replay({}, o).status().code(), absl::StatusCode::kInvalidArgument);
  o.concurrency = 1;
  o.vocab_size = 5;
  o.first_token_id = 5;
  EXPECT_EQ(Replay({}, o).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Replay({}, ReplayOptions{}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace swaserve::loadgen
