// POST /v1/messages and /v1/messages/count_tokens bodies into
// v1::GenerateRequest (anthropic.h says how each field maps).
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "lib/api/anthropic.h"
#include "lib/api/openai_read.h"
#include "lib/base/multimodal.h"

namespace swaserve::api {
namespace {

using namespace openai_internal;  // NOLINT: the shared readers and JSON helpers

// Anthropic's limit on cache_control breakpoints per request.
constexpr int kMaxBreakpoints = 4;

ApiError Unrecognized(const std::string& field) {
  return InvalidRequestError(Cat({field, ": Extra inputs are not permitted"}), field,
                             "unrecognized_argument");
}

// Every key of `obj` is in `allowed` (`param` prefixes the error's field).
Error CheckKeys(const json& obj, const std::string& param,
                std::initializer_list<std::string_view> allowed) {
  for (const auto& [key, value] : obj.items()) {
    bool known = false;
    for (std::string_view a : allowed) known = known || key == a;
    if (!known) return Unrecognized(param.empty() ? Shorten(key) : Cat({param, ".", Shorten(key)}));
  }
  return std::nullopt;
}

// What the parse of one request collects besides the GenerateRequest.
struct MessagesState {
  v1::GenerateRequest* req = nullptr;
  std::vector<std::string> tool_names;
};

// A block's cache_control: {"type": "ephemeral", "ttl"?: "5m" | "1h"}
// recorded as a breakpoint at `message_index`.
Error ReadCacheControl(const json& block, const std::string& param, int message_index,
                       MessagesState* st) {
  const json* cc = Find(block, "cache_control");
  if (cc == nullptr) return std::nullopt;
  const std::string p = Cat({param, ".cache_control"});
  if (!cc->is_object()) return TypeError(p, "an object", *cc);
  if (Error e = CheckKeys(*cc, p, {"type", "ttl"})) return e;
  const json* type = Find(*cc, "type");
  if (type == nullptr || !type->is_string() || *type != "ephemeral") {
    return ValueError(Cat({p, ".type"}), "only 'ephemeral' is supported.");
  }
  uint32_t ttl = 300;
  if (const json* t = Find(*cc, "ttl")) {
    if (!t->is_string() || (*t != "5m" && *t != "1h")) {
      return ValueError(Cat({p, ".ttl"}), "expected '5m' or '1h'.");
    }
    if (*t == "1h") ttl = 3600;
  }
  v1::ChatMessages* chat = st->req->mutable_chat();
  if (chat->cache_breakpoints_size() >= kMaxBreakpoints) {
    return InvalidRequestError(
        Cat({"A maximum of ", std::to_string(kMaxBreakpoints),
             " blocks with cache_control may be provided."}),
        p, "invalid_value");
  }
  v1::CacheBreakpoint* b = chat->add_cache_breakpoints();
  b->set_message_index(message_index);
  b->set_ttl_seconds(ttl);
  return std::nullopt;
}

Error RequiredString(const json& obj, const std::string& param, const char* key, std::string* out) {
  const json* v = Find(obj, key);
  if (v == nullptr) return MissingParam(Cat({param, ".", key}));
  return ReadString(*v, Cat({param, ".", key}), out);
}

// A text block's text ({"type": "text", "text", "cache_control"?,
// "citations"?}).
Error ReadTextBlock(const json& block, const std::string& param, std::string* text) {
  if (Error e = CheckKeys(block, param, {"type", "text", "cache_control", "citations"})) return e;
  return RequiredString(block, param, "text", text);
}

// An image block as the OpenAI image part it equals: base64 becomes a data:
// URL, url stays a URL.
Error ReadImageBlock(const json& block, const std::string& param, v1::MultimodalItem* item) {
  if (Error e = CheckKeys(block, param, {"type", "source", "cache_control"})) return e;
  const json* src = Find(block, "source");
  const std::string sp = Cat({param, ".source"});
  if (src == nullptr) return MissingParam(sp);
  if (!src->is_object()) return TypeError(sp, "an object", *src);
  std::string type;
  if (Error e = RequiredString(*src, sp, "type", &type)) return e;
  item->set_modality(v1::MODALITY_IMAGE);
  if (type == "base64") {
    if (Error e = CheckKeys(*src, sp, {"type", "media_type", "data"})) return e;
    std::string media_type, data;
    if (Error e = RequiredString(*src, sp, "media_type", &media_type)) return e;
    if (media_type != "image/jpeg" && media_type != "image/png" && media_type != "image/gif" &&
        media_type != "image/webp") {
      return ValueError(Cat({sp, ".media_type"}),
                        "expected 'image/jpeg', 'image/png', 'image/gif' or 'image/webp'.");
    }
    if (Error e = RequiredString(*src, sp, "data", &data)) return e;
    if (data.empty()) return ValueError(Cat({sp, ".data"}), "the image data is empty.");
    item->set_url(Cat({"data:", media_type, ";base64,", data}));
    return std::nullopt;
  }
  if (type == "url") {
    if (Error e = CheckKeys(*src, sp, {"type", "url"})) return e;
    std::string url;
    if (Error e = RequiredString(*src, sp, "url", &url)) return e;
    if (url.empty()) return ValueError(Cat({sp, ".url"}), "the URL is empty.");
    item->set_url(std::move(url));
    return std::nullopt;
  }
  return ValueError(Cat({sp, ".type"}), "expected 'base64' or 'url'.");
}

// A tool_result block's content: a string or text (and image) blocks,
// joined with "\n"; "Error: " before it when is_error.
Error ReadToolResult(const json& block, const std::string& param, v1::ChatMessage* msg,
                     v1::GenerateRequest* req) {
  if (Error e = CheckKeys(block, param,
                          {"type", "tool_use_id", "content", "is_error", "cache_control"})) {
    return e;
  }
  msg->set_role("tool");
  if (Error e = RequiredString(block, param, "tool_use_id", msg->mutable_tool_call_id())) return e;
  bool is_error = false;
  if (const json* v = Find(block, "is_error")) {
    if (Error e = ReadBool(*v, Cat({param, ".is_error"}), &is_error)) return e;
  }
  std::string text;
  if (const json* c = Find(block, "content")) {
    const std::string cp = Cat({param, ".content"});
    if (c->is_string()) {
      text = c->get<std::string>();
    } else if (c->is_array()) {
      for (size_t i = 0; i < c->size(); ++i) {
        const json& b = (*c)[i];
        const std::string bp = IndexedParam(cp, i);
        if (!b.is_object()) return TypeError(bp, "an object", b);
        std::string type;
        if (Error e = RequiredString(b, bp, "type", &type)) return e;
        if (i > 0) text.push_back('\n');
        if (type == "text") {
          std::string t;
          if (Error e = ReadTextBlock(b, bp, &t)) return e;
          text += t;
        } else if (type == "image") {
          if (Error e = ReadImageBlock(b, bp, req->add_multimodal())) return e;
          text.append(base::kImageMarker);
        } else {
          return ValueError(Cat({bp, ".type"}), "expected 'text' or 'image'.");
        }
      }
    } else {
      return TypeError(cp, "a string or an array of content blocks", *c);
    }
  }
  msg->set_content(is_error ? Cat({"Error: ", text}) : std::move(text));
  return std::nullopt;
}

// A user turn: tool_result blocks become tool messages (in order), the text
// and image blocks one user message after them.
Error ReadUserMessage(const json& content, const std::string& param, MessagesState* st) {
  v1::ChatMessages* chat = st->req->mutable_chat();
  if (content.is_string()) {
    v1::ChatMessage* m = chat->add_messages();
    m->set_role("user");
    m->set_content(content.get<std::string>());
    return std::nullopt;
  }
  std::string text;
  bool has_user_part = false;
  // Breakpoints on text/image blocks: at the user message, made last.
  std::vector<const json*> user_blocks;
  std::vector<std::string> user_params;
  for (size_t i = 0; i < content.size(); ++i) {
    const json& b = content[i];
    const std::string bp = IndexedParam(param, i);
    if (!b.is_object()) return TypeError(bp, "an object", b);
    std::string type;
    if (Error e = RequiredString(b, bp, "type", &type)) return e;
    if (type == "tool_result") {
      if (has_user_part) {
        return InvalidRequestError(
            Cat({bp, ": tool_result blocks must come before any other content in a user turn."}),
            bp, "invalid_value");
      }
      if (Error e = ReadToolResult(b, bp, chat->add_messages(), st->req)) return e;
      if (Error e = ReadCacheControl(b, bp, chat->messages_size() - 1, st)) return e;
      continue;
    }
    if (has_user_part) text.push_back('\n');
    has_user_part = true;
    if (type == "text") {
      std::string t;
      if (Error e = ReadTextBlock(b, bp, &t)) return e;
      text += t;
    } else if (type == "image") {
      if (Error e = ReadImageBlock(b, bp, st->req->add_multimodal())) return e;
      text.append(base::kImageMarker);
    } else {
      return ValueError(Cat({bp, ".type"}),
                        Cat({"'", Shorten(type),
                             "' is not a user content block here (text, image, tool_result "
                             "are)."}));
    }
    user_blocks.push_back(&b);
    user_params.push_back(bp);
  }
  if (!has_user_part) return std::nullopt;
  v1::ChatMessage* m = chat->add_messages();
  m->set_role("user");
  m->set_content(std::move(text));
  for (size_t i = 0; i < user_blocks.size(); ++i) {
    if (Error e = ReadCacheControl(*user_blocks[i], user_params[i], chat->messages_size() - 1, st)) {
      return e;
    }
  }
  return std::nullopt;
}

Error ReadToolUse(const json& b, const std::string& bp, v1::ChatMessage* msg) {
  if (Error e = CheckKeys(b, bp, {"type", "id", "name", "input", "cache_control"})) return e;
  v1::ToolCall* call = msg->add_tool_calls();
  if (Error e = RequiredString(b, bp, "id", call->mutable_id())) return e;
  if (Error e = RequiredString(b, bp, "name", call->mutable_name())) return e;
  const json* input = Find(b, "input");
  if (input == nullptr) return MissingParam(Cat({bp, ".input"}));
  if (!input->is_object()) return TypeError(Cat({bp, ".input"}), "an object", *input);
  call->set_arguments(Dump(*input));
  return std::nullopt;
}

// An assistant turn: text, thinking, redacted_thinking and tool_use blocks.
Error ReadAssistantMessage(const json& content, const std::string& param, MessagesState* st) {
  v1::ChatMessages* chat = st->req->mutable_chat();
  v1::ChatMessage* m = chat->add_messages();
  const int index = chat->messages_size() - 1;
  m->set_role("assistant");
  if (content.is_string()) {
    m->set_content(content.get<std::string>());
    return std::nullopt;
  }
  bool has_text = false;
  std::string text, reasoning;
  for (size_t i = 0; i < content.size(); ++i) {
    const json& b = content[i];
    const std::string bp = IndexedParam(param, i);
    if (!b.is_object()) return TypeError(bp, "an object", b);
    std::string type;
    if (Error e = RequiredString(b, bp, "type", &type)) return e;
    if (type == "text") {
      std::string t;
      if (Error e = ReadTextBlock(b, bp, &t)) return e;
      if (has_text) text.push_back('\n');
      has_text = true;
      text += t;
    } else if (type == "thinking") {
      if (Error e = CheckKeys(b, bp, {"type", "thinking", "signature"})) return e;
      std::string t;
      if (Error e = RequiredString(b, bp, "thinking", &t)) return e;
      if (!reasoning.empty() && !t.empty()) reasoning.push_back('\n');
      reasoning += t;
    } else if (type == "redacted_thinking") {
      if (Error e = CheckKeys(b, bp, {"type", "data"})) return e;
    } else if (type == "tool_use") {
      if (Error e = ReadToolUse(b, bp, m)) return e;
    } else {
      return ValueError(Cat({bp, ".type"}),
                        Cat({"'", Shorten(type),
                             "' is not an assistant content block (text, thinking, "
                             "redacted_thinking, tool_use are)."}));
    }
    if (Error e = ReadCacheControl(b, bp, index, st)) return e;
  }
  if (!reasoning.empty()) m->set_reasoning_content(std::move(reasoning));
  if (has_text) {
    m->set_content(std::move(text));
  } else if (m->tool_calls_size() > 0) {
    m->set_content_null(true);  // as an OpenAI client sends a turn of calls alone
  }
  return std::nullopt;
}

Error ReadSystem(const json& body, MessagesState* st) {
  const json* v = Find(body, "system");
  if (v == nullptr) return std::nullopt;
  v1::ChatMessages* chat = st->req->mutable_chat();
  if (v->is_string()) {
    v1::ChatMessage* m = chat->add_messages();
    m->set_role("system");
    m->set_content(v->get<std::string>());
    return std::nullopt;
  }
  if (!v->is_array()) return TypeError("system", "a string or an array of text blocks", *v);
  v1::ChatMessage* m = chat->add_messages();
  m->set_role("system");
  std::string text;
  for (size_t i = 0; i < v->size(); ++i) {
    const json& b = (*v)[i];
    const std::string bp = IndexedParam("system", i);
    if (!b.is_object()) return TypeError(bp, "an object", b);
    std::string type;
    if (Error e = RequiredString(b, bp, "type", &type)) return e;
    if (type != "text") return ValueError(Cat({bp, ".type"}), "system blocks are 'text' blocks.");
    std::string t;
    if (Error e = ReadTextBlock(b, bp, &t)) return e;
    if (i > 0) text.push_back('\n');
    text += t;
    if (Error e = ReadCacheControl(b, bp, 0, st)) return e;
  }
  m->set_content(std::move(text));
  return std::nullopt;
}

Error ReadMessages(const json& body, MessagesState* st) {
  const json* v = Find(body, "messages");
  if (v == nullptr) return MissingParam("messages");
  if (!v->is_array()) return TypeError("messages", "an array", *v);
  if (v->empty()) return ValueError("messages", "at least one message is required.");
  for (size_t i = 0; i < v->size(); ++i) {
    const json& m = (*v)[i];
    const std::string param = IndexedParam("messages", i);
    if (!m.is_object()) return TypeError(param, "an object", m);
    if (Error e = CheckKeys(m, param, {"role", "content"})) return e;
    std::string role;
    if (Error e = RequiredString(m, param, "role", &role)) return e;
    if (role != "user" && role != "assistant") {
      return ValueError(Cat({param, ".role"}), "expected 'user' or 'assistant'.");
    }
    const json* content = Find(m, "content");
    const std::string cp = Cat({param, ".content"});
    if (content == nullptr) return MissingParam(cp);
    if (!content->is_string() && !content->is_array()) {
      return TypeError(cp, "a string or an array of content blocks", *content);
    }
    Error e = role == "user" ? ReadUserMessage(*content, cp, st)
                             : ReadAssistantMessage(*content, cp, st);
    if (e) return e;
  }
  st->req->mutable_chat()->set_add_generation_prompt(true);
  return std::nullopt;
}

// tools: [{"name", "description"?, "input_schema", "cache_control"?,
// "type"?: "custom"}] as the OpenAI function tools they equal.
Error ReadTools(const json& body, MessagesState* st) {
  const json* v = Find(body, "tools");
  if (v == nullptr) return std::nullopt;
  if (!v->is_array()) return TypeError("tools", "an array", *v);
  if (v->size() > 128) return ValueError("tools", "at most 128 tools are allowed.");
  json tools = json::array();
  for (size_t i = 0; i < v->size(); ++i) {
    const json& t = (*v)[i];
    const std::string tp = IndexedParam("tools", i);
    if (!t.is_object()) return TypeError(tp, "an object", t);
    if (Error e = CheckKeys(t, tp, {"type", "name", "description", "input_schema",
                                    "cache_control"})) {
      return e;
    }
    if (const json* type = Find(t, "type"); type != nullptr && *type != "custom") {
      return ValueError(Cat({tp, ".type"}),
                        "only client tools ('custom') are supported; this server runs no "
                        "server tools.");
    }
    std::string name;
    if (Error e = RequiredString(t, tp, "name", &name)) return e;
    json f = json::object();
    f["name"] = name;
    if (const json* d = Find(t, "description")) {
      if (!d->is_string()) return TypeError(Cat({tp, ".description"}), "a string", *d);
      f["description"] = *d;
    }
    const json* schema = Find(t, "input_schema");
    if (schema == nullptr) return MissingParam(Cat({tp, ".input_schema"}));
    if (!schema->is_object()) return TypeError(Cat({tp, ".input_schema"}), "an object", *schema);
    f["parameters"] = *schema;
    tools.push_back(json{{"type", "function"}, {"function", std::move(f)}});
    if (Error e = ReadCacheControl(t, tp, -1, st)) return e;
  }
  // The OpenAI reader checks names (pattern, duplicates) and stores them.
  return ParseTools(tools, st->req, &st->tool_names);
}

// tool_choice: {"type": "auto" | "any" | "none" | "tool", "name"?,
// "disable_parallel_tool_use"?}.
Error ReadToolChoice(const json& body, MessagesState* st) {
  const json* v = Find(body, "tool_choice");
  if (v == nullptr) return std::nullopt;
  if (!v->is_object()) return TypeError("tool_choice", "an object", *v);
  if (Error e = CheckKeys(*v, "tool_choice", {"type", "name", "disable_parallel_tool_use"})) {
    return e;
  }
  std::string type;
  if (Error e = RequiredString(*v, "tool_choice", "type", &type)) return e;
  json openai;
  if (type == "auto") {
    openai = "auto";
  } else if (type == "any") {
    openai = "required";
  } else if (type == "none") {
    openai = "none";
  } else if (type == "tool") {
    std::string name;
    if (Error e = RequiredString(*v, "tool_choice", "name", &name)) return e;
    openai = json{{"type", "function"}, {"function", {{"name", name}}}};
  } else {
    return ValueError("tool_choice.type", "expected 'auto', 'any', 'tool' or 'none'.");
  }
  if (type != "tool" && Find(*v, "name") != nullptr) {
    return Unrecognized("tool_choice.name");
  }
  if (Error e = ParseToolChoice(openai, st->tool_names, st->req)) {
    e->param = "tool_choice";
    return e;
  }
  if (const json* d = Find(*v, "disable_parallel_tool_use")) {
    bool disable = false;
    if (Error e = ReadBool(*d, "tool_choice.disable_parallel_tool_use", &disable)) return e;
    if (disable) st->req->set_parallel_tool_calls(false);
  }
  return std::nullopt;
}

// thinking: {"type": "enabled", "budget_tokens"} or {"type": "disabled"} as
// the template's enable_thinking.
Error ReadThinking(const json& body, uint32_t max_tokens, MessagesState* st) {
  const json* v = Find(body, "thinking");
  if (v == nullptr) return std::nullopt;
  if (!v->is_object()) return TypeError("thinking", "an object", *v);
  std::string type;
  if (Error e = RequiredString(*v, "thinking", "type", &type)) return e;
  bool enabled = false;
  if (type == "enabled") {
    if (Error e = CheckKeys(*v, "thinking", {"type", "budget_tokens"})) return e;
    const json* b = Find(*v, "budget_tokens");
    if (b == nullptr) return MissingParam("thinking.budget_tokens");
    uint64_t budget = 0;
    if (Error e = ReadInt(*b, "thinking.budget_tokens", 1024,
                          std::numeric_limits<uint32_t>::max(), &budget)) {
      return e;
    }
    if (max_tokens > 0 && budget >= max_tokens) {
      return ValueError("thinking.budget_tokens", "must be less than max_tokens.");
    }
    enabled = true;
  } else if (type == "disabled") {
    if (Error e = CheckKeys(*v, "thinking", {"type"})) return e;
  } else {
    return ValueError("thinking.type", "expected 'enabled' or 'disabled'.");
  }
  st->req->mutable_chat()->set_template_kwargs_json(
      Dump(ojson{{"enable_thinking", enabled}}));
  return std::nullopt;
}

Error ReadSampling(const json& body, const ParseLimits& limits, ParsedRequest* out) {
  v1::SamplingParams& s = *out->request.mutable_sampling();
  s.set_temperature(1.0f);
  s.set_top_p(1.0f);
  if (const json* v = Find(body, "temperature")) {
    double t = 0;
    if (Error e = ReadNumber(*v, "temperature", &t)) return e;
    if (!(t >= 0.0 && t <= 1.0)) return ValueError("temperature", "expected a number in [0, 1].");
    s.set_temperature(static_cast<float>(t));
  }
  if (const json* v = Find(body, "top_p")) {
    double p = 0;
    if (Error e = ReadNumber(*v, "top_p", &p)) return e;
    if (!(p > 0.0 && p <= 1.0)) return ValueError("top_p", "expected a number in (0, 1].");
    s.set_top_p(static_cast<float>(p));
  }
  if (const json* v = Find(body, "top_k")) {
    uint64_t k = 0;
    if (Error e = ReadInt(*v, "top_k", 0, std::numeric_limits<uint32_t>::max(), &k)) return e;
    s.set_top_k(static_cast<uint32_t>(k));
  }
  if (const json* v = Find(body, "stop_sequences")) {
    if (!v->is_array()) return TypeError("stop_sequences", "an array of strings", *v);
    if (v->size() > limits.max_stop) {
      return ValueError("stop_sequences",
                        Cat({"at most ", std::to_string(limits.max_stop), " are allowed."}));
    }
    for (size_t i = 0; i < v->size(); ++i) {
      std::string stop;
      if (Error e = ReadString((*v)[i], IndexedParam("stop_sequences", i), &stop)) return e;
      if (stop.empty()) return ValueError("stop_sequences", "stop sequences must not be empty.");
      s.add_stop(std::move(stop));
    }
  }
  if (const json* v = Find(body, "stream")) {
    if (Error e = ReadBool(*v, "stream", &out->stream)) return e;
  }
  if (const json* v = Find(body, "metadata")) {
    if (!v->is_object()) return TypeError("metadata", "an object", *v);
    if (Error e = CheckKeys(*v, "metadata", {"user_id"})) return e;
    if (const json* u = Find(*v, "user_id")) {
      std::string user;
      if (Error e = ReadString(*u, "metadata.user_id", &user)) return e;
      if (user.size() > 256) return ValueError("metadata.user_id", "at most 256 characters.");
    }
  }
  if (const json* v = Find(body, "service_tier")) {
    if (!v->is_string() || (*v != "auto" && *v != "standard_only")) {
      return ValueError("service_tier", "expected 'auto' or 'standard_only'.");
    }
  }
  return std::nullopt;
}

Error ReadModel(const json& body, std::string* model) {
  const json* v = Find(body, "model");
  if (v == nullptr) return MissingParam("model");
  if (Error e = ReadString(*v, "model", model)) return e;
  if (model->empty()) return ValueError("model", "the model name is empty.");
  return std::nullopt;
}

// The chat parts both endpoints share.
Error ReadChat(const json& body, uint32_t max_tokens, MessagesState* st) {
  if (Error e = ReadTools(body, st)) return e;
  if (Error e = ReadSystem(body, st)) return e;
  if (Error e = ReadMessages(body, st)) return e;
  if (Error e = ReadToolChoice(body, st)) return e;
  return ReadThinking(body, max_tokens, st);
}

ParseResult ParseMessagesImpl(std::string_view body, const ParseLimits& limits) {
  json j;
  if (Error e = ParseBody(body, limits, &j)) return *e;
  if (Error e = CheckKeys(j, "", {"model", "messages", "max_tokens", "system", "metadata",
                                  "stop_sequences", "stream", "temperature", "top_p", "top_k",
                                  "tools", "tool_choice", "thinking", "service_tier"})) {
    return *e;
  }
  ParsedRequest out;
  out.chat = true;
  out.messages_api = true;
  if (Error e = ReadModel(j, &out.model)) return *e;
  out.request.set_model(out.model);
  const json* mt = Find(j, "max_tokens");
  if (mt == nullptr) return MissingParam("max_tokens");
  uint64_t max_tokens = 0;
  if (Error e = ReadInt(*mt, "max_tokens", 1, limits.max_tokens_limit, &max_tokens)) return *e;
  out.request.mutable_sampling()->set_max_tokens(static_cast<uint32_t>(max_tokens));
  if (Error e = ReadSampling(j, limits, &out)) return *e;
  MessagesState st{.req = &out.request};
  if (Error e = ReadChat(j, static_cast<uint32_t>(max_tokens), &st)) return *e;
  return out;
}

template <typename T, typename F>
std::variant<T, ApiError> Guarded(F&& parse) {
  try {
    return parse();
  } catch (const json::exception& e) {
    return InvalidRequestError(
        Cat({"Invalid request body: ", Shorten(e.what(), kMaxParseMessageBytes)}));
  } catch (const std::bad_alloc&) {
    return PayloadTooLargeError(0);
  } catch (...) {
    return InvalidRequestError("Invalid request body.");
  }
}

std::variant<TokenizeRequest, ApiError> ParseCountTokensImpl(std::string_view body,
                                                             const ParseLimits& limits) {
  json j;
  if (Error e = ParseBody(body, limits, &j)) return *e;
  if (Error e = CheckKeys(j, "", {"model", "messages", "system", "tools", "tool_choice",
                                  "thinking"})) {
    return *e;
  }
  TokenizeRequest out;
  std::string model;
  if (Error e = ReadModel(j, &model)) return *e;
  out.request.set_model(model);
  MessagesState st{.req = &out.request};
  if (Error e = ReadChat(j, /*max_tokens=*/0, &st)) return *e;
  return out;
}

}  // namespace

ParseResult ParseMessagesRequest(std::string_view body, const ParseLimits& limits) {
  return Guarded<ParsedRequest>([&] { return ParseMessagesImpl(body, limits); });
}

std::variant<TokenizeRequest, ApiError> ParseCountTokensRequest(std::string_view body,
                                                                const ParseLimits& limits) {
  return Guarded<TokenizeRequest>([&] { return ParseCountTokensImpl(body, limits); });
}

std::string CountTokensResponseJson(size_t input_tokens) {
  return Dump(ojson{{"input_tokens", input_tokens}});
}

}  // namespace swaserve::api
