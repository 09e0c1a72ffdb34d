// Internal to lib/model/config*.cc: typed access to config.json fields with
// errors that name the field. Not part of the public API.
#pragma once

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "lib/base/status.h"
#include "lib/model/config.h"

namespace swaserve::model::config_internal {

using Json = nlohmann::json;

inline absl::Status FieldError(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("field '", field, "': ", what));
}

inline std::string Describe(const Json& j) {
  std::string text = j.dump();
  if (text.size() > 40) text = absl::StrCat(text.substr(0, 37), "...");
  return absl::StrCat(j.type_name(), " ", text);
}

// Typed access to the top-level object of config.json. A field may have
// several accepted names; the first present, non-null one is used.
class Fields {
 public:
  explicit Fields(const Json& root) : root_(root) {}

  // The value of the first of `names` present and not null, or nullptr.
  const Json* Find(std::initializer_list<const char*> names,
                   std::string* used) const {
    for (const char* name : names) {
      auto it = root_.find(name);
      if (it != root_.end() && !it->is_null()) {
        *used = name;
        return &*it;
      }
    }
    return nullptr;
  }

  // Reads an integer field into *out (left alone when absent and not
  // required). Returns whether the field was present.
  absl::StatusOr<bool> Int(std::initializer_list<const char*> names,
                           bool required, int* out) const {
    std::string name;
    const Json* v = Find(names, &name);
    if (v == nullptr) {
      if (required) return FieldError(*names.begin(), "missing (required)");
      return false;
    }
    ASSIGN_OR_RETURN(*out, AsInt(*v, name));
    return true;
  }

  absl::StatusOr<bool> Double(std::initializer_list<const char*> names,
                              double* out) const {
    std::string name;
    const Json* v = Find(names, &name);
    if (v == nullptr) return false;
    if (!v->is_number()) {
      return FieldError(name,
                        absl::StrCat("expected a number, got ", Describe(*v)));
    }
    const double d = v->get<double>();
    if (!std::isfinite(d)) return FieldError(name, "must be finite");
    *out = d;
    return true;
  }

  absl::StatusOr<bool> Bool(std::initializer_list<const char*> names,
                            bool* out) const {
    std::string name;
    const Json* v = Find(names, &name);
    if (v == nullptr) return false;
    if (!v->is_boolean()) {
      return FieldError(
          name, absl::StrCat("expected true or false, got ", Describe(*v)));
    }
    *out = v->get<bool>();
    return true;
  }

  absl::StatusOr<bool> String(std::initializer_list<const char*> names,
                              std::string* out) const {
    std::string name;
    const Json* v = Find(names, &name);
    if (v == nullptr) return false;
    if (!v->is_string()) {
      return FieldError(name,
                        absl::StrCat("expected a string, got ", Describe(*v)));
    }
    *out = v->get<std::string>();
    return true;
  }

  static absl::StatusOr<int> AsInt(const Json& v, absl::string_view name) {
    if (!v.is_number_integer()) {
      return FieldError(name,
                        absl::StrCat("expected an integer, got ", Describe(v)));
    }
    if (v.is_number_unsigned()) {
      const uint64_t u = v.get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<int>::max())) {
        return FieldError(name, absl::StrCat(u, " is out of range"));
      }
      return static_cast<int>(u);
    }
    const int64_t i = v.get<int64_t>();
    if (i > std::numeric_limits<int>::max() ||
        i < std::numeric_limits<int>::min()) {
      return FieldError(name, absl::StrCat(i, " is out of range"));
    }
    return static_cast<int>(i);
  }

 private:
  const Json& root_;
};

// config_formats.cc: the transformers-native format, the field list, the
// quantization config and the MTP count from tensor names.

// Whether `root` is a transformers-native config (rope_parameters given).
bool IsNativeFormat(const Json& root);
// Every top-level key must be one this engine reads or one kInertFields
// lists; InvalidArgument naming the first other key.
absl::Status CheckKnownFields(const Json& root);
// When `name` is present (not null) it must be an integer equal to `value`
// (the value of `other`).
absl::Status CheckSameInt(const Json& root, const char* name, int value,
                          const char* other);
// The attention fields of a transformers-native config (rope_parameters,
// the SWA geometry and sinks transformers' model code implies); hub fields
// given as well must agree. Needs layer_types, num_mtp_layers and
// model_type already set.
absl::Status ApplyNativeAttention(const Json& root, ModelConfig* c);
// Hub format, model_type mimo_v2*, with SWA or MTP layers: the SWA KV heads,
// RoPE theta and sink flag must be stated.
absl::Status RequireHubSwaFields(const Json& root, const ModelConfig& c);
// quantization_config and attention_projection_layout.
absl::Status ReadQuantAndLayout(const Json& root, ModelConfig* c);
// The quantization_config object ToJson writes for `q` (q.fp8).
nlohmann::ordered_json QuantToJson(const QuantConfig& q);
// The number of MTP layers model.mtp.layers.{k}.* in `names`: max k + 1;
// every k below must appear (InvalidArgument naming the missing one).
absl::StatusOr<int> CountMtpLayers(const std::vector<std::string>& names);
// The tensor names of the checkpoint in `dir`: the weight_map keys of
// model.safetensors.index.json, else the header keys of every *.safetensors
// file. Empty when the directory holds neither.
absl::StatusOr<std::vector<std::string>> CheckpointTensorNames(
    const std::string& dir);

}  // namespace swaserve::model::config_internal
