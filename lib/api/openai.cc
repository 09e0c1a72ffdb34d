#include "lib/api/openai.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <exception>
#include <initializer_list>
#include <limits>
#include <new>
#include <span>
#include <utility>

#include "nlohmann/json.hpp"

namespace swaserve::api {
namespace {

namespace v1 = ::swaserve::v1;
using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

// Longest client-supplied name (field, role, part type) repeated in a message.
constexpr size_t kMaxEchoedBytes = 64;
// Longest JSON parser message passed on.
constexpr size_t kMaxParseMessageBytes = 200;
// OpenAI's stand-in for a log-probability of -inf.
constexpr double kMinLogprob = -9999.0;

std::string Cat(std::initializer_list<std::string_view> parts) {
  size_t size = 0;
  for (std::string_view p : parts) size += p.size();
  std::string out;
  out.reserve(size);
  for (std::string_view p : parts) out.append(p);
  return out;
}

// `s`, cut to at most `max` bytes ("..." appended when cut). The cut may split
// a UTF-8 character; Dump() replaces the broken bytes.
std::string Shorten(std::string_view s, size_t max = kMaxEchoedBytes) {
  if (s.size() <= max) return std::string(s);
  return Cat({s.substr(0, max), "..."});
}

std::string Dump(const ojson& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string IndexedParam(std::string_view name, size_t i) {
  return Cat({name, "[", std::to_string(i), "]"});
}

// "a string", "an integer", ... for type errors.
std::string_view TypeWord(const json& j) {
  switch (j.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::object:
      return "an object";
    case json::value_t::array:
      return "an array";
    case json::value_t::string:
      return "a string";
    case json::value_t::boolean:
      return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
      return "an integer";
    case json::value_t::number_float:
      return "a number with a fraction or exponent";
    default:
      return "an unsupported value";
  }
}

ApiError TypeError(std::string_view param, std::string_view expected,
                   const json& got) {
  return InvalidRequestError(Cat({"Invalid type for '", param, "': expected ",
                                  expected, ", but got ", TypeWord(got), "."}),
                             std::string(param), "invalid_type");
}

ApiError ValueError(std::string_view param, std::string_view what) {
  return InvalidRequestError(Cat({"Invalid value for '", param, "': ", what}),
                             std::string(param), "invalid_value");
}

ApiError NotSupported(std::string_view param, std::string_view what) {
  return InvalidRequestError(
      Cat({"'", param, "' is not supported by this server: ", what}),
      std::string(param), "unsupported_parameter");
}

// The value of `key` in `obj`, or nullptr when absent or null.
const json* Find(const json& obj, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

using Error = std::optional<ApiError>;

// An integer in [lo, hi] (floats, booleans and strings are type errors).
Error ReadInt(const json& v, std::string_view param, int64_t lo, uint64_t hi,
              uint64_t* out_unsigned, int64_t* out_signed = nullptr) {
  if (!v.is_number_integer()) return TypeError(param, "an integer", v);
  const std::string range =
      Cat({"expected an integer between ", std::to_string(lo), " and ",
           std::to_string(hi), ", but got ", v.dump(), "."});
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > hi || (lo > 0 && u < static_cast<uint64_t>(lo))) {
      return ValueError(param, range);
    }
    if (out_unsigned != nullptr) *out_unsigned = u;
    if (out_signed != nullptr) *out_signed = static_cast<int64_t>(u);
    return std::nullopt;
  }
  const int64_t i = v.get<int64_t>();
  if (i < lo || (i >= 0 && static_cast<uint64_t>(i) > hi)) {
    return ValueError(param, range);
  }
  if (out_unsigned != nullptr) *out_unsigned = static_cast<uint64_t>(i);
  if (out_signed != nullptr) *out_signed = i;
  return std::nullopt;
}

Error ReadNumber(const json& v, std::string_view param, double* out) {
  if (!v.is_number()) return TypeError(param, "a number", v);
  *out = v.get<double>();
  return std::nullopt;
}

Error ReadBool(const json& v, std::string_view param, bool* out) {
  if (!v.is_boolean()) return TypeError(param, "a boolean", v);
  *out = v.get<bool>();
  return std::nullopt;
}

Error ReadString(const json& v, std::string_view param, std::string* out) {
  if (!v.is_string()) return TypeError(param, "a string", v);
  *out = v.get_ref<const std::string&>();
  return std::nullopt;
}

// Depth of array/object nesting, scanning bytes (strings skipped), so that a
// hostile body is rejected before the parser builds it.
bool DepthWithin(std::string_view body, int max_depth) {
  int depth = 0;
  bool in_string = false;
  bool escaped = false;
  for (char c : body) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return false;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return true;
}

// Parses `body` into a JSON object, or an error.
Error ParseBody(std::string_view body, const ParseLimits& limits, json* out) {
  if (body.size() > limits.max_body_bytes) {
    return PayloadTooLargeError(limits.max_body_bytes);
  }
  if (!DepthWithin(body, limits.max_json_depth)) {
    return InvalidRequestError(
        Cat({"The request body nests arrays or objects deeper than ",
             std::to_string(limits.max_json_depth), " levels."}));
  }
  try {
    *out = json::parse(body.begin(), body.end());
  } catch (const json::exception& e) {
    // parse_error, or out_of_range for a number like 1e400.
    std::string_view what = e.what();
    // Drop the "[json.exception.parse_error.101] " prefix.
    if (size_t pos = what.find("] "); pos != std::string_view::npos) {
      what.remove_prefix(pos + 2);
    }
    return InvalidRequestError(
        Cat({"We could not parse the JSON body of your request: ",
             Shorten(what, kMaxParseMessageBytes)}),
        "", "invalid_json");
  }
  if (!out->is_object()) {
    return InvalidRequestError(
        Cat({"The request body must be a JSON object, but got ", TypeWord(*out),
             "."}),
        "", "invalid_json");
  }
  return std::nullopt;
}

// Fields both endpoints accept.
constexpr std::string_view kCommonFields[] = {"model",
                                              "max_tokens",
                                              "temperature",
                                              "top_p",
                                              "top_k",
                                              "seed",
                                              "stop",
                                              "stream",
                                              "stream_options",
                                              "n",
                                              "presence_penalty",
                                              "frequency_penalty",
                                              "user",
                                              "ignore_eos",
                                              "stop_token_ids",
                                              "logit_bias"};

// Rejects top-level keys outside `allowed`.
Error CheckKnownFields(const json& obj,
                       std::span<const std::string_view> common,
                       std::initializer_list<std::string_view> specific) {
  for (const auto& [key, value] : obj.items()) {
    bool known = false;
    for (std::string_view k : common) known = known || k == key;
    for (std::string_view k : specific) known = known || k == key;
    if (!known) {
      const std::string name = Shorten(key);
      return InvalidRequestError(
          Cat({"Unrecognized request argument supplied: ", name}), name,
          "unrecognized_argument");
    }
  }
  return std::nullopt;
}

// max_tokens (or its chat alias) into sampling.max_tokens.
Error ReadMaxTokens(const json& v, std::string_view param,
                    const ParseLimits& limits, uint64_t* out) {
  return ReadInt(v, param, 1, limits.max_tokens_limit, out);
}

// The fields in kCommonFields except max_tokens, into `out`.
Error ParseCommon(const json& body, const ParseLimits& limits,
                  ParsedRequest* out) {
  v1::GenerateRequest& req = out->request;
  v1::SamplingParams& sampling = *req.mutable_sampling();

  const json* model = Find(body, "model");
  if (model == nullptr) {
    return InvalidRequestError("You must provide a model parameter.", "model",
                               "missing_required_parameter");
  }
  if (Error e = ReadString(*model, "model", &out->model)) return e;
  if (out->model.empty()) {
    return ValueError("model", "the model name must not be empty.");
  }
  req.set_model(out->model);

  sampling.set_max_tokens(
      std::min(limits.default_max_tokens, limits.max_tokens_limit));
  sampling.set_temperature(1.0f);
  sampling.set_top_p(1.0f);

  if (const json* v = Find(body, "temperature")) {
    double t = 0;
    if (Error e = ReadNumber(*v, "temperature", &t)) return e;
    if (!(t >= 0.0 && t <= 2.0)) {
      return ValueError("temperature", "expected a number between 0 and 2.");
    }
    sampling.set_temperature(static_cast<float>(t));
  }
  if (const json* v = Find(body, "top_p")) {
    double p = 0;
    if (Error e = ReadNumber(*v, "top_p", &p)) return e;
    if (!(p > 0.0 && p <= 1.0)) {
      return ValueError("top_p",
                        "expected a number greater than 0 and at "
                        "most 1.");
    }
    sampling.set_top_p(static_cast<float>(p));
  }
  if (const json* v = Find(body, "top_k")) {
    int64_t k = 0;
    if (Error e = ReadInt(*v, "top_k", -1, std::numeric_limits<uint32_t>::max(),
                          nullptr, &k)) {
      return e;
    }
    sampling.set_top_k(k < 0 ? 0 : static_cast<uint32_t>(k));
  }
  if (const json* v = Find(body, "seed")) {
    uint64_t seed = 0;
    if (Error e = ReadInt(*v, "seed", std::numeric_limits<int64_t>::min(),
                          std::numeric_limits<uint64_t>::max(), &seed)) {
      return e;
    }
    sampling.set_seed(seed);
  }
  if (const json* v = Find(body, "stop")) {
    if (v->is_string()) {
      if (v->get_ref<const std::string&>().empty()) {
        return ValueError("stop", "stop strings must not be empty.");
      }
      sampling.add_stop(v->get<std::string>());
    } else if (v->is_array()) {
      if (v->size() > limits.max_stop) {
        return ValueError("stop",
                          Cat({"at most ", std::to_string(limits.max_stop),
                               " stop strings are allowed."}));
      }
      for (size_t i = 0; i < v->size(); ++i) {
        const json& s = (*v)[i];
        if (!s.is_string()) {
          return TypeError(IndexedParam("stop", i), "a string", s);
        }
        if (s.get_ref<const std::string&>().empty()) {
          return ValueError("stop", "stop strings must not be empty.");
        }
        sampling.add_stop(s.get<std::string>());
      }
    } else {
      return TypeError("stop", "a string or an array of strings", *v);
    }
  }
  if (const json* v = Find(body, "stream")) {
    if (Error e = ReadBool(*v, "stream", &out->stream)) return e;
  }
  if (const json* v = Find(body, "stream_options")) {
    if (!v->is_object()) return TypeError("stream_options", "an object", *v);
    if (!out->stream) {
      return InvalidRequestError(
          "The 'stream_options' parameter is only allowed when 'stream' is "
          "true.",
          "stream_options", "invalid_value");
    }
    for (const auto& [key, value] : v->items()) {
      const std::string param = Cat({"stream_options.", Shorten(key)});
      if (key != "include_usage") {
        return InvalidRequestError(
            Cat({"Unrecognized request argument supplied: ", param}), param,
            "unrecognized_argument");
      }
      if (!value.is_null()) {
        if (Error e = ReadBool(value, param, &out->include_usage)) return e;
      }
    }
  }
  if (const json* v = Find(body, "n")) {
    uint64_t n = 0;
    if (Error e =
            ReadInt(*v, "n", 1, std::numeric_limits<uint64_t>::max(), &n)) {
      return e;
    }
    if (n != 1) return NotSupported("n", "only n=1 is supported.");
  }
  for (const char* name : {"presence_penalty", "frequency_penalty"}) {
    if (const json* v = Find(body, name)) {
      double p = 0;
      if (Error e = ReadNumber(*v, name, &p)) return e;
      if (p != 0.0) return NotSupported(name, "only 0 is supported.");
    }
  }
  if (const json* v = Find(body, "user")) {
    std::string user;
    if (Error e = ReadString(*v, "user", &user)) return e;
  }
  if (const json* v = Find(body, "ignore_eos")) {
    bool ignore_eos = false;
    if (Error e = ReadBool(*v, "ignore_eos", &ignore_eos)) return e;
    sampling.set_ignore_eos(ignore_eos);
  }
  if (const json* v = Find(body, "stop_token_ids")) {
    if (!v->is_array()) {
      return TypeError("stop_token_ids", "an array of token ids", *v);
    }
    if (v->size() > limits.max_stop_token_ids) {
      return ValueError(
          "stop_token_ids",
          Cat({"at most ", std::to_string(limits.max_stop_token_ids),
               " stop token ids are allowed."}));
    }
    for (size_t i = 0; i < v->size(); ++i) {
      uint64_t id = 0;
      if (Error e = ReadInt((*v)[i], IndexedParam("stop_token_ids", i), 0,
                            std::numeric_limits<uint32_t>::max(), &id)) {
        return e;
      }
      sampling.add_stop_token_ids(static_cast<uint32_t>(id));
    }
  }
  if (const json* v = Find(body, "logit_bias")) {
    if (!v->is_object()) return TypeError("logit_bias", "an object", *v);
    if (!v->empty()) {
      return NotSupported("logit_bias", "only an empty map is supported.");
    }
  }
  return std::nullopt;
}

// A token id array (prompt or one element of it).
Error ReadTokenIds(const json& v, std::string_view param, v1::TokenIds* out) {
  for (size_t i = 0; i < v.size(); ++i) {
    uint64_t id = 0;
    if (Error e = ReadInt(v[i], IndexedParam(param, i), 0,
                          std::numeric_limits<uint32_t>::max(), &id)) {
      return e;
    }
    out->add_ids(static_cast<uint32_t>(id));
  }
  return std::nullopt;
}

Error ParsePrompt(const json& body, v1::GenerateRequest* req) {
  const json* v = Find(body, "prompt");
  if (v == nullptr) {
    return InvalidRequestError("You must provide a prompt parameter.", "prompt",
                               "missing_required_parameter");
  }
  const char* kExpected =
      "a string, an array of token ids, or an array holding one string or "
      "one array of token ids";
  const ApiError empty = ValueError("prompt", "the prompt must not be empty.");
  if (v->is_string()) {
    if (v->get_ref<const std::string&>().empty()) return empty;
    req->set_text(v->get<std::string>());
    return std::nullopt;
  }
  if (!v->is_array()) return TypeError("prompt", kExpected, *v);
  if (v->empty()) return empty;
  const json& first = (*v)[0];
  if (first.is_string() || first.is_array()) {
    if (v->size() != 1) {
      return NotSupported("prompt",
                          "batched prompts are not supported; send one prompt "
                          "per request.");
    }
    if (first.is_string()) {
      if (first.get_ref<const std::string&>().empty()) return empty;
      req->set_text(first.get<std::string>());
      return std::nullopt;
    }
    if (first.empty()) return empty;
    return ReadTokenIds(first, "prompt[0]", req->mutable_token_ids());
  }
  if (!first.is_number_integer()) return TypeError("prompt", kExpected, *v);
  return ReadTokenIds(*v, "prompt", req->mutable_token_ids());
}

Error ParseChatContent(const json& m, size_t i, bool assistant,
                       std::string* content) {
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
  bool first_text = true;
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
    if (type_name != "text") {
      return InvalidRequestError(
          Cat({"multimodal content is not supported by this endpoint yet "
               "(content part type '",
               Shorten(type_name), "')."}),
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
    if (!first_text) content->push_back('\n');
    first_text = false;
    content->append(text->get_ref<const std::string&>());
  }
  return std::nullopt;
}

Error ParseMessages(const json& body, v1::ChatMessages* chat) {
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
    for (const auto& [key, value] : m.items()) {
      const bool known = key == "role" || key == "content" || key == "name" ||
                         (key == "tool_call_id" && role == "tool");
      if (!known) {
        const std::string field = Cat({param, ".", Shorten(key)});
        return InvalidRequestError(
            Cat({"Unrecognized request argument supplied: ", field}), field,
            "unrecognized_argument");
      }
    }
    for (const char* name : {"name", "tool_call_id"}) {
      if (const json* s = Find(m, name)) {
        std::string ignored;
        if (Error e = ReadString(*s, Cat({param, ".", name}), &ignored)) {
          return e;
        }
      }
    }
    v1::ChatMessage* msg = chat->add_messages();
    msg->set_role(role);
    if (Error e = ParseChatContent(m, i, role == "assistant",
                                   msg->mutable_content())) {
      return e;
    }
  }
  chat->set_add_generation_prompt(true);
  return std::nullopt;
}

ParseResult ParseCompletionImpl(std::string_view body,
                                const ParseLimits& limits) {
  json j;
  if (Error e = ParseBody(body, limits, &j)) return *e;
  if (Error e = CheckKnownFields(
          j, kCommonFields,
          {"prompt", "logprobs", "echo", "best_of", "suffix"})) {
    return *e;
  }
  ParsedRequest out;
  out.chat = false;
  if (Error e = ParseCommon(j, limits, &out)) return *e;
  if (Error e = ParsePrompt(j, &out.request)) return *e;
  v1::SamplingParams& sampling = *out.request.mutable_sampling();
  if (const json* v = Find(j, "max_tokens")) {
    uint64_t n = 0;
    if (Error e = ReadMaxTokens(*v, "max_tokens", limits, &n)) return *e;
    sampling.set_max_tokens(static_cast<uint32_t>(n));
  }
  if (const json* v = Find(j, "logprobs")) {
    uint64_t k = 0;
    if (Error e = ReadInt(*v, "logprobs", 0, 5, &k)) return *e;
    sampling.set_logprobs(true);
    sampling.set_top_logprobs(static_cast<uint32_t>(k));
    out.logprobs = true;
    out.logprobs_top = static_cast<int>(k);
  }
  if (const json* v = Find(j, "echo")) {
    bool echo = false;
    if (Error e = ReadBool(*v, "echo", &echo)) return *e;
    if (echo) return NotSupported("echo", "only echo=false is supported.");
  }
  if (const json* v = Find(j, "best_of")) {
    uint64_t n = 0;
    if (Error e = ReadInt(*v, "best_of", 1,
                          std::numeric_limits<uint64_t>::max(), &n)) {
      return *e;
    }
    if (n != 1) return NotSupported("best_of", "only best_of=1 is supported.");
  }
  if (const json* v = Find(j, "suffix")) {
    std::string suffix;
    if (Error e = ReadString(*v, "suffix", &suffix)) return *e;
    if (!suffix.empty()) {
      return NotSupported("suffix", "only an empty suffix is supported.");
    }
  }
  return out;
}

ParseResult ParseChatImpl(std::string_view body, const ParseLimits& limits) {
  json j;
  if (Error e = ParseBody(body, limits, &j)) return *e;
  if (Error e =
          CheckKnownFields(j, kCommonFields,
                           {"messages", "max_completion_tokens", "logprobs",
                            "top_logprobs", "response_format"})) {
    return *e;
  }
  ParsedRequest out;
  out.chat = true;
  if (Error e = ParseCommon(j, limits, &out)) return *e;
  if (Error e = ParseMessages(j, out.request.mutable_chat())) return *e;
  v1::SamplingParams& sampling = *out.request.mutable_sampling();

  std::optional<uint64_t> max_tokens;
  for (const char* name : {"max_tokens", "max_completion_tokens"}) {
    if (const json* v = Find(j, name)) {
      uint64_t n = 0;
      if (Error e = ReadMaxTokens(*v, name, limits, &n)) return *e;
      if (max_tokens.has_value() && *max_tokens != n) {
        return InvalidRequestError(
            "'max_tokens' and 'max_completion_tokens' differ; give only one "
            "of them.",
            "max_completion_tokens", "invalid_value");
      }
      max_tokens = n;
    }
  }
  if (max_tokens.has_value()) {
    sampling.set_max_tokens(static_cast<uint32_t>(*max_tokens));
  }

  bool logprobs = false;
  if (const json* v = Find(j, "logprobs")) {
    if (Error e = ReadBool(*v, "logprobs", &logprobs)) return *e;
  }
  uint64_t top = 0;
  if (const json* v = Find(j, "top_logprobs")) {
    if (Error e = ReadInt(*v, "top_logprobs", 0, 20, &top)) return *e;
    if (!logprobs) {
      return InvalidRequestError(
          "'top_logprobs' requires 'logprobs' to be true.", "top_logprobs",
          "invalid_value");
    }
  }
  if (logprobs) {
    sampling.set_logprobs(true);
    sampling.set_top_logprobs(static_cast<uint32_t>(top));
    out.logprobs = true;
    out.logprobs_top = static_cast<int>(top);
  }
  if (const json* v = Find(j, "response_format")) {
    if (!v->is_object()) return TypeError("response_format", "an object", *v);
    const json* type = Find(*v, "type");
    if (type == nullptr || !type->is_string() || *type != "text" ||
        v->size() != 1) {
      return NotSupported("response_format",
                          "only {\"type\": \"text\"} is supported.");
    }
  }
  return out;
}

// Runs a parser, turning any exception into an error.
template <typename F>
ParseResult Guarded(F&& parse) {
  try {
    return parse();
  } catch (const json::exception& e) {
    return InvalidRequestError(Cat(
        {"Invalid request body: ", Shorten(e.what(), kMaxParseMessageBytes)}));
  } catch (const std::bad_alloc&) {
    return PayloadTooLargeError(0);
  } catch (...) {
    return InvalidRequestError("Invalid request body.");
  }
}

// --- Formatting
// ---------------------------------------------------------------

// A float as the shortest double that prints like it ("-0.1", not
// "-0.10000000149011612"); non-finite values become kMinLogprob.
double LogprobValue(float f) {
  if (!std::isfinite(f)) return kMinLogprob;
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), f);
  if (ec != std::errc()) return f;
  double d = f;
  std::from_chars(buf, end, d);
  return d;
}

