#include "lib/model/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "lib/model/unicode.h"

namespace swaserve::model {
namespace {

using unicode::CharClass;

constexpr uint8_t kLetter = static_cast<uint8_t>(CharClass::kLetter);
constexpr uint8_t kNumber = static_cast<uint8_t>(CharClass::kNumber);
constexpr uint8_t kSpace = static_cast<uint8_t>(CharClass::kSpace);
constexpr uint8_t kNewline = static_cast<uint8_t>(CharClass::kNewline);
constexpr uint8_t kOther = static_cast<uint8_t>(CharClass::kOther);

struct Ch {
  uint8_t cls;
  uint8_t len;
  char32_t cp;
};

// Scanner for
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,D}
//   | ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
// with D = max_digits. At each position it finds what the leftmost-first
// backtracking regex would match (the pattern matches every character, so
// there are no gaps):
//   1. an apostrophe followed by s/t/m/d, re/ve/ll in any case (ſ U+017F
//      folds to s);
//   2. a letter run, optionally preceded by one character that is neither a
//      newline, a letter nor a number;
//   3. up to D numbers;
//   4. an optional U+0020 then a run of "other" characters, then newlines;
//   5. whitespace: up to and including the last newline of the run when it
//      has one; else the run if it ends the text; else the run minus its last
//      character when that leaves something (\s+(?!\S)); else the run.
class ScannerSplitter final : public Splitter {
 public:
  explicit ScannerSplitter(int max_digits) : max_digits_(max_digits) {}

  absl::Status Split(
      absl::string_view text,
      absl::FunctionRef<void(absl::string_view)> piece) const override {
    const auto* begin = reinterpret_cast<const uint8_t*>(text.data());
    const uint8_t* end = begin + text.size();
    const uint8_t* table = unicode::CharTable();
    const uint8_t* s = begin;
    while (s < end) {
      const uint8_t* e = MatchAt(s, end, table);
      piece(absl::string_view(reinterpret_cast<const char*>(s),
                              static_cast<size_t>(e - s)));
      s = e;
    }
    return absl::OkStatus();
  }

 private:
  static Ch At(const uint8_t* p, const uint8_t* table) {
    const uint8_t b = *p;
    if (b < 0x80) {
      return {static_cast<uint8_t>(table[b] & unicode::kClassMask), 1, b};
    }
    int len;
    const char32_t cp = unicode::DecodeValid(p, &len);
    const uint8_t cls =
        cp < unicode::kTableSize
            ? static_cast<uint8_t>(table[cp] & unicode::kClassMask)
            : static_cast<uint8_t>(unicode::Classify(cp));
    return {cls, static_cast<uint8_t>(len), cp};
  }

  // Length of the contraction suffix at p (after an apostrophe), or 0.
  static int ContractionLength(const uint8_t* p, const uint8_t* end) {
    const uint8_t c = *p | 0x20;  // ASCII lower case (harmless for others)
    if (c == 's' || c == 't' || c == 'm' || c == 'd') return 1;
    if (p + 1 < end) {
      const uint8_t c2 = p[1] | 0x20;
      if ((c == 'r' && c2 == 'e') || (c == 'v' && c2 == 'e') ||
          (c == 'l' && c2 == 'l')) {
        return 2;
      }
      if (p[0] == 0xC5 && p[1] == 0xBF) return 2;  // U+017F LATIN SMALL LONG S
    }
    return 0;
  }

  static const uint8_t* LetterRun(const uint8_t* q, const uint8_t* end,
                                  const uint8_t* table) {
    while (q < end) {
      const Ch d = At(q, table);
      if (d.cls != kLetter) break;
      q += d.len;
    }
    return q;
  }

