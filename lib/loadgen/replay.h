// Replays a Mooncake trace (mooncake_trace.h) against a router's
// swaserve.v1.Router/Generate and reports latency, throughput and prefix-cache
// figures.
//
// How it sends: request i is due at start + (t_i - t_0) * time_scale (t = the
// trace timestamps; time_scale 0 sends as fast as the concurrency limit
// allows). Requests are dispatched in trace order by one thread; a request
// that is due while `concurrency` calls are in flight waits (FIFO) for a
// slot. Its prompt is SynthesizePrompt(...) (or PromptSynthesizer with
// reconstruct_continuations) sent as token_ids, with
// max_tokens = ScaledOutputLength, ignore_eos = true and temperature 0.
// Calls use the gRPC callback API (ClientReadReactor), so hundreds of
// concurrent streams need no threads of their own; channels are opened one
// per 64 concurrent calls.
//
// What it measures, per request (all wall-clock, absl::Now()):
//   queue wait   from the due time to the send (time waiting for a slot at
//                the client, plus any dispatcher lateness). NOT part of TTFT.
//   TTFT         from the send (StartCall) to the first response carrying
//                at least one token.
//   TPOT         (end - first token) / (output tokens - 1), for requests with
//                more than one output token.
//   end-to-end   from the send to the end of the stream (OnDone): also
//                excludes the queue wait.
// Latency figures cover successful requests only. Output tokens count the
// token ids received; prompt and cached tokens come from the final Usage of
// successful requests, and cache hit rate = cached / prompt tokens.
// Throughput figures divide by the run's duration: from the start of Replay
// to the end of the last call.
//
// Thread-safety: Replay blocks the calling thread until every call has
// ended; on_progress runs on that thread. Several Replays may run at once.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "lib/loadgen/mooncake_trace.h"
#include "lib/loadgen/stats.h"

namespace swaserve::loadgen {

// A snapshot of a running replay, for progress lines.
struct ReplayProgress {
  int64_t total = 0;      // requests to send
  int64_t sent = 0;       // calls started
  int64_t done = 0;       // calls ended (succeeded or failed)
  int64_t errors = 0;     // calls that ended with a non-OK status
  int64_t in_flight = 0;  // sent - done
  double elapsed_s = 0;   // since the start of Replay
  // Calls ended per second over the last progress interval.
  double recent_requests_per_s = 0;
  // Output tokens received per second over the last progress interval.
  double recent_output_tokens_per_s = 0;
};

// One line, e.g. "[   12.0s] 340/1000 done, 2 errors, 64 in flight,
// 28.1 req/s, 9520 tok/s".
std::string FormatProgress(const ReplayProgress& p);

struct ReplayOptions {
  // Router address: "host:port" (any gRPC target). Required.
  std::string router;
  // Length/time scaling and caps (block_tokens: the trace's block size).
  ScaleOptions scale;
  // Most calls in flight at once (>= 1).
  int64_t concurrency = 64;
  // Synthetic token ids are in [first_token_id, vocab_size).
  uint32_t vocab_size = 1000;
  uint32_t first_token_id = 0;
  // Rebuild conversation continuations (PromptSynthesizer); false: plain
  // per-block synthesis (SynthesizePrompt).
  bool reconstruct_continuations = false;
  // GenerateRequest.model ("" = the router's default).
  std::string model;
  // Deadline of each call, from its send.
  absl::Duration request_deadline = absl::Seconds(600);
  // How long to wait for the router's channel to connect before sending
  // anything; an unreachable router fails Replay with Unavailable.
  absl::Duration connect_timeout = absl::Seconds(10);
  // Called about every progress_interval (and once at the end) on the
  // thread running Replay. Optional.
  std::function<void(const ReplayProgress&)> on_progress;
  absl::Duration progress_interval = absl::Seconds(1);
  // request_id of request i is request_id_prefix + i.
  std::string request_id_prefix = "replay-";
};

// The outcome of one call.
struct RequestResult {
  int64_t index = 0;  // position in the replayed trace
  bool ok = false;
  std::string code;   // gRPC status code name: "OK", "UNAVAILABLE", ...
  std::string error;  // status message when !ok
  double due_s = 0;   // due time, seconds after the start
  double queue_wait_s = 0;
  double ttft_s = -1;  // -1: no token received
  double e2e_s = 0;
  int64_t prompt_tokens_sent = 0;
  int64_t max_tokens = 0;
  int64_t output_tokens = 0;  // token ids received
  // From the final Usage (0 when absent).
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;
  // MTP draft tokens proposed and accepted (Usage).
  int64_t draft_tokens = 0;
  int64_t accepted_draft_tokens = 0;
  // Usage.prefill_queue_seconds: the prompt's scheduling wait in the prefill
  // worker (-1 when absent).
  double prefill_queue_s = -1;
};

struct ReplayReport {
  int64_t requests = 0;   // calls sent
  int64_t succeeded = 0;  // OK status
  int64_t failed = 0;
  // gRPC status code name -> failed calls.
  std::map<std::string, int64_t> errors_by_code;
  // The first few distinct error messages ("CODE: message").
  std::vector<std::string> error_samples;

  Distribution queue_wait_s;  // every sent call
  Distribution ttft_s;        // successful calls that received a token
  Distribution tpot_s;        // successful calls with > 1 output token
  Distribution e2e_s;         // successful calls
  // Successful calls whose Usage carried the prefill scheduling wait.
  Distribution prefill_queue_s;

  double duration_s = 0;
  int64_t output_tokens = 0;       // received, all calls
  int64_t prompt_tokens_sent = 0;  // synthesized, all calls
  int64_t prompt_tokens = 0;       // Usage, successful calls
  int64_t cached_tokens = 0;       // Usage, successful calls
  double cache_hit_rate = 0;       // cached / prompt (0 when prompt is 0)
  int64_t draft_tokens = 0;           // MTP drafts proposed (Usage), successful calls
  int64_t accepted_draft_tokens = 0;  // and accepted
  double output_tokens_per_s = 0;
  double requests_per_s = 0;  // successful calls per second

  // The options that produced it (echoed in the JSON).
  ReplayOptions options;
  // Per call, in trace order.
  std::vector<RequestResult> results;

  // Human-readable table (seconds shown in ms).
  std::string ToText() const;
  // JSON object: the figures above (latencies in seconds), the options, and
  // per-request results when include_requests.
  std::string ToJson(bool include_requests = false) const;
};

// Computes the summary figures of a report from per-call `results` and the
// run's duration (exposed for tests; Replay calls it).
ReplayReport BuildReport(std::vector<RequestResult> results, double duration_s,
                         const ReplayOptions& options);

// Replays `trace` (in order) against options.router; returns when every call
// has ended. Fails (before sending anything) with InvalidArgument for bad
// options and Unavailable when the router cannot be reached within
// connect_timeout; failures of individual calls are counted in the report.
absl::StatusOr<ReplayReport> Replay(const std::vector<TraceRequest>& trace,
                                    const ReplayOptions& options);

}  // namespace swaserve::loadgen
