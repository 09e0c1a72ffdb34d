// Anthropic Messages API responses for the router's HTTP layer: the whole
// message of a non-streamed request and the event stream of a streamed one.
// Part of swaserve::api (anthropic.h parses the requests).
//
// Usage, as Anthropic counts it (input_tokens + cache_read_input_tokens +
// cache_creation_input_tokens = the prompt's tokens):
//   cache_read_input_tokens     prompt tokens whose KV came from a prefix
//                               cache (v1::Usage.cached_tokens)
//   cache_creation_input_tokens prompt tokens computed up to the request's
//                               last cache_control breakpoint, which the
//                               cluster keeps for the breakpoint's TTL
//   input_tokens                the other prompt tokens
//
// Pure functions and a per-stream encoder; thread-safe except
// MessagesStream, which belongs to one stream.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "lib/api/openai_errors.h"
#include "lib/api/openai_response.h"

namespace swaserve::api {

// A message's usage in Anthropic's terms (see above).
struct MessagesUsage {
  uint32_t input_tokens = 0;
  uint32_t output_tokens = 0;
  uint32_t cache_read_input_tokens = 0;
  uint32_t cache_creation_input_tokens = 0;
};
// `breakpoint_tokens`: the prompt's tokens up to its last cache_control
// breakpoint (0: none).
MessagesUsage MessagesUsageFrom(const swaserve::v1::Usage& usage, uint32_t breakpoint_tokens);

// "end_turn", "max_tokens", "stop_sequence" or "tool_use" for a finished
// output (in.finish_reason, in.stop_sequence, in.finished_in_tool_calls).
std::string_view StopReasonString(const ResponseInput& in);

// The whole message (non-streamed): {"id": "msg_<request id>", "type":
// "message", "role": "assistant", "model", "content": [thinking?, text?,
// tool_use...], "stop_reason", "stop_sequence", "usage"}. Tool calls'
// arguments become `input` objects.
std::string MessagesResponseJson(const ResponseInput& in, const MessagesUsage& usage);

// The event stream of one streamed message, as server-sent events ("event:
// <type>\ndata: <json>\n\n"): message_start, then content blocks (thinking,
// text, tool_use: content_block_start, content_block_delta with
// thinking_delta / text_delta / input_json_delta, content_block_stop), then
// message_delta (stop reason, usage) and message_stop. Pings may come at
// any point after message_start. Not thread-safe: one per stream.
class MessagesStream {
 public:
  MessagesStream(std::string request_id, std::string model);

  bool started() const { return started_; }
  // Finish() ran.
  bool finished() const { return finished_; }
  // message_start with the prompt's token count so far (the final counts
  // travel in message_delta). Once; later calls return "".
  std::string Start(uint32_t prompt_tokens);
  // A ping event (message_start first when not started).
  std::string Ping(uint32_t prompt_tokens);
  // New output: reasoning, then text, then tool-call deltas (a delta with
  // an id opens a tool_use block; argument fragments follow as
  // input_json_delta). Opens and closes blocks as the kind changes.
  std::string Delta(std::string_view reasoning, std::string_view text,
                    const std::vector<ToolCallOut>& calls);
  // Closes the open block, then message_delta and message_stop.
  std::string Finish(const ResponseInput& last, const MessagesUsage& usage);
  // An error event ends the stream after a 200.
  static std::string Error(const ApiError& error);

 private:
  enum class Block { kNone, kThinking, kText, kToolUse };
  // Closes the open block unless it is `kind`; then opens `kind`.
  std::string Open(Block kind, std::string_view start_json_block);
  std::string Close();

  std::string id_;
  std::string model_;
  bool started_ = false;
  bool finished_ = false;
  Block open_ = Block::kNone;
  int index_ = -1;  // the open (or last) block's index
};

// One server-sent event: "event: <type>\ndata: <json>\n\n".
std::string SseEvent(std::string_view type, std::string_view json);

}  // namespace swaserve::api
