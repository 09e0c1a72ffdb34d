// ConstraintFactory over the demo model's tokenizer: what the sampler sees of
// a constraint — masks that allow exactly the grammar's tokens, the
// reasoning gate (free until its closing token, but EOS masked), replay of a
// migrated stream's tokens, termination — and the sampler drawing only
// allowed tokens.
#include "lib/worker/output_constraint.h"

#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "lib/model/sampling.h"
#include "lib/model/tokenizer.h"

namespace swaserve::worker {
namespace {

class OutputConstraintTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto t = model::Tokenizer::Load(std::string(SWASERVE_SOURCE_DIR) + "/models/demo/tokenizer.json");
    ASSERT_TRUE(t.ok()) << t.status();
    tok_ = t->release();
    eos_ = tok_->eos_ids();
    ASSERT_FALSE(eos_.empty());
    auto f = ConstraintFactory::Create(*tok_, eos_);
    ASSERT_TRUE(f.ok()) << f.status();
    factory_ = f->release();
  }
  static void TearDownTestSuite() {
    delete factory_;
    delete tok_;
  }
  static std::vector<uint32_t> Ids(const std::string& text) { return *tok_->Encode(text, false); }
  static bool Allowed(const std::vector<uint32_t>& mask, uint32_t id) {
    return (mask[id / 32] >> (id % 32)) & 1u;
  }
  static v1::OutputConstraint Schema(const std::string& schema) {
    v1::OutputConstraint c;
    c.set_kind(v1::OutputConstraint::KIND_JSON_SCHEMA);
    c.set_json_schema(schema);
    return c;
  }
  static model::Tokenizer* tok_;
  static std::vector<uint32_t> eos_;
  static ConstraintFactory* factory_;
};
model::Tokenizer* OutputConstraintTest::tok_ = nullptr;
std::vector<uint32_t> OutputConstraintTest::eos_;
ConstraintFactory* OutputConstraintTest::factory_ = nullptr;

TEST_F(OutputConstraintTest, MasksFollowTheGrammarToItsEnd) {
  auto c = factory_->Make(Schema(R"({"enum": ["yes", "no"]})"));
  ASSERT_TRUE(c.ok()) << c.status();
  std::vector<uint32_t> mask;
  ASSERT_TRUE((*c)->FillMask(&mask));
  const uint32_t quote = tok_->Encode("\"", false)->at(0);
  EXPECT_TRUE(Allowed(mask, quote));
  EXPECT_FALSE(Allowed(mask, tok_->Encode("{", false)->at(0)));
  for (uint32_t e : eos_) EXPECT_FALSE(Allowed(mask, e));
  for (uint32_t id : Ids("\"yes\"")) ASSERT_TRUE((*c)->Accept(id));
  EXPECT_TRUE((*c)->Terminated());
  ASSERT_TRUE((*c)->FillMask(&mask));
  for (uint32_t e : eos_) EXPECT_TRUE(Allowed(mask, e));  // accepting: it may end
  EXPECT_FALSE((*c)->Accept(quote));
}

TEST_F(OutputConstraintTest, ReasoningIsFreeButMustEnd) {
  v1::OutputConstraint spec = Schema(R"({"type": "boolean"})");
  const std::optional<uint32_t> close = tok_->TokenId("</think>");
  ASSERT_TRUE(close.has_value());
  spec.set_start_after_token(*close);
  auto c = factory_->Make(spec);
  ASSERT_TRUE(c.ok()) << c.status();
  std::vector<uint32_t> mask;
  ASSERT_TRUE((*c)->FillMask(&mask));
  for (uint32_t e : eos_) EXPECT_FALSE(Allowed(mask, e));
  const uint32_t word = tok_->Encode(" light", false)->at(0);
  EXPECT_TRUE(Allowed(mask, word));
  EXPECT_TRUE((*c)->Accept(word));
  EXPECT_TRUE((*c)->Accept(*close));
  ASSERT_TRUE((*c)->FillMask(&mask));
  EXPECT_FALSE(Allowed(mask, word));
  EXPECT_TRUE(Allowed(mask, tok_->Encode("t", false)->at(0)));
}

TEST_F(OutputConstraintTest, AMigratedStreamContinuesWhereItStood) {
  v1::OutputConstraint spec = Schema(R"({"type": "array", "items": {"type": "integer"}})");
  for (uint32_t id : Ids("[1, 2")) spec.add_generated_token_ids(id);
  auto c = factory_->Make(spec);
  ASSERT_TRUE(c.ok()) << c.status();
  for (uint32_t id : Ids("]")) ASSERT_TRUE((*c)->Accept(id));
  EXPECT_TRUE((*c)->Terminated());
  spec.clear_generated_token_ids();
  for (uint32_t id : Ids("{")) spec.add_generated_token_ids(id);
  EXPECT_FALSE(factory_->Make(spec).ok());
  // What cannot be compiled is named.
  auto bad = factory_->Make(Schema(R"({"type": "string", "multipleOf": 2})"));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("multipleOf"), std::string::npos);
  // No constraint: null.
  auto none = factory_->Make(v1::OutputConstraint());
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, nullptr);
}

TEST_F(OutputConstraintTest, TheSamplerDrawsOnlyAllowedTokens) {
  const int V = tok_->vocab_size();
  for (uint64_t seed = 0; seed < 20; ++seed) {
    auto c = factory_->Make(Schema(R"({"type": "object", "properties": {"a": {"type": "integer"}},
                                       "required": ["a"], "additionalProperties": false})"));
    ASSERT_TRUE(c.ok());
    model::SamplingOptions o;
    o.temperature = 1.5f;
    o.seed = seed;
    o.top_logprobs = 3;
    o.constraint = *c;
    model::Sampler s(o);
    std::vector<float> logits(static_cast<size_t>(V));
    std::mt19937 gen(static_cast<uint32_t>(seed));
    std::string text;
    for (int step = 0; step < 200 && !s.Terminated(); ++step) {
      for (float& l : logits) l = std::uniform_real_distribution<float>(-5, 5)(gen);
      const model::SampledToken t = s.Sample(logits);
      if (std::find(eos_.begin(), eos_.end(), t.token) != eos_.end()) break;
      text += std::string(tok_->TokenBytes(t.token));
      for (const auto& [id, lp] : t.top) EXPECT_TRUE(std::isfinite(lp));
    }
    // Random logits, constrained: a whole object with an integer "a".
    ASSERT_TRUE(s.Terminated()) << text;
    const std::string compact = [&] {
      std::string out;
      for (char ch : text) {
        if (ch != ' ' && ch != '\n' && ch != '\t' && ch != '\r') out += ch;
      }
      return out;
    }();
    EXPECT_EQ(compact.rfind("{\"a\":", 0), 0u) << text;
    EXPECT_EQ(compact.back(), '}') << text;
  }
}

}  // namespace
}  // namespace swaserve::worker
