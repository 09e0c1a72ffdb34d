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
  // plain_height, children before parents (reverse preorder).
  const size_t n = t.byte.size();
  std::vector<uint8_t> child_max(n, 0);
  std::vector<bool> child_bad(n, false);
  std::vector<int64_t> parent(n, -1);
  std::vector<uint32_t> stack;
  for (size_t i = 0; i < n; ++i) {
    while (!stack.empty() && t.depth[stack.back()] >= t.depth[i]) stack.pop_back();
    if (!stack.empty()) parent[i] = stack.back();
    stack.push_back(static_cast<uint32_t>(i));
  }
  t.plain_height.assign(n, 0);
  for (size_t i = n; i-- > 0;) {
    if (IsPlainAsciiByte(t.byte[i]) && !child_bad[i]) {
      t.plain_height[i] = static_cast<uint8_t>(std::min(255, child_max[i] + 1));
    }
    if (parent[i] >= 0) {
      if (t.plain_height[i] == 0) child_bad[parent[i]] = true;
      child_max[parent[i]] = std::max(child_max[parent[i]], t.plain_height[i]);
    }
  }
}

}  // namespace swaserve::grammar
