// Internal to swaserve::model_text (included only by lib/model/tokenizer*.cc
// and their tests): the representation behind Tokenizer (tokenizer.h).
//
//   tokenizer.cc           Tokenizer's public methods (load, encode, decode,
//                          lookups)
//   tokenizer_json.{h,cc}  reading tokenizer.json (SAX reader, typed fields)
//   tokenizer_pipeline.cc  added tokens, normalizer, pre-tokenizer and decoder
//                          configuration; the encode pipeline up to words
//   tokenizer_bpe.cc       the BPE model: vocabulary, merges, byte symbols,
//                          byte fallback / unk, the merge loops, word cache
//
// Thread-safety: a Rep is built by one thread (Tokenizer::FromJson) and then
// only read; its WordCache keeps a map per thread (see WordCache), so the
// const methods may run concurrently.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <bitset>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "lib/model/pretokenizer.h"
#include "lib/model/tokenizer.h"
#include "lib/model/tokenizer_json.h"

namespace swaserve::model {
namespace tokenizer_internal {

inline constexpr uint32_t kNoId = std::numeric_limits<uint32_t>::max();
// Words longer than this are not cached (they rarely repeat).
inline constexpr size_t kMaxCachedWordBytes = 128;
// Words with more symbols use the heap-based merge loop.
inline constexpr size_t kSmallWordSymbols = 48;

// Flags per id.
inline constexpr uint8_t kValid = 1;
inline constexpr uint8_t kAdded = 2;
inline constexpr uint8_t kSpecial = 4;

struct Merge {
  uint32_t rank;
  uint32_t new_id;
};

inline uint64_t PairKey(uint32_t a, uint32_t b) {
  return (uint64_t{a} << 32) | b;
}

struct AddedToken {
  std::string content;
  uint32_t id = 0;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
  bool normalized = false;
};

// A byte trie over added-token contents for leftmost-longest matching.
class AddedTrie {
 public:
  AddedTrie() : terminal_(1, -1) {}

  void Insert(absl::string_view s, int token_index) {
    if (s.empty()) return;
    first_.set(static_cast<uint8_t>(s[0]));
    int node = 0;
    for (const char ch : s) {
      const uint64_t key = EdgeKey(node, static_cast<uint8_t>(ch));
      auto it = edges_.find(key);
      if (it == edges_.end()) {
        terminal_.push_back(-1);
        it = edges_.emplace(key, static_cast<int>(terminal_.size()) - 1).first;
      }
      node = it->second;
    }
    terminal_[node] = token_index;
  }

  bool empty() const { return terminal_.size() <= 1; }

  // Finds the leftmost position >= from where some token for which
  // `eligible(token_index, start, end)` holds matches, and the longest such
  // token there.
  template <typename Eligible>
  bool Find(absl::string_view text, size_t from, const Eligible& eligible,
            size_t* start, size_t* end, int* token) const {
    const size_t n = text.size();
    for (size_t p = from; p < n; ++p) {
      if (!first_.test(static_cast<uint8_t>(text[p]))) continue;
      int node = 0;
      int best = -1;
      size_t best_end = 0;
      for (size_t q = p; q < n; ++q) {
        const auto it =
            edges_.find(EdgeKey(node, static_cast<uint8_t>(text[q])));
        if (it == edges_.end()) break;
        node = it->second;
        const int t = terminal_[node];
        if (t >= 0 && eligible(t, p, q + 1)) {
          best = t;
          best_end = q + 1;
        }
      }
      if (best >= 0) {
        *start = p;
        *end = best_end;
        *token = best;
        return true;
      }
    }
    return false;
  }

 private:
  static uint64_t EdgeKey(int node, uint8_t byte) {
    return (static_cast<uint64_t>(node) << 8) | byte;
  }

  std::vector<int> terminal_;  // token index per node, -1 for none
  absl::flat_hash_map<uint64_t, int> edges_;
  std::bitset<256> first_;
};

// Cache of BPE results per word. Each thread has its own map per tokenizer
// (thread_local, at most kMaxCachesPerThread tokenizers per thread, least
// recently used dropped), so lookups take no lock and threads never contend.
// A map is cleared when it reaches the capacity. Maps of a destroyed
// tokenizer stay allocated until they are evicted or the thread exits.
class WordCache {
 public:
  using Ids = absl::InlinedVector<uint32_t, 4>;
  using Map = absl::flat_hash_map<std::string, Ids>;

  explicit WordCache(size_t capacity)
      : capacity_(capacity), owner_(next_owner_.fetch_add(1) + 1) {}

  bool enabled() const { return capacity_ > 0; }

  // Appends the cached ids of `word` to `out`; false on a miss.
  bool Lookup(absl::string_view word, std::vector<uint32_t>* out) const {
    const Map& map = ThisThreadMap();
    const auto it = map.find(word);
    if (it == map.end()) return false;
    out->insert(out->end(), it->second.begin(), it->second.end());
    return true;
  }

  void Insert(absl::string_view word, absl::Span<const uint32_t> ids) const {
    Map& map = ThisThreadMap();
    if (map.size() >= capacity_) map.clear();
    map.try_emplace(word, ids.begin(), ids.end());
  }

