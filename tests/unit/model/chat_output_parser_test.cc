#include "lib/model/chat_output_parser.h"

#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/model/chat_format.h"
#include "lib/model/chat_template.h"

namespace swaserve::model {
namespace {

using OJson = nlohmann::ordered_json;
using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::SizeIs;

constexpr char kTemplatesDir[] = SWASERVE_SOURCE_DIR "/tests/fixtures/chat_templates/";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<ToolDefinition> Tools() {
  return {
      {.name = "add",
       .parameters = OJson::parse(R"({"type": "object", "properties": {
          "a": {"type": "integer"}, "b": {"type": "number"}}})")},
      {.name = "lookup",
       .parameters = OJson::parse(R"({"type": "object", "properties": {
          "word": {"type": "string"}, "exact": {"type": "boolean"},
          "tags": {"type": "array"}, "opts": {"type": "object"},
          "limit": {"type": ["integer", "null"]}}})")},
  };
}

ChatOutputOptions Xml() {
  return {.tool_format = ToolCallFormat::kXmlFunction,
          .parse_tool_calls = true,
          .tools = Tools(),
          .call_id_prefix = "r1_"};
}

// What a parser produced over a whole output, deltas joined.
struct Joined {
  std::string content, reasoning;
  std::vector<std::string> ids, names, args;
  int deltas_with_id = 0;
};

Joined RunAll(ChatOutputParser& p, const std::vector<std::string>& pieces) {
  Joined j;
  auto add = [&](const ChatOutputDelta& d) {
    j.content += d.content;
    j.reasoning += d.reasoning;
    for (const ToolCallDelta& t : d.tool_calls) {
      if (t.index >= static_cast<int>(j.args.size())) {
        j.args.resize(t.index + 1);
        j.ids.resize(t.index + 1);
        j.names.resize(t.index + 1);
      }
      if (!t.id.empty()) {
        ++j.deltas_with_id;
        j.ids[t.index] = t.id;
        j.names[t.index] = t.name;
      }
      j.args[t.index] += t.arguments;
    }
  };
  for (const std::string& s : pieces) add(p.Feed(s));
  add(p.Finish());
  return j;
}

// Every split of `text` into pieces of `n` bytes.
std::vector<std::string> Split(const std::string& text, size_t n) {
  std::vector<std::string> out;
  for (size_t i = 0; i < text.size(); i += n) out.push_back(text.substr(i, n));
  return out;
}

TEST(ChatOutputParserTest, XmlCallWithTypedArguments) {
  const std::string out =
      "Let me add.<tool_call>\n<function=add>\n<parameter=a>2</parameter>\n"
      "<parameter=b>3.5</parameter>\n</function>\n</tool_call>";
  for (size_t n : {1, 2, 3, 7, 1000}) {
    ChatOutputParser p(Xml());
    const Joined j = RunAll(p, Split(out, n));
    EXPECT_EQ(j.content, "Let me add.") << n;
    ASSERT_THAT(j.names, ElementsAre("add")) << n;
    EXPECT_EQ(j.ids[0], "call_r1_0");
    EXPECT_EQ(j.args[0], R"({"a": 2, "b": 3.5})");
    EXPECT_EQ(j.deltas_with_id, 1);
    ASSERT_THAT(p.calls(), SizeIs(1));
    EXPECT_EQ(p.calls()[0].arguments, j.args[0]);
  }
}

TEST(ChatOutputParserTest, ValuesKeepTheirExactTextAsStrings) {
  const std::string out =
      "<tool_call>\n<function=lookup>\n<parameter=word>  line one\nline \"two\" é</parameter>\n"
      "<parameter=exact>true</parameter>\n<parameter=tags>[\"a\", 1]</parameter>\n"
      "<parameter=opts>{\"k\": {\"n\": null}}</parameter>\n<parameter=limit>null</parameter>\n"
      "<parameter=extra>42</parameter>\n</function>\n</tool_call>";
  ChatOutputParser p(Xml());
  const Joined j = RunAll(p, Split(out, 5));
  ASSERT_THAT(j.names, ElementsAre("lookup"));
  const OJson args = OJson::parse(j.args[0]);
  EXPECT_EQ(args["word"], "  line one\nline \"two\" é");
  EXPECT_EQ(args["exact"], true);
  EXPECT_EQ(args["tags"], OJson::parse(R"(["a", 1])"));
  EXPECT_EQ(args["opts"]["k"]["n"], nullptr);
  EXPECT_EQ(args["limit"], nullptr);
  EXPECT_EQ(args["extra"], "42");  // undeclared: a string
  EXPECT_THAT(j.content, IsEmpty());
}

