// Tool-call grammars: the calls the chat templates render are accepted, and
// random walks through the grammar always give text the chat output parser
// reads back as exactly the calls of declared tools, with arguments of the
// declared types.
#include "lib/grammar/tool_call.h"

#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "lib/model/chat_output_parser.h"
#include "lib/model/tokenizer.h"
#include "nlohmann/json.hpp"
#include "tests/unit/grammar/grammar_test_util.h"

namespace swaserve::grammar {
namespace {

using Json = nlohmann::ordered_json;
using model::ToolCallFormat;
using testing::Matches;

std::vector<model::ToolDefinition> Tools() {
  return {
      {.name = "get_weather",
       .parameters = Json::parse(R"({"type": "object", "properties": {
           "location": {"type": "string"}, "days": {"type": "integer"},
           "unit": {"enum": ["celsius", "fahrenheit"]},
           "hours": {"type": "array", "items": {"type": "integer"}, "maxItems": 3}},
         "required": ["location", "unit"]})")},
      {.name = "ping", .parameters = Json::parse(R"({"type": "object", "properties": {}})")},
  };
}

std::shared_ptr<const CompiledGrammar> Compile(ToolCallFormat format, bool parallel,
                                               std::shared_ptr<const TokenVocabulary> v) {
  ToolCallGrammarOptions o;
  o.format = format;
  o.parallel_calls = parallel;
  auto g = CompileToolCall(Tools(), std::move(v), o);
  EXPECT_TRUE(g.ok()) << g.status();
  return *g;
}

TEST(ToolCall, AcceptsTheRenderedCalls) {
  auto xml = Compile(ToolCallFormat::kXmlFunction, false, testing::ByteVocabulary());
  // As MiMo's template renders a call.
  EXPECT_TRUE(Matches(xml,
                      "<tool_call>\n<function=get_weather>\n<parameter=location>Paris, FR</parameter>\n"
                      "<parameter=unit>celsius</parameter>\n</function>\n</tool_call>"));
  EXPECT_TRUE(Matches(xml,
                      "<tool_call>\n<function=get_weather>\n<parameter=location>a < b\nline 2</parameter>\n"
                      "<parameter=days>3</parameter>\n<parameter=unit>fahrenheit</parameter>\n"
                      "<parameter=hours>[1, 2]</parameter>\n</function>\n</tool_call>"));
  EXPECT_TRUE(Matches(xml, "<tool_call>\n<function=ping>\n</function>\n</tool_call>"));
  EXPECT_FALSE(Matches(xml, "<tool_call>\n<function=get_weather>\n<parameter=unit>celsius</parameter>\n"
                            "</function>\n</tool_call>"));  // location is required
  EXPECT_FALSE(Matches(xml, "<tool_call>\n<function=other>\n</function>\n</tool_call>"));
  auto json = Compile(ToolCallFormat::kJsonToolCall, true, testing::ByteVocabulary());
  // As Qwen3's template renders calls (arguments | tojson).
  const std::string call =
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris\", "
      "\"unit\": \"celsius\"}}\n</tool_call>";
  EXPECT_TRUE(Matches(json, call));
  EXPECT_TRUE(Matches(json, call + "\n<tool_call>\n{\"name\": \"ping\", \"arguments\": {}}\n</tool_call>"));
  auto xml_parallel = Compile(ToolCallFormat::kXmlFunction, true, testing::ByteVocabulary());
  const std::string ping = "<tool_call>\n<function=ping>\n</function>\n</tool_call>";
  EXPECT_TRUE(Matches(xml_parallel, ping + ping));  // as MiMo's template renders two calls
  EXPECT_FALSE(Matches(xml, ping + ping));          // parallel calls off
  EXPECT_FALSE(Matches(json, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"unit\": "
                             "\"kelvin\", \"location\": \"x\"}}\n</tool_call>"));
}

TEST(ToolCall, TextBeforeCallsThenOnlyCalls) {
  ToolCallGrammarOptions o;
  o.format = ToolCallFormat::kJsonToolCall;
  o.text_before_calls = true;
  auto g = *CompileToolCall(Tools(), testing::ByteVocabulary(), o);
  EXPECT_TRUE(Matches(g, ""));
  EXPECT_TRUE(Matches(g, "Just an answer with <tool and <tool_cal but no call."));
  const std::string call = "<tool_call>\n{\"name\": \"ping\", \"arguments\": {}}\n</tool_call>";
  EXPECT_TRUE(Matches(g, "Let me check. <tool_" + std::string("x ") + call));
  EXPECT_TRUE(Matches(g, "<tool_<tool_call>\n{\"name\": \"ping\", \"arguments\": {}}\n</tool_call>"));
  EXPECT_FALSE(Matches(g, "<tool_call>\n{\"name\": \"nope\"}\n</tool_call>"));  // once started, constrained
  EXPECT_FALSE(Matches(g, call + " and text after"));
  std::string longer;
  for (int i = 0; i < 500; ++i) longer += "word <tool_ ";
  EXPECT_TRUE(Matches(g, longer + call));  // tail calls: no stack growth
}

TEST(ToolCall, Errors) {
  auto bytes = testing::ByteVocabulary();
  ToolCallGrammarOptions xml;
  xml.format = ToolCallFormat::kXmlFunction;
  EXPECT_FALSE(CompileToolCall({}, bytes, xml).ok());
  EXPECT_FALSE(CompileToolCall({{.name = "a b", .parameters = Json::object()}}, bytes, xml).ok());
  auto pattern = CompileToolCall(
      {{.name = "f", .parameters = Json::parse(R"({"type": "object", "properties": {
          "s": {"type": "string", "pattern": "^a$"}}})")}},
      bytes, xml);
  ASSERT_FALSE(pattern.ok());
  EXPECT_NE(pattern.status().message().find("pattern"), std::string::npos);
  ToolCallGrammarOptions json;
  auto bad = CompileToolCall(
      {{.name = "f", .parameters = Json::parse(R"({"type": "object", "properties": {
          "n": {"type": "number", "multipleOf": 2}}})")}},
      bytes, json);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("tool f"), std::string::npos) << bad.status();
  EXPECT_NE(bad.status().message().find("multipleOf"), std::string::npos) << bad.status();
}

