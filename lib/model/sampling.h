// Token sampling from logits: greedy, temperature, top-k, top-p, with a
// per-request seeded generator so the same seed reproduces the same output;
// optional log-probabilities of the chosen token and the top alternatives.
//
// A Sampler belongs to one request (it owns that request's random state);
// not thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace swaserve::model {

// What a request's output must match (structured output), as the sampler
// sees it: which tokens may come next, and the tokens that came. One per
// request; lib/grammar's matcher behind it (lib/worker/output_constraint.h).
// Not thread-safe (the request's sampler calls it).
class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // The tokens allowed next as a bitmask (bit id % 32 of word id / 32;
  // `mask` is resized to cover the vocabulary). False: every token is
  // allowed now (the constraint has not started).
  virtual bool FillMask(std::vector<uint32_t>* mask) = 0;
  // The next output token. False: the constraint did not allow it.
  virtual bool Accept(uint32_t token) = 0;
  // The output is complete and nothing may follow it.
  virtual bool Terminated() = 0;
  // Takes back the last `n` accepted tokens (MTP drafts).
  virtual void Rollback(int n) = 0;
};

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
  // Structured output (null: free). Sample() draws only tokens it allows
  // (every other logit is -inf, after logit_bias) and hands it each token
  // drawn. MTP stays exact under it: each draft is drawn under the mask of
  // the drafts before it (accepted provisionally, taken back before
  // verification), and verification uses the masks of the tokens accepted.
  // Default: none.
  std::shared_ptr<TokenConstraint> constraint;
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

  // Samples one token from one row of logits (with a constraint: among
  // the tokens it allows, and the token is then accepted by it).
  SampledToken Sample(absl::Span<const float> logits);

  // A token chosen elsewhere (the prefill worker's first token) fed to the
  // constraint. False: the constraint did not allow it.
  bool Observe(uint32_t token);
  bool constrained() const { return options_.constraint != nullptr; }
  // The constraint's output is complete (false without one).
  bool Terminated() const;

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
  // Takes the provisional drafts back from the constraint.
  void UndoDrafts();
  // Draft() / Verify() without the constraint's bookkeeping.
  uint32_t DraftUnobserved(absl::Span<const float> draft_logits, TokenDistribution* q);
  bool VerifyUnobserved(absl::Span<const float> target_logits, uint32_t token,
                        const TokenDistribution& q, SampledToken* out);
  // Sample() without handing the token to the constraint.
  SampledToken SampleUnobserved(absl::Span<const float> logits);
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
  std::vector<uint32_t> mask_;
  int provisional_drafts_ = 0;  // drafts the constraint accepted since the last verify
  TokenDistribution p_;
};

// Index of the largest value (lowest index on ties).
uint32_t Argmax(absl::Span<const float> logits);

}  // namespace swaserve::model
