#include "bench/common/prompt_synth.h"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace swaserve::bench {
namespace {

constexpr uint64_t kTokenSeed = 0x5EED5EED1234ABCDull;
constexpr uint32_t kVocab = 152064;

}  // namespace

uint64_t Mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint32_t GenToken(int64_t block_id, int pos) {
  return static_cast<uint32_t>(
      Mix64(kTokenSeed ^
            (static_cast<uint64_t>(block_id) * kTraceBlockTokens + pos)) %
      kVocab);
}

void PromptSynthesizer::Tokens(const std::vector<int64_t>& ids, int n,
                               std::vector<uint32_t>* out, int* reconstructed) {
  *reconstructed = 0;
  if (reconstruct_) {
    // First block id not seen before; only it can start a continuation (any
    // earlier request whose full blocks reached past it would have made it
    // seen).
    size_t p = 0;
    while (p < ids.size() && seen_.contains(ids[p])) ++p;
    if (p > 0 && p < ids.size()) {
      auto it = by_last_full_.find(ids[p - 1]);
      if (it != by_last_full_.end()) {
        for (auto c = it->second.rbegin(); c != it->second.rend(); ++c) {
          if (c->length < n) {
            const int t = c->length - static_cast<int>(p) * kTraceBlockTokens;
            recipes_[ids[p]] = Recipe{c->tail_id, t};
            *reconstructed = t;
            break;
          }
        }
      }
    }
  }
  for (int64_t id : ids) seen_.insert(id);
  const int full_blocks = n / kTraceBlockTokens;
  if (reconstruct_ && full_blocks >= 1 && n % kTraceBlockTokens != 0) {
    by_last_full_[ids[full_blocks - 1]].push_back(Ending{n, ids[full_blocks]});
  }
  out->resize(n);
  for (size_t b = 0; b < ids.size(); ++b) {
    const int begin = static_cast<int>(b) * kTraceBlockTokens;
    const int len = std::min(kTraceBlockTokens, n - begin);
    if (len <= 0) break;
    Fill(ids[b], 0, len, out->data() + begin);
  }
}

void PromptSynthesizer::Fill(int64_t id, int begin, int end,
                             uint32_t* block) const {
  int from = begin;
  auto it = recipes_.find(id);
  if (it != recipes_.end() && it->second.t > begin) {
    const int t = std::min(it->second.t, end);
    Fill(it->second.src, begin, t, block);
    from = t;
  }
  for (int i = from; i < end; ++i) block[i] = GenToken(id, i);
}

}  // namespace swaserve::bench
