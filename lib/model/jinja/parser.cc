#include "lib/model/jinja/parser.h"

#include <initializer_list>
#include <string>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "lib/base/status.h"

namespace swaserve::model::jinja {
namespace {

enum class ArgsMode { kCall, kParameters };

NodePtr MakeNode(NodeKind kind, uint32_t pos) {
  auto n = std::make_unique<Node>();
  n->kind = kind;
  n->pos = pos;
  return n;
}

NodePtr Binary(std::string op, uint32_t pos, NodePtr left, NodePtr right) {
  NodePtr n = MakeNode(NodeKind::kBinary, pos);
  n->str = std::move(op);
  n->x = std::move(left);
  n->y = std::move(right);
  return n;
}

class Parser {
 public:
  Parser(const std::vector<Token>& tokens, absl::string_view source)
      : t_(tokens), source_(source) {}

  absl::StatusOr<NodePtr> Program() {
    NodePtr program = MakeNode(NodeKind::kProgram, 0);
    while (cur_ < t_.size()) {
      ASSIGN_OR_RETURN(NodePtr n, Any());
      program->a.push_back(std::move(n));
    }
    return program;
  }

 private:
  // Bounds the recursion depth; every recursive production holds one.
  class Depth {
   public:
    explicit Depth(Parser* p) : p_(p) { ++p_->depth_; }
    ~Depth() { --p_->depth_; }
    bool ok() const { return p_->depth_ <= kMaxParseDepth; }

   private:
    Parser* p_;
  };

  const Token* Peek(size_t k = 0) const {
    return cur_ + k < t_.size() ? &t_[cur_ + k] : nullptr;
  }
  uint32_t Pos() const {
    return cur_ < t_.size() ? t_[cur_].pos
                            : static_cast<uint32_t>(source_.size());
  }
  bool Is(TokenType type, size_t k = 0) const {
    const Token* tok = Peek(k);
    return tok != nullptr && tok->type == type;
  }
  bool IsIdentifier(absl::string_view name, size_t k = 0) const {
    const Token* tok = Peek(k);
    return tok != nullptr && tok->type == TokenType::kIdentifier &&
           tok->value == name;
  }
  bool IsStatement(std::initializer_list<absl::string_view> names) const {
    if (!Is(TokenType::kOpenStatement) || !Is(TokenType::kIdentifier, 1)) {
      return false;
    }
    for (absl::string_view n : names) {
      if (t_[cur_ + 1].value == n) return true;
    }
    return false;
  }
  absl::Status ErrorAt(uint32_t pos, absl::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat(DescribePosition(source_, pos), ": ", what));
  }
  absl::Status Error(absl::string_view what) const {
    if (cur_ >= t_.size()) {
      return ErrorAt(Pos(),
                     absl::StrCat(what, " (at the end of the template)"));
    }
    return ErrorAt(
        Pos(), absl::StrCat(what, ", got ", TokenTypeName(t_[cur_].type), " '",
                            t_[cur_].value, "'"));
  }
  absl::Status TooDeep() const {
    return ErrorAt(Pos(), absl::StrCat("the template nests deeper than ",
                                       kMaxParseDepth, " levels"));
  }
  absl::Status Expect(TokenType type) {
    if (!Is(type)) return Error(absl::StrCat("expected ", TokenTypeName(type)));
    ++cur_;
    return absl::OkStatus();
  }
  absl::Status ExpectIdentifier(absl::string_view name) {
    if (!IsIdentifier(name))
      return Error(absl::StrCat("expected '", name, "'"));
    ++cur_;
    return absl::OkStatus();
  }
  // {% name %}
  absl::Status ExpectEndTag(absl::string_view name) {
    RETURN_IF_ERROR(Expect(TokenType::kOpenStatement));
    RETURN_IF_ERROR(ExpectIdentifier(name));
    return Expect(TokenType::kCloseStatement);
  }
  absl::Status Body(std::initializer_list<absl::string_view> until,
                    std::vector<NodePtr>* body) {
    while (!IsStatement(until)) {
      ASSIGN_OR_RETURN(NodePtr n, Any());
      body->push_back(std::move(n));
    }
    return absl::OkStatus();
  }

