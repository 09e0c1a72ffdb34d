// Runtime values of the Jinja interpreter (lib/model/jinja/), modelled on
// @huggingface/jinja's runtime values so that renders match it byte for
// byte. Internal to swaserve::model_text.
//
// Text is a string that remembers which of its bytes came from untrusted
// input (message contents, tool definitions, request kwargs): every string
// operation carries those ranges along, so the rendered prompt says which of
// its bytes the template wrote and which it copied from data. The chat
// template encoder (chat_template.h) parses special tokens only in the
// template's own bytes.
//
// Value is a small handle: numbers and booleans inline, strings shared and
// immutable, lists and dicts shared (lists and dicts are immutable once
// built, except a namespace's attributes). As in JavaScript, == on lists,
// dicts and functions compares identity.
//
// Not thread-safe: values belong to one render.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace swaserve::model::jinja {

struct ByteRange {
  size_t begin = 0;
  size_t end = 0;  // exclusive
};

class Text {
 public:
  Text() = default;
  explicit Text(std::string s, bool untrusted = false);

  const std::string& str() const { return s_; }
  size_t size() const { return s_.size(); }
  bool empty() const { return s_.empty(); }
  // Sorted, disjoint, non-adjacent byte ranges of untrusted bytes.
  const std::vector<ByteRange>& untrusted() const { return untrusted_; }
  bool any_untrusted() const { return !untrusted_.empty(); }

  void Append(const Text& other);
  void Append(absl::string_view trusted);
  void AppendUntrusted(absl::string_view s);
  // Appends s[begin, end) of `other` with its provenance.
  void AppendRange(const Text& other, size_t begin, size_t end);
  Text Substr(size_t begin, size_t end) const;
  // A new text `s` that is untrusted as a whole when this one has any
  // untrusted byte (for transformations that do not keep byte positions).
  Text Derived(std::string s) const;
  // `s`, of the same length, with this text's provenance byte for byte (for
  // transformations that keep byte positions).
  Text SameSpans(std::string s) const;

 private:
  void MarkUntrusted(size_t begin, size_t end);

  std::string s_;
  std::vector<ByteRange> untrusted_;
};

class Value;
class Env;

// Arguments of a call: positional values, then (when the call had keyword
// arguments) one kKwargs dict, exactly as @huggingface/jinja passes them.
using NativeFn =
    std::function<absl::StatusOr<Value>(std::vector<Value>& args, Env* caller)>;

struct ListData;
struct DictData;
struct Function {
  std::string name;
  NativeFn fn;
};

enum class Kind : uint8_t {
  kUndefined,
  kNone,
  kBool,
  kInt,    // an integral IEEE double, as IntegerValue in JavaScript
  kFloat,  // FloatValue
  kString,
  kList,
  kTuple,      // from (a, b): a list, except where the JS runtime treats
               // TupleValue apart (tojson, `is iterable`, unpacking)
  kDict,       // ObjectValue
  kKwargs,     // KeywordArgumentsValue: a dict passed as call keywords
  kNamespace,  // namespace(...): attributes, mutable
  kFunction,
};

class Value {
 public:
  Value() = default;  // undefined
  // JavaScript's own undefined (not an UndefinedValue): what `first` / `last`
  // of an empty list give in @huggingface/jinja. Stored and read back it is
  // undefined; a macro argument that is missing takes its default; most
  // other uses are errors there, and here.
  static Value Missing();
  static Value None();
  static Value Bool(bool b);
  static Value Int(double v);
  static Value Float(double v);
  static Value Number(double v, bool is_float);
  static Value Str(Text t);
  static Value Str(std::string s) { return Str(Text(std::move(s))); }
  static Value List(std::vector<Value> items, Kind kind = Kind::kList);
  static Value Dict(std::shared_ptr<DictData> d, Kind kind = Kind::kDict);
  static Value EmptyDict(Kind kind = Kind::kDict);
  static Value Fn(std::string name, NativeFn fn);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_missing() const { return kind_ == Kind::kUndefined && b_; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_number() const {
    return kind_ == Kind::kInt || kind_ == Kind::kFloat;
  }
  bool is_string() const { return kind_ == Kind::kString; }
  // ArrayValue (list or tuple).
  bool is_list_like() const {
    return kind_ == Kind::kList || kind_ == Kind::kTuple;
  }
  // ObjectValue (dict or kwargs).
  bool is_object() const {
    return kind_ == Kind::kDict || kind_ == Kind::kKwargs;
  }
  // Attribute containers: objects and namespaces.
  bool has_attrs() const { return is_object() || kind_ == Kind::kNamespace; }

  bool boolean() const { return b_; }
  double number() const { return num_; }
  const Text& text() const { return *str_; }
  const std::vector<Value>& items() const;
  const DictData& dict() const { return *dict_; }
  DictData& mutable_dict() const { return *dict_; }
  const Function& function() const { return *fn_; }
  const std::shared_ptr<DictData>& dict_ptr() const { return dict_; }
  const void* identity() const;  // list/dict/function storage
  // Nesting depth of lists/dicts (1 for scalars).
  int depth() const;

  // __bool__: Python truthiness as the JS runtime computes it.
  bool Truthy() const;
  // The type name @huggingface/jinja reports ("StringValue", ...).
  const char* TypeName() const;

 private:
  Kind kind_ = Kind::kUndefined;
  bool b_ = false;
  double num_ = 0;
  std::shared_ptr<const Text> str_;
  std::shared_ptr<const ListData> list_;
  std::shared_ptr<DictData> dict_;
  std::shared_ptr<const Function> fn_;
};

struct ListData {
  std::vector<Value> items;
  int depth = 1;
};

// Insertion-ordered string-keyed map (JavaScript Map).
struct DictData {
  std::vector<std::pair<Text, Value>> entries;
  absl::flat_hash_map<std::string, size_t> index;
  int depth = 1;

  const Value* Find(absl::string_view key) const;
  // Inserts or replaces (keeping the first insertion's position).
  void Set(Text key, Value v);
  size_t size() const { return entries.size(); }
};

}  // namespace swaserve::model::jinja
