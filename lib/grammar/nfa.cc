// BuildNfa: Thompson construction of each rule, then the analyses that make
// the automaton free of dead ends (productive rules, live states), the
// epsilon closures and the byte classes.
#include <algorithm>
#include <map>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "lib/grammar/engine.h"

namespace swaserve::grammar {
namespace {

class Builder {
 public:
  Builder(const Grammar& g, int max_states, Nfa* nfa) : g_(g), max_(max_states), nfa_(nfa) {}

  absl::Status Build() {
    const auto& rules = g_.rules();
    if (rules.empty()) return absl::InvalidArgumentError("grammar has no rules");
    nfa_->rule_start.resize(rules.size());
    for (size_t r = 0; r < rules.size(); ++r) {
      if (rules[r].body < 0) {
        return absl::InvalidArgumentError(absl::StrCat("rule ", rules[r].name, " has no body"));
      }
      nfa_->rule_start[r] = New();
    }
    for (size_t r = 0; r < rules.size(); ++r) {
      const int32_t end = Expand(rules[r].body, nfa_->rule_start[r]);
      if (!ok_) break;
      nfa_->states[end].final = true;
    }
    if (!ok_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the grammar needs more than ", max_, " automaton states (lower maxLength, maxItems "
          "or repetition counts)"));
    }
    return absl::OkStatus();
  }

 private:
  int32_t New() {
    if (static_cast<int>(nfa_->states.size()) >= max_) {
      ok_ = false;
      return 0;
    }
    nfa_->states.emplace_back();
    return static_cast<int32_t>(nfa_->states.size() - 1);
  }
  void Eps(int32_t from, int32_t to) {
    if (ok_) nfa_->states[from].eps.push_back(to);
  }

  // Adds `id`'s automaton starting at state `in`; returns its end state.
  int32_t Expand(ExprId id, int32_t in) {
    if (!ok_) return 0;
    const Expr& e = g_.expr(id);
    switch (e.kind) {
      case Expr::Kind::kBytes: {
        const int32_t out = New();
        if (ok_ && !e.bytes.Empty()) {
          nfa_->states[in].bytes.push_back(Nfa::ByteEdge{.set = e.bytes, .to = out});
        }
        return out;
      }
      case Expr::Kind::kSeq: {
        int32_t cur = in;
        for (ExprId c : e.children) cur = Expand(c, cur);
        return cur;
      }
      case Expr::Kind::kAlt: {
        const int32_t out = New();
        for (ExprId c : e.children) {
          const int32_t s = New();
          Eps(in, s);
          Eps(Expand(c, s), out);
        }
        return out;
      }
      case Expr::Kind::kRepeat: {
        int32_t cur = in;
        for (int i = 0; i < e.min && ok_; ++i) cur = Expand(e.children[0], cur);
        if (e.max < 0) {
          const int32_t loop = New();
          Eps(cur, loop);
          Eps(Expand(e.children[0], loop), loop);
          return loop;
        }
        const int32_t out = New();
        Eps(cur, out);
        for (int i = e.min; i < e.max && ok_; ++i) {
          cur = Expand(e.children[0], cur);
          Eps(cur, out);
        }
        return out;
      }
      case Expr::Kind::kRef: {
        const int32_t out = New();
        if (ok_) nfa_->states[in].calls.push_back(Nfa::Call{.rule = e.rule, .ret = out});
        return out;
      }
    }
    return in;
  }

