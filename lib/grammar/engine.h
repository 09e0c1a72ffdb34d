// Internal to lib/grammar: the byte-level pushdown automaton behind a
// CompiledGrammar and its lazily determinized tables (see compiled_grammar.h
// for the design). Not part of the module's interface.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "lib/grammar/compiled_grammar.h"

namespace swaserve::grammar {

// The rules' NFAs, epsilon-closed and trimmed.
struct Nfa {
  struct ByteEdge {
    ByteSet set;
    int32_t to = 0;
  };
  struct Call {
    RuleId rule = 0;
    int32_t ret = 0;  // state to continue at when the rule ends
  };
  struct State {
    std::vector<ByteEdge> bytes;
    std::vector<int32_t> eps;
    std::vector<Call> calls;
    bool final = false;  // the end of its rule
  };
  std::vector<State> states;
  std::vector<int32_t> rule_start;
  // Per state: the states of its epsilon closure that consume a byte, call
  // a rule or end the rule (live ones only).
  std::vector<std::vector<int32_t>> closure;
  // Per state: its closure only ends the rule (a call returning here needs
  // no frame: tail call).
  std::vector<bool> pure_end;
  std::vector<bool> live;          // can reach its rule's end
  std::vector<bool> productive;    // per rule: derives a finite string
  // Byte -> class: bytes no byte set of the grammar tells apart.
  std::array<uint8_t, 256> byte_class{};
  std::vector<uint8_t> class_byte;  // a representative byte per class
};

// Builds the NFA of `grammar`; InvalidArgument when it is malformed, too
// large or derives no finite string.
absl::Status BuildNfa(const Grammar& grammar, int max_states, Nfa* nfa);

class CompiledGrammar::Engine {
 public:
  static constexpr int32_t kDead = 0;

  Engine(Nfa nfa, const TokenVocabulary* vocab, const CompiledGrammarOptions& options);

  absl::Mutex mu;

  // Everything below requires `mu`.
  // Drops the tables when they outgrow the options; call only where no
  // configuration id is held across the call (the matcher's entry points).
  void MaybeReset();
  // Bumped by every reset: configuration ids from an older generation are
  // void.
  uint64_t generation() const { return generation_; }
  int32_t Start();
  int32_t Next(int32_t config, uint8_t byte) {
    const size_t i = static_cast<size_t>(config) * num_classes_ + nfa_.byte_class[byte];
    const int32_t t = trans_[i];
    return t >= 0 ? t : Compute(config, nfa_.byte_class[byte]);
  }
  // The configuration after `bytes`, or kDead.
  int32_t NextBytes(int32_t config, absl::string_view bytes);
  bool Accepting(int32_t config) const { return accepting_[config]; }
  // Some byte continues `config`.
  bool HasContinuation(int32_t config);
  void FillMask(int32_t config, uint32_t* mask);

  const Nfa& nfa() const { return nfa_; }
  int num_classes() const { return num_classes_; }
  CompiledGrammar::Stats stats() const;

 private:
  struct Node {
    int32_t state;
    int32_t parent;
    int32_t depth;
  };
  int32_t InternNode(int32_t state, int32_t parent);
  int32_t InternConfig(std::vector<int32_t> nodes, bool accepting);
  int32_t Compute(int32_t config, int cls);
  // How many plain string characters (TokenTrie::plain_chars) surely
  // follow `config`: every such character, whatever its bytes, leads to the
  // same live configuration, and so on for at least this many characters
  // (255: forever). 0 when they differ or die (e.g. inside a character, or
  // a pattern's class).
  int PlainRun(int32_t config);
  // The one configuration every byte of [lo, hi] leads `config` to; -1 when
  // they differ or die.
  int32_t Uniform(int32_t config, int lo, int hi);
  // Adds to `out` the byte-consuming stacks reachable from (state, parent)
  // by epsilon moves, calls and returns; sets *accepting when the start rule
  // can end.
  void Close(std::vector<std::pair<int32_t, int32_t>> work, std::vector<int32_t>* out,
             bool* accepting);
  void Reset();

  const Nfa nfa_;
  const TokenVocabulary* const vocab_;
  const CompiledGrammarOptions options_;
  const int num_classes_;

  uint64_t generation_ = 0;
  std::vector<Node> nodes_;
  absl::flat_hash_map<std::pair<int32_t, int32_t>, int32_t> node_ids_;
  std::vector<std::vector<int32_t>> configs_;
  std::vector<bool> accepting_;
  absl::flat_hash_map<std::vector<int32_t>, int32_t> config_ids_;
  std::vector<int32_t> trans_;  // configs * classes; -1: not computed yet
  std::vector<int16_t> plain_run_;  // per config; -1: not computed yet
  absl::flat_hash_map<int32_t, std::vector<uint32_t>> masks_;
  std::vector<int32_t> walk_;  // the trie walk's configuration per depth
  int64_t mask_hits_ = 0;
  int64_t mask_walks_ = 0;
  int64_t resets_ = 0;
};

}  // namespace swaserve::grammar
