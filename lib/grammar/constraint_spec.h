// A request's output constraint as the gRPC API carries it
// (v1::OutputConstraint) compiled into a grammar over the model's
// vocabulary: a JSON Schema, any JSON object, or a forced tool call in the
// model's markup with each tool's parameters as its argument schema. The
// router compiles it to refuse what cannot be compiled before dispatch; the
// workers compile it (through their cache) to constrain the sampler.
//
// Thread-safety: as the cache (thread-safe).
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "lib/grammar/grammar_cache.h"
#include "swaserve/v1/common.pb.h"

namespace swaserve::grammar {

// InvalidArgument naming what cannot be compiled (the schema keyword, no
// tools, an unknown tool-call format). KIND_NONE is InvalidArgument too.
absl::StatusOr<std::shared_ptr<const CompiledGrammar>> CompileConstraint(
    const v1::OutputConstraint& spec, std::shared_ptr<const TokenVocabulary> vocab,
    GrammarCache* cache);

}  // namespace swaserve::grammar
