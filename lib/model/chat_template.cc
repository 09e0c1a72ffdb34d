#include "lib/model/chat_template.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "lib/base/status.h"

namespace swaserve::model {
namespace {

constexpr absl::string_view kImStart = "<|im_start|>";
constexpr absl::string_view kImEnd = "<|im_end|>";

// The rendered prompt as alternating control tokens and text.
struct Segment {
  bool control;
  std::string text;
};

class PromptBuilder {
 public:
  void Control(absl::string_view token) {
    segments_.push_back({true, std::string(token)});
  }
  template <typename... Parts>
  void Text(const Parts&... parts) {
    if (segments_.empty() || segments_.back().control) {
      segments_.push_back({false, std::string()});
    }
    absl::StrAppend(&segments_.back().text, parts...);
  }
  std::vector<Segment> Release() { return std::move(segments_); }

 private:
  std::vector<Segment> segments_;
};

absl::string_view StripLeft(absl::string_view s) {
  while (!s.empty() && s.front() == '\n') s.remove_prefix(1);
  return s;
}
absl::string_view StripRight(absl::string_view s) {
  while (!s.empty() && s.back() == '\n') s.remove_suffix(1);
  return s;
}

// Python's s.split(sep)[0] and s.split(sep)[-1].
absl::string_view BeforeFirst(absl::string_view s, absl::string_view sep) {
  const size_t p = s.find(sep);
  return p == absl::string_view::npos ? s : s.substr(0, p);
}
absl::string_view AfterLast(absl::string_view s, absl::string_view sep) {
  const size_t p = s.rfind(sep);
  return p == absl::string_view::npos ? s : s.substr(p + sep.size());
}

// Qwen3's chat_template, statement by statement (see the header).
absl::StatusOr<std::vector<Segment>> Render(
    absl::Span<const ChatMessage> messages,
    const ChatTemplateOptions& options) {
  if (messages.empty()) {
    return absl::InvalidArgumentError("chat template: no messages");
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    if (role != "system" && role != "user" && role != "assistant" &&
        role != "tool") {
      return absl::InvalidArgumentError(
          absl::StrCat("chat template: messages[", i, "] has unknown role \"",
                       role, "\" (expected system, user, assistant or tool)"));
    }
  }
  // The last user message that is not a wrapped tool response.
  size_t last_query = messages.size() - 1;
  for (size_t k = messages.size(); k-- > 0;) {
    const ChatMessage& m = messages[k];
    if (m.role == "user" && !(absl::StartsWith(m.content, "<tool_response>") &&
                              absl::EndsWith(m.content, "</tool_response>"))) {
      last_query = k;
      break;
    }
  }

  PromptBuilder out;
  const size_t n = messages.size();
  for (size_t i = 0; i < n; ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "system" || m.role == "user") {
      out.Control(kImStart);
      out.Text(m.role, "\n", m.content);
      out.Control(kImEnd);
      out.Text("\n");
    } else if (m.role == "assistant") {
      absl::string_view content = m.content;
      absl::string_view reasoning;
      if (absl::StrContains(m.content, "</think>")) {
        content = StripLeft(AfterLast(m.content, "</think>"));
        reasoning = StripLeft(AfterLast(
            StripRight(BeforeFirst(m.content, "</think>")), "<think>"));
      }
      out.Control(kImStart);
      if (i > last_query && (i + 1 == n || !reasoning.empty())) {
        out.Text("assistant\n<think>\n", StripRight(StripLeft(reasoning)),
                 "\n</think>\n\n", StripLeft(content));
      } else {
        out.Text("assistant\n", content);
      }
      out.Control(kImEnd);
      out.Text("\n");
    } else {  // tool
      if (i == 0 || messages[i - 1].role != "tool") {
        out.Control(kImStart);
        out.Text("user");
      }
      out.Text("\n<tool_response>\n", m.content, "\n</tool_response>");
      if (i + 1 == n || messages[i + 1].role != "tool") {
        out.Control(kImEnd);
        out.Text("\n");
      }
    }
  }
  if (options.add_generation_prompt) {
    out.Control(kImStart);
    out.Text("assistant\n");
    if (options.enable_thinking.has_value() && !*options.enable_thinking) {
      out.Text("<think>\n\n</think>\n\n");
    }
  }
  return out.Release();
}

}  // namespace

