// Router's structured-output part of Prepare: a request's output
// constraint completed (a forced tool_choice becomes a tool-call grammar in
// the model's markup; a prompt that opens a reasoning block constrains only
// what follows it) and compiled once here, so that what cannot be compiled
// is a 400 naming why before any worker sees the request.
#include <string>

#include "absl/strings/str_cat.h"
#include "lib/grammar/constraint_spec.h"
#include "lib/router/router.h"
#include "lib/router/router_request.h"
#include "lib/rpc/status_conversion.h"
#include "nlohmann/json.hpp"

namespace swaserve::router {
namespace {

absl::Status InvalidConstraint(absl::string_view msg) {
  return rpc::ErrorWithDetail(absl::StatusCode::kInvalidArgument, v1::ERROR_CODE_INVALID_REQUEST,
                              msg);
}

// The tools of `tools_json` a forced call may name: all, or the named one.
std::string ForcedTools(const std::string& tools_json, const v1::ToolChoice& choice) {
  if (choice.mode() != v1::ToolChoice::MODE_FUNCTION) return tools_json;
  const auto all = nlohmann::ordered_json::parse(tools_json, nullptr, /*allow_exceptions=*/false);
  nlohmann::ordered_json one = nlohmann::ordered_json::array();
  if (all.is_array()) {
    for (const auto& t : all) {
      const auto& f = t.contains("function") ? t["function"] : t;
      if (f.is_object() && f.value("name", "") == choice.function_name()) one.push_back(t);
    }
  }
  return one.dump();
}

}  // namespace

std::shared_ptr<const grammar::TokenVocabulary> Router::ConstraintVocabulary() {
  absl::MutexLock lock(&vocab_mu_);
  if (vocab_ == nullptr) {
    grammar::TokenVocabularyOptions o;
    o.eos_ids = options_.tokenizer->eos_ids();
    absl::StatusOr<std::shared_ptr<const grammar::TokenVocabulary>> v =
        grammar::TokenVocabulary::FromTokenizer(*options_.tokenizer, o);
    if (v.ok()) vocab_ = *std::move(v);
  }
  return vocab_;
}

absl::Status Router::PrepareConstraint(const v1::GenerateRequest& in, Request& r) {
  const v1::ToolChoice::Mode mode = in.tool_choice().mode();
  const bool forced = mode == v1::ToolChoice::MODE_REQUIRED || mode == v1::ToolChoice::MODE_FUNCTION;
  v1::OutputConstraint c = r.sampling.constraint();
  if (c.kind() == v1::OutputConstraint::KIND_NONE && !forced) {
    r.sampling.clear_constraint();
    return absl::OkStatus();
  }
  if (forced) {
    if (c.kind() != v1::OutputConstraint::KIND_NONE) {
      return InvalidConstraint(
          "a response format and a tool_choice that forces a call cannot be combined");
    }
    if (in.prompt_case() != v1::GenerateRequest::kChat || in.chat().tools_json().empty()) {
      return InvalidConstraint("a forced tool_choice needs a chat with tools");
    }
    c.set_kind(v1::OutputConstraint::KIND_TOOL_CALL);
    c.set_tools_json(ForcedTools(in.chat().tools_json(), in.tool_choice()));
    c.set_parallel_calls(mode == v1::ToolChoice::MODE_REQUIRED &&
                         (!in.has_parallel_tool_calls() || in.parallel_tool_calls()));
  }
  if (c.kind() == v1::OutputConstraint::KIND_TOOL_CALL) {
    switch (chat_format_.tool_format) {
      case model::ToolCallFormat::kXmlFunction:
        c.set_tool_format(v1::OutputConstraint::TOOL_FORMAT_XML_FUNCTION);
        break;
      case model::ToolCallFormat::kJsonToolCall:
        c.set_tool_format(v1::OutputConstraint::TOOL_FORMAT_JSON);
        break;
      default:
        return InvalidConstraint(
            "this model's chat template has no tool-call format the server reads, so a call "
            "cannot be forced");
    }
  }
  c.clear_start_after_token();
  if (r.opens_reasoning) {
    const std::optional<uint32_t> close = options_.tokenizer->TokenId(chat_format_.think_close);
    if (!close.has_value()) {
      return InvalidConstraint(absl::StrCat(
          "the prompt opens a reasoning block whose end ('", chat_format_.think_close,
          "') is not one token, so the constraint cannot start after it; turn thinking off"));
    }
    c.set_start_after_token(*close);
  }
  c.clear_generated_token_ids();
  std::shared_ptr<const grammar::TokenVocabulary> vocab = ConstraintVocabulary();
  if (vocab == nullptr) return absl::InternalError("the tokenizer's vocabulary cannot be read");
  absl::StatusOr<std::shared_ptr<const grammar::CompiledGrammar>> g =
      grammar::CompileConstraint(c, vocab, &grammar_cache_);
  if (!g.ok()) return InvalidConstraint(g.status().message());
  *r.sampling.mutable_constraint() = std::move(c);
  return absl::OkStatus();
}

}  // namespace swaserve::router
