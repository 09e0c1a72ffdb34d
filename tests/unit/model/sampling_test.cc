#include "lib/model/sampling.h"

#include <cmath>
#include <limits>
#include <map>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace swaserve::model {
namespace {

TEST(Sampling, GreedyIsArgmaxLowestIdOnTies) {
  Sampler s({});
  std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f};
  EXPECT_EQ(s.Sample(logits).token, 1u);
  EXPECT_EQ(Argmax(logits), 1u);
}

TEST(Sampling, LogprobsAreLogSoftmax) {
  SamplingOptions o;
  o.top_logprobs = 2;
  Sampler s(o);
  std::vector<float> logits = {1.0f, 3.0f, 2.0f};
  SampledToken t = s.Sample(logits);
  const double z = std::log(std::exp(1.0) + std::exp(3.0) + std::exp(2.0));
  EXPECT_NEAR(t.logprob, 3.0 - z, 1e-5);
  ASSERT_EQ(t.top.size(), 2u);
  EXPECT_EQ(t.top[0].first, 1u);
  EXPECT_EQ(t.top[1].first, 2u);
  EXPECT_NEAR(t.top[1].second, 2.0 - z, 1e-5);
}

TEST(Sampling, SameSeedSameTokensDifferentSeedDiffers) {
  std::vector<float> logits(50);
  for (int i = 0; i < 50; ++i) logits[i] = std::sin(i * 0.7f);
  auto draw = [&](uint64_t seed) {
    SamplingOptions o;
    o.temperature = 1.0f;
    o.seed = seed;
    Sampler s(o);
    std::vector<uint32_t> out;
    for (int i = 0; i < 100; ++i) out.push_back(s.Sample(logits).token);
    return out;
  };
  EXPECT_EQ(draw(7), draw(7));
  EXPECT_NE(draw(7), draw(8));
}

TEST(Sampling, TemperatureFollowsTheDistribution) {
  std::vector<float> logits = {0.0f, std::log(3.0f)};  // p = 1/4, 3/4
  SamplingOptions o;
  o.temperature = 1.0f;
  o.seed = 1;
  Sampler s(o);
  int ones = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) ones += s.Sample(logits).token == 1;
  EXPECT_NEAR(static_cast<double>(ones) / n, 0.75, 0.02);
}

TEST(Sampling, TopKAndTopPRestrictTheCandidates) {
  std::vector<float> logits = {5.0f, 4.9f, 4.8f, 0.0f, -1.0f};
  SamplingOptions k;
  k.temperature = 2.0f;
  k.top_k = 2;
  k.seed = 3;
  Sampler sk(k);
  std::map<uint32_t, int> seen;
  for (int i = 0; i < 2000; ++i) ++seen[sk.Sample(logits).token];
  EXPECT_THAT(seen, ::testing::ElementsAre(::testing::Key(0u), ::testing::Key(1u)));
  SamplingOptions p;
  p.temperature = 1.0f;
  p.top_p = 0.5f;  // the top token alone has ~35%: two tokens needed
  p.seed = 4;
  Sampler sp(p);
  seen.clear();
  for (int i = 0; i < 2000; ++i) ++seen[sp.Sample(logits).token];
  EXPECT_THAT(seen, ::testing::ElementsAre(::testing::Key(0u), ::testing::Key(1u)));
}

TEST(Sampling, ValidateNamesTheParameter) {
  EXPECT_TRUE(Sampler::Validate({}).ok());
  SamplingOptions o;
  o.temperature = -1;
  EXPECT_THAT(Sampler::Validate(o).message(), ::testing::HasSubstr("temperature"));
  o = {};
  o.top_p = 1.5f;
  EXPECT_THAT(Sampler::Validate(o).message(), ::testing::HasSubstr("top_p"));
  o = {};
  o.top_k = -2;
  EXPECT_THAT(Sampler::Validate(o).message(), ::testing::HasSubstr("top_k"));
  o = {};
  o.top_logprobs = 21;
  EXPECT_THAT(Sampler::Validate(o).message(), ::testing::HasSubstr("top_logprobs"));
}

// Chi-square statistic of `counts` (n draws) against probabilities `p`
// (cells with p > 0); a count where p == 0 returns infinity.
double ChiSquare(const std::map<uint32_t, int>& counts, const TokenDistribution& p, int n,
                 int* df) {
  double chi = 0;
  *df = -1;
  for (const auto& [t, prob] : p.probs) {
    const double expect = prob * n;
    const auto it = counts.find(t);
    const double got = it == counts.end() ? 0 : it->second;
    chi += (got - expect) * (got - expect) / expect;
    ++*df;
  }
  for (const auto& [t, c] : counts) {
    if (p.Prob(t) == 0) return INFINITY;
  }
  return chi;
}

