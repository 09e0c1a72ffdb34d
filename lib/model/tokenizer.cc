#include "lib/model/tokenizer.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <bitset>
#include <cstdio>
#include <functional>
#include <limits>
#include <queue>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "lib/base/status.h"
#include "lib/model/pretokenizer.h"
#include "lib/model/unicode.h"
#include "nlohmann/json.hpp"

namespace swaserve::model {
namespace {

using Json = nlohmann::json;

constexpr uint32_t kNoId = std::numeric_limits<uint32_t>::max();
// Sanity bound on ids in tokenizer.json (real vocabularies are < 2^18).
constexpr uint64_t kMaxId = uint64_t{1} << 24;
// Words longer than this are not cached (they rarely repeat).
constexpr size_t kMaxCachedWordBytes = 128;
// Words with more symbols use the heap-based merge loop.
constexpr size_t kSmallWordSymbols = 48;

// Flags per id.
constexpr uint8_t kValid = 1;
constexpr uint8_t kAdded = 2;
constexpr uint8_t kSpecial = 4;

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

// ---- JSON helpers --------------------------------------------------------

const Json* Field(const Json& obj, const char* key) {
  if (!obj.is_object()) return nullptr;
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

absl::StatusOr<bool> BoolField(const Json& obj, const char* key, bool def,
                               absl::string_view where) {
  const Json* v = Field(obj, key);
  if (v == nullptr) return def;
  if (!v->is_boolean()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer.json: ", where, ".", key, " is not a boolean"));
  }
  return v->get<bool>();
}

absl::StatusOr<std::string> StringField(const Json& obj, const char* key,
                                        absl::string_view where) {
  const Json* v = Field(obj, key);
  if (v == nullptr || !v->is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tokenizer.json: ", where, ".", key, " is missing or not a string"));
  }
  return v->get<std::string>();
}

absl::StatusOr<uint32_t> IdValue(const Json& v, absl::string_view where) {
  if (!v.is_number_integer() || v.get<int64_t>() < 0 ||
      static_cast<uint64_t>(v.get<int64_t>()) >= kMaxId) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tokenizer.json: ", where, " is not a token id in [0, ", kMaxId, ")"));
  }
  return static_cast<uint32_t>(v.get<int64_t>());
}

std::string Utf8Of(char32_t cp) {
  std::string s;
  unicode::AppendUtf8(cp, &s);
  return s;
}

// "<0xHH>" -> HH, or -1.
int ByteFallbackValue(absl::string_view token) {
  if (token.size() != 6 || token.substr(0, 3) != "<0x" || token[5] != '>') {
    return -1;
  }
  int v = 0;
  for (int i = 3; i < 5; ++i) {
    const char c = token[i];
    v <<= 4;
    if (c >= '0' && c <= '9') {
      v |= c - '0';
    } else if (c >= 'A' && c <= 'F') {
      v |= c - 'A' + 10;
    } else {
      return -1;
    }
  }
  return v;
}

std::string ByteFallbackToken(uint8_t b) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string s = "<0x";
  s.push_back(kHex[b >> 4]);
  s.push_back(kHex[b & 15]);
  s.push_back('>');
  return s;
}

// Reads tokenizer.json in one SAX pass: model.vocab and model.merges (the
// bulk of a real file: ~150k entries each) stream straight into vectors, the
// rest becomes a small DOM. About 3x faster than building the full DOM.
class TokenizerJsonReader {
 public:
  // Everything except model.vocab and model.merges.
  Json root;
  bool has_vocab = false;
  std::vector<std::pair<std::string, int64_t>> vocab;
  bool has_merges = false;
  std::vector<std::pair<std::string, std::string>> merges;
  std::string error;  // first error in vocab/merges or the JSON syntax

  bool null() { return Value(Json(nullptr)); }
  bool boolean(bool v) { return Value(Json(v)); }
  bool number_integer(int64_t v) { return Integer(v); }
  bool number_unsigned(uint64_t v) {
    return Integer(
        v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())
            ? -1
            : static_cast<int64_t>(v));
  }
  bool number_float(double v, const std::string&) { return Value(Json(v)); }
  bool string(std::string& v) {
    if (mode_ == Mode::kMerges) {
      const size_t space = v.find(' ');
      if (space == std::string::npos ||
          v.find(' ', space + 1) != std::string::npos) {
        return Fail(
            absl::StrCat("model.merges[", merges.size(), "] = \"", v,
                         "\" is not two tokens separated by one space"));
      }
      merges.emplace_back(v.substr(0, space), v.substr(space + 1));
      return true;
    }
    if (mode_ == Mode::kMergePair) {
      if (pair_.size() >= 2) return BadMerge();
      pair_.push_back(std::move(v));
      return true;
    }
    return Value(Json(std::move(v)));
  }
  bool binary(Json::binary_t&) { return Fail("unexpected binary value"); }
  bool key(std::string& k) {
    key_ = std::move(k);
    return true;
  }
  bool start_object(size_t) {
    if (mode_ == Mode::kDom && IsModelField("vocab")) {
      mode_ = Mode::kVocab;
      has_vocab = true;
      return true;
    }
    if (mode_ != Mode::kDom) {
      return mode_ == Mode::kVocab ? BadVocab() : BadMerge();
    }
    return Open(Json::object());
  }
  bool end_object() {
    if (mode_ == Mode::kVocab) {
      mode_ = Mode::kDom;
      return true;
    }
    stack_.pop_back();
    keys_.pop_back();
    return true;
  }
  bool start_array(size_t) {
    if (mode_ == Mode::kDom && IsModelField("merges")) {
      mode_ = Mode::kMerges;
      has_merges = true;
      return true;
    }
    if (mode_ == Mode::kMerges) {
      mode_ = Mode::kMergePair;
      pair_.clear();
      return true;
    }
    if (mode_ != Mode::kDom) {
      return mode_ == Mode::kVocab ? BadVocab() : BadMerge();
    }
    return Open(Json::array());
  }
  bool end_array() {
    if (mode_ == Mode::kMergePair) {
      if (pair_.size() != 2) return BadMerge();
      merges.emplace_back(std::move(pair_[0]), std::move(pair_[1]));
      mode_ = Mode::kMerges;
      return true;
    }
    if (mode_ == Mode::kMerges) {
      mode_ = Mode::kDom;
      return true;
    }
    stack_.pop_back();
    keys_.pop_back();
    return true;
  }
  bool parse_error(size_t position, const std::string&,
                   const nlohmann::detail::exception& e) {
    return Fail(
        absl::StrCat("not valid JSON (at byte ", position, "): ", e.what()));
  }

