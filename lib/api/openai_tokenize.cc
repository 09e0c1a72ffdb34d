// POST /tokenize and /detokenize (openai.h).
#include <new>
#include <string>
#include <vector>

#include "lib/api/openai.h"
#include "lib/api/openai_read.h"

namespace swaserve::api {
namespace {

using namespace openai_internal;  // NOLINT(build/namespaces): this module's readers

Error CheckFields(const json& j, std::initializer_list<std::string_view> known) {
  for (const auto& [key, value] : j.items()) {
    bool ok = false;
    for (std::string_view k : known) ok = ok || k == key;
    if (!ok) {
      const std::string name = Shorten(key);
      return InvalidRequestError(Cat({"Unrecognized request argument supplied: ", name}), name,
                                 "unrecognized_argument");
    }
  }
  return std::nullopt;
}

Error ReadModel(const json& j, v1::GenerateRequest* req) {
  if (const json* v = Find(j, "model")) {
    if (Error e = ReadString(*v, "model", req->mutable_model())) return e;
  }
  return std::nullopt;
}

template <typename T, typename F>
std::variant<T, ApiError> Guard(F&& f) {
  try {
    return f();
  } catch (const json::exception& e) {
    return InvalidRequestError(
        Cat({"Invalid request body: ", Shorten(e.what(), kMaxParseMessageBytes)}));
  } catch (const std::bad_alloc&) {
    return PayloadTooLargeError(0);
  }
}

std::variant<TokenizeRequest, ApiError> ParseTokenize(std::string_view body,
                                                      const ParseLimits& limits) {
  json j;
  if (Error e = ParseBody(body, limits, &j)) return *e;
  if (Error e = CheckFields(j, {"model", "prompt", "messages", "add_generation_prompt",
                                "add_special_tokens", "tools", "chat_template_kwargs",
                                "return_token_strs", "continue_final_message"})) {
    return *e;
  }
  TokenizeRequest out;
  v1::GenerateRequest& req = out.request;
  if (Error e = ReadModel(j, &req)) return *e;
  if (const json* v = Find(j, "return_token_strs")) {
    if (Error e = ReadBool(*v, "return_token_strs", &out.return_token_strs)) return *e;
  }
  const json* prompt = Find(j, "prompt");
  const json* messages = Find(j, "messages");
  if ((prompt == nullptr) == (messages == nullptr)) {
    return InvalidRequestError("Give exactly one of 'prompt' and 'messages'.", "prompt",
                               "invalid_value");
  }
  if (prompt != nullptr) {
    for (const char* chat_only : {"tools", "chat_template_kwargs", "add_generation_prompt"}) {
      if (Find(j, chat_only) != nullptr) {
        return InvalidRequestError(Cat({"'", chat_only, "' needs 'messages'."}), chat_only,
                                   "invalid_value");
      }
    }
    if (Error e = ReadString(*prompt, "prompt", req.mutable_text())) return *e;
    return out;
  }
  if (Error e = ParseMessages(j, &req)) return *e;
  if (const json* v = Find(j, "add_generation_prompt")) {
    bool add = true;
    if (Error e = ReadBool(*v, "add_generation_prompt", &add)) return *e;
    req.mutable_chat()->set_add_generation_prompt(add);
  }
  std::vector<std::string> names;
  if (const json* v = Find(j, "tools")) {
    if (Error e = ParseTools(*v, &req, &names)) return *e;
  }
  if (Error e = ParseTemplateKwargs(j, &req)) return *e;
  return out;
}

std::variant<std::vector<uint32_t>, ApiError> ParseDetokenize(std::string_view body,
                                                              const ParseLimits& limits) {
  json j;
  if (Error e = ParseBody(body, limits, &j)) return *e;
  if (Error e = CheckFields(j, {"model", "tokens"})) return *e;
  v1::GenerateRequest ignored;
  if (Error e = ReadModel(j, &ignored)) return *e;
  const json* tokens = Find(j, "tokens");
  if (tokens == nullptr) return MissingParam("tokens");
  if (!tokens->is_array()) return TypeError("tokens", "an array of token ids", *tokens);
  std::vector<uint32_t> ids;
  ids.reserve(tokens->size());
  for (size_t i = 0; i < tokens->size(); ++i) {
    uint64_t id = 0;
    if (Error e = ReadInt((*tokens)[i], IndexedParam("tokens", i), 0, UINT32_MAX, &id)) return *e;
    ids.push_back(static_cast<uint32_t>(id));
  }
  return ids;
}

}  // namespace

std::variant<TokenizeRequest, ApiError> ParseTokenizeRequest(std::string_view body,
                                                             const ParseLimits& limits) {
  return Guard<TokenizeRequest>([&] { return ParseTokenize(body, limits); });
}

std::variant<std::vector<uint32_t>, ApiError> ParseDetokenizeRequest(std::string_view body,
                                                                     const ParseLimits& limits) {
  return Guard<std::vector<uint32_t>>([&] { return ParseDetokenize(body, limits); });
}

std::string TokenizeResponseJson(const std::vector<uint32_t>& tokens, uint32_t max_model_len,
                                 const std::vector<std::string>* token_strs) {
  ojson j;
  j["count"] = tokens.size();
  j["max_model_len"] = max_model_len;
  j["tokens"] = tokens;
  if (token_strs != nullptr) {
    j["token_strs"] = *token_strs;
  } else {
    j["token_strs"] = nullptr;
  }
  return Dump(j);
}

std::string DetokenizeResponseJson(std::string_view text) {
  ojson j;
  j["prompt"] = std::string(text);
  return Dump(j);
}

}  // namespace swaserve::api