absl::StatusOr<std::string> ApplyChatTemplate(
    absl::Span<const ChatMessage> messages, bool add_generation_prompt) {
  ChatTemplateOptions options;
  options.add_generation_prompt = add_generation_prompt;
  return ApplyChatTemplate(messages, options);
}

absl::StatusOr<std::string> ApplyChatTemplate(
    absl::Span<const ChatMessage> messages,
    const ChatTemplateOptions& options) {
  ASSIGN_OR_RETURN(const std::vector<Segment> segments,
                   Render(messages, options));
  std::string prompt;
  for (const Segment& s : segments) prompt += s.text;
  return prompt;
}

namespace {

// Occurrences of the markers in `text`, in order: (byte offset, marker).
absl::StatusOr<std::vector<std::pair<size_t, int>>> FindMarkers(
    absl::string_view text, absl::Span<const std::string> markers) {
  for (size_t a = 0; a < markers.size(); ++a) {
    if (markers[a].empty()) return absl::InvalidArgumentError("empty marker");
    for (size_t b = 0; b < markers.size(); ++b) {
      if (a != b && absl::StartsWith(markers[b], markers[a])) {
        return absl::InvalidArgumentError(absl::StrCat(
            "marker \"", markers[a], "\" is a prefix of \"", markers[b], "\""));
      }
    }
  }
  std::vector<std::pair<size_t, int>> out;
  if (markers.empty()) return out;
  for (size_t pos = 0; pos < text.size();) {
    int found = -1;
    for (size_t m = 0; m < markers.size() && found < 0; ++m) {
      if (absl::StartsWith(text.substr(pos), markers[m])) found = static_cast<int>(m);
    }
    if (found < 0) {
      ++pos;
      continue;
    }
    out.emplace_back(pos, found);
    pos += markers[found].size();
  }
  return out;
}

// Encodes `text` piece by piece between the markers with `encode(begin,
// end, ids)`, recording the cuts.
template <typename EncodePiece>
absl::Status EncodeCut(absl::string_view text, absl::Span<const std::string> markers,
                       EncodePiece encode, std::vector<uint32_t>* ids,
                       std::vector<MarkerCut>* cuts) {
  ASSIGN_OR_RETURN(const auto found, FindMarkers(text, markers));
  size_t begin = 0;
  for (const auto& [pos, marker] : found) {
    if (pos > begin) RETURN_IF_ERROR(encode(begin, pos, ids));
    cuts->push_back({.marker = marker, .token_offset = ids->size()});
    begin = pos + markers[marker].size();
  }
  if (begin < text.size()) RETURN_IF_ERROR(encode(begin, text.size(), ids));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<uint32_t>> EncodeSegments(
    const Tokenizer& tokenizer, absl::Span<const ChatMessage> messages,
    const ChatTemplateOptions& options, absl::Span<const std::string> markers,
    std::vector<MarkerCut>* cuts) {
  const std::optional<uint32_t> im_start = tokenizer.TokenId(kImStart);
  const std::optional<uint32_t> im_end = tokenizer.TokenId(kImEnd);
  if (!im_start || !im_end) {
    return absl::FailedPreconditionError(
        "chat template: the tokenizer has no <|im_start|>/<|im_end|> tokens");
  }
  ASSIGN_OR_RETURN(const std::vector<Segment> segments,
                   Render(messages, options));
  std::vector<uint32_t> ids;
  for (const Segment& s : segments) {
    if (s.control) {
      ids.push_back(s.text == kImStart ? *im_start : *im_end);
      continue;
    }
    const absl::string_view text = s.text;
    RETURN_IF_ERROR(EncodeCut(
        text, markers,
        [&](size_t b, size_t e, std::vector<uint32_t>* out) {
          return tokenizer.EncodeAppend(text.substr(b, e - b), /*parse_special=*/false, out);
        },
        &ids, cuts));
  }
  return ids;
}

}  // namespace

absl::StatusOr<std::vector<uint32_t>> EncodeChat(
    const Tokenizer& tokenizer, absl::Span<const ChatMessage> messages,
    const ChatTemplateOptions& options) {
  std::vector<MarkerCut> none;
  return EncodeSegments(tokenizer, messages, options, {}, &none);
}

absl::StatusOr<std::vector<uint32_t>> EncodeChatWithMarkers(
    const Tokenizer& tokenizer, absl::Span<const ChatMessage> messages,
    const ChatTemplateOptions& options, absl::Span<const std::string> markers,
    std::vector<MarkerCut>* cuts) {
  cuts->clear();
  return EncodeSegments(tokenizer, messages, options, markers, cuts);
}

absl::StatusOr<std::vector<uint32_t>> EncodeTextWithMarkers(
    const Tokenizer& tokenizer, absl::string_view text,
    absl::Span<const std::string> markers, std::vector<MarkerCut>* cuts) {
  cuts->clear();
  std::vector<uint32_t> ids;
  RETURN_IF_ERROR(EncodeCut(
      text, markers,
      [&](size_t b, size_t e, std::vector<uint32_t>* out) {
        return tokenizer.EncodeAppend(text.substr(b, e - b), /*parse_special=*/true, out);
      },
      &ids, cuts));
  return ids;
}

namespace {

using OJson = nlohmann::ordered_json;
namespace fs = std::filesystem;

constexpr char kBuiltinOrigin[] = "built-in Qwen3 ChatML";

absl::StatusOr<std::string> ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return absl::NotFoundError(absl::StrCat(path.string(), ": cannot open"));
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// A special token of tokenizer_config.json: a string, an AddedToken
// {"content": ...}, or null / absent.
std::optional<std::string> TokenField(const OJson& config, const char* key) {
  const auto it = config.find(key);
  if (it == config.end()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    const auto c = it->find("content");
    if (c != it->end() && c->is_string()) return c->get<std::string>();
  }
  return std::nullopt;
}

// The built-in template's view of `input`, or InvalidArgument for what it
// cannot render.
absl::Status ToBuiltin(const ChatInput& input, std::vector<ChatMessage>* out,
                       ChatTemplateOptions* options) {
  auto unsupported = [](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(
        what,
        " needs the checkpoint's own chat template (this checkpoint has "
        "none; the built-in Qwen3 ChatML template takes only string "
        "contents)"));
  };
  if (!input.messages.is_array()) {
    return absl::InvalidArgumentError("messages must be an array");
  }
  if (!input.tools.is_null() &&
      !(input.tools.is_array() && input.tools.empty())) {
    return unsupported("tools");
  }
  for (size_t i = 0; i < input.messages.size(); ++i) {
    const OJson& m = input.messages[i];
    const std::string where = absl::StrCat("messages[", i, "]");
    if (!m.is_object())
      return absl::InvalidArgumentError(where + " is not an object");
    const auto role = m.find("role");
    if (role == m.end() || !role->is_string()) {
      return absl::InvalidArgumentError(where + " has no string \"role\"");
    }
    const auto content = m.find("content");
    if (content == m.end() || !content->is_string()) {
      return unsupported(where + ": content that is not a string");
    }
    if (m.contains("tool_calls")) return unsupported(where + ".tool_calls");
    if (m.contains("reasoning_content")) {
      return unsupported(where + ".reasoning_content");
    }
    out->push_back({role->get<std::string>(), content->get<std::string>()});
  }
  options->add_generation_prompt = input.add_generation_prompt;
  if (input.kwargs.is_object()) {
    const auto t = input.kwargs.find("enable_thinking");
    if (t != input.kwargs.end() && t->is_boolean()) {
      options->enable_thinking = t->get<bool>();
    }
  }
  return absl::OkStatus();
}

}  // namespace

