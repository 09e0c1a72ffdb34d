#include "lib/model/jinja/lexer.h"

#include <algorithm>
#include <cctype>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "lib/model/jinja/js_text.h"
#include "lib/model/unicode.h"

namespace swaserve::model::jinja {
namespace {

// A transformed template with, per byte, its offset in the original.
struct Src {
  std::string s;
  std::vector<uint32_t> orig;  // s.size() + 1 entries (the last: the end)

  void Push(char c, uint32_t o) {
    s.push_back(c);
    orig.push_back(o);
  }
  void Copy(const Src& from, size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) Push(from.s[i], from.orig[i]);
  }
  void Finish(uint32_t end) { orig.push_back(end); }
};

// JavaScript whitespace at byte i (false at the end).
size_t WhitespaceLen(absl::string_view s, size_t i) {
  if (i >= s.size()) return 0;
  int len;
  return IsJsWhitespace(DecodeAt(s, i, &len)) ? static_cast<size_t>(len) : 0;
}

// Length of a JavaScript line terminator ending right before byte i.
bool AfterLineTerminator(absl::string_view s, size_t i) {
  if (i == 0) return true;
  if (s[i - 1] == '\n' || s[i - 1] == '\r') return true;
  return i >= 3 && s.substr(i - 3, 2) == "\xE2\x80" &&
         (s[i - 1] == '\xA8' || s[i - 1] == '\xA9');
}

// lstrip_blocks: /^[ \t]*({[#%-])/gm -> "$1".
Src LstripBlocks(const Src& in) {
  Src out;
  const std::string& s = in.s;
  size_t i = 0;
  while (i < s.size()) {
    if (AfterLineTerminator(s, i)) {
      size_t j = i;
      while (j < s.size() && (s[j] == ' ' || s[j] == '\t')) ++j;
      if (j + 1 < s.size() && s[j] == '{' &&
          (s[j + 1] == '#' || s[j + 1] == '%' || s[j + 1] == '-')) {
        out.Copy(in, j, j + 2);
        i = j + 2;
        continue;
      }
    }
    out.Push(s[i], in.orig[i]);
    ++i;
  }
  out.Finish(in.orig.back());
  return out;
}

// trim_blocks: /([#%-]})\n/g -> "$1".
Src TrimBlocks(const Src& in) {
  Src out;
  const std::string& s = in.s;
  size_t i = 0;
  while (i < s.size()) {
    if (i + 2 < s.size() && (s[i] == '#' || s[i] == '%' || s[i] == '-') &&
        s[i + 1] == '}' && s[i + 2] == '\n') {
      out.Copy(in, i, i + 2);
      i += 3;
      continue;
    }
    out.Push(s[i], in.orig[i]);
    ++i;
  }
  out.Finish(in.orig.back());
  return out;
}

// The end of a {% generation %} / {% endgeneration %} tag starting at `j`
// (npos when there is none there), with its `-` flags.
size_t GenerationTagEnd(absl::string_view s, size_t j, bool* lstrip,
                        bool* rstrip) {
  if (s.substr(j, 2) != "{%") return absl::string_view::npos;
  size_t q = j + 2;
  *lstrip = q < s.size() && s[q] == '-';
  if (*lstrip) ++q;
  while (size_t n = WhitespaceLen(s, q)) q += n;
  if (s.substr(q, 13) == "endgeneration") {
    q += 13;
  } else if (s.substr(q, 10) == "generation") {
    q += 10;
  } else {
    return absl::string_view::npos;
  }
  while (size_t n = WhitespaceLen(s, q)) q += n;
  *rstrip = q < s.size() && s[q] == '-';
  if (*rstrip) ++q;
  if (s.substr(q, 2) != "%}") return absl::string_view::npos;
  return q + 2;
}

// /(\s*){%(-?)\s*(?:end)?generation\s*(-?)%}(\s*)/gs.
Src RemoveGenerationTags(const Src& in) {
  const std::string& s = in.s;
  if (s.find("generation") == std::string::npos) return in;
  Src out;
  size_t k = 0;  // copied up to here
  size_t p = 0;
  while ((p = s.find("{%", p)) != std::string::npos) {
    bool lstrip;
    bool rstrip;
    const size_t tag_end = GenerationTagEnd(s, p, &lstrip, &rstrip);
    if (tag_end == absl::string_view::npos) {
      ++p;
      continue;
    }
    size_t ws_begin = p;
    while (ws_begin > k) {
      size_t b = ws_begin - 1;
      while (b > k && (static_cast<unsigned char>(s[b]) & 0xC0) == 0x80) --b;
      if (WhitespaceLen(s, b) == 0) break;
      ws_begin = b;
    }
    size_t ws_end = tag_end;
    while (size_t n = WhitespaceLen(s, ws_end)) ws_end += n;
    out.Copy(in, k, ws_begin);
    if (!lstrip) out.Copy(in, ws_begin, p);
    if (!rstrip) out.Copy(in, tag_end, ws_end);
    k = p = ws_end;
  }
  out.Copy(in, k, s.size());
  out.Finish(in.orig.back());
  return out;
}

bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsWord(char c) {
  return IsDigit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         c == '_';
}

struct Mapping {
  absl::string_view seq;
  TokenType type;
};
constexpr Mapping kMappings[] = {
    {"{%", TokenType::kOpenStatement},  {"%}", TokenType::kCloseStatement},
    {"{{", TokenType::kOpenExpression}, {"}}", TokenType::kCloseExpression},
    {"(", TokenType::kOpenParen},       {")", TokenType::kCloseParen},
    {"{", TokenType::kOpenCurly},       {"}", TokenType::kCloseCurly},
    {"[", TokenType::kOpenSquare},      {"]", TokenType::kCloseSquare},
    {",", TokenType::kComma},           {".", TokenType::kDot},
    {":", TokenType::kColon},           {"|", TokenType::kPipe},
    {"<=", TokenType::kComparison},     {">=", TokenType::kComparison},
    {"==", TokenType::kComparison},     {"!=", TokenType::kComparison},
    {"<", TokenType::kComparison},      {">", TokenType::kComparison},
    {"+", TokenType::kAdditive},        {"-", TokenType::kAdditive},
    {"~", TokenType::kAdditive},        {"**", TokenType::kExponent},
    {"*", TokenType::kMultiplicative},  {"//", TokenType::kMultiplicative},
    {"/", TokenType::kMultiplicative},  {"%", TokenType::kMultiplicative},
    {"=", TokenType::kEquals},
};

class Lexer {
 public:
  Lexer(absl::string_view original, Src src)
      : original_(original), src_(std::move(src)), s_(src_.s) {}

