// The Jinja interpreter: a port of @huggingface/jinja's Interpreter (its
// runtime.ts), so that a template renders byte for byte as it does there,
// including where that differs from Python's Jinja2 (see template.h).
// Internal to swaserve::model_text; the public API is template.h.
//
// Split over interpreter.cc (statements, expressions, operators),
// builtins.cc (filters, tests, string/dict methods, globals) and
// format.cc (printing values, tojson).
//
// Untrusted input meets this code, so every render is bounded
// (RenderLimits): loop iterations plus macro calls, call depth, value nesting,
// string and output size, and the total bytes of strings built (against
// quadratic blow-ups). Errors are InvalidArgument "line L, column C: ...".
//
// One Interpreter renders one template once; not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "lib/model/jinja/ast.h"
#include "lib/model/jinja/value.h"

namespace swaserve::model::jinja {

struct RenderLimits {
  // Loop iterations plus macro calls per render. Default: 1 << 20.
  int64_t max_steps = int64_t{1} << 20;
  // Nested macro / call-block calls. Default: 64.
  int max_call_depth = 64;
  // Nesting of lists and dicts (input data included). Default: 64.
  int max_value_depth = 64;
  // Largest string, list or output. Default: 64 MiB / 1M items.
  size_t max_string_bytes = size_t{64} << 20;
  size_t max_list_items = size_t{1} << 20;
  // Total bytes of all strings built in one render. Default: 1 GiB.
  size_t max_work_bytes = size_t{1} << 30;
};

// The status payload key marking an error raised by the template itself
// (raise_exception); its message is the template's.
inline constexpr char kRaisedPayload[] = "swaserve.jinja/raised";

// A scope. Lookups walk to the parent; the root holds the globals and the
// render's context.
class Env {
 public:
  explicit Env(Env* parent) : parent_(parent) {}
  Env(const Env&) = delete;
  Env& operator=(const Env&) = delete;

  const Value* Find(absl::string_view name) const;
  void Set(absl::string_view name, Value v);
  bool HasOwn(absl::string_view name) const { return vars_.contains(name); }

 private:
  Env* parent_;
  absl::flat_hash_map<std::string, Value> vars_;
};

// Options of tojson (keyword arguments of the filter).
struct JsonOptions {
  int indent = 0;  // 0: none
  bool ensure_ascii = false;
  bool sort_keys = false;
  std::optional<std::pair<std::string, std::string>> separators;
};

class Interpreter {
 public:
  Interpreter(absl::string_view source, const RenderLimits& limits)
      : source_(source), limits_(limits) {}
  ~Interpreter();
  Interpreter(const Interpreter&) = delete;
  Interpreter& operator=(const Interpreter&) = delete;

  // Declares the globals (true, false, none, namespace, range,
  // raise_exception, strftime_now, ...) in `root`.
  void AddGlobals(Env* root);
  absl::StatusOr<Text> Run(const Node& program, Env* root);

  const RenderLimits& limits() const { return limits_; }

 private:
  enum class Jump { kNone, kBreak, kContinue };

  // ---- interpreter.cc ----
  absl::Status Block(const std::vector<NodePtr>& body, Env* env, Text* out);
  absl::Status Statement(const Node& n, Env* env, Text* out);
  absl::StatusOr<Value> Eval(const Node& n, Env* env);
  absl::StatusOr<Value> EvalBinary(const Node& n, Env* env);
  absl::StatusOr<Value> EvalUnary(const Node& n, Env* env);
  absl::StatusOr<Value> EvalMember(const Node& n, Env* env);
  absl::StatusOr<Value> EvalSlice(const Node& n, const Value& object, Env* env);
  absl::StatusOr<Value> EvalCall(const Node& n, Env* env);
  absl::StatusOr<Value> EvalLiteral(const Node& n, Env* env);
  absl::Status EvalArguments(const std::vector<NodePtr>& args, Env* env,
                             std::vector<Value>* positional,
                             std::shared_ptr<DictData>* keywords);
  absl::Status For(const Node& n, Env* env, Text* out);
  absl::Status Set(const Node& n, Env* env);
  absl::Status DefineMacro(const Node& n, Env* env);
  absl::StatusOr<Value> CallBlock(const Node& n, Env* env);
  absl::StatusOr<Value> CallMacro(const Node& macro, absl::string_view name,
                                  const std::vector<NodePtr>& params,
                                  const std::vector<NodePtr>& body,
                                  std::vector<Value>& args, Env* parent);
  absl::Status BindArguments(const Node& owner, absl::string_view name,
                             const std::vector<NodePtr>& params,
                             const std::vector<NodePtr>& body,
                             std::vector<Value>& args, Env* scope);

