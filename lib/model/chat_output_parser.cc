#include "lib/model/chat_output_parser.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <optional>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace swaserve::model {
namespace {

using OJson = nlohmann::ordered_json;

constexpr std::string_view kCallOpen = "<tool_call>";
constexpr std::string_view kCallClose = "</tool_call>";
constexpr std::string_view kFunctionOpen = "<function=";
constexpr std::string_view kFunctionClose = "</function>";
constexpr std::string_view kParameterOpen = "<parameter=";
constexpr std::string_view kParameterClose = "</parameter>";

bool IsBlank(std::string_view s) {
  for (char c : s) {
    if (c != ' ' && c != '\n' && c != '\t' && c != '\r') return false;
  }
  return true;
}

std::string_view Trim(std::string_view s) {
  const absl::string_view t = absl::StripAsciiWhitespace(absl::string_view(s.data(), s.size()));
  return std::string_view(t.data(), t.size());
}

std::string_view SkipSpace(std::string_view s) {
  const absl::string_view t = absl::StripLeadingAsciiWhitespace(absl::string_view(s.data(), s.size()));
  return std::string_view(t.data(), t.size());
}

// Length of the longest suffix of `s` that is a proper prefix of `tag`.
size_t PartialTagSuffix(std::string_view s, std::string_view tag) {
  const size_t most = std::min(s.size(), tag.size() - 1);
  for (size_t n = most; n > 0; --n) {
    if (s.substr(s.size() - n) == tag.substr(0, n)) return n;
  }
  return 0;
}

// A JSON string literal; bytes that are not UTF-8 (a model can write them
// anywhere, parameter names included) become U+FFFD instead of throwing.
std::string DumpString(const std::string& s) {
  return OJson(s).dump(-1, ' ', false, OJson::error_handler_t::replace);
}

// JSON text as Python's json.dumps(ensure_ascii=False) writes it.
std::string PyDump(const OJson& v) {
  if (v.is_object()) {
    std::string out = "{";
    bool first = true;
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (!first) out += ", ";
      first = false;
      absl::StrAppend(&out, DumpString(it.key()), ": ", PyDump(it.value()));
    }
    return out + "}";
  }
  if (v.is_array()) {
    std::string out = "[";
    for (size_t i = 0; i < v.size(); ++i) {
      if (i > 0) out += ", ";
      out += PyDump(v[i]);
    }
    return out + "]";
  }
  return v.dump(-1, ' ', false, OJson::error_handler_t::replace);
}

// An object's members as argument fragments: "{k1: v1", ", k2: v2", ... "}".
std::vector<std::string> Fragments(const OJson& args) {
  std::vector<std::string> out;
  for (auto it = args.begin(); it != args.end(); ++it) {
    out.push_back(
        absl::StrCat(out.empty() ? "{" : ", ", DumpString(it.key()), ": ", PyDump(it.value())));
  }
  if (out.empty()) {
    out.push_back("{}");
  } else {
    out.back() += "}";
  }
  return out;
}

bool HasType(const OJson& schema, std::string_view type) {
  if (!schema.is_object()) return false;
  const auto t = schema.find("type");
  if (t == schema.end()) return false;
  if (t->is_string()) return t->get_ref<const std::string&>() == type;
  if (t->is_array()) {
    for (const OJson& e : *t) {
      if (e.is_string() && e.get_ref<const std::string&>() == type) return true;
    }
  }
  return false;
}

std::optional<OJson> ToInteger(std::string_view s) {
  int64_t i = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), i);
  if (ec != std::errc() || end != s.data() + s.size() || s.empty()) return std::nullopt;
  return OJson(i);
}

std::optional<OJson> ToNumber(std::string_view s) {
  if (std::optional<OJson> i = ToInteger(s)) return i;
  double d = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), d);
  if (ec != std::errc() || end != s.data() + s.size() || s.empty()) return std::nullopt;
  if (!std::isfinite(d)) return std::nullopt;
  return OJson(d);
}

}  // namespace

OJson ConvertParameter(std::string_view text, const OJson& schema) {
  if (HasType(schema, "string") || !schema.is_object()) return OJson(std::string(text));
  const std::string_view t = Trim(text);
  if (HasType(schema, "null") && (t == "null" || t == "None")) return OJson(nullptr);
  if (HasType(schema, "boolean")) {
    if (t == "true" || t == "True") return OJson(true);
    if (t == "false" || t == "False") return OJson(false);
  }
  if (HasType(schema, "integer")) {
    if (std::optional<OJson> v = ToInteger(t)) return *v;
  }
  if (HasType(schema, "number")) {
    if (std::optional<OJson> v = ToNumber(t)) return *v;
  }
  const bool object = HasType(schema, "object"), array = HasType(schema, "array");
  if (object || array) {
    OJson v = OJson::parse(t, nullptr, /*allow_exceptions=*/false);
    if ((object && v.is_object()) || (array && v.is_array())) return v;
  }
  return OJson(std::string(text));
}