  absl::StatusOr<std::vector<Token>> Run();

 private:
  char At(size_t i) const { return i < s_.size() ? s_[i] : '\0'; }
  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(
        DescribePosition(original_, src_.orig[std::min(pos_, s_.size())]), ": ",
        what));
  }
  void Push(TokenType type, std::string value, size_t at) {
    tokens_.push_back(
        Token{.type = type, .value = std::move(value), .pos = src_.orig[at]});
  }
  TokenType LastType(bool* none) const {
    *none = tokens_.empty();
    return tokens_.empty() ? TokenType::kText : tokens_.back().type;
  }
  // consumeWhile for whitespace, digits and word characters: `len(i)` is the
  // length of the matching character at i (0: none). An error when the run
  // reaches the end of the template, as in the JavaScript lexer.
  template <typename Len>
  absl::StatusOr<std::string> ConsumeWhile(Len len) {
    std::string out;
    while (pos_ < s_.size()) {
      const size_t n = len(pos_);
      if (n == 0) break;
      out.append(s_, pos_, n);
      pos_ += n;
      if (pos_ >= s_.size()) return Error("unexpected end of template");
    }
    return out;
  }
  absl::StatusOr<std::string> ConsumeDigits() {
    return ConsumeWhile([&](size_t i) -> size_t { return IsDigit(s_[i]); });
  }
  absl::StatusOr<std::string> ConsumeString(char quote);
  void StripTrailingWhitespace();
  void SkipLeadingWhitespace() {
    while (size_t n = WhitespaceLen(s_, pos_)) pos_ += n;
  }
  absl::Status LexText();
  absl::Status LexComment();
  absl::StatusOr<bool> LexUnary(char c);
  absl::Status LexOperand(char c);

  absl::string_view original_;
  Src src_;
  const std::string& s_;
  size_t pos_ = 0;
  int curly_depth_ = 0;
  std::vector<Token> tokens_;
};