 private:
  enum class Mode { kDom, kVocab, kMerges, kMergePair };

  // True when the container about to open is root.model.<field>.
  bool IsModelField(const char* field) const {
    return stack_.size() == 2 && keys_[1] == "model" &&
           stack_[1]->is_object() && key_ == field;
  }
  bool Integer(int64_t v) {
    if (mode_ == Mode::kVocab) {
      vocab.emplace_back(std::move(key_), v);
      return true;
    }
    if (mode_ != Mode::kDom) return BadMerge();
    return Value(Json(v));
  }
  bool Value(Json v) {
    if (mode_ == Mode::kVocab) return BadVocab();
    if (mode_ != Mode::kDom) return BadMerge();
    Place(std::move(v));
    return true;
  }
  Json* Place(Json v) {
    if (stack_.empty()) {
      root = std::move(v);
      return &root;
    }
    Json* top = stack_.back();
    if (top->is_object()) {
      Json& slot = (*top)[key_];
      slot = std::move(v);
      return &slot;
    }
    top->push_back(std::move(v));
    return &top->back();
  }
  bool Open(Json container) {
    std::string key = stack_.empty() || !stack_.back()->is_object() ? "" : key_;
    stack_.push_back(Place(std::move(container)));
    keys_.push_back(std::move(key));
    return true;
  }
  bool BadVocab() {
    return Fail(absl::StrCat("model.vocab[\"", key_, "\"] is not a token id"));
  }
  bool BadMerge() {
    return Fail(absl::StrCat("model.merges[", merges.size(),
                             "] is neither \"a b\" nor [\"a\", \"b\"]"));
  }
  bool Fail(std::string message) {
    if (error.empty()) error = std::move(message);
    return false;
  }

  Mode mode_ = Mode::kDom;
  std::vector<Json*> stack_;       // open DOM containers
  std::vector<std::string> keys_;  // the key each was opened under
  std::string key_;                // the last object key
  std::vector<std::string> pair_;  // the merge pair being read
};

}  // namespace

// ---- Rep -----------------------------------------------------------------

struct Tokenizer::Rep {
  explicit Rep(const TokenizerOptions& options)
      : cache(options.word_cache_entries) {}

  // Model.
  absl::flat_hash_map<std::string, uint32_t> token_to_id;
  std::vector<std::string> id_to_token;  // spelling; empty for gaps
  std::vector<std::string> id_bytes;     // decoded bytes
  std::vector<uint8_t> id_flags;
  absl::flat_hash_map<uint64_t, Merge> merges;
  std::array<uint32_t, 256> byte_id{};  // token of each byte's character
  bool byte_fallback = false;
  bool fuse_unk = false;
  bool ignore_merges = false;
  uint32_t unk_id = kNoId;

  // Added tokens.
  std::vector<AddedToken> added;
  AddedTrie raw_trie;         // normalized = false: matched on the input
  AddedTrie normalized_trie;  // normalized = true: matched after normalizing

  // Normalizer / pre-tokenizer.
  bool nfc = false;
  bool add_prefix_space = false;
  std::vector<std::unique_ptr<Splitter>> splitters;

  std::optional<uint32_t> im_start;
  std::optional<uint32_t> im_end;
  std::optional<uint32_t> endoftext;
  std::vector<uint32_t> eos;

  WordCache cache;

  // ---- Loading ----
  absl::Status ParseModel(TokenizerJsonReader& reader);
  absl::Status ParseAddedTokens(const Json& root);
  absl::Status ParseNormalizer(const Json& root);
  absl::Status ParsePreTokenizer(const Json& root);
  absl::Status ParseDecoder(const Json& root);
  absl::Status AddPreTokenizerStep(const Json& step, bool first,
                                   bool* byte_level);
  void SetId(uint32_t id, std::string spelling, std::string bytes,
             uint8_t flags);
  void Finish();