ojson Bytes(std::string_view s) {
  ojson a = ojson::array();
  for (unsigned char c : s) a.push_back(static_cast<int>(c));
  return a;
}

ojson FinishReasonJson(v1::FinishReason reason) {
  std::string_view s = FinishReasonString(reason);
  if (s.empty()) return nullptr;
  return std::string(s);
}

ojson UsageObject(const std::optional<v1::Usage>& usage) {
  v1::Usage u = usage.value_or(v1::Usage());
  ojson j;
  j["prompt_tokens"] = u.prompt_tokens();
  j["completion_tokens"] = u.completion_tokens();
  j["total_tokens"] = static_cast<uint64_t>(u.prompt_tokens()) +
                      static_cast<uint64_t>(u.completion_tokens());
  j["prompt_tokens_details"] = {{"cached_tokens", u.cached_tokens()}};
  return j;
}

// Completions-style logprobs: {tokens, token_logprobs, top_logprobs,
// text_offset}.
ojson CompletionLogprobs(const ResponseInput& in) {
  if (!in.logprobs) return nullptr;
  ojson tokens = ojson::array();
  ojson token_logprobs = ojson::array();
  ojson top_logprobs = ojson::array();
  ojson text_offset = ojson::array();
  size_t offset = in.text_offset_start;
  for (const TokenLogprobText& t : in.token_logprobs) {
    tokens.push_back(t.token);
    token_logprobs.push_back(LogprobValue(t.logprob.logprob()));
    ojson top = ojson::object();
    for (int i = 0; i < t.logprob.top_size(); ++i) {
      const std::string key = static_cast<size_t>(i) < t.top_tokens.size()
                                  ? t.top_tokens[i]
                                  : std::string();
      top[key] = LogprobValue(t.logprob.top(i).logprob());
    }
    top_logprobs.push_back(std::move(top));
    text_offset.push_back(offset);
    offset += t.token.size();
  }
  ojson j;
  j["tokens"] = std::move(tokens);
  j["token_logprobs"] = std::move(token_logprobs);
  j["top_logprobs"] = std::move(top_logprobs);
  j["text_offset"] = std::move(text_offset);
  return j;
}