  // A left-associative chain `next (op next)*`; `op()` consumes and returns
  // the operator at the current token, or returns "" when there is none.
  template <typename Next, typename Op>
  absl::StatusOr<NodePtr> Chain(Next next, Op op) {
    ASSIGN_OR_RETURN(NodePtr left, next());
    while (true) {
      const uint32_t pos = Pos();
      std::string o = op();
      if (o.empty()) return left;
      ASSIGN_OR_RETURN(NodePtr right, next());
      left = Binary(std::move(o), pos, std::move(left), std::move(right));
    }
  }
  // The operator of `type` at the current token (consumed), or "".
  std::string TakeOperator(TokenType type) {
    return Is(type) ? t_[cur_++].value : std::string();
  }
  std::string TakeKeyword(absl::string_view word) {
    if (!IsIdentifier(word)) return std::string();
    ++cur_;
    return std::string(word);
  }

  absl::StatusOr<NodePtr> Any();
  absl::StatusOr<NodePtr> Statement();
  absl::StatusOr<NodePtr> Set(uint32_t pos);
  absl::StatusOr<NodePtr> If(uint32_t pos);
  absl::StatusOr<NodePtr> Macro(uint32_t pos);
  absl::StatusOr<NodePtr> For(uint32_t pos);
  absl::StatusOr<NodePtr> CallBlock(uint32_t pos);
  absl::StatusOr<NodePtr> FilterBlock(uint32_t pos);
  absl::StatusOr<NodePtr> ExpressionSequence(bool primary);
  absl::StatusOr<NodePtr> Expression();
  absl::StatusOr<NodePtr> IfExpression();
  absl::StatusOr<NodePtr> LogicalOr();
  absl::StatusOr<NodePtr> LogicalAnd();
  absl::StatusOr<NodePtr> LogicalNot();
  absl::StatusOr<NodePtr> Comparison();
  absl::StatusOr<NodePtr> Additive();
  absl::StatusOr<NodePtr> Multiplicative();
  absl::StatusOr<NodePtr> Power();
  absl::StatusOr<NodePtr> TestExpr();
  absl::StatusOr<NodePtr> FilterExpr();
  absl::StatusOr<NodePtr> UnarySign();
  absl::StatusOr<NodePtr> CallMember();
  absl::StatusOr<NodePtr> CallExpression(NodePtr callee);
  absl::Status Args(ArgsMode mode, std::vector<NodePtr>* out);
  absl::StatusOr<NodePtr> MemberArgs();
  absl::StatusOr<NodePtr> Member(NodePtr object);
  absl::StatusOr<NodePtr> Primary();

