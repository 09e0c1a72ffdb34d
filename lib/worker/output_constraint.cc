#include "lib/worker/output_constraint.h"

#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "lib/grammar/matcher.h"
#include "lib/grammar/constraint_spec.h"

namespace swaserve::worker {
namespace {

// The sampler's view of a grammar matcher, free until `start_after` came.
class GrammarConstraint final : public model::TokenConstraint {
 public:
  GrammarConstraint(std::shared_ptr<const grammar::CompiledGrammar> g,
                    std::optional<uint32_t> start_after)
      : matcher_(std::move(g)), started_(!start_after.has_value()), start_after_(start_after) {}

  bool FillMask(std::vector<uint32_t>* mask) override {
    const grammar::TokenVocabulary& vocab = matcher_.grammar().vocabulary();
    const size_t words = static_cast<size_t>(vocab.BitmaskWords());
    if (!started_) {
      // Free text until the reasoning ends, but it must end: the output
      // cannot stop before the constrained part.
      mask->assign(words, ~0u);
      for (uint32_t eos : vocab.eos_ids()) {
        if (eos / 32 < words) (*mask)[eos / 32] &= ~(1u << (eos % 32));
      }
      return true;
    }
    mask->assign(words, 0);
    matcher_.FillNextTokenMask(mask->data());
    return true;
  }
  bool Accept(uint32_t token) override {
    if (!started_) {
      started_ = token == *start_after_;
      kinds_.push_back(started_ ? kStart : kFree);
      return true;
    }
    if (!matcher_.AcceptToken(token)) return false;
    kinds_.push_back(kMatched);
    return true;
  }
  bool Terminated() override { return started_ && matcher_.IsTerminated(); }
  void Rollback(int n) override {
    int matched = 0;
    for (; n > 0 && !kinds_.empty(); --n) {
      if (kinds_.back() == kMatched) ++matched;
      if (kinds_.back() == kStart) started_ = false;
      kinds_.pop_back();
    }
    matcher_.Rollback(matched);
  }

 private:
  // What each accepted token was: free text before the start, the start
  // token, or a token of the grammar.
  enum Kind : uint8_t { kFree, kStart, kMatched };
  std::vector<uint8_t> kinds_;
  grammar::GrammarMatcher matcher_;
  bool started_;
  std::optional<uint32_t> start_after_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ConstraintFactory>> ConstraintFactory::Create(
    const model::Tokenizer& tokenizer, const std::vector<uint32_t>& eos_ids,
    const ConstraintFactoryOptions& options) {
  grammar::TokenVocabularyOptions vo;
  vo.eos_ids = eos_ids;
  std::unique_ptr<ConstraintFactory> f(new ConstraintFactory());
  auto vocab = grammar::TokenVocabulary::FromTokenizer(tokenizer, vo);
  if (!vocab.ok()) return vocab.status();
  f->vocab_ = *std::move(vocab);
  f->cache_ = std::make_unique<grammar::GrammarCache>(
      grammar::GrammarCacheOptions{.max_entries = options.max_grammars});
  return f;
}

absl::StatusOr<std::shared_ptr<model::TokenConstraint>> ConstraintFactory::Make(
    const v1::OutputConstraint& spec) const {
  if (spec.kind() == v1::OutputConstraint::KIND_NONE) return nullptr;
  absl::StatusOr<std::shared_ptr<const grammar::CompiledGrammar>> g =
      grammar::CompileConstraint(spec, vocab_, cache_.get());
  if (!g.ok()) return g.status();
  std::optional<uint32_t> start_after;
  if (spec.has_start_after_token()) start_after = spec.start_after_token();
  auto c = std::make_shared<GrammarConstraint>(*std::move(g), start_after);
  for (uint32_t t : spec.generated_token_ids()) {
    if (!c->Accept(t)) {
      return absl::InvalidArgumentError(
          absl::StrCat("constraint: the output so far does not match it (token ", t, ")"));
    }
  }
  return c;
}

}  // namespace swaserve::worker
