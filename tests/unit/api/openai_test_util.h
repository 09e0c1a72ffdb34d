// Shared by the OpenAI request parser tests: the parse result a case
// expects, or a test failure.
#pragma once

#include <variant>

#include "gtest/gtest.h"
#include "lib/api/openai.h"

namespace swaserve::api::testing {

inline ParsedRequest MustParse(const ParseResult& r) {
  if (const ApiError* e = std::get_if<ApiError>(&r)) {
    ADD_FAILURE() << "unexpected error " << e->http_status << " (" << e->param
                  << "): " << e->message;
    return {};
  }
  return std::get<ParsedRequest>(r);
}

inline ApiError MustFail(const ParseResult& r) {
  if (std::holds_alternative<ParsedRequest>(r)) {
    ADD_FAILURE() << "parsed, expected an error";
    return {};
  }
  return std::get<ApiError>(r);
}

}  // namespace swaserve::api::testing