  const std::vector<Token>& t_;
  absl::string_view source_;
  size_t cur_ = 0;
  int depth_ = 0;
};

absl::StatusOr<NodePtr> Parser::Any() {
  Depth d(this);
  if (!d.ok()) return TooDeep();
  const Token* tok = Peek();
  if (tok == nullptr) return Error("unexpected end of template");
  switch (tok->type) {
    case TokenType::kComment: {
      ++cur_;
      return MakeNode(NodeKind::kComment, tok->pos);
    }
    case TokenType::kText: {
      NodePtr n = MakeNode(NodeKind::kText, tok->pos);
      n->str = tok->value;
      ++cur_;
      return n;
    }
    case TokenType::kOpenStatement:
      return Statement();
    case TokenType::kOpenExpression: {
      ++cur_;
      ASSIGN_OR_RETURN(NodePtr e, Expression());
      RETURN_IF_ERROR(Expect(TokenType::kCloseExpression));
      return e;
    }
    default:
      return Error("unexpected token");
  }
}

absl::StatusOr<NodePtr> Parser::Statement() {
  const uint32_t pos = Pos();
  RETURN_IF_ERROR(Expect(TokenType::kOpenStatement));
  if (!Is(TokenType::kIdentifier)) return Error("expected a statement name");
  const std::string name = t_[cur_].value;
  ++cur_;
  NodePtr result;
  if (name == "set") return Set(pos);
  if (name == "if") {
    ASSIGN_OR_RETURN(result, If(pos));
    RETURN_IF_ERROR(ExpectEndTag("endif"));
    return result;
  }
  if (name == "macro") {
    ASSIGN_OR_RETURN(result, Macro(pos));
    RETURN_IF_ERROR(ExpectEndTag("endmacro"));
    return result;
  }
  if (name == "for") {
    ASSIGN_OR_RETURN(result, For(pos));
    RETURN_IF_ERROR(ExpectEndTag("endfor"));
    return result;
  }
  if (name == "call") return CallBlock(pos);
  if (name == "filter") return FilterBlock(pos);
  if (name == "break" || name == "continue") {
    RETURN_IF_ERROR(Expect(TokenType::kCloseStatement));
    return MakeNode(name == "break" ? NodeKind::kBreak : NodeKind::kContinue,
                    pos);
  }
  return ErrorAt(pos, absl::StrCat("unknown statement '", name, "'"));
}

absl::StatusOr<NodePtr> Parser::Set(uint32_t pos) {
  NodePtr n = MakeNode(NodeKind::kSet, pos);
  ASSIGN_OR_RETURN(n->x, ExpressionSequence(false));
  if (Is(TokenType::kEquals)) {
    ++cur_;
    ASSIGN_OR_RETURN(n->y, ExpressionSequence(false));
  } else {
    RETURN_IF_ERROR(Expect(TokenType::kCloseStatement));
    RETURN_IF_ERROR(Body({"endset"}, &n->a));
    RETURN_IF_ERROR(Expect(TokenType::kOpenStatement));
    RETURN_IF_ERROR(ExpectIdentifier("endset"));
  }
  RETURN_IF_ERROR(Expect(TokenType::kCloseStatement));
  return n;
}

absl::StatusOr<NodePtr> Parser::If(uint32_t pos) {
  Depth d(this);
  if (!d.ok()) return TooDeep();
  NodePtr n = MakeNode(NodeKind::kIf, pos);
  ASSIGN_OR_RETURN(n->x, Expression());
  RETURN_IF_ERROR(Expect(TokenType::kCloseStatement));
  RETURN_IF_ERROR(Body({"elif", "else", "endif"}, &n->a));
  if (IsStatement({"elif"})) {
    const uint32_t elif_pos = Pos();
    cur_ += 2;
    ASSIGN_OR_RETURN(NodePtr nested, If(elif_pos));
    n->b.push_back(std::move(nested));
  } else if (IsStatement({"else"})) {
    cur_ += 2;
    RETURN_IF_ERROR(Expect(TokenType::kCloseStatement));
    RETURN_IF_ERROR(Body({"endif"}, &n->b));
  }
  return n;
}

absl::StatusOr<NodePtr> Parser::Macro(uint32_t pos) {
  NodePtr n = MakeNode(NodeKind::kMacro, pos);
  ASSIGN_OR_RETURN(NodePtr name, Primary());
  if (name->kind != NodeKind::kIdentifier) {
    return ErrorAt(name->pos, "expected a macro name");
  }
  n->str = name->str;
  RETURN_IF_ERROR(Args(ArgsMode::kParameters, &n->a));
  RETURN_IF_ERROR(Expect(TokenType::kCloseStatement));
  RETURN_IF_ERROR(Body({"endmacro"}, &n->b));
  return n;
}

absl::StatusOr<NodePtr> Parser::For(uint32_t pos) {
  NodePtr n = MakeNode(NodeKind::kFor, pos);
  ASSIGN_OR_RETURN(n->x, ExpressionSequence(true));
  if (n->x->kind != NodeKind::kIdentifier && n->x->kind != NodeKind::kTuple) {
    return ErrorAt(n->x->pos,
                   "expected a name or a tuple of names to loop over");
  }
  if (!IsIdentifier("in"))
    return Error("expected 'in' after the loop variable");
  ++cur_;
  ASSIGN_OR_RETURN(n->y, Expression());
  RETURN_IF_ERROR(Expect(TokenType::kCloseStatement));
  RETURN_IF_ERROR(Body({"endfor", "else"}, &n->a));
  if (IsStatement({"else"})) {
    cur_ += 2;
    RETURN_IF_ERROR(Expect(TokenType::kCloseStatement));
    RETURN_IF_ERROR(Body({"endfor"}, &n->b));
  }
  return n;
}

absl::StatusOr<NodePtr> Parser::CallBlock(uint32_t pos) {
  NodePtr n = MakeNode(NodeKind::kCallBlock, pos);
  if (Is(TokenType::kOpenParen)) {
    RETURN_IF_ERROR(Args(ArgsMode::kParameters, &n->a));
  }
  ASSIGN_OR_RETURN(NodePtr callee, Primary());
  if (callee->kind != NodeKind::kIdentifier) {
    return ErrorAt(callee->pos, "expected a name after 'call'");
  }
  NodePtr call = MakeNode(NodeKind::kCall, callee->pos);
  call->x = std::move(callee);
  RETURN_IF_ERROR(Args(ArgsMode::kCall, &call->a));
  n->x = std::move(call);
  RETURN_IF_ERROR(Expect(TokenType::kCloseStatement));
  RETURN_IF_ERROR(Body({"endcall"}, &n->b));
  RETURN_IF_ERROR(ExpectEndTag("endcall"));
  return n;
}

absl::StatusOr<NodePtr> Parser::FilterBlock(uint32_t pos) {
  NodePtr n = MakeNode(NodeKind::kFilterBlock, pos);
  ASSIGN_OR_RETURN(NodePtr filter, Primary());
  if (filter->kind == NodeKind::kIdentifier && Is(TokenType::kOpenParen)) {
    ASSIGN_OR_RETURN(filter, CallExpression(std::move(filter)));
  }
  n->x = std::move(filter);
  RETURN_IF_ERROR(Expect(TokenType::kCloseStatement));
  RETURN_IF_ERROR(Body({"endfilter"}, &n->a));
  RETURN_IF_ERROR(ExpectEndTag("endfilter"));
  return n;
}

absl::StatusOr<NodePtr> Parser::ExpressionSequence(bool primary) {
  const uint32_t pos = Pos();
  std::vector<NodePtr> exprs;
  ASSIGN_OR_RETURN(NodePtr first, primary ? Primary() : Expression());
  exprs.push_back(std::move(first));
  const bool is_tuple = Is(TokenType::kComma);
  while (is_tuple) {
    ++cur_;
    ASSIGN_OR_RETURN(NodePtr next, primary ? Primary() : Expression());
    exprs.push_back(std::move(next));
    if (!Is(TokenType::kComma)) break;
  }
  if (!is_tuple) return std::move(exprs[0]);
  NodePtr tuple = MakeNode(NodeKind::kTuple, pos);
  tuple->a = std::move(exprs);
  return tuple;
}

absl::StatusOr<NodePtr> Parser::Expression() {
  Depth d(this);
  if (!d.ok()) return TooDeep();
  return IfExpression();
}

absl::StatusOr<NodePtr> Parser::IfExpression() {
  Depth d(this);
  if (!d.ok()) return TooDeep();
  ASSIGN_OR_RETURN(NodePtr a, LogicalOr());
  if (!IsIdentifier("if")) return a;
  const uint32_t pos = Pos();
  ++cur_;
  ASSIGN_OR_RETURN(NodePtr test, LogicalOr());
  if (IsIdentifier("else")) {
    ++cur_;
    NodePtr n = MakeNode(NodeKind::kTernary, pos);
    n->x = std::move(test);
    n->y = std::move(a);
    ASSIGN_OR_RETURN(n->z, IfExpression());
    return n;
  }
  NodePtr n = MakeNode(NodeKind::kSelect, pos);
  n->x = std::move(a);
  n->y = std::move(test);
  return n;
}

absl::StatusOr<NodePtr> Parser::LogicalOr() {
  return Chain([this] { return LogicalAnd(); },
               [this] { return TakeKeyword("or"); });
}

absl::StatusOr<NodePtr> Parser::LogicalAnd() {
  return Chain([this] { return LogicalNot(); },
               [this] { return TakeKeyword("and"); });
}

absl::StatusOr<NodePtr> Parser::LogicalNot() {
  Depth d(this);
  if (!d.ok()) return TooDeep();
  NodePtr right;
  // As in the JavaScript parser, a second `not` after the operand replaces
  // the first expression.
  while (IsIdentifier("not")) {
    const uint32_t pos = Pos();
    ++cur_;
    ASSIGN_OR_RETURN(NodePtr arg, LogicalNot());
    right = MakeNode(NodeKind::kUnary, pos);
    right->str = "not";
    right->x = std::move(arg);
  }
  if (right) return right;
  return Comparison();
}

absl::StatusOr<NodePtr> Parser::Comparison() {
  // `in`, `not in` and the comparisons share one precedence level.
  return Chain([this] { return Additive(); },
               [this]() -> std::string {
                 if (IsIdentifier("not") && IsIdentifier("in", 1)) {
                   cur_ += 2;
                   return "not in";
                 }
                 if (IsIdentifier("in")) return TakeKeyword("in");
                 return TakeOperator(TokenType::kComparison);
               });
}

absl::StatusOr<NodePtr> Parser::Additive() {
  return Chain([this] { return Multiplicative(); },
               [this] { return TakeOperator(TokenType::kAdditive); });
}

absl::StatusOr<NodePtr> Parser::Multiplicative() {
  return Chain([this] { return Power(); },
               [this] { return TakeOperator(TokenType::kMultiplicative); });
}

absl::StatusOr<NodePtr> Parser::Power() {
  // Left-associative, as in Jinja2: 2 ** 3 ** 2 == (2 ** 3) ** 2.
  return Chain([this] { return TestExpr(); },
               [this] { return TakeOperator(TokenType::kExponent); });
}

absl::StatusOr<NodePtr> Parser::TestExpr() {
  ASSIGN_OR_RETURN(NodePtr operand, FilterExpr());
  while (IsIdentifier("is")) {
    const uint32_t pos = Pos();
    ++cur_;
    const bool negate = IsIdentifier("not");
    if (negate) ++cur_;
    ASSIGN_OR_RETURN(NodePtr test, Primary());
    if (test->kind != NodeKind::kIdentifier) {
      return ErrorAt(test->pos, "expected the name of a test after 'is'");
    }
    NodePtr n = MakeNode(NodeKind::kTest, pos);
    n->x = std::move(operand);
    n->str = test->str;
    n->flag = negate;
    operand = std::move(n);
  }
  return operand;
}

absl::StatusOr<NodePtr> Parser::FilterExpr() {
  ASSIGN_OR_RETURN(NodePtr operand, UnarySign());
  while (Is(TokenType::kPipe)) {
    const uint32_t pos = Pos();
    ++cur_;
    ASSIGN_OR_RETURN(NodePtr filter, Primary());
    if (filter->kind != NodeKind::kIdentifier) {
      return ErrorAt(filter->pos, "expected the name of a filter after '|'");
    }
    if (Is(TokenType::kOpenParen)) {
      ASSIGN_OR_RETURN(filter, CallExpression(std::move(filter)));
    }
    NodePtr n = MakeNode(NodeKind::kFilter, pos);
    n->x = std::move(operand);
    n->y = std::move(filter);
    operand = std::move(n);
  }
  return operand;
}

absl::StatusOr<NodePtr> Parser::UnarySign() {
  Depth d(this);
  if (!d.ok()) return TooDeep();
  const Token* tok = Peek();
  if (tok != nullptr &&
      (tok->type == TokenType::kUnary || tok->type == TokenType::kAdditive) &&
      (tok->value == "-" || tok->value == "+")) {
    ++cur_;
    NodePtr n = MakeNode(NodeKind::kUnary, tok->pos);
    n->str = tok->value;
    ASSIGN_OR_RETURN(n->x, UnarySign());
    return n;
  }
  return CallMember();
}

absl::StatusOr<NodePtr> Parser::CallMember() {
  ASSIGN_OR_RETURN(NodePtr primary, Primary());
  ASSIGN_OR_RETURN(NodePtr member, Member(std::move(primary)));
  if (Is(TokenType::kOpenParen)) return CallExpression(std::move(member));
  return member;
}

absl::StatusOr<NodePtr> Parser::CallExpression(NodePtr callee) {
  Depth d(this);
  if (!d.ok()) return TooDeep();
  NodePtr call = MakeNode(NodeKind::kCall, Pos());
  call->x = std::move(callee);
  RETURN_IF_ERROR(Args(ArgsMode::kCall, &call->a));
  ASSIGN_OR_RETURN(NodePtr expr, Member(std::move(call)));
  if (Is(TokenType::kOpenParen)) return CallExpression(std::move(expr));
  return expr;
}

absl::Status Parser::Args(ArgsMode mode, std::vector<NodePtr>* out) {
  RETURN_IF_ERROR(Expect(TokenType::kOpenParen));
  absl::flat_hash_set<std::string> names;
  bool saw_keyword = false;
  bool saw_spread = false;
  const bool params = mode == ArgsMode::kParameters;
  while (!Is(TokenType::kCloseParen)) {
    const uint32_t pos = Pos();
    const bool kw_spread = Is(TokenType::kExponent);
    const bool spread = Is(TokenType::kMultiplicative) && t_[cur_].value == "*";
    if (params && (kw_spread || spread)) {
      return Error("argument unpacking is not allowed in parameters");
    }
    if (kw_spread) {
      ++cur_;
      NodePtr n = MakeNode(NodeKind::kKwSpread, pos);
      ASSIGN_OR_RETURN(n->x, Expression());
      out->push_back(std::move(n));
      if (Is(TokenType::kComma)) ++cur_;
      if (!Is(TokenType::kCloseParen)) {
        return Error("'**' must be applied to the last argument");
      }
      break;
    }
    NodePtr arg;
    if (spread) {
      if (saw_spread) return Error("only one '*' argument is allowed");
      saw_spread = true;
      ++cur_;
      arg = MakeNode(NodeKind::kSpread, pos);
      ASSIGN_OR_RETURN(arg->x, Expression());
    } else {
      ASSIGN_OR_RETURN(arg, Expression());
      if (Is(TokenType::kEquals)) {
        ++cur_;
        if (arg->kind != NodeKind::kIdentifier) {
          return ErrorAt(arg->pos, "expected a name before '='");
        }
        NodePtr kw = MakeNode(NodeKind::kKeywordArg, arg->pos);
        kw->str = arg->str;
        ASSIGN_OR_RETURN(kw->x, Expression());
        arg = std::move(kw);
      }
      if (params) {
        if (arg->kind != NodeKind::kIdentifier &&
            arg->kind != NodeKind::kKeywordArg) {
          return ErrorAt(arg->pos, "expected a parameter name");
        }
        if (!names.insert(arg->str).second) {
          return ErrorAt(arg->pos,
                         absl::StrCat("duplicate parameter '", arg->str, "'"));
        }
      }
      if (arg->kind == NodeKind::kKeywordArg) {
        saw_keyword = true;
      } else if (saw_keyword) {
        return ErrorAt(arg->pos, params
                                     ? "a parameter without a default follows "
                                       "one with a default"
                                     : "a positional argument follows a "
                                       "keyword argument");
      } else if (saw_spread) {
        return ErrorAt(arg->pos, "a positional argument follows '*'");
      }
    }
    out->push_back(std::move(arg));
    if (Is(TokenType::kComma)) ++cur_;
  }
  return Expect(TokenType::kCloseParen);
}

absl::StatusOr<NodePtr> Parser::MemberArgs() {
  const uint32_t pos = Pos();
  std::vector<NodePtr> slices;
  bool is_slice = false;
  while (!Is(TokenType::kCloseSquare)) {
    if (Is(TokenType::kColon)) {
      slices.push_back(nullptr);
      ++cur_;
      is_slice = true;
    } else {
      ASSIGN_OR_RETURN(NodePtr e, Expression());
      slices.push_back(std::move(e));
      if (Is(TokenType::kColon)) {
        ++cur_;
        is_slice = true;
      }
    }
  }
  if (slices.empty()) return Error("expected an index or a slice in []");
  if (!is_slice) return std::move(slices[0]);
  if (slices.size() > 3) return ErrorAt(pos, "a slice takes at most 3 parts");
  NodePtr n = MakeNode(NodeKind::kSlice, pos);
  n->x = std::move(slices[0]);
  if (slices.size() > 1) n->y = std::move(slices[1]);
  if (slices.size() > 2) n->z = std::move(slices[2]);
  return n;
}

absl::StatusOr<NodePtr> Parser::Member(NodePtr object) {
  while (Is(TokenType::kDot) || Is(TokenType::kOpenSquare)) {
    const uint32_t pos = Pos();
    const bool computed = Is(TokenType::kOpenSquare);
    ++cur_;
    NodePtr n = MakeNode(NodeKind::kMember, pos);
    n->flag = computed;
    if (computed) {
      ASSIGN_OR_RETURN(n->y, MemberArgs());
      RETURN_IF_ERROR(Expect(TokenType::kCloseSquare));
    } else {
      ASSIGN_OR_RETURN(n->y, Primary());
      if (n->y->kind != NodeKind::kIdentifier &&
          n->y->kind != NodeKind::kIntLiteral) {
        return ErrorAt(n->y->pos, "expected a name or an integer after '.'");
      }
    }
    n->x = std::move(object);
    object = std::move(n);
  }
  return object;
}

absl::StatusOr<NodePtr> Parser::Primary() {
  Depth d(this);
  if (!d.ok()) return TooDeep();
  const Token* tok = Peek();
  if (tok == nullptr) return Error("expected an expression");
  ++cur_;
  switch (tok->type) {
    case TokenType::kNumeric: {
      const bool is_float = tok->value.find('.') != std::string::npos;
      NodePtr n = MakeNode(
          is_float ? NodeKind::kFloatLiteral : NodeKind::kIntLiteral, tok->pos);
      n->num = std::strtod(tok->value.c_str(), nullptr);
      return n;
    }
    case TokenType::kString: {
      NodePtr n = MakeNode(NodeKind::kStringLiteral, tok->pos);
      n->str = tok->value;
      while (Is(TokenType::kString)) n->str += t_[cur_++].value;
      return n;
    }
    case TokenType::kIdentifier: {
      NodePtr n = MakeNode(NodeKind::kIdentifier, tok->pos);
      n->str = tok->value;
      return n;
    }
    case TokenType::kOpenParen: {
      ASSIGN_OR_RETURN(NodePtr e, ExpressionSequence(false));
      RETURN_IF_ERROR(Expect(TokenType::kCloseParen));
      return e;
    }
    case TokenType::kOpenSquare: {
      NodePtr n = MakeNode(NodeKind::kArray, tok->pos);
      while (!Is(TokenType::kCloseSquare)) {
        ASSIGN_OR_RETURN(NodePtr e, Expression());
        n->a.push_back(std::move(e));
        if (Is(TokenType::kComma)) ++cur_;
      }
      ++cur_;
      return n;
    }
    case TokenType::kOpenCurly: {
      NodePtr n = MakeNode(NodeKind::kObject, tok->pos);
      while (!Is(TokenType::kCloseCurly)) {
        ASSIGN_OR_RETURN(NodePtr key, Expression());
        RETURN_IF_ERROR(Expect(TokenType::kColon));
        ASSIGN_OR_RETURN(NodePtr value, Expression());
        n->a.push_back(std::move(key));
        n->b.push_back(std::move(value));
        if (Is(TokenType::kComma)) ++cur_;
      }
      ++cur_;
      return n;
    }
    default:
      --cur_;
      return Error("expected an expression");
  }
}

}  // namespace

absl::StatusOr<NodePtr> Parse(const std::vector<Token>& tokens,
                              absl::string_view source) {
  Parser parser(tokens, source);
  return parser.Program();
}

}  // namespace swaserve::model::jinja
