#include "lib/model/unicode.h"

#include <utf8proc.h>

#include <array>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

namespace swaserve::model::unicode {
namespace {

CharClass ClassFromUtf8proc(char32_t cp) {
  if (cp == '\r' || cp == '\n') return CharClass::kNewline;
  if ((cp >= 0x09 && cp <= 0x0D) || cp == 0x85) return CharClass::kSpace;
  if (cp > 0x10FFFF) return CharClass::kOther;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
      return CharClass::kLetter;
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_NO:
      return CharClass::kNumber;
    case UTF8PROC_CATEGORY_ZS:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
      return CharClass::kSpace;
    default:
      return CharClass::kOther;
  }
}

// Full canonical decomposition of `cp` into `buf` (capacity `cap`); returns
// the length (1 and buf[0] == cp when there is none).
int CanonicalDecomposition(char32_t cp, utf8proc_int32_t* buf, int cap) {
  int boundclass = 0;
  const utf8proc_ssize_t n =
      utf8proc_decompose_char(static_cast<utf8proc_int32_t>(cp), buf, cap,
                              UTF8PROC_DECOMPOSE, &boundclass);
  if (n < 1 || n > cap) {
    buf[0] = static_cast<utf8proc_int32_t>(cp);
    return 1;
  }
  return static_cast<int>(n);
}

// The per-code-point table of CharTable(). A character is "NFC-unsafe" when
// a string made of it and other safe characters could change under NFC:
//   - its canonical combining class is not 0 (it may be reordered or
//     composed with a preceding starter);
//   - it has a canonical decomposition that does not compose back to itself
//     (singletons such as U+212B, composition exclusions);
//   - it occurs after the first position of some canonical decomposition (it
//     may compose with a preceding character: U+09BE, Hangul V/T jamo, ...).
// Characters below U+0300 are never unsafe: no composition involves them as
// a second element, and those with decompositions are already composed.
std::vector<uint8_t> BuildCharTable() {
  std::vector<uint8_t> table(kTableSize);
  for (char32_t cp = 0; cp < kTableSize; ++cp) {
    table[cp] = static_cast<uint8_t>(ClassFromUtf8proc(cp));
  }
  std::array<utf8proc_int32_t, 32> buf;
  for (char32_t cp = 0x300; cp < kTableSize; ++cp) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    const utf8proc_property_t* prop =
        utf8proc_get_property(static_cast<utf8proc_int32_t>(cp));
    if (prop->combining_class != 0) table[cp] |= kNfcUnsafe;
    const int n = CanonicalDecomposition(cp, buf.data(), buf.size());
    if (n == 1 && buf[0] == static_cast<utf8proc_int32_t>(cp)) continue;
    for (int i = 1; i < n; ++i) {
      if (buf[i] >= 0x300 && static_cast<char32_t>(buf[i]) < kTableSize) {
        table[buf[i]] |= kNfcUnsafe;
      }
    }
    // Does the decomposition compose back to exactly `cp`?
    const utf8proc_ssize_t m = utf8proc_normalize_utf32(
        buf.data(), n,
        static_cast<utf8proc_option_t>(UTF8PROC_COMPOSE | UTF8PROC_STABLE));
    if (m != 1 || buf[0] != static_cast<utf8proc_int32_t>(cp)) {
      table[cp] |= kNfcUnsafe;
    }
  }
  return table;
}

struct ByteMaps {
  std::array<char32_t, 256> byte_to_cp{};
  std::array<int16_t, 0x144> cp_to_byte{};
};

ByteMaps BuildByteMaps() {
  ByteMaps m;
  m.cp_to_byte.fill(-1);
  int next = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7E) ||
                           (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    const char32_t cp = printable ? static_cast<char32_t>(b)
                                  : static_cast<char32_t>(0x100 + next++);
    m.byte_to_cp[b] = cp;
    m.cp_to_byte[cp] = static_cast<int16_t>(b);
  }
  return m;
}

const ByteMaps& GetByteMaps() {
  static const ByteMaps maps = BuildByteMaps();
  return maps;
}