// Chat-style logprobs: {content: [{token, logprob, bytes, top_logprobs}]}.
ojson ChatLogprobs(const ResponseInput& in) {
  if (!in.logprobs) return nullptr;
  ojson content = ojson::array();
  for (const TokenLogprobText& t : in.token_logprobs) {
    ojson entry;
    entry["token"] = t.token;
    entry["logprob"] = LogprobValue(t.logprob.logprob());
    entry["bytes"] = Bytes(t.token);
    ojson top = ojson::array();
    for (int i = 0; i < t.logprob.top_size(); ++i) {
      const std::string token = static_cast<size_t>(i) < t.top_tokens.size()
                                    ? t.top_tokens[i]
                                    : std::string();
      ojson alt;
      alt["token"] = token;
      alt["logprob"] = LogprobValue(t.logprob.top(i).logprob());
      alt["bytes"] = Bytes(token);
      top.push_back(std::move(alt));
    }
    entry["top_logprobs"] = std::move(top);
    content.push_back(std::move(entry));
  }
  ojson j;
  j["content"] = std::move(content);
  return j;
}

ojson Header(const ResponseInput& in, std::string_view prefix,
             std::string_view object) {
  ojson j;
  j["id"] = Cat({prefix, in.request_id});
  j["object"] = std::string(object);
  j["created"] = in.created;
  j["model"] = in.model;
  return j;
}

}  // namespace

