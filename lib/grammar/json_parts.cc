#include "lib/grammar/json_parts.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_format.h"

namespace swaserve::grammar {
namespace {

constexpr uint32_t kMaxCodePoint = 0x10FFFF;

int Utf8Length(uint32_t c) { return c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4; }

void Encode(uint32_t c, uint8_t* out) {
  switch (Utf8Length(c)) {
    case 1: out[0] = static_cast<uint8_t>(c); break;
    case 2:
      out[0] = static_cast<uint8_t>(0xC0 | (c >> 6));
      out[1] = static_cast<uint8_t>(0x80 | (c & 0x3F));
      break;
    case 3:
      out[0] = static_cast<uint8_t>(0xE0 | (c >> 12));
      out[1] = static_cast<uint8_t>(0x80 | ((c >> 6) & 0x3F));
      out[2] = static_cast<uint8_t>(0x80 | (c & 0x3F));
      break;
    default:
      out[0] = static_cast<uint8_t>(0xF0 | (c >> 18));
      out[1] = static_cast<uint8_t>(0x80 | ((c >> 12) & 0x3F));
      out[2] = static_cast<uint8_t>(0x80 | ((c >> 6) & 0x3F));
      out[3] = static_cast<uint8_t>(0x80 | (c & 0x3F));
  }
}

// The byte-range sequences encoding [lo, hi] (no surrogates inside): each
// sequence is one range per byte position.
void Utf8Sequences(uint32_t lo, uint32_t hi, std::vector<std::vector<std::pair<uint8_t, uint8_t>>>* out) {
  if (lo > hi) return;
  for (uint32_t boundary : {0x7Fu, 0x7FFu, 0xFFFFu}) {
    if (lo <= boundary && boundary < hi) {
      Utf8Sequences(lo, boundary, out);
      Utf8Sequences(boundary + 1, hi, out);
      return;
    }
  }
  const int n = Utf8Length(lo);
  for (int i = 1; i < n; ++i) {
    const uint32_t m = (uint32_t{1} << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        Utf8Sequences(lo, lo | m, out);
        Utf8Sequences((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        Utf8Sequences(lo, (hi & ~m) - 1, out);
        Utf8Sequences(hi & ~m, hi, out);
        return;
      }
    }
  }
  uint8_t a[4], b[4];
  Encode(lo, a);
  Encode(hi, b);
  std::vector<std::pair<uint8_t, uint8_t>> seq;
  for (int i = 0; i < n; ++i) seq.emplace_back(a[i], b[i]);
  out->push_back(std::move(seq));
}

}  // namespace

CodePointSet Normalize(CodePointSet set) {
  CodePointSet split;
  for (auto [lo, hi] : set) {
    hi = std::min(hi, kMaxCodePoint);
    if (lo > hi) continue;
    if (lo < 0xD800 && hi >= 0xD800) {
      split.emplace_back(lo, 0xD7FF);
      lo = 0xD800;
    }
    if (lo <= 0xDFFF && hi >= 0xD800) {
      if (hi <= 0xDFFF) continue;
      lo = 0xE000;
    }
    split.emplace_back(lo, hi);
  }
  std::sort(split.begin(), split.end());
  CodePointSet merged;
  for (const auto& r : split) {
    if (!merged.empty() && r.first <= merged.back().second + 1) {
      merged.back().second = std::max(merged.back().second, r.second);
    } else {
      merged.push_back(r);
    }
  }
  return merged;
}

CodePointSet Complement(const CodePointSet& set) {
  CodePointSet n = Normalize(set), out;
  uint32_t next = 0;
  for (const auto& [lo, hi] : n) {
    if (lo > next) out.emplace_back(next, lo - 1);
    next = hi + 1;
  }
  if (next <= kMaxCodePoint) out.emplace_back(next, kMaxCodePoint);
  return Normalize(out);
}

CodePointSet JsonParts::PlainRanges() const {
  if (options_.escape_angle_bracket) {
    return {{0x20, 0x21}, {0x23, 0x3B}, {0x3D, 0x5B}, {0x5D, kMaxCodePoint}};
  }
  return {{0x20, 0x21}, {0x23, 0x5B}, {0x5D, kMaxCodePoint}};
}

ExprId JsonParts::Ws() {
  ByteSet ws;
  for (char c : {' ', '\t', '\n', '\r'}) ws.Add(static_cast<uint8_t>(c));
  if (options_.max_whitespace <= 0) return g_->Empty();
  return g_->Repeat(g_->Bytes(ws), 0, options_.max_whitespace);
}

ExprId JsonParts::Utf8(const CodePointSet& set) {
  std::vector<std::vector<std::pair<uint8_t, uint8_t>>> seqs;
  for (const auto& [lo, hi] : Normalize(set)) Utf8Sequences(lo, hi, &seqs);
  // One-byte ranges merge into one byte set.
  ByteSet ascii;
  std::vector<ExprId> alts;
  for (const auto& seq : seqs) {
    if (seq.size() == 1) {
      ascii.AddRange(seq[0].first, seq[0].second);
      continue;
    }
    std::vector<ExprId> parts;
    for (const auto& [a, b] : seq) parts.push_back(g_->Bytes(ByteSet::Range(a, b)));
    alts.push_back(g_->Seq(std::move(parts)));
  }
  if (!ascii.Empty()) alts.insert(alts.begin(), g_->Bytes(ascii));
  if (alts.empty()) return g_->Bytes(ByteSet{});  // matches nothing
  return g_->Alt(std::move(alts));
}

ExprId JsonParts::JsonChars(const CodePointSet& set) {
  const CodePointSet n = Normalize(set);
  CodePointSet plain;
  std::vector<ExprId> alts;
  for (auto [lo, hi] : n) {
    for (uint32_t c = lo; c <= std::min<uint32_t>(hi, 0x5C); ++c) {
      // Control characters, " and \ (and < when asked) are written as escapes.
      if (c >= 0x20 && c != '"' && c != '\\' && !(c == '<' && options_.escape_angle_bracket)) {
        continue;
      }
      std::string esc;
      switch (c) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\n': esc = "\\n"; break;
        case '\t': esc = "\\t"; break;
        case '\r': esc = "\\r"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        default: esc = absl::StrFormat("\\u%04X", c);
      }
      alts.push_back(g_->Literal(esc));
    }
    plain.emplace_back(lo, hi);
  }
  CodePointSet cut;
  for (auto [lo, hi] : plain) {
    // Remove 0..0x1F, " and \ (and < when asked) from the plain part.
    for (auto [a, b] : PlainRanges()) {
      const uint32_t l = std::max(lo, a), h = std::min(hi, b);
      if (l <= h) cut.emplace_back(l, h);
    }
  }
  if (!cut.empty()) alts.insert(alts.begin(), Utf8(cut));
  if (alts.empty()) return g_->Bytes(ByteSet{});
  return g_->Alt(std::move(alts));
}

ExprId JsonParts::StringChar() {
  if (string_char_ >= 0) return string_char_;
  ByteSet simple;
  for (char c : {'"', '\\', '/', 'b', 'f', 'n', 'r', 't'}) simple.Add(static_cast<uint8_t>(c));
  ByteSet hex = ByteSet::Range('0', '9');
  hex.AddRange('a', 'f');
  hex.AddRange('A', 'F');
  ByteSet hex_not_d = ByteSet::Range('0', '9');
  hex_not_d.AddRange('a', 'c');
  hex_not_d.AddRange('A', 'C');
  hex_not_d.AddRange('e', 'f');
  hex_not_d.AddRange('E', 'F');
  ByteSet d;
  d.Add('d');
  d.Add('D');
  // \uXXXX without surrogates: first digit not d, or d then 0-7.
  const ExprId u = g_->Seq(
      {g_->Literal("u"),
       g_->Alt({g_->Seq({g_->Bytes(hex_not_d), g_->Bytes(hex)}),
                g_->Seq({g_->Bytes(d), g_->Bytes(ByteSet::Range('0', '7'))})}),
       g_->Bytes(hex), g_->Bytes(hex)});
  const ExprId escape = g_->Seq({g_->Literal("\\"), g_->Alt({g_->Bytes(simple), u})});
  const ExprId plain = Utf8(PlainRanges());
  string_char_ = g_->Alt({plain, escape});
  return string_char_;
}

ExprId JsonParts::String(int min, int max) {
  if (min == 0 && max == Grammar::kUnbounded) {
    if (plain_string_ < 0) {
      plain_string_ = g_->Seq({g_->Literal("\""), g_->Star(StringChar()), g_->Literal("\"")});
    }
    return plain_string_;
  }
  return g_->Seq({g_->Literal("\""), g_->Repeat(StringChar(), min, max), g_->Literal("\"")});
}

ExprId JsonParts::Integer() {
  const ExprId digits = g_->Bytes(ByteSet::Range('0', '9'));
  return g_->Seq({g_->Optional(g_->Literal("-")),
                  g_->Alt({g_->Literal("0"), g_->Seq({g_->Bytes(ByteSet::Range('1', '9')),
                                                      g_->Repeat(digits, 0, 15)})})});
}

namespace {
constexpr int64_t kMaxMagnitude = 9999999999999999;  // 16 digits, as Integer()
}  // namespace

ExprId JsonParts::DigitsRange(const std::string& lo, const std::string& hi) {
  const size_t n = lo.size();
  if (n == 0) return g_->Empty();
  const uint8_t a = static_cast<uint8_t>(lo[0]), b = static_cast<uint8_t>(hi[0]);
  if (n == 1) return g_->Bytes(ByteSet::Range(a, b));
  if (lo == std::string(n, '0') && hi == std::string(n, '9')) {
    // Every n-digit string (keeps the recursion linear in n).
    return g_->Repeat(g_->Bytes(ByteSet::Range('0', '9')), static_cast<int>(n), static_cast<int>(n));
  }
  const std::string rest_lo = lo.substr(1), rest_hi = hi.substr(1);
  if (a == b) return g_->Seq({g_->Bytes(ByteSet::Of(a)), DigitsRange(rest_lo, rest_hi)});
  const ExprId digit = g_->Bytes(ByteSet::Range('0', '9'));
  std::vector<ExprId> alts = {
      g_->Seq({g_->Bytes(ByteSet::Of(a)), DigitsRange(rest_lo, std::string(n - 1, '9'))})};
  if (b > a + 1) {
    alts.push_back(g_->Seq({g_->Bytes(ByteSet::Range(a + 1, b - 1)),
                            g_->Repeat(digit, static_cast<int>(n - 1), static_cast<int>(n - 1))}));
  }
  alts.push_back(g_->Seq({g_->Bytes(ByteSet::Of(b)), DigitsRange(std::string(n - 1, '0'), rest_hi)}));
  return g_->Alt(std::move(alts));
}

ExprId JsonParts::MagnitudeRange(int64_t lo, int64_t hi) {
  std::vector<ExprId> alts;
  // One alternative per digit count: [max(lo, 10^(k-1)), min(hi, 10^k - 1)].
  int64_t low_k = 0;  // smallest value with k digits (0 for k = 1)
  for (int k = 1; k <= 16; ++k) {
    const int64_t high_k = low_k == 0 ? 9 : low_k * 10 - 1;
    const int64_t a = std::max(lo, low_k), b = std::min(hi, high_k);
    if (a <= b) alts.push_back(DigitsRange(std::to_string(a), std::to_string(b)));
    low_k = low_k == 0 ? 10 : low_k * 10;
  }
  if (alts.empty()) return g_->Bytes(ByteSet{});
  return g_->Alt(std::move(alts));
}

ExprId JsonParts::IntegerRange(std::optional<int64_t> lo, std::optional<int64_t> hi) {
  const int64_t l = std::max(lo.value_or(-kMaxMagnitude), -kMaxMagnitude);
  const int64_t h = std::min(hi.value_or(kMaxMagnitude), kMaxMagnitude);
  std::vector<ExprId> alts;
  if (h >= 0) alts.push_back(MagnitudeRange(std::max<int64_t>(l, 0), h));
  if (l < 0) {
    // Negative values -m for m in [max(1, -h), -l].
    alts.push_back(g_->Seq({g_->Literal("-"), MagnitudeRange(std::max<int64_t>(1, -h), -l)}));
  }
  if (alts.empty()) return g_->Bytes(ByteSet{});
  return g_->Alt(std::move(alts));
}

ExprId JsonParts::Number() {
  const ExprId digit = g_->Bytes(ByteSet::Range('0', '9'));
  ByteSet e;
  e.Add('e');
  e.Add('E');
  ByteSet sign;
  sign.Add('+');
  sign.Add('-');
  const ExprId frac = g_->Seq({g_->Literal("."), g_->Repeat(digit, 1, 16)});
  const ExprId exp = g_->Seq({g_->Bytes(e), g_->Optional(g_->Bytes(sign)), g_->Repeat(digit, 1, 2)});
  return g_->Seq({Integer(), g_->Optional(frac), g_->Optional(exp)});
}

ExprId JsonParts::Boolean() { return g_->Alt({g_->Literal("true"), g_->Literal("false")}); }
ExprId JsonParts::Null() { return g_->Literal("null"); }

RuleId JsonParts::AnyValue() {
  MakeAnyRules();
  return any_value_;
}
RuleId JsonParts::AnyObject() {
  MakeAnyRules();
  return any_object_;
}
RuleId JsonParts::AnyArray() {
  MakeAnyRules();
  return any_array_;
}

void JsonParts::MakeAnyRules() {
  if (any_value_ >= 0) return;
  any_value_ = g_->AddRule("json_value");
  any_object_ = g_->AddRule("json_object");
  any_array_ = g_->AddRule("json_array");
  const ExprId value = g_->Ref(any_value_);
  g_->SetRule(any_value_, g_->Alt({g_->Ref(any_object_), g_->Ref(any_array_), String(0, -1),
                                   Number(), Boolean(), Null()}));
  const ExprId comma = g_->Seq({Ws(), g_->Literal(","), Ws()});
  const ExprId member = g_->Seq({String(0, -1), Ws(), g_->Literal(":"), Ws(), value});
  g_->SetRule(any_object_,
              g_->Seq({g_->Literal("{"), Ws(),
                       g_->Optional(g_->Seq({member, g_->Star(g_->Seq({comma, member})), Ws()})),
                       g_->Literal("}")}));
  g_->SetRule(any_array_,
              g_->Seq({g_->Literal("["), Ws(),
                       g_->Optional(g_->Seq({value, g_->Star(g_->Seq({comma, value})), Ws()})),
                       g_->Literal("]")}));
}

}  // namespace swaserve::grammar
