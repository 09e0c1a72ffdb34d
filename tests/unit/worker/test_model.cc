#include "tests/unit/worker/test_model.h"

#include <cstring>
#include <random>

#include "gtest/gtest.h"
#include "lib/base/subprocess.h"
#include "lib/model/checkpoint.h"
#include "lib/model/sampling.h"

namespace swaserve::worker::testing {

EngineLock& TestEngine() {
  static EngineLock* engine = [] {
    const std::string dir = *base::MakeTempDir("worker-test");
    auto config = model::BuiltinConfig("tiny", 256);
    EXPECT_TRUE(config.ok()) << config.status();
    EXPECT_TRUE(model::WriteRandomCheckpoint(*config, 11, dir).ok());
    auto e = model::Engine::Create({dir, 2});
    EXPECT_TRUE(e.ok()) << e.status();
    return new EngineLock(e->release());
  }();
  return *engine;
}

std::unique_ptr<kv::KvPools> NewPools(int full_pages, int swa_pages) {
  auto pools = kv::KvPools::Create(
      {TestEngine().config().KvShape(kPage), full_pages, swa_pages, true});
  EXPECT_TRUE(pools.ok()) << pools.status();
  // Zeroed, so that token slots nothing wrote compare equal across pools.
  for (kv::PagePool* pool : {&(*pools)->full(), &(*pools)->swa()}) {
    for (int64_t p = 0; p < pool->num_pages(); ++p) {
      std::memset(pool->PageData(static_cast<kv::PageId>(p)), 0, pool->page_bytes());
    }
  }
  return std::move(*pools);
}

std::vector<uint32_t> RandomPrompt(uint64_t seed, int n) {
  std::mt19937_64 rng(seed);
  std::vector<uint32_t> t(n);
  for (auto& x : t) x = static_cast<uint32_t>(rng() % 256);
  return t;
}

std::vector<uint32_t> ReferenceGreedy(const std::vector<uint32_t>& prompt, int n) {
  EngineLock& e = TestEngine();
  auto pools = NewPools(1024, 1024);
  kv::Sequence seq(kv::SequenceOptions{pools.get(), nullptr, 0, false});
  model::ForwardOutput out;
  EXPECT_TRUE(seq.Append(static_cast<int>(prompt.size())).ok());
  model::ForwardItem item{&seq, prompt, 0, false};
  EXPECT_TRUE(e.Forward({&item, 1}, &out).ok());
  std::vector<uint32_t> gen;
  gen.push_back(model::Argmax(out.logits));
  while (static_cast<int>(gen.size()) < n) {
    EXPECT_TRUE(seq.Append(1).ok());
    model::ForwardItem step{&seq, absl::MakeConstSpan(&gen.back(), 1), seq.length() - 1, false};
    EXPECT_TRUE(e.Forward({&step, 1}, &out).ok());
    gen.push_back(model::Argmax(out.logits));
  }
  return gen;
}

Prefilled PrefillAndStage(kv::KvPools& pools, const std::vector<uint32_t>& prompt, int chunk) {
  EngineLock& e = TestEngine();
  kv::Sequence seq(kv::SequenceOptions{&pools, nullptr, 0, false});
  model::ForwardOutput out;
  const int n = static_cast<int>(prompt.size());
  for (int s = 0; s < n; s += chunk) {
    const int c = std::min(chunk, n - s);
    EXPECT_TRUE(seq.Append(c).ok());
    model::ForwardItem item{&seq, absl::MakeConstSpan(prompt).subspan(s, c), s, false};
    absl::Status st = e.Forward({&item, 1}, &out);
    EXPECT_TRUE(st.ok()) << st;
  }
  Prefilled p;
  p.first_token = model::Argmax(out.logits);
  auto staging = KvStaging::Create(StagedKvLayout::For(pools.shape(), n));
  EXPECT_TRUE(staging.ok()) << staging.status();
  p.staging = std::move(*staging);
  absl::Status st = CopySequenceToStaging(seq, pools, p.staging.get());
  EXPECT_TRUE(st.ok()) << st;
  return p;
}

}  // namespace swaserve::worker::testing
