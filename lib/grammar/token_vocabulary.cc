#include "lib/grammar/token_vocabulary.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "lib/base/hash.h"
#include "lib/model/tokenizer.h"

namespace swaserve::grammar {

absl::StatusOr<std::shared_ptr<const TokenVocabulary>> TokenVocabulary::FromTokenizer(
    const model::Tokenizer& tokenizer, const TokenVocabularyOptions& options) {
  const int n = tokenizer.vocab_size();
  std::vector<std::string> bytes(n);
  for (int id = 0; id < n; ++id) {
    const uint32_t u = static_cast<uint32_t>(id);
    if (tokenizer.IsSpecial(u)) continue;
    if (tokenizer.IsAddedToken(u) && !options.allow_added_tokens) continue;
    bytes[id] = std::string(tokenizer.TokenBytes(u));
  }
  std::vector<uint32_t> eos = options.eos_ids;
  if (eos.empty()) eos = tokenizer.eos_ids();
  return FromBytes(std::move(bytes), std::move(eos));
}

absl::StatusOr<std::shared_ptr<const TokenVocabulary>> TokenVocabulary::FromBytes(
    std::vector<std::string> token_bytes, std::vector<uint32_t> eos_ids) {
  if (token_bytes.empty()) return absl::InvalidArgumentError("empty vocabulary");
  std::shared_ptr<TokenVocabulary> v(new TokenVocabulary());
  v->bytes_ = std::move(token_bytes);
  v->is_eos_.assign(v->bytes_.size(), false);
  std::sort(eos_ids.begin(), eos_ids.end());
  eos_ids.erase(std::unique(eos_ids.begin(), eos_ids.end()), eos_ids.end());
  for (uint32_t id : eos_ids) {
    if (id >= v->bytes_.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("EOS id ", id, " is outside the vocabulary of ", v->bytes_.size()));
    }
    v->is_eos_[id] = true;
    v->bytes_[id].clear();  // EOS is never text
  }
  v->eos_ids_ = std::move(eos_ids);
  uint64_t h = base::Hash64(absl::StrCat("vocab:", v->bytes_.size()));
  for (const std::string& b : v->bytes_) h = base::Hash64(b, h ^ (b.size() * 0x9e3779b97f4a7c15ULL));
  for (uint32_t id : v->eos_ids_) h = base::Hash64(absl::StrCat("eos:", id), h);
  v->fingerprint_ = h;
  v->BuildTrie();
  return std::shared_ptr<const TokenVocabulary>(std::move(v));
}

absl::string_view TokenVocabulary::TokenBytes(uint32_t id) const {
  if (id >= bytes_.size()) return {};
  return bytes_[id];
}

bool TokenVocabulary::IsEos(uint32_t id) const { return id < is_eos_.size() && is_eos_[id]; }

namespace {

// UTF-8 reading states: at a character boundary, or inside a character
// expecting continuation bytes (with the first one's range where it is
// narrower).
enum Utf8State : uint8_t { kBoundary, kCont1, kCont2, kCont3, kAfterE0, kAfterED, kAfterF0, kAfterF4, kNumStates };

// The state after `b` and whether `b` starts a character; false when `b`
// cannot follow (or is not a plain string character).
bool Utf8Step(int s, uint8_t b, int* next, int* chars) {
  *chars = 0;
  auto cont = [&](uint8_t lo, uint8_t hi, int to) {
    if (b < lo || b > hi) return false;
    *next = to;
    return true;
  };
  switch (s) {
    case kBoundary:
      *chars = 1;
      if (b >= 0x20 && b < 0x7F && b != '"' && b != '\\') { *next = kBoundary; return true; }
      if (b >= 0xC2 && b <= 0xDF) { *next = kCont1; return true; }
      if (b == 0xE0) { *next = kAfterE0; return true; }
      if (b == 0xED) { *next = kAfterED; return true; }
      if (b >= 0xE1 && b <= 0xEF) { *next = kCont2; return true; }
      if (b == 0xF0) { *next = kAfterF0; return true; }
      if (b >= 0xF1 && b <= 0xF3) { *next = kCont3; return true; }
      if (b == 0xF4) { *next = kAfterF4; return true; }
      return false;
    case kCont1: return cont(0x80, 0xBF, kBoundary);
    case kCont2: return cont(0x80, 0xBF, kCont1);
    case kCont3: return cont(0x80, 0xBF, kCont2);
    case kAfterE0: return cont(0xA0, 0xBF, kCont1);
    case kAfterED: return cont(0x80, 0x9F, kCont1);
    case kAfterF0: return cont(0x90, 0xBF, kCont2);
    default: return cont(0x80, 0x8F, kCont2);  // kAfterF4
  }
}

}  // namespace

