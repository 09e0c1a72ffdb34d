// The BPE model of Tokenizer (tokenizer_rep.h): model.vocab and
// model.merges, the byte-level symbols of a word, byte fallback and unk, the
// two merge loops and the per-thread word cache in front of them.
#include <algorithm>
#include <array>
#include <functional>
#include <limits>
#include <queue>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "lib/base/status.h"
#include "lib/model/tokenizer_rep.h"
#include "lib/model/unicode.h"

namespace swaserve::model {

using tokenizer_internal::BoolField;
using tokenizer_internal::Field;
using tokenizer_internal::Json;
using tokenizer_internal::kMaxCachedWordBytes;
using tokenizer_internal::kMaxId;
using tokenizer_internal::kNoId;
using tokenizer_internal::kSmallWordSymbols;
using tokenizer_internal::kValid;
using tokenizer_internal::Merge;
using tokenizer_internal::PairKey;
using tokenizer_internal::TokenizerJsonReader;

namespace {

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

}  // namespace

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

// ---- Encoding words ------------------------------------------------------

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

}  // namespace swaserve::model
