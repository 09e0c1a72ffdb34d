#include "lib/grammar/compiled_grammar.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "lib/grammar/engine.h"

namespace swaserve::grammar {

absl::StatusOr<std::shared_ptr<const CompiledGrammar>> CompiledGrammar::Compile(
    const Grammar& grammar, std::shared_ptr<const TokenVocabulary> vocab,
    const CompiledGrammarOptions& options) {
  if (vocab == nullptr) return absl::InvalidArgumentError("no vocabulary");
  if (options.max_stack_depth < 1 || options.max_configurations < 16 ||
      options.max_mask_cache_bytes < 0) {
    return absl::InvalidArgumentError("bad CompiledGrammarOptions");
  }
  Nfa nfa;
  if (absl::Status s = BuildNfa(grammar, options.max_nfa_states, &nfa); !s.ok()) return s;
  std::shared_ptr<CompiledGrammar> g(new CompiledGrammar());
  g->vocab_ = std::move(vocab);
  g->text_ = grammar.ToString();
  g->engine_ = std::make_unique<Engine>(std::move(nfa), g->vocab_.get(), options);
  return std::shared_ptr<const CompiledGrammar>(std::move(g));
}

CompiledGrammar::~CompiledGrammar() = default;

int CompiledGrammar::num_nfa_states() const {
  return static_cast<int>(engine_->nfa().states.size());
}
int CompiledGrammar::num_byte_classes() const { return engine_->num_classes(); }

CompiledGrammar::Stats CompiledGrammar::stats() const {
  absl::MutexLock lock(&engine_->mu);
  return engine_->stats();
}

CompiledGrammar::Engine::Engine(Nfa nfa, const TokenVocabulary* vocab,
                                const CompiledGrammarOptions& options)
    : nfa_(std::move(nfa)),
      vocab_(vocab),
      options_(options),
      num_classes_(static_cast<int>(nfa_.class_byte.size())) {
  Reset();
}

void CompiledGrammar::Engine::Reset() {
  ++generation_;
  nodes_.clear();
  node_ids_.clear();
  configs_.clear();
  accepting_.clear();
  config_ids_.clear();
  trans_.clear();
  masks_.clear();
  // Configuration 0: dead, every byte leads back to it.
  configs_.emplace_back();
  accepting_.push_back(false);
  trans_.assign(num_classes_, kDead);
  plain_run_.assign(1, 0);
}

void CompiledGrammar::Engine::MaybeReset() {
  if (static_cast<int>(configs_.size()) > options_.max_configurations) {
    ++resets_;
    Reset();
  }
}

int32_t CompiledGrammar::Engine::InternNode(int32_t state, int32_t parent) {
  auto [it, inserted] = node_ids_.try_emplace({state, parent}, 0);
  if (!inserted) return it->second;
  const int32_t depth = parent < 0 ? 1 : nodes_[parent].depth + 1;
  if (depth > options_.max_stack_depth) {
    node_ids_.erase(it);
    return -2;
  }
  it->second = static_cast<int32_t>(nodes_.size());
  nodes_.push_back(Node{.state = state, .parent = parent, .depth = depth});
  return it->second;
}

int32_t CompiledGrammar::Engine::InternConfig(std::vector<int32_t> nodes, bool accepting) {
  if (nodes.empty() && !accepting) return kDead;
  std::sort(nodes.begin(), nodes.end());
  nodes.erase(std::unique(nodes.begin(), nodes.end()), nodes.end());
  nodes.push_back(accepting ? -1 : -2);  // the key carries the flag
  auto [it, inserted] = config_ids_.try_emplace(nodes, 0);
  if (!inserted) return it->second;
  nodes.pop_back();
  it->second = static_cast<int32_t>(configs_.size());
  configs_.push_back(std::move(nodes));
  accepting_.push_back(accepting);
  trans_.resize(trans_.size() + num_classes_, -1);
  plain_run_.push_back(-1);
  return it->second;
}

void CompiledGrammar::Engine::Close(std::vector<std::pair<int32_t, int32_t>> work,
                                    std::vector<int32_t>* out, bool* accepting) {
  absl::flat_hash_set<std::pair<int32_t, int32_t>> seen(work.begin(), work.end());
  auto push = [&](int32_t state, int32_t parent) {
    if (seen.emplace(state, parent).second) work.emplace_back(state, parent);
  };
  while (!work.empty()) {
    const auto [s, parent] = work.back();
    work.pop_back();
    for (int32_t q : nfa_.closure[s]) {
      const Nfa::State& st = nfa_.states[q];
      for (const auto& e : st.bytes) {
        if (nfa_.live[e.to]) {
          const int32_t node = InternNode(q, parent);
          if (node >= 0) out->push_back(node);
          break;
        }
      }
      for (const auto& c : st.calls) {
        if (!nfa_.productive[c.rule] || !nfa_.live[c.ret]) continue;
        const int32_t frame = nfa_.pure_end[c.ret] ? parent : InternNode(c.ret, parent);
        if (frame == -2) continue;  // too deep
        push(nfa_.rule_start[c.rule], frame);
      }
      if (st.final) {
        if (parent < 0) {
          *accepting = true;
        } else {
          const Node& p = nodes_[parent];
          push(p.state, p.parent);
        }
      }
    }
  }
}

int32_t CompiledGrammar::Engine::Start() {
  std::vector<int32_t> out;
  bool accepting = false;
  Close({{nfa_.rule_start[0], -1}}, &out, &accepting);
  return InternConfig(std::move(out), accepting);
}

int32_t CompiledGrammar::Engine::Compute(int32_t config, int cls) {
  const uint8_t b = nfa_.class_byte[cls];
  std::vector<std::pair<int32_t, int32_t>> work;
  for (int32_t n : configs_[config]) {
    const Node node = nodes_[n];
    for (const auto& e : nfa_.states[node.state].bytes) {
      if (e.set.Has(b) && nfa_.live[e.to]) work.emplace_back(e.to, node.parent);
    }
  }
  std::vector<int32_t> out;
  bool accepting = false;
  if (!work.empty()) Close(std::move(work), &out, &accepting);
  const int32_t next = InternConfig(std::move(out), accepting);
  trans_[static_cast<size_t>(config) * num_classes_ + cls] = next;
  return next;
}

int32_t CompiledGrammar::Engine::Uniform(int32_t config, int lo, int hi) {
  int32_t r = -1;
  for (int b = lo; b <= hi; ++b) {
    const int32_t t = Next(config, static_cast<uint8_t>(b));
    if (t == kDead || (r >= 0 && t != r)) return -1;
    r = t;
  }
  return r;
}

int CompiledGrammar::Engine::PlainRun(int32_t config) {
  if (plain_run_[config] >= 0) return plain_run_[config];
  plain_run_[config] = 0;  // while computing: a cycle reads as 0 (a lower bound)
  // Every plain character — ASCII but '"', '\\' and DEL; then each UTF-8
  // lead byte range with its continuations, as JSON strings take them —
  // must lead to one configuration y.
  const int32_t y = Uniform(config, 0x20, 0x21);
  if (y < 0 || Uniform(config, 0x23, 0x5B) != y || Uniform(config, 0x5D, 0x7E) != y) return 0;
  struct Path {
    int lead_lo, lead_hi;
    int second_lo, second_hi;
    int more;  // continuation bytes [80-BF] after the second byte
  };
  static constexpr Path kPaths[] = {
      {.lead_lo = 0xC2, .lead_hi = 0xDF, .second_lo = 0x80, .second_hi = 0xBF, .more = 0},
      {.lead_lo = 0xE0, .lead_hi = 0xE0, .second_lo = 0xA0, .second_hi = 0xBF, .more = 1},
      {.lead_lo = 0xE1, .lead_hi = 0xEC, .second_lo = 0x80, .second_hi = 0xBF, .more = 1},
      {.lead_lo = 0xED, .lead_hi = 0xED, .second_lo = 0x80, .second_hi = 0x9F, .more = 1},
      {.lead_lo = 0xEE, .lead_hi = 0xEF, .second_lo = 0x80, .second_hi = 0xBF, .more = 1},
      {.lead_lo = 0xF0, .lead_hi = 0xF0, .second_lo = 0x90, .second_hi = 0xBF, .more = 2},
      {.lead_lo = 0xF1, .lead_hi = 0xF3, .second_lo = 0x80, .second_hi = 0xBF, .more = 2},
      {.lead_lo = 0xF4, .lead_hi = 0xF4, .second_lo = 0x80, .second_hi = 0x8F, .more = 2},
  };
  for (const Path& p : kPaths) {
    int32_t c = Uniform(config, p.lead_lo, p.lead_hi);
    if (c >= 0) c = Uniform(c, p.second_lo, p.second_hi);
    for (int k = 0; k < p.more && c >= 0; ++k) c = Uniform(c, 0x80, 0xBF);
    if (c != y) return 0;
  }
  const int run = y == config ? 255 : std::min(255, 1 + PlainRun(y));
  plain_run_[config] = static_cast<int16_t>(run);
  return run;
}

int32_t CompiledGrammar::Engine::NextBytes(int32_t config, absl::string_view bytes) {
  for (char c : bytes) {
    config = Next(config, static_cast<uint8_t>(c));
    if (config == kDead) return kDead;
  }
  return config;
}

bool CompiledGrammar::Engine::HasContinuation(int32_t config) {
  for (int c = 0; c < num_classes_; ++c) {
    if (Next(config, nfa_.class_byte[c]) != kDead) return true;
  }
  return false;
}

void CompiledGrammar::Engine::FillMask(int32_t config, uint32_t* mask) {
  const size_t words = static_cast<size_t>(vocab_->BitmaskWords());
  if (auto it = masks_.find(config); it != masks_.end()) {
    ++mask_hits_;
    std::memcpy(mask, it->second.data(), words * sizeof(uint32_t));
    return;
  }
  ++mask_walks_;
  std::memset(mask, 0, words * sizeof(uint32_t));
  // The walk keeps each depth's configuration as its row offset in trans_
  // and reads the arrays through local pointers: mask stores may alias
  // int32 data, so members would be reloaded at every node.
  const TokenTrie& t = vocab_->trie();
  walk_.resize(static_cast<size_t>(t.max_depth) + 1);
  int32_t* walk = walk_.data();
  const size_t nc = static_cast<size_t>(num_classes_);
  walk[0] = config * num_classes_;
  const uint8_t* byte = t.byte.data();
  const uint16_t* depth = t.depth.data();
  const uint32_t* subtree_end = t.subtree_end.data();
  const uint32_t* token_begin = t.token_begin.data();
  const uint32_t* token_ids = t.token_ids.data();
  const uint8_t* byte_class = nfa_.byte_class.data();
  const int32_t* trans = trans_.data();
  const uint32_t n = static_cast<uint32_t>(t.num_nodes());
  const uint8_t* plain_chars = t.plain_chars.data();
  for (uint32_t i = 0; i < n;) {
    const int d = depth[i];
    if (plain_chars[i] != 0) {
      // A subtree of plain string text that the configuration surely takes:
      // every token in it, without walking it.
      const int run = PlainRun(walk[d - 1] / num_classes_);
      trans = trans_.data();
      if (plain_chars[i] <= run) {
        const uint32_t end = subtree_end[i];
        for (uint32_t k = token_begin[i], e = token_begin[end]; k < e; ++k) {
          const uint32_t id = token_ids[k];
          mask[id >> 5] |= uint32_t{1} << (id & 31);
        }
        i = end;
        continue;
      }
    }
    const int cls = byte_class[byte[i]];
    int32_t s = trans[static_cast<size_t>(walk[d - 1]) + cls];
    if (s < 0) {
      s = Compute(walk[d - 1] / num_classes_, cls);
      trans = trans_.data();
    }
    if (s == kDead) {
      i = subtree_end[i];
      continue;
    }
    walk[d] = static_cast<int32_t>(static_cast<size_t>(s) * nc);
    for (uint32_t k = token_begin[i], e = token_begin[i + 1]; k < e; ++k) {
      const uint32_t id = token_ids[k];
      mask[id >> 5] |= uint32_t{1} << (id & 31);
    }
    ++i;
  }
  if (accepting_[config]) {
    for (uint32_t id : vocab_->eos_ids()) mask[id >> 5] |= uint32_t{1} << (id & 31);
  }
  if (static_cast<int64_t>(words * sizeof(uint32_t)) > options_.max_mask_cache_bytes) return;
  if (static_cast<int64_t>((masks_.size() + 1) * words * sizeof(uint32_t)) >
      options_.max_mask_cache_bytes) {
    masks_.clear();
  }
  masks_.emplace(config, std::vector<uint32_t>(mask, mask + words));
}

CompiledGrammar::Stats CompiledGrammar::Engine::stats() const {
  return CompiledGrammar::Stats{.configurations = static_cast<int>(configs_.size()),
                                .stack_nodes = static_cast<int>(nodes_.size()),
                                .cached_masks = static_cast<int>(masks_.size()),
                                .mask_cache_hits = mask_hits_,
                                .mask_walks = mask_walks_,
                                .table_resets = resets_};
}

}  // namespace swaserve::grammar
