#include "lib/grammar/regex.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace swaserve::grammar {
namespace {

const CodePointSet kDigit = {{'0', '9'}};
const CodePointSet kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
// What \s generates: ASCII whitespace (a subset of JavaScript's \s).
const CodePointSet kSpaceAscii = {{'\t', '\r'}, {' ', ' '}};
// JavaScript's \s, what \S must exclude.
const CodePointSet kSpaceJs = {{'\t', '\r'},     {' ', ' '},       {0xA0, 0xA0},
                               {0x1680, 0x1680}, {0x2000, 0x200A}, {0x2028, 0x2029},
                               {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000},
                               {0xFEFF, 0xFEFF}};
// What . matches (JavaScript with the u flag: all but line terminators).
const CodePointSet kDot = Complement({{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}});

class Parser {
 public:
  Parser(absl::string_view p, JsonParts* parts) : p_(p), parts_(parts), g_(parts->g()) {}

  absl::StatusOr<ExprId> Parse() {
    bool anchored_start = false, anchored_end = false;
    if (!p_.empty() && p_[0] == '^') {
      anchored_start = true;
      pos_ = 1;
    }
    if (p_.size() > pos_ && p_.back() == '$' && !Escaped(p_.size() - 1)) {
      anchored_end = true;
      p_.remove_suffix(1);
    }
    ExprId body = Alternation();
    if (!error_.empty()) return absl::InvalidArgumentError(error_);
    if (pos_ < p_.size()) {
      Fail(absl::StrCat("unexpected '", std::string(1, p_[pos_]), "'"));
      return absl::InvalidArgumentError(error_);
    }
    std::vector<ExprId> seq;
    if (!anchored_start) seq.push_back(g_.Star(parts_->StringChar()));
    seq.push_back(body);
    if (!anchored_end) seq.push_back(g_.Star(parts_->StringChar()));
    return g_.Seq(std::move(seq));
  }

 private:
  bool Escaped(size_t i) const {
    size_t n = 0;
    while (i > n && p_[i - n - 1] == '\\') ++n;
    return n % 2 == 1;
  }
  // Records the first error; parsing unwinds and Parse() returns it.
  void Fail(const std::string& what) {
    if (error_.empty()) {
      error_ = absl::StrCat("pattern: ", what, " at offset ", pos_,
                            " (supported: literals . [] \\d\\w\\s groups | * + ? {n,m})");
    }
  }
  bool AtEnd() const { return pos_ >= p_.size() || !error_.empty(); }

  ExprId Alternation() {
    std::vector<ExprId> alts{Sequence()};
    while (!AtEnd() && p_[pos_] == '|') {
      ++pos_;
      alts.push_back(Sequence());
    }
    return g_.Alt(std::move(alts));
  }

  ExprId Sequence() {
    std::vector<ExprId> seq;
    while (!AtEnd() && p_[pos_] != '|' && p_[pos_] != ')') {
      ExprId atom = Atom();
      if (!error_.empty()) return 0;
      seq.push_back(Quantified(atom));
    }
    return g_.Seq(std::move(seq));
  }

  // Reads a decimal number at pos_; -1 when there is none.
  int Number() {
    int n = -1;
    while (pos_ < p_.size() && p_[pos_] >= '0' && p_[pos_] <= '9') {
      n = (n < 0 ? 0 : n) * 10 + (p_[pos_] - '0');
      if (n > 1000000) n = 1000000;
      ++pos_;
    }
    return n;
  }

  ExprId Quantified(ExprId atom) {
    while (!AtEnd()) {
      int lo, hi;
      const char c = p_[pos_];
      if (c == '*') { lo = 0; hi = Grammar::kUnbounded; ++pos_; }
      else if (c == '+') { lo = 1; hi = Grammar::kUnbounded; ++pos_; }
      else if (c == '?') { lo = 0; hi = 1; ++pos_; }
      else if (c == '{') {
        ++pos_;
        lo = Number();
        hi = lo;
        if (pos_ < p_.size() && p_[pos_] == ',') {
          ++pos_;
          hi = Number();
          if (hi < 0) hi = Grammar::kUnbounded;
        }
        if (lo < 0 || pos_ >= p_.size() || p_[pos_] != '}') {
          Fail("malformed {n,m}");
          return 0;
        }
        ++pos_;
        if (hi != Grammar::kUnbounded && hi < lo) {
          Fail("{n,m} with m < n");
          return 0;
        }
        const int max_rep = parts_->options().max_repetition;
        if (lo > max_rep || hi > max_rep) {
          Fail(absl::StrCat("repetition above ", max_rep));
          return 0;
        }
      } else {
        return atom;
      }
      if (pos_ < p_.size() && p_[pos_] == '?') ++pos_;  // lazy: same language
      atom = g_.Repeat(atom, lo, hi);
    }
    return atom;
  }

