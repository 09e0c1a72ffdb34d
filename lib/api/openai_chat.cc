#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "lib/api/openai.h"
#include "lib/api/openai_read.h"
#include "lib/base/multimodal.h"

namespace swaserve::api::openai_internal {
namespace {

// The MultimodalItem of a non-text content part, and the marker that places
// it in the message text (lib/base/multimodal.h).
Error ParseMediaPart(const json& part, const std::string& param,
                     const std::string& type, v1::MultimodalItem* item,
                     std::string_view* marker) {
  const json* body = Find(part, type.c_str());
  if (body == nullptr) {
    return InvalidRequestError(
        Cat({"Missing required parameter: '", param, ".", type, "'."}),
        Cat({param, ".", type}), "missing_required_parameter");
  }
  const std::string body_param = Cat({param, ".", type});
  if (!body->is_object()) return TypeError(body_param, "an object", *body);
  auto required_string = [&](const char* key, std::string* out) -> Error {
    const json* v = Find(*body, key);
    if (v == nullptr) {
      return InvalidRequestError(
          Cat({"Missing required parameter: '", body_param, ".", key, "'."}),
          Cat({body_param, ".", key}), "missing_required_parameter");
    }
    return ReadString(*v, Cat({body_param, ".", key}), out);
  };
  if (type == "input_audio") {
    std::string data, format;
    if (Error e = required_string("data", &data)) return e;
    if (Error e = required_string("format", &format)) return e;
    if (format != "wav") {
      return InvalidRequestError(
          Cat({"input_audio format '", Shorten(format),
               "' is not supported (only 'wav': PCM WAV at any sample rate)."}),
          Cat({body_param, ".format"}), "unsupported_format");
    }
    std::string bytes;
    if (data.empty() || !absl::Base64Unescape(data, &bytes) || bytes.empty()) {
      return InvalidRequestError("input_audio data is not valid non-empty base64.",
                                 Cat({body_param, ".data"}), "invalid_value");
    }
    item->set_modality(v1::MODALITY_AUDIO);
    item->set_mime_type("audio/wav");
    item->set_data(std::move(bytes));
    *marker = base::kAudioMarker;
    return std::nullopt;
  }
  std::string url;
  if (Error e = required_string("url", &url)) return e;
  if (url.empty()) {
    return InvalidRequestError(Cat({"'", body_param, ".url' is empty."}),
                               Cat({body_param, ".url"}), "invalid_value");
  }
  // The router decodes data: URLs and fetches http(s) ones (MediaFetcher).
  item->set_url(std::move(url));
  const bool video = type == "video_url";
  item->set_modality(video ? v1::MODALITY_VIDEO : v1::MODALITY_IMAGE);
  *marker = video ? base::kVideoMarker : base::kImageMarker;
  return std::nullopt;
}

Error ParseChatContent(const json& m, size_t i, bool assistant,
                       std::string* content,
                       google::protobuf::RepeatedPtrField<v1::MultimodalItem>* items) {
  const std::string param = Cat({IndexedParam("messages", i), ".content"});
  const json* v = Find(m, "content");
  if (v == nullptr) {
    if (assistant) return std::nullopt;
    return InvalidRequestError(
        Cat({"Missing required parameter: '", param, "'."}), param,
        "missing_required_parameter");
  }
  if (v->is_string()) {
    *content = v->get<std::string>();
    return std::nullopt;
  }
  if (!v->is_array()) {
    return TypeError(param, "a string or an array of content parts", *v);
  }
  bool first_part = true;
  for (size_t p = 0; p < v->size(); ++p) {
    const json& part = (*v)[p];
    const std::string part_param = IndexedParam(param, p);
    if (!part.is_object()) return TypeError(part_param, "an object", part);
    const json* type = Find(part, "type");
    if (type == nullptr) {
      return InvalidRequestError(
          Cat({"Missing required parameter: '", part_param, ".type'."}),
          Cat({part_param, ".type"}), "missing_required_parameter");
    }
    std::string type_name;
    if (Error e = ReadString(*type, Cat({part_param, ".type"}), &type_name)) {
      return e;
    }
    if (!first_part) content->push_back('\n');
    first_part = false;
    if (type_name == "image_url" || type_name == "input_audio" ||
        type_name == "video_url") {
      if (assistant) {
        return InvalidRequestError(
            Cat({"content part type '", type_name,
                 "' is only accepted in user and system messages."}),
            Cat({part_param, ".type"}), "invalid_value");
      }
      std::string_view marker;
      if (Error e = ParseMediaPart(part, part_param, type_name, items->Add(), &marker)) {
        return e;
      }
      content->append(marker);
      continue;
    }
    if (type_name != "text") {
      return InvalidRequestError(
          Cat({"content part type '", Shorten(type_name),
               "' is not supported (text, image_url, input_audio, video_url are)."}),
          Cat({part_param, ".type"}), "unsupported_content");
    }
    const json* text = Find(part, "text");
    if (text == nullptr) {
      return InvalidRequestError(
          Cat({"Missing required parameter: '", part_param, ".text'."}),
          Cat({part_param, ".text"}), "missing_required_parameter");
    }
    if (!text->is_string()) {
      return TypeError(Cat({part_param, ".text"}), "a string", *text);
    }
    content->append(text->get_ref<const std::string&>());
  }
  return std::nullopt;
}

// Names of functions: OpenAI's rule.
bool ValidFunctionName(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                    (c >= '0' && c <= '9') || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

// An assistant message's tool_calls: [{"id", "type": "function",
// "function": {"name", "arguments"}}]; arguments a JSON string (an object
// is taken too and written as JSON). An "index" (what clients that join a
// stream's deltas keep) is ignored.
Error ParseToolCalls(const json& v, const std::string& param, v1::ChatMessage* msg) {
  if (!v.is_array()) return TypeError(param, "an array", v);
  for (size_t i = 0; i < v.size(); ++i) {
    const json& c = v[i];
    const std::string cp = IndexedParam(param, i);
    if (!c.is_object()) return TypeError(cp, "an object", c);
    for (const auto& [key, value] : c.items()) {
      if (key != "id" && key != "type" && key != "function" && key != "index") {
        const std::string field = Cat({cp, ".", Shorten(key)});
        return InvalidRequestError(Cat({"Unrecognized request argument supplied: ", field}),
                                   field, "unrecognized_argument");
      }
    }
    v1::ToolCall* call = msg->add_tool_calls();
    const json* id = Find(c, "id");
    if (id == nullptr) return MissingParam(Cat({cp, ".id"}));
    if (Error e = ReadString(*id, Cat({cp, ".id"}), call->mutable_id())) return e;
    if (const json* type = Find(c, "type")) {
      if (!type->is_string() || *type != "function") {
        return ValueError(Cat({cp, ".type"}), "only 'function' is supported.");
      }
    }
    const json* f = Find(c, "function");
    if (f == nullptr) return MissingParam(Cat({cp, ".function"}));
    if (!f->is_object()) return TypeError(Cat({cp, ".function"}), "an object", *f);
    const json* name = Find(*f, "name");
    if (name == nullptr) return MissingParam(Cat({cp, ".function.name"}));
    if (Error e = ReadString(*name, Cat({cp, ".function.name"}), call->mutable_name())) return e;
    const json* args = Find(*f, "arguments");
    if (args == nullptr) return MissingParam(Cat({cp, ".function.arguments"}));
    if (args->is_object()) {
      call->set_arguments(args->dump());
    } else if (Error e = ReadString(*args, Cat({cp, ".function.arguments"}),
                                    call->mutable_arguments())) {
      return e;
    }
  }
  return std::nullopt;
}

}  // namespace

// tools: [{"type": "function", "function": {"name", "description",
// "parameters", "strict"}}], kept as the client wrote them (the template
// renders what it finds).
Error ParseTools(const json& v, v1::GenerateRequest* req, std::vector<std::string>* names) {
  if (!v.is_array()) return TypeError("tools", "an array", v);
  if (v.size() > 128) return ValueError("tools", "at most 128 tools are allowed.");
  for (size_t i = 0; i < v.size(); ++i) {
    const json& t = v[i];
    const std::string tp = IndexedParam("tools", i);
    if (!t.is_object()) return TypeError(tp, "an object", t);
    for (const auto& [key, value] : t.items()) {
      if (key != "type" && key != "function") {
        const std::string field = Cat({tp, ".", Shorten(key)});
        return InvalidRequestError(Cat({"Unrecognized request argument supplied: ", field}),
                                   field, "unrecognized_argument");
      }
    }
    const json* type = Find(t, "type");
    if (type == nullptr) return MissingParam(Cat({tp, ".type"}));
    if (!type->is_string() || *type != "function") {
      return ValueError(Cat({tp, ".type"}), "only 'function' tools are supported.");
    }
    const json* f = Find(t, "function");
    if (f == nullptr) return MissingParam(Cat({tp, ".function"}));
    if (!f->is_object()) return TypeError(Cat({tp, ".function"}), "an object", *f);
    for (const auto& [key, value] : f->items()) {
      if (key != "name" && key != "description" && key != "parameters" && key != "strict") {
        const std::string field = Cat({tp, ".function.", Shorten(key)});
        return InvalidRequestError(Cat({"Unrecognized request argument supplied: ", field}),
                                   field, "unrecognized_argument");
      }
    }
    const json* name = Find(*f, "name");
    if (name == nullptr) return MissingParam(Cat({tp, ".function.name"}));
    std::string n;
    if (Error e = ReadString(*name, Cat({tp, ".function.name"}), &n)) return e;
    if (!ValidFunctionName(n)) {
      return ValueError(Cat({tp, ".function.name"}),
                        "function names are 1 to 64 characters of a-z, A-Z, 0-9, _ and -.");
    }
    for (const std::string& other : *names) {
      if (other == n) return ValueError(Cat({tp, ".function.name"}), "duplicate function name.");
    }
    names->push_back(n);
    if (const json* d = Find(*f, "description"); d != nullptr && !d->is_string()) {
      return TypeError(Cat({tp, ".function.description"}), "a string", *d);
    }
    if (const json* p = Find(*f, "parameters"); p != nullptr && !p->is_object()) {
      return TypeError(Cat({tp, ".function.parameters"}), "an object", *p);
    }
    if (const json* st = Find(*f, "strict"); st != nullptr && !st->is_boolean()) {
      return TypeError(Cat({tp, ".function.strict"}), "a boolean", *st);
    }
  }
  if (!v.empty()) req->mutable_chat()->set_tools_json(v.dump());
  return std::nullopt;
}

Error ParseToolChoice(const json& v, const std::vector<std::string>& names,
                      v1::GenerateRequest* req) {
  v1::ToolChoice* choice = req->mutable_tool_choice();
  if (v.is_string()) {
    const std::string& s = v.get_ref<const std::string&>();
    if (s == "auto") {
      choice->set_mode(v1::ToolChoice::MODE_AUTO);
    } else if (s == "none") {
      choice->set_mode(v1::ToolChoice::MODE_NONE);
    } else if (s == "required") {
      choice->set_mode(v1::ToolChoice::MODE_REQUIRED);
    } else {
      return ValueError("tool_choice", "expected 'none', 'auto', 'required' or a function.");
    }
  } else if (v.is_object()) {
    const json* type = Find(v, "type");
    const json* f = Find(v, "function");
    const json* name = f != nullptr && f->is_object() ? Find(*f, "name") : nullptr;
    if (type == nullptr || *type != "function" || name == nullptr || !name->is_string()) {
      return ValueError("tool_choice",
                        "expected {\"type\": \"function\", \"function\": {\"name\": ...}}.");
    }
    choice->set_mode(v1::ToolChoice::MODE_FUNCTION);
    choice->set_function_name(name->get<std::string>());
  } else {
    return TypeError("tool_choice", "a string or an object", v);
  }
  const bool forced = choice->mode() == v1::ToolChoice::MODE_REQUIRED ||
                      choice->mode() == v1::ToolChoice::MODE_FUNCTION;
  if (forced && names.empty()) {
    return InvalidRequestError("'tool_choice' requires 'tools'.", "tool_choice", "invalid_value");
  }
  if (choice->mode() == v1::ToolChoice::MODE_FUNCTION &&
      std::find(names.begin(), names.end(), choice->function_name()) == names.end()) {
    return ValueError("tool_choice", Cat({"function '", Shorten(choice->function_name()),
                                          "' is not among the tools."}));
  }
  return std::nullopt;
}

// chat_template_kwargs (an object passed to the template) and
// reasoning_effort (enable_thinking: false for "none" and "minimal", true
// otherwise, unless chat_template_kwargs sets it).
Error ParseTemplateKwargs(const json& body, v1::GenerateRequest* req) {
  json kwargs = json::object();
  if (const json* v = Find(body, "chat_template_kwargs")) {
    if (!v->is_object()) return TypeError("chat_template_kwargs", "an object", *v);
    for (const auto& [key, value] : v->items()) {
      if (key == "messages" || key == "tools" || key == "documents" ||
          key == "add_generation_prompt") {
        return ValueError("chat_template_kwargs",
                          Cat({"'", key, "' is set by the request itself."}));
      }
    }
    kwargs = *v;
  }
  if (const json* v = Find(body, "reasoning_effort")) {
    std::string effort;
    if (Error e = ReadString(*v, "reasoning_effort", &effort)) return e;
    if (effort != "none" && effort != "minimal" && effort != "low" && effort != "medium" &&
        effort != "high" && effort != "xhigh") {
      return ValueError("reasoning_effort",
                        "expected one of 'none', 'minimal', 'low', 'medium', 'high', 'xhigh'.");
    }
    if (!kwargs.contains("enable_thinking")) {
      kwargs["enable_thinking"] = !(effort == "none" || effort == "minimal");
    }
  }
  if (!kwargs.empty()) req->mutable_chat()->set_template_kwargs_json(kwargs.dump());
  return std::nullopt;
}

Error ParseResponseFormat(const json& v, v1::GenerateRequest* req) {
  if (!v.is_object()) return TypeError("response_format", "an object", v);
  const json* type = Find(v, "type");
  if (type == nullptr) return MissingParam("response_format.type");
  std::string t;
  if (Error e = ReadString(*type, "response_format.type", &t)) return e;
  auto only = [&](std::initializer_list<const char*> keys) -> Error {
    for (const auto& [key, value] : v.items()) {
      bool known = false;
      for (const char* k : keys) known = known || key == k;
      if (!known) {
        const std::string field = Cat({"response_format.", Shorten(key)});
        return InvalidRequestError(Cat({"Unrecognized request argument supplied: ", field}),
                                   field, "unrecognized_argument");
      }
    }
    return std::nullopt;
  };
  if (t == "text") return only({"type"});
  v1::OutputConstraint* c = req->mutable_sampling()->mutable_constraint();
  if (t == "json_object") {
    if (Error e = only({"type"})) return e;
    c->set_kind(v1::OutputConstraint::KIND_JSON_OBJECT);
    return std::nullopt;
  }
  if (t != "json_schema") {
    return ValueError("response_format.type", "expected 'text', 'json_object' or 'json_schema'.");
  }
  if (Error e = only({"type", "json_schema"})) return e;
  const json* js = Find(v, "json_schema");
  if (js == nullptr) return MissingParam("response_format.json_schema");
  if (!js->is_object()) return TypeError("response_format.json_schema", "an object", *js);
  for (const auto& [key, value] : js->items()) {
    if (key != "name" && key != "description" && key != "schema" && key != "strict") {
      const std::string field = Cat({"response_format.json_schema.", Shorten(key)});
      return InvalidRequestError(Cat({"Unrecognized request argument supplied: ", field}), field,
                                 "unrecognized_argument");
    }
  }
  const json* name = Find(*js, "name");
  if (name == nullptr) return MissingParam("response_format.json_schema.name");
  if (!name->is_string()) return TypeError("response_format.json_schema.name", "a string", *name);
  if (const json* st = Find(*js, "strict"); st != nullptr && !st->is_boolean()) {
    return TypeError("response_format.json_schema.strict", "a boolean", *st);
  }
  const json* schema = Find(*js, "schema");
  // No schema: any JSON value is not what a client means; take an object.
  if (schema == nullptr) {
    c->set_kind(v1::OutputConstraint::KIND_JSON_OBJECT);
    return std::nullopt;
  }
  if (!schema->is_object() && !schema->is_boolean()) {
    return TypeError("response_format.json_schema.schema", "an object", *schema);
  }
  c->set_kind(v1::OutputConstraint::KIND_JSON_SCHEMA);
  c->set_json_schema(schema->dump());
  return std::nullopt;
}

Error ParseMessages(const json& body, v1::GenerateRequest* req) {
  v1::ChatMessages* chat = req->mutable_chat();
  const json* v = Find(body, "messages");
  if (v == nullptr) {
    return InvalidRequestError("You must provide a messages parameter.",
                               "messages", "missing_required_parameter");
  }
  if (!v->is_array()) return TypeError("messages", "an array", *v);
  if (v->empty()) {
    return ValueError("messages", "expected at least one message.");
  }
  for (size_t i = 0; i < v->size(); ++i) {
    const json& m = (*v)[i];
    const std::string param = IndexedParam("messages", i);
    if (!m.is_object()) return TypeError(param, "an object", m);
    const json* role_value = Find(m, "role");
    if (role_value == nullptr) {
      return InvalidRequestError(
          Cat({"Missing required parameter: '", param, ".role'."}),
          Cat({param, ".role"}), "missing_required_parameter");
    }
    std::string role;
    if (Error e = ReadString(*role_value, Cat({param, ".role"}), &role)) {
      return e;
    }
    if (role == "developer") role = "system";
    if (role != "system" && role != "user" && role != "assistant" &&
        role != "tool") {
      return ValueError(Cat({param, ".role"}),
                        Cat({"'", Shorten(role),
                             "' is not one of 'system', 'developer', 'user', "
                             "'assistant', 'tool'."}));
    }
    const bool assistant = role == "assistant";
    for (const auto& [key, value] : m.items()) {
      const bool known = key == "role" || key == "content" || key == "name" ||
                         (key == "tool_call_id" && role == "tool") ||
                         ((key == "tool_calls" || key == "reasoning_content" ||
                           key == "reasoning") &&
                          assistant);
      if (!known) {
        const std::string field = Cat({param, ".", Shorten(key)});
        return InvalidRequestError(
            Cat({"Unrecognized request argument supplied: ", field}), field,
            "unrecognized_argument");
      }
    }
    v1::ChatMessage* msg = chat->add_messages();
    msg->set_role(role);
    if (const json* s = Find(m, "name")) {
      if (Error e = ReadString(*s, Cat({param, ".name"}), msg->mutable_name())) return e;
    }
    if (const json* s = Find(m, "tool_call_id")) {
      if (Error e = ReadString(*s, Cat({param, ".tool_call_id"}), msg->mutable_tool_call_id())) {
        return e;
      }
    }
    for (const char* name : {"reasoning_content", "reasoning"}) {
      if (const json* s = Find(m, name)) {
        std::string text;
        if (Error e = ReadString(*s, Cat({param, ".", name}), &text)) return e;
        msg->set_reasoning_content(std::move(text));
      }
    }
    if (const json* calls = Find(m, "tool_calls")) {
      if (Error e = ParseToolCalls(*calls, Cat({param, ".tool_calls"}), msg)) return e;
    }
    if (Error e = ParseChatContent(m, i, assistant, msg->mutable_content(),
                                   req->mutable_multimodal())) {
      return e;
    }
    if (assistant && Find(m, "content") == nullptr) msg->set_content_null(true);
  }
  chat->set_add_generation_prompt(true);
  return std::nullopt;
}

}  // namespace swaserve::api::openai_internal
