// Helpers the grammar tests share: a byte vocabulary (id b = byte b, id 256 =
// EOS) and a whole-string check through a matcher.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "lib/grammar/json_schema.h"
#include "lib/grammar/matcher.h"
#include "lib/grammar/token_vocabulary.h"

namespace swaserve::grammar::testing {

inline constexpr uint32_t kByteEos = 256;

// Ids 0..255 are the single bytes, 256 is EOS, and `extra` follow from 257.
inline std::shared_ptr<const TokenVocabulary> ByteVocabulary(
    const std::vector<std::string>& extra = {}) {
  std::vector<std::string> bytes;
  for (int b = 0; b < 256; ++b) bytes.push_back(std::string(1, static_cast<char>(b)));
  bytes.push_back("");
  for (const std::string& e : extra) bytes.push_back(e);
  return *TokenVocabulary::FromBytes(std::move(bytes), {kByteEos});
}

// Whether `text` is a whole string of the grammar (byte by byte, then EOS).
inline bool Matches(const std::shared_ptr<const CompiledGrammar>& g, absl::string_view text) {
  GrammarMatcher m(g);
  for (char c : text) {
    if (!m.AcceptToken(static_cast<uint8_t>(c))) return false;
  }
  return m.AcceptToken(kByteEos);
}

inline bool MaskHas(const std::vector<uint32_t>& mask, uint32_t id) {
  return (mask[id / 32] >> (id % 32)) & 1;
}

}  // namespace swaserve::grammar::testing
