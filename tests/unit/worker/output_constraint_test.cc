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

// MTP under a constraint: drafts drawn under the masks of the drafts before
// them, verified under the masks of the tokens accepted; greedy output is
// the output without drafts, and sampled output only allowed tokens.
TEST_F(OutputConstraintTest, DraftsAndVerificationFollowTheGrammar) {
  const int V = tok_->vocab_size();
  const std::string schema =
      R"({"type": "array", "items": {"enum": ["red", "green", 7]}, "minItems": 2, "maxItems": 6})";
  // Logits that depend only on the position (target) or position and salt (draft).
  auto logits = [&](int pos, uint32_t salt) {
    std::vector<float> l(static_cast<size_t>(V));
    std::mt19937 gen(static_cast<uint32_t>(pos * 7919 + salt));
    for (float& x : l) x = std::uniform_real_distribution<float>(-4, 4)(gen);
    return l;
  };
  for (float temperature : {0.0f, 1.0f}) {
    for (uint64_t seed = 0; seed < 6; ++seed) {
      auto make = [&] {
        model::SamplingOptions o;
        o.temperature = temperature;
        o.seed = seed;
        o.constraint = *factory_->Make(Schema(schema));
        return o;
      };
      // Without drafts.
      model::Sampler plain(make());
      std::vector<uint32_t> a;
      for (int pos = 0; pos < 60 && !plain.Terminated(); ++pos) a.push_back(plain.Sample(logits(pos, 0)).token);
      // With 3 drafts a step.
      model::SamplingOptions o = make();
      std::shared_ptr<model::TokenConstraint> c = o.constraint;
      model::Sampler mtp(o);
      std::vector<uint32_t> b;
      while (static_cast<int>(b.size()) < 60 && !mtp.Terminated()) {
        const int pos = static_cast<int>(b.size());
        std::vector<uint32_t> drafts;
        std::vector<model::TokenDistribution> q(3);
        for (int j = 0; j < 3; ++j) drafts.push_back(mtp.Draft(logits(pos + j, 99), &q[j]));
        int i = 0;
        for (; i < 3; ++i) {
          model::SampledToken t;
          const bool ok = mtp.Verify(logits(pos + i, 0), drafts[i], q[i], &t);
          b.push_back(t.token);
          if (!ok || mtp.Terminated()) break;
        }
        if (i == 3 && !mtp.Terminated()) b.push_back(mtp.Sample(logits(pos + 3, 0)).token);
      }
      // Every emitted token was allowed, and the output is a whole value.
      auto check = make().constraint;
      for (uint32_t t : b) ASSERT_TRUE(check->Accept(t)) << "seed " << seed;
      EXPECT_TRUE(check->Terminated() || b.size() >= 60u);
      if (temperature == 0) EXPECT_EQ(a, b) << "seed " << seed;
    }
  }
}

}  // namespace
}  // namespace swaserve::worker
