// JSON Schema -> grammar: which strings each supported keyword admits, and
// the errors for what is not supported.
#include "lib/grammar/json_schema.h"

#include <string>

#include "gtest/gtest.h"
#include "tests/unit/grammar/grammar_test_util.h"

namespace swaserve::grammar {
namespace {

using testing::ByteVocabulary;
using testing::Matches;

std::shared_ptr<const CompiledGrammar> Compile(const std::string& schema,
                                               JsonGrammarOptions options = {}) {
  auto g = CompileJsonSchema(schema, ByteVocabulary(), options);
  EXPECT_TRUE(g.ok()) << schema << ": " << g.status();
  return g.ok() ? *g : nullptr;
}

TEST(JsonSchema, Scalars) {
  auto s = Compile(R"({"type": "string"})");
  EXPECT_TRUE(Matches(s, R"("")"));
  EXPECT_TRUE(Matches(s, R"("a\"b\\c\n\u00e9 é 中文 😀")"));
  EXPECT_FALSE(Matches(s, R"("\ud83d")"));  // surrogate escapes are not generated
  EXPECT_FALSE(Matches(s, "\"a\nb\""));      // raw control character
  EXPECT_FALSE(Matches(s, "\"\xff\""));      // not UTF-8
  EXPECT_FALSE(Matches(s, "\"abc"));
  auto i = Compile(R"({"type": "integer"})");
  EXPECT_TRUE(Matches(i, "0"));
  EXPECT_TRUE(Matches(i, "-120"));
  EXPECT_FALSE(Matches(i, "01"));
  EXPECT_FALSE(Matches(i, "1.5"));
  auto n = Compile(R"({"type": "number"})");
  EXPECT_TRUE(Matches(n, "-1.25e+10"));
  EXPECT_TRUE(Matches(n, "3"));
  EXPECT_FALSE(Matches(n, "1e999"));  // exponents up to 2 digits: always finite
  EXPECT_FALSE(Matches(n, "."));
  auto b = Compile(R"({"type": ["boolean", "null"]})");
  EXPECT_TRUE(Matches(b, "true"));
  EXPECT_TRUE(Matches(b, "null"));
  EXPECT_FALSE(Matches(b, "1"));
}

TEST(JsonSchema, ObjectsInSchemaOrderWithOptionalProperties) {
  auto g = Compile(R"({"type": "object", "properties": {
      "a": {"type": "integer"}, "b": {"type": "string"}, "c": {"type": "boolean"}},
      "required": ["b"], "additionalProperties": false})");
  EXPECT_TRUE(Matches(g, R"({"b":"x"})"));
  EXPECT_TRUE(Matches(g, R"({"a":1,"b":"x","c":true})"));
  EXPECT_TRUE(Matches(g, "{\n  \"a\": 1,\n  \"b\": \"x\"\n}"));
  EXPECT_TRUE(Matches(g, R"({"b":"x", "c":false})"));
  EXPECT_FALSE(Matches(g, R"({"a":1})"));          // b is required
  EXPECT_FALSE(Matches(g, R"({"b":"x","a":1})"));  // schema order
  EXPECT_FALSE(Matches(g, R"({"b":"x","d":1})"));  // undeclared
  EXPECT_FALSE(Matches(g, R"({,"b":"x"})"));
  EXPECT_FALSE(Matches(g, R"({"b":"x",})"));
  auto none = Compile(R"({"type": "object", "properties": {"a": {"type": "null"}}})");
  EXPECT_TRUE(Matches(none, "{}"));
  EXPECT_TRUE(Matches(none, R"({"a":null})"));
  auto any = Compile(R"({"type": "object"})");
  EXPECT_TRUE(Matches(any, R"({"x":[1,{"y":null}],"z":"w"})"));
}

TEST(JsonSchema, Whitespace) {
  JsonGrammarOptions compact;
  compact.max_whitespace = 0;
  auto g = Compile(R"({"type": "array", "items": {"type": "integer"}})", compact);
  EXPECT_TRUE(Matches(g, "[1,2]"));
  EXPECT_FALSE(Matches(g, "[1, 2]"));
  JsonGrammarOptions two;
  two.max_whitespace = 2;
  auto h = Compile(R"({"type": "array", "items": {"type": "integer"}})", two);
  EXPECT_TRUE(Matches(h, "[ 1 ,\n 2 ]"));
  EXPECT_FALSE(Matches(h, "[   1]"));
}

TEST(JsonSchema, Arrays) {
  auto g = Compile(R"({"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 3})");
  EXPECT_FALSE(Matches(g, "[]"));
  EXPECT_TRUE(Matches(g, R"(["a"])"));
  EXPECT_TRUE(Matches(g, R"(["a","b","c"])"));
  EXPECT_FALSE(Matches(g, R"(["a","b","c","d"])"));
  EXPECT_FALSE(Matches(g, R"([1])"));
  auto any = Compile(R"({"type": "array"})");
  EXPECT_TRUE(Matches(any, R"([1,"a",null,[]])"));
  EXPECT_TRUE(Matches(any, "[]"));
}

