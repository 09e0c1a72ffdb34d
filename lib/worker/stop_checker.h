// When a request's generation ends: max tokens, end-of-sequence ids (unless
// ignored), stop token ids, stop strings in the decoded text.
//
// One per request; not thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "lib/model/tokenizer.h"

namespace swaserve::worker {

struct StopOptions {
  // Tokens to generate at most (the first token included); > 0.
  int max_tokens = 16;
  // The model's end-of-sequence ids (generation ends on them unless
  // ignore_eos); the token itself is returned.
  std::vector<uint32_t> eos_ids;
  bool ignore_eos = false;
  // Extra ids that end generation (returned).
  std::vector<uint32_t> stop_ids;
  // Generation ends once the decoded output contains one of these (needs a
  // tokenizer). The caller trims the text at the stop string.
  std::vector<std::string> stop_strings;
};

enum class StopReason { kNone, kStop, kLength };

class StopChecker {
 public:
  // `tokenizer` (may be null when there are no stop strings) must outlive it.
  static absl::Status Validate(const StopOptions& options, const model::Tokenizer* tokenizer);
  StopChecker(const StopOptions& options, const model::Tokenizer* tokenizer);

  // Accounts one generated token; the reason generation ends after it, or
  // kNone.
  StopReason Add(uint32_t token);
  int generated() const { return generated_; }

 private:
  StopOptions options_;
  std::unique_ptr<model::StreamingDecoder> decoder_;
  std::string tail_;  // recent decoded text, long enough for every stop string
  size_t keep_ = 0;
  int generated_ = 0;
};

}  // namespace swaserve::worker
