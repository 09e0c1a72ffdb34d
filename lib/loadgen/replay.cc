#include "lib/loadgen/replay.h"

#include <grpcpp/client_context.h>
#include <grpcpp/support/client_callback.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "lib/rpc/channel.h"
#include "swaserve/v1/router.grpc.pb.h"

namespace swaserve::loadgen {
namespace {

// Calls per channel (one HTTP/2 connection each).
constexpr int64_t kCallsPerChannel = 64;
constexpr size_t kMaxErrorSamples = 5;

const char* CodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
      return "OK";
    case grpc::StatusCode::CANCELLED:
      return "CANCELLED";
    case grpc::StatusCode::UNKNOWN:
      return "UNKNOWN";
    case grpc::StatusCode::INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND:
      return "NOT_FOUND";
    case grpc::StatusCode::ALREADY_EXISTS:
      return "ALREADY_EXISTS";
    case grpc::StatusCode::PERMISSION_DENIED:
      return "PERMISSION_DENIED";
    case grpc::StatusCode::UNAUTHENTICATED:
      return "UNAUTHENTICATED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION:
      return "FAILED_PRECONDITION";
    case grpc::StatusCode::ABORTED:
      return "ABORTED";
    case grpc::StatusCode::OUT_OF_RANGE:
      return "OUT_OF_RANGE";
    case grpc::StatusCode::UNIMPLEMENTED:
      return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL:
      return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE:
      return "UNAVAILABLE";
    case grpc::StatusCode::DATA_LOSS:
      return "DATA_LOSS";
    default:
      return "UNKNOWN";
  }
}

double Seconds(absl::Duration d) { return absl::ToDoubleSeconds(d); }

// Shared state of one Replay call. Thread-safe.
class ReplayRun {
 public:
  ReplayRun(int64_t total, int64_t limit, absl::Time start)
      : total_(total), limit_(limit), start_(start) {}

  absl::Time start() const { return start_; }

  // Blocks until fewer than `limit` calls are in flight, then counts one more.
  void AcquireSlot() {
    absl::MutexLock lock(&mu_, absl::Condition(this, &ReplayRun::HasSlot));
    ++in_flight_;
    ++sent_;
  }

  void AddOutputTokens(int64_t n) {
    output_tokens_.fetch_add(n, std::memory_order_relaxed);
  }

  // A call ended; its RequestResult is complete.
  void CallDone(bool ok) {
    absl::MutexLock lock(&mu_);
    --in_flight_;
    ++done_;
    if (!ok) ++errors_;
    end_ = absl::Now();
  }

  // Waits up to `timeout` for every call to end; returns a snapshot.
  ReplayProgress WaitAndSnapshot(absl::Duration timeout, bool* all_done) {
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(this, &ReplayRun::AllDone), timeout);
    *all_done = done_ == total_;
    ReplayProgress p;
    p.total = total_;
    p.sent = sent_;
    p.done = done_;
    p.errors = errors_;
    p.in_flight = in_flight_;
    p.elapsed_s = Seconds(absl::Now() - start_);
    return p;
  }

  int64_t output_tokens() const {
    return output_tokens_.load(std::memory_order_relaxed);
  }
  absl::Time end() {
    absl::MutexLock lock(&mu_);
    return end_;
  }

 private:
  bool HasSlot() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return in_flight_ < limit_;
  }
  bool AllDone() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return done_ == total_;
  }

  const int64_t total_;
  const int64_t limit_;
  const absl::Time start_;
  std::atomic<int64_t> output_tokens_{0};
  absl::Mutex mu_;
  int64_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t sent_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t done_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t errors_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time end_ ABSL_GUARDED_BY(mu_);
};

