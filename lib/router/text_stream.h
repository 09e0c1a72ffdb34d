// TextStream: turns a request's generated token ids into the text a client
// receives, for the router.
//
// Two jobs the decode worker leaves to its caller:
//   * UTF-8: text pieces never end inside a character (model::StreamingDecoder);
//   * stop strings: the worker ends generation once the decoded output
//     contains a stop string, but the stop string itself must not reach the
//     client (SamplingParams.stop). So the stream holds back the last
//     (longest stop string − 1) bytes until more text proves they do not
//     start a stop string, and cuts the text at the first stop string.
// The concatenation of every Add() and Finish() equals the decoded ids, cut
// before the first stop string when there is one.
//
// Holds a reference to the tokenizer (must outlive it). Not thread-safe: one
// per request stream.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lib/model/tokenizer.h"

namespace swaserve::router {

class TextStream {
 public:
  TextStream(const model::Tokenizer& tokenizer, std::vector<std::string> stop_strings);

  // Text that may be sent after `id` (often empty). Once a stop string has
  // been seen everything later is dropped and stopped() is true.
  std::string Add(uint32_t id);
  // The held-back text at the end of the stream (cut at a stop string).
  std::string Finish();
  bool stopped() const { return stopped_; }
  // The stop string that ended the stream (empty while !stopped()).
  const std::string& matched_stop() const { return matched_; }

 private:
  // Emits what can be released from held_ (all of it when `final`).
  std::string Release(bool final);

  model::StreamingDecoder decoder_;
  std::vector<std::string> stops_;
  size_t holdback_ = 0;  // longest stop string − 1
  std::string held_;
  bool stopped_ = false;
  std::string matched_;
};

}  // namespace swaserve::router
