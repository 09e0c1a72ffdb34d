#include "lib/grammar/grammar.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace swaserve::grammar {

RuleId Grammar::AddRule(std::string name) {
  rules_.push_back(Rule{.name = std::move(name), .body = -1});
  return static_cast<RuleId>(rules_.size() - 1);
}

ExprId Grammar::Add(Expr e) {
  exprs_.push_back(std::move(e));
  return static_cast<ExprId>(exprs_.size() - 1);
}

ExprId Grammar::Bytes(const ByteSet& set) {
  Expr e;
  e.kind = Expr::Kind::kBytes;
  e.bytes = set;
  return Add(std::move(e));
}

ExprId Grammar::Literal(absl::string_view bytes) {
  std::vector<ExprId> parts;
  parts.reserve(bytes.size());
  for (char c : bytes) parts.push_back(Bytes(ByteSet::Of(static_cast<uint8_t>(c))));
  if (parts.size() == 1) return parts[0];
  return Seq(std::move(parts));
}

ExprId Grammar::Seq(std::vector<ExprId> parts) {
  if (parts.size() == 1) return parts[0];
  Expr e;
  e.kind = Expr::Kind::kSeq;
  e.children = std::move(parts);
  return Add(std::move(e));
}

ExprId Grammar::Alt(std::vector<ExprId> options) {
  if (options.size() == 1) return options[0];
  Expr e;
  e.kind = Expr::Kind::kAlt;
  e.children = std::move(options);
  return Add(std::move(e));
}

ExprId Grammar::Repeat(ExprId child, int min, int max) {
  if (min == 1 && max == 1) return child;
  Expr e;
  e.kind = Expr::Kind::kRepeat;
  e.children = {child};
  e.min = min;
  e.max = max;
  return Add(std::move(e));
}

ExprId Grammar::Ref(RuleId rule) {
  Expr e;
  e.kind = Expr::Kind::kRef;
  e.rule = rule;
  return Add(std::move(e));
}

namespace {

std::string ByteSetString(const ByteSet& s) {
  std::string out = "[";
  for (int b = 0; b < 256; ++b) {
    if (!s.Has(static_cast<uint8_t>(b))) continue;
    int e = b;
    while (e + 1 < 256 && s.Has(static_cast<uint8_t>(e + 1))) ++e;
    auto one = [](int c) {
      return c >= 0x21 && c < 0x7f && c != '\\' && c != ']' && c != '-'
                 ? std::string(1, static_cast<char>(c))
                 : absl::StrFormat("\\x%02x", c);
    };
    absl::StrAppend(&out, one(b));
    if (e > b) absl::StrAppend(&out, "-", one(e));
    b = e;
  }
  return out + "]";
}

// Grammar text past this many bytes is cut ("..."): shared expressions are
// printed once per use.
constexpr size_t kMaxText = 1 << 16;

void AppendExpr(const Grammar& g, ExprId id, std::string* out) {
  if (out->size() > kMaxText) return;
  const Expr& e = g.expr(id);
  switch (e.kind) {
    case Expr::Kind::kBytes:
      absl::StrAppend(out, ByteSetString(e.bytes));
      return;
    case Expr::Kind::kRef:
      absl::StrAppend(out, g.rules()[e.rule].name);
      return;
    case Expr::Kind::kRepeat:
      absl::StrAppend(out, "(");
      AppendExpr(g, e.children[0], out);
      absl::StrAppend(out, "){", e.min, ",", e.max < 0 ? "" : absl::StrCat(e.max), "}");
      return;
    case Expr::Kind::kSeq:
    case Expr::Kind::kAlt: {
      absl::StrAppend(out, "(");
      for (size_t i = 0; i < e.children.size(); ++i) {
        if (i > 0) absl::StrAppend(out, e.kind == Expr::Kind::kAlt ? " | " : " ");
        AppendExpr(g, e.children[i], out);
      }
      absl::StrAppend(out, ")");
      return;
    }
  }
}

}  // namespace

std::string Grammar::ToString() const {
  std::string out;
  for (const Rule& r : rules_) {
    if (out.size() > kMaxText) return out + "...\n";
    absl::StrAppend(&out, r.name, " ::= ");
    if (r.body >= 0) AppendExpr(*this, r.body, &out);
    absl::StrAppend(&out, "\n");
  }
  return out;
}

}  // namespace swaserve::grammar