  const uint8_t* MatchAt(const uint8_t* s, const uint8_t* end,
                         const uint8_t* table) const {
    const Ch c = At(s, table);
    // 1. Contractions. \p{L}, \p{N} and ASCII letters are distinct from the
    // apostrophe, so it is only tried for it.
    if (c.cp == '\'' && s + 1 < end) {
      const int n = ContractionLength(s + 1, end);
      if (n > 0) return s + 1 + n;
    }
    // 2. [^\r\n\p{L}\p{N}]?\p{L}+
    if (c.cls == kLetter) return LetterRun(s + c.len, end, table);
    const uint8_t* after = s + c.len;
    const bool has_next = after < end;
    const Ch next = has_next ? At(after, table) : Ch{kNewline, 0, 0};
    if (c.cls != kNewline && c.cls != kNumber && has_next &&
        next.cls == kLetter) {
      return LetterRun(after + next.len, end, table);
    }
    // 3. \p{N}{1,D}
    if (c.cls == kNumber) {
      const uint8_t* q = after;
      for (int k = 1; k < max_digits_ && q < end; ++k) {
        const Ch d = At(q, table);
        if (d.cls != kNumber) break;
        q += d.len;
      }
      return q;
    }
    // 4.  ?[^\s\p{L}\p{N}]+[\r\n]*
    if (c.cls == kOther || (c.cp == ' ' && has_next && next.cls == kOther)) {
      const uint8_t* q = c.cls == kOther ? after : after + next.len;
      while (q < end) {
        const Ch d = At(q, table);
        if (d.cls != kOther) break;
        q += d.len;
      }
      while (q < end && (*q == '\r' || *q == '\n')) ++q;
      return q;
    }
    // 5. Whitespace (c is \s): \s*[\r\n]+ | \s+(?!\S) | \s+
    const uint8_t* q = s;
    const uint8_t* last_newline_end = nullptr;
    const uint8_t* last_char = s;
    while (q < end) {
      const Ch d = At(q, table);
      if (d.cls != kSpace && d.cls != kNewline) break;
      if (d.cls == kNewline) last_newline_end = q + d.len;
      last_char = q;
      q += d.len;
    }
    if (last_newline_end != nullptr) return last_newline_end;
    if (q == end) return q;
    if (last_char > s) return last_char;
    return q;
  }

  const int max_digits_;
};

class Pcre2Splitter final : public Splitter {
 public:
  explicit Pcre2Splitter(pcre2_code* code) : code_(code) {}
  ~Pcre2Splitter() override { pcre2_code_free(code_); }
  Pcre2Splitter(const Pcre2Splitter&) = delete;
  Pcre2Splitter& operator=(const Pcre2Splitter&) = delete;

  absl::Status Split(
      absl::string_view text,
      absl::FunctionRef<void(absl::string_view)> piece) const override {
    std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> md(
        pcre2_match_data_create_from_pattern(code_, nullptr),
        &pcre2_match_data_free);
    if (md == nullptr) return absl::ResourceExhaustedError("pcre2: no memory");
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    const size_t n = text.size();
    size_t start = 0;
    size_t last_end = 0;
    while (start <= n) {
      int rc = pcre2_match(code_, subject, n, start, PCRE2_NO_UTF_CHECK,
                           md.get(), nullptr);
      if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
        rc = pcre2_match(code_, subject, n, start,
                         PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md.get(), nullptr);
      }
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof(msg));
        return absl::ResourceExhaustedError(
            absl::StrCat("pre-tokenizer regex failed: ",
                         reinterpret_cast<const char*>(msg)));
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
      const size_t ms = ov[0];
      const size_t me = ov[1];
      if (me > ms) {
        if (ms > last_end) piece(text.substr(last_end, ms - last_end));
        piece(text.substr(ms, me - ms));
        last_end = me;
        start = me;
      } else {
        // An empty match: step over one character.
        if (ms >= n) break;
        int len;
        unicode::DecodeValid(subject + ms, &len);
        start = ms + static_cast<size_t>(len);
      }
    }
    if (last_end < n) piece(text.substr(last_end));
    return absl::OkStatus();
  }

 private:
  pcre2_code* const code_;
};

}  // namespace

std::unique_ptr<Splitter> NewScannerSplitter(int max_digits) {
  return std::make_unique<ScannerSplitter>(max_digits < 1 ? 1 : max_digits);
}

absl::StatusOr<std::unique_ptr<Splitter>> NewPcre2Splitter(
    absl::string_view pattern, bool literal) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  uint32_t options = PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK;
  if (literal) options |= PCRE2_LITERAL;
  if (!unicode::IsValidUtf8(pattern)) {
    return absl::InvalidArgumentError("pre-tokenizer pattern is not UTF-8");
  }
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()),
                    pattern.size(), options, &error, &offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(error, msg, sizeof(msg));
    return absl::InvalidArgumentError(
        absl::StrCat("pre-tokenizer regex does not compile at offset ", offset,
                     ": ", reinterpret_cast<const char*>(msg)));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // optional; falls back
  return std::make_unique<Pcre2Splitter>(code);
}

absl::StatusOr<std::unique_ptr<Splitter>> NewRegexSplitter(
    absl::string_view pattern) {
  if (pattern == kQwenPattern) return NewScannerSplitter(1);
  if (pattern == kLlama3Pattern) return NewScannerSplitter(3);
  return NewPcre2Splitter(pattern, /*literal=*/false);
}

}  // namespace swaserve::model
