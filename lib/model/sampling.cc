#include "lib/model/sampling.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace swaserve::model {

uint32_t Argmax(absl::Span<const float> logits) {
  uint32_t best = 0;
  for (uint32_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  return best;
}

absl::Status Sampler::Validate(const SamplingOptions& o) {
  if (!(o.temperature >= 0) || !std::isfinite(o.temperature)) {
    return absl::InvalidArgumentError(absl::StrCat("temperature must be >= 0, got ", o.temperature));
  }
  if (o.top_k < 0) return absl::InvalidArgumentError(absl::StrCat("top_k must be >= 0, got ", o.top_k));
  if (!(o.top_p >= 0 && o.top_p <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat("top_p must be in [0, 1], got ", o.top_p));
  }
  if (o.top_logprobs < 0 || o.top_logprobs > 20) {
    return absl::InvalidArgumentError(absl::StrCat("top_logprobs must be in [0, 20], got ", o.top_logprobs));
  }
  return absl::OkStatus();
}

Sampler::Sampler(const SamplingOptions& options)
    : options_(options), rng_(options.seed) {}

SampledToken Sampler::Sample(absl::Span<const float> logits) {
  SampledToken out;
  const size_t n = logits.size();
  // Log-softmax normaliser of the raw logits (for logprobs).
  const float mx = *std::max_element(logits.begin(), logits.end());
  double z = 0;
  for (float l : logits) z += std::exp(static_cast<double>(l - mx));
  const float log_z = mx + static_cast<float>(std::log(z));

  if (options_.temperature <= 0) {
    out.token = Argmax(logits);
  } else {
    // Candidates sorted by logit (descending, id ascending on ties).
    scratch_.resize(n);
    for (uint32_t i = 0; i < n; ++i) scratch_[i] = {logits[i], i};
    size_t keep = n;
    if (options_.top_k > 0) keep = std::min<size_t>(keep, options_.top_k);
    auto cmp = [](const std::pair<float, uint32_t>& a, const std::pair<float, uint32_t>& b) {
      return a.first > b.first || (a.first == b.first && a.second < b.second);
    };
    const bool use_top_p = options_.top_p > 0 && options_.top_p < 1;
    if (use_top_p || keep < n) {
      std::partial_sort(scratch_.begin(), scratch_.begin() + keep, scratch_.end(), cmp);
    }
    // Probabilities at the temperature over the kept candidates.
    const float inv_t = 1.0f / options_.temperature;
    const float top = (use_top_p || keep < n) ? scratch_[0].first
                                              : *std::max_element(logits.begin(), logits.end());
    std::vector<double> p(keep);
    double sum = 0;
    for (size_t i = 0; i < keep; ++i) {
      p[i] = std::exp(static_cast<double>((scratch_[i].first - top) * inv_t));
      sum += p[i];
    }
    if (use_top_p) {
      double acc = 0;
      size_t cut = keep;
      for (size_t i = 0; i < keep; ++i) {
        acc += p[i] / sum;
        if (acc >= options_.top_p) {
          cut = i + 1;
          break;
        }
      }
      keep = cut;
      sum = 0;
      for (size_t i = 0; i < keep; ++i) sum += p[i];
    }
    const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng_) * sum;
    double acc = 0;
    out.token = scratch_[keep - 1].second;
    for (size_t i = 0; i < keep; ++i) {
      acc += p[i];
      if (u < acc) {
        out.token = scratch_[i].second;
        break;
      }
    }
  }
  out.logprob = logits[out.token] - log_z;
  if (options_.top_logprobs > 0) {
    const size_t k = std::min<size_t>(options_.top_logprobs, n);
    scratch_.resize(n);
    for (uint32_t i = 0; i < n; ++i) scratch_[i] = {logits[i], i};
    std::partial_sort(scratch_.begin(), scratch_.begin() + k, scratch_.end(),
                      [](const auto& a, const auto& b) {
                        return a.first > b.first || (a.first == b.first && a.second < b.second);
                      });
    for (size_t i = 0; i < k; ++i) out.top.push_back({scratch_[i].second, scratch_[i].first - log_z});
  }
  return out;
}

}  // namespace swaserve::model
