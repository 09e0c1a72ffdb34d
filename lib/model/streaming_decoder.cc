#include "lib/model/streaming_decoder.h"

#include <string>

#include "absl/strings/string_view.h"
#include "lib/model/tokenizer.h"
#include "lib/model/unicode.h"

namespace swaserve::model {

StreamingDecoder::StreamingDecoder(const Tokenizer& tokenizer,
                                   bool skip_special_tokens)
    : tokenizer_(tokenizer), skip_special_tokens_(skip_special_tokens) {}

std::string StreamingDecoder::Add(uint32_t id) {
  if (skip_special_tokens_ && tokenizer_.IsSpecial(id)) return std::string();
  const absl::string_view bytes = tokenizer_.TokenBytes(id);
  if (bytes.empty()) return std::string();
  pending_.append(bytes.data(), bytes.size());
  std::string out;
  const size_t used =
      unicode::AppendUtf8Lossy(pending_, /*hold_incomplete_tail=*/true, &out);
  pending_.erase(0, used);
  return out;
}

std::string StreamingDecoder::Flush() {
  std::string out;
  unicode::AppendUtf8Lossy(pending_, /*hold_incomplete_tail=*/false, &out);
  pending_.clear();
  return out;
}

}  // namespace swaserve::model
