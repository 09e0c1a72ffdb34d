#include "lib/model/jinja/interpreter.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "lib/base/status.h"
#include "lib/model/jinja/builtins_internal.h"
#include "lib/model/jinja/js_text.h"
#include "lib/model/jinja/lexer.h"

namespace swaserve::model::jinja {

bool IsObjectLike(const Value& v) {
  switch (v.kind()) {
    case Kind::kList:
    case Kind::kTuple:
    case Kind::kDict:
    case Kind::kKwargs:
    case Kind::kNamespace:
    case Kind::kFunction:
      return true;
    default:
      return false;
  }
}

bool StrictEquals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) return a.number() == b.number();
  const bool a_nullish = a.is_none() || a.is_undefined();
  const bool b_nullish = b.is_none() || b.is_undefined();
  if (a_nullish || b_nullish) return a_nullish && b_nullish;
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Kind::kBool:
      return a.boolean() == b.boolean();
    case Kind::kString:
      return a.text().str() == b.text().str();
    default:
      return a.identity() == b.identity();
  }
}

namespace {

// Marks macro bodies that read `kwargs` / `varargs` (filter and attribute
// names are not reads).
void ScanSpecial(const Node& n, bool* kwargs, bool* varargs) {
  if (n.kind == NodeKind::kIdentifier) {
    if (n.str == "kwargs") *kwargs = true;
    if (n.str == "varargs") *varargs = true;
    return;
  }
  auto visit = [&](const NodePtr& c) {
    if (c) ScanSpecial(*c, kwargs, varargs);
  };
  if (n.kind == NodeKind::kFilter || n.kind == NodeKind::kFilterBlock) {
    const Node* filter = n.kind == NodeKind::kFilter ? n.y.get() : n.x.get();
    if (n.kind == NodeKind::kFilter) visit(n.x);
    if (filter->kind == NodeKind::kCall) {
      for (const NodePtr& c : filter->a) visit(c);
    }
    for (const NodePtr& c : n.a) visit(c);
    return;
  }
  visit(n.x);
  if (!(n.kind == NodeKind::kMember && !n.flag)) visit(n.y);
  visit(n.z);
  for (const NodePtr& c : n.a) visit(c);
  for (const NodePtr& c : n.b) visit(c);
}

}  // namespace

const Value* Env::Find(absl::string_view name) const {
  for (const Env* e = this; e != nullptr; e = e->parent_) {
    const auto it = e->vars_.find(name);
    if (it != e->vars_.end()) return &it->second;
  }
  return nullptr;
}

void Env::Set(absl::string_view name, Value v) {
  vars_.insert_or_assign(std::string(name), std::move(v));
}

Interpreter::~Interpreter() {
  for (const auto& ns : namespaces_) {
    ns->entries.clear();
    ns->index.clear();
  }
}

absl::Status Interpreter::Error(uint32_t pos, absl::string_view what) const {
  return absl::InvalidArgumentError(
      absl::StrCat(DescribePosition(source_, pos), ": ", what));
}
absl::Status Interpreter::Error(const Node& n, absl::string_view what) const {
  return Error(n.pos, what);
}

absl::Status Interpreter::CheckNotMissing(const Node& n, const Value& v) const {
  if (!v.is_missing()) return absl::OkStatus();
  return Error(n, "the result of first/last of an empty list is used");
}

absl::Status Interpreter::CheckSize(uint32_t pos, size_t size) const {
  if (size <= limits_.max_string_bytes) return absl::OkStatus();
  return Error(
      pos, absl::StrCat("a string of ", size, " bytes is over the limit of ",
                        limits_.max_string_bytes));
}

absl::Status Interpreter::Produced(uint32_t pos, size_t size, size_t added) {
  RETURN_IF_ERROR(CheckSize(pos, size));
  work_bytes_ += added;
  if (work_bytes_ > limits_.max_work_bytes) {
    return Error(
        pos, absl::StrCat("the render built more than ", limits_.max_work_bytes,
                          " bytes of strings"));
  }
  return absl::OkStatus();
}

