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
#include "lib/api/openai_read.h"
#include "lib/base/multimodal.h"
#include "nlohmann/json.hpp"

namespace swaserve::api {
namespace {

using openai_internal::Cat;
using openai_internal::Error;
using openai_internal::Find;
using openai_internal::IndexedParam;
using openai_internal::json;
using openai_internal::kMaxParseMessageBytes;
using openai_internal::NotSupported;
using openai_internal::ParseBody;
using openai_internal::ReadBool;
using openai_internal::ReadInt;
using openai_internal::ReadNumber;
using openai_internal::ReadString;
using openai_internal::Shorten;
using openai_internal::TypeError;
using openai_internal::ValueError;
namespace v1 = ::swaserve::v1;

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
                                              "priority",
                                              "store",
                                              "metadata",
                                              "service_tier",
                                              "safety_identifier",
                                              "prompt_cache_key",
                                              "cache_salt"};

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

// What agent clients send beside the request proper: store (nothing is
// stored here either way), metadata (up to 16 string values, kept in no
// log), safety_identifier (ignored), prompt_cache_key (the router's
// affinity hint), cache_salt (narrows the prefix cache the request may
// share, as vLLM's), service_tier (priority: served first, flex: after the
// rest; a priority field wins).
Error ParseClientFields(const json& body, ParsedRequest* out) {
  v1::GenerateRequest& req = out->request;
  if (const json* v = Find(body, "store")) {
    bool store = false;
    if (Error e = ReadBool(*v, "store", &store)) return e;
  }
  if (const json* v = Find(body, "metadata")) {
    if (!v->is_object()) return TypeError("metadata", "an object", *v);
    if (v->size() > 16) return ValueError("metadata", "at most 16 keys are allowed.");
    for (const auto& [key, value] : v->items()) {
      if (!value.is_string()) {
        return TypeError(Cat({"metadata.", Shorten(key)}), "a string", value);
      }
    }
  }
  for (const char* name : {"safety_identifier", "prompt_cache_key", "cache_salt"}) {
    if (const json* v = Find(body, name)) {
      std::string text;
      if (Error e = ReadString(*v, name, &text)) return e;
      if (text.size() > 1024) return ValueError(name, "at most 1024 bytes are allowed.");
      if (std::string_view(name) == "prompt_cache_key") req.set_cache_key(text);
      if (std::string_view(name) == "cache_salt") req.set_cache_salt(text);
    }
  }
  if (const json* v = Find(body, "service_tier")) {
    std::string tier;
    if (Error e = ReadString(*v, "service_tier", &tier)) return e;
    if (tier != "auto" && tier != "default" && tier != "flex" && tier != "priority" &&
        tier != "scale") {
      return ValueError("service_tier",
                        "expected one of 'auto', 'default', 'flex', 'scale', 'priority'.");
    }
    if (Find(body, "priority") == nullptr) {
      req.set_priority(tier == "priority" ? -1 : tier == "flex" ? 1 : 0);
    }
  }
  return std::nullopt;
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
    if (n > 128) return ValueError("n", "n must be at most 128.");
    out->request.set_n(static_cast<uint32_t>(n));
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
    if (v->size() > 300) return ValueError("logit_bias", "at most 300 tokens may be biased.");
    for (const auto& [key, value] : v->items()) {
      const std::string param = Cat({"logit_bias.", Shorten(key)});
      uint32_t id = 0;
      const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
      if (ec != std::errc() || end != key.data() + key.size() || key.empty()) {
        return ValueError(param, "keys are token ids (decimal integers).");
      }
      double bias = 0;
      if (Error e = ReadNumber(value, param, &bias)) return e;
      if (!(bias >= -100 && bias <= 100)) {
        return ValueError(param, "biases are between -100 and 100.");
      }
      (*sampling.mutable_logit_bias())[id] = static_cast<float>(bias);
    }
  }
  // Extension (vLLM's): scheduling priority, lower values served first.
  if (const json* v = Find(body, "priority")) {
    int64_t p = 0;
    if (Error e = ReadInt(*v, "priority", -1000000, 1000000, nullptr, &p)) return e;
    req.set_priority(static_cast<int32_t>(p));
  }
  return ParseClientFields(body, out);
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
                            "top_logprobs", "response_format", "tools", "tool_choice",
                            "parallel_tool_calls", "chat_template_kwargs",
                            "reasoning_effort"})) {
    return *e;
  }
  ParsedRequest out;
  out.chat = true;
  if (Error e = ParseCommon(j, limits, &out)) return *e;
  if (Error e = openai_internal::ParseMessages(j, &out.request)) return *e;
  std::vector<std::string> tool_names;
  if (const json* v = Find(j, "tools")) {
    if (Error e = openai_internal::ParseTools(*v, &out.request, &tool_names)) return *e;
  }
  if (const json* v = Find(j, "tool_choice")) {
    if (Error e = openai_internal::ParseToolChoice(*v, tool_names, &out.request)) return *e;
  }
  if (const json* v = Find(j, "parallel_tool_calls")) {
    bool parallel = true;
    if (Error e = ReadBool(*v, "parallel_tool_calls", &parallel)) return *e;
    out.request.set_parallel_tool_calls(parallel);
  }
  if (Error e = openai_internal::ParseTemplateKwargs(j, &out.request)) return *e;
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
    if (Error e = openai_internal::ParseResponseFormat(*v, &out.request)) return *e;
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
