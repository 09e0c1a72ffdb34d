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

#include "absl/strings/escaping.h"
#include "lib/api/openai_json.h"
#include "lib/base/multimodal.h"
#include "nlohmann/json.hpp"

namespace swaserve::api {
namespace {

namespace v1 = ::swaserve::v1;
using openai_internal::Cat;
using openai_internal::json;
using openai_internal::Shorten;

// Longest JSON parser message passed on.
constexpr size_t kMaxParseMessageBytes = 200;

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
                                              "speculative_tokens",
                                              "stop_token_ids",
                                              "logit_bias",
                                              "priority"};

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
  // Extension: MTP draft tokens per decode step (0 turns speculation off).
  if (const json* v = Find(body, "speculative_tokens")) {
    uint64_t k = 0;
    if (Error e = ReadInt(*v, "speculative_tokens", 0, 64, &k)) return e;
    sampling.set_speculative_tokens(static_cast<uint32_t>(k));
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
  // Extension (vLLM's): scheduling priority, lower values served first.
  if (const json* v = Find(body, "priority")) {
    int64_t p = 0;
    if (Error e = ReadInt(*v, "priority", -1000000, 1000000, nullptr, &p)) return e;
    req.set_priority(static_cast<int32_t>(p));
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
                                   msg->mutable_content(),
                                   req->mutable_multimodal())) {
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
  if (Error e = ParseMessages(j, &out.request)) return *e;
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

}  // namespace

ParseResult ParseCompletionRequest(std::string_view body,
                                   const ParseLimits& limits) {
  return Guarded([&] { return ParseCompletionImpl(body, limits); });
}

ParseResult ParseChatRequest(std::string_view body, const ParseLimits& limits) {
  return Guarded([&] { return ParseChatImpl(body, limits); });
}

}  // namespace swaserve::api
