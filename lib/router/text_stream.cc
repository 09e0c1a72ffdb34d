#include "lib/router/text_stream.h"

#include <algorithm>
#include <utility>

namespace swaserve::router {

TextStream::TextStream(const model::Tokenizer& tokenizer, std::vector<std::string> stop_strings)
    : decoder_(tokenizer, /*skip_special_tokens=*/true) {
  for (std::string& s : stop_strings) {
    if (s.empty()) continue;
    holdback_ = std::max(holdback_, s.size() - 1);
    stops_.push_back(std::move(s));
  }
}

std::string TextStream::Add(uint32_t id) {
  if (stopped_) return "";
  held_ += decoder_.Add(id);
  return Release(/*final=*/false);
}

std::string TextStream::Finish() {
  if (stopped_) return "";
  held_ += decoder_.Flush();
  return Release(/*final=*/true);
}

std::string TextStream::Release(bool final) {
  // The earliest stop string in the held text ends the stream. A stop
  // string cannot start before held_ (what was released had no prefix of one
  // within holdback_ bytes of its end).
  size_t cut = std::string::npos;
  const std::string* first = nullptr;
  for (const std::string& s : stops_) {
    const size_t at = held_.find(s);
    if (at < cut) {
      cut = at;
      first = &s;
    }
  }
  if (cut != std::string::npos) {
    matched_ = *first;
    std::string out = held_.substr(0, cut);
    held_.clear();
    stopped_ = true;
    return out;
  }
  size_t keep = final ? 0 : std::min(holdback_, held_.size());
  // Never split a UTF-8 character: move the cut back to a character start.
  size_t n = held_.size() - keep;
  while (n > 0 && n < held_.size() && (static_cast<unsigned char>(held_[n]) & 0xC0) == 0x80) --n;
  std::string out = held_.substr(0, n);
  held_.erase(0, n);
  return out;
}

}  // namespace swaserve::router