// Speculative sampling (Draft then Verify) emits tokens distributed as the
// target's processed distribution whatever the draft distribution, with
// temperature, top-k and top-p applied alike to both. 200,000 draws, fixed
// seed; the bound is the chi-square 0.9999 quantile (df <= 15: 44.3).
TEST(Sampling, SpeculativeVerifyPreservesTheTargetDistribution) {
  const std::vector<float> target = {2.0f, 1.5f, 1.4f, 0.3f, -0.5f, 0.9f, 1.1f, -2.0f,
                                     0.0f, 0.7f, 1.9f, -1.0f, 0.4f, 0.2f, -0.1f, 1.0f};
  const std::vector<float> whole_draft = {0.1f, 2.5f, 0.3f, 1.8f, 0.2f, -1.0f, 1.2f, 0.5f,
                                          2.2f, -0.3f, 0.0f, 0.8f, 1.5f, -2.0f, 0.6f, 0.9f};
  // A draft vocabulary (model::DraftHead): tokens outside it are -infinity
  // in the draft logits, so drafts never propose them; the target's mass
  // there must still be emitted, through the residual.
  std::vector<float> narrow_draft = whole_draft;
  for (int t : {0, 4, 5, 10, 11}) narrow_draft[t] = -std::numeric_limits<float>::infinity();
  struct Case {
    float temperature;
    int top_k;
    float top_p;
    bool narrow;
  };
  for (const Case& c : {Case{1.0f, 0, 1.0f, false}, Case{0.7f, 5, 1.0f, false},
                        Case{1.3f, 0, 0.8f, false}, Case{0.9f, 8, 0.9f, false},
                        Case{1.0f, 0, 1.0f, true}, Case{0.9f, 8, 0.9f, true}}) {
    SCOPED_TRACE(testing::Message() << "T " << c.temperature << " top_k " << c.top_k
                                    << " top_p " << c.top_p << " narrow " << c.narrow);
    const std::vector<float>& draft = c.narrow ? narrow_draft : whole_draft;
    SamplingOptions o;
    o.temperature = c.temperature;
    o.top_k = c.top_k;
    o.top_p = c.top_p;
    o.seed = 42;
    Sampler s(o);
    TokenDistribution p;
    s.Distribution(target, &p);
    const int n = 200000;
    std::map<uint32_t, int> counts;
    int accepted = 0;
    for (int i = 0; i < n; ++i) {
      TokenDistribution q;
      const uint32_t d = s.Draft(draft, &q);
      SampledToken out;
      accepted += s.Verify(target, d, q, &out);
      ++counts[out.token];
    }
    int df = 0;
    const double chi = ChiSquare(counts, p, n, &df);
    EXPECT_LT(chi, 44.3) << "df " << df;
    if (c.narrow) EXPECT_GT(counts[0], n / 20);  // token 0 is never drafted, yet emitted
    EXPECT_GT(accepted, n / 10);      // the drafts overlap the target
    EXPECT_LT(accepted, n - n / 10);  // and differ from it
  }
}

TEST(Sampling, GreedyVerifyAcceptsExactlyTheArgmax) {
  Sampler s(SamplingOptions{});
  const std::vector<float> target = {0.1f, 3.0f, 2.9f};
  TokenDistribution q;
  EXPECT_EQ(s.Draft(std::vector<float>{5.0f, 0.0f, 0.0f}, &q), 0u);
  SampledToken out;
  EXPECT_FALSE(s.Verify(target, 0, q, &out));
  EXPECT_EQ(out.token, 1u);
  EXPECT_EQ(s.Draft(std::vector<float>{0.0f, 5.0f, 0.0f}, &q), 1u);
  EXPECT_TRUE(s.Verify(target, 1, q, &out));
  EXPECT_EQ(out.token, 1u);
  EXPECT_NEAR(out.logprob, 3.0f - std::log(std::exp(0.1f) + std::exp(3.0f) + std::exp(2.9f)),
              1e-5);
}

TEST(Sampling, LogitBiasShiftsTheLogitsEverywhere) {
  const std::vector<float> logits = {3.0f, 1.0f, 0.5f, -1.0f};
  SamplingOptions o;
  o.logit_bias = {{2, 10.0f}, {0, -100.0f}, {99, 50.0f}};  // 99: outside, ignored
  Sampler greedy(o);
  const SampledToken t = greedy.Sample(logits);
  EXPECT_EQ(t.token, 2u);
  // Logprobs are of the biased logits.
  double z = 0;
  for (float l : {3.0f - 100.0f, 1.0f, 0.5f + 10.0f, -1.0f}) z += std::exp(l);
  EXPECT_NEAR(t.logprob, 10.5 - std::log(z), 1e-4);
  // Sampling never draws a token pushed down by 100.
  o.temperature = 1.0f;
  o.seed = 3;
  Sampler sampled(o);
  for (int i = 0; i < 2000; ++i) EXPECT_NE(sampled.Sample(logits).token, 0u);
  // Greedy verification of an MTP draft sees the same bias as the draft.
  o.temperature = 0.0f;
  Sampler verify(o);
  TokenDistribution q;
  EXPECT_EQ(verify.Draft(logits, &q), 2u);
  SampledToken out;
  EXPECT_TRUE(verify.Verify(logits, 2, q, &out));
  EXPECT_EQ(out.token, 2u);
}

}  // namespace
}  // namespace swaserve::model
