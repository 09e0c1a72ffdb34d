// GrammarMatcher: one request's position in a CompiledGrammar — what the
// sampler asks before each token (the mask) and tells after it (the token).
//
//   auto m = GrammarMatcher(grammar);
//   std::vector<uint32_t> mask(grammar->vocabulary().BitmaskWords());
//   while (!m.IsTerminated()) {
//     m.FillNextTokenMask(mask.data());   // bit id%32 of word id/32: allowed
//     uint32_t id = Sample(logits, mask);  // forbidden logits -> -inf
//     if (!m.AcceptToken(id)) ...;         // false: the grammar forbids id
//     if (vocab.IsEos(id)) break;
//   }
//
// Masks: an allowed token is one whose bytes keep the output a prefix of
// some string of the grammar; EOS ids are allowed exactly when the output so
// far is a whole string of the grammar (IsAccepting). Unless the matcher is
// terminated, the mask always holds at least one id (no dead ends; see
// compiled_grammar.h), provided the vocabulary can spell every byte (all
// byte-level BPE vocabularies can).
//
// Speculative decoding and migration: Rollback(n) undoes the last n accepted
// tokens (MTP drafts the verifier rejected) in O(n); ResetTo(tokens) rebuilds
// the position from the tokens already produced (a migrated stream), in time
// linear in their bytes.
//
// Copyable: a copy continues on its own from the same position (e.g. the
// `n` choices of one request, forked after the prompt).
//
// Thread-safety: a matcher is used by one thread at a time (a request's
// decode step); matchers of one grammar may run on different threads (see
// compiled_grammar.h for how they share its tables). The matcher keeps the
// grammar alive.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/types/span.h"
#include "lib/grammar/compiled_grammar.h"

namespace swaserve::grammar {

class GrammarMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar);

  // Writes the allowed-token bitmask: vocabulary().BitmaskWords() words,
  // bit (id % 32) of word (id / 32) set when id is allowed. A terminated
  // matcher (EOS accepted) allows nothing.
  void FillNextTokenMask(uint32_t* bitmask);
  // Whether `id` is allowed now (the same answer as the mask's bit, without
  // computing the mask).
  bool IsTokenAllowed(uint32_t id);
  // Advances by `id` when the grammar allows it and returns true; returns
  // false and changes nothing otherwise. An EOS id is allowed only when
  // IsAccepting(); after it the matcher is terminated.
  bool AcceptToken(uint32_t id);
  // Advances by raw bytes before the first token (e.g. a prefix the prompt
  // already holds). False, and no change, when the grammar forbids them or a
  // token was accepted already. Kept by Rollback and ResetTo; Reset drops it.
  bool AcceptBytes(std::string_view bytes);

  // The output so far is a whole string of the grammar (EOS allowed).
  bool IsAccepting();
  // Nothing may follow: EOS was accepted, or the output is accepting and no
  // byte can continue it (end the choice: finish_reason "stop").
  bool IsTerminated();

  // Undoes the last min(n, accepted) tokens, EOS included.
  void Rollback(int n);
  // Back to the start of the grammar.
  void Reset();
  // Reset, then AcceptToken each of `tokens`. False when one is forbidden:
  // the matcher is then left after the tokens before it.
  bool ResetTo(absl::Span<const uint32_t> tokens);

  // Tokens accepted since the start (EOS included).
  const std::vector<uint32_t>& tokens() const { return tokens_; }
  const CompiledGrammar& grammar() const { return *grammar_; }

 private:
  // Requires the engine's mutex. Brings history_ to the engine's current
  // generation (replaying the tokens after a table reset) and returns the
  // current configuration.
  int32_t Current();

  std::shared_ptr<const CompiledGrammar> grammar_;
  std::vector<uint32_t> tokens_;
  // Configuration after the prefix bytes and after each token; valid in
  // generation_.
  std::vector<int32_t> history_;
  std::string prefix_bytes_;  // AcceptBytes input, replayed after resets
  uint64_t generation_ = 0;
  bool terminated_ = false;  // EOS accepted
};

}  // namespace swaserve::grammar