ChatOutputParser::ChatOutputParser(ChatOutputOptions options)
    : o_(std::move(options)),
      state_(o_.parse_reasoning && o_.starts_in_reasoning ? State::kReasoning : State::kContent) {
  if (o_.tool_format == ToolCallFormat::kUnknown) o_.parse_tool_calls = false;
  if (state_ == State::kReasoning) saw_reasoning_ = true;
}

ChatOutputDelta ChatOutputParser::Feed(std::string_view text) {
  ChatOutputDelta out;
  buf_.append(text);
  Run(/*final=*/false, &out);
  return out;
}

ChatOutputDelta ChatOutputParser::Finish() {
  ChatOutputDelta out;
  Run(/*final=*/true, &out);
  return out;
}

void ChatOutputParser::Run(bool final, ChatOutputDelta* out) {
  for (;;) {
    bool progressed = false;
    switch (state_) {
      case State::kContent:
        progressed = StepContent(final, out);
        break;
      case State::kReasoning:
        progressed = StepReasoning(final, out);
        break;
      case State::kCall:
        progressed = StepCall(final, out);
        break;
    }
    if (!progressed) return;
  }
}

void ChatOutputParser::EmitContent(std::string_view text, ChatOutputDelta* out) {
  if (text.empty()) return;
  // Whitespace between and after calls is not part of the answer.
  const bool blank = IsBlank(text);
  if (!calls_.empty() && !content_after_call_ && blank) return;
  out->content.append(text);
  content_.append(text);
  if (!blank) {
    saw_content_ = true;
    content_after_call_ = !calls_.empty();
  }
}

bool ChatOutputParser::StepContent(bool final, ChatOutputDelta* out) {
  const bool think = o_.parse_reasoning && !saw_content_ && !saw_reasoning_;
  const bool calls = o_.parse_tool_calls;
  size_t think_at = think ? buf_.find(o_.think_open) : std::string::npos;
  // A reasoning block opens only before any answer text.
  if (think_at != std::string::npos && !IsBlank(std::string_view(buf_).substr(0, think_at))) {
    think_at = std::string::npos;
  }
  const size_t call_at = calls ? buf_.find(kCallOpen) : std::string::npos;
  if (think_at != std::string::npos && (call_at == std::string::npos || think_at < call_at)) {
    EmitContent(std::string_view(buf_).substr(0, think_at), out);
    buf_.erase(0, think_at + o_.think_open.size());
    state_ = State::kReasoning;
    saw_reasoning_ = true;
    return true;
  }
  if (call_at != std::string::npos) {
    EmitContent(std::string_view(buf_).substr(0, call_at), out);
    buf_.erase(0, call_at + kCallOpen.size());
    state_ = State::kCall;
    return true;
  }
  if (final) {
    EmitContent(buf_, out);
    buf_.clear();
    return false;
  }
  size_t hold = 0;
  if (think) hold = std::max(hold, PartialTagSuffix(buf_, o_.think_open));
  if (calls) hold = std::max(hold, PartialTagSuffix(buf_, kCallOpen));
  const std::string_view ready = std::string_view(buf_).substr(0, buf_.size() - hold);
  // Blank text after a call waits: it is dropped unless text follows.
  if (!calls_.empty() && !content_after_call_ && IsBlank(ready)) return false;
  EmitContent(ready, out);
  buf_.erase(0, ready.size());
  return false;
}

bool ChatOutputParser::StepReasoning(bool final, ChatOutputDelta* out) {
  const size_t at = buf_.find(o_.think_close);
  size_t n = buf_.size();
  if (at != std::string::npos) {
    n = at;
  } else if (!final) {
    n -= PartialTagSuffix(buf_, o_.think_close);
  }
  out->reasoning.append(buf_, 0, n);
  reasoning_.append(buf_, 0, n);
  if (at == std::string::npos) {
    buf_.erase(0, n);
    return false;
  }
  buf_.erase(0, at + o_.think_close.size());
  state_ = State::kContent;
  return true;
}

