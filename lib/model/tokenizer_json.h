// Internal to swaserve::model_text (included only by lib/model/tokenizer*.cc
// and their tests): reading tokenizer.json. A SAX reader streams model.vocab
// and model.merges (the bulk of a real file: ~150k entries each) straight
// into vectors and keeps the rest as a small DOM; typed field accessors turn
// wrong types into InvalidArgument errors that name the field.
//
// Everything here is stateless except TokenizerJsonReader, which one thread
// fills once (ParseTokenizerJson) and then only reads.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace swaserve::model::tokenizer_internal {

using Json = nlohmann::json;

// Sanity bound on ids in tokenizer.json (real vocabularies are < 2^18).
inline constexpr uint64_t kMaxId = uint64_t{1} << 24;

// The value of `key` in `obj`, or nullptr when `obj` is not an object or the
// key is absent or null.
const Json* Field(const Json& obj, const char* key);
// obj.key as a bool (`def` when absent); InvalidArgument naming
// "<where>.<key>" when it is not a boolean.
absl::StatusOr<bool> BoolField(const Json& obj, const char* key, bool def,
                               absl::string_view where);
// obj.key as a string; InvalidArgument when missing or not a string.
absl::StatusOr<std::string> StringField(const Json& obj, const char* key,
                                        absl::string_view where);
// `v` as a token id in [0, kMaxId); InvalidArgument naming `where` otherwise.
absl::StatusOr<uint32_t> IdValue(const Json& v, absl::string_view where);

// The steps of a pipeline component that may be a Sequence:
// {"type": "Sequence", <list_key>: [steps...]} gives the list's elements,
// anything else gives {&component}. InvalidArgument naming
// "<where>.<list_key>" when a Sequence's list is not an array. The pointers
// point into `component`.
absl::StatusOr<std::vector<const Json*>> SequenceSteps(const Json& component,
                                                       const char* list_key,
                                                       absl::string_view where);

// Reads tokenizer.json in one SAX pass: model.vocab and model.merges (the
// bulk of a real file: ~150k entries each) stream straight into vectors, the
// rest becomes a small DOM. About 3x faster than building the full DOM.
class TokenizerJsonReader {
 public:
  // Everything except model.vocab and model.merges.
  Json root;
  bool has_vocab = false;
  std::vector<std::pair<std::string, int64_t>> vocab;
  bool has_merges = false;
  std::vector<std::pair<std::string, std::string>> merges;
  std::string error;  // first error in vocab/merges or the JSON syntax