void TokenVocabulary::ComputePlainChars() {
  // f(i, s): the most characters a token below node i spans when node i is
  // read in UTF-8 state s; -1 when one of them is not plain text. Children
  // come after their parent in preorder, so a reverse pass sees them first.
  TokenTrie& t = trie_;
  const size_t n = t.byte.size();
  std::vector<int64_t> parent(n, -1);
  std::vector<uint32_t> stack;
  for (size_t i = 0; i < n; ++i) {
    while (!stack.empty() && t.depth[stack.back()] >= t.depth[i]) stack.pop_back();
    if (!stack.empty()) parent[i] = stack.back();
    stack.push_back(static_cast<uint32_t>(i));
  }
  // Per node and state: the children's max (0 when none) or -1 when one
  // child is not plain.
  std::vector<int16_t> children(n * kNumStates, 0);
  t.plain_chars.assign(n, 0);
  for (size_t i = n; i-- > 0;) {
    for (int s = 0; s < kNumStates; ++s) {
      int next, chars;
      int16_t f = -1;
      if (Utf8Step(s, t.byte[i], &next, &chars)) {
        const int16_t below = children[i * kNumStates + next];
        if (below >= 0) f = static_cast<int16_t>(std::min(255, chars + below));
      }
      if (s == kBoundary) t.plain_chars[i] = static_cast<uint8_t>(std::max<int16_t>(f, 0));
      if (parent[i] >= 0) {
        int16_t& agg = children[parent[i] * kNumStates + s];
        agg = (agg < 0 || f < 0) ? int16_t{-1} : std::max(agg, f);
      }
    }
  }
}

void TokenVocabulary::BuildTrie() {
  std::vector<uint32_t> order;
  for (uint32_t id = 0; id < bytes_.size(); ++id) {
    if (!bytes_[id].empty()) order.push_back(id);
  }
  std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    return bytes_[a] != bytes_[b] ? bytes_[a] < bytes_[b] : a < b;
  });
  TokenTrie& t = trie_;
  std::vector<uint32_t> path;  // node index per depth - 1 on the current path
  std::vector<std::pair<uint32_t, uint32_t>> ends;  // (node, token id), nodes ascending
  const std::string* prev = nullptr;
  for (uint32_t id : order) {
    const std::string& s = bytes_[id];
    size_t lcp = 0;
    if (prev != nullptr) {
      while (lcp < s.size() && lcp < prev->size() && s[lcp] == (*prev)[lcp]) ++lcp;
    }
    while (path.size() > lcp) {
      t.subtree_end[path.back()] = static_cast<uint32_t>(t.byte.size());
      path.pop_back();
    }
    for (size_t i = lcp; i < s.size(); ++i) {
      path.push_back(static_cast<uint32_t>(t.byte.size()));
      t.byte.push_back(static_cast<uint8_t>(s[i]));
      t.depth.push_back(static_cast<uint16_t>(i + 1));
      t.subtree_end.push_back(0);
    }
    t.max_depth = std::max(t.max_depth, static_cast<int>(s.size()));
    ends.emplace_back(path.back(), id);
    prev = &s;
  }
  while (!path.empty()) {
    t.subtree_end[path.back()] = static_cast<uint32_t>(t.byte.size());
    path.pop_back();
  }
  t.token_begin.assign(t.byte.size() + 1, 0);
  for (const auto& [node, id] : ends) ++t.token_begin[node + 1];
  std::partial_sum(t.token_begin.begin(), t.token_begin.end(), t.token_begin.begin());
  t.token_ids.resize(ends.size());
  for (size_t i = 0; i < ends.size(); ++i) t.token_ids[i] = ends[i].second;  // already node order
  ComputePlainChars();
}

}  // namespace swaserve::grammar
