#include "lib/loadgen/mooncake_trace.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "lib/base/hash.h"

namespace swaserve::loadgen {
namespace {

// Seeds block token streams; changing it changes every synthetic prompt.
constexpr uint64_t kBlockSeed = 0x6d6f6f6e63616b65ull;  // "mooncake"

uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

absl::Status LineError(const std::string& path, int64_t line,
                       absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ":", line, ": ", what));
}

absl::StatusOr<int64_t> GetInt(const nlohmann::json& j, const char* key,
                               const std::string& path, int64_t line) {
  auto it = j.find(key);
  if (it == j.end()) {
    return LineError(path, line, absl::StrCat("missing field '", key, "'"));
  }
  if (it->is_number_integer()) return it->get<int64_t>();
  if (it->is_number_float()) {
    const double d = it->get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9e18) {
      return static_cast<int64_t>(d);
    }
  }
  return LineError(path, line,
                   absl::StrCat("field '", key, "' is not an integer"));
}

int64_t NumBlocks(const TraceRequest& r, int64_t block) {
  if (r.input_length <= 0 || r.hash_ids.empty()) return 0;
  const int64_t needed = (r.input_length + block - 1) / block;
  return std::min<int64_t>(needed, static_cast<int64_t>(r.hash_ids.size()));
}

}  // namespace

absl::StatusOr<std::vector<TraceRequest>> LoadMooncakeTrace(
    const std::string& path, int64_t limit) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot open trace"));
  }
  std::vector<TraceRequest> out;
  std::string text;
  int64_t line = 0;
  while (std::getline(in, text)) {
    ++line;
    if (limit > 0 && static_cast<int64_t>(out.size()) >= limit) break;
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded()) return LineError(path, line, "not valid JSON");
    if (!j.is_object()) return LineError(path, line, "not a JSON object");
    TraceRequest r;
    auto ts = GetInt(j, "timestamp", path, line);
    if (!ts.ok()) return ts.status();
    auto in_len = GetInt(j, "input_length", path, line);
    if (!in_len.ok()) return in_len.status();
    auto out_len = GetInt(j, "output_length", path, line);
    if (!out_len.ok()) return out_len.status();
    r.timestamp_ms = *ts;
    r.input_length = *in_len;
    r.output_length = *out_len;
    if (r.timestamp_ms < 0) return LineError(path, line, "negative timestamp");
    if (r.input_length < 0) {
      return LineError(path, line, "negative input_length");
    }
    if (r.output_length < 0) {
      return LineError(path, line, "negative output_length");
    }
    auto ids = j.find("hash_ids");
    if (ids == j.end())
      return LineError(path, line, "missing field 'hash_ids'");
    if (!ids->is_array()) {
      return LineError(path, line, "field 'hash_ids' is not an array");
    }
    r.hash_ids.reserve(ids->size());
    for (const auto& id : *ids) {
      if (!id.is_number_integer()) {
        return LineError(path, line,
                         "field 'hash_ids' holds a non-integer element");
      }
      r.hash_ids.push_back(id.get<int64_t>());
    }
    if (r.input_length > 0 && r.hash_ids.empty()) {
      return LineError(path, line, "input_length > 0 but no hash_ids");
    }
    out.push_back(std::move(r));
  }
  if (in.bad()) {
    return absl::DataLossError(absl::StrCat(path, ":", line, ": read error"));
  }
  return out;
}

int64_t ScaledBlockTokens(const ScaleOptions& s) {
  const double scaled = static_cast<double>(s.block_tokens) * s.length_scale;
  return std::max<int64_t>(1, std::llround(scaled));
}

int64_t ScaledInputLength(const TraceRequest& r, const ScaleOptions& s) {
  const int64_t block = std::max(1, s.block_tokens);
  const int64_t n = NumBlocks(r, block);
  if (n == 0) return 0;
  const int64_t scaled_block = ScaledBlockTokens(s);
  const int64_t last_raw =
      std::clamp<int64_t>(r.input_length - (n - 1) * block, 1, block);
  const int64_t last = std::clamp<int64_t>(
      std::llround(static_cast<double>(last_raw) * s.length_scale), 1,
      scaled_block);
  int64_t len = (n - 1) * scaled_block + last;
  if (s.max_input_tokens > 0 && len > s.max_input_tokens) {
    len = s.max_input_tokens >= scaled_block
              ? s.max_input_tokens / scaled_block * scaled_block
              : s.max_input_tokens;
  }
  return len;
}

