// Unicode helpers for the tokenizer (internal to swaserve::model_text): strict
// UTF-8 validation and decoding, lossy UTF-8 repair for decoded token bytes,
// the character classes the pre-tokenizer regexes use (\p{L}, \p{N}, \s),
// NFC normalization, and GPT-2's byte <-> unicode map used by byte-level BPE.
//
// Character data comes from utf8proc (Unicode 15 in Debian 12). The classes
// follow Oniguruma, the regex engine of Hugging Face `tokenizers`:
//   letter  = general category L* (Lu Ll Lt Lm Lo)
//   number  = general category N* (Nd Nl No)
//   space   = U+0009..U+000D, U+0085 and categories Zs Zl Zp (= the Unicode
//             White_Space property)
// (JavaScript's \s differs on two characters: it also matches U+FEFF and does
// not match U+0085.)
//
// All functions are thread-safe. The first call to a classifying or
// normalizing function builds read-only tables (about 200 KB, a few ms).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace swaserve::model::unicode {

inline constexpr char32_t kReplacementChar = 0xFFFD;

// Class of a code point as the pre-tokenizer regexes see it. \r and \n are
// spaces with a class of their own because the Qwen pattern treats them apart.
enum class CharClass : uint8_t {
  kLetter = 0,   // \p{L}
  kNumber = 1,   // \p{N}
  kSpace = 2,    // \s other than \r and \n
  kNewline = 3,  // \r or \n
  kOther = 4,    // anything else: punctuation, symbols, marks, controls, ...
};

// Returns the class of `cp` (any value; out-of-range values are kOther).
CharClass Classify(char32_t cp);

// Per-code-point table for cp < kTableSize: bits 0..2 hold the CharClass,
// bit 3 (kNfcUnsafe) marks characters that may change under NFC (see
// IsNfcQuick). For hot loops that classify many characters.
inline constexpr char32_t kTableSize = 0x30000;
inline constexpr uint8_t kClassMask = 0x07;
inline constexpr uint8_t kNfcUnsafe = 0x08;
const uint8_t* CharTable();

// Byte offset of the first byte of `s` that does not belong to a well-formed
// UTF-8 sequence (overlong forms, surrogates and values above U+10FFFF are
// ill-formed), or absl::string_view::npos when all of `s` is valid.
size_t FindInvalidUtf8(absl::string_view s);
inline bool IsValidUtf8(absl::string_view s) {
  return FindInvalidUtf8(s) == absl::string_view::npos;
}

// Decodes the code point at `p`, which must start a well-formed sequence that
// ends before `end`; stores its byte length in `*len`.
inline char32_t DecodeValid(const uint8_t* p, int* len) {
  const uint8_t b = p[0];
  if (b < 0x80) {
    *len = 1;
    return b;
  }
  if (b < 0xE0) {
    *len = 2;
    return (char32_t{b & 0x1Fu} << 6) | (p[1] & 0x3Fu);
  }
  if (b < 0xF0) {
    *len = 3;
    return (char32_t{b & 0x0Fu} << 12) | (char32_t{p[1] & 0x3Fu} << 6) |
           (p[2] & 0x3Fu);
  }
  *len = 4;
  return (char32_t{b & 0x07u} << 18) | (char32_t{p[1] & 0x3Fu} << 12) |
         (char32_t{p[2] & 0x3Fu} << 6) | (p[3] & 0x3Fu);
}

// Appends the UTF-8 encoding of `cp` (must be a valid scalar value).
void AppendUtf8(char32_t cp, std::string* out);

// Appends `bytes` to `out`, replacing each maximal ill-formed subsequence by
// U+FFFD (the Unicode "maximal subpart" practice, as in WHATWG and Rust's
// from_utf8_lossy). When `hold_incomplete_tail` is true, a trailing sequence
// that is a valid but incomplete prefix of a character is not written.
// Returns the number of bytes of `bytes` consumed (all of them unless a tail
// was held back; at most 3 bytes are ever held).
size_t AppendUtf8Lossy(absl::string_view bytes, bool hold_incomplete_tail,
                       std::string* out);

// True when `s` (valid UTF-8) is certainly in NFC: a fast scan with a
// conservative per-character table (false means "normalize to find out").
bool IsNfcQuick(absl::string_view s);

// Returns the NFC form of `s`, which must be valid UTF-8.
std::string NormalizeNfc(absl::string_view s);

// GPT-2's bytes_to_unicode(): the printable bytes '!'..'~', U+00A1..U+00AC
// and U+00AE..U+00FF map to themselves; the other 68 bytes map, in order, to
// U+0100..U+0143. (So a space becomes U+0120 'Ġ'.)
char32_t ByteToUnicode(uint8_t byte);
// The inverse: the byte for `cp`, or -1 when `cp` is not in the map.
int UnicodeToByte(char32_t cp);

}  // namespace swaserve::model::unicode