// A model can write bytes that are not UTF-8 anywhere; a parameter name or
// value with them still gives a call whose arguments are valid JSON.
TEST(ChatOutputParserTest, BytesThatAreNotUtf8DoNotBreakTheArguments) {
  ChatOutputParser p(Xml());
  const Joined j = RunAll(p, {"<tool_call>\n<function=lookup>\n<parameter=w\xfa>x\xfe</parameter>\n"
                              "</function>\n</tool_call>"});
  ASSERT_THAT(j.names, ElementsAre("lookup"));
  const OJson args = OJson::parse(j.args[0], nullptr, false);
  ASSERT_TRUE(args.is_object()) << j.args[0];
  EXPECT_EQ(args.size(), 1u);
}

TEST(ChatOutputParserTest, ValuesThatDoNotConvertStayStrings) {
  const OJson integer = OJson::parse(R"({"type": "integer"})");
  EXPECT_EQ(ConvertParameter("12", integer), 12);
  EXPECT_EQ(ConvertParameter(" 12\n", integer), 12);
  EXPECT_EQ(ConvertParameter("12.5", integer), "12.5");
  EXPECT_EQ(ConvertParameter("twelve", integer), "twelve");
  EXPECT_EQ(ConvertParameter("1e999", OJson::parse(R"({"type": "number"})")), "1e999");
  EXPECT_EQ(ConvertParameter("[1,", OJson::parse(R"({"type": "array"})")), "[1,");
  EXPECT_EQ(ConvertParameter("{}", OJson::parse(R"({"type": "array"})")), "{}");
  EXPECT_EQ(ConvertParameter("yes", OJson::parse(R"({"type": "boolean"})")), "yes");
  EXPECT_EQ(ConvertParameter("7", OJson::parse(R"({"type": ["string", "integer"]})")), "7");
}

TEST(ChatOutputParserTest, ParallelCallsAndWhitespaceBetweenThem) {
  const std::string call_a =
      "<tool_call>\n<function=add>\n<parameter=a>1</parameter>\n</function>\n</tool_call>";
  const std::string call_b =
      "<tool_call>\n<function=lookup>\n<parameter=word>x</parameter>\n</function>\n</tool_call>";
  const std::string out = call_a + "\n\n" + call_b + "\n";
  ChatOutputParser p(Xml());
  const Joined j = RunAll(p, Split(out, 4));
  EXPECT_THAT(j.names, ElementsAre("add", "lookup"));
  EXPECT_THAT(j.ids, ElementsAre("call_r1_0", "call_r1_1"));
  EXPECT_THAT(j.content, IsEmpty());

  ChatOutputOptions single = Xml();
  single.parallel_tool_calls = false;
  ChatOutputParser q(single);
  const Joined k = RunAll(q, Split(out, 4));
  EXPECT_THAT(k.names, ElementsAre("add"));
  EXPECT_EQ(k.content, call_b);  // the second call is text
  EXPECT_EQ(q.rejected_calls(), 1);
  EXPECT_EQ(p.rejected_calls(), 0);
}

TEST(ChatOutputParserTest, MalformedOrUnfinishedCallsAreText) {
  const std::vector<std::string> bad = {
      "<tool_call>\n<function=nosuch>\n</function>\n</tool_call>",
      "<tool_call>\n<function=add>\n<parameter=a>1\n</function>\n</tool_call>",
      "<tool_call>\n<function=add>\n<parameter=a>1</parameter>\n<parameter=a>2</parameter>\n"
      "</function>\n</tool_call>",
      "<tool_call>\nadd(1)\n</tool_call>",
      "<tool_call>\n<function=add>\n</function>\ntrailing</tool_call>",
      "<tool_call>\n<function=add>\n<parameter=a>1</parameter>",  // cut off
  };
  for (const std::string& out : bad) {
    ChatOutputParser p(Xml());
    const Joined j = RunAll(p, Split(out, 3));
    EXPECT_THAT(j.names, IsEmpty()) << out;
    EXPECT_EQ(j.content, out);
    EXPECT_THAT(p.calls(), IsEmpty());
    EXPECT_EQ(p.rejected_calls(), 1);
  }
}

TEST(ChatOutputParserTest, ReasoningIsSplitOffExactly) {
  for (bool open : {false, true}) {
    ChatOutputOptions o = Xml();
    o.starts_in_reasoning = open;
    const std::string out = std::string(open ? "" : "<think>") +
                            "\nI should call <tool_call>add</tool_call>? no.\n</think>\n\nIt is 4.";
    ChatOutputParser p(o);
    const Joined j = RunAll(p, Split(out, 2));
    EXPECT_EQ(j.reasoning, "\nI should call <tool_call>add</tool_call>? no.\n");
    EXPECT_EQ(j.content, "\n\nIt is 4.");
    EXPECT_THAT(j.names, IsEmpty());  // markup inside reasoning is not a call
  }
}