// --- Errors
// -------------------------------------------------------------------

std::string ErrorJson(const ApiError& error) {
  ojson e;
  e["message"] = error.message;
  e["type"] = error.type;
  e["param"] = error.param.empty() ? ojson(nullptr) : ojson(error.param);
  e["code"] = error.code.empty() ? ojson(nullptr) : ojson(error.code);
  ojson j;
  j["error"] = std::move(e);
  return Dump(j);
}

ApiError InvalidRequestError(std::string message, std::string param,
                             std::string code) {
  return ApiError{400, "invalid_request_error", std::move(message),
                  std::move(param), std::move(code)};
}

ApiError ModelNotFoundError(std::string_view model) {
  return ApiError{404, "invalid_request_error",
                  Cat({"The model '", Shorten(model, 256),
                       "' does not exist or is not served here."}),
                  "model", "model_not_found"};
}

ApiError PayloadTooLargeError(size_t limit_bytes) {
  return ApiError{413, "invalid_request_error",
                  limit_bytes == 0
                      ? std::string("The request body is too large.")
                      : Cat({"The request body is larger than ",
                             std::to_string(limit_bytes), " bytes."}),
                  "", "request_too_large"};
}

ApiError AuthenticationError(std::string message) {
  return ApiError{401, "authentication_error", std::move(message), "",
                  "invalid_api_key"};
}

