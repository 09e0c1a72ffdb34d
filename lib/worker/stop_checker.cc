#include "lib/worker/stop_checker.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace swaserve::worker {

absl::Status StopChecker::Validate(const StopOptions& o, const model::Tokenizer* tokenizer) {
  if (o.max_tokens <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("max_tokens must be > 0, got ", o.max_tokens));
  }
  for (const std::string& s : o.stop_strings) {
    if (s.empty()) return absl::InvalidArgumentError("empty stop string");
  }
  if (!o.stop_strings.empty() && tokenizer == nullptr) {
    return absl::InvalidArgumentError(
        "stop strings need a tokenizer, and this model has no tokenizer.json");
  }
  return absl::OkStatus();
}

StopChecker::StopChecker(const StopOptions& options, const model::Tokenizer* tokenizer)
    : options_(options) {
  if (!options_.stop_strings.empty() && tokenizer != nullptr) {
    decoder_ = std::make_unique<model::StreamingDecoder>(*tokenizer);
    for (const std::string& s : options_.stop_strings) keep_ = std::max(keep_, s.size());
  }
}

StopReason StopChecker::Add(uint32_t token) {
  ++generated_;
  auto in = [token](const std::vector<uint32_t>& ids) {
    return std::find(ids.begin(), ids.end(), token) != ids.end();
  };
  if (!options_.ignore_eos && in(options_.eos_ids)) return StopReason::kStop;
  if (in(options_.stop_ids)) return StopReason::kStop;
  if (decoder_ != nullptr) {
    const std::string piece = decoder_->Add(token);
    if (!piece.empty()) {
      // Search only where a match could end in the new piece.
      const size_t before = tail_.size();
      tail_ += piece;
      for (const std::string& s : options_.stop_strings) {
        const size_t from = before >= s.size() ? before - s.size() + 1 : 0;
        if (tail_.find(s, from) != std::string::npos) return StopReason::kStop;
      }
      if (tail_.size() > 2 * keep_) tail_.erase(0, tail_.size() - keep_);
    }
  }
  if (generated_ >= options_.max_tokens) return StopReason::kLength;
  return StopReason::kNone;
}

}  // namespace swaserve::worker