void Lexer::StripTrailingWhitespace() {
  if (tokens_.empty() || tokens_.back().type != TokenType::kText) return;
  std::string& v = tokens_.back().value;
  v.resize(JsTrimRange(v, false, true).second);
  if (v.empty()) tokens_.pop_back();
}

absl::StatusOr<std::string> Lexer::ConsumeString(char quote) {
  std::string out;
  char32_t pending_high = 0;  // a \uD8xx escape waiting for its pair
  auto flush_high = [&] {
    if (pending_high != 0) unicode::AppendUtf8(unicode::kReplacementChar, &out);
    pending_high = 0;
  };
  while (pos_ < s_.size() && s_[pos_] != quote) {
    if (s_[pos_] != '\\') {
      flush_high();
      out.push_back(s_[pos_++]);
      if (pos_ >= s_.size()) return Error("unexpected end of template");
      continue;
    }
    ++pos_;
    if (pos_ >= s_.size()) return Error("unexpected end of template");
    const char e = s_[pos_++];
    if (e == 'x' || e == 'u') {
      const size_t len = e == 'x' ? 2 : 4;
      const std::string hex = s_.substr(pos_, len);
      bool ok = hex.size() == len;
      for (char h : hex)
        ok = ok && std::isxdigit(static_cast<unsigned char>(h));
      if (!ok)
        return Error(absl::StrCat("invalid escape \\", std::string(1, e), hex));
      pos_ += len;
      const auto cp = static_cast<char32_t>(std::stoul(hex, nullptr, 16));
      if (cp >= 0xDC00 && cp <= 0xDFFF && pending_high != 0) {
        unicode::AppendUtf8(
            0x10000 + ((pending_high - 0xD800) << 10) + (cp - 0xDC00), &out);
        pending_high = 0;
      } else {
        flush_high();
        if (cp >= 0xD800 && cp <= 0xDBFF) {
          pending_high = cp;
        } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
          unicode::AppendUtf8(unicode::kReplacementChar, &out);
        } else {
          unicode::AppendUtf8(cp, &out);
        }
      }
      continue;
    }
    flush_high();
    switch (e) {
      case 'n':
        out.push_back('\n');
        break;
      case 't':
        out.push_back('\t');
        break;
      case 'r':
        out.push_back('\r');
        break;
      case 'b':
        out.push_back('\b');
        break;
      case 'f':
        out.push_back('\f');
        break;
      case 'v':
        out.push_back('\v');
        break;
      case '\'':
      case '"':
      case '\\':
        out.push_back(e);
        break;
      default:
        return Error(absl::StrCat("unexpected escaped character '",
                                  std::string(1, e), "'"));
    }
  }
  flush_high();
  if (pos_ >= s_.size()) return Error("unterminated string literal");
  return out;
}

absl::Status Lexer::LexText() {
  const size_t start = pos_;
  while (pos_ < s_.size() &&
         !(s_[pos_] == '{' && (At(pos_ + 1) == '%' || At(pos_ + 1) == '{' ||
                               At(pos_ + 1) == '#'))) {
    ++pos_;
  }
  if (pos_ > start)
    Push(TokenType::kText, s_.substr(start, pos_ - start), start);
  return absl::OkStatus();
}

absl::Status Lexer::LexComment() {
  const size_t start = pos_;
  pos_ += 2;
  const bool strip_before = At(pos_) == '-';
  if (strip_before) ++pos_;
  std::string comment;
  while (At(pos_) != '#' || At(pos_ + 1) != '}') {
    if (pos_ + 2 >= s_.size()) return Error("missing end of comment tag");
    comment.push_back(s_[pos_++]);
  }
  const bool strip_after = !comment.empty() && comment.back() == '-';
  if (strip_after) comment.pop_back();
  if (strip_before) StripTrailingWhitespace();
  Push(TokenType::kComment, std::move(comment), start);
  pos_ += 2;
  if (strip_after) SkipLeadingWhitespace();
  return absl::OkStatus();
}