  // ---- builtins.cc ----
  absl::StatusOr<Value> ApplyFilter(const Value& operand, const Node& filter,
                                    Env* env);
  absl::StatusOr<Value> ApplyTest(const Node& n, const Value& operand);
  absl::StatusOr<Value> IdentifierFilter(const Value& operand,
                                         const Node& filter, Env* env);
  absl::StatusOr<Value> CallFilter(const Value& operand, const Node& filter,
                                   Env* env);
  absl::StatusOr<Value> ListCallFilter(const Value& operand, const Node& filter,
                                       Env* env);
  absl::StatusOr<Value> SelectAttr(const Value& operand, const Node& filter,
                                   Env* env);
  absl::StatusOr<Value> Indent(const Text& t, const Value& width,
                               const Value& first, const Value& blank);
  absl::StatusOr<Value> Join(const Value& operand, const Text& separator);
  absl::StatusOr<Value> Unique(const Value& operand);
  // Sorts `items` by `keys` (same length) as compareRuntimeValues orders
  // them; an error when two keys cannot be compared.
  absl::Status SortBy(const std::vector<Value>& keys, bool case_sensitive,
                      bool reverse, std::vector<Value>* items);
  absl::StatusOr<Value> Namespace(std::vector<Value>& args);
  absl::StatusOr<Value> Range(std::vector<Value>& args);

  // ---- methods.cc ----
  // The member `name` of a string, list or dict (a bound method or a
  // property), Undefined when there is none.
  absl::StatusOr<Value> Builtin(const Value& object, absl::string_view name);
  absl::StatusOr<Value> StringMethod(const Value& self, absl::string_view name);
  absl::StatusOr<Value> DictMethod(const Value& self, absl::string_view name);
  absl::StatusOr<Value> Split(const Text& t, std::vector<Value>& args);
  absl::StatusOr<Value> Replace(const Text& t, std::vector<Value>& args);
  absl::StatusOr<Value> DictView(const Value& self, absl::string_view what);
  absl::StatusOr<Value> DictSort(const Value& self, std::vector<Value>& args);

  // ---- format.cc ----
  // What {{ value }} prints (RuntimeValue.toString()).
  absl::StatusOr<Text> Print(const Value& v);
  // String(value.value): how `~`, `+` and join see a value.
  absl::StatusOr<Text> RawString(const Value& v);
  absl::StatusOr<Text> ToJson(const Value& v, const JsonOptions& options,
                              bool undefined_as_null);
  absl::Status AppendJson(const Value& v, const JsonOptions& options, int depth,
                          bool undefined_as_null, Text* out);

  // ---- shared helpers (interpreter.cc) ----
  absl::Status Error(const Node& n, absl::string_view what) const;
  absl::Status Error(uint32_t pos, absl::string_view what) const;
  // An error when `v` is Value::Missing() (JavaScript fails on it).
  absl::Status CheckNotMissing(const Node& n, const Value& v) const;
  // Checks a string of `size` bytes against max_string_bytes.
  absl::Status CheckSize(uint32_t pos, size_t size) const;
  // A string grew to `size` bytes by writing `added` new ones: checks the
  // size and counts `added` against max_work_bytes.
  absl::Status Produced(uint32_t pos, size_t size, size_t added);
  absl::Status Step(uint32_t pos);
  absl::StatusOr<Value> MakeList(uint32_t pos, std::vector<Value> items,
                                 Kind kind = Kind::kList);
  absl::StatusOr<Value> MakeDict(uint32_t pos, std::shared_ptr<DictData> d,
                                 Kind kind = Kind::kDict);
  absl::StatusOr<Value> MakeString(uint32_t pos, Text t);

  absl::string_view source_;
  RenderLimits limits_;
  Jump jump_ = Jump::kNone;
  int64_t steps_ = 0;
  int call_depth_ = 0;
  size_t work_bytes_ = 0;
  uint32_t pos_ = 0;  // the node being evaluated, for errors from builtins
  // Namespaces are the only mutable containers, hence the only way to build
  // reference cycles; they are emptied when the render ends.
  std::vector<std::shared_ptr<DictData>> namespaces_;
  // Macros' use of kwargs / varargs, by macro node.
  absl::flat_hash_map<const Node*, std::pair<bool, bool>> special_args_;
};

}  // namespace swaserve::model::jinja