  // ---- Encoding ----
  absl::Status EncodeAppend(absl::string_view text, bool parse_special,
                            std::vector<uint32_t>* out) const;
  absl::Status EncodeNormalizedPiece(absl::string_view text, bool parse_special,
                                     std::vector<uint32_t>* out) const;
  absl::Status EncodePreTokenized(absl::string_view text,
                                  std::vector<uint32_t>* out) const;
  void EncodeWord(absl::string_view word, std::vector<uint32_t>* out) const;
  void Bpe(absl::string_view word, std::vector<uint32_t>* out) const;
  void AppendSymbolsForByte(uint8_t b, absl::InlinedVector<uint32_t, 64>* syms,
                            bool* last_was_unk) const;
  void MergeSmall(absl::InlinedVector<uint32_t, 64>* syms) const;
  void MergeLarge(absl::InlinedVector<uint32_t, 64>* syms) const;
  const Merge* FindMerge(uint32_t a, uint32_t b) const {
    const auto it = merges.find(PairKey(a, b));
    return it == merges.end() ? nullptr : &it->second;
  }
  // Splits `text` on the added tokens of `trie`; calls on_text for the text
  // between them and on_token for each matched token.
  template <typename OnText>
  absl::Status SplitAdded(const AddedTrie& trie, absl::string_view text,
                          bool parse_special, OnText on_text,
                          std::vector<uint32_t>* out) const;

  bool IsWordChar(absl::string_view text, size_t pos, bool before) const;
};

void Tokenizer::Rep::SetId(uint32_t id, std::string spelling, std::string bytes,
                           uint8_t flags) {
  if (id >= id_to_token.size()) {
    id_to_token.resize(id + 1);
    id_bytes.resize(id + 1);
    id_flags.resize(id + 1, 0);
  }
  id_to_token[id] = std::move(spelling);
  id_bytes[id] = std::move(bytes);
  id_flags[id] = flags;
}

absl::Status Tokenizer::Rep::ParseModel(TokenizerJsonReader& reader) {
  const Json* model = Field(reader.root, "model");
  if (model == nullptr || !model->is_object()) {
    return absl::InvalidArgumentError("tokenizer.json: no \"model\" object");
  }
  const Json* type = Field(*model, "type");
  if (type != nullptr && (!type->is_string() || *type != "BPE")) {
    return absl::UnimplementedError(absl::StrCat("tokenizer.json: model.type ",
                                                 type->dump(),
                                                 " (only BPE is supported)"));
  }
  ASSIGN_OR_RETURN(byte_fallback,
                   BoolField(*model, "byte_fallback", false, "model"));
  ASSIGN_OR_RETURN(fuse_unk, BoolField(*model, "fuse_unk", false, "model"));
  ASSIGN_OR_RETURN(ignore_merges,
                   BoolField(*model, "ignore_merges", false, "model"));
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const Json* v = Field(*model, key);
    if (v != nullptr && !(v->is_string() && v->get<std::string>().empty())) {
      return absl::UnimplementedError(
          absl::StrCat("tokenizer.json: model.", key, " = ", v->dump(),
                       " (only byte-level BPE without affixes is supported)"));
    }
  }
  if (const Json* dropout = Field(*model, "dropout");
      dropout != nullptr &&
      !(dropout->is_number() && dropout->get<double>() == 0.0)) {
    return absl::UnimplementedError(
        "tokenizer.json: model.dropout (BPE dropout is not supported)");
  }

  // Vocabulary.
  if (!reader.has_vocab) {
    return absl::InvalidArgumentError(
        "tokenizer.json: model.vocab is missing or not an object");
  }
  token_to_id.reserve(reader.vocab.size() + 64);
  int64_t max_id = -1;
  for (const auto& [token, id] : reader.vocab) max_id = std::max(max_id, id);
  if (max_id >= 0 && static_cast<uint64_t>(max_id) < kMaxId) {
    id_to_token.reserve(max_id + 1);
    id_bytes.reserve(max_id + 1);
    id_flags.reserve(max_id + 1);
  }
  for (auto& [token, raw_id] : reader.vocab) {
    if (raw_id < 0 || static_cast<uint64_t>(raw_id) >= kMaxId) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer.json: model.vocab[\"", token,
                       "\"] is not a token id in [0, ", kMaxId, ")"));
    }
    const auto id = static_cast<uint32_t>(raw_id);
    if (id < id_flags.size() && (id_flags[id] & kValid)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tokenizer.json: model.vocab: id ", id, " is used by both \"",
          id_to_token[id], "\" and \"", token, "\""));
    }
    if (!token_to_id.emplace(token, id).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tokenizer.json: model.vocab: token \"", token, "\" appears twice"));
    }
    // Byte-level tokens decode through the inverse byte map; a token with a
    // character outside it decodes to its own UTF-8 (as HF's ByteLevel does).
    std::string bytes;
    bool mapped = true;
    const absl::string_view spelling = token;
    if (!unicode::IsValidUtf8(spelling)) {
      return absl::InvalidArgumentError(
          "tokenizer.json: model.vocab has a token that is not UTF-8");
    }
    const auto* p = reinterpret_cast<const uint8_t*>(spelling.data());
    for (size_t i = 0; i < spelling.size();) {
      int len;
      const int b = unicode::UnicodeToByte(unicode::DecodeValid(p + i, &len));
      if (b < 0) {
        mapped = false;
        break;
      }
      bytes.push_back(static_cast<char>(b));
      i += len;
    }
    if (!mapped) bytes = std::string(spelling);
    if (byte_fallback) {
      const int v = ByteFallbackValue(spelling);
      if (v >= 0) bytes = std::string(1, static_cast<char>(v));
    }
    SetId(id, std::move(token), std::move(bytes), kValid);
  }

  // Single-byte symbols.
  for (int b = 0; b < 256; ++b) {
    const auto it = token_to_id.find(
        Utf8Of(unicode::ByteToUnicode(static_cast<uint8_t>(b))));
    byte_id[b] = it == token_to_id.end() ? kNoId : it->second;
  }

  if (const Json* unk = Field(*model, "unk_token"); unk != nullptr) {
    if (!unk->is_string()) {
      return absl::InvalidArgumentError(
          "tokenizer.json: model.unk_token is not a string");
    }
    const auto it = token_to_id.find(unk->get<std::string>());
    if (it == token_to_id.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer.json: model.unk_token \"",
                       unk->get<std::string>(), "\" is not in the vocabulary"));
    }
    unk_id = it->second;
  }

  // Merges: "a b" strings (tokenizers < 0.20) or ["a", "b"] pairs, split
  // by the reader.
  if (!reader.has_merges && Field(*model, "merges") != nullptr) {
    return absl::InvalidArgumentError(
        "tokenizer.json: model.merges is not an array");
  }
  merges.reserve(reader.merges.size());
  std::string merged;
  for (size_t rank = 0; rank < reader.merges.size(); ++rank) {
    const auto& [a, b] = reader.merges[rank];
    merged.assign(a).append(b);
    uint32_t ids[3];
    const std::string* parts[3] = {&a, &b, &merged};
    for (int k = 0; k < 3; ++k) {
      const auto it = token_to_id.find(*parts[k]);
      if (it == token_to_id.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat("tokenizer.json: model.merges[", rank, "]: token \"",
                         *parts[k], "\" is not in the vocabulary"));
      }
      ids[k] = it->second;
    }
    // A repeated pair keeps its last rank, as HF and transformers.js do.
    merges.insert_or_assign(PairKey(ids[0], ids[1]),
                            Merge{static_cast<uint32_t>(rank), ids[2]});
  }
  return absl::OkStatus();
}

