// What the Messages API layer (lib/api/anthropic.h, anthropic_response.h)
// costs beside the OpenAI layer it sits next to, on the router's CPU:
//   per request: parsing a 20-turn agent conversation (tool calls and tool
//     results, about 40 KB) into the v1::GenerateRequest, both APIs;
//   per streamed token: one token's event (MessagesStream::Delta) beside
//     one OpenAI chat chunk (ChatChunkJson + SseFrame).
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "lib/api/anthropic.h"
#include "lib/api/anthropic_response.h"
#include "nlohmann/json.hpp"

namespace swaserve::api {
namespace {

using json = nlohmann::json;

const char kSchema[] = R"({"type":"object","properties":{"path":{"type":"string"}},"required":["path"]})";

std::string Verse(int i) {
  std::string s = "turn " + std::to_string(i) + ": ";
  while (s.size() < 1800) s += "And God said, Let there be light: and there was light. ";
  return s;
}

// The same conversation as an OpenAI chat body and a Messages body.
std::pair<std::string, std::string> Bodies(int turns) {
  json o = {{"model", "demo"}, {"max_tokens", 256}};
  json a = o;
  o["tools"] = json::array({{{"type", "function"},
                             {"function", {{"name", "read"}, {"parameters", json::parse(kSchema)}}}}});
  a["tools"] = json::array({{{"name", "read"}, {"input_schema", json::parse(kSchema)}}});
  json om = json::array({{{"role", "user"}, {"content", "Fix the bug."}}});
  json am = om;
  for (int i = 0; i < turns; ++i) {
    const std::string id = "call_" + std::to_string(i);
    om.push_back({{"role", "assistant"},
                  {"content", nullptr},
                  {"tool_calls", json::array({{{"id", id},
                                               {"type", "function"},
                                               {"function", {{"name", "read"}, {"arguments", R"({"path":"a.cc"})"}}}}})}});
    om.push_back({{"role", "tool"}, {"tool_call_id", id}, {"content", Verse(i)}});
    am.push_back({{"role", "assistant"},
                  {"content", json::array({{{"type", "tool_use"}, {"id", id}, {"name", "read"},
                                            {"input", {{"path", "a.cc"}}}}})}});
    am.push_back({{"role", "user"},
                  {"content", json::array({{{"type", "tool_result"}, {"tool_use_id", id},
                                            {"content", Verse(i)}}})}});
  }
  o["messages"] = om;
  a["messages"] = am;
  return {o.dump(), a.dump()};
}

void BM_ParseOpenAiChat(benchmark::State& state) {
  const std::string body = Bodies(20).first;
  for (auto _ : state) benchmark::DoNotOptimize(ParseChatRequest(body));
  state.counters["body_bytes"] = static_cast<double>(body.size());
}
BENCHMARK(BM_ParseOpenAiChat)->Unit(benchmark::kMicrosecond);

void BM_ParseMessages(benchmark::State& state) {
  const std::string body = Bodies(20).second;
  for (auto _ : state) benchmark::DoNotOptimize(ParseMessagesRequest(body));
  state.counters["body_bytes"] = static_cast<double>(body.size());
}
BENCHMARK(BM_ParseMessages)->Unit(benchmark::kMicrosecond);

// 1,000 tokens of ~4 bytes each.
std::vector<std::string> Pieces() {
  std::vector<std::string> out;
  const std::string text = Verse(0);
  for (int i = 0; i < 1000; ++i) out.push_back(text.substr((i * 4) % 1600, 4));
  return out;
}

void BM_OpenAiChunkPerToken(benchmark::State& state) {
  const std::vector<std::string> pieces = Pieces();
  for (auto _ : state) {
    size_t bytes = 0;
    ResponseInput in;
    in.request_id = "r";
    in.model = "demo";
    for (const std::string& p : pieces) {
      in.text = p;
      bytes += SseFrame(ChatChunkJson(in)).size();
    }
    benchmark::DoNotOptimize(bytes);
  }
  state.counters["ns_per_token"] = benchmark::Counter(
      static_cast<double>(pieces.size()),
      benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_OpenAiChunkPerToken)->Unit(benchmark::kMicrosecond);

void BM_MessagesEventPerToken(benchmark::State& state) {
  const std::vector<std::string> pieces = Pieces();
  for (auto _ : state) {
    size_t bytes = 0;
    MessagesStream s("r", "demo");
    bytes += s.Start(100).size();
    for (const std::string& p : pieces) bytes += s.Delta("", p, {}).size();
    benchmark::DoNotOptimize(bytes);
  }
  state.counters["ns_per_token"] = benchmark::Counter(
      static_cast<double>(pieces.size()),
      benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_MessagesEventPerToken)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace swaserve::api

BENCHMARK_MAIN();