ChatInput ToChatInput(absl::Span<const ChatMessage> messages,
                      const ChatTemplateOptions& options) {
  ChatInput input;
  for (const ChatMessage& m : messages) {
    input.messages.push_back(OJson{{"role", m.role}, {"content", m.content}});
  }
  input.add_generation_prompt = options.add_generation_prompt;
  if (options.enable_thinking.has_value()) {
    input.kwargs["enable_thinking"] = *options.enable_thinking;
  }
  return input;
}

ChatTemplate::~ChatTemplate() = default;

std::unique_ptr<ChatTemplate> ChatTemplate::Builtin() {
  std::unique_ptr<ChatTemplate> t(new ChatTemplate());
  t->origin_ = kBuiltinOrigin;
  return t;
}

absl::StatusOr<std::unique_ptr<ChatTemplate>> ChatTemplate::FromJinja(
    std::string source, ChatTemplateTokens tokens,
    const jinja::RenderLimits& limits) {
  std::unique_ptr<ChatTemplate> t(new ChatTemplate());
  t->origin_ = "(given)";
  t->tokens_ = std::move(tokens);
  t->limits_ = limits;
  absl::StatusOr<std::unique_ptr<jinja::Template>> parsed =
      jinja::Template::Parse(std::move(source));
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("chat template: ", parsed.status().message()));
  }
  t->templates_["default"] = *std::move(parsed);
  return t;
}

