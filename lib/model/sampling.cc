#include "lib/model/sampling.h"

#include <limits>

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

namespace {

bool ByLogit(const std::pair<float, uint32_t>& a, const std::pair<float, uint32_t>& b) {
  return a.first > b.first || (a.first == b.first && a.second < b.second);
}

}  // namespace

double TokenDistribution::Prob(uint32_t token) const {
  for (const auto& [t, p] : probs) {
    if (t == token) return p;
  }
  return 0;
}

void Sampler::Skip(int samples) {
  if (options_.temperature <= 0) return;
  for (int i = 0; i < samples; ++i) (void)Uniform();
}

double Sampler::Uniform() { return std::uniform_real_distribution<double>(0.0, 1.0)(rng_); }

size_t Sampler::Candidates(absl::Span<const float> logits, std::vector<double>* weights,
                           double* sum_out) {
  const size_t n = logits.size();
  // Candidates sorted by logit (descending, id ascending on ties).
  scratch_.resize(n);
  for (uint32_t i = 0; i < n; ++i) scratch_[i] = {logits[i], i};
  size_t keep = n;
  if (options_.top_k > 0) keep = std::min<size_t>(keep, options_.top_k);
  const bool use_top_p = options_.top_p > 0 && options_.top_p < 1;
  if (use_top_p || keep < n) {
    std::partial_sort(scratch_.begin(), scratch_.begin() + keep, scratch_.end(), ByLogit);
  }
  // Probabilities at the temperature over the kept candidates.
  const float inv_t = 1.0f / options_.temperature;
  const float top = (use_top_p || keep < n) ? scratch_[0].first
                                            : *std::max_element(logits.begin(), logits.end());
  std::vector<double>& p = *weights;
  p.resize(keep);
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
  *sum_out = sum;
  return keep;
}

absl::Span<const float> Sampler::Biased(absl::Span<const float> logits) {
  bool masked = options_.constraint != nullptr && options_.constraint->FillMask(&mask_);
  // Nothing allowed (a draft past the output's end): nothing to mask by.
  if (masked && std::all_of(mask_.begin(), mask_.end(), [](uint32_t w) { return w == 0; })) {
    masked = false;
  }
  if (options_.logit_bias.empty() && !masked) return logits;
  biased_.assign(logits.begin(), logits.end());
  for (const auto& [token, bias] : options_.logit_bias) {
    if (token < biased_.size()) biased_[token] += bias;
  }
  if (masked) {
    const float kOff = -std::numeric_limits<float>::infinity();
    for (size_t i = 0; i < biased_.size(); ++i) {
      const size_t w = i / 32;
      if (w >= mask_.size() || ((mask_[w] >> (i % 32)) & 1u) == 0) biased_[i] = kOff;
    }
  }
  return biased_;
}

bool Sampler::Observe(uint32_t token) {
  return options_.constraint == nullptr || options_.constraint->Accept(token);
}

bool Sampler::Terminated() const {
  return options_.constraint != nullptr && options_.constraint->Terminated();
}

void Sampler::UndoDrafts() {
  if (provisional_drafts_ > 0) options_.constraint->Rollback(provisional_drafts_);
  provisional_drafts_ = 0;
}

SampledToken Sampler::Sample(absl::Span<const float> raw_logits) {
  UndoDrafts();
  SampledToken t = SampleUnobserved(raw_logits);
  if (options_.constraint != nullptr) options_.constraint->Accept(t.token);
  return t;
}

SampledToken Sampler::SampleUnobserved(absl::Span<const float> raw_logits) {
  const absl::Span<const float> logits = Biased(raw_logits);
  uint32_t token;
  if (options_.temperature <= 0) {
    token = Argmax(logits);
  } else {
    double sum = 0;
    const size_t keep = Candidates(logits, &weights_, &sum);
    const double u = Uniform() * sum;
    double acc = 0;
    token = scratch_[0].second;
    for (size_t i = 0; i < keep; ++i) {
      if (weights_[i] <= 0) continue;  // a masked token (probability 0)
      token = scratch_[i].second;  // rounding leaves u past the sum: the last drawable one
      acc += weights_[i];
      if (u < acc) break;
    }
  }
  return DescribeBiased(logits, token);
}

void Sampler::Distribution(absl::Span<const float> logits, TokenDistribution* out) {
  DistributionBiased(Biased(logits), out);
}

