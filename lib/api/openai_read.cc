#include "lib/api/openai_read.h"

#include <exception>
#include <limits>

namespace swaserve::api::openai_internal {

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


// An integer in [lo, hi] (floats, booleans and strings are type errors).
Error ReadInt(const json& v, std::string_view param, int64_t lo, uint64_t hi,
              uint64_t* out_unsigned, int64_t* out_signed) {
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

ApiError MissingParam(const std::string& param) {
  return InvalidRequestError(Cat({"Missing required parameter: '", param, "'."}), param,
                             "missing_required_parameter");
}

}  // namespace swaserve::api::openai_internal
