// A small Jinja interpreter for chat templates (lib/model/jinja/): the
// checkpoint's own template (tokenizer_config.json "chat_template" or
// chat_template.jinja) rendered byte for byte as the npm package
// @huggingface/jinja 0.5.11 renders it (the goldens in
// tests/fixtures/chat_templates/ are made with it), with the options
// transformers uses (trim_blocks, lstrip_blocks). No maintained C++ Jinja
// library is packaged here, hence this port of that package.
//
// Supported: {{ }}, {% %}, {# #}, whitespace control (-), if/elif/else,
// for (loop.index/index0/revindex/revindex0/first/last/length/previtem/
// nextitem, `for x in y if cond`, else, tuple unpacking, break/continue),
// set (names, tuples, namespace attributes, block set), macros (defaults,
// keyword arguments, kwargs/varargs), call blocks and caller(), filter
// blocks; literals, slices, calls with * and ** arguments, `x if c else y`;
// the operators and, or, not, in, not in, is [not], == != < > <= >=, + - ~ *
// / // % **; the tests defined, undefined, none, boolean, true, false,
// string, number, integer, mapping, iterable, sequence, callable, odd, even,
// lower, upper, equalto/eq; the filters safe, tojson (indent, ensure_ascii,
// sort_keys, separators), length, first, last, list, reverse, sort, join,
// string, unique, trim, upper, lower, title, capitalize, indent, int, float,
// abs, bool, default, items, replace, selectattr, rejectattr, map(attribute=),
// dictsort and the dict methods as filters; string methods upper, lower,
// strip, lstrip, rstrip, title, capitalize, startswith, endswith, split,
// replace, length; dict methods get, items, keys, values, dictsort; globals
// namespace, range, raise_exception, strftime_now, true/false/none (also
// True/False/None).
//
// Where @huggingface/jinja differs from Python's Jinja2 (hence from
// transformers), this follows @huggingface/jinja; the differences a chat
// template can meet:
//   - strip/lstrip/rstrip ignore their argument and strip all whitespace;
//   - booleans print as "true"/"false", floats with a ".0" when integral,
//     and a JSON number like 1.0 in the messages is the integer 1;
//   - undefined values are lenient (printing one prints nothing, but
//     `undefined ~ "x"` is an error);
//   - `%` is JavaScript's remainder (sign of the dividend);
//   - break / continue drop what the interrupted iteration rendered;
//   - macros see the caller's variables;
//   - dict keys that look like array indices come first, in numeric order
//     (JavaScript object key order), in input data;
//   - string lengths and indices count UTF-16 code units;
//   - `str + list` concatenates (the list printed as JSON items joined by
//     ","), looping over an undefined value is an error, and none inside a
//     list printed with `~` reads "undefined".
// (tools/chat_template_golden/python_crosscheck.py lists the golden
// conversations that Jinja2 renders differently: 3 of 77 today.)
// Not supported (errors, as in @huggingface/jinja): other filters and tests,
// tests with arguments (`is divisibleby(3)`), list methods such as append,
// str.format, {% include %}, {% extends %}, {% raw %}. Known gaps against
// @huggingface/jinja itself: js_text.h (case mapping, lone surrogates),
// tojson's sort_keys orders keys case-insensitively instead of by the ICU
// locale, tojson and indent widths are at most 1024, `**` with a
// non-integer result may differ in the last bit (std::pow against V8's),
// a few operations on the undefined result of `[] | first` that JavaScript
// lets through are errors here, printing a function is an error. Checked by
// 168 golden cases and 2000 random templates (tests/fixtures/chat_templates;
// 100,000 more random ones found only the `**` difference).
//
// Untrusted data: every render is bounded by RenderLimits (interpreter.h);
// errors are InvalidArgument "line L, column C: ..." (raise_exception: the
// template's own message, with the kRaisedPayload payload). The renderer
// reports which output bytes came from untrusted context values (Rendered).
//
// Thread-safety: a Template is immutable after Parse; Render may be called
// from any number of threads at once.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "lib/model/jinja/interpreter.h"
#include "lib/model/jinja/value.h"
#include "nlohmann/json.hpp"

namespace swaserve::model::jinja {

struct RenderOptions {
  RenderLimits limits;
  // Top-level context keys whose strings the template may emit as its own
  // text (e.g. bos_token, eos_token from tokenizer_config.json). Strings of
  // every other key are untrusted. Default: none.
  std::vector<std::string> trusted_keys;
};

struct Rendered {
  std::string text;
  // Sorted, disjoint byte ranges of `text` copied from untrusted values.
  std::vector<ByteRange> untrusted;
};

class Template {
 public:
  // Parses `source`; InvalidArgument "line L, column C: ..." when the lexer
  // or parser cannot read it.
  static absl::StatusOr<std::unique_ptr<Template>> Parse(std::string source);

  // Renders with the variables of `context` (a JSON object; dict key order
  // is kept). The names true, false, none, True, False, None, namespace,
  // range, raise_exception and strftime_now cannot be context keys.
  absl::StatusOr<Rendered> Render(const nlohmann::ordered_json& context,
                                  const RenderOptions& options = {}) const;

  const std::string& source() const { return source_; }

 private:
  Template(std::string source, NodePtr program)
      : source_(std::move(source)), program_(std::move(program)) {}

  std::string source_;
  NodePtr program_;
};

// The value of JSON `j` as the JavaScript runtime sees JSON.parse output
// (integral numbers are integers; object keys in JavaScript order). Strings
// are untrusted when `untrusted`. InvalidArgument for strings that are not
// UTF-8 or nesting deeper than `max_depth`.
absl::StatusOr<Value> ValueFromJson(const nlohmann::ordered_json& j,
                                    bool untrusted, int max_depth);

}  // namespace swaserve::model::jinja