// One Generate stream. Owns itself: deleted in OnDone, after which it tells
// the run (so the run may be destroyed as soon as the last call reported).
class GenerateCall final
    : public grpc::ClientReadReactor<swaserve::v1::GenerateResponse> {
 public:
  GenerateCall(ReplayRun* run, RequestResult* result,
               swaserve::v1::Router::Stub* stub,
               swaserve::v1::GenerateRequest request, absl::Duration deadline)
      : run_(run), result_(result), stub_(stub), request_(std::move(request)) {
    deadline_ = deadline;
  }

  // Sends the request; `send` is the time the call counts from.
  void Start(absl::Time send) {
    send_ = send;
    context_.set_deadline(absl::ToChronoTime(send + deadline_));
    stub_->async()->Generate(&context_, &request_, this);
    StartRead(&response_);
    StartCall();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // End of stream or failure: OnDone follows.
    const int n = response_.token_ids_size();
    if (n > 0) {
      if (!got_token_) {
        got_token_ = true;
        first_token_ = absl::Now();
      }
      output_tokens_ += n;
      run_->AddOutputTokens(n);
    }
    if (response_.has_usage()) {
      prompt_tokens_ = response_.usage().prompt_tokens();
      cached_tokens_ = response_.usage().cached_tokens();
      draft_tokens_ = response_.usage().draft_tokens();
      accepted_draft_tokens_ = response_.usage().accepted_draft_tokens();
      if (response_.usage().has_prefill_queue_seconds()) {
        prefill_queue_s_ = response_.usage().prefill_queue_seconds();
      }
    }
    StartRead(&response_);
  }

  void OnDone(const grpc::Status& status) override {
    const absl::Time end = absl::Now();
    RequestResult& r = *result_;
    r.ok = status.ok();
    r.code = CodeName(status.error_code());
    if (!status.ok()) r.error = status.error_message();
    r.e2e_s = Seconds(end - send_);
    r.ttft_s = got_token_ ? Seconds(first_token_ - send_) : -1;
    r.output_tokens = output_tokens_;
    r.prompt_tokens = prompt_tokens_;
    r.cached_tokens = cached_tokens_;
    r.draft_tokens = draft_tokens_;
    r.accepted_draft_tokens = accepted_draft_tokens_;
    r.prefill_queue_s = prefill_queue_s_;
    ReplayRun* run = run_;
    const bool ok = status.ok();
    delete this;
    run->CallDone(ok);
  }

 private:
  ReplayRun* const run_;
  RequestResult* const result_;
  swaserve::v1::Router::Stub* const stub_;
  const swaserve::v1::GenerateRequest request_;
  absl::Duration deadline_;
  grpc::ClientContext context_;
  swaserve::v1::GenerateResponse response_;
  absl::Time send_;
  // Reads are serialized (one outstanding at a time), OnDone comes last.
  bool got_token_ = false;
  absl::Time first_token_;
  int64_t output_tokens_ = 0;
  int64_t prompt_tokens_ = 0;
  int64_t cached_tokens_ = 0;
  int64_t draft_tokens_ = 0;
  int64_t accepted_draft_tokens_ = 0;
  double prefill_queue_s_ = -1;
};

nlohmann::json DistributionJson(const Distribution& d) {
  return {{"count", d.count}, {"mean", d.mean}, {"min", d.min}, {"p50", d.p50},
          {"p90", d.p90},     {"p99", d.p99},   {"max", d.max}};
}

}  // namespace

std::string FormatProgress(const ReplayProgress& p) {
  return absl::StrFormat(
      "[%7.1fs] %d/%d done, %d errors, %d in flight, %.1f req/s, %.0f tok/s",
      p.elapsed_s, p.done, p.total, p.errors, p.in_flight,
      p.recent_requests_per_s, p.recent_output_tokens_per_s);
}

