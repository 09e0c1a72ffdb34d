#include "lib/router/cache_breakpoints.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"

namespace swaserve::router {
namespace {

size_t CommonPrefix(const std::string& a, const std::string& b) {
  const size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

// The render of messages [0, last], no generation prompt.
absl::StatusOr<std::string> RenderPrefix(const model::ChatTemplate& tmpl,
                                         const model::ChatInput& input, int last) {
  model::ChatInput part = input;
  part.add_generation_prompt = false;
  part.messages = nlohmann::ordered_json::array();
  for (int i = 0; i <= last && i < static_cast<int>(input.messages.size()); ++i) {
    part.messages.push_back(input.messages[i]);
  }
  return tmpl.Apply(part);
}

}  // namespace

absl::StatusOr<std::vector<v1::CachePin>> CachePinsFor(
    const model::ChatTemplate& tmpl, const model::Tokenizer& tokenizer,
    const model::ChatInput& input, const google::protobuf::RepeatedPtrField<v1::CacheBreakpoint>& breakpoints,
    absl::Span<const uint32_t> prompt) {
  std::vector<v1::CachePin> pins;
  if (breakpoints.empty()) return pins;
  const int n = static_cast<int>(input.messages.size());
  absl::StatusOr<std::string> full = tmpl.Apply(input);
  if (!full.ok()) return full.status();
  // Token ends, in bytes of the render.
  std::vector<size_t> ends;
  ends.reserve(prompt.size());
  size_t at = 0;
  for (uint32_t id : prompt) {
    at += tokenizer.TokenBytes(id).size();
    ends.push_back(at);
  }
  if (at != full->size()) return pins;
  for (const v1::CacheBreakpoint& b : breakpoints) {
    if (b.message_index() < -1 || b.message_index() >= n) {
      return absl::InvalidArgumentError(absl::StrCat("cache breakpoint at message ",
                                                     b.message_index(), " of ", n));
    }
    int last = b.message_index();
    if (last == -1) {
      // The tools: up to the end of the leading system messages; with none,
      // up to where the first message's content starts.
      last = 0;
      while (last < n && input.messages[last].value("role", "") == "system") ++last;
      --last;
    }
    size_t bytes = 0;
    if (last >= 0) {
      absl::StatusOr<std::string> part = RenderPrefix(tmpl, input, last);
      if (!part.ok()) continue;  // a template that rejects a partial chat: no pin
      bytes = CommonPrefix(*full, *part);
    } else {
      model::ChatInput first = input;
      first.add_generation_prompt = false;
      first.messages = nlohmann::ordered_json::array({input.messages[0]});
      first.messages[0]["content"] = "";
      absl::StatusOr<std::string> part = tmpl.Apply(first);
      if (!part.ok()) continue;
      bytes = CommonPrefix(*full, *part);
    }
    const auto tokens = static_cast<uint32_t>(
        std::upper_bound(ends.begin(), ends.end(), bytes) - ends.begin());
    if (tokens == 0) continue;
    v1::CachePin pin;
    pin.set_tokens(tokens);
    pin.set_ttl_seconds(b.ttl_seconds());
    pins.push_back(std::move(pin));
  }
  return pins;
}

}  // namespace swaserve::router