TEST(JsonSchema, EnumConstAnyOfOneOf) {
  auto e = Compile(R"({"enum": ["red", 1, null, {"k": [true]}]})");
  EXPECT_TRUE(Matches(e, R"("red")"));
  EXPECT_TRUE(Matches(e, "1"));
  EXPECT_TRUE(Matches(e, R"({"k":[true]})"));
  EXPECT_FALSE(Matches(e, R"("blue")"));
  auto typed = Compile(R"({"type": "string", "enum": ["a", 1]})");
  EXPECT_TRUE(Matches(typed, R"("a")"));
  EXPECT_FALSE(Matches(typed, "1"));
  auto c = Compile(R"({"const": "x"})");
  EXPECT_TRUE(Matches(c, R"("x")"));
  EXPECT_FALSE(Matches(c, R"("y")"));
  auto a = Compile(R"({"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 2}]})");
  EXPECT_TRUE(Matches(a, "12"));
  EXPECT_TRUE(Matches(a, R"("ab")"));
  EXPECT_FALSE(Matches(a, R"("abc")"));
  auto o = Compile(R"({"oneOf": [{"type": "null"}, {"type": "boolean"}]})");
  EXPECT_TRUE(Matches(o, "null"));
  EXPECT_TRUE(Matches(o, "false"));
}

TEST(JsonSchema, RefsAndRecursion) {
  auto g = Compile(R"({"$defs": {"node": {"type": "object", "properties": {
      "v": {"type": "integer"}, "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
      "required": ["v"], "additionalProperties": false}}, "$ref": "#/$defs/node"})");
  EXPECT_TRUE(Matches(g, R"({"v":1})"));
  EXPECT_TRUE(Matches(g, R"({"v":1,"children":[{"v":2,"children":[{"v":3}]},{"v":4}]})"));
  EXPECT_FALSE(Matches(g, R"({"v":1,"children":[{"w":2}]})"));
  auto root = Compile(R"({"type": "array", "items": {"anyOf": [{"type": "integer"}, {"$ref": "#"}]}})");
  EXPECT_TRUE(Matches(root, "[1,[2,[[]]]]"));
  auto defs = Compile(R"({"definitions": {"a": {"type": "string"}},
      "type": "object", "properties": {"x": {"$ref": "#/definitions/a"}}, "required": ["x"]})");
  EXPECT_TRUE(Matches(defs, R"({"x":"s"})"));
}