absl::StatusOr<std::unique_ptr<ChatTemplate>> ChatTemplate::FromCheckpointDir(
    const std::string& dir, const jinja::RenderLimits& limits) {
  const fs::path root(dir);
  std::error_code ec;
  OJson config = OJson::object();
  const fs::path config_path = root / "tokenizer_config.json";
  if (fs::is_regular_file(config_path, ec)) {
    ASSIGN_OR_RETURN(const std::string text, ReadFile(config_path));
    config = OJson::parse(text, nullptr, /*allow_exceptions=*/false);
    if (config.is_discarded() || !config.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(config_path.string(), ": not a JSON object"));
    }
  }
  ChatTemplateTokens tokens{.bos_token = TokenField(config, "bos_token"),
                            .eos_token = TokenField(config, "eos_token"),
                            .unk_token = TokenField(config, "unk_token"),
                            .pad_token = TokenField(config, "pad_token")};
  std::map<std::string, std::string> sources;
  std::string origin;
  const fs::path jinja_path = root / "chat_template.jinja";
  if (fs::is_regular_file(jinja_path, ec)) {
    ASSIGN_OR_RETURN(sources["default"], ReadFile(jinja_path));
    origin = jinja_path.string();
  } else if (const auto it = config.find("chat_template"); it != config.end()) {
    origin = config_path.string();
    if (it->is_string()) {
      sources["default"] = it->get<std::string>();
    } else if (it->is_array()) {
      for (const OJson& named : *it) {
        if (!named.is_object() || !named.contains("name") ||
            !named["name"].is_string() || !named.contains("template") ||
            !named["template"].is_string()) {
          return absl::InvalidArgumentError(
              absl::StrCat(origin,
                           ": chat_template must be a string or a list of "
                           "{\"name\", \"template\"} objects"));
        }
        sources[named["name"].get<std::string>()] =
            named["template"].get<std::string>();
      }
      if (!sources.contains("default")) {
        return absl::InvalidArgumentError(absl::StrCat(
            origin, ": chat_template has no template named \"default\""));
      }
    } else if (!it->is_null()) {
      return absl::InvalidArgumentError(
          absl::StrCat(origin, ": chat_template must be a string or a list"));
    }
  }
  if (sources.empty()) return Builtin();
  std::unique_ptr<ChatTemplate> t(new ChatTemplate());
  t->origin_ = origin;
  t->tokens_ = std::move(tokens);
  t->limits_ = limits;
  for (auto& [name, source] : sources) {
    absl::StatusOr<std::unique_ptr<jinja::Template>> parsed =
        jinja::Template::Parse(std::move(source));
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "chat template ", origin,
          name == "default" ? "" : absl::StrCat(" (\"", name, "\")"), ": ",
          parsed.status().message()));
    }
    t->templates_[name] = *std::move(parsed);
  }
  return t;
}