absl::Status Tokenizer::Rep::ParseAddedTokens(const Json& root) {
  const Json* list = Field(root, "added_tokens");
  if (list == nullptr) return absl::OkStatus();
  if (!list->is_array()) {
    return absl::InvalidArgumentError(
        "tokenizer.json: added_tokens is not an array");
  }
  for (size_t i = 0; i < list->size(); ++i) {
    const Json& t = (*list)[i];
    const std::string where = absl::StrCat("added_tokens[", i, "]");
    if (!t.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer.json: ", where, " is not an object"));
    }
    AddedToken tok;
    const Json* id = Field(t, "id");
    if (id == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer.json: ", where, ".id is missing"));
    }
    ASSIGN_OR_RETURN(tok.id, IdValue(*id, where + ".id"));
    ASSIGN_OR_RETURN(tok.content, StringField(t, "content", where));
    if (tok.content.empty() || !unicode::IsValidUtf8(tok.content)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tokenizer.json: ", where, ".content is empty or not UTF-8"));
    }
    ASSIGN_OR_RETURN(tok.special, BoolField(t, "special", false, where));
    ASSIGN_OR_RETURN(tok.lstrip, BoolField(t, "lstrip", false, where));
    ASSIGN_OR_RETURN(tok.rstrip, BoolField(t, "rstrip", false, where));
    ASSIGN_OR_RETURN(tok.single_word,
                     BoolField(t, "single_word", false, where));
    ASSIGN_OR_RETURN(tok.normalized,
                     BoolField(t, "normalized", !tok.special, where));
    token_to_id.insert_or_assign(tok.content, tok.id);
    SetId(tok.id, tok.content, tok.content,
          static_cast<uint8_t>(kValid | kAdded | (tok.special ? kSpecial : 0)));
    added.push_back(std::move(tok));
  }
  return absl::OkStatus();
}

absl::Status Tokenizer::Rep::ParseNormalizer(const Json& root) {
  const Json* norm = Field(root, "normalizer");
  if (norm == nullptr) return absl::OkStatus();
  std::vector<const Json*> steps;
  if (norm->is_object() && Field(*norm, "type") != nullptr &&
      *Field(*norm, "type") == "Sequence") {
    const Json* list = Field(*norm, "normalizers");
    if (list == nullptr || !list->is_array()) {
      return absl::InvalidArgumentError(
          "tokenizer.json: normalizer.normalizers is not an array");
    }
    for (const Json& s : *list) steps.push_back(&s);
  } else {
    steps.push_back(norm);
  }
  for (const Json* s : steps) {
    const Json* type = Field(*s, "type");
    if (type != nullptr && *type == "NFC") {
      nfc = true;
      continue;
    }
    return absl::UnimplementedError(absl::StrCat("tokenizer.json: normalizer ",
                                                 s->dump().substr(0, 200),
                                                 " (supported: null, NFC)"));
  }
  return absl::OkStatus();
}