 private:
  static constexpr size_t kMaxCachesPerThread = 4;
  struct ThreadMaps {
    // Most recently used first.
    std::vector<std::pair<uint64_t, std::unique_ptr<Map>>> maps;
  };

  Map& ThisThreadMap() const {
    thread_local ThreadMaps tls;
    auto& maps = tls.maps;
    if (!maps.empty() && maps.front().first == owner_) {
      return *maps.front().second;
    }
    for (size_t i = 1; i < maps.size(); ++i) {
      if (maps[i].first == owner_) {
        std::rotate(maps.begin(), maps.begin() + i, maps.begin() + i + 1);
        return *maps.front().second;
      }
    }
    if (maps.size() >= kMaxCachesPerThread) maps.pop_back();
    maps.insert(maps.begin(), {owner_, std::make_unique<Map>()});
    return *maps.front().second;
  }

  static inline std::atomic<uint64_t> next_owner_{0};
  const size_t capacity_;
  const uint64_t owner_;  // unique per cache, never reused
};

}  // namespace tokenizer_internal

struct Tokenizer::Rep {
  explicit Rep(const TokenizerOptions& options)
      : cache(options.word_cache_entries) {}

  // Model.
  absl::flat_hash_map<std::string, uint32_t> token_to_id;
  std::vector<std::string> id_to_token;  // spelling; empty for gaps
  std::vector<std::string> id_bytes;     // decoded bytes
  std::vector<uint8_t> id_flags;
  absl::flat_hash_map<uint64_t, tokenizer_internal::Merge> merges;
  std::array<uint32_t, 256> byte_id{};  // token of each byte's character
  bool byte_fallback = false;
  bool fuse_unk = false;
  bool ignore_merges = false;
  uint32_t unk_id = tokenizer_internal::kNoId;

  // Added tokens.
  std::vector<tokenizer_internal::AddedToken> added;
  tokenizer_internal::AddedTrie
      raw_trie;  // normalized = false: matched on the input
  tokenizer_internal::AddedTrie
      normalized_trie;  // normalized = true: matched after normalizing

  // Normalizer / pre-tokenizer.
  bool nfc = false;
  bool add_prefix_space = false;
  std::vector<std::unique_ptr<Splitter>> splitters;

  std::optional<uint32_t> im_start;
  std::optional<uint32_t> im_end;
  std::optional<uint32_t> endoftext;
  std::vector<uint32_t> eos;

  tokenizer_internal::WordCache cache;

  // ---- Loading ----
  absl::Status ParseModel(tokenizer_internal::TokenizerJsonReader& reader);
  absl::Status ParseAddedTokens(const tokenizer_internal::Json& root);
  absl::Status ParseNormalizer(const tokenizer_internal::Json& root);
  absl::Status ParsePreTokenizer(const tokenizer_internal::Json& root);
  absl::Status ParseDecoder(const tokenizer_internal::Json& root);
  absl::Status AddPreTokenizerStep(const tokenizer_internal::Json& step,
                                   bool first, bool* byte_level);
  void SetId(uint32_t id, std::string spelling, std::string bytes,
             uint8_t flags);
  void Finish();

  // ---- Encoding ----
  // Where special added tokens may be matched: nowhere (parse_special
  // false), everywhere, or everywhere but inside the `literal` byte ranges
  // of the text starting at `base` (Tokenizer::EncodeAppendWithLiterals).
  struct SpecialPolicy {
    bool parse_special = false;
    const char* base = nullptr;
    absl::Span<const std::pair<size_t, size_t>> literal;

    // May a special token whose text is `token` (a view into the text at
    // `base`) be matched?
    bool Allows(absl::string_view token) const;
    // Does `piece` (a view into that text) overlap a literal range?
    bool Overlaps(absl::string_view piece) const;
  };
  absl::Status EncodeAppend(absl::string_view text, const SpecialPolicy& policy,
                            std::vector<uint32_t>* out) const;
  absl::Status EncodeNormalizedPiece(absl::string_view text,
                                     const SpecialPolicy& policy,
                                     std::vector<uint32_t>* out) const;
  absl::Status EncodePreTokenized(absl::string_view text,
                                  std::vector<uint32_t>* out) const;
  void EncodeWord(absl::string_view word, std::vector<uint32_t>* out) const;
  void Bpe(absl::string_view word, std::vector<uint32_t>* out) const;
  void AppendSymbolsForByte(uint8_t b, absl::InlinedVector<uint32_t, 64>* syms,
                            bool* last_was_unk) const;
  void MergeSmall(absl::InlinedVector<uint32_t, 64>* syms) const;
  void MergeLarge(absl::InlinedVector<uint32_t, 64>* syms) const;
  const tokenizer_internal::Merge* FindMerge(uint32_t a, uint32_t b) const {
    const auto it = merges.find(tokenizer_internal::PairKey(a, b));
    return it == merges.end() ? nullptr : &it->second;
  }
  // Splits `text` on the added tokens of `trie`; calls on_text for the text
  // between them and on_token for each matched token.
  template <typename OnText>
  absl::Status SplitAdded(const tokenizer_internal::AddedTrie& trie,
                          absl::string_view text, const SpecialPolicy& policy,
                          OnText on_text, std::vector<uint32_t>* out) const;

  bool IsWordChar(absl::string_view text, size_t pos, bool before) const;
};

}  // namespace swaserve::model