TEST(ChatOutputParserTest, ReasoningThenCall) {
  ChatOutputOptions o = Xml();
  o.starts_in_reasoning = true;
  ChatOutputParser p(o);
  EXPECT_TRUE(p.in_reasoning());
  const Joined j = RunAll(p, Split("Need a sum.</think><tool_call>\n<function=add>\n"
                                "<parameter=a>5</parameter>\n</function>\n</tool_call>",
                                6));
  EXPECT_FALSE(p.in_reasoning());
  EXPECT_EQ(j.reasoning, "Need a sum.");
  EXPECT_THAT(j.names, ElementsAre("add"));
  EXPECT_EQ(j.args[0], R"({"a": 5})");
}

TEST(ChatOutputParserTest, UnclosedReasoningIsAllReasoning) {
  ChatOutputOptions o = Xml();
  o.starts_in_reasoning = true;
  ChatOutputParser p(o);
  const Joined j = RunAll(p, {"thinking and ", "then cut off </thi"});
  EXPECT_EQ(j.reasoning, "thinking and then cut off </thi");
  EXPECT_THAT(j.content, IsEmpty());
}

TEST(ChatOutputParserTest, ThinkTagAfterContentIsText) {
  ChatOutputParser p(Xml());
  const Joined j = RunAll(p, {"Answer: <think>x</think>"});
  EXPECT_EQ(j.content, "Answer: <think>x</think>");
  EXPECT_THAT(j.reasoning, IsEmpty());
}

TEST(ChatOutputParserTest, NoParsingWithToolChoiceNone) {
  ChatOutputOptions o = Xml();
  o.parse_tool_calls = false;
  ChatOutputParser p(o);
  const std::string out =
      "<tool_call>\n<function=add>\n<parameter=a>1</parameter>\n</function>\n</tool_call>";
  const Joined j = RunAll(p, {out});
  EXPECT_EQ(j.content, out);
  EXPECT_THAT(j.names, IsEmpty());
}

TEST(ChatOutputParserTest, PartialTagsAreHeldNotLost) {
  ChatOutputParser p(Xml());
  ChatOutputDelta d = p.Feed("Hello <tool_");
  EXPECT_EQ(d.content, "Hello ");
  d = p.Feed("tip> world");
  EXPECT_EQ(d.content, "<tool_tip> world");
}

