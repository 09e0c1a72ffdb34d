// CompiledGrammar: a Grammar (grammar.h) turned into a token-level automaton
// over one TokenVocabulary, shared by every request that uses the same
// constraint. GrammarMatcher (matcher.h) is the per-request cursor over it.
//
// How it works. Each rule becomes a byte-level NFA whose edges are byte sets,
// epsilon moves and calls of other rules; with the call stack that is a
// pushdown automaton. A parse state ("configuration") is the set of stacks
// the PDA can be in after the bytes so far — stacks are hash-consed parent
// links, and a configuration is interned to a small integer. Transitions
// (configuration, byte class) -> configuration are computed on first use and
// memoized, so the automaton is determinized lazily and only where text
// actually goes. A token mask is a walk of the vocabulary's byte trie with
// these transitions: a rejected byte skips the whole subtree, so the cost is
// the number of trie nodes whose prefix the grammar allows. Inside strings
// that would be most of the vocabulary, so a subtree whose tokens are all
// plain string text (TokenTrie::plain_chars) is taken whole, without a walk,
// when the configuration surely takes that many plain characters. The masks
// of configurations seen before come from a cache (a string body, the place
// after a comma, ... recur in every request that uses the grammar).
//
// Guarantees:
//   - no dead ends: at compile time rules that derive no finite string are
//     dropped and NFA states that cannot reach their rule's end are trimmed,
//     so every configuration a token leads to can still be completed (up to
//     max_stack_depth, below); a grammar with no finite string at all is
//     InvalidArgument;
//   - EOS is allowed exactly in accepting configurations;
//   - recursion (recursive $ref, JSON nesting) is unbounded except by
//     max_stack_depth frames: a path that would go deeper is not offered.
//
// Thread-safety: a CompiledGrammar is shared (std::shared_ptr<const ...>)
// between any number of matchers on any threads. The lazily built tables
// and the mask cache are guarded by one mutex per grammar: matchers of the
// same grammar serialize their mask and advance calls (a cached mask is a
// copy of BitmaskWords() words); matchers of different grammars never wait
// for each other. When the tables outgrow max_configurations they are
// dropped and rebuilt on demand (matchers replay their tokens; see
// matcher.h), so memory stays bounded however long the grammar lives.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "lib/grammar/grammar.h"
#include "lib/grammar/token_vocabulary.h"

namespace swaserve::grammar {

struct CompiledGrammarOptions {
  // Most NFA states the grammar may expand to (bounded repetitions are
  // unrolled: a maxLength of 1,000 costs about 10,000 states); above it
  // compilation fails with InvalidArgument. Default: 500,000.
  int max_nfa_states = 500000;
  // Deepest rule-call stack a path may reach; deeper paths are not offered
  // (e.g. JSON nested deeper than about a third of this). Default: 384.
  int max_stack_depth = 384;
  // Interned configurations kept before the lazy tables are dropped and
  // rebuilt. Default: 65,536 (with ~40 byte classes, ~10 MB of tables).
  int max_configurations = 65536;
  // Bytes of token masks cached per grammar (each BitmaskWords() * 4 bytes:
  // 19 KB for a 152K vocabulary, 544 bytes for 4K). When full, the cache is
  // emptied and refills with the masks in use. 0 disables it. Default:
  // 16 MiB (about 880 masks at 152K).
  int64_t max_mask_cache_bytes = int64_t{16} << 20;
};

class CompiledGrammar {
 public:
  // Compiles `grammar` for `vocab`. InvalidArgument when the grammar has no
  // rule, a rule without a body, no finite string, or exceeds
  // max_nfa_states.
  static absl::StatusOr<std::shared_ptr<const CompiledGrammar>> Compile(
      const Grammar& grammar, std::shared_ptr<const TokenVocabulary> vocab,
      const CompiledGrammarOptions& options = {});

  ~CompiledGrammar();
  CompiledGrammar(const CompiledGrammar&) = delete;
  CompiledGrammar& operator=(const CompiledGrammar&) = delete;

  const TokenVocabulary& vocabulary() const { return *vocab_; }
  const std::shared_ptr<const TokenVocabulary>& shared_vocabulary() const { return vocab_; }
  int num_nfa_states() const;
  int num_byte_classes() const;
  // Human-readable grammar (Grammar::ToString of what was compiled).
  const std::string& grammar_text() const { return text_; }

  // Statistics of the lazy tables, for tests and benchmarks.
  struct Stats {
    int configurations = 0;
    int stack_nodes = 0;
    int cached_masks = 0;
    int64_t mask_cache_hits = 0;
    int64_t mask_walks = 0;
    int64_t table_resets = 0;
  };
  Stats stats() const;

  // The automaton (lib/grammar/engine.h; internal to the module).
  class Engine;

 private:
  friend class GrammarMatcher;

  CompiledGrammar() = default;

  std::shared_ptr<const TokenVocabulary> vocab_;
  std::string text_;
  std::unique_ptr<Engine> engine_;
};

}  // namespace swaserve::grammar