TEST(JsonSchema, StringLengthPatternFormat) {
  auto len = Compile(R"({"type": "string", "minLength": 2, "maxLength": 3})");
  EXPECT_FALSE(Matches(len, R"("a")"));
  EXPECT_TRUE(Matches(len, R"("中文")"));  // code points, not bytes
  EXPECT_TRUE(Matches(len, R"("a\nb")"));
  EXPECT_FALSE(Matches(len, R"("abcd")"));
  auto p = Compile(R"({"type": "string", "pattern": "^[a-z]+-\\d{2,3}$"})");
  EXPECT_TRUE(Matches(p, R"("ab-12")"));
  EXPECT_TRUE(Matches(p, R"("x-123")"));
  EXPECT_FALSE(Matches(p, R"("x-1")"));
  EXPECT_FALSE(Matches(p, R"("X-12")"));
  auto unanchored = Compile(R"({"type": "string", "pattern": "ab"})");
  EXPECT_TRUE(Matches(unanchored, R"("xxabyy")"));
  EXPECT_FALSE(Matches(unanchored, R"("xxayy")"));
  auto quote = Compile(R"j({"type": "string", "pattern": "^(\"|\\\\|[^a-z])*$"})j");
  EXPECT_TRUE(Matches(quote, R"("\"\\Z")"));
  EXPECT_FALSE(Matches(quote, R"("a")"));
  auto date = Compile(R"({"type": "string", "format": "date"})");
  EXPECT_TRUE(Matches(date, R"("2024-02-28")"));
  EXPECT_FALSE(Matches(date, R"("2024-02-30")"));
  EXPECT_FALSE(Matches(date, R"("2024-13-01")"));
  auto dt = Compile(R"({"type": "string", "format": "date-time"})");
  EXPECT_TRUE(Matches(dt, R"("2024-01-31T23:59:59.123Z")"));
  EXPECT_TRUE(Matches(dt, R"("2024-01-31T00:00:00+05:30")"));
  EXPECT_FALSE(Matches(dt, R"("2024-01-31T24:00:00Z")"));
  auto uuid = Compile(R"({"type": "string", "format": "uuid"})");
  EXPECT_TRUE(Matches(uuid, R"("123e4567-e89b-12d3-a456-426614174000")"));
  EXPECT_FALSE(Matches(uuid, R"("123e4567e89b12d3a456426614174000")"));
}

TEST(JsonSchema, UnsupportedIsAnErrorNamingIt) {
  auto vocab = ByteVocabulary();
  auto err = [&](const std::string& schema) {
    auto g = CompileJsonSchema(schema, vocab);
    EXPECT_FALSE(g.ok()) << schema;
    EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(g.status().message());
  };
  {
    const std::string m = err(R"({"type": "object", "properties": {"age": {"type": "integer", "multipleOf": 2}}})");
    EXPECT_NE(m.find("'multipleOf'"), std::string::npos) << m;
    EXPECT_NE(m.find("/properties/age"), std::string::npos) << m;
  }
  EXPECT_NE(err(R"({"type": "string", "format": "email"})").find("email"), std::string::npos);
  EXPECT_NE(err(R"j({"type": "string", "pattern": "(?=a)"})j").find("lookaround"), std::string::npos);
  EXPECT_NE(err(R"j({"type": "string", "pattern": "(a)\\1"})j").find("escape"), std::string::npos);
  EXPECT_NE(err(R"({"$ref": "#/$defs/missing"})").find("does not resolve"), std::string::npos);
  EXPECT_NE(err(R"({"$ref": "http://x/y"})").find("only references"), std::string::npos);
  EXPECT_NE(err(R"({"enum": []})").find("no value"), std::string::npos);
  EXPECT_NE(err(R"({"type": "object", "properties": {"a": {}}, "additionalProperties": {"type": "string"}})")
                .find("additionalProperties"),
            std::string::npos);
  EXPECT_NE(err(R"({"type": "string", "maxLength": 1000000})").find("maxLength"), std::string::npos);
  EXPECT_NE(err("{not json").find("not valid JSON"), std::string::npos);
  EXPECT_NE(err("false").find("no instance"), std::string::npos);
  // A required recursion that never ends has no finite instance.
  EXPECT_NE(err(R"({"$defs": {"a": {"type": "object", "properties": {"n": {"$ref": "#/$defs/a"}},
      "required": ["n"]}}, "$ref": "#/$defs/a"})")
                .find("no finite string"),
            std::string::npos);
}

TEST(JsonSchema, IntegerBounds) {
  auto g = Compile(R"({"type": "integer", "minimum": -12, "maximum": 107})");
  for (int v = -30; v <= 200; ++v) {
    EXPECT_EQ(Matches(g, std::to_string(v)), v >= -12 && v <= 107) << v;
  }
  EXPECT_FALSE(Matches(g, "-0"));
  EXPECT_FALSE(Matches(g, "007"));
  auto e = Compile(R"({"type": "integer", "exclusiveMinimum": 1.5, "exclusiveMaximum": 1000})");
  EXPECT_FALSE(Matches(e, "1"));
  EXPECT_TRUE(Matches(e, "2"));
  EXPECT_TRUE(Matches(e, "999"));
  EXPECT_FALSE(Matches(e, "1000"));
  auto lo = Compile(R"({"type": "integer", "minimum": 95})");
  EXPECT_TRUE(Matches(lo, "95"));
  EXPECT_TRUE(Matches(lo, "123456789"));
  EXPECT_FALSE(Matches(lo, "94"));
  EXPECT_FALSE(Matches(lo, "-100"));
  auto hi = Compile(R"({"type": "number", "maximum": -5.5})");
  EXPECT_TRUE(Matches(hi, "-6"));
  EXPECT_TRUE(Matches(hi, "-1000"));
  EXPECT_FALSE(Matches(hi, "-5"));
  EXPECT_FALSE(Matches(hi, "0"));
  auto vocab = ByteVocabulary();
  EXPECT_FALSE(CompileJsonSchema(R"({"type": "integer", "minimum": 3, "maximum": 2})", vocab).ok());
  EXPECT_FALSE(CompileJsonSchema(R"({"type": "integer", "minimum": "3"})", vocab).ok());
}

TEST(JsonSchema, JsonObjectGrammar) {
  auto g = *CompileJsonObject(ByteVocabulary());
  EXPECT_TRUE(Matches(g, "{}"));
  EXPECT_TRUE(Matches(g, R"({"a": {"b": [1, 2.5e3, "x", true, null, {}]}})"));
  EXPECT_FALSE(Matches(g, "[]"));
  EXPECT_FALSE(Matches(g, R"({"a": })"));
  std::string deep = "{\"a\":";
  for (int i = 0; i < 50; ++i) deep += "[";
  for (int i = 0; i < 50; ++i) deep += "]";
  EXPECT_TRUE(Matches(g, deep + "}"));
}

}  // namespace
}  // namespace swaserve::grammar
