#include "lib/model/sampling.h"

#include <cmath>
#include <map>

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

}  // namespace
}  // namespace swaserve::model