ReplayReport BuildReport(std::vector<RequestResult> results, double duration_s,
                         const ReplayOptions& options) {
  ReplayReport rep;
  rep.options = options;
  rep.duration_s = duration_s;
  std::vector<double> wait, ttft, tpot, e2e, prefill_queue;
  std::set<std::string> seen_errors;
  for (const RequestResult& r : results) {
    ++rep.requests;
    wait.push_back(r.queue_wait_s);
    rep.output_tokens += r.output_tokens;
    rep.prompt_tokens_sent += r.prompt_tokens_sent;
    if (!r.ok) {
      ++rep.failed;
      ++rep.errors_by_code[r.code];
      std::string sample = absl::StrCat(r.code, ": ", r.error);
      if (rep.error_samples.size() < kMaxErrorSamples &&
          seen_errors.insert(sample).second) {
        rep.error_samples.push_back(std::move(sample));
      }
      continue;
    }
    ++rep.succeeded;
    e2e.push_back(r.e2e_s);
    if (r.ttft_s >= 0) ttft.push_back(r.ttft_s);
    if (r.ttft_s >= 0 && r.output_tokens > 1) {
      tpot.push_back((r.e2e_s - r.ttft_s) /
                     static_cast<double>(r.output_tokens - 1));
    }
    rep.prompt_tokens += r.prompt_tokens;
    rep.cached_tokens += r.cached_tokens;
    rep.draft_tokens += r.draft_tokens;
    rep.accepted_draft_tokens += r.accepted_draft_tokens;
    if (r.prefill_queue_s >= 0) prefill_queue.push_back(r.prefill_queue_s);
  }
  rep.queue_wait_s = Summarize(std::move(wait));
  rep.ttft_s = Summarize(std::move(ttft));
  rep.tpot_s = Summarize(std::move(tpot));
  rep.e2e_s = Summarize(std::move(e2e));
  rep.prefill_queue_s = Summarize(std::move(prefill_queue));
  rep.cache_hit_rate = rep.prompt_tokens > 0
                           ? static_cast<double>(rep.cached_tokens) /
                                 static_cast<double>(rep.prompt_tokens)
                           : 0;
  if (duration_s > 0) {
    rep.output_tokens_per_s =
        static_cast<double>(rep.output_tokens) / duration_s;
    rep.requests_per_s = static_cast<double>(rep.succeeded) / duration_s;
  }
  rep.results = std::move(results);
  return rep;
}

std::string ReplayReport::ToText() const {
  std::string out = absl::StrFormat(
      "replay of %d requests against %s in %.2f s\n"
      "  (concurrency %d, length_scale %g, time_scale %g, max_input_tokens "
      "%d, max_output_tokens %d, vocab %d)\n\n",
      requests, options.router, duration_s, options.concurrency,
      options.scale.length_scale, options.scale.time_scale,
      options.scale.max_input_tokens, options.scale.max_output_tokens,
      options.vocab_size);
  absl::StrAppendFormat(&out, "  %-22s %d\n", "succeeded", succeeded);
  std::vector<std::string> codes;
  for (const auto& [code, n] : errors_by_code) {
    codes.push_back(absl::StrCat(code, " ", n));
  }
  absl::StrAppendFormat(
      &out, "  %-22s %d%s\n", "failed", failed,
      codes.empty() ? ""
                    : absl::StrCat("  (", absl::StrJoin(codes, ", "), ")"));
  for (const std::string& e : error_samples) {
    absl::StrAppendFormat(&out, "  %-22s %s\n", "", e);
  }
  absl::StrAppendFormat(&out, "\n  %-22s %7s %10s %10s %10s %10s %10s\n",
                        "latency (ms)", "count", "mean", "p50", "p90", "p99",
                        "max");
  auto row = [&out](const char* name, const Distribution& d) {
    absl::StrAppendFormat(
        &out, "  %-22s %7d %10.2f %10.2f %10.2f %10.2f %10.2f\n", name, d.count,
        d.mean * 1e3, d.p50 * 1e3, d.p90 * 1e3, d.p99 * 1e3, d.max * 1e3);
  };
  row("queue wait (client)", queue_wait_s);
  row("TTFT (from send)", ttft_s);
  row("TPOT", tpot_s);
  row("end-to-end (from send)", e2e_s);
  row("prefill sched. wait", prefill_queue_s);
  absl::StrAppendFormat(&out, "\n  %-22s %d  (%.1f tok/s)\n", "output tokens",
                        output_tokens, output_tokens_per_s);
  absl::StrAppendFormat(&out, "  %-22s %.2f\n", "requests/s", requests_per_s);
  absl::StrAppendFormat(&out, "  %-22s %d  (sent %d)\n", "prompt tokens",
                        prompt_tokens, prompt_tokens_sent);
  absl::StrAppendFormat(&out, "  %-22s %d  (hit rate %.1f%%)\n",
                        "cached tokens", cached_tokens, cache_hit_rate * 100);
  if (draft_tokens > 0) {
    absl::StrAppendFormat(&out, "  %-22s %d of %d drafted (%.1f%%)\n", "MTP drafts accepted",
                          accepted_draft_tokens, draft_tokens,
                          100.0 * static_cast<double>(accepted_draft_tokens) /
                              static_cast<double>(draft_tokens));
  }
  return out;
}

