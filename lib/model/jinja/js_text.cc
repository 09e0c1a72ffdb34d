#include "lib/model/jinja/js_text.h"

#include <utf8proc.h>

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <system_error>

#include "lib/model/unicode.h"

namespace swaserve::model::jinja {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

bool IsAsciiWord(unsigned char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') ||
         (c >= 'A' && c <= 'Z') || c == '_';
}
bool IsDigit(char c) { return c >= '0' && c <= '9'; }

void AppendCp(char32_t cp, std::string* out) { unicode::AppendUtf8(cp, out); }

// Multi-character uppercase mappings of SpecialCasing.txt that JavaScript
// applies (the common ones); false when `cp` has none.
bool SpecialUpper(char32_t cp, std::string* out) {
  switch (cp) {
    case 0x00DF:
      *out += "SS";
      return true;
    case 0x0149:
      AppendCp(0x02BC, out);
      *out += "N";
      return true;
    case 0x01F0:
      *out += "J";
      AppendCp(0x030C, out);
      return true;
    case 0x0390:
      AppendCp(0x0399, out);
      AppendCp(0x0308, out);
      AppendCp(0x0301, out);
      return true;
    case 0x03B0:
      AppendCp(0x03A5, out);
      AppendCp(0x0308, out);
      AppendCp(0x0301, out);
      return true;
    case 0x0587:
      AppendCp(0x0535, out);
      AppendCp(0x0552, out);
      return true;
    case 0xFB00:
      *out += "FF";
      return true;
    case 0xFB01:
      *out += "FI";
      return true;
    case 0xFB02:
      *out += "FL";
      return true;
    case 0xFB03:
      *out += "FFI";
      return true;
    case 0xFB04:
      *out += "FFL";
      return true;
    case 0xFB05:
    case 0xFB06:
      *out += "ST";
      return true;
    default:
      return false;
  }
}

bool IsCased(char32_t cp) {
  const auto c = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  return c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LL ||
         c == UTF8PROC_CATEGORY_LT;
}
bool IsCaseIgnorable(char32_t cp) {
  const auto c = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  return c == UTF8PROC_CATEGORY_MN || c == UTF8PROC_CATEGORY_ME ||
         c == UTF8PROC_CATEGORY_CF || c == UTF8PROC_CATEGORY_LM ||
         c == UTF8PROC_CATEGORY_SK || cp == '\'' || cp == 0x2019;
}

// Final_Sigma: a cased letter before (skipping case-ignorables) and none
// after.
bool IsFinalSigma(absl::string_view s, size_t begin, size_t end) {
  bool before = false;
  for (size_t i = begin; i > 0;) {
    size_t j = i - 1;
    while (j > 0 && (static_cast<unsigned char>(s[j]) & 0xC0) == 0x80) --j;
    int len;
    const char32_t cp = DecodeAt(s, j, &len);
    i = j;
    if (IsCaseIgnorable(cp)) continue;
    before = IsCased(cp);
    break;
  }
  if (!before) return false;
  for (size_t i = end; i < s.size();) {
    int len;
    const char32_t cp = DecodeAt(s, i, &len);
    i += len;
    if (IsCaseIgnorable(cp)) continue;
    return !IsCased(cp);
  }
  return true;
}

// UTF-16 units of a code point.
int Units(char32_t cp, char16_t* u) {
  if (cp < 0x10000) {
    u[0] = static_cast<char16_t>(cp);
    return 1;
  }
  const char32_t v = cp - 0x10000;
  u[0] = static_cast<char16_t>(0xD800 + (v >> 10));
  u[1] = static_cast<char16_t>(0xDC00 + (v & 0x3FF));
  return 2;
}

// JavaScript's decimal-literal prefix of `s` (after the sign): digits with an
// optional fraction and exponent; the length consumed, 0 when none.
size_t DecimalPrefix(absl::string_view s) {
  size_t i = 0;
  size_t int_digits = 0;
  while (i < s.size() && IsDigit(s[i])) ++i, ++int_digits;
  size_t frac_digits = 0;
  if (i < s.size() && s[i] == '.') {
    size_t j = i + 1;
    while (j < s.size() && IsDigit(s[j])) ++j, ++frac_digits;
    if (int_digits + frac_digits > 0) i = j;
  }
  if (int_digits + frac_digits == 0) return 0;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    size_t j = i + 1;
    if (j < s.size() && (s[j] == '+' || s[j] == '-')) ++j;
    const size_t digits_at = j;
    while (j < s.size() && IsDigit(s[j])) ++j;
    if (j > digits_at) i = j;
  }
  return i;
}

double ParseDouble(absl::string_view s) {
  const std::string copy(s);
  return std::strtod(copy.c_str(), nullptr);
}

