#include "lib/worker/convert.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace swaserve::worker {

absl::StatusOr<model::SamplingOptions> ToSamplingOptions(const v1::SamplingParams& p,
                                                         uint64_t default_seed,
                                                         const ConstraintFactory* constraints) {
  model::SamplingOptions o;
  if (!std::isfinite(p.temperature()) || p.temperature() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.temperature must be >= 0, got ", p.temperature()));
  }
  if (!std::isfinite(p.top_p()) || p.top_p() < 0 || p.top_p() > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.top_p must be in [0, 1], got ", p.top_p()));
  }
  if (p.top_logprobs() > 20) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.top_logprobs must be at most 20, got ", p.top_logprobs()));
  }
  o.temperature = p.temperature();
  o.top_p = p.top_p() == 0 ? 1.0f : p.top_p();
  o.top_k = static_cast<int>(std::min<uint32_t>(p.top_k(), 1u << 30));
  o.seed = p.has_seed() ? p.seed() : default_seed;
  o.top_logprobs = p.logprobs() ? static_cast<int>(p.top_logprobs()) : 0;
  for (const auto& [token, bias] : p.logit_bias()) {
    if (!std::isfinite(bias) || bias < -100 || bias > 100) {
      return absl::InvalidArgumentError(
          absl::StrCat("sampling.logit_bias[", token, "] must be in [-100, 100], got ", bias));
    }
    o.logit_bias.push_back({token, bias});
  }
  std::sort(o.logit_bias.begin(), o.logit_bias.end());
  if (p.has_speculative_tokens()) {
    o.speculative_tokens = static_cast<int>(std::min<uint32_t>(p.speculative_tokens(), 64));
  }
  if (p.has_constraint() && p.constraint().kind() != v1::OutputConstraint::KIND_NONE) {
    if (constraints == nullptr) {
      return absl::FailedPreconditionError(
          "sampling.constraint: this worker has no tokenizer to compile constraints with");
    }
    absl::StatusOr<std::shared_ptr<model::TokenConstraint>> c = constraints->Make(p.constraint());
    if (!c.ok()) return absl::InvalidArgumentError(c.status().message());
    o.constraint = *std::move(c);
  }
  return o;
}

absl::StatusOr<StopOptions> ToStopOptions(const v1::SamplingParams& p, int default_max_tokens,
                                          int max_max_tokens, std::vector<uint32_t> eos_ids) {
  StopOptions s;
  const int64_t max_tokens = p.max_tokens() == 0 ? default_max_tokens : p.max_tokens();
  if (max_tokens > max_max_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("sampling.max_tokens ", max_tokens,
                                                   " exceeds this worker's limit of ",
                                                   max_max_tokens));
  }
  s.max_tokens = static_cast<int>(max_tokens);
  s.eos_ids = std::move(eos_ids);
  s.ignore_eos = p.ignore_eos();
  s.stop_ids.assign(p.stop_token_ids().begin(), p.stop_token_ids().end());
  s.stop_strings.assign(p.stop().begin(), p.stop().end());
  return s;
}

v1::TokenLogprob ToProto(const model::SampledToken& t) {
  v1::TokenLogprob p;
  p.set_token_id(t.token);
  p.set_logprob(t.logprob);
  for (const auto& [id, lp] : t.top) {
    auto* a = p.add_top();
    a->set_token_id(id);
    a->set_logprob(lp);
  }
  return p;
}

model::SampledToken FromProto(const v1::TokenLogprob& p) {
  model::SampledToken t;
  t.token = p.token_id();
  t.logprob = p.logprob();
  for (const auto& a : p.top()) t.top.emplace_back(a.token_id(), a.logprob());
  return t;
}

v1::FinishReason ToProto(FinishReason r) {
  switch (r) {
    case FinishReason::kStop: return v1::FINISH_REASON_STOP;
    case FinishReason::kLength: return v1::FINISH_REASON_LENGTH;
    case FinishReason::kCancelled: return v1::FINISH_REASON_CANCELLED;
    default: return v1::FINISH_REASON_UNSPECIFIED;
  }
}

v1::WorkerLoad PoolLoad(const std::string& worker_id, v1::Role role, const kv::KvPools& pools) {
  v1::WorkerLoad w;
  w.set_worker_id(worker_id);
  w.set_role(role);
  w.set_free_full_pages(pools.full().num_free());
  w.set_total_full_pages(pools.full().num_pages());
  w.set_free_swa_pages(pools.swa().num_free());
  w.set_total_swa_pages(pools.swa().num_pages());
  w.set_timestamp_ms(absl::ToUnixMillis(absl::Now()));
  return w;
}

absl::StatusOr<PrefillMultimodal> ToPrefillMultimodal(const v1::MultimodalItem& item, int index,
                                                      int hidden_size) {
  auto bad = [&](auto... parts) {
    return absl::InvalidArgumentError(absl::StrCat("multimodal item ", index, ": ", parts...));
  };
  PrefillMultimodal m;
  if (!base::Hash128::FromBytes(item.content_hash(), &m.span.content)) {
    return bad("content_hash must be 16 bytes, got ", item.content_hash().size());
  }
  if (item.num_tokens() == 0) return bad("num_tokens is 0");
  m.span.token_offset = item.token_offset();
  m.span.num_tokens = item.num_tokens();
  const v1::Tensor& t = item.embeddings();
  if (t.dtype() != v1::DTYPE_F32 || t.shape_size() != 2 ||
      t.shape(0) != static_cast<int64_t>(item.num_tokens()) || t.shape(1) != hidden_size) {
    return bad("embeddings must be DTYPE_F32 [", item.num_tokens(), ", ", hidden_size,
               "] (the encoder's output), got dtype ", v1::DType_Name(t.dtype()), " with ",
               t.shape_size(), " dims");
  }
  const size_t values = static_cast<size_t>(item.num_tokens()) * hidden_size;
  if (t.data().size() != values * sizeof(float)) {
    return bad("embeddings hold ", t.data().size(), " bytes, ", values * sizeof(float),
               " expected");
  }
  auto e = std::make_shared<std::vector<float>>(values);
  std::memcpy(e->data(), t.data().data(), t.data().size());
  m.embeddings = std::move(e);
  return m;
}

}  // namespace swaserve::worker