enum class SeqKind : uint8_t { kValid, kInvalid, kIncomplete };
struct Seq {
  SeqKind kind;
  int len;  // kValid: sequence length; kInvalid/kIncomplete: subpart length
};

// Examines the sequence starting at p[0] (avail >= 1 bytes available).
inline Seq CheckSequence(const uint8_t* p, size_t avail) {
  const uint8_t b = p[0];
  if (b < 0x80) return {SeqKind::kValid, 1};
  int need;
  uint8_t lo = 0x80;
  uint8_t hi = 0xBF;
  if (b >= 0xC2 && b <= 0xDF) {
    need = 1;
  } else if (b == 0xE0) {
    need = 2;
    lo = 0xA0;
  } else if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) {
    need = 2;
  } else if (b == 0xED) {
    need = 2;
    hi = 0x9F;
  } else if (b == 0xF0) {
    need = 3;
    lo = 0x90;
  } else if (b >= 0xF1 && b <= 0xF3) {
    need = 3;
  } else if (b == 0xF4) {
    need = 3;
    hi = 0x8F;
  } else {
    return {SeqKind::kInvalid, 1};
  }
  for (int k = 1; k <= need; ++k) {
    if (static_cast<size_t>(k) >= avail) return {SeqKind::kIncomplete, k};
    const uint8_t c = p[k];
    if (c < lo || c > hi) return {SeqKind::kInvalid, k};
    lo = 0x80;
    hi = 0xBF;
  }
  return {SeqKind::kValid, need + 1};
}

// Length of the leading all-ASCII run of [p, p + n).
inline size_t AsciiPrefix(const uint8_t* p, size_t n) {
  size_t i = 0;
  while (i + 8 <= n) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    if (w & 0x8080808080808080ull) break;
    i += 8;
  }
  while (i < n && p[i] < 0x80) ++i;
  return i;
}

}  // namespace

const uint8_t* CharTable() {
  static const std::vector<uint8_t>* table =
      new std::vector<uint8_t>(BuildCharTable());
  return table->data();
}

CharClass Classify(char32_t cp) {
  if (cp < kTableSize) {
    return static_cast<CharClass>(CharTable()[cp] & kClassMask);
  }
  return ClassFromUtf8proc(cp);
}

size_t FindInvalidUtf8(absl::string_view s) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    i += AsciiPrefix(p + i, n - i);
    if (i >= n) break;
    const Seq seq = CheckSequence(p + i, n - i);
    if (seq.kind != SeqKind::kValid) return i;
    i += seq.len;
  }
  return absl::string_view::npos;
}

void AppendUtf8(char32_t cp, std::string* out) {
  char buf[4];
  int n;
  if (cp < 0x80) {
    buf[0] = static_cast<char>(cp);
    n = 1;
  } else if (cp < 0x800) {
    buf[0] = static_cast<char>(0xC0 | (cp >> 6));
    buf[1] = static_cast<char>(0x80 | (cp & 0x3F));
    n = 2;
  } else if (cp < 0x10000) {
    buf[0] = static_cast<char>(0xE0 | (cp >> 12));
    buf[1] = static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    buf[2] = static_cast<char>(0x80 | (cp & 0x3F));
    n = 3;
  } else {
    buf[0] = static_cast<char>(0xF0 | (cp >> 18));
    buf[1] = static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    buf[2] = static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    buf[3] = static_cast<char>(0x80 | (cp & 0x3F));
    n = 4;
  }
  out->append(buf, n);
}

size_t AppendUtf8Lossy(absl::string_view bytes, bool hold_incomplete_tail,
                       std::string* out) {
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  const size_t n = bytes.size();
  size_t i = 0;
  size_t run_start = 0;  // start of the pending run of valid bytes
  while (i < n) {
    i += AsciiPrefix(p + i, n - i);
    if (i >= n) break;
    const Seq seq = CheckSequence(p + i, n - i);
    if (seq.kind == SeqKind::kValid) {
      i += seq.len;
      continue;
    }
    out->append(bytes.data() + run_start, i - run_start);
    if (seq.kind == SeqKind::kIncomplete && hold_incomplete_tail) {
      return i;  // the tail [i, n) is a valid prefix of a character
    }
    AppendUtf8(kReplacementChar, out);
    i += seq.len;
    run_start = i;
  }
  out->append(bytes.data() + run_start, n - run_start);
  return n;
}