// A '+' or '-' that starts an operand: a signed number or a unary operator.
// False when it is a binary operator.
absl::StatusOr<bool> Lexer::LexUnary(char c) {
  bool none;
  const TokenType last = LastType(&none);
  if (none || last == TokenType::kText) {
    return Error(
        absl::StrCat("unexpected character '", std::string(1, c), "'"));
  }
  switch (last) {
    case TokenType::kIdentifier:
    case TokenType::kNumeric:
    case TokenType::kString:
    case TokenType::kCloseParen:
    case TokenType::kCloseSquare:
      return false;
    default:
      break;
  }
  const size_t start = pos_;
  ++pos_;
  absl::StatusOr<std::string> digits = ConsumeDigits();
  if (!digits.ok()) return digits.status();
  std::string num = *std::move(digits);
  if (!num.empty() && At(pos_) == '.' && IsDigit(At(pos_ + 1))) {
    ++pos_;
    absl::StatusOr<std::string> frac = ConsumeDigits();
    if (!frac.ok()) return frac.status();
    num += "." + *frac;
  }
  Push(num.empty() ? TokenType::kUnary : TokenType::kNumeric,
       std::string(1, c) + num, start);
  return true;
}

absl::Status Lexer::LexOperand(char c) {
  const size_t start = pos_;
  if (c == '\'' || c == '"') {
    ++pos_;
    absl::StatusOr<std::string> str = ConsumeString(c);
    if (!str.ok()) return str.status();
    Push(TokenType::kString, *std::move(str), start);
    ++pos_;
    return absl::OkStatus();
  }
  if (IsDigit(c)) {
    absl::StatusOr<std::string> num = ConsumeDigits();
    if (!num.ok()) return num.status();
    std::string value = *std::move(num);
    if (!(!tokens_.empty() && tokens_.back().type == TokenType::kDot) &&
        At(pos_) == '.' && IsDigit(At(pos_ + 1))) {
      ++pos_;
      absl::StatusOr<std::string> frac = ConsumeDigits();
      if (!frac.ok()) return frac.status();
      value += "." + *frac;
    }
    Push(TokenType::kNumeric, std::move(value), start);
    return absl::OkStatus();
  }
  if (IsWord(c)) {
    absl::StatusOr<std::string> word =
        ConsumeWhile([&](size_t i) -> size_t { return IsWord(s_[i]); });
    if (!word.ok()) return word.status();
    Push(TokenType::kIdentifier, *std::move(word), start);
    return absl::OkStatus();
  }
  int len;
  const char32_t cp = DecodeAt(s_, pos_, &len);
  std::string shown;
  unicode::AppendUtf8(cp, &shown);
  return Error(absl::StrCat("unexpected character '", shown, "'"));
}

absl::StatusOr<std::vector<Token>> Lexer::Run() {
  while (pos_ < s_.size()) {
    bool none;
    const TokenType last = LastType(&none);
    if (none || last == TokenType::kCloseStatement ||
        last == TokenType::kCloseExpression || last == TokenType::kComment) {
      const size_t before = tokens_.size();
      if (absl::Status st = LexText(); !st.ok()) return st;
      if (tokens_.size() > before) continue;
    }
    if (At(pos_) == '{' && At(pos_ + 1) == '#') {
      if (absl::Status st = LexComment(); !st.ok()) return st;
      continue;
    }
    if (s_.compare(pos_, 3, "{%-") == 0) {
      StripTrailingWhitespace();
      Push(TokenType::kOpenStatement, "{%", pos_);
      pos_ += 3;
      continue;
    }
    if (s_.compare(pos_, 3, "{{-") == 0) {
      StripTrailingWhitespace();
      Push(TokenType::kOpenExpression, "{{", pos_);
      curly_depth_ = 0;
      pos_ += 3;
      continue;
    }
    if (absl::StatusOr<std::string> ws =
            ConsumeWhile([&](size_t i) { return WhitespaceLen(s_, i); });
        !ws.ok()) {
      return ws.status();
    }
    if (s_.compare(pos_, 3, "-%}") == 0) {
      Push(TokenType::kCloseStatement, "%}", pos_);
      pos_ += 3;
      SkipLeadingWhitespace();
      continue;
    }
    if (s_.compare(pos_, 3, "-}}") == 0) {
      Push(TokenType::kCloseExpression, "}}", pos_);
      pos_ += 3;
      SkipLeadingWhitespace();
      continue;
    }
    const char c = s_[pos_];
    if (c == '-' || c == '+') {
      absl::StatusOr<bool> unary = LexUnary(c);
      if (!unary.ok()) return unary.status();
      if (*unary) continue;
    }
    bool matched = false;
    for (const Mapping& m : kMappings) {
      if (m.type == TokenType::kCloseExpression && curly_depth_ > 0) continue;
      if (s_.compare(pos_, m.seq.size(), m.seq.data(), m.seq.size()) != 0) {
        continue;
      }
      Push(m.type, std::string(m.seq), pos_);
      if (m.type == TokenType::kOpenExpression) curly_depth_ = 0;
      if (m.type == TokenType::kOpenCurly) ++curly_depth_;
      if (m.type == TokenType::kCloseCurly) --curly_depth_;
      pos_ += m.seq.size();
      matched = true;
      break;
    }
    if (matched) continue;
    if (absl::Status st = LexOperand(c); !st.ok()) return st;
  }
  return std::move(tokens_);
}

}  // namespace