absl::Status Interpreter::Step(uint32_t pos) {
  if (++steps_ > limits_.max_steps) {
    return Error(pos, absl::StrCat("more than ", limits_.max_steps,
                                   " loop iterations and macro calls"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Value> Interpreter::MakeList(uint32_t pos,
                                            std::vector<Value> items,
                                            Kind kind) {
  if (items.size() > limits_.max_list_items) {
    return Error(pos, absl::StrCat("a list of ", items.size(),
                                   " items is over the limit of ",
                                   limits_.max_list_items));
  }
  Value v = Value::List(std::move(items), kind);
  if (v.depth() > limits_.max_value_depth) {
    return Error(pos, absl::StrCat("values nest deeper than ",
                                   limits_.max_value_depth, " levels"));
  }
  return v;
}

absl::StatusOr<Value> Interpreter::MakeDict(uint32_t pos,
                                            std::shared_ptr<DictData> d,
                                            Kind kind) {
  if (d->size() > limits_.max_list_items) {
    return Error(
        pos, absl::StrCat("a dict of ", d->size(), " items is over the limit"));
  }
  const bool is_namespace = kind == Kind::kNamespace;
  Value v = Value::Dict(std::move(d), kind);
  if (v.depth() > limits_.max_value_depth) {
    return Error(pos, absl::StrCat("values nest deeper than ",
                                   limits_.max_value_depth, " levels"));
  }
  if (is_namespace) namespaces_.push_back(v.dict_ptr());
  return v;
}

absl::StatusOr<Value> Interpreter::MakeString(uint32_t pos, Text t) {
  RETURN_IF_ERROR(Produced(pos, t.size(), t.size()));
  return Value::Str(std::move(t));
}

absl::StatusOr<Text> Interpreter::Run(const Node& program, Env* root) {
  Text out;
  RETURN_IF_ERROR(Block(program.a, root, &out));
  if (jump_ != Jump::kNone) {
    return Error(program.pos, "{% break %} or {% continue %} outside a loop");
  }
  return out;
}

absl::Status Interpreter::Block(const std::vector<NodePtr>& body, Env* env,
                                Text* out) {
  for (const NodePtr& n : body) {
    RETURN_IF_ERROR(Statement(*n, env, out));
    if (jump_ != Jump::kNone) break;
  }
  return absl::OkStatus();
}

absl::Status Interpreter::Statement(const Node& n, Env* env, Text* out) {
  Value printed;
  switch (n.kind) {
    case NodeKind::kText:
      RETURN_IF_ERROR(
          Produced(n.pos, out->size() + n.str.size(), n.str.size()));
      out->Append(n.str);
      return absl::OkStatus();
    case NodeKind::kComment:
      return absl::OkStatus();
    case NodeKind::kIf: {
      ASSIGN_OR_RETURN(const Value test, Eval(*n.x, env));
      RETURN_IF_ERROR(CheckNotMissing(*n.x, test));
      return Block(test.Truthy() ? n.a : n.b, env, out);
    }
    case NodeKind::kFor:
      return For(n, env, out);
    case NodeKind::kBreak:
      jump_ = Jump::kBreak;
      return absl::OkStatus();
    case NodeKind::kContinue:
      jump_ = Jump::kContinue;
      return absl::OkStatus();
    case NodeKind::kSet:
      return Set(n, env);
    case NodeKind::kMacro:
      return DefineMacro(n, env);
    case NodeKind::kCallBlock: {
      ASSIGN_OR_RETURN(printed, CallBlock(n, env));
      break;
    }
    case NodeKind::kFilterBlock: {
      Text body;
      RETURN_IF_ERROR(Block(n.a, env, &body));
      if (jump_ != Jump::kNone) return absl::OkStatus();
      pos_ = n.pos;
      ASSIGN_OR_RETURN(printed,
                       ApplyFilter(Value::Str(std::move(body)), *n.x, env));
      break;
    }
    default: {
      ASSIGN_OR_RETURN(printed, Eval(n, env));
      break;
    }
  }
  RETURN_IF_ERROR(CheckNotMissing(n, printed));
  if (printed.is_none() || printed.is_undefined()) return absl::OkStatus();
  pos_ = n.pos;
  ASSIGN_OR_RETURN(const Text t, Print(printed));
  RETURN_IF_ERROR(Produced(n.pos, out->size() + t.size(), t.size()));
  out->Append(t);
  return absl::OkStatus();
}

absl::StatusOr<Value> Interpreter::Eval(const Node& n, Env* env) {
  switch (n.kind) {
    case NodeKind::kIntLiteral:
      return Value::Int(n.num);
    case NodeKind::kFloatLiteral:
      return Value::Float(n.num);
    case NodeKind::kStringLiteral:
    case NodeKind::kText:
      return MakeString(n.pos, Text(n.str));
    case NodeKind::kArray:
    case NodeKind::kTuple:
    case NodeKind::kObject:
      return EvalLiteral(n, env);
    case NodeKind::kIdentifier: {
      const Value* v = env->Find(n.str);
      return v == nullptr || v->is_missing() ? Value() : *v;
    }
    case NodeKind::kCall:
      return EvalCall(n, env);
    case NodeKind::kMember:
      return EvalMember(n, env);
    case NodeKind::kUnary:
      return EvalUnary(n, env);
    case NodeKind::kBinary:
      return EvalBinary(n, env);
    case NodeKind::kFilter: {
      ASSIGN_OR_RETURN(const Value operand, Eval(*n.x, env));
      pos_ = n.pos;
      return ApplyFilter(operand, *n.y, env);
    }
    case NodeKind::kTest: {
      ASSIGN_OR_RETURN(const Value operand, Eval(*n.x, env));
      if (operand.is_missing() && n.str == "callable")
        return Value::Bool(n.flag);
      RETURN_IF_ERROR(CheckNotMissing(n, operand));
      return ApplyTest(n, operand);
    }
    case NodeKind::kSelect: {
      ASSIGN_OR_RETURN(const Value test, Eval(*n.y, env));
      RETURN_IF_ERROR(CheckNotMissing(*n.y, test));
      if (!test.Truthy()) return Value();
      return Eval(*n.x, env);
    }
    case NodeKind::kTernary: {
      ASSIGN_OR_RETURN(const Value cond, Eval(*n.x, env));
      RETURN_IF_ERROR(CheckNotMissing(*n.x, cond));
      return Eval(cond.Truthy() ? *n.y : *n.z, env);
    }
    default:
      return Error(n, "this statement cannot be used as an expression");
  }
}

absl::StatusOr<Value> Interpreter::EvalLiteral(const Node& n, Env* env) {
  if (n.kind == NodeKind::kObject) {
    auto d = std::make_shared<DictData>();
    for (size_t i = 0; i < n.a.size(); ++i) {
      ASSIGN_OR_RETURN(const Value key, Eval(*n.a[i], env));
      if (!key.is_string()) {
        return Error(*n.a[i], absl::StrCat("dict keys must be strings, got ",
                                           key.TypeName()));
      }
      ASSIGN_OR_RETURN(Value value, Eval(*n.b[i], env));
      d->Set(key.text(), std::move(value));
    }
    return MakeDict(n.pos, std::move(d));
  }
  std::vector<Value> items;
  items.reserve(n.a.size());
  for (const NodePtr& e : n.a) {
    ASSIGN_OR_RETURN(Value v, Eval(*e, env));
    items.push_back(std::move(v));
  }
  return MakeList(n.pos, std::move(items),
                  n.kind == NodeKind::kTuple ? Kind::kTuple : Kind::kList);
}

absl::Status Interpreter::EvalArguments(const std::vector<NodePtr>& args,
                                        Env* env,
                                        std::vector<Value>* positional,
                                        std::shared_ptr<DictData>* keywords) {
  for (const NodePtr& a : args) {
    if (a->kind == NodeKind::kSpread) {
      ASSIGN_OR_RETURN(const Value v, Eval(*a->x, env));
      if (!v.is_list_like()) {
        return Error(*a, absl::StrCat("cannot unpack ", v.TypeName()));
      }
      for (const Value& item : v.items()) positional->push_back(item);
    } else if (a->kind != NodeKind::kKeywordArg &&
               a->kind != NodeKind::kKwSpread) {
      ASSIGN_OR_RETURN(Value v, Eval(*a, env));
      positional->push_back(std::move(v));
    }
  }
  auto add = [&](const Node& at, const Text& key, Value v) -> absl::Status {
    if (*keywords == nullptr) *keywords = std::make_shared<DictData>();
    if ((*keywords)->Find(key.str()) != nullptr) {
      return Error(
          at, absl::StrCat("keyword argument '", key.str(), "' given twice"));
    }
    (*keywords)->Set(key, std::move(v));
    return absl::OkStatus();
  };
  for (const NodePtr& a : args) {
    if (a->kind == NodeKind::kKeywordArg) {
      ASSIGN_OR_RETURN(Value v, Eval(*a->x, env));
      RETURN_IF_ERROR(add(*a, Text(a->str), std::move(v)));
    } else if (a->kind == NodeKind::kKwSpread) {
      ASSIGN_OR_RETURN(const Value v, Eval(*a->x, env));
      if (!v.is_object()) {
        return Error(*a, absl::StrCat("the argument after ** must be a "
                                      "mapping, not ",
                                      v.TypeName()));
      }
      for (const auto& [key, value] : v.dict().entries) {
        RETURN_IF_ERROR(add(*a, key, value));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Value> Interpreter::EvalCall(const Node& n, Env* env) {
  std::vector<Value> args;
  std::shared_ptr<DictData> keywords;
  RETURN_IF_ERROR(EvalArguments(n.a, env, &args, &keywords));
  if (keywords != nullptr) {
    ASSIGN_OR_RETURN(Value kw, MakeDict(n.pos, keywords, Kind::kKwargs));
    args.push_back(std::move(kw));
  }
  ASSIGN_OR_RETURN(const Value fn, Eval(*n.x, env));
  if (fn.kind() != Kind::kFunction) {
    return Error(n, absl::StrCat("cannot call a ", fn.TypeName(),
                                 " (it is not a function)"));
  }
  pos_ = n.pos;
  return fn.function().fn(args, env);
}

absl::StatusOr<Value> Interpreter::EvalMember(const Node& n, Env* env) {
  ASSIGN_OR_RETURN(const Value object, Eval(*n.x, env));
  RETURN_IF_ERROR(CheckNotMissing(*n.x, object));
  Value property;
  if (n.flag) {
    if (n.y->kind == NodeKind::kSlice) return EvalSlice(*n.y, object, env);
    ASSIGN_OR_RETURN(property, Eval(*n.y, env));
  } else if (n.y->kind == NodeKind::kIntLiteral) {
    property = Value::Int(n.y->num);
  } else {
    property = Value::Str(Text(n.y->str));
  }
  pos_ = n.pos;
  if (object.has_attrs()) {
    if (!property.is_string()) {
      return Error(n, absl::StrCat("cannot look up a ", property.TypeName(),
                                   " key in a ", object.TypeName()));
    }
    const Value* v = object.dict().Find(property.text().str());
    if (v != nullptr && !v->is_missing()) return *v;
    if (object.is_object()) return Builtin(object, property.text().str());
    return Value();
  }
  if (object.is_list_like() || object.is_string()) {
    if (property.kind() == Kind::kInt) {
      double index = property.number();
      if (std::isnan(index)) index = 0;
      if (std::isinf(index)) return Value();
      if (object.is_list_like()) {
        const auto& items = object.items();
        const auto size = static_cast<double>(items.size());
        if (index < 0) index += size;
        if (index < 0 || index >= size) return Value();
        const Value& item = items[static_cast<size_t>(index)];
        return item.is_missing() ? Value() : item;
      }
      const Text& t = object.text();
      size_t b;
      size_t e;
      bool lone;
      if (std::fabs(index) > 1e15 ||
          !Utf16At(t.str(), static_cast<int64_t>(index), &b, &e, &lone)) {
        return Value();
      }
      if (lone) return Value::Str(t.Substr(b, e).Derived("\xEF\xBF\xBD"));
      return Value::Str(t.Substr(b, e));
    }
    if (property.is_string()) return Builtin(object, property.text().str());
    return Error(n, absl::StrCat("cannot index a ", object.TypeName(),
                                 " with a ", property.TypeName()));
  }
  if (!property.is_string()) {
    return Error(n, absl::StrCat("cannot look up a ", property.TypeName(),
                                 " in a ", object.TypeName()));
  }
  return Builtin(object, property.text().str());
}

absl::StatusOr<Value> Interpreter::EvalSlice(const Node& n, const Value& object,
                                             Env* env) {
  if (!object.is_list_like() && !object.is_string()) {
    return Error(n, absl::StrCat("cannot slice a ", object.TypeName()));
  }
  double parts[3] = {0, 0, 1};
  bool given[3] = {false, false, false};
  const Node* nodes[3] = {n.x.get(), n.y.get(), n.z.get()};
  for (int i = 0; i < 3; ++i) {
    if (nodes[i] == nullptr) continue;
    ASSIGN_OR_RETURN(const Value v, Eval(*nodes[i], env));
    if (v.is_undefined()) continue;
    if (v.kind() != Kind::kInt || !std::isfinite(v.number())) {
      return Error(*nodes[i], "slice bounds must be integers");
    }
    parts[i] = v.number();
    given[i] = true;
  }
  // Code point offsets of a string; list indices otherwise.
  std::vector<size_t> offsets;
  if (object.is_string()) {
    const std::string& s = object.text().str();
    for (size_t i = 0; i < s.size(); ++i) {
      if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80)
        offsets.push_back(i);
    }
    offsets.push_back(s.size());
  }
  const double len = object.is_string()
                         ? static_cast<double>(offsets.size() - 1)
                         : static_cast<double>(object.items().size());
  const double step = parts[2];
  const int direction = step > 0 ? 1 : (step < 0 ? -1 : 0);
  double start;
  double stop;
  if (direction >= 0) {
    start = given[0] ? parts[0] : 0;
    start = start < 0 ? std::max(len + start, 0.0) : std::min(start, len);
    stop = given[1] ? parts[1] : len;
    stop = stop < 0 ? std::max(len + stop, 0.0) : std::min(stop, len);
  } else {
    start = given[0] ? parts[0] : len - 1;
    start = start < 0 ? std::max(len + start, -1.0) : std::min(start, len - 1);
    stop = given[1] ? parts[1] : -1;
    stop = stop < -1 ? std::max(len + stop, -1.0) : std::min(stop, len - 1);
  }
  std::vector<int64_t> picked;
  if (direction != 0) {
    for (double i = start; direction * i < direction * stop; i += step) {
      picked.push_back(static_cast<int64_t>(i));
    }
  }
  if (object.is_string()) {
    const Text& t = object.text();
    Text out;
    for (int64_t i : picked) out.AppendRange(t, offsets[i], offsets[i + 1]);
    return MakeString(n.pos, std::move(out));
  }
  std::vector<Value> items;
  items.reserve(picked.size());
  for (int64_t i : picked) items.push_back(object.items()[i]);
  return MakeList(n.pos, std::move(items));
}

absl::StatusOr<Value> Interpreter::EvalUnary(const Node& n, Env* env) {
  ASSIGN_OR_RETURN(const Value arg, Eval(*n.x, env));
  RETURN_IF_ERROR(CheckNotMissing(n, arg));
  if (n.str == "not") return Value::Bool(!arg.Truthy());
  const double sign = n.str == "-" ? -1 : 1;
  if (IsNumericLike(arg)) {
    return Value::Number(sign * NumericValue(arg), arg.kind() == Kind::kFloat);
  }
  return Error(n, absl::StrCat("unary '", n.str, "' on a ", arg.TypeName()));
}

absl::StatusOr<Value> Interpreter::EvalBinary(const Node& n, Env* env) {
  ASSIGN_OR_RETURN(const Value left, Eval(*n.x, env));
  RETURN_IF_ERROR(CheckNotMissing(n, left));
  const std::string& op = n.str;
  if (op == "and") return left.Truthy() ? Eval(*n.y, env) : left;
  if (op == "or") return left.Truthy() ? left : Eval(*n.y, env);
  ASSIGN_OR_RETURN(const Value right, Eval(*n.y, env));
  RETURN_IF_ERROR(CheckNotMissing(n, right));
  pos_ = n.pos;
  if (op == "==" || op == "!=") {
    // JavaScript's loose ==.
    std::function<absl::StatusOr<bool>(const Value&, const Value&)> loose =
        [&](const Value& a, const Value& b) -> absl::StatusOr<bool> {
      const bool a_nullish = a.is_none() || a.is_undefined();
      const bool b_nullish = b.is_none() || b.is_undefined();
      if (a_nullish || b_nullish) return a_nullish && b_nullish;
      const bool a_obj = IsObjectLike(a);
      const bool b_obj = IsObjectLike(b);
      if (a_obj && b_obj) return a.identity() == b.identity();
      if (a_obj || b_obj) {
        const Value& obj = a_obj ? a : b;
        const Value& prim = a_obj ? b : a;
        if (obj.kind() == Kind::kFunction) return false;
        ASSIGN_OR_RETURN(const Text s, RawString(obj));
        return loose(Value::Str(s), prim);
      }
      if (a.kind() == Kind::kBool) return loose(Value::Int(NumericValue(a)), b);
      if (b.kind() == Kind::kBool) return loose(a, Value::Int(NumericValue(b)));
      if (a.is_string() && b.is_string())
        return a.text().str() == b.text().str();
      const double x =
          a.is_string() ? JsStringToNumber(a.text().str()) : a.number();
      const double y =
          b.is_string() ? JsStringToNumber(b.text().str()) : b.number();
      return x == y;
    };
    ASSIGN_OR_RETURN(const bool eq, loose(left, right));
    return Value::Bool(op == "==" ? eq : !eq);
  }
  auto unknown = [&] {
    return Error(n, absl::StrCat("operator '", op, "' is not defined between ",
                                 left.TypeName(), " and ", right.TypeName()));
  };
  if (left.is_undefined() || right.is_undefined()) {
    if (right.is_undefined() && (op == "in" || op == "not in")) {
      return Value::Bool(op == "not in");
    }
    return Error(n, absl::StrCat("operator '", op, "' on an undefined value"));
  }
  if (left.is_none() || right.is_none()) {
    return Error(n, absl::StrCat("operator '", op, "' on none"));
  }
  if (op == "~") {
    ASSIGN_OR_RETURN(Text a, RawString(left));
    ASSIGN_OR_RETURN(const Text b, RawString(right));
    a.Append(b);
    return MakeString(n.pos, std::move(a));
  }
  if (op == "**" && IsNumericLike(left) && IsNumericLike(right)) {
    const double a = NumericValue(left);
    const double b = NumericValue(right);
    if (a == 0 && b < 0)
      return Error(n, "0 cannot be raised to a negative power");
    const double r = std::pow(a, b);
    if (!std::isfinite(r)) return Error(n, "the power is not a finite number");
    return Value::Number(r, left.kind() == Kind::kFloat ||
                                right.kind() == Kind::kFloat || b < 0);
  }
  if (left.is_number() && right.is_number()) {
    const double a = left.number();
    const double b = right.number();
    const bool is_float =
        left.kind() == Kind::kFloat || right.kind() == Kind::kFloat;
    if (op == "+") return Value::Number(a + b, is_float);
    if (op == "-") return Value::Number(a - b, is_float);
    if (op == "*") return Value::Number(a * b, is_float);
    if (op == "/") return Value::Float(a / b);
    if (op == "//") return Value::Number(std::floor(a / b), is_float);
    if (op == "%") return Value::Number(std::fmod(a, b), is_float);
    if (op == "<") return Value::Bool(a < b);
    if (op == ">") return Value::Bool(a > b);
    if (op == ">=") return Value::Bool(a >= b);
    if (op == "<=") return Value::Bool(a <= b);
  } else if (left.is_list_like() && right.is_list_like()) {
    if (op == "+") {
      std::vector<Value> items = left.items();
      items.insert(items.end(), right.items().begin(), right.items().end());
      return MakeList(n.pos, std::move(items));
    }
  } else if (right.is_list_like()) {
    if (op == "in" || op == "not in") {
      bool member = false;
      for (const Value& x : right.items()) {
        if (StrictEquals(x, left)) {
          member = true;
          break;
        }
      }
      return Value::Bool(op == "in" ? member : !member);
    }
  }
  if ((left.is_string() || right.is_string()) && op == "+") {
    ASSIGN_OR_RETURN(Text a, RawString(left));
    ASSIGN_OR_RETURN(const Text b, RawString(right));
    a.Append(b);
    return MakeString(n.pos, std::move(a));
  }
  if (left.is_string() && right.is_string() && (op == "in" || op == "not in")) {
    const bool has =
        right.text().str().find(left.text().str()) != std::string::npos;
    return Value::Bool(op == "in" ? has : !has);
  }
  if (left.is_string() && right.is_object() && (op == "in" || op == "not in")) {
    const bool has = right.dict().Find(left.text().str()) != nullptr;
    return Value::Bool(op == "in" ? has : !has);
  }
  return unknown();
}

absl::Status Interpreter::Set(const Node& n, Env* env) {
  Value rhs;
  if (n.y) {
    ASSIGN_OR_RETURN(rhs, Eval(*n.y, env));
  } else {
    Text body;
    RETURN_IF_ERROR(Block(n.a, env, &body));
    if (jump_ != Jump::kNone) return absl::OkStatus();
    rhs = Value::Str(std::move(body));
  }
  const Node& target = *n.x;
  switch (target.kind) {
    case NodeKind::kIdentifier:
      env->Set(target.str, std::move(rhs));
      return absl::OkStatus();
    case NodeKind::kTuple: {
      if (!rhs.is_list_like()) {
        return Error(n, absl::StrCat("cannot unpack a ", rhs.TypeName()));
      }
      if (rhs.items().size() != target.a.size()) {
        return Error(n,
                     absl::StrCat("cannot unpack ", rhs.items().size(),
                                  " values into ", target.a.size(), " names"));
      }
      for (size_t i = 0; i < target.a.size(); ++i) {
        if (target.a[i]->kind != NodeKind::kIdentifier) {
          return Error(*target.a[i], "can only unpack into names");
        }
        env->Set(target.a[i]->str, rhs.items()[i]);
      }
      return absl::OkStatus();
    }
    case NodeKind::kMember: {
      ASSIGN_OR_RETURN(const Value object, Eval(*target.x, env));
      if (object.kind() != Kind::kNamespace) {
        return Error(target,
                     absl::StrCat("cannot set an attribute of a ",
                                  object.TypeName(), " (only of a namespace)"));
      }
      if (target.y->kind != NodeKind::kIdentifier) {
        return Error(target, "an attribute name is required");
      }
      DictData& d = object.mutable_dict();
      d.depth = std::max(d.depth, rhs.depth() + 1);
      if (d.depth > limits_.max_value_depth) {
        return Error(target, absl::StrCat("values nest deeper than ",
                                          limits_.max_value_depth, " levels"));
      }
      d.Set(Text(target.y->str), std::move(rhs));
      return absl::OkStatus();
    }
    default:
      return Error(target, "cannot assign to this expression");
  }
}

absl::Status Interpreter::For(const Node& n, Env* env, Text* out) {
  Env scope(env);
  const Node* test = nullptr;
  Value iterable;
  if (n.y->kind == NodeKind::kSelect) {
    ASSIGN_OR_RETURN(iterable, Eval(*n.y->x, &scope));
    test = n.y->y.get();
  } else {
    ASSIGN_OR_RETURN(iterable, Eval(*n.y, &scope));
  }
  RETURN_IF_ERROR(CheckNotMissing(*n.y, iterable));
  if (iterable.is_object()) {
    ASSIGN_OR_RETURN(const Value keys, Builtin(iterable, "keys"));
    std::vector<Value> args;
    ASSIGN_OR_RETURN(iterable, keys.function().fn(args, env));
  } else if (!iterable.is_list_like()) {
    return Error(*n.y,
                 absl::StrCat("cannot loop over a ", iterable.TypeName()));
  }
  const Node& target = *n.x;
  auto assign = [&](const Value& item, Env* into) -> absl::Status {
    if (target.kind == NodeKind::kIdentifier) {
      into->Set(target.str, item);
      return absl::OkStatus();
    }
    for (size_t j = 0; j < target.a.size(); ++j) {
      if (target.a[j]->kind != NodeKind::kIdentifier) {
        return Error(*target.a[j], "can only unpack into names");
      }
      into->Set(target.a[j]->str, item.items()[j]);
    }
    return absl::OkStatus();
  };
  std::vector<Value> items;
  for (const Value& item : iterable.items()) {
    RETURN_IF_ERROR(Step(n.pos));
    if (target.kind == NodeKind::kTuple) {
      if (item.kind() != Kind::kList) {
        return Error(target, absl::StrCat("cannot unpack a ", item.TypeName()));
      }
      if (item.items().size() != target.a.size()) {
        return Error(target,
                     absl::StrCat("cannot unpack ", item.items().size(),
                                  " values into ", target.a.size(), " names"));
      }
    }
    if (test != nullptr) {
      Env loop_scope(&scope);
      RETURN_IF_ERROR(assign(item, &loop_scope));
      ASSIGN_OR_RETURN(const Value keep, Eval(*test, &loop_scope));
      RETURN_IF_ERROR(CheckNotMissing(*test, keep));
      if (!keep.Truthy()) continue;
    }
    items.push_back(item);
  }
  Text result;
  bool no_iteration = true;
  const size_t count = items.size();
  for (size_t i = 0; i < count; ++i) {
    RETURN_IF_ERROR(Step(n.pos));
    auto loop = std::make_shared<DictData>();
    loop->Set(Text("index"), Value::Int(static_cast<double>(i + 1)));
    loop->Set(Text("index0"), Value::Int(static_cast<double>(i)));
    loop->Set(Text("revindex"), Value::Int(static_cast<double>(count - i)));
    loop->Set(Text("revindex0"),
              Value::Int(static_cast<double>(count - i - 1)));
    loop->Set(Text("first"), Value::Bool(i == 0));
    loop->Set(Text("last"), Value::Bool(i + 1 == count));
    loop->Set(Text("length"), Value::Int(static_cast<double>(count)));
    loop->Set(Text("previtem"), i > 0 ? items[i - 1] : Value());
    loop->Set(Text("nextitem"), i + 1 < count ? items[i + 1] : Value());
    ASSIGN_OR_RETURN(Value loop_value, MakeDict(n.pos, std::move(loop)));
    scope.Set("loop", std::move(loop_value));
    RETURN_IF_ERROR(assign(items[i], &scope));
    Text body;
    RETURN_IF_ERROR(Block(n.a, &scope, &body));
    // As in @huggingface/jinja, break and continue drop what the interrupted
    // iteration rendered (Jinja2 keeps it).
    if (jump_ == Jump::kContinue) {
      jump_ = Jump::kNone;
      continue;
    }
    if (jump_ == Jump::kBreak) {
      jump_ = Jump::kNone;
      break;
    }
    RETURN_IF_ERROR(Produced(n.pos, result.size() + body.size(), body.size()));
    result.Append(body);
    no_iteration = false;
  }
  if (no_iteration) RETURN_IF_ERROR(Block(n.b, &scope, &result));
  RETURN_IF_ERROR(Produced(n.pos, out->size() + result.size(), result.size()));
  out->Append(result);
  return absl::OkStatus();
}

absl::Status Interpreter::DefineMacro(const Node& n, Env* env) {
  const Node* macro = &n;
  env->Set(
      n.str,
      Value::Fn(n.str, [this, macro](std::vector<Value>& args, Env* caller) {
        return CallMacro(*macro, macro->str, macro->a, macro->b, args, caller);
      }));
  return absl::OkStatus();
}

absl::StatusOr<Value> Interpreter::CallMacro(const Node& macro,
                                             absl::string_view name,
                                             const std::vector<NodePtr>& params,
                                             const std::vector<NodePtr>& body,
                                             std::vector<Value>& args,
                                             Env* parent) {
  const uint32_t call_pos = pos_;
  RETURN_IF_ERROR(Step(call_pos));
  if (call_depth_ >= limits_.max_call_depth) {
    return Error(call_pos, absl::StrCat("macro calls nest deeper than ",
                                        limits_.max_call_depth));
  }
  ++call_depth_;
  // Macros see the caller's variables (the JavaScript runtime scopes them
  // dynamically).
  Env scope(parent);
  absl::Status bound = BindArguments(macro, name, params, body, args, &scope);
  Text out;
  if (bound.ok()) bound = Block(body, &scope, &out);
  --call_depth_;
  RETURN_IF_ERROR(bound);
  if (jump_ != Jump::kNone) {
    return Error(macro, "{% break %} or {% continue %} outside a loop");
  }
  return Value::Str(std::move(out));
}

absl::Status Interpreter::BindArguments(const Node& owner,
                                        absl::string_view name,
                                        const std::vector<NodePtr>& params,
                                        const std::vector<NodePtr>& body,
                                        std::vector<Value>& args, Env* scope) {
  auto it = special_args_.find(&owner);
  if (it == special_args_.end()) {
    bool kwargs = false;
    bool varargs = false;
    for (const NodePtr& s : body) ScanSpecial(*s, &kwargs, &varargs);
    for (const NodePtr& p : params) {
      if (p->str == "kwargs") kwargs = false;
      if (p->str == "varargs") varargs = false;
    }
    it = special_args_.emplace(&owner, std::make_pair(kwargs, varargs)).first;
  }
  const auto [uses_kwargs, uses_varargs] = it->second;
  std::vector<Value> positional = args;
  auto keywords = std::make_shared<DictData>();
  if (!positional.empty() && positional.back().kind() == Kind::kKwargs) {
    *keywords = positional.back().dict();
    positional.pop_back();
  }
  std::vector<std::pair<std::string, const Node*>> pending;
  for (size_t i = 0; i < params.size(); ++i) {
    const Node& p = *params[i];
    // A JavaScript undefined argument counts as not given.
    std::optional<Value> value;
    if (i < positional.size() && !positional[i].is_missing()) {
      value = positional[i];
    }
    if (!value.has_value()) {
      if (const Value* kw = keywords->Find(p.str)) {
        if (!kw->is_missing()) value = *kw;
        // Remove it: rebuild without the key.
        auto rest = std::make_shared<DictData>();
        for (const auto& [k, v] : keywords->entries) {
          if (k.str() != p.str) rest->Set(k, v);
        }
        keywords = std::move(rest);
      }
    }
    if (!value.has_value() && p.kind == NodeKind::kKeywordArg) {
      pending.emplace_back(p.str, p.x.get());
    }
    scope->Set(p.str, value.has_value() ? *value : Value());
  }
  if (uses_kwargs) {
    ASSIGN_OR_RETURN(Value kw, MakeDict(owner.pos, keywords));
    scope->Set("kwargs", std::move(kw));
  } else if (keywords->size() > 0) {
    return Error(pos_,
                 absl::StrCat("macro '", name, "' takes no keyword argument '",
                              keywords->entries[0].first.str(), "'"));
  }
  if (uses_varargs) {
    std::vector<Value> rest;
    for (size_t i = params.size(); i < positional.size(); ++i) {
      rest.push_back(positional[i]);
    }
    ASSIGN_OR_RETURN(Value v, MakeList(owner.pos, std::move(rest)));
    scope->Set("varargs", std::move(v));
  } else if (positional.size() > params.size()) {
    return Error(pos_, absl::StrCat("macro '", name, "' takes at most ",
                                    params.size(), " argument(s)"));
  }
  for (const auto& [param, def] : pending) {
    ASSIGN_OR_RETURN(Value v, Eval(*def, scope));
    scope->Set(param, std::move(v));
  }
  return absl::OkStatus();
}

absl::StatusOr<Value> Interpreter::CallBlock(const Node& n, Env* env) {
  auto alive = std::make_shared<bool>(true);
  const Node* block = &n;
  Value caller = Value::Fn(
      "caller",
      [this, block, env, alive](std::vector<Value>& args,
                                Env*) -> absl::StatusOr<Value> {
        if (!*alive) {
          return Error(*block, "caller() used after its call block ended");
        }
        return CallMacro(*block, "caller", block->a, block->b, args, env);
      });
  const Node& call = *n.x;
  std::vector<Value> args;
  std::shared_ptr<DictData> keywords;
  RETURN_IF_ERROR(EvalArguments(call.a, env, &args, &keywords));
  if (keywords == nullptr) keywords = std::make_shared<DictData>();
  ASSIGN_OR_RETURN(Value kw, MakeDict(n.pos, keywords, Kind::kKwargs));
  args.push_back(std::move(kw));
  ASSIGN_OR_RETURN(const Value fn, Eval(*call.x, env));
  if (fn.kind() != Kind::kFunction) {
    return Error(call, absl::StrCat("cannot call a ", fn.TypeName()));
  }
  Env with_caller(env);
  with_caller.Set("caller", caller);
  pos_ = n.pos;
  absl::StatusOr<Value> result = fn.function().fn(args, &with_caller);
  *alive = false;
  return result;
}

}  // namespace swaserve::model::jinja