ApiError RateLimitError(std::string message) {
  return ApiError{429, "rate_limit_error", std::move(message), "",
                  "rate_limit_exceeded"};
}

ApiError OverloadedError(std::string message) {
  return ApiError{429, "server_overloaded", std::move(message), "",
                  "server_overloaded"};
}

ApiError ServiceUnavailableError(std::string message) {
  return ApiError{503, "service_unavailable", std::move(message), "", ""};
}

ApiError ServerError(std::string message) {
  return ApiError{500, "server_error", std::move(message), "", ""};
}

ApiError ApiErrorFromStatus(const absl::Status& status) {
  std::string message(status.message());
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kFailedPrecondition:
      return InvalidRequestError(std::move(message));
    case absl::StatusCode::kNotFound:
      return ApiError{404, "invalid_request_error", std::move(message), "",
                      "not_found"};
    case absl::StatusCode::kUnauthenticated:
      return AuthenticationError(std::move(message));
    case absl::StatusCode::kPermissionDenied:
      return ApiError{403, "permission_error", std::move(message), "", ""};
    case absl::StatusCode::kResourceExhausted:
      return OverloadedError(std::move(message));
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
      return ServiceUnavailableError(std::move(message));
    default:
      if (message.empty()) message = "Internal server error.";
      return ServerError(std::move(message));
  }
}