absl::StatusOr<jinja::Rendered> ChatTemplate::Render(
    const ChatInput& input) const {
  if (!input.messages.is_array()) {
    return absl::InvalidArgumentError("messages must be an array");
  }
  if (!input.kwargs.is_object()) {
    return absl::InvalidArgumentError("chat template kwargs must be an object");
  }
  OJson context = OJson::object();
  context["messages"] = input.messages;
  context["tools"] = input.tools;
  context["documents"] = nullptr;
  context["add_generation_prompt"] = input.add_generation_prompt;
  jinja::RenderOptions options{.limits = limits_};
  const std::pair<const char*, const std::optional<std::string>*> tokens[] = {
      {"bos_token", &tokens_.bos_token},
      {"eos_token", &tokens_.eos_token},
      {"unk_token", &tokens_.unk_token},
      {"pad_token", &tokens_.pad_token}};
  for (const auto& [name, value] : tokens) {
    if (!value->has_value() || input.kwargs.contains(name)) continue;
    context[name] = **value;
    options.trusted_keys.push_back(name);
  }
  for (auto it = input.kwargs.begin(); it != input.kwargs.end(); ++it) {
    if (it.key() == "messages" || it.key() == "tools" ||
        it.key() == "documents" || it.key() == "add_generation_prompt") {
      return absl::InvalidArgumentError(
          absl::StrCat("chat template kwargs cannot set \"", it.key(), "\""));
    }
    context[it.key()] = it.value();
  }
  const jinja::Template* t = templates_.at("default").get();
  if (!input.tools.is_null()) {
    if (const auto it = templates_.find("tool_use"); it != templates_.end()) {
      t = it->second.get();
    }
  }
  absl::StatusOr<jinja::Rendered> rendered = t->Render(context, options);
  if (!rendered.ok()) {
    absl::Status st = absl::InvalidArgumentError(absl::StrCat(
        "chat template ", origin_, ": ", rendered.status().message()));
    if (auto raised = rendered.status().GetPayload(jinja::kRaisedPayload)) {
      st.SetPayload(jinja::kRaisedPayload, *raised);
    }
    return st;
  }
  return rendered;
}

absl::StatusOr<std::string> ChatTemplate::Apply(const ChatInput& input) const {
  if (is_builtin()) {
    std::vector<ChatMessage> messages;
    ChatTemplateOptions options;
    RETURN_IF_ERROR(ToBuiltin(input, &messages, &options));
    return ApplyChatTemplate(messages, options);
  }
  ASSIGN_OR_RETURN(jinja::Rendered r, Render(input));
  return std::move(r.text);
}

absl::StatusOr<std::vector<uint32_t>> ChatTemplate::Encode(
    const Tokenizer& tokenizer, const ChatInput& input) const {
  std::vector<MarkerCut> none;
  return EncodeWithMarkers(tokenizer, input, {}, &none);
}

absl::StatusOr<std::vector<uint32_t>> ChatTemplate::EncodeWithMarkers(
    const Tokenizer& tokenizer, const ChatInput& input,
    absl::Span<const std::string> markers, std::vector<MarkerCut>* cuts) const {
  cuts->clear();
  if (is_builtin()) {
    std::vector<ChatMessage> messages;
    ChatTemplateOptions options;
    RETURN_IF_ERROR(ToBuiltin(input, &messages, &options));
    return EncodeSegments(tokenizer, messages, options, markers, cuts);
  }
  ASSIGN_OR_RETURN(const jinja::Rendered r, Render(input));
  const absl::string_view text = r.text;
  std::vector<uint32_t> ids;
  // Each piece keeps the parts of the untrusted ranges that fall in it.
  RETURN_IF_ERROR(EncodeCut(
      text, markers,
      [&](size_t b, size_t e, std::vector<uint32_t>* out) {
        std::vector<std::pair<size_t, size_t>> literal;
        for (const jinja::ByteRange& u : r.untrusted) {
          const size_t lo = std::max<size_t>(u.begin, b), hi = std::min<size_t>(u.end, e);
          if (lo < hi) literal.emplace_back(lo - b, hi - b);
        }
        return tokenizer.EncodeAppendWithLiterals(text.substr(b, e - b), literal, out);
      },
      &ids, cuts));
  return ids;
}

}  // namespace swaserve::model
