#include "lib/model/tokenizer_json.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace swaserve::model::tokenizer_internal {

const Json* Field(const Json& obj, const char* key) {
  if (!obj.is_object()) return nullptr;
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

absl::StatusOr<bool> BoolField(const Json& obj, const char* key, bool def,
                               absl::string_view where) {
  const Json* v = Field(obj, key);
  if (v == nullptr) return def;
  if (!v->is_boolean()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer.json: ", where, ".", key, " is not a boolean"));
  }
  return v->get<bool>();
}

absl::StatusOr<std::string> StringField(const Json& obj, const char* key,
                                        absl::string_view where) {
  const Json* v = Field(obj, key);
  if (v == nullptr || !v->is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tokenizer.json: ", where, ".", key, " is missing or not a string"));
  }
  return v->get<std::string>();
}

absl::StatusOr<uint32_t> IdValue(const Json& v, absl::string_view where) {
  if (!v.is_number_integer() || v.get<int64_t>() < 0 ||
      static_cast<uint64_t>(v.get<int64_t>()) >= kMaxId) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tokenizer.json: ", where, " is not a token id in [0, ", kMaxId, ")"));
  }
  return static_cast<uint32_t>(v.get<int64_t>());
}

absl::StatusOr<std::vector<const Json*>> SequenceSteps(
    const Json& component, const char* list_key, absl::string_view where) {
  std::vector<const Json*> steps;
  const Json* type = Field(component, "type");
  if (type != nullptr && *type == "Sequence") {
    const Json* list = Field(component, list_key);
    if (list == nullptr || !list->is_array()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tokenizer.json: ", where, ".", list_key, " is not an array"));
    }
    for (const Json& s : *list) steps.push_back(&s);
  } else {
    steps.push_back(&component);
  }
  return steps;
}

absl::Status ParseTokenizerJson(absl::string_view json,
                                TokenizerJsonReader* reader) {
  const bool parsed =
      Json::sax_parse(json.data(), json.data() + json.size(), reader,
                      nlohmann::detail::input_format_t::json,
                      /*strict=*/true);
  if (!parsed || !reader->error.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer.json: ",
                     reader->error.empty() ? "not valid JSON" : reader->error));
  }
  if (!reader->root.is_object()) {
    return absl::InvalidArgumentError("tokenizer.json is not a JSON object");
  }
  return absl::OkStatus();
}

}  // namespace swaserve::model::tokenizer_internal
