// Tests for lib/model/jinja/template.h: hand-written templates with their
// expected output (the byte-for-byte comparison with @huggingface/jinja is
// jinja_golden_test.cc), error messages with line and column, the render
// limits against hostile templates, the provenance of untrusted bytes, and
// how JSON data becomes template values.
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/model/jinja/js_text.h"
#include "lib/model/jinja/template.h"
#include "nlohmann/json.hpp"

namespace swaserve::model::jinja {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::ordered_json;

absl::StatusOr<Rendered> RenderFull(const std::string& source,
                                    const Json& context = Json::object(),
                                    const RenderOptions& options = {}) {
  absl::StatusOr<std::unique_ptr<Template>> t = Template::Parse(source);
  if (!t.ok()) return t.status();
  return (*t)->Render(context, options);
}

absl::StatusOr<std::string> Render(const std::string& source,
                                   const Json& context = Json::object(),
                                   const RenderOptions& options = {}) {
  absl::StatusOr<Rendered> r = RenderFull(source, context, options);
  if (!r.ok()) return r.status();
  return r->text;
}

std::string Ok(const std::string& source,
               const Json& context = Json::object()) {
  absl::StatusOr<std::string> r = Render(source, context);
  EXPECT_TRUE(r.ok()) << source << ": " << r.status();
  return r.ok() ? *r : "<error>";
}

TEST(JinjaTemplateTest, ExpressionsAndOperators) {
  EXPECT_EQ(Ok("{{ 1 + 2 * 3 }}|{{ (1 + 2) * 3 }}|{{ 7 // 2 }}|{{ 7 / 2 }}|{{ "
               "2 ** 3 ** 2 }}"),
            "7|9|3|3.5|64");
  EXPECT_EQ(Ok("{{ 'a' ~ 1 ~ none is none }}"), "a1true");
  EXPECT_EQ(Ok("{{ 1 if x else 2 }}{{ 'y' if x }}", {{"x", false}}), "2");
  EXPECT_EQ(Ok("{{ [1, 2][::-1] }}{{ 'abc'[1:] }}{{ {'k': 'v'}['k'] }}"),
            "[2, 1]bcv");
  EXPECT_EQ(Ok("{{ 'b' in 'abc' and 3 not in [1, 2] }}"), "true");
  EXPECT_EQ(Ok("{{ x.y.z }}|{{ x is defined }}|{{ none is none }}"),
            "|false|true");
}

TEST(JinjaTemplateTest, StatementsLoopsAndScopes) {
  EXPECT_EQ(Ok("{% for m in ms %}{{ loop.index }}{{ m }}{% if not loop.last "
               "%},{% endif %}"
               "{% endfor %}",
               {{"ms", {"a", "b", "c"}}}),
            "1a,2b,3c");
  EXPECT_EQ(Ok("{% set ns = namespace(n=0) %}{% for x in [1, 2, 3] if x != 2 %}"
               "{% set ns.n = ns.n + x %}{% endfor %}{{ ns.n }}"),
            "4");
  // A plain set inside a loop does not leak; a namespace does.
  EXPECT_EQ(
      Ok("{% set n = 0 %}{% for x in [1] %}{% set n = 5 %}{% endfor %}{{ n }}"),
      "0");
  EXPECT_EQ(Ok("{% macro m(a, b='B') %}{{ a }}{{ b }}{% endmacro %}{{ m(1) "
               "}}{{ m(1, b=2) }}"),
            "1B12");
  EXPECT_EQ(Ok("{% for k, v in d | items %}{{ k }}={{ v }} {% endfor %}",
               {{"d", {{"x", 1}, {"y", "z"}}}}),
            "x=1 y=z ");
}

TEST(JinjaTemplateTest, WhitespaceControlAsTransformersSetsIt) {
  // trim_blocks: the newline after a block tag goes; lstrip_blocks: the
  // indentation before it.
  EXPECT_EQ(Ok("<\n  {% if true %}\n  x\n  {% endif %}\n>"), "<\n  x\n>");
  EXPECT_EQ(Ok("a  {{- 'b' -}}  c"), "abc");
  EXPECT_EQ(Ok("a {#- comment -#} b"), "ab");
  EXPECT_EQ(Ok("{{ 'x' }}\n"), "x");  // one trailing newline is dropped
}

TEST(JinjaTemplateTest, FiltersAndMethods) {
  EXPECT_EQ(Ok("{{ ' a ' | trim | upper }}|{{ 'a,b'.split(',') | join('-') }}|"
               "{{ [3, 1, 2] | sort | first }}|{{ x | default('d') }}|{{ 'x' | "
               "tojson }}"),
            "A|a-b|1|d|\"x\"");
  EXPECT_EQ(Ok("{{ d | tojson(indent=2) }}", {{"d", {{"a", {1, 2}}}}}),
            "{\n  \"a\": [\n    1,\n    2\n  ]\n}");
  EXPECT_EQ(
      Ok("{{ us | selectattr('ok') | map(attribute='n') | join(',') }}",
         {{"us", {{{"n", "a"}, {"ok", true}}, {{"n", "b"}, {"ok", false}}}}}),
      "a");
}

TEST(JinjaTemplateTest, ErrorsNameLineAndColumn) {
  auto parse = Render("line one\n{% for x in %}");
  ASSERT_FALSE(parse.ok());
  EXPECT_EQ(parse.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(parse.status().message(), HasSubstr("line 2, column 13"));
  auto unknown_filter = Render("ok\n  {{ 'x' | nope }}");
  EXPECT_THAT(unknown_filter.status().message(),
              HasSubstr("line 2, column 12"));
  EXPECT_THAT(unknown_filter.status().message(),
              HasSubstr("unknown filter 'nope'"));
  auto unknown_statement = Render("{% include 'a' %}");
  EXPECT_THAT(unknown_statement.status().message(),
              HasSubstr("line 1, column 1: unknown statement 'include'"));
  auto unclosed = Render("{% if true %}x");
  EXPECT_THAT(unclosed.status().message(), HasSubstr("end of the template"));
  auto raised = Render("{{ raise_exception('No tools allowed') }}");
  ASSERT_FALSE(raised.ok());
  EXPECT_EQ(raised.status().message(), "No tools allowed");
  EXPECT_TRUE(raised.status().GetPayload(kRaisedPayload).has_value());
  EXPECT_THAT(Render("{{ 'a' }").status().message(), HasSubstr("line 1"));
  EXPECT_FALSE(Render("{{ '\xFF' }}").ok());  // not UTF-8
}

TEST(JinjaTemplateTest, ContextNamesTheRuntimeOwnAreRejected) {
  EXPECT_THAT(Render("x", {{"range", 1}}).status().message(),
              HasSubstr("range"));
  EXPECT_FALSE(Render("x", Json::array()).ok());
}

TEST(JinjaTemplateTest, LimitsStopHostileTemplates) {
  RenderOptions small;
  small.limits.max_steps = 10000;
  small.limits.max_string_bytes = 1 << 16;
  small.limits.max_work_bytes = 1 << 22;
  auto loops = Render(
      "{% for i in range(1000) %}{% for j in range(1000) %}{% endfor %}{% "
      "endfor %}",
      Json::object(), small);
  EXPECT_THAT(loops.status().message(), HasSubstr("loop iterations"));
  auto recursion = Render("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}");
  EXPECT_THAT(recursion.status().message(), HasSubstr("nest deeper"));
  auto doubling = Render(
      "{% set ns = namespace(s='x') %}{% for i in range(40) %}"
      "{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
      Json::object(), small);
  EXPECT_THAT(doubling.status().message(), HasSubstr("over the limit"));
  auto quadratic = Render(
      "{% set ns = namespace(s='') %}{% for i in range(5000) %}"
      "{% set ns.s = ns.s ~ 'xxxxxxxx' %}{% endfor %}",
      Json::object(), small);
  EXPECT_THAT(quadratic.status().message(), HasSubstr("bytes of strings"));
  auto nested_lists = Render(
      "{% set ns = namespace(x=[]) %}{% for i in range(1000) %}"
      "{% set ns.x = [ns.x] %}{% endfor %}");
  EXPECT_THAT(nested_lists.status().message(), HasSubstr("nest deeper"));
  auto cycle =
      Render("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns | tojson }}");
  EXPECT_FALSE(cycle.ok());
  std::string parens(5000, '(');
  EXPECT_THAT(Render("{{ " + parens + "1" + std::string(5000, ')') + " }}")
                  .status()
                  .message(),
              HasSubstr("nests deeper"));
  EXPECT_THAT(Render("{{ range(100000000) | length }}").status().message(),
              HasSubstr("over the limit"));
  Json deep = 1;
  for (int i = 0; i < 1000; ++i) deep = Json::array({deep});
  EXPECT_FALSE(Render("{{ x }}", {{"x", deep}}).ok());
}

// Untrusted ranges of the output, as strings.
std::vector<std::string> UntrustedParts(const Rendered& r) {
  std::vector<std::string> parts;
  for (const ByteRange& b : r.untrusted) {
    parts.push_back(r.text.substr(b.begin, b.end - b.begin));
  }
  return parts;
}

TEST(JinjaTemplateTest, ProvenanceFollowsDataThroughStringOperations) {
  RenderOptions options;
  options.trusted_keys = {"bos"};
  auto r = RenderFull(
      "{{ bos }}<{{ m }}>{{ (m ~ 'T') | upper }}|{{ m.split('b')[1] }}|"
      "{{ m | replace('b', 'X') }}|{{ m[::-1] }}|{{ {'k': m} | tojson }}|{{ "
      "'lit' }}",
      {{"bos", "<s>"}, {"m", "abc"}}, options);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->text, "<s><abc>ABCT|c|aXc|cba|{\"k\": \"abc\"}|lit");
  EXPECT_THAT(
      UntrustedParts(*r),
      ::testing::ElementsAre("abc", "ABC", "c", "a", "c", "cba", "\"abc\""));
}

TEST(JinjaTemplateTest, ValuesFromJsonFollowJavaScript) {
  // Array-index keys first (numeric order), integral numbers are integers.
  EXPECT_EQ(
      Ok("{% for k in d %}{{ k }}{% endfor %}|{{ d | tojson }}|{{ f }}|{{ g }}",
         Json::parse(R"({"d": {"b": 1, "2": 2, "a": 3, "1": 4, "01": 5},
                               "f": 1.0, "g": 1.5})")),
      "12ba01|{\"1\": 4, \"2\": 2, \"b\": 1, \"a\": 3, \"01\": 5}|1|1.5");
  EXPECT_FALSE(Render("{{ s }}", {{"s", std::string("bad \xFF")}}).ok());
}

TEST(JinjaTemplateTest, RendersConcurrently) {
  auto t = Template::Parse("{% for i in range(n) %}{{ i }}{% endfor %}");
  ASSERT_TRUE(t.ok());
  std::vector<std::thread> threads;
  std::vector<std::string> out(8);
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] {
      for (int k = 0; k < 50; ++k) {
        auto r = (*t)->Render({{"n", 5 + i}});
        if (r.ok()) out[i] = r->text;
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int i = 0; i < 8; ++i) {
    std::string expected;
    for (int k = 0; k < 5 + i; ++k) expected += std::to_string(k);
    EXPECT_EQ(out[i], expected);
  }
}

TEST(JsTextTest, NumbersPrintAsJavaScript) {
  EXPECT_EQ(JsNumberToString(1e21), "1e+21");
  EXPECT_EQ(JsNumberToString(123456789012345680000.0), "123456789012345680000");
  EXPECT_EQ(JsNumberToString(0.000001), "0.000001");
  EXPECT_EQ(JsNumberToString(1.5e-7), "1.5e-7");
  EXPECT_EQ(JsNumberToString(-0.0), "0");
  EXPECT_EQ(JsFloatToString(-0.0), "-0.0");
  EXPECT_EQ(JsFloatToString(3), "3.0");
  EXPECT_EQ(JsNumberToJson(std::nan("")), "null");
  EXPECT_EQ(JsParseInt("  -12abc"), -12);
  EXPECT_TRUE(std::isnan(JsParseInt("x1")));
  EXPECT_EQ(JsParseFloat("3.5e2x"), 350);
  EXPECT_EQ(JsStringToNumber(" 0x1F "), 31);
  EXPECT_TRUE(std::isnan(JsStringToNumber("1x")));
  EXPECT_EQ(JsStringToNumber(""), 0);
}

TEST(JsTextTest, StringsCountAndCaseAsJavaScript) {
  EXPECT_EQ(Utf16Length("a😀é"), 4u);
  EXPECT_EQ(JsToUpper("straße ﬁ"), "STRASSE FI");
  EXPECT_EQ(JsToLower("ΟΔΟΣ ΣΑ İ"),
            "οδο\xCF\x82 \xCF\x83α i\xCC\x87");  // final sigma, dotted I
  EXPECT_EQ(JsTitle("hello wORLD x1y é_a éa"), "Hello WORLD X1y é_a éA");
  // U+FF21 sorts after U+1F600 in UTF-16 (before it in UTF-8).
  EXPECT_EQ(CompareUtf16("\xEF\xBC\xA1", "😀"), 1);
  EXPECT_EQ(CompareUtf16("ab", "abc"), -1);
  std::string json;
  AppendJsonString("a\"\n\x01é😀", /*ensure_ascii=*/true, &json);
  EXPECT_EQ(json, "\"a\\\"\\n\\u0001\\u00e9\\ud83d\\ude00\"");
}

}  // namespace
}  // namespace swaserve::model::jinja