std::string ReplayReport::ToJson(bool include_requests) const {
  nlohmann::json j;
  j["requests"] = requests;
  j["succeeded"] = succeeded;
  j["failed"] = failed;
  j["errors_by_code"] = nlohmann::json::object();
  for (const auto& [code, n] : errors_by_code) j["errors_by_code"][code] = n;
  j["error_samples"] = error_samples;
  j["queue_wait_s"] = DistributionJson(queue_wait_s);
  j["ttft_s"] = DistributionJson(ttft_s);
  j["tpot_s"] = DistributionJson(tpot_s);
  j["e2e_s"] = DistributionJson(e2e_s);
  j["prefill_queue_s"] = DistributionJson(prefill_queue_s);
  j["duration_s"] = duration_s;
  j["output_tokens"] = output_tokens;
  j["output_tokens_per_s"] = output_tokens_per_s;
  j["requests_per_s"] = requests_per_s;
  j["prompt_tokens"] = prompt_tokens;
  j["prompt_tokens_sent"] = prompt_tokens_sent;
  j["cached_tokens"] = cached_tokens;
  j["cache_hit_rate"] = cache_hit_rate;
  j["draft_tokens"] = draft_tokens;
  j["accepted_draft_tokens"] = accepted_draft_tokens;
  j["ttft_excludes_queue_wait"] = true;
  j["options"] = {
      {"router", options.router},
      {"concurrency", options.concurrency},
      {"length_scale", options.scale.length_scale},
      {"time_scale", options.scale.time_scale},
      {"max_input_tokens", options.scale.max_input_tokens},
      {"max_output_tokens", options.scale.max_output_tokens},
      {"block_tokens", options.scale.block_tokens},
      {"vocab_size", options.vocab_size},
      {"first_token_id", options.first_token_id},
      {"model", options.model},
      {"request_deadline_s", Seconds(options.request_deadline)},
      {"prompt_synthesis", options.reconstruct_continuations
                               ? "continuations reconstructed"
                               : "plain per-block"},
  };
  if (include_requests) {
    nlohmann::json rs = nlohmann::json::array();
    for (const RequestResult& r : results) {
      rs.push_back({{"index", r.index},
                    {"ok", r.ok},
                    {"code", r.code},
                    {"error", r.error},
                    {"due_s", r.due_s},
                    {"queue_wait_s", r.queue_wait_s},
                    {"ttft_s", r.ttft_s},
                    {"e2e_s", r.e2e_s},
                    {"prompt_tokens_sent", r.prompt_tokens_sent},
                    {"max_tokens", r.max_tokens},
                    {"output_tokens", r.output_tokens},
                    {"prompt_tokens", r.prompt_tokens},
                    {"cached_tokens", r.cached_tokens},
                    {"draft_tokens", r.draft_tokens},
                    {"accepted_draft_tokens", r.accepted_draft_tokens},
                    {"prefill_queue_s", r.prefill_queue_s}});
    }
    j["results"] = std::move(rs);
  }
  return j.dump(2);
}