  ExprId Atom() {
    const char c = p_[pos_];
    if (c == '(') {
      ++pos_;
      if (p_.substr(pos_, 2) == "?:") {
        pos_ += 2;
      } else if (pos_ < p_.size() && p_[pos_] == '?') {
        Fail("lookaround or named group");
        return 0;
      }
      ExprId inner = Alternation();
      if (AtEnd() || p_[pos_] != ')') {
        Fail("missing ')'");
        return 0;
      }
      ++pos_;
      return inner;
    }
    if (c == '[') return Class();
    if (c == '.') {
      ++pos_;
      return parts_->JsonChars(kDot);
    }
    if (c == '^' || c == '$') {
      Fail("^ or $ inside the pattern");
      return 0;
    }
    if (c == '*' || c == '+' || c == '?' || c == '{' || c == ')') {
      Fail("nothing to repeat");
      return 0;
    }
    CodePointSet set;
    if (!Char(/*in_class=*/false, &set)) return 0;
    return parts_->JsonChars(set);
  }

  // One UTF-8 code point of the pattern at pos_.
  uint32_t CodePoint() {
    const auto b = static_cast<uint8_t>(p_[pos_++]);
    if (b < 0x80) return b;
    const int n = b >= 0xF0 ? 3 : b >= 0xE0 ? 2 : 1;
    uint32_t c = b & (0x3F >> n);
    for (int i = 0; i < n && pos_ < p_.size(); ++i) c = (c << 6) | (p_[pos_++] & 0x3F);
    return c;
  }

  // A literal character or escape (into *set); false after Fail.
  bool Char(bool in_class, CodePointSet* set) {
    if (p_[pos_] != '\\') {
      const uint32_t c = CodePoint();
      set->emplace_back(c, c);
      return true;
    }
    ++pos_;
    if (pos_ >= p_.size()) {
      Fail("trailing backslash");
      return false;
    }
    const char e = p_[pos_++];
    auto add = [&](const CodePointSet& s) { set->insert(set->end(), s.begin(), s.end()); };
    switch (e) {
      case 'd': add(kDigit); return true;
      case 'D': add(Complement(kDigit)); return true;
      case 'w': add(kWord); return true;
      case 'W': add(Complement(kWord)); return true;
      case 's': add(kSpaceAscii); return true;
      case 'S': add(Complement(kSpaceJs)); return true;
      case 'n': set->emplace_back('\n', '\n'); return true;
      case 't': set->emplace_back('\t', '\t'); return true;
      case 'r': set->emplace_back('\r', '\r'); return true;
      case 'f': set->emplace_back('\f', '\f'); return true;
      case 'v': set->emplace_back('\v', '\v'); return true;
      case 'u': {
        uint32_t c = 0;
        for (int i = 0; i < 4; ++i) {
          const char h = pos_ < p_.size() ? p_[pos_++] : 'x';
          const int v = h >= '0' && h <= '9' ? h - '0'
                        : h >= 'a' && h <= 'f' ? h - 'a' + 10
                        : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
          if (v < 0) {
            Fail("malformed \\u escape");
            return false;
          }
          c = c * 16 + v;
        }
        set->emplace_back(c, c);
        return true;
      }
      default:
        break;
    }
    const std::string punct = in_class ? "\\/-.^$*+?()[]{}|" : "\\/.^$*+?()[]{}|-";
    if (punct.find(e) != std::string::npos) {
      set->emplace_back(static_cast<uint8_t>(e), static_cast<uint8_t>(e));
      return true;
    }
    Fail(absl::StrCat("unsupported escape \\", std::string(1, e)));
    return false;
  }

  ExprId Class() {
    ++pos_;  // [
    bool negate = false;
    if (pos_ < p_.size() && p_[pos_] == '^') {
      negate = true;
      ++pos_;
    }
    CodePointSet set;
    bool first = true;
    while (true) {
      if (pos_ >= p_.size()) {
        Fail("missing ']'");
        return 0;
      }
      if (p_[pos_] == ']' && !first) break;
      first = false;
      CodePointSet item;
      const bool class_escape = p_[pos_] == '\\' && pos_ + 1 < p_.size() &&
                                std::string("dDwWsS").find(p_[pos_ + 1]) != std::string::npos;
      if (!Char(/*in_class=*/true, &item)) return 0;
      const bool single = !class_escape && item.size() == 1;
      if (single && pos_ + 1 < p_.size() && p_[pos_] == '-' && p_[pos_ + 1] != ']') {
        ++pos_;
        CodePointSet hi;
        if (!Char(/*in_class=*/true, &hi)) return 0;
        if (hi.size() != 1 || hi[0].first != hi[0].second || hi[0].first < item[0].first) {
          Fail("bad range in []");
          return 0;
        }
        set.emplace_back(item[0].first, hi[0].first);
        continue;
      }
      set.insert(set.end(), item.begin(), item.end());
    }
    ++pos_;  // ]
    if (negate) set = Complement(set);
    return parts_->JsonChars(set);
  }

  absl::string_view p_;
  size_t pos_ = 0;
  JsonParts* parts_;
  Grammar& g_;
  std::string error_;
};

}  // namespace

absl::StatusOr<ExprId> PatternToStringBody(absl::string_view pattern, JsonParts* parts) {
  return Parser(pattern, parts).Parse();
}

}  // namespace swaserve::grammar
