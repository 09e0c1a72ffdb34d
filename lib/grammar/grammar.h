// Grammar: a context-free grammar over bytes, the form every constraint
// (JSON Schema, json_object, tool calls) is compiled to before it becomes a
// token-level automaton (compiled_grammar.h).
//
// A grammar is a list of rules; rule 0 is the start. Each rule is one
// expression built with the Grammar's factory methods:
//   Bytes(set)        one byte from a set (ByteSet)
//   Literal("abc")    the bytes in order
//   Seq({a, b, ...})  concatenation; Seq({}) is the empty string
//   Alt({a, b, ...})  alternation
//   Repeat(e, lo, hi) e at least lo and at most hi times (hi = kUnbounded)
//   Ref(rule)         the language of another rule (recursion allowed)
// Expressions are values in the grammar's arena (ExprId); one expression may
// be used in several places. A rule that references itself without first
// consuming a byte (left recursion) has no finite expansion there: such
// paths are cut at CompiledGrammarOptions::max_stack_depth.
//
// Thread-safety: a Grammar is a plain value; build it on one thread.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace swaserve::grammar {

// A set of bytes (256 bits).
struct ByteSet {
  std::array<uint64_t, 4> bits{};

  static ByteSet Of(uint8_t b) { ByteSet s; s.Add(b); return s; }
  static ByteSet Range(uint8_t lo, uint8_t hi) { ByteSet s; s.AddRange(lo, hi); return s; }
  void Add(uint8_t b) { bits[b >> 6] |= uint64_t{1} << (b & 63); }
  void AddRange(uint8_t lo, uint8_t hi) {
    for (int b = lo; b <= hi; ++b) Add(static_cast<uint8_t>(b));
  }
  void Remove(uint8_t b) { bits[b >> 6] &= ~(uint64_t{1} << (b & 63)); }
  bool Has(uint8_t b) const { return (bits[b >> 6] >> (b & 63)) & 1; }
  bool Empty() const { return (bits[0] | bits[1] | bits[2] | bits[3]) == 0; }
  void Union(const ByteSet& o) { for (int i = 0; i < 4; ++i) bits[i] |= o.bits[i]; }
  bool operator==(const ByteSet& o) const { return bits == o.bits; }
};

using ExprId = int32_t;
using RuleId = int32_t;

struct Expr {
  enum class Kind { kBytes, kSeq, kAlt, kRepeat, kRef };
  Kind kind = Kind::kSeq;
  ByteSet bytes;                  // kBytes
  std::vector<ExprId> children;   // kSeq, kAlt; kRepeat: one child
  int min = 0;                    // kRepeat
  int max = 0;                    // kRepeat; kUnbounded for no bound
  RuleId rule = -1;               // kRef
};

class Grammar {
 public:
  static constexpr int kUnbounded = -1;

  // Declares a rule (its body set later with SetRule); returns its id. The
  // first rule declared is the start rule.
  RuleId AddRule(std::string name);
  void SetRule(RuleId rule, ExprId body) { rules_[rule].body = body; }

  ExprId Bytes(const ByteSet& set);
  ExprId Literal(absl::string_view bytes);
  ExprId Seq(std::vector<ExprId> parts);
  ExprId Alt(std::vector<ExprId> options);
  ExprId Repeat(ExprId e, int min, int max);
  ExprId Optional(ExprId e) { return Repeat(e, 0, 1); }
  ExprId Star(ExprId e) { return Repeat(e, 0, kUnbounded); }
  ExprId Ref(RuleId rule);
  // The empty string.
  ExprId Empty() { return Seq({}); }

  struct Rule {
    std::string name;
    ExprId body = -1;
  };
  const std::vector<Rule>& rules() const { return rules_; }
  const Expr& expr(ExprId id) const { return exprs_[id]; }
  size_t num_exprs() const { return exprs_.size(); }

  // Grammar text in an EBNF-like notation, for tests and error messages.
  std::string ToString() const;

 private:
  ExprId Add(Expr e);
  std::vector<Expr> exprs_;
  std::vector<Rule> rules_;
};

}  // namespace swaserve::grammar
