// libFuzzer target: the coding-agent session parser
// (loadgen::ParseAgentSessions, lib/loadgen/agent_trace.h), which reads
// trace files a user points the replay at. Any input must parse or fail with
// InvalidArgument, never crash or hang. What parses must be consistent:
// sessions indexed in order, every sub-agent after its parent and in its
// parent's scope, every prompt with an id per full block; the
// schedule and the prompt synthesis then run on it (prompt lengths capped so
// a large `in` cannot allocate without bound). Seeds (corpus/agent_trace/)
// are small sessions in the trace's format, with and without sub-agents.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "lib/loadgen/agent_trace.h"

using swaserve::loadgen::AgentPromptSynthesizer;
using swaserve::loadgen::AgentSession;
using swaserve::loadgen::ParseAgentSessions;
using swaserve::loadgen::ScheduleAgentSessions;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto sessions = ParseAgentSessions(text);
  if (!sessions.ok()) {
    if (!absl::IsInvalidArgument(sessions.status())) __builtin_trap();
    return 0;
  }
  for (size_t i = 0; i < sessions->size(); ++i) {
    const AgentSession& s = (*sessions)[i];
    if (s.index != static_cast<int64_t>(i)) __builtin_trap();
    if (s.parent >= s.index || s.scope > s.index) __builtin_trap();
    if (s.parent >= 0 && (*sessions)[s.parent].scope != s.scope)
      __builtin_trap();
    if (s.block_tokens < 1) __builtin_trap();
    for (const auto& r : s.requests) {
      if (r.input_tokens < 0 || r.t_s < 0) __builtin_trap();
      if (static_cast<int64_t>(r.hash_ids.size()) <
          r.input_tokens / s.block_tokens) {
        __builtin_trap();
      }
    }
  }
  auto schedule =
      ScheduleAgentSessions(*sessions, {.concurrency = 2, .seed = 3});
  if (!schedule.ok()) return 0;  // e.g. durations that overflow to inf
  AgentPromptSynthesizer synth(
      {.scale = {.max_input_tokens = 4096}, .vocab_size = 1000});
  for (const auto& a : schedule->arrivals) {
    const auto tokens = synth.Next((*sessions)[a.session], a.request);
    if (tokens.size() > 4096) __builtin_trap();
  }
  return 0;
}
