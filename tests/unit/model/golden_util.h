// Helpers shared by the model tests that compare against golden files or
// run a model end to end: file reading, the FNV-1a 64 checkpoint hash the
// fixture scripts record, the row tolerance of golden logits, and one
// prefill + MTP + greedy run over fresh KV pools.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "lib/kv/page_pool.h"
#include "lib/kv/prefix_cache.h"
#include "lib/model/forward.h"

namespace swaserve::model::testing_util {

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// FNV-1a 64 of a file's bytes, 16 lower-case hex digits (as the fixture
// scripts in tools/reference and tools/train compute it).
inline std::string Fnv1a64Hex(const std::string& path) {
  const std::string data = ReadFile(path);
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : data) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return absl::StrFormat("%016x", h);
}

// max |a - g| / max |g| over a row.
inline double RowRelDiff(const float* a, const std::vector<double>& g) {
  double maxabs = 1e-30, diff = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    maxabs = std::max(maxabs, std::fabs(g[i]));
    diff = std::max(diff, std::fabs(static_cast<double>(a[i]) - g[i]));
  }
  return diff / maxabs;
}

// Logits of every position of a prompt, MTP layer 0's logits over it, and
// greedy tokens after it.
struct ModelRun {
  std::vector<float> logits, mtp_logits;
  std::vector<uint32_t> greedy;
};

// Runs `tokens` through `e` on fresh pools (KV in `kv_dtype`), then
// `greedy_steps` greedy decode steps.
inline ModelRun RunPrompt(Engine& e, const std::vector<uint32_t>& tokens,
                          kv::DType kv_dtype, int greedy_steps) {
  ModelRun r;
  kv::KvShape shape = e.config().KvShape(4);
  shape.dtype = kv_dtype;
  auto pools = *kv::KvPools::Create({shape, 256, 256, true});
  auto cache = *kv::PrefixCache::Create({pools.get(), nullptr});
  kv::Sequence seq(kv::SequenceOptions{pools.get(), cache.get(), 0, false}, kv::CacheHit());
  EXPECT_TRUE(seq.Append(tokens.size()).ok());
  ForwardItem item{&seq, tokens, 0, true};
  ForwardOutput out;
  EXPECT_TRUE(e.Forward({&item, 1}, &out, /*keep_all_hidden=*/true).ok());
  r.logits = out.logits;
  const int H = e.config().hidden_size, V = e.config().vocab_size;
  if (tokens.size() > 1 && e.config().num_mtp_layers > 0) {
    ForwardItem mtp{&seq, absl::MakeConstSpan(tokens).subspan(1), 0, true};
    ForwardOutput mo;
    EXPECT_TRUE(e.ForwardMtp(0, {&mtp, 1},
                             absl::MakeConstSpan(out.all_hidden).first((tokens.size() - 1) * H),
                             &mo)
                    .ok());
    r.mtp_logits = mo.logits;
  }
  const float* last = out.logits.data() + out.logits.size() - V;
  uint32_t next = static_cast<uint32_t>(std::max_element(last, last + V) - last);
  for (int step = 0; step < greedy_steps; ++step) {
    r.greedy.push_back(next);
    const int pos = static_cast<int>(seq.length());
    EXPECT_TRUE(seq.Append(1).ok());
    ForwardItem d{&seq, absl::MakeConstSpan(&r.greedy.back(), 1), pos};
    ForwardOutput o;
    EXPECT_TRUE(e.Forward({&d, 1}, &o).ok());
    next = static_cast<uint32_t>(std::max_element(o.logits.begin(), o.logits.end()) -
                                 o.logits.begin());
  }
  return r;
}

}  // namespace swaserve::model::testing_util