absl::Status Tokenizer::Rep::AddPreTokenizerStep(const Json& step, bool first,
                                                 bool* byte_level) {
  const Json* type = Field(step, "type");
  if (type == nullptr || !type->is_string()) {
    return absl::InvalidArgumentError(
        "tokenizer.json: a pre_tokenizer has no type");
  }
  const std::string t = type->get<std::string>();
  if (t == "ByteLevel") {
    if (*byte_level) {
      return absl::UnimplementedError(
          "tokenizer.json: pre_tokenizer has ByteLevel twice");
    }
    *byte_level = true;
    ASSIGN_OR_RETURN(const bool prefix, BoolField(step, "add_prefix_space",
                                                  false, "pre_tokenizer"));
    if (prefix && !first) {
      return absl::UnimplementedError(
          "tokenizer.json: ByteLevel add_prefix_space after another "
          "pre-tokenizer");
    }
    add_prefix_space = prefix;
    ASSIGN_OR_RETURN(const bool use_regex,
                     BoolField(step, "use_regex", true, "pre_tokenizer"));
    if (use_regex) {
      ASSIGN_OR_RETURN(auto splitter, NewRegexSplitter(kGpt2Pattern));
      splitters.push_back(std::move(splitter));
    }
    return absl::OkStatus();
  }
  if (t == "Split") {
    ASSIGN_OR_RETURN(const bool invert,
                     BoolField(step, "invert", false, "pre_tokenizer"));
    const Json* behavior = Field(step, "behavior");
    if (invert || behavior == nullptr || *behavior != "Isolated") {
      return absl::UnimplementedError(absl::StrCat(
          "tokenizer.json: Split pre-tokenizer with behavior ",
          behavior == nullptr ? "null" : behavior->dump(),
          invert ? " and invert" : "", " (supported: Isolated, no invert)"));
    }
    const Json* pattern = Field(step, "pattern");
    const Json* regex = pattern == nullptr ? nullptr : Field(*pattern, "Regex");
    const Json* literal =
        pattern == nullptr ? nullptr : Field(*pattern, "String");
    if (regex != nullptr && regex->is_string()) {
      ASSIGN_OR_RETURN(auto splitter,
                       NewRegexSplitter(regex->get<std::string>()));
      splitters.push_back(std::move(splitter));
    } else if (literal != nullptr && literal->is_string()) {
      ASSIGN_OR_RETURN(auto splitter,
                       NewPcre2Splitter(literal->get<std::string>(), true));
      splitters.push_back(std::move(splitter));
    } else {
      return absl::InvalidArgumentError(
          "tokenizer.json: Split pre-tokenizer without a Regex or String "
          "pattern");
    }
    return absl::OkStatus();
  }
  return absl::UnimplementedError(
      absl::StrCat("tokenizer.json: pre_tokenizer type \"", t,
                   "\" (supported: ByteLevel, Split, Sequence)"));
}

absl::Status Tokenizer::Rep::ParsePreTokenizer(const Json& root) {
  const Json* pre = Field(root, "pre_tokenizer");
  bool byte_level = false;
  if (pre != nullptr) {
    const Json* type = Field(*pre, "type");
    if (type != nullptr && *type == "Sequence") {
      const Json* list = Field(*pre, "pretokenizers");
      if (list == nullptr || !list->is_array()) {
        return absl::InvalidArgumentError(
            "tokenizer.json: pre_tokenizer.pretokenizers is not an array");
      }
      for (size_t i = 0; i < list->size(); ++i) {
        RETURN_IF_ERROR(AddPreTokenizerStep((*list)[i], i == 0, &byte_level));
      }
    } else {
      RETURN_IF_ERROR(AddPreTokenizerStep(*pre, true, &byte_level));
    }
  }
  if (!byte_level) {
    return absl::UnimplementedError(
        "tokenizer.json: pre_tokenizer has no ByteLevel step (only byte-level "
        "BPE is supported)");
  }
  return absl::OkStatus();
}

absl::Status Tokenizer::Rep::ParseDecoder(const Json& root) {
  const Json* dec = Field(root, "decoder");
  if (dec == nullptr) return absl::OkStatus();
  std::vector<const Json*> steps;
  const Json* type = Field(*dec, "type");
  if (type != nullptr && *type == "Sequence") {
    const Json* list = Field(*dec, "decoders");
    if (list == nullptr || !list->is_array()) {
      return absl::InvalidArgumentError(
          "tokenizer.json: decoder.decoders is not an array");
    }
    for (const Json& s : *list) steps.push_back(&s);
  } else {
    steps.push_back(dec);
  }
  for (const Json* s : steps) {
    const Json* t = Field(*s, "type");
    if (t != nullptr &&
        (*t == "ByteLevel" || *t == "ByteFallback" || *t == "Fuse")) {
      continue;
    }
    return absl::UnimplementedError(
        absl::StrCat("tokenizer.json: decoder ", s->dump().substr(0, 200),
                     " (supported: ByteLevel, ByteFallback, Fuse)"));
  }
  return absl::OkStatus();
}

void Tokenizer::Rep::Finish() {
  for (size_t i = 0; i < added.size(); ++i) {
    if (added[i].normalized) {
      const std::string content =
          nfc ? unicode::NormalizeNfc(added[i].content) : added[i].content;
      normalized_trie.Insert(content, static_cast<int>(i));
    } else {
      raw_trie.Insert(added[i].content, static_cast<int>(i));
    }
  }
  auto find = [&](const char* s) -> std::optional<uint32_t> {
    const auto it = token_to_id.find(s);
    if (it == token_to_id.end()) return std::nullopt;
    return it->second;
  };
  im_start = find("<|im_start|>");
  im_end = find("<|im_end|>");
  endoftext = find("<|endoftext|>");
  if (im_end) eos.push_back(*im_end);
  if (endoftext) eos.push_back(*endoftext);
  std::sort(eos.begin(), eos.end());
  eos.erase(std::unique(eos.begin(), eos.end()), eos.end());
}

// ---- Encoding ------------------------------------------------------------

bool Tokenizer::Rep::IsWordChar(absl::string_view text, size_t pos,
                                bool before) const {
  // The character just before `pos` (before = true) or at `pos`.
  const auto* p = reinterpret_cast<const uint8_t*>(text.data());
  size_t i = pos;
  if (before) {
    if (pos == 0) return false;
    i = pos - 1;
    while (i > 0 && (p[i] & 0xC0) == 0x80) --i;
  } else if (pos >= text.size()) {
    return false;
  }
  int len;
  const char32_t cp = unicode::DecodeValid(p + i, &len);
  const unicode::CharClass c = unicode::Classify(cp);
  return c == unicode::CharClass::kLetter || c == unicode::CharClass::kNumber ||
         cp == '_';
}

