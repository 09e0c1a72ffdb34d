// Tokenizer's public methods. The pieces behind them (tokenizer_rep.h):
// tokenizer_json.cc reads tokenizer.json, tokenizer_pipeline.cc the added
// tokens / normalizer / pre-tokenizer / decoder, tokenizer_bpe.cc the BPE
// model; streaming_decoder.cc holds StreamingDecoder.
#include "lib/model/tokenizer.h"

#include <algorithm>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "lib/base/status.h"
#include "lib/model/tokenizer_json.h"
#include "lib/model/tokenizer_rep.h"
#include "lib/model/unicode.h"
#include "nlohmann/json.hpp"

namespace swaserve::model {

using tokenizer_internal::AddedToken;
using tokenizer_internal::Json;
using tokenizer_internal::kAdded;
using tokenizer_internal::kSpecial;
using tokenizer_internal::kValid;
using tokenizer_internal::ParseTokenizerJson;
using tokenizer_internal::TokenizerJsonReader;

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
  RETURN_IF_ERROR(ParseTokenizerJson(json, &reader));
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
  RETURN_IF_ERROR(
      rep_->EncodeAppend(text, {.parse_special = parse_special}, &ids));
  return ids;
}

absl::Status Tokenizer::EncodeAppend(absl::string_view text, bool parse_special,
                                     std::vector<uint32_t>* ids) const {
  return rep_->EncodeAppend(text, {.parse_special = parse_special}, ids);
}

absl::Status Tokenizer::EncodeAppendWithLiterals(
    absl::string_view text, absl::Span<const std::pair<size_t, size_t>> literal,
    std::vector<uint32_t>* ids) const {
  for (size_t i = 0; i < literal.size(); ++i) {
    if (literal[i].first >= literal[i].second ||
        literal[i].second > text.size() ||
        (i > 0 && literal[i].first < literal[i - 1].second)) {
      return absl::InvalidArgumentError(
          "EncodeAppendWithLiterals: the ranges must be sorted, disjoint, "
          "non-empty and inside the text");
    }
  }
  return rep_->EncodeAppend(
      text, {.parse_special = true, .base = text.data(), .literal = literal},
      ids);
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

}  // namespace swaserve::model
