// Structured output in a worker: a request's v1::OutputConstraint compiled
// (lib/grammar, through a per-worker cache) into the model::TokenConstraint
// its sampler calls.
//
// A constraint with start_after_token leaves the output free until that
// token (the end of the reasoning block the prompt opened), except that it
// cannot end there (EOS is masked), and constrains what follows it. generated_token_ids (a migrated stream's output so far)
// are replayed first, so the constraint continues where the stream stood.
// The grammar's own end (accepting, nothing may follow) shows as
// Terminated(); EOS is allowed only where the grammar accepts.
//
// Thread-safety: the factory is thread-safe; each constraint belongs to one
// request's sampler.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "lib/grammar/grammar_cache.h"
#include "lib/grammar/token_vocabulary.h"
#include "lib/model/sampling.h"
#include "lib/model/tokenizer.h"
#include "swaserve/v1/common.pb.h"

namespace swaserve::worker {

struct ConstraintFactoryOptions {
  // Compiled grammars kept (grammar::GrammarCacheOptions). Default 64.
  int max_grammars = 64;
};

class ConstraintFactory {
 public:
  // The tokenizer's vocabulary; `eos_ids`: the ids that end the output
  // (the worker's stop ids). The tokenizer need not outlive the factory.
  static absl::StatusOr<std::unique_ptr<ConstraintFactory>> Create(
      const model::Tokenizer& tokenizer, const std::vector<uint32_t>& eos_ids,
      const ConstraintFactoryOptions& options = {});

  // Null for KIND_NONE. InvalidArgument for what lib/grammar cannot
  // compile (naming the schema keyword), or generated tokens the grammar
  // does not allow.
  absl::StatusOr<std::shared_ptr<model::TokenConstraint>> Make(
      const v1::OutputConstraint& spec) const;

  const grammar::GrammarCache& cache() const { return *cache_; }

 private:
  ConstraintFactory() = default;
  std::shared_ptr<const grammar::TokenVocabulary> vocab_;
  std::unique_ptr<grammar::GrammarCache> cache_;
};

}  // namespace swaserve::worker