ApiError ApiErrorFromDetail(const v1::ErrorDetail& detail) {
  std::string message = detail.message();
  switch (detail.code()) {
    case v1::ERROR_CODE_PROMPT_TOO_LONG:
      return InvalidRequestError(std::move(message), "",
                                 "context_length_exceeded");
    case v1::ERROR_CODE_OVERLOADED:
      return OverloadedError(std::move(message));
    case v1::ERROR_CODE_NO_WORKERS:
    case v1::ERROR_CODE_TRANSFER_FAILED:
    case v1::ERROR_CODE_WORKER_LOST:
      return ServiceUnavailableError(std::move(message));
    case v1::ERROR_CODE_UNKNOWN_MODEL:
      return ApiError{404, "invalid_request_error", std::move(message), "model",
                      "model_not_found"};
    case v1::ERROR_CODE_INVALID_REQUEST:
      return InvalidRequestError(std::move(message));
    default:
      if (message.empty()) message = "Internal server error.";
      return ServerError(std::move(message));
  }
}

// --- Parsing
// ------------------------------------------------------------------

ParseResult ParseCompletionRequest(std::string_view body,
                                   const ParseLimits& limits) {
  return Guarded([&] { return ParseCompletionImpl(body, limits); });
}

ParseResult ParseChatRequest(std::string_view body, const ParseLimits& limits) {
  return Guarded([&] { return ParseChatImpl(body, limits); });
}

