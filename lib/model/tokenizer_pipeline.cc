// The HF pipeline around the BPE model of Tokenizer (tokenizer_rep.h):
// added tokens (cut out before and after normalizing), the normalizer (NFC),
// the pre-tokenizer (Split / ByteLevel splitters, prefix space) and the
// decoder check, from tokenizer.json and at encode time.
#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "lib/base/status.h"
#include "lib/model/pretokenizer.h"
#include "lib/model/tokenizer_rep.h"
#include "lib/model/unicode.h"

namespace swaserve::model {

using tokenizer_internal::AddedToken;
using tokenizer_internal::AddedTrie;
using tokenizer_internal::BoolField;
using tokenizer_internal::Field;
using tokenizer_internal::IdValue;
using tokenizer_internal::Json;
using tokenizer_internal::kAdded;
using tokenizer_internal::kSpecial;
using tokenizer_internal::kValid;
using tokenizer_internal::SequenceSteps;
using tokenizer_internal::StringField;

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
  ASSIGN_OR_RETURN(const std::vector<const Json*> steps,
                   SequenceSteps(*norm, "normalizers", "normalizer"));
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
    ASSIGN_OR_RETURN(const std::vector<const Json*> steps,
                     SequenceSteps(*pre, "pretokenizers", "pre_tokenizer"));
    for (size_t i = 0; i < steps.size(); ++i) {
      RETURN_IF_ERROR(AddPreTokenizerStep(*steps[i], i == 0, &byte_level));
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
  ASSIGN_OR_RETURN(const std::vector<const Json*> steps,
                   SequenceSteps(*dec, "decoders", "decoder"));
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
                                        const SpecialPolicy& policy,
                                        OnText on_text,
                                        std::vector<uint32_t>* out) const {
  if (trie.empty()) return on_text(text);
  auto eligible = [&](int t, size_t start, size_t end) {
    const AddedToken& tok = added[t];
    if (tok.special && !policy.Allows(text.substr(start, end - start))) {
      return false;
    }
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

bool Tokenizer::Rep::SpecialPolicy::Allows(absl::string_view token) const {
  if (!parse_special) return false;
  if (base == nullptr || literal.empty()) return true;
  return !Overlaps(token);
}

bool Tokenizer::Rep::SpecialPolicy::Overlaps(absl::string_view piece) const {
  if (base == nullptr) return false;
  const size_t b = static_cast<size_t>(piece.data() - base);
  const size_t e = b + piece.size();
  // The first range ending after b.
  auto it =
      std::upper_bound(literal.begin(), literal.end(), b,
                       [](size_t pos, const std::pair<size_t, size_t>& r) {
                         return pos < r.second;
                       });
  return it != literal.end() && it->first < e;
}

absl::Status Tokenizer::Rep::EncodeAppend(absl::string_view text,
                                          const SpecialPolicy& policy,
                                          std::vector<uint32_t>* out) const {
  if (const size_t bad = unicode::FindInvalidUtf8(text);
      bad != absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "text is not valid UTF-8 (at byte ", bad, " of ", text.size(), ")"));
  }
  const size_t old_size = out->size();
  absl::Status status = SplitAdded(
      raw_trie, text, policy,
      [&](absl::string_view piece) {
        return EncodeNormalizedPiece(piece, policy, out);
      },
      out);
  if (!status.ok()) out->resize(old_size);
  return status;
}

absl::Status Tokenizer::Rep::EncodeNormalizedPiece(
    absl::string_view text, const SpecialPolicy& policy,
    std::vector<uint32_t>* out) const {
  std::string normalized;
  SpecialPolicy piece_policy = policy;
  if (nfc && !unicode::IsNfcQuick(text)) {
    // The normalized copy's offsets do not map back to the literal ranges:
    // no special token in a piece that touches one.
    piece_policy = SpecialPolicy{.parse_special = policy.parse_special &&
                                                  !policy.Overlaps(text)};
    normalized = unicode::NormalizeNfc(text);
    text = normalized;
  }
  if (normalized_trie.empty()) return EncodePreTokenized(text, out);
  return SplitAdded(
      normalized_trie, text, piece_policy,
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

}  // namespace swaserve::model
