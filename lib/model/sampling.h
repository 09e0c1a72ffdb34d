// Token sampling from logits: greedy, temperature, top-k, top-p, with a
// per-request seeded generator so the same seed reproduces the same output;
// optional log-probabilities of the chosen token and the top alternatives.
//
// A Sampler belongs to one request (it owns that request's random state);
// not thread-safe.
#pragma once

#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace swaserve::model {

struct SamplingOptions {
  // 0: greedy (argmax; ties go to the lowest id).
  float temperature = 0.0f;
  // 0 disables.
  int top_k = 0;
  // 0 or >= 1 disables.
  float top_p = 1.0f;
  uint64_t seed = 0;
  // How many top alternatives' log-probabilities to report (0–20).
  int top_logprobs = 0;
  // MTP draft tokens per decode step for this request: -1 uses the decode
  // worker's setting, 0 turns speculation off; capped at the worker's.
  int speculative_tokens = -1;
  // Added to the logits of these tokens before anything else (OpenAI's
  // logit_bias, -100 to 100; ids outside the vocabulary are ignored). The
  // distribution drawn from, greedy's argmax and the reported logprobs are
  // all of the biased logits, for drafts and verification alike, so MTP
  // stays exact. Default: none.
  std::vector<std::pair<uint32_t, float>> logit_bias;
};

// A next-token distribution after temperature, top-k and top-p, exactly as
// Sampler::Sample draws from it: (token, probability) over the kept
// candidates, probabilities summing to 1. Greedy (temperature 0) is the
// point mass on the argmax.
struct TokenDistribution {
  std::vector<std::pair<uint32_t, double>> probs;
  // Probability of `token` (0 outside the kept candidates).
  double Prob(uint32_t token) const;
};

struct SampledToken {
  uint32_t token = 0;
  // log softmax(logits)[token] (of the unscaled logits).
  float logprob = 0;
  std::vector<std::pair<uint32_t, float>> top;  // top_logprobs alternatives
};

class Sampler {
 public:
  explicit Sampler(const SamplingOptions& options);
  // InvalidArgument for negative temperature/top_k, top_p outside [0, 1],
  // top_logprobs outside [0, 20].
  static absl::Status Validate(const SamplingOptions& options);

  // Samples one token from one row of logits.
  SampledToken Sample(absl::Span<const float> logits);

  // Skips what `samples` Sample() calls draw (none when greedy): a decode
  // worker continues the random stream after the prefill worker's first
  // token instead of drawing the same number again.
  void Skip(int samples);

  // The distribution Sample() draws from for these logits.
  void Distribution(absl::Span<const float> logits, TokenDistribution* out);

  // `token` described against these logits: its logprob and the top
  // alternatives, as Sample() reports them.
  SampledToken Describe(absl::Span<const float> logits, uint32_t token);

  // Speculative decoding (Leviathan et al. / Chen et al.): a draft token is
  // drawn from the draft model's processed distribution q (Draft), then
  // Verify accepts it with probability min(1, p(x) / q(x)) under the target
  // model's processed distribution p, or else draws from the normalised
  // residual max(0, p − q). The emitted tokens are then distributed exactly
  // as Sample() on the target logits. Greedy: the draft is q's argmax and it
  // is accepted iff it is p's argmax (otherwise p's argmax is emitted).
  // Temperature, top-k and top-p are applied identically to p and q.
  uint32_t Draft(absl::Span<const float> draft_logits, TokenDistribution* q);
  // True: `token` accepted (`out` describes it). False: rejected, `out` is
  // the replacement token.
  bool Verify(absl::Span<const float> target_logits, uint32_t token,
              const TokenDistribution& q, SampledToken* out);

 private:
  // The kept candidates of Sample() in scratch_[0, keep) with their
  // unnormalised weights; returns keep (temperature > 0 only).
  size_t Candidates(absl::Span<const float> logits, std::vector<double>* weights, double* sum);
  double Uniform();
  // `logits` with options_.logit_bias added (in biased_), or `logits`.
  absl::Span<const float> Biased(absl::Span<const float> logits);
  // Distribution / Describe of logits already biased.
  void DistributionBiased(absl::Span<const float> logits, TokenDistribution* out);
  SampledToken DescribeBiased(absl::Span<const float> logits, uint32_t token);

  SamplingOptions options_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, uint32_t>> scratch_;
  std::vector<double> weights_;
  std::vector<double> dense_q_;
  std::vector<float> biased_;
  TokenDistribution p_;
};

// Index of the largest value (lowest index on ties).
uint32_t Argmax(absl::Span<const float> logits);

}  // namespace swaserve::model