bool IsNfcQuick(absl::string_view s) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  const size_t n = s.size();
  const uint8_t* table = nullptr;
  size_t i = 0;
  while (i < n) {
    // Code points below U+0300 are NFC-safe: lead bytes up to 0xCB.
    if (p[i] < 0xCC) {
      ++i;
      continue;
    }
    int len;
    const char32_t cp = DecodeValid(p + i, &len);
    i += len;
    if (cp >= kTableSize) continue;  // nothing up there changes under NFC
    if (table == nullptr) table = CharTable();
    if (table[cp] & kNfcUnsafe) return false;
  }
  return true;
}

// Only the spans around NFC-unsafe characters go through utf8proc: a span
// starts at the safe character before an unsafe one (a starter it may compose
// with) and ends before the next safe character (which, being a starter that
// is never the second element of a composition, interacts with nothing
// before it). Safe stretches are copied verbatim.
std::string NormalizeNfc(absl::string_view s) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  const size_t n = s.size();
  const uint8_t* table = CharTable();
  auto unsafe_at = [&](size_t i, int* len) {
    if (p[i] < 0xCC) {  // below U+0300
      *len = 1;
      while (i + *len < n && (p[i + *len] & 0xC0) == 0x80) ++*len;
      return false;
    }
    const char32_t cp = DecodeValid(p + i, len);
    return cp < kTableSize && (table[cp] & kNfcUnsafe) != 0;
  };
  std::string out;
  out.reserve(n + 16);
  std::vector<utf8proc_int32_t> buf;
  size_t copied = 0;                     // s[0, copied) is in `out`
  size_t last_safe = std::string::npos;  // start of the last safe character
  size_t i = 0;
  while (i < n) {
    int len;
    if (!unsafe_at(i, &len)) {
      last_safe = i;
      i += len;
      continue;
    }
    const size_t span_start =
        (last_safe != std::string::npos && last_safe >= copied) ? last_safe : i;
    size_t span_end = i + len;
    while (span_end < n && unsafe_at(span_end, &len)) span_end += len;
    out.append(s.data() + copied, span_start - copied);
    // Decompose (canonically ordered), compose, re-encode.
    const auto options =
        static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    const auto* span =
        reinterpret_cast<const utf8proc_uint8_t*>(p + span_start);
    const auto span_len = static_cast<utf8proc_ssize_t>(span_end - span_start);
    buf.resize(static_cast<size_t>(span_len) * 4 + 4);
    utf8proc_ssize_t m =
        utf8proc_decompose(span, span_len, buf.data(),
                           static_cast<utf8proc_ssize_t>(buf.size()), options);
    if (m > static_cast<utf8proc_ssize_t>(buf.size())) {
      buf.resize(static_cast<size_t>(m));
      m = utf8proc_decompose(span, span_len, buf.data(), m, options);
    }
    if (m < 0) {  // only for invalid input, which callers exclude
      out.append(s.data() + span_start, span_end - span_start);
    } else {
      m = utf8proc_normalize_utf32(buf.data(), m, options);
      for (utf8proc_ssize_t k = 0; k < m; ++k) {
        AppendUtf8(static_cast<char32_t>(buf[k]), &out);
      }
    }
    copied = span_end;
    last_safe = std::string::npos;
    i = span_end;
  }
  out.append(s.data() + copied, n - copied);
  return out;
}

char32_t ByteToUnicode(uint8_t byte) { return GetByteMaps().byte_to_cp[byte]; }

int UnicodeToByte(char32_t cp) {
  if (cp >= 0x144) return -1;
  return GetByteMaps().cp_to_byte[cp];
}

}  // namespace swaserve::model::unicode
