// GrammarCache: compiled grammars shared across requests, keyed by what was
// compiled (the kind, the schema text's XXH3-128, the vocabulary's
// fingerprint and the options), so `n` choices, retries and every request
// with the same schema compile it once.
//
// Bounded: at most `max_entries` grammars (least recently used dropped
// first). A dropped grammar lives on while matchers hold it. Failed
// compilations are not cached (the error is returned each time).
// Concurrent requests for the same missing key may compile it more than once;
// one result is kept.
//
// Thread-safety: all methods may be called concurrently.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "lib/grammar/json_schema.h"
#include "lib/grammar/tool_call.h"

namespace swaserve::grammar {

struct GrammarCacheOptions {
  // Compiled grammars kept. Each holds up to its
  // CompiledGrammarOptions::max_mask_cache_bytes of masks (16 MiB by
  // default) plus its tables. Default 64.
  int max_entries = 64;
};

class GrammarCache {
 public:
  explicit GrammarCache(const GrammarCacheOptions& options = {}) : options_(options) {}

  // CompileJsonSchema through the cache.
  absl::StatusOr<std::shared_ptr<const CompiledGrammar>> JsonSchema(
      absl::string_view schema_json, std::shared_ptr<const TokenVocabulary> vocab,
      const JsonGrammarOptions& options = {});
  // CompileJsonObject through the cache.
  absl::StatusOr<std::shared_ptr<const CompiledGrammar>> JsonObject(
      std::shared_ptr<const TokenVocabulary> vocab, const JsonGrammarOptions& options = {});

  // CompileToolCall through the cache; `key_text` names the tools (e.g.
  // their JSON text): equal texts must mean equal tools.
  absl::StatusOr<std::shared_ptr<const CompiledGrammar>> ToolCall(
      absl::string_view key_text, const std::vector<model::ToolDefinition>& tools,
      std::shared_ptr<const TokenVocabulary> vocab, const ToolCallGrammarOptions& options);

  int64_t hits() const;
  int64_t misses() const;
  int size() const;

 private:
  using Key = std::pair<uint64_t, uint64_t>;
  using Compile = absl::StatusOr<std::shared_ptr<const CompiledGrammar>>();
  template <typename F>
  absl::StatusOr<std::shared_ptr<const CompiledGrammar>> GetOrCompile(const Key& key, F compile);

  const GrammarCacheOptions options_;
  mutable absl::Mutex mu_;
  std::list<std::pair<Key, std::shared_ptr<const CompiledGrammar>>> lru_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<Key, decltype(lru_)::iterator> index_ ABSL_GUARDED_BY(mu_);
  int64_t hits_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t misses_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace swaserve::grammar