// Random walks on the demo vocabulary; the parser must read every output as
// calls of declared tools.
void WalkAndParse(ToolCallFormat format) {
  auto tok = *model::Tokenizer::Load(std::string(SWASERVE_SOURCE_DIR) + "/models/demo/tokenizer.json");
  auto vocab = *TokenVocabulary::FromTokenizer(*tok);
  auto g = Compile(format, /*parallel=*/true, vocab);
  std::mt19937_64 rng(static_cast<int>(format));
  int finished = 0;
  for (int walk = 0; walk < 40; ++walk) {
    GrammarMatcher m(g);
    std::vector<uint32_t> mask(vocab->BitmaskWords());
    std::string text;
    bool done = false;
    for (int step = 0; step < 600 && !done; ++step) {
      m.FillNextTokenMask(mask.data());
      std::vector<uint32_t> allowed, closing;
      for (uint32_t id = 0; id < static_cast<uint32_t>(vocab->size()); ++id) {
        if (!testing::MaskHas(mask, id)) continue;
        if (vocab->IsEos(id)) {
          done = true;
          break;
        }
        allowed.push_back(id);
        if (vocab->TokenBytes(id).find_first_of("<\"]}") != absl::string_view::npos) closing.push_back(id);
      }
      if (done) break;
      ASSERT_FALSE(allowed.empty()) << text;
      const auto& pool = !closing.empty() && rng() % 2 == 0 ? closing : allowed;
      const uint32_t id = pool[rng() % pool.size()];
      ASSERT_TRUE(m.AcceptToken(id));
      absl::StrAppend(&text, vocab->TokenBytes(id));
    }
    if (!done) continue;
    ++finished;
    model::ChatOutputParser parser({.tool_format = format, .parse_tool_calls = true, .tools = Tools()});
    parser.Feed(text);
    parser.Finish();
    EXPECT_EQ(parser.rejected_calls(), 0) << text;
    ASSERT_FALSE(parser.calls().empty()) << text;
    for (const model::ParsedToolCall& c : parser.calls()) {
      const Json args = Json::parse(c.arguments);
      if (c.name == "get_weather") {
        EXPECT_TRUE(args["location"].is_string()) << text;
        EXPECT_TRUE(args["unit"] == "celsius" || args["unit"] == "fahrenheit") << text;
        if (args.contains("days")) {
          EXPECT_TRUE(args["days"].is_number_integer()) << text;
        }
        if (args.contains("hours")) {
          EXPECT_TRUE(args["hours"].is_array()) << text;
        }
      }
    }
  }
  EXPECT_GE(finished, 30);
}

TEST(ToolCall, XmlWalksParseAsCalls) { WalkAndParse(ToolCallFormat::kXmlFunction); }
TEST(ToolCall, JsonWalksParseAsCalls) { WalkAndParse(ToolCallFormat::kJsonToolCall); }

}  // namespace
}  // namespace swaserve::grammar
