// Coding-agent session traces (the kv-cache-tester format; see
// docs/benchmarks.md#traces, "Coding-agent sessions") and the deterministic
// prompts that replay them with real token ids.
//
// A trace is JSONL (optionally gzip-compressed), one session per line:
//   {"id": "...", "block_size": 64, "hash_id_scope": "local",
//    "requests": [{"t": 0.0, "type": "n", "in": 15818, "out": 154,
//                  "hash_ids": [...], "api_time": 5.2, "think_time": 0.0},
//                 {"t": 440.2, "type": "subagent", "requests": [...]}, ...]}
// `t` is seconds on the session's own clock; a sub-agent entry's `t` is its
// start on its parent's clock and its own requests' `t` count from there.
// hash_ids hold one id per full block_size-token block of the prompt (a
// partial last block has none), chained (equal leading ids = equal prefix),
// comparable only inside one session and its sub-agents (the id scope).
//
// Loading flattens the tree: every top-level session and every sub-agent
// becomes an AgentSession of its own (its own clock offset, its own
// requests); a sub-agent keeps its top-level session as `scope`, so its
// prompts share token ids with its parent's exactly where their hash ids
// agree.
//
// ScheduleAgentSessions places the top-level sessions on one timeline so that
// a chosen number run at once on average, and lists every request's arrival.
// AgentPromptSynthesizer turns a request into token ids: the Mooncake
// synthesis (mooncake_trace.h: block tokens from the block's id, the
// previous prompt's partial last block reconstructed in a continuation) over
// ids made unique per scope.
//
// Free functions are thread-safe; an AgentPromptSynthesizer is not.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "lib/loadgen/mooncake_trace.h"

namespace swaserve::loadgen {

struct AgentRequest {
  // Seconds from its session's start (the session's clock).
  double t_s = 0;
  // The client's seconds between the previous response and this request.
  double think_time_s = 0;
  // The model service's seconds for this request in the recording.
  double api_time_s = 0;
  int64_t input_tokens = 0;
  int64_t output_tokens = 0;
  // One id per full block of the prompt, local to the session's scope.
  std::vector<int64_t> hash_ids;
};

struct AgentSession {
  // Position in the loaded vector.
  int64_t index = 0;
  // Index of the top-level session whose ids this one shares (itself for a
  // top-level session).
  int64_t scope = 0;
  // Index of the session that started this sub-agent; -1 for top level.
  int64_t parent = -1;
  // Seconds from the scope's start to this session's start (0 for top
  // level; a sub-agent's `t` plus its parent's offset).
  double offset_s = 0;
  // The trace's session id (a sub-agent: its agent_id, else its parent's
  // id with "/sub<k>" appended).
  std::string id;
  int block_tokens = 64;
  std::vector<AgentRequest> requests;

  bool top_level() const { return parent < 0; }
  // Seconds from this session's start to the end of its last request
  // (t + api_time of the last one; 0 when it has none).
  double DurationS() const;
};

struct AgentParseOptions {
  // Top-level sessions to keep (0 = all); sub-agents come with theirs.
  int64_t limit = 0;
  // Deepest sub-agent nesting accepted (a deeper one is an error).
  int max_depth = 8;
  // Name used in error messages.
  std::string source = "agent trace";
};

// Parses JSONL text (one session per line; blank lines skipped) into
// sessions: each top-level session followed by its sub-agents, depth first
// in trace order. Errors name the source and the 1-based line: bad JSON,
// a missing or mistyped field, negative lengths or times, a prompt with
// fewer hash ids than its full blocks, block_size outside [1, 65536].
absl::StatusOr<std::vector<AgentSession>> ParseAgentSessions(
    absl::string_view jsonl, const AgentParseOptions& options = {});

// Reads `path` (gzip when it starts with the gzip magic, else plain text)
// and parses it as above.
absl::StatusOr<std::vector<AgentSession>> LoadAgentTrace(
    const std::string& path, const AgentParseOptions& options = {});

struct AgentScheduleOptions {
  // Mean number of top-level sessions running at once (each from its first
  // request to the end of its last). > 0: the start span is
  // sum(durations) / concurrency. 0: span_s is used as given.
  double concurrency = 0;
  // Top-level sessions start evenly over [0, span_s) in index order,
  // shuffled by `seed` (0 = index order, no shuffle).
  double span_s = 0;
  uint64_t seed = 0;
  // Session clocks (t, offsets) are multiplied by this.
  double time_scale = 1.0;
};

struct AgentArrival {
  double arrival_s = 0;
  int64_t session = 0;  // index into the sessions
  int64_t request = 0;  // index into its requests
};

struct AgentSchedule {
  double span_s = 0;
  // Start of each session (sub-agents: their scope's start + scaled offset).
  std::vector<double> start_s;
  // Every request, by arrival (ties: session index, then request index).
  std::vector<AgentArrival> arrivals;
};

// Places the sessions on one timeline (see AgentScheduleOptions).
// InvalidArgument for negative or non-finite options.
absl::StatusOr<AgentSchedule> ScheduleAgentSessions(
    const std::vector<AgentSession>& sessions,
    const AgentScheduleOptions& options);

// Block id of `local_id` in scope `scope`, unique across scopes (a 64-bit
// mix of both, kept non-negative).
int64_t ScopedBlockId(int64_t scope, int64_t local_id);

// The request as a Mooncake TraceRequest: hash ids made unique per scope
// (ScopedBlockId) and, when the prompt ends in a partial block the trace
// leaves unnamed, one more id for it (a function of the scope, the last full
// block's id and the prompt length: a continuation gets those tokens from
// the synthesizer's reconstruction, not from this id). Scaling by the
// session's block size is the caller's business. timestamp_ms is 0.
TraceRequest AsTraceRequest(const AgentSession& session, int64_t request);

// Prompts of agent requests. Call Next in arrival order (the order
// ScheduleAgentSessions lists): continuations are reconstructed per scope
// exactly as PromptSynthesizer does for Mooncake (the previous prompt's
// partial last block continues into the next prompt), across a session and
// its sub-agents. Memory: one PromptSynthesizer per scope until Release.
class AgentPromptSynthesizer {
 public:
  struct Options {
    // block_tokens is taken from each session; length_scale and the caps
    // apply as for Mooncake.
    ScaleOptions scale;
    uint32_t vocab_size = 152064;
    uint32_t first_id = 0;
    bool reconstruct_continuations = true;
  };
  explicit AgentPromptSynthesizer(const Options& options) : options_(options) {}

  // The prompt of request `request` of `session`
  // (ScaledInputLength(AsTraceRequest(...), scale) tokens).
  std::vector<uint32_t> Next(const AgentSession& session, int64_t request);
  // Drops a scope's state (after its last request).
  void Release(int64_t scope) { by_scope_.erase(scope); }

 private:
  const Options options_;
  absl::flat_hash_map<int64_t, std::unique_ptr<PromptSynthesizer>> by_scope_;
};

}  // namespace swaserve::loadgen