template <typename OnText>
absl::Status Tokenizer::Rep::SplitAdded(const AddedTrie& trie,
                                        absl::string_view text,
                                        bool parse_special, OnText on_text,
                                        std::vector<uint32_t>* out) const {
  if (trie.empty()) return on_text(text);
  auto eligible = [&](int t, size_t start, size_t end) {
    const AddedToken& tok = added[t];
    if (tok.special && !parse_special) return false;
    if (tok.single_word &&
        (IsWordChar(text, start, true) || IsWordChar(text, end, false))) {
      return false;
    }
    return true;
  };
  size_t pos = 0;
  while (pos < text.size()) {
    size_t start;
    size_t end;
    int t;
    if (!trie.Find(text, pos, eligible, &start, &end, &t)) break;
    const AddedToken& tok = added[t];
    size_t text_end = start;
    if (tok.lstrip) {
      // Absorb the whitespace before the token.
      const auto* p = reinterpret_cast<const uint8_t*>(text.data());
      while (text_end > pos) {
        size_t i = text_end - 1;
        while (i > pos && (p[i] & 0xC0) == 0x80) --i;
        int len;
        const auto c = unicode::Classify(unicode::DecodeValid(p + i, &len));
        if (c != unicode::CharClass::kSpace &&
            c != unicode::CharClass::kNewline) {
          break;
        }
        text_end = i;
      }
    }
    if (text_end > pos)
      RETURN_IF_ERROR(on_text(text.substr(pos, text_end - pos)));
    out->push_back(tok.id);
    pos = end;
    if (tok.rstrip) {
      const auto* p = reinterpret_cast<const uint8_t*>(text.data());
      while (pos < text.size()) {
        int len;
        const auto c = unicode::Classify(unicode::DecodeValid(p + pos, &len));
        if (c != unicode::CharClass::kSpace &&
            c != unicode::CharClass::kNewline) {
          break;
        }
        pos += len;
      }
    }
  }
  if (pos < text.size()) return on_text(text.substr(pos));
  return absl::OkStatus();
}

absl::Status Tokenizer::Rep::EncodeAppend(absl::string_view text,
                                          bool parse_special,
                                          std::vector<uint32_t>* out) const {
  if (const size_t bad = unicode::FindInvalidUtf8(text);
      bad != absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "text is not valid UTF-8 (at byte ", bad, " of ", text.size(), ")"));
  }
  const size_t old_size = out->size();
  absl::Status status = SplitAdded(
      raw_trie, text, parse_special,
      [&](absl::string_view piece) {
        return EncodeNormalizedPiece(piece, parse_special, out);
      },
      out);
  if (!status.ok()) out->resize(old_size);
  return status;
}

absl::Status Tokenizer::Rep::EncodeNormalizedPiece(
    absl::string_view text, bool parse_special,
    std::vector<uint32_t>* out) const {
  std::string normalized;
  if (nfc && !unicode::IsNfcQuick(text)) {
    normalized = unicode::NormalizeNfc(text);
    text = normalized;
  }
  if (normalized_trie.empty()) return EncodePreTokenized(text, out);
  return SplitAdded(
      normalized_trie, text, parse_special,
      [&](absl::string_view piece) { return EncodePreTokenized(piece, out); },
      out);
}

absl::Status Tokenizer::Rep::EncodePreTokenized(
    absl::string_view text, std::vector<uint32_t>* out) const {
  if (text.empty()) return absl::OkStatus();
  std::string prefixed;
  if (add_prefix_space && text[0] != ' ') {
    prefixed = absl::StrCat(" ", text);
    text = prefixed;
  }
  if (splitters.empty()) {
    EncodeWord(text, out);
    return absl::OkStatus();
  }
  if (splitters.size() == 1) {
    return splitters[0]->Split(
        text, [&](absl::string_view word) { EncodeWord(word, out); });
  }
  std::vector<absl::string_view> pieces = {text};
  std::vector<absl::string_view> next;
  for (const auto& splitter : splitters) {
    next.clear();
    for (absl::string_view piece : pieces) {
      RETURN_IF_ERROR(splitter->Split(
          piece, [&](absl::string_view w) { next.push_back(w); }));
    }
    pieces.swap(next);
  }
  for (absl::string_view word : pieces) EncodeWord(word, out);
  return absl::OkStatus();
}

void Tokenizer::Rep::EncodeWord(absl::string_view word,
                                std::vector<uint32_t>* out) const {
  if (word.size() == 1) {
    const uint32_t id = byte_id[static_cast<uint8_t>(word[0])];
    if (id != kNoId) {
      out->push_back(id);
      return;
    }
  }
  if (ignore_merges) {
    std::string spelling;
    for (const char ch : word) {
      unicode::AppendUtf8(unicode::ByteToUnicode(static_cast<uint8_t>(ch)),
                          &spelling);
    }
    const auto it = token_to_id.find(spelling);
    if (it != token_to_id.end()) {
      out->push_back(it->second);
      return;
    }
  }
  const bool cacheable = cache.enabled() && word.size() <= kMaxCachedWordBytes;
  if (cacheable && cache.Lookup(word, out)) return;
  const size_t start = out->size();
  Bpe(word, out);
  if (cacheable) {
    cache.Insert(word,
                 absl::MakeConstSpan(out->data() + start, out->size() - start));
  }
}

