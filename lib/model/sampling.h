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

 private:
  SamplingOptions options_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, uint32_t>> scratch_;
};

// Index of the largest value (lowest index on ties).
uint32_t Argmax(absl::Span<const float> logits);

}  // namespace swaserve::model