// Sign, then Infinity or a decimal literal; `*used` gets the length.
double SignedDecimal(absl::string_view s, size_t* used) {
  size_t i = 0;
  double sign = 1;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) {
    if (s[i] == '-') sign = -1;
    ++i;
  }
  const absl::string_view rest = s.substr(i);
  if (rest.substr(0, 8) == "Infinity") {
    *used = i + 8;
    return sign * std::numeric_limits<double>::infinity();
  }
  const size_t n = DecimalPrefix(rest);
  if (n == 0) {
    *used = 0;
    return kNaN;
  }
  *used = i + n;
  return sign * ParseDouble(rest.substr(0, n));
}

}  // namespace

bool IsJsWhitespace(char32_t cp) {
  if (cp >= 0x09 && cp <= 0x0D) return true;
  switch (cp) {
    case 0x20:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
    case 0xFEFF:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

char32_t DecodeAt(absl::string_view s, size_t i, int* len) {
  return unicode::DecodeValid(reinterpret_cast<const uint8_t*>(s.data()) + i,
                              len);
}

std::pair<size_t, size_t> JsTrimRange(absl::string_view s, bool start,
                                      bool end) {
  size_t b = 0;
  size_t e = s.size();
  if (start) {
    while (b < e) {
      int len;
      if (!IsJsWhitespace(DecodeAt(s, b, &len))) break;
      b += len;
    }
  }
  if (end) {
    while (e > b) {
      size_t j = e - 1;
      while (j > b && (static_cast<unsigned char>(s[j]) & 0xC0) == 0x80) --j;
      int len;
      if (!IsJsWhitespace(DecodeAt(s, j, &len))) break;
      e = j;
    }
  }
  return {b, e};
}

size_t Utf16Length(absl::string_view s) {
  size_t n = 0;
  for (unsigned char c : s) {
    if ((c & 0xC0) != 0x80) n += c >= 0xF0 ? 2 : 1;
  }
  return n;
}

bool Utf16At(absl::string_view s, int64_t index, size_t* begin, size_t* end,
             bool* lone) {
  const int64_t length = static_cast<int64_t>(Utf16Length(s));
  if (index < 0) index += length;
  if (index < 0 || index >= length) return false;
  int64_t unit = 0;
  for (size_t i = 0; i < s.size();) {
    int len;
    const char32_t cp = DecodeAt(s, i, &len);
    const int units = cp >= 0x10000 ? 2 : 1;
    if (index < unit + units) {
      *begin = i;
      *end = i + len;
      *lone = units == 2;
      return true;
    }
    unit += units;
    i += len;
  }
  return false;
}

std::string JsToUpper(absl::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    int len;
    const char32_t cp = DecodeAt(s, i, &len);
    i += len;
    if (cp < 0x80) {
      out.push_back(cp >= 'a' && cp <= 'z' ? static_cast<char>(cp - 32)
                                           : static_cast<char>(cp));
    } else if (!SpecialUpper(cp, &out)) {
      AppendCp(static_cast<char32_t>(
                   utf8proc_toupper(static_cast<utf8proc_int32_t>(cp))),
               &out);
    }
  }
  return out;
}

std::string JsToLower(absl::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    int len;
    const char32_t cp = DecodeAt(s, i, &len);
    const size_t at = i;
    i += len;
    if (cp < 0x80) {
      out.push_back(cp >= 'A' && cp <= 'Z' ? static_cast<char>(cp + 32)
                                           : static_cast<char>(cp));
    } else if (cp == 0x0130) {
      out += "i";
      AppendCp(0x0307, &out);
    } else if (cp == 0x03A3) {
      AppendCp(IsFinalSigma(s, at, i) ? 0x03C2 : 0x03C3, &out);
    } else {
      AppendCp(static_cast<char32_t>(
                   utf8proc_tolower(static_cast<utf8proc_int32_t>(cp))),
               &out);
    }
  }
  return out;
}

std::string JsCapitalize(absl::string_view s) {
  if (s.empty()) return std::string();
  int len;
  const char32_t cp = DecodeAt(s, 0, &len);
  if (cp >= 0x10000) return std::string(s);
  return JsToUpper(s.substr(0, len)) + std::string(s.substr(len));
}

std::string JsTitle(absl::string_view s) {
  std::string out(s);
  for (size_t i = 0; i < out.size(); ++i) {
    const auto c = static_cast<unsigned char>(out[i]);
    if (!IsAsciiWord(c)) continue;
    if (i > 0 && IsAsciiWord(static_cast<unsigned char>(out[i - 1]))) continue;
    if (c >= 'a' && c <= 'z') out[i] = static_cast<char>(c - 32);
  }
  return out;
}