void Tokenizer::Rep::AppendSymbolsForByte(
    uint8_t b, absl::InlinedVector<uint32_t, 64>* syms,
    bool* last_was_unk) const {
  const uint32_t id = byte_id[b];
  if (id != kNoId) {
    syms->push_back(id);
    *last_was_unk = false;
    return;
  }
  if (byte_fallback) {
    const auto it = token_to_id.find(ByteFallbackToken(b));
    if (it != token_to_id.end()) {
      syms->push_back(it->second);
      *last_was_unk = false;
      return;
    }
  }
  if (unk_id != kNoId) {
    if (!(fuse_unk && *last_was_unk)) syms->push_back(unk_id);
    *last_was_unk = true;
  }
  // No unk token: the character is dropped, as HF does.
}

void Tokenizer::Rep::Bpe(absl::string_view word,
                         std::vector<uint32_t>* out) const {
  absl::InlinedVector<uint32_t, 64> syms;
  bool last_was_unk = false;
  for (const char ch : word) {
    const uint32_t id = byte_id[static_cast<uint8_t>(ch)];
    if (id != kNoId) {
      syms.push_back(id);
      last_was_unk = false;
    } else {
      AppendSymbolsForByte(static_cast<uint8_t>(ch), &syms, &last_was_unk);
    }
  }
  if (syms.size() <= kSmallWordSymbols) {
    MergeSmall(&syms);
  } else {
    MergeLarge(&syms);
  }
  out->insert(out->end(), syms.begin(), syms.end());
}

// Repeatedly merges the leftmost lowest-rank pair, scanning an array of
// pair ranks: O(n^2) but fastest for the short words that dominate.
void Tokenizer::Rep::MergeSmall(absl::InlinedVector<uint32_t, 64>* syms) const {
  constexpr uint32_t kNone = std::numeric_limits<uint32_t>::max();
  size_t n = syms->size();
  if (n < 2) return;
  uint32_t* s = syms->data();
  std::array<Merge, kSmallWordSymbols> pair;
  auto lookup = [&](size_t i) {
    const Merge* m = FindMerge(s[i], s[i + 1]);
    pair[i] = m == nullptr ? Merge{kNone, 0} : *m;
  };
  for (size_t i = 0; i + 1 < n; ++i) lookup(i);
  while (n > 1) {
    size_t best = 0;
    uint32_t best_rank = kNone;
    for (size_t i = 0; i + 1 < n; ++i) {
      if (pair[i].rank < best_rank) {
        best_rank = pair[i].rank;
        best = i;
      }
    }
    if (best_rank == kNone) break;
    s[best] = pair[best].new_id;
    // Remove symbol best + 1 and pair best + 1.
    for (size_t i = best + 1; i + 1 < n; ++i) s[i] = s[i + 1];
    for (size_t i = best + 1; i + 2 < n; ++i) pair[i] = pair[i + 1];
    --n;
    if (best > 0) lookup(best - 1);
    if (best + 1 < n) lookup(best);
  }
  syms->resize(n);
}

// The same merges with a linked list and a min-heap of (rank, position):
// O(n log n) for long words (long CJK runs, whitespace, repeated symbols).
void Tokenizer::Rep::MergeLarge(absl::InlinedVector<uint32_t, 64>* syms) const {
  struct Node {
    uint32_t id;
    int32_t prev;
    int32_t next;
  };
  struct Candidate {
    uint32_t rank;
    uint32_t pos;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  const size_t n = syms->size();
  std::vector<Node> nodes(n);
  for (size_t i = 0; i < n; ++i) {
    nodes[i] = {(*syms)[i], static_cast<int32_t>(i) - 1,
                i + 1 < n ? static_cast<int32_t>(i + 1) : -1};
  }
  std::vector<Candidate> storage;
  storage.reserve(n);
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap(
      std::greater<>(), std::move(storage));
  for (size_t i = 0; i + 1 < n; ++i) {
    if (const Merge* m = FindMerge(nodes[i].id, nodes[i + 1].id)) {
      heap.push({m->rank, static_cast<uint32_t>(i)});
    }
  }
  constexpr uint32_t kDead = std::numeric_limits<uint32_t>::max();
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    Node& left = nodes[c.pos];
    if (left.id == kDead || left.next < 0) continue;
    Node& right = nodes[left.next];
    const Merge* m = FindMerge(left.id, right.id);
    if (m == nullptr || m->rank != c.rank) continue;  // stale candidate
    left.id = m->new_id;
    right.id = kDead;
    left.next = right.next;
    if (left.next >= 0) nodes[left.next].prev = static_cast<int32_t>(c.pos);
    if (left.prev >= 0) {
      if (const Merge* pm = FindMerge(nodes[left.prev].id, left.id)) {
        heap.push({pm->rank, static_cast<uint32_t>(left.prev)});
      }
    }
    if (left.next >= 0) {
      if (const Merge* nm = FindMerge(left.id, nodes[left.next].id)) {
        heap.push({nm->rank, c.pos});
      }
    }
  }
  syms->clear();
  for (int32_t i = 0; i >= 0; i = nodes[i].next) syms->push_back(nodes[i].id);
}

// ---- Tokenizer -----------------------------------------------------------

