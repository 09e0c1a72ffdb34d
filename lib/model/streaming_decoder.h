// StreamingDecoder: generated token ids -> text, one id at a time, never
// splitting a UTF-8 character. Part of swaserve::model_text; tokenizer.h
// includes this header, so callers of Tokenizer get it too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace swaserve::model {

class Tokenizer;

// Turns a stream of generated ids into text pieces that never end in the
// middle of a UTF-8 character: Add() returns only complete characters and
// holds back an incomplete trailing sequence (at most 3 bytes) until the
// next ids complete it. Ill-formed sequences come out as U+FFFD. The
// concatenation of all Add() results and Flush() equals
// tokenizer.Decode(all ids).
//
// Holds a reference to the tokenizer, which must outlive it. Not thread-safe
// (one decoder per request stream); cheap to create.
class StreamingDecoder {
 public:
  explicit StreamingDecoder(const Tokenizer& tokenizer,
                            bool skip_special_tokens = false);

  // Text completed by `id` (often empty while a character is incomplete).
  std::string Add(uint32_t id);
  // The held-back bytes, as U+FFFD (a stream that ended mid-character), and
  // resets the decoder. Empty when nothing is held back.
  std::string Flush();
  // Bytes currently held back.
  size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer& tokenizer_;
  const bool skip_special_tokens_;
  std::string pending_;
};

}  // namespace swaserve::model
