// Fuzzes the grammar engine (lib/grammar): the JSON Schema compiler, the
// pattern compiler and the automaton. The input is "<schema>\n--\n<text>":
// the first byte picks whether <schema> is a whole schema or only a string
// pattern ({"type": "string", "pattern": <schema>}); when it compiles,
// <text> is walked token by token over a small vocabulary of single bytes
// and some multi-byte pieces, with a rollback now and then. Checked: no
// crash or sanitizer report; a failed compile is InvalidArgument; the mask
// agrees with IsTokenAllowed; an unterminated matcher's mask is never empty
// (no dead ends); EOS is allowed exactly when accepting.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "lib/grammar/json_schema.h"
#include "lib/grammar/matcher.h"
#include "lib/grammar/token_vocabulary.h"
#include "nlohmann/json.hpp"

namespace {

using namespace swaserve::grammar;

void Check(bool ok) {
  if (!ok) std::abort();
}

std::shared_ptr<const TokenVocabulary> Vocab() {
  static const auto* v = [] {
    std::vector<std::string> bytes;
    for (int b = 0; b < 256; ++b) bytes.push_back(std::string(1, static_cast<char>(b)));
    bytes.push_back("");  // 256: EOS
    for (const char* t : {"\":", "{\"", "\"}", "[]", "true", "null", "12", ", ", "é", "\\u00"}) {
      bytes.push_back(t);
    }
    return new std::shared_ptr<const TokenVocabulary>(*TokenVocabulary::FromBytes(bytes, {256}));
  }();
  return *v;
}

bool Has(const std::vector<uint32_t>& mask, uint32_t id) { return (mask[id / 32] >> (id % 32)) & 1; }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const bool pattern_only = data[0] & 1;
  std::string input(reinterpret_cast<const char*>(data + 1), size - 1);
  const size_t cut = input.find("\n--\n");
  std::string schema = input.substr(0, cut);
  const std::string text = cut == std::string::npos ? "" : input.substr(cut + 4);
  if (pattern_only) {
    schema = nlohmann::json({{"type", "string"}, {"pattern", schema}})
                 .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  JsonGrammarOptions options;
  options.max_repetition = 64;
  options.max_whitespace = 2;
  options.compile.max_nfa_states = 20000;
  options.compile.max_stack_depth = 64;
  options.compile.max_configurations = 512;
  auto g = CompileJsonSchema(schema, Vocab(), options);
  if (!g.ok()) {
    Check(g.status().code() == absl::StatusCode::kInvalidArgument);
    return 0;
  }
  GrammarMatcher m(*g);
  const std::shared_ptr<const TokenVocabulary> vocab = Vocab();
  const TokenVocabulary& v = *vocab;
  std::vector<uint32_t> mask(v.BitmaskWords());
  for (size_t i = 0; i < text.size() && i < 256; ++i) {
    m.FillNextTokenMask(mask.data());
    bool any = false;
    for (uint32_t w : mask) any |= w != 0;
    Check(any || m.IsTerminated());
    Check(Has(mask, 256) == m.IsAccepting());
    const uint8_t c = static_cast<uint8_t>(text[i]);
    const uint32_t id = c >= 0xF6 ? 257 + (c - 0xF6) : c;  // the top bytes pick pieces
    Check(Has(mask, id) == m.IsTokenAllowed(id));
    if (!m.AcceptToken(id)) {
      // A token the mask forbids: take an allowed one instead when there is.
      for (uint32_t other = 0; other < static_cast<uint32_t>(v.size()); ++other) {
        if (other != 256 && Has(mask, other)) {
          Check(m.AcceptToken(other));
          break;
        }
      }
    }
    if (i % 11 == 10) m.Rollback(2);
  }
  if (m.IsAccepting()) Check(m.AcceptToken(256));
  return 0;
}