  const Grammar& g_;
  const int max_;
  Nfa* nfa_;
  bool ok_ = true;
};

// Which rules derive a finite string, and which states can reach their
// rule's end through productive calls (a fixpoint over both).
void Analyze(Nfa* nfa) {
  const size_t n = nfa->states.size();
  const size_t num_rules = nfa->rule_start.size();
  nfa->productive.assign(num_rules, false);
  // Reverse edges once: eps/byte edges, and calls as from -> ret.
  std::vector<std::vector<int32_t>> rev(n);
  std::vector<std::vector<std::pair<int32_t, RuleId>>> rev_calls(n);
  for (size_t s = 0; s < n; ++s) {
    const Nfa::State& st = nfa->states[s];
    for (int32_t t : st.eps) rev[t].push_back(static_cast<int32_t>(s));
    for (const auto& e : st.bytes) rev[e.to].push_back(static_cast<int32_t>(s));
    for (const auto& c : st.calls) rev_calls[c.ret].emplace_back(static_cast<int32_t>(s), c.rule);
  }
  for (bool changed = true; changed;) {
    changed = false;
    nfa->live.assign(n, false);
    std::vector<int32_t> work;
    for (size_t s = 0; s < n; ++s) {
      if (nfa->states[s].final) {
        nfa->live[s] = true;
        work.push_back(static_cast<int32_t>(s));
      }
    }
    while (!work.empty()) {
      const int32_t s = work.back();
      work.pop_back();
      auto mark = [&](int32_t p) {
        if (!nfa->live[p]) {
          nfa->live[p] = true;
          work.push_back(p);
        }
      };
      for (int32_t p : rev[s]) mark(p);
      for (const auto& [p, rule] : rev_calls[s]) {
        if (nfa->productive[rule]) mark(p);
      }
    }
    for (size_t r = 0; r < num_rules; ++r) {
      if (!nfa->productive[r] && nfa->live[nfa->rule_start[r]]) {
        nfa->productive[r] = true;
        changed = true;
      }
    }
  }
}

void Closures(Nfa* nfa) {
  const size_t n = nfa->states.size();
  nfa->closure.assign(n, {});
  nfa->pure_end.assign(n, false);
  std::vector<int32_t> seen(n, -1);
  std::vector<int32_t> work;
  for (size_t s = 0; s < n; ++s) {
    if (!nfa->live[s]) continue;
    work.assign(1, static_cast<int32_t>(s));
    seen[s] = static_cast<int32_t>(s);
    bool pure = true;
    while (!work.empty()) {
      const int32_t q = work.back();
      work.pop_back();
      const Nfa::State& st = nfa->states[q];
      bool useful = st.final;
      for (const auto& e : st.bytes) useful |= nfa->live[e.to] != 0;
      for (const auto& c : st.calls) {
        useful |= nfa->productive[c.rule] && nfa->live[c.ret];
      }
      if (useful) {
        nfa->closure[s].push_back(q);
        if (!st.final || !st.calls.empty() || !st.bytes.empty()) pure = false;
      }
      for (int32_t t : st.eps) {
        if (nfa->live[t] && seen[t] != static_cast<int32_t>(s)) {
          seen[t] = static_cast<int32_t>(s);
          work.push_back(t);
        }
      }
    }
    std::sort(nfa->closure[s].begin(), nfa->closure[s].end());
    nfa->pure_end[s] = pure;
  }
}

void ByteClasses(Nfa* nfa) {
  // Refine: two bytes share a class when every byte set holds both or
  // neither. The signature of a byte is the list of sets holding it.
  std::map<std::array<uint64_t, 4>, int> distinct;
  for (const Nfa::State& st : nfa->states) {
    for (const auto& e : st.bytes) distinct.emplace(e.set.bits, 0);
  }
  std::vector<std::vector<int>> signature(256);
  int index = 0;
  for (auto& [bits, i] : distinct) {
    i = index++;
    ByteSet set;
    set.bits = bits;
    for (int b = 0; b < 256; ++b) {
      if (set.Has(static_cast<uint8_t>(b))) signature[b].push_back(i);
    }
  }
  std::map<std::vector<int>, int> class_of;
  nfa->class_byte.clear();
  for (int b = 0; b < 256; ++b) {
    auto [it, inserted] = class_of.emplace(signature[b], static_cast<int>(class_of.size()));
    if (inserted) nfa->class_byte.push_back(static_cast<uint8_t>(b));
    nfa->byte_class[b] = static_cast<uint8_t>(it->second);
  }
}

}  // namespace

absl::Status BuildNfa(const Grammar& grammar, int max_states, Nfa* nfa) {
  Builder builder(grammar, max_states, nfa);
  if (absl::Status s = builder.Build(); !s.ok()) return s;
  Analyze(nfa);
  if (!nfa->productive[0]) {
    return absl::InvalidArgumentError(
        "the grammar derives no finite string (e.g. an empty enum, or a required recursion "
        "that never ends)");
  }
  Closures(nfa);
  ByteClasses(nfa);
  return absl::OkStatus();
}

}  // namespace swaserve::grammar