// --- Responses
// ----------------------------------------------------------------

std::vector<TokenLogprobText> MakeTokenLogprobs(
    const google::protobuf::RepeatedPtrField<v1::TokenLogprob>& logprobs,
    const std::function<std::string(uint32_t)>& token_text) {
  std::vector<TokenLogprobText> out;
  out.reserve(logprobs.size());
  for (const v1::TokenLogprob& lp : logprobs) {
    TokenLogprobText t;
    t.logprob = lp;
    t.token = token_text(lp.token_id());
    for (const auto& alt : lp.top()) {
      t.top_tokens.push_back(token_text(alt.token_id()));
    }
    out.push_back(std::move(t));
  }
  return out;
}

std::string_view FinishReasonString(v1::FinishReason reason) {
  switch (reason) {
    case v1::FINISH_REASON_STOP:
      return "stop";
    case v1::FINISH_REASON_LENGTH:
      return "length";
    case v1::FINISH_REASON_CANCELLED:
      return "abort";
    default:
      return "";
  }
}

std::string CompletionResponseJson(const ResponseInput& in) {
  ojson j = Header(in, "cmpl-", "text_completion");
  ojson choice;
  choice["index"] = 0;
  choice["text"] = in.text;
  choice["logprobs"] = CompletionLogprobs(in);
  choice["finish_reason"] = FinishReasonJson(in.finish_reason);
  j["choices"] = ojson::array({std::move(choice)});
  j["usage"] = UsageObject(in.usage);
  return Dump(j);
}