absl::StatusOr<ReplayReport> Replay(const std::vector<TraceRequest>& trace,
                                    const ReplayOptions& options) {
  if (options.router.empty()) {
    return absl::InvalidArgumentError("no router address");
  }
  if (options.concurrency < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("concurrency must be >= 1, got ", options.concurrency));
  }
  if (options.vocab_size <= options.first_token_id) {
    return absl::InvalidArgumentError(absl::StrCat(
        "vocab_size (", options.vocab_size, ") must exceed first_token_id (",
        options.first_token_id, ")"));
  }
  if (!(options.scale.length_scale > 0) || !(options.scale.time_scale >= 0) ||
      options.scale.block_tokens < 1) {
    return absl::InvalidArgumentError(
        "length_scale must be > 0, time_scale >= 0, block_tokens >= 1");
  }
  if (options.request_deadline <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("request deadline must be > 0");
  }

  // Channels (separate connections) and stubs.
  const int64_t num_channels =
      (options.concurrency + kCallsPerChannel - 1) / kCallsPerChannel;
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  std::vector<std::unique_ptr<swaserve::v1::Router::Stub>> stubs;
  for (int64_t c = 0; c < num_channels; ++c) {
    rpc::ChannelOptions copts;
    copts.use_local_subchannel_pool = num_channels > 1;
    copts.max_receive_message_bytes = -1;
    copts.max_send_message_bytes = -1;
    auto channel = rpc::CreateChannel(options.router, copts);
    if (!channel.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "router '", options.router, "': ", channel.status().message()));
    }
    if (absl::Status s =
            rpc::WaitForConnected(**channel, options.connect_timeout);
        !s.ok()) {
      return absl::UnavailableError(absl::StrCat(
          "cannot reach the router at ", options.router, " within ",
          absl::FormatDuration(options.connect_timeout), ": ", s.message()));
    }
    stubs.push_back(swaserve::v1::Router::NewStub(*channel));
    channels.push_back(*std::move(channel));
  }

  const int64_t n = static_cast<int64_t>(trace.size());
  std::vector<RequestResult> results(trace.size());
  const absl::Time start = absl::Now();
  if (n == 0) return BuildReport({}, 0, options);

  ReplayRun run(n, options.concurrency, start);
  const int64_t t0 = ScaledTimestampMs(trace[0], options.scale);

  std::thread dispatcher([&] {
    PromptSynthesizer synthesizer(
        {.scale = options.scale,
         .vocab_size = options.vocab_size,
         .first_id = options.first_token_id,
         .reconstruct_continuations = options.reconstruct_continuations});
    for (int64_t i = 0; i < n; ++i) {
      const TraceRequest& t = trace[i];
      RequestResult& r = results[i];
      r.index = i;
      const absl::Time due =
          start + absl::Milliseconds(std::max<int64_t>(
                      0, ScaledTimestampMs(t, options.scale) - t0));
      r.due_s = Seconds(due - start);

      swaserve::v1::GenerateRequest req;
      req.set_model(options.model);
      req.set_request_id(absl::StrCat(options.request_id_prefix, i));
      const std::vector<uint32_t> prompt = synthesizer.Next(t);
      r.prompt_tokens_sent = static_cast<int64_t>(prompt.size());
      req.mutable_token_ids()->mutable_ids()->Add(prompt.begin(), prompt.end());
      r.max_tokens = ScaledOutputLength(t, options.scale);
      auto* sampling = req.mutable_sampling();
      sampling->set_max_tokens(
          static_cast<uint32_t>(std::min<int64_t>(r.max_tokens, 0xFFFFFFFFll)));
      sampling->set_temperature(0);
      sampling->set_ignore_eos(true);

      const absl::Time now = absl::Now();
      if (due > now) absl::SleepFor(due - now);
      run.AcquireSlot();
      const absl::Time send = absl::Now();
      r.queue_wait_s = std::max(0.0, Seconds(send - due));
      auto* call = new GenerateCall(&run, &r, stubs[i % num_channels].get(),
                                    std::move(req), options.request_deadline);
      call->Start(send);
    }
  });

  // Progress until every call has ended.
  absl::Time last_time = start;
  int64_t last_done = 0;
  int64_t last_tokens = 0;
  while (true) {
    bool all_done = false;
    ReplayProgress p =
        run.WaitAndSnapshot(options.progress_interval, &all_done);
    const absl::Time now = absl::Now();
    const double dt = Seconds(now - last_time);
    const int64_t tokens = run.output_tokens();
    if (dt > 0) {
      p.recent_requests_per_s = static_cast<double>(p.done - last_done) / dt;
      p.recent_output_tokens_per_s =
          static_cast<double>(tokens - last_tokens) / dt;
    }
    last_time = now;
    last_done = p.done;
    last_tokens = tokens;
    if (options.on_progress) options.on_progress(p);
    if (all_done) break;
  }
  dispatcher.join();
  const double duration = Seconds(run.end() - start);
  return BuildReport(std::move(results), duration, options);
}

}  // namespace swaserve::loadgen