TEST(ChatOutputParserTest, JsonFormat) {
  ChatOutputOptions o = Xml();
  o.tool_format = ToolCallFormat::kJsonToolCall;
  const std::string out =
      "Sure.\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": [1, {\"c\": \"ü\"}]}}\n"
      "</tool_call>\n<tool_call>\n{\"name\": \"lookup\", \"arguments\": \"{\\\"word\\\": \\\"x\\\"}\"}\n"
      "</tool_call><tool_call>{\"name\": \"add\", \"arguments\": [1]}</tool_call>";
  ChatOutputParser p(o);
  const Joined j = RunAll(p, Split(out, 9));
  EXPECT_THAT(j.names, ElementsAre("add", "lookup"));
  EXPECT_EQ(j.args[0], R"({"a": 1, "b": [1, {"c": "ü"}]})");
  EXPECT_EQ(j.args[1], R"({"word": "x"})");
  EXPECT_EQ(j.content,
            "Sure.\n<tool_call>{\"name\": \"add\", \"arguments\": [1]}</tool_call>");
}

// Random splits of random mixtures give the same result as one piece.
TEST(ChatOutputParserTest, SplitsDoNotMatter) {
  const std::vector<std::string> parts = {
      "<think>", "</think>", "<tool_call>", "</tool_call>", "<function=add>", "</function>",
      "<parameter=a>", "</parameter>", "7", "text ", "\n", "<", "é", "<tool"};
  std::mt19937 rng(7);
  for (int round = 0; round < 2000; ++round) {
    std::string out;
    const int n = 1 + static_cast<int>(rng() % 12);
    for (int i = 0; i < n; ++i) out += parts[rng() % parts.size()];
    ChatOutputOptions o = Xml();
    o.starts_in_reasoning = rng() % 2 == 0;
    ChatOutputParser whole(o);
    const Joined a = RunAll(whole, {out});
    std::vector<std::string> pieces;
    for (size_t i = 0; i < out.size();) {
      const size_t len = 1 + rng() % 6;
      pieces.push_back(out.substr(i, len));
      i += len;
    }
    ChatOutputParser split(o);
    const Joined b = RunAll(split, pieces);
    ASSERT_EQ(a.content, b.content) << out;
    ASSERT_EQ(a.reasoning, b.reasoning) << out;
    ASSERT_EQ(a.args, b.args) << out;
    ASSERT_EQ(a.names, b.names) << out;
    // Nothing is lost: every byte is in a field or was markup of a call,
    // reasoning tags or blank text after a call.
    if (a.names.empty()) {
      ASSERT_LE(a.content.size() + a.reasoning.size(), out.size());
    }
  }
}

ChatTemplate* Load(const char* file) {
  static std::map<std::string, std::unique_ptr<ChatTemplate>> cache;
  auto& t = cache[file];
  if (t == nullptr) {
    auto r = ChatTemplate::FromJinja(ReadFile(std::string(kTemplatesDir) + file),
                                     {.eos_token = "<|im_end|>"});
    EXPECT_TRUE(r.ok()) << r.status();
    if (r.ok()) t = *std::move(r);
  }
  return t.get();
}

TEST(ChatFormatTest, DetectedFromTheTemplates) {
  const ChatFormat mimo = DetectChatFormat(*Load("mimo_v2_5.jinja"));
  EXPECT_TRUE(mimo.tools_supported);
  EXPECT_EQ(mimo.tool_format, ToolCallFormat::kXmlFunction);
  EXPECT_TRUE(mimo.thinking_switch);

  const ChatFormat qwen = DetectChatFormat(*Load("qwen3.jinja"));
  EXPECT_TRUE(qwen.tools_supported);
  EXPECT_EQ(qwen.tool_format, ToolCallFormat::kJsonToolCall);
  EXPECT_TRUE(qwen.thinking_switch);

  const ChatFormat deepseek = DetectChatFormat(*Load("deepseek_v3.jinja"));
  EXPECT_EQ(deepseek.tool_format, ToolCallFormat::kUnknown);
  EXPECT_TRUE(deepseek.null_content);
  EXPECT_FALSE(mimo.null_content);
  EXPECT_FALSE(qwen.null_content);

  const ChatFormat builtin = DetectChatFormat(*ChatTemplate::Builtin());
  EXPECT_FALSE(builtin.tools_supported);
  EXPECT_TRUE(builtin.thinking_switch);

  auto plain = ChatTemplate::FromJinja(
      "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}");
  ASSERT_TRUE(plain.ok());
  const ChatFormat none = DetectChatFormat(**plain);
  EXPECT_FALSE(none.tools_supported);
  EXPECT_FALSE(none.thinking_switch);
}

TEST(ChatFormatTest, OpensReasoning) {
  const ChatFormat f;
  EXPECT_TRUE(OpensReasoning("<|im_start|>assistant\n<think>", f));
  EXPECT_TRUE(OpensReasoning("<think>\n", f));
  EXPECT_FALSE(OpensReasoning("<|im_start|>assistant\n<think></think>", f));
  EXPECT_FALSE(OpensReasoning("<|im_start|>assistant\n", f));
}

// A MiMo turn rendered back from what the parser returned is the output
// itself: the next turn's prompt extends this one's token for token.
TEST(ChatFormatTest, MimoTurnRendersBackToTheOutput) {
  const ChatTemplate& t = *Load("mimo_v2_5.jinja");
  OJson tools = OJson::array();
  for (const ToolDefinition& d : Tools()) {
    tools.push_back({{"type", "function"},
                     {"function", {{"name", d.name}, {"parameters", d.parameters}}}});
  }
  ChatInput first;
  first.tools = tools;
  first.messages.push_back({{"role", "user"}, {"content", "add 2 and 3.5"}});
  const absl::StatusOr<std::string> prompt = t.Apply(first);
  ASSERT_TRUE(prompt.ok()) << prompt.status();
  ChatOutputOptions o = Xml();
  o.starts_in_reasoning = OpensReasoning(*prompt, DetectChatFormat(t));
  ASSERT_TRUE(o.starts_in_reasoning);
  const std::string output =
      "Two numbers.</think>Adding.<tool_call>\n<function=add>\n<parameter=a>2</parameter>\n"
      "<parameter=b>3.5</parameter>\n</function>\n</tool_call>";
  ChatOutputParser p(o);
  const Joined j = RunAll(p, Split(output, 3));
  ASSERT_THAT(j.names, ElementsAre("add"));

  ChatInput next = first;
  next.messages.push_back({{"role", "assistant"},
                           {"content", j.content},
                           {"reasoning_content", j.reasoning},
                           {"tool_calls",
                            OJson::array({{{"id", j.ids[0]},
                                           {"type", "function"},
                                           {"function",
                                            {{"name", "add"},
                                             {"arguments", OJson::parse(j.args[0])}}}}})}});
  next.messages.push_back({{"role", "tool"}, {"tool_call_id", j.ids[0]}, {"content", "5.5"}});
  const absl::StatusOr<std::string> second = t.Apply(next);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->substr(0, prompt->size() + output.size()), *prompt + output);
}

}  // namespace
}  // namespace swaserve::model