const char* TokenTypeName(TokenType t) {
  switch (t) {
    case TokenType::kText:
      return "text";
    case TokenType::kNumeric:
      return "number";
    case TokenType::kString:
      return "string";
    case TokenType::kIdentifier:
      return "identifier";
    case TokenType::kEquals:
      return "'='";
    case TokenType::kOpenParen:
      return "'('";
    case TokenType::kCloseParen:
      return "')'";
    case TokenType::kOpenStatement:
      return "'{%'";
    case TokenType::kCloseStatement:
      return "'%}'";
    case TokenType::kOpenExpression:
      return "'{{'";
    case TokenType::kCloseExpression:
      return "'}}'";
    case TokenType::kOpenSquare:
      return "'['";
    case TokenType::kCloseSquare:
      return "']'";
    case TokenType::kOpenCurly:
      return "'{'";
    case TokenType::kCloseCurly:
      return "'}'";
    case TokenType::kComma:
      return "','";
    case TokenType::kDot:
      return "'.'";
    case TokenType::kColon:
      return "':'";
    case TokenType::kPipe:
      return "'|'";
    case TokenType::kAdditive:
      return "additive operator";
    case TokenType::kMultiplicative:
      return "multiplicative operator";
    case TokenType::kExponent:
      return "'**'";
    case TokenType::kComparison:
      return "comparison operator";
    case TokenType::kUnary:
      return "unary operator";
    case TokenType::kComment:
      return "comment";
  }
  return "?";
}

std::string DescribePosition(absl::string_view source, uint32_t pos) {
  size_t line = 1;
  size_t column = 1;
  for (size_t i = 0; i < pos && i < source.size(); ++i) {
    if (source[i] == '\n') {
      ++line;
      column = 1;
    } else if ((static_cast<unsigned char>(source[i]) & 0xC0) != 0x80) {
      ++column;
    }
  }
  return absl::StrCat("line ", line, ", column ", column);
}

absl::StatusOr<std::vector<Token>> Tokenize(absl::string_view source) {
  if (source.size() > kMaxTemplateBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("the template has ", source.size(), " bytes (at most ",
                     kMaxTemplateBytes, ")"));
  }
  if (const size_t bad = unicode::FindInvalidUtf8(source);
      bad != absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(DescribePosition(source, static_cast<uint32_t>(bad)),
                     ": the template is not valid UTF-8"));
  }
  Src src;
  src.s.assign(source.data(), source.size());
  src.orig.resize(source.size() + 1);
  for (size_t i = 0; i <= source.size(); ++i)
    src.orig[i] = static_cast<uint32_t>(i);
  if (!src.s.empty() && src.s.back() == '\n') {
    src.s.pop_back();
    src.orig.erase(src.orig.end() - 2);
  }
  Src processed = RemoveGenerationTags(TrimBlocks(LstripBlocks(src)));
  Lexer lexer(source, std::move(processed));
  return lexer.Run();
}

}  // namespace swaserve::model::jinja
