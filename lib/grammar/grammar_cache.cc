#include "lib/grammar/grammar_cache.h"

#include "absl/strings/str_cat.h"
#include "lib/base/hash.h"

namespace swaserve::grammar {
namespace {

std::string OptionsKey(const JsonGrammarOptions& o) {
  const CompiledGrammarOptions& c = o.compile;
  return absl::StrCat(o.max_whitespace, ",", o.max_repetition, ",", o.escape_angle_bracket, ",",
                      c.max_nfa_states, ",",
                      c.max_stack_depth, ",", c.max_configurations, ",", c.max_mask_cache_bytes);
}

}  // namespace

template <typename F>
absl::StatusOr<std::shared_ptr<const CompiledGrammar>> GrammarCache::GetOrCompile(const Key& key,
                                                                                  F compile) {
  {
    absl::MutexLock lock(&mu_);
    if (auto it = index_.find(key); it != index_.end()) {
      ++hits_;
      lru_.splice(lru_.begin(), lru_, it->second);
      return it->second->second;
    }
    ++misses_;
  }
  absl::StatusOr<std::shared_ptr<const CompiledGrammar>> g = compile();
  if (!g.ok()) return g;
  absl::MutexLock lock(&mu_);
  if (auto it = index_.find(key); it != index_.end()) return it->second->second;
  lru_.emplace_front(key, *g);
  index_[key] = lru_.begin();
  while (static_cast<int>(lru_.size()) > std::max(options_.max_entries, 1)) {
    index_.erase(lru_.back().first);
    lru_.pop_back();
  }
  return g;
}

absl::StatusOr<std::shared_ptr<const CompiledGrammar>> GrammarCache::JsonSchema(
    absl::string_view schema_json, std::shared_ptr<const TokenVocabulary> vocab,
    const JsonGrammarOptions& options) {
  if (vocab == nullptr) return absl::InvalidArgumentError("no vocabulary");
  const base::Hash128 h = base::Hash128Of(
      absl::StrCat("json_schema|", vocab->fingerprint(), "|", OptionsKey(options), "|", schema_json));
  return GetOrCompile(Key(h.high, h.low),
                      [&] { return CompileJsonSchema(schema_json, vocab, options); });
}

absl::StatusOr<std::shared_ptr<const CompiledGrammar>> GrammarCache::JsonObject(
    std::shared_ptr<const TokenVocabulary> vocab, const JsonGrammarOptions& options) {
  if (vocab == nullptr) return absl::InvalidArgumentError("no vocabulary");
  const base::Hash128 h = base::Hash128Of(
      absl::StrCat("json_object|", vocab->fingerprint(), "|", OptionsKey(options)));
  return GetOrCompile(Key(h.high, h.low), [&] { return CompileJsonObject(vocab, options); });
}

absl::StatusOr<std::shared_ptr<const CompiledGrammar>> GrammarCache::ToolCall(
    absl::string_view key_text, const std::vector<model::ToolDefinition>& tools,
    std::shared_ptr<const TokenVocabulary> vocab, const ToolCallGrammarOptions& options) {
  if (vocab == nullptr) return absl::InvalidArgumentError("no vocabulary");
  const base::Hash128 h = base::Hash128Of(absl::StrCat(
      "tool_call|", vocab->fingerprint(), "|", static_cast<int>(options.format), ",",
      options.parallel_calls, ",", options.text_before_calls, ",", OptionsKey(options.json), "|",
      key_text));
  return GetOrCompile(Key(h.high, h.low), [&] { return CompileToolCall(tools, vocab, options); });
}

int64_t GrammarCache::hits() const {
  absl::MutexLock lock(&mu_);
  return hits_;
}
int64_t GrammarCache::misses() const {
  absl::MutexLock lock(&mu_);
  return misses_;
}
int GrammarCache::size() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(lru_.size());
}

}  // namespace swaserve::grammar
