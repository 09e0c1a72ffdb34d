// Internal to swaserve::api (included only by lib/api/openai*.cc): the
// string and JSON helpers the request parser, the error constructors and the
// response writers share. Stateless; thread-safe.
#pragma once

#include <cstddef>
#include <initializer_list>
#include <string>
#include <string_view>

#include "nlohmann/json.hpp"

namespace swaserve::api::openai_internal {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

// Longest client-supplied name (field, role, part type) repeated in a message.
inline constexpr size_t kMaxEchoedBytes = 64;

// The concatenation of `parts`.
inline std::string Cat(std::initializer_list<std::string_view> parts) {
  size_t size = 0;
  for (std::string_view p : parts) size += p.size();
  std::string out;
  out.reserve(size);
  for (std::string_view p : parts) out.append(p);
  return out;
}

// `s`, cut to at most `max` bytes ("..." appended when cut). The cut may split
// a UTF-8 character; Dump() replaces the broken bytes.
inline std::string Shorten(std::string_view s, size_t max = kMaxEchoedBytes) {
  if (s.size() <= max) return std::string(s);
  return Cat({s.substr(0, max), "..."});
}

// Compact JSON text; ill-formed UTF-8 in strings becomes U+FFFD.
inline std::string Dump(const ojson& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace swaserve::api::openai_internal