bool ChatOutputParser::StepCall(bool final, ChatOutputDelta* out) {
  // A long call (a file's contents in a parameter) is searched once, not
  // again from its start on every delta.
  const size_t at = buf_.find(kCallClose, call_scanned_);
  if (at == std::string::npos) {
    call_scanned_ = buf_.size() >= kCallClose.size() ? buf_.size() - kCallClose.size() + 1 : 0;
    if (!final) return false;
    // Cut off: the block is text.
    ++rejected_calls_;
    const std::string text = std::string(kCallOpen) + buf_;
    buf_.clear();
    state_ = State::kContent;
    call_scanned_ = 0;
    out->content.append(text);
    content_.append(text);
    saw_content_ = true;
    return false;
  }
  EmitCall(std::string_view(buf_).substr(0, at), out);
  buf_.erase(0, at + kCallClose.size());
  call_scanned_ = 0;
  state_ = State::kContent;
  return true;
}

void ChatOutputParser::EmitCall(std::string_view block, ChatOutputDelta* out) {
  ParsedToolCall call;
  std::vector<std::string> fragments;
  const bool allowed = o_.parallel_tool_calls || calls_.empty();
  if (!allowed || !ParseCall(block, &call, &fragments)) {
    ++rejected_calls_;
    std::string text(kCallOpen);
    text.append(block).append(kCallClose);
    out->content.append(text);
    content_.append(text);
    saw_content_ = true;
    return;
  }
  const int index = static_cast<int>(calls_.size());
  call.id = absl::StrCat("call_", o_.call_id_prefix, index);
  out->tool_calls.push_back({.index = index, .id = call.id, .name = call.name, .arguments = ""});
  for (std::string& f : fragments) {
    call.arguments += f;
    out->tool_calls.push_back({.index = index, .id = "", .name = "", .arguments = std::move(f)});
  }
  calls_.push_back(std::move(call));
  content_after_call_ = false;
}

const ToolDefinition* ChatOutputParser::FindTool(std::string_view name) const {
  for (const ToolDefinition& t : o_.tools) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

bool ChatOutputParser::ParseCall(std::string_view body, ParsedToolCall* call,
                                 std::vector<std::string>* fragments) const {
  if (o_.tool_format == ToolCallFormat::kJsonToolCall) {
    const OJson j = OJson::parse(Trim(body), nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) return false;
    const auto name = j.find("name");
    if (name == j.end() || !name->is_string()) return false;
    if (FindTool(name->get_ref<const std::string&>()) == nullptr) return false;
    OJson args = OJson::object();
    if (const auto a = j.find("arguments"); a != j.end()) {
      args = a->is_string() ? OJson::parse(a->get_ref<const std::string&>(), nullptr, false) : *a;
      if (!args.is_object()) return false;
    }
    call->name = name->get<std::string>();
    *fragments = Fragments(args);
    return true;
  }
  // kXmlFunction.
  std::string_view s = SkipSpace(body);
  if (!s.starts_with(kFunctionOpen)) return false;
  s.remove_prefix(kFunctionOpen.size());
  const size_t name_end = s.find('>');
  if (name_end == std::string_view::npos || name_end == 0) return false;
  const std::string_view name = s.substr(0, name_end);
  if (name.find_first_of(" \t\n<") != std::string_view::npos) return false;
  const ToolDefinition* tool = FindTool(name);
  if (tool == nullptr) return false;
  s.remove_prefix(name_end + 1);
  const OJson* props = nullptr;
  if (tool->parameters.is_object()) {
    const auto p = tool->parameters.find("properties");
    if (p != tool->parameters.end() && p->is_object()) props = &*p;
  }
  OJson args = OJson::object();
  for (;;) {
    s = SkipSpace(s);
    if (s.starts_with(kFunctionClose)) {
      s.remove_prefix(kFunctionClose.size());
      break;
    }
    if (!s.starts_with(kParameterOpen)) return false;
    s.remove_prefix(kParameterOpen.size());
    const size_t pn = s.find('>');
    if (pn == std::string_view::npos || pn == 0) return false;
    const std::string key(s.substr(0, pn));
    if (key.find_first_of(" \t\n<") != std::string::npos || args.contains(key)) return false;
    s.remove_prefix(pn + 1);
    const size_t ve = s.find(kParameterClose);
    if (ve == std::string_view::npos) return false;
    const std::string_view value = s.substr(0, ve);
    s.remove_prefix(ve + kParameterClose.size());
    static const OJson kNoSchema = nullptr;
    const OJson* schema = &kNoSchema;
    if (props != nullptr) {
      if (const auto it = props->find(key); it != props->end()) schema = &*it;
    }
    args[key] = ConvertParameter(value, *schema);
  }
  if (!IsBlank(s)) return false;
  call->name = std::string(name);
  *fragments = Fragments(args);
  return true;
}

}  // namespace swaserve::model
