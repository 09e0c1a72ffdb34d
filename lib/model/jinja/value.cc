#include "lib/model/jinja/value.h"

#include <algorithm>
#include <cmath>

namespace swaserve::model::jinja {

Text::Text(std::string s, bool untrusted) : s_(std::move(s)) {
  if (untrusted && !s_.empty()) untrusted_.push_back({0, s_.size()});
}

void Text::MarkUntrusted(size_t begin, size_t end) {
  if (begin >= end) return;
  if (!untrusted_.empty() && untrusted_.back().end == begin) {
    untrusted_.back().end = end;
  } else {
    untrusted_.push_back({begin, end});
  }
}

void Text::Append(const Text& other) { AppendRange(other, 0, other.size()); }

void Text::Append(absl::string_view trusted) {
  s_.append(trusted.data(), trusted.size());
}

void Text::AppendUntrusted(absl::string_view s) {
  const size_t at = s_.size();
  s_.append(s.data(), s.size());
  MarkUntrusted(at, s_.size());
}

void Text::AppendRange(const Text& other, size_t begin, size_t end) {
  if (begin >= end) return;
  const size_t base = s_.size();
  s_.append(other.s_, begin, end - begin);
  const auto& spans = other.untrusted_;
  auto it = std::upper_bound(
      spans.begin(), spans.end(), begin,
      [](size_t pos, const ByteRange& r) { return pos < r.end; });
  for (; it != spans.end() && it->begin < end; ++it) {
    const size_t b = std::max(it->begin, begin);
    const size_t e = std::min(it->end, end);
    MarkUntrusted(base + b - begin, base + e - begin);
  }
}

Text Text::Substr(size_t begin, size_t end) const {
  Text t;
  t.AppendRange(*this, begin, end);
  return t;
}

Text Text::Derived(std::string s) const {
  return Text(std::move(s), any_untrusted());
}

Text Text::SameSpans(std::string s) const {
  Text t;
  t.s_ = std::move(s);
  t.untrusted_ = untrusted_;
  return t;
}

Value Value::Missing() {
  Value v;
  v.b_ = true;
  return v;
}

Value Value::None() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}

Value Value::Bool(bool b) {
  Value v;
  v.kind_ = Kind::kBool;
  v.b_ = b;
  return v;
}

Value Value::Int(double n) { return Number(n, /*is_float=*/false); }

Value Value::Float(double n) { return Number(n, /*is_float=*/true); }

Value Value::Number(double n, bool is_float) {
  Value v;
  v.kind_ = is_float ? Kind::kFloat : Kind::kInt;
  v.num_ = n;
  return v;
}

Value Value::Str(Text t) {
  Value v;
  v.kind_ = Kind::kString;
  v.str_ = std::make_shared<const Text>(std::move(t));
  return v;
}

Value Value::List(std::vector<Value> items, Kind kind) {
  auto data = std::make_shared<ListData>();
  int depth = 0;
  for (const Value& item : items) depth = std::max(depth, item.depth());
  data->depth = depth + 1;
  data->items = std::move(items);
  Value v;
  v.kind_ = kind;
  v.list_ = std::move(data);
  return v;
}

Value Value::Dict(std::shared_ptr<DictData> d, Kind kind) {
  int depth = 0;
  for (const auto& [key, value] : d->entries) {
    depth = std::max(depth, value.depth());
  }
  d->depth = depth + 1;
  Value v;
  v.kind_ = kind;
  v.dict_ = std::move(d);
  return v;
}

Value Value::EmptyDict(Kind kind) {
  return Dict(std::make_shared<DictData>(), kind);
}

Value Value::Fn(std::string name, NativeFn fn) {
  Value v;
  v.kind_ = Kind::kFunction;
  v.fn_ = std::make_shared<const Function>(
      Function{.name = std::move(name), .fn = std::move(fn)});
  return v;
}

const std::vector<Value>& Value::items() const { return list_->items; }

const void* Value::identity() const {
  if (list_) return list_.get();
  if (dict_) return dict_.get();
  if (fn_) return fn_.get();
  return nullptr;
}

int Value::depth() const {
  if (list_) return list_->depth;
  if (dict_) return dict_->depth;
  return 1;
}

bool Value::Truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return b_;
    case Kind::kInt:
    case Kind::kFloat:
      return num_ != 0 && !std::isnan(num_);
    case Kind::kString:
      return !str_->empty();
    case Kind::kList:
    case Kind::kTuple:
      return !list_->items.empty();
    case Kind::kDict:
    case Kind::kKwargs:
      return dict_->size() > 0;
    case Kind::kNamespace:
    case Kind::kFunction:
      return true;
  }
  return false;
}

const char* Value::TypeName() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "UndefinedValue";
    case Kind::kNone:
      return "NullValue";
    case Kind::kBool:
      return "BooleanValue";
    case Kind::kInt:
      return "IntegerValue";
    case Kind::kFloat:
      return "FloatValue";
    case Kind::kString:
      return "StringValue";
    case Kind::kList:
      return "ArrayValue";
    case Kind::kTuple:
      return "TupleValue";
    case Kind::kDict:
      return "ObjectValue";
    case Kind::kKwargs:
      return "KeywordArgumentsValue";
    case Kind::kNamespace:
      return "NamespaceValue";
    case Kind::kFunction:
      return "FunctionValue";
  }
  return "?";
}

const Value* DictData::Find(absl::string_view key) const {
  const auto it = index.find(key);
  return it == index.end() ? nullptr : &entries[it->second].second;
}

void DictData::Set(Text key, Value v) {
  const auto it = index.find(key.str());
  if (it != index.end()) {
    entries[it->second].second = std::move(v);
    return;
  }
  index.emplace(key.str(), entries.size());
  entries.emplace_back(std::move(key), std::move(v));
}

}  // namespace swaserve::model::jinja