int CompareUtf16(absl::string_view a, absl::string_view b) {
  size_t i = 0;
  size_t j = 0;
  char16_t ua[2];
  char16_t ub[2];
  int na = 0;
  int nb = 0;
  int ka = 0;
  int kb = 0;
  while (true) {
    if (ka == na) {
      if (i >= a.size()) {
        na = 0;
      } else {
        int len;
        na = Units(DecodeAt(a, i, &len), ua);
        i += len;
      }
      ka = 0;
    }
    if (kb == nb) {
      if (j >= b.size()) {
        nb = 0;
      } else {
        int len;
        nb = Units(DecodeAt(b, j, &len), ub);
        j += len;
      }
      kb = 0;
    }
    if (na == 0 || nb == 0) return na == nb ? 0 : (na == 0 ? -1 : 1);
    if (ua[ka] != ub[kb]) return ua[ka] < ub[kb] ? -1 : 1;
    ++ka;
    ++kb;
  }
}

std::string JsNumberToString(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  if (v == 0) return "0";
  char buf[64];
  const auto r =
      std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  std::string sign;
  if (sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  const size_t e_at = sci.find('e');
  std::string digits = sci.substr(0, e_at);
  if (digits.size() > 1) digits.erase(1, 1);  // the '.'
  const int exp = std::atoi(sci.c_str() + e_at + 1);
  const int k = static_cast<int>(digits.size());
  const int n = exp + 1;
  std::string out = sign;
  if (k <= n && n <= 21) {
    out += digits + std::string(n - k, '0');
  } else if (0 < n && n <= 21) {
    out += digits.substr(0, n) + "." + digits.substr(n);
  } else if (-6 < n && n <= 0) {
    out += "0." + std::string(-n, '0') + digits;
  } else {
    out += digits.substr(0, 1);
    if (k > 1) out += "." + digits.substr(1);
    out += n - 1 < 0 ? "e-" : "e+";
    out += std::to_string(std::abs(n - 1));
  }
  return out;
}

std::string JsNumberToJson(double v) {
  if (!std::isfinite(v)) return "null";
  return JsNumberToString(v);
}

std::string JsFloatToString(double v) {
  if (v == 0 && std::signbit(v)) return "-0.0";
  if (std::isfinite(v) && std::fmod(v, 1.0) == 0 && std::fabs(v) < 1e21) {
    char buf[400];
    std::snprintf(buf, sizeof(buf), "%.1f", v);
    return buf;
  }
  return JsNumberToString(v);
}

double JsParseInt(absl::string_view s) {
  const auto [b, e] = JsTrimRange(s, true, false);
  s = s.substr(b);
  size_t i = 0;
  bool negative = false;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) {
    negative = s[i] == '-';
    ++i;
  }
  const size_t start = i;
  while (i < s.size() && IsDigit(s[i])) ++i;
  if (i == start) return kNaN;
  const double v = ParseDouble(s.substr(start, i - start));
  return negative ? -v : v;
}

double JsParseFloat(absl::string_view s) {
  const auto [b, e] = JsTrimRange(s, true, false);
  size_t used;
  return SignedDecimal(s.substr(b), &used);
}

double JsStringToNumber(absl::string_view s) {
  const auto [b, e] = JsTrimRange(s, true, true);
  s = s.substr(b, e - b);
  if (s.empty()) return 0;
  if (s.size() > 2 && s[0] == '0') {
    int base = 0;
    const char p = s[1];
    if (p == 'x' || p == 'X') base = 16;
    if (p == 'o' || p == 'O') base = 8;
    if (p == 'b' || p == 'B') base = 2;
    if (base != 0) {
      double v = 0;
      for (size_t i = 2; i < s.size(); ++i) {
        const char c = s[i];
        int d = -1;
        if (IsDigit(c)) d = c - '0';
        if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
        if (d < 0 || d >= base) return kNaN;
        v = v * base + d;
      }
      return v;
    }
  }
  size_t used;
  const double v = SignedDecimal(s, &used);
  return used == s.size() ? v : kNaN;
}

void AppendJsonString(absl::string_view s, bool ensure_ascii,
                      std::string* out) {
  static constexpr char kHex[] = "0123456789abcdef";
  auto unit = [&](unsigned u) {
    *out += "\\u";
    for (int shift = 12; shift >= 0; shift -= 4) {
      out->push_back(kHex[(u >> shift) & 0xF]);
    }
  };
  out->push_back('"');
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      switch (c) {
        case '"':
          *out += "\\\"";
          break;
        case '\\':
          *out += "\\\\";
          break;
        case '\b':
          *out += "\\b";
          break;
        case '\f':
          *out += "\\f";
          break;
        case '\n':
          *out += "\\n";
          break;
        case '\r':
          *out += "\\r";
          break;
        case '\t':
          *out += "\\t";
          break;
        default:
          if (c < 0x20 || (ensure_ascii && c == 0x7F)) {
            unit(c);
          } else {
            out->push_back(static_cast<char>(c));
          }
      }
      continue;
    }
    int len;
    const char32_t cp = DecodeAt(s, i, &len);
    if (ensure_ascii) {
      char16_t u[2];
      const int n = Units(cp, u);
      for (int k = 0; k < n; ++k) unit(u[k]);
    } else {
      out->append(s.data() + i, len);
    }
    i += len;
  }
  out->push_back('"');
}

}  // namespace swaserve::model::jinja