  bool null() { return Value(Json(nullptr)); }
  bool boolean(bool v) { return Value(Json(v)); }
  bool number_integer(int64_t v) { return Integer(v); }
  bool number_unsigned(uint64_t v) {
    return Integer(
        v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())
            ? -1
            : static_cast<int64_t>(v));
  }
  bool number_float(double v, const std::string&) { return Value(Json(v)); }
  bool string(std::string& v) {
    if (mode_ == Mode::kMerges) {
      const size_t space = v.find(' ');
      if (space == std::string::npos ||
          v.find(' ', space + 1) != std::string::npos) {
        return Fail(
            absl::StrCat("model.merges[", merges.size(), "] = \"", v,
                         "\" is not two tokens separated by one space"));
      }
      merges.emplace_back(v.substr(0, space), v.substr(space + 1));
      return true;
    }
    if (mode_ == Mode::kMergePair) {
      if (pair_.size() >= 2) return BadMerge();
      pair_.push_back(std::move(v));
      return true;
    }
    return Value(Json(std::move(v)));
  }
  bool binary(Json::binary_t&) { return Fail("unexpected binary value"); }
  bool key(std::string& k) {
    key_ = std::move(k);
    return true;
  }
  bool start_object(size_t) {
    if (mode_ == Mode::kDom && IsModelField("vocab")) {
      mode_ = Mode::kVocab;
      has_vocab = true;
      return true;
    }
    if (mode_ != Mode::kDom) {
      return mode_ == Mode::kVocab ? BadVocab() : BadMerge();
    }
    return Open(Json::object());
  }
  bool end_object() {
    if (mode_ == Mode::kVocab) {
      mode_ = Mode::kDom;
      return true;
    }
    stack_.pop_back();
    keys_.pop_back();
    return true;
  }
  bool start_array(size_t) {
    if (mode_ == Mode::kDom && IsModelField("merges")) {
      mode_ = Mode::kMerges;
      has_merges = true;
      return true;
    }
    if (mode_ == Mode::kMerges) {
      mode_ = Mode::kMergePair;
      pair_.clear();
      return true;
    }
    if (mode_ != Mode::kDom) {
      return mode_ == Mode::kVocab ? BadVocab() : BadMerge();
    }
    return Open(Json::array());
  }
  bool end_array() {
    if (mode_ == Mode::kMergePair) {
      if (pair_.size() != 2) return BadMerge();
      merges.emplace_back(std::move(pair_[0]), std::move(pair_[1]));
      mode_ = Mode::kMerges;
      return true;
    }
    if (mode_ == Mode::kMerges) {
      mode_ = Mode::kDom;
      return true;
    }
    stack_.pop_back();
    keys_.pop_back();
    return true;
  }
  bool parse_error(size_t position, const std::string&,
                   const nlohmann::detail::exception& e) {
    return Fail(
        absl::StrCat("not valid JSON (at byte ", position, "): ", e.what()));
  }

 private:
  enum class Mode { kDom, kVocab, kMerges, kMergePair };

  // True when the container about to open is root.model.<field>.
  bool IsModelField(const char* field) const {
    return stack_.size() == 2 && keys_[1] == "model" &&
           stack_[1]->is_object() && key_ == field;
  }
  bool Integer(int64_t v) {
    if (mode_ == Mode::kVocab) {
      vocab.emplace_back(std::move(key_), v);
      return true;
    }
    if (mode_ != Mode::kDom) return BadMerge();
    return Value(Json(v));
  }
  bool Value(Json v) {
    if (mode_ == Mode::kVocab) return BadVocab();
    if (mode_ != Mode::kDom) return BadMerge();
    Place(std::move(v));
    return true;
  }
  Json* Place(Json v) {
    if (stack_.empty()) {
      root = std::move(v);
      return &root;
    }
    Json* top = stack_.back();
    if (top->is_object()) {
      Json& slot = (*top)[key_];
      slot = std::move(v);
      return &slot;
    }
    top->push_back(std::move(v));
    return &top->back();
  }
  bool Open(Json container) {
    std::string key = stack_.empty() || !stack_.back()->is_object() ? "" : key_;
    stack_.push_back(Place(std::move(container)));
    keys_.push_back(std::move(key));
    return true;
  }
  bool BadVocab() {
    return Fail(absl::StrCat("model.vocab[\"", key_, "\"] is not a token id"));
  }
  bool BadMerge() {
    return Fail(absl::StrCat("model.merges[", merges.size(),
                             "] is neither \"a b\" nor [\"a\", \"b\"]"));
  }
  bool Fail(std::string message) {
    if (error.empty()) error = std::move(message);
    return false;
  }

  Mode mode_ = Mode::kDom;
  std::vector<Json*> stack_;       // open DOM containers
  std::vector<std::string> keys_;  // the key each was opened under
  std::string key_;                // the last object key
  std::vector<std::string> pair_;  // the merge pair being read
};

// Parses tokenizer.json `json` into `*reader` (a fresh reader):
// InvalidArgument "tokenizer.json: ..." when it is not valid JSON, when
// model.vocab or model.merges are malformed, or when the top level is not an
// object.
absl::Status ParseTokenizerJson(absl::string_view json,
                                TokenizerJsonReader* reader);

}  // namespace swaserve::model::tokenizer_internal
