// What the chat output parser (lib/model/chat_output_parser.h) adds per
// streamed token: a 2,000-token output fed one token's text at a time, as
// the router's HTTP layer feeds it, for plain content, reasoning then
// content, and reasoning then a tool call with typed arguments; beside it
// the baseline of appending the same pieces to a string (what the layer
// does without a parser). Time per token = time per iteration / tokens.
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "lib/model/chat_output_parser.h"

namespace swaserve::model {
namespace {

// ~4-byte pieces, as a BPE tokenizer's tokens of English text are.
std::vector<std::string> Pieces(const std::string& text) {
  std::vector<std::string> out;
  for (size_t i = 0; i < text.size(); i += 4) out.push_back(text.substr(i, 4));
  return out;
}

std::string Words(size_t bytes) {
  const std::string verse = "And God said, Let there be light: and there was light. ";
  std::string s;
  while (s.size() < bytes) s += verse;
  s.resize(bytes);
  return s;
}

std::vector<std::string> Output(int kind) {
  std::string text;
  if (kind == 0) text = Words(8000);
  if (kind == 1) text = Words(4000) + "</think>" + Words(4000);
  if (kind == 2) {
    text = Words(6000) + "</think><tool_call>\n<function=lookup>\n<parameter=word>" + Words(1500) +
           "</parameter>\n<parameter=limit>12</parameter>\n</function>\n</tool_call>";
  }
  return Pieces(text);
}

ChatOutputOptions Options(int kind) {
  ChatOutputOptions o;
  o.tool_format = ToolCallFormat::kXmlFunction;
  o.parse_tool_calls = true;
  o.starts_in_reasoning = kind > 0;
  o.tools = {{.name = "lookup",
              .parameters = nlohmann::ordered_json::parse(
                  R"({"properties": {"word": {"type": "string"}, "limit": {"type": "integer"}}})")}};
  return o;
}

void BM_Parser(benchmark::State& state) {
  const int kind = static_cast<int>(state.range(0));
  const std::vector<std::string> pieces = Output(kind);
  const ChatOutputOptions options = Options(kind);
  for (auto _ : state) {
    ChatOutputParser p(options);
    size_t bytes = 0;
    for (const std::string& s : pieces) {
      const ChatOutputDelta d = p.Feed(s);
      bytes += d.content.size() + d.reasoning.size() + d.tool_calls.size();
    }
    bytes += p.Finish().content.size();
    benchmark::DoNotOptimize(bytes);
  }
  state.counters["tokens"] = static_cast<double>(pieces.size());
  state.counters["ns_per_token"] = benchmark::Counter(
      static_cast<double>(pieces.size()),
      benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_Parser)->ArgName("kind")->Arg(0)->Arg(1)->Arg(2)->Unit(benchmark::kMicrosecond);

void BM_AppendBaseline(benchmark::State& state) {
  const std::vector<std::string> pieces = Output(static_cast<int>(state.range(0)));
  for (auto _ : state) {
    std::string out;
    for (const std::string& s : pieces) out += s;
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["ns_per_token"] = benchmark::Counter(
      static_cast<double>(pieces.size()),
      benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_AppendBaseline)->ArgName("kind")->Arg(0)->Arg(2)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace swaserve::model

BENCHMARK_MAIN();