int64_t ScaledOutputLength(const TraceRequest& r, const ScaleOptions& s) {
  int64_t len = std::max<int64_t>(
      1, std::llround(static_cast<double>(r.output_length) * s.length_scale));
  if (s.max_output_tokens > 0) len = std::min(len, s.max_output_tokens);
  return len;
}

int64_t ScaledTimestampMs(const TraceRequest& r, const ScaleOptions& s) {
  return std::llround(static_cast<double>(r.timestamp_ms) * s.time_scale);
}

void AppendBlockTokens(int64_t hash_id, int64_t count, uint32_t vocab_size,
                       uint32_t first_id, std::vector<uint32_t>* out) {
  const uint64_t range =
      vocab_size > first_id ? static_cast<uint64_t>(vocab_size - first_id) : 1;
  uint64_t state = base::Hash64(&hash_id, sizeof(hash_id), kBlockSeed);
  for (int64_t i = 0; i < count; ++i) {
    out->push_back(first_id + static_cast<uint32_t>(SplitMix64(state) % range));
  }
}

std::vector<uint32_t> SynthesizePrompt(const TraceRequest& r,
                                       const ScaleOptions& s,
                                       uint32_t vocab_size, uint32_t first_id) {
  const int64_t total = ScaledInputLength(r, s);
  const int64_t block = ScaledBlockTokens(s);
  std::vector<uint32_t> tokens;
  tokens.reserve(static_cast<size_t>(total));
  for (size_t i = 0; i < r.hash_ids.size(); ++i) {
    const int64_t left = total - static_cast<int64_t>(tokens.size());
    if (left <= 0) break;
    AppendBlockTokens(r.hash_ids[i], std::min(left, block), vocab_size,
                      first_id, &tokens);
  }
  return tokens;
}

std::vector<uint32_t> PromptSynthesizer::Next(const TraceRequest& r) {
  const ScaleOptions& s = options_.scale;
  if (!options_.reconstruct_continuations) {
    return SynthesizePrompt(r, s, options_.vocab_size, options_.first_id);
  }
  const int64_t block = std::max(1, s.block_tokens);
  const int64_t scaled_block = ScaledBlockTokens(s);
  const int64_t n = NumBlocks(r, block);
  ScaleOptions uncapped = s;
  uncapped.max_input_tokens = 0;
  const int64_t length = ScaledInputLength(r, uncapped);
  const int64_t total = ScaledInputLength(r, s);

  auto segments = std::make_shared<std::vector<Segment>>();
  int64_t pos = 0;
  for (int64_t k = n; k >= 1; --k) {
    auto it = by_last_full_id_.find(r.hash_ids[k - 1]);
    if (it == by_last_full_id_.end() || it->second.full_blocks != k ||
        it->second.length >= length) {
      continue;
    }
    *segments = *it->second.segments;
    pos = it->second.length;
    break;
  }
  while (pos < length) {
    const int64_t j = pos / scaled_block;
    const int64_t offset = pos % scaled_block;
    const int64_t count = std::min(scaled_block - offset, length - pos);
    segments->push_back({r.hash_ids[j], offset, count});
    pos += count;
  }

  std::vector<uint32_t> tokens;
  tokens.reserve(static_cast<size_t>(total));
  std::vector<uint32_t> scratch;
  for (const Segment& seg : *segments) {
    const int64_t left = total - static_cast<int64_t>(tokens.size());
    if (left <= 0) break;
    scratch.clear();
    AppendBlockTokens(seg.hash_id, seg.offset + std::min(seg.count, left),
                      options_.vocab_size, options_.first_id, &scratch);
    tokens.insert(tokens.end(), scratch.begin() + seg.offset, scratch.end());
  }

  const int64_t full_blocks = std::min<int64_t>(r.input_length / block, n);
  if (full_blocks >= 1) {
    by_last_full_id_[r.hash_ids[full_blocks - 1]] = {full_blocks, length,
                                                     std::move(segments)};
  }
  return tokens;
}

}  // namespace swaserve::loadgen
