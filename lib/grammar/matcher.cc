#include "lib/grammar/matcher.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "lib/grammar/engine.h"

namespace swaserve::grammar {

using Engine = CompiledGrammar::Engine;

GrammarMatcher::GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar)
    : grammar_(std::move(grammar)) {}

int32_t GrammarMatcher::Current() {
  Engine& e = *grammar_->engine_;
  e.MaybeReset();
  if (generation_ != e.generation() || history_.empty()) {
    generation_ = e.generation();
    history_.clear();
    int32_t c = e.NextBytes(e.Start(), prefix_bytes_);
    history_.push_back(c);
    const TokenVocabulary& v = grammar_->vocabulary();
    for (uint32_t id : tokens_) {
      if (!v.IsEos(id)) c = e.NextBytes(c, v.TokenBytes(id));
      history_.push_back(c);
    }
  }
  return history_.back();
}

void GrammarMatcher::FillNextTokenMask(uint32_t* bitmask) {
  if (terminated_) {
    std::memset(bitmask, 0, sizeof(uint32_t) * grammar_->vocabulary().BitmaskWords());
    return;
  }
  Engine& e = *grammar_->engine_;
  absl::MutexLock lock(&e.mu);
  e.FillMask(Current(), bitmask);
}

bool GrammarMatcher::IsTokenAllowed(uint32_t id) {
  if (terminated_) return false;
  const TokenVocabulary& v = grammar_->vocabulary();
  Engine& e = *grammar_->engine_;
  absl::MutexLock lock(&e.mu);
  const int32_t c = Current();
  if (v.IsEos(id)) return e.Accepting(c);
  const absl::string_view b = v.TokenBytes(id);
  if (b.empty()) return false;
  return e.NextBytes(c, b) != Engine::kDead;
}

bool GrammarMatcher::AcceptToken(uint32_t id) {
  if (terminated_) return false;
  const TokenVocabulary& v = grammar_->vocabulary();
  Engine& e = *grammar_->engine_;
  absl::MutexLock lock(&e.mu);
  const int32_t c = Current();
  if (v.IsEos(id)) {
    if (!e.Accepting(c)) return false;
    tokens_.push_back(id);
    history_.push_back(c);
    terminated_ = true;
    return true;
  }
  const absl::string_view b = v.TokenBytes(id);
  if (b.empty()) return false;
  const int32_t next = e.NextBytes(c, b);
  if (next == Engine::kDead) return false;
  tokens_.push_back(id);
  history_.push_back(next);
  return true;
}

bool GrammarMatcher::AcceptBytes(std::string_view bytes) {
  if (terminated_ || !tokens_.empty()) return false;
  Engine& e = *grammar_->engine_;
  absl::MutexLock lock(&e.mu);
  const int32_t next = e.NextBytes(Current(), absl::string_view(bytes.data(), bytes.size()));
  if (next == Engine::kDead) return false;
  prefix_bytes_.append(bytes.data(), bytes.size());
  history_.back() = next;
  return true;
}

bool GrammarMatcher::IsAccepting() {
  if (terminated_) return true;
  Engine& e = *grammar_->engine_;
  absl::MutexLock lock(&e.mu);
  return e.Accepting(Current());
}

bool GrammarMatcher::IsTerminated() {
  if (terminated_) return true;
  Engine& e = *grammar_->engine_;
  absl::MutexLock lock(&e.mu);
  const int32_t c = Current();
  return e.Accepting(c) && !e.HasContinuation(c);
}

void GrammarMatcher::Rollback(int n) {
  n = std::min<int>(std::max(n, 0), static_cast<int>(tokens_.size()));
  if (n == 0) return;
  tokens_.resize(tokens_.size() - n);
  if (history_.size() == tokens_.size() + n + 1) {
    history_.resize(tokens_.size() + 1);
  } else {
    history_.clear();  // rebuilt by the next call
  }
  terminated_ = !tokens_.empty() && grammar_->vocabulary().IsEos(tokens_.back());
}

void GrammarMatcher::Reset() {
  tokens_.clear();
  history_.clear();
  prefix_bytes_.clear();
  terminated_ = false;
}

bool GrammarMatcher::ResetTo(absl::Span<const uint32_t> tokens) {
  const std::string prefix = prefix_bytes_;
  Reset();
  prefix_bytes_ = prefix;
  for (uint32_t id : tokens) {
    if (!AcceptToken(id)) return false;
  }
  return true;
}

}  // namespace swaserve::grammar