void Sampler::DistributionBiased(absl::Span<const float> logits, TokenDistribution* out) {
  out->probs.clear();
  if (options_.temperature <= 0) {
    out->probs.push_back({Argmax(logits), 1.0});
    return;
  }
  double sum = 0;
  const size_t keep = Candidates(logits, &weights_, &sum);
  out->probs.reserve(keep);
  // Tokens of probability 0 (masked by a constraint) are left out.
  for (size_t i = 0; i < keep; ++i) {
    if (weights_[i] > 0) out->probs.push_back({scratch_[i].second, weights_[i] / sum});
  }
}

SampledToken Sampler::Describe(absl::Span<const float> logits, uint32_t token) {
  return DescribeBiased(Biased(logits), token);
}

SampledToken Sampler::DescribeBiased(absl::Span<const float> logits, uint32_t token) {
  SampledToken out;
  const size_t n = logits.size();
  // Log-softmax normaliser of the raw logits (for logprobs).
  const float mx = *std::max_element(logits.begin(), logits.end());
  double z = 0;
  for (float l : logits) z += std::exp(static_cast<double>(l - mx));
  const float log_z = mx + static_cast<float>(std::log(z));
  out.token = token;
  out.logprob = logits[token] - log_z;
  if (options_.top_logprobs > 0) {
    const size_t k = std::min<size_t>(options_.top_logprobs, n);
    scratch_.resize(n);  // Sample() is done with it by now
    for (uint32_t i = 0; i < n; ++i) scratch_[i] = {logits[i], i};
    std::partial_sort(scratch_.begin(), scratch_.begin() + k, scratch_.end(), ByLogit);
    for (size_t i = 0; i < k && std::isfinite(scratch_[i].first); ++i) {
      out.top.push_back({scratch_[i].second, scratch_[i].first - log_z});
    }
  }
  return out;
}

uint32_t Sampler::Draft(absl::Span<const float> draft_logits, TokenDistribution* q) {
  const uint32_t t = DraftUnobserved(draft_logits, q);
  if (options_.constraint != nullptr && options_.constraint->Accept(t)) ++provisional_drafts_;
  return t;
}

uint32_t Sampler::DraftUnobserved(absl::Span<const float> draft_logits, TokenDistribution* q) {
  DistributionBiased(Biased(draft_logits), q);
  if (q->probs.size() == 1) return q->probs[0].first;
  const double u = Uniform();
  double acc = 0;
  for (const auto& [t, p] : q->probs) {
    acc += p;
    if (u < acc) return t;
  }
  return q->probs.back().first;
}

bool Sampler::Verify(absl::Span<const float> raw_target_logits, uint32_t token,
                     const TokenDistribution& q, SampledToken* out) {
  UndoDrafts();
  const bool accepted = VerifyUnobserved(raw_target_logits, token, q, out);
  if (options_.constraint != nullptr) options_.constraint->Accept(out->token);
  return accepted;
}

bool Sampler::VerifyUnobserved(absl::Span<const float> raw_target_logits, uint32_t token,
                               const TokenDistribution& q, SampledToken* out) {
  const absl::Span<const float> target_logits = Biased(raw_target_logits);
  if (options_.temperature <= 0) {
    const uint32_t best = Argmax(target_logits);
    *out = DescribeBiased(target_logits, best);
    return best == token;
  }
  DistributionBiased(target_logits, &p_);
  // q densely (the residual below looks it up for every candidate of p).
  dense_q_.assign(target_logits.size(), 0.0);
  for (const auto& [t, p] : q.probs) dense_q_[t] = p;
  const double pt = p_.Prob(token), qt = dense_q_[token];
  // qt > 0: the draft was drawn from q. Accept with probability min(1, p/q).
  if (qt > 0 && (pt >= qt || Uniform() * qt < pt)) {
    *out = DescribeBiased(target_logits, token);
    return true;
  }
  // Rejected: draw from the residual max(0, p - q), normalised.
  double mass = 0;
  for (const auto& [t, p] : p_.probs) mass += std::max(0.0, p - dense_q_[t]);
  uint32_t pick = p_.probs.back().first;
  if (mass > 0) {
    const double u = Uniform() * mass;
    double acc = 0;
    for (const auto& [t, p] : p_.probs) {
      acc += std::max(0.0, p - dense_q_[t]);
      if (u < acc) {
        pick = t;
        break;
      }
    }
  } else {  // p == q up to rounding: rejection had probability ~0; draw from p
    const double u = Uniform();
    double acc = 0;
    for (const auto& [t, p] : p_.probs) {
      acc += p;
      if (u < acc) {
        pick = t;
        break;
      }
    }
  }
  *out = DescribeBiased(target_logits, pick);
  return false;
}

}  // namespace swaserve::model