Tokenizer::Tokenizer(std::unique_ptr<Rep> rep) : rep_(std::move(rep)) {}
Tokenizer::~Tokenizer() = default;

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Load(
    const std::string& tokenizer_json_path, const TokenizerOptions& options) {
  std::FILE* f = std::fopen(tokenizer_json_path.c_str(), "rb");
  if (f == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("cannot open tokenizer file ", tokenizer_json_path));
  }
  std::string content;
  if (std::fseek(f, 0, SEEK_END) == 0) {
    const long size = std::ftell(f);
    if (size > 0) content.reserve(static_cast<size_t>(size));
    std::rewind(f);
  }
  char chunk[1 << 16];
  size_t got;
  while ((got = std::fread(chunk, 1, sizeof(chunk), f)) > 0) {
    content.append(chunk, got);
  }
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) {
    return absl::DataLossError(
        absl::StrCat("cannot read tokenizer file ", tokenizer_json_path));
  }
  auto result = FromJson(content, options);
  if (!result.ok()) {
    return base::Annotate(result.status(), tokenizer_json_path);
  }
  return result;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromJson(
    absl::string_view json, const TokenizerOptions& options) {
  TokenizerJsonReader reader;
  const bool parsed =
      Json::sax_parse(json.data(), json.data() + json.size(), &reader,
                      nlohmann::detail::input_format_t::json,
                      /*strict=*/true);
  if (!parsed || !reader.error.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer.json: ",
                     reader.error.empty() ? "not valid JSON" : reader.error));
  }
  if (!reader.root.is_object()) {
    return absl::InvalidArgumentError("tokenizer.json is not a JSON object");
  }
  const Json& root = reader.root;
  auto rep = std::make_unique<Rep>(options);
  try {
    RETURN_IF_ERROR(rep->ParseModel(reader));
    RETURN_IF_ERROR(rep->ParseAddedTokens(root));
    RETURN_IF_ERROR(rep->ParseNormalizer(root));
    RETURN_IF_ERROR(rep->ParsePreTokenizer(root));
    RETURN_IF_ERROR(rep->ParseDecoder(root));
  } catch (const nlohmann::json::exception& e) {
    // Type mismatches the checks above missed; never escape as exceptions.
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer.json: ", e.what()));
  }
  rep->Finish();
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(rep)));
}

absl::StatusOr<std::vector<uint32_t>> Tokenizer::Encode(
    absl::string_view text, bool parse_special) const {
  std::vector<uint32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  RETURN_IF_ERROR(rep_->EncodeAppend(text, parse_special, &ids));
  return ids;
}

absl::Status Tokenizer::EncodeAppend(absl::string_view text, bool parse_special,
                                     std::vector<uint32_t>* ids) const {
  return rep_->EncodeAppend(text, parse_special, ids);
}

std::string Tokenizer::Decode(absl::Span<const uint32_t> ids,
                              bool skip_special_tokens) const {
  std::string raw;
  for (const uint32_t id : ids) {
    if (id >= rep_->id_bytes.size()) continue;
    if (skip_special_tokens && (rep_->id_flags[id] & kSpecial)) continue;
    raw.append(rep_->id_bytes[id]);
  }
  if (unicode::IsValidUtf8(raw)) return raw;
  std::string out;
  out.reserve(raw.size() + 8);
  unicode::AppendUtf8Lossy(raw, /*hold_incomplete_tail=*/false, &out);
  return out;
}

absl::string_view Tokenizer::TokenBytes(uint32_t id) const {
  if (id >= rep_->id_bytes.size()) return absl::string_view();
  return rep_->id_bytes[id];
}

int Tokenizer::vocab_size() const {
  return static_cast<int>(rep_->id_to_token.size());
}

std::optional<uint32_t> Tokenizer::TokenId(absl::string_view token) const {
  const auto it = rep_->token_to_id.find(token);
  if (it == rep_->token_to_id.end()) return std::nullopt;
  return it->second;
}

std::optional<std::string> Tokenizer::TokenString(uint32_t id) const {
  if (id >= rep_->id_flags.size() || !(rep_->id_flags[id] & kValid)) {
    return std::nullopt;
  }
  return rep_->id_to_token[id];
}

bool Tokenizer::IsSpecial(uint32_t id) const {
  return id < rep_->id_flags.size() && (rep_->id_flags[id] & kSpecial);
}

bool Tokenizer::IsAddedToken(uint32_t id) const {
  return id < rep_->id_flags.size() && (rep_->id_flags[id] & kAdded);
}

std::vector<uint32_t> Tokenizer::SpecialIds() const {
  std::vector<uint32_t> ids;
  for (const AddedToken& t : rep_->added) {
    if (t.special && (rep_->id_flags[t.id] & kSpecial)) ids.push_back(t.id);
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

std::optional<uint32_t> Tokenizer::im_start_id() const {
  return rep_->im_start;
}
std::optional<uint32_t> Tokenizer::im_end_id() const { return rep_->im_end; }
std::optional<uint32_t> Tokenizer::endoftext_id() const {
  return rep_->endoftext;
}
const std::vector<uint32_t>& Tokenizer::eos_ids() const { return rep_->eos; }

// ---- StreamingDecoder ----------------------------------------------------

StreamingDecoder::StreamingDecoder(const Tokenizer& tokenizer,
                                   bool skip_special_tokens)
    : tokenizer_(tokenizer), skip_special_tokens_(skip_special_tokens) {}

std::string StreamingDecoder::Add(uint32_t id) {
  if (skip_special_tokens_ && tokenizer_.IsSpecial(id)) return std::string();
  const absl::string_view bytes = tokenizer_.TokenBytes(id);
  if (bytes.empty()) return std::string();
  pending_.append(bytes.data(), bytes.size());
  std::string out;
  const size_t used =
      unicode::AppendUtf8Lossy(pending_, /*hold_incomplete_tail=*/true, &out);
  pending_.erase(0, used);
  return out;
}

std::string StreamingDecoder::Flush() {
  std::string out;
  unicode::AppendUtf8Lossy(pending_, /*hold_incomplete_tail=*/false, &out);
  pending_.clear();
  return out;
}

}  // namespace swaserve::model