std::string ChatResponseJson(const ResponseInput& in) {
  ojson j = Header(in, "chatcmpl-", "chat.completion");
  ojson choice;
  choice["index"] = 0;
  choice["message"] = {{"role", "assistant"}, {"content", in.text}};
  choice["logprobs"] = ChatLogprobs(in);
  choice["finish_reason"] = FinishReasonJson(in.finish_reason);
  j["choices"] = ojson::array({std::move(choice)});
  j["usage"] = UsageObject(in.usage);
  return Dump(j);
}

std::string CompletionChunkJson(const ResponseInput& in) {
  ojson j = Header(in, "cmpl-", "text_completion");
  ojson choice;
  choice["index"] = 0;
  choice["text"] = in.text;
  choice["logprobs"] = CompletionLogprobs(in);
  choice["finish_reason"] = FinishReasonJson(in.finish_reason);
  j["choices"] = ojson::array({std::move(choice)});
  if (in.include_usage) j["usage"] = nullptr;
  return Dump(j);
}

std::string ChatChunkJson(const ResponseInput& in) {
  ojson j = Header(in, "chatcmpl-", "chat.completion.chunk");
  ojson delta = ojson::object();
  if (in.first_chunk) delta["role"] = "assistant";
  if (in.first_chunk || !in.text.empty()) delta["content"] = in.text;
  ojson choice;
  choice["index"] = 0;
  choice["delta"] = std::move(delta);
  choice["logprobs"] = ChatLogprobs(in);
  choice["finish_reason"] = FinishReasonJson(in.finish_reason);
  j["choices"] = ojson::array({std::move(choice)});
  if (in.include_usage) j["usage"] = nullptr;
  return Dump(j);
}

std::string UsageChunkJson(const ResponseInput& in, bool chat) {
  ojson j = chat ? Header(in, "chatcmpl-", "chat.completion.chunk")
                 : Header(in, "cmpl-", "text_completion");
  j["choices"] = ojson::array();
  j["usage"] = UsageObject(in.usage);
  return Dump(j);
}

std::string UsageJson(const v1::Usage& usage) {
  return Dump(UsageObject(usage));
}

std::string ModelsJson(const v1::ListModelsResponse& models) {
  ojson data = ojson::array();
  for (const v1::ModelInfo& m : models.models()) {
    ojson entry;
    entry["id"] = m.id();
    entry["object"] = "model";
    entry["created"] = m.created();
    entry["owned_by"] =
        m.owned_by().empty() ? std::string("swaserve") : m.owned_by();
    data.push_back(std::move(entry));
  }
  ojson j;
  j["object"] = "list";
  j["data"] = std::move(data);
  return Dump(j);
}

std::string SseFrame(std::string_view json_text) {
  return Cat({"data: ", json_text, "\n\n"});
}

}  // namespace swaserve::api
