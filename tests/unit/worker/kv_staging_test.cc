#include "lib/worker/kv_staging.h"

#include <cstring>

#include "gtest/gtest.h"
#include "tests/unit/worker/test_model.h"

namespace swaserve::worker {
namespace {

using testing::kPage;

TEST(StagedKvLayout, CoversTheFullPromptAndTheNextWindowOnly) {
  const kv::KvShape shape = testing::TestEngine().config().KvShape(kPage);
  const int W = shape.sliding_window;
  const StagedKvLayout l = StagedKvLayout::For(shape, 101);
  EXPECT_EQ(l.full_pages(), 26);
  EXPECT_EQ(l.first_swa_token, kv::SwaWindowStart(101, W, kPage));
  EXPECT_LE(l.first_swa_token, 101 - W + 1);
  EXPECT_EQ(l.swa_pages(), 26 - l.first_swa_token / kPage);
  EXPECT_EQ(l.total_bytes(), 26 * shape.Full().PageBytes() + l.swa_pages() * shape.Swa().PageBytes());
  EXPECT_FALSE(KvStaging::Create(StagedKvLayout{}).ok());
}

TEST(KvStaging, CopyThenAdmitMovesEveryByte) {
  auto src_pools = testing::NewPools(256, 256);
  const std::vector<uint32_t> prompt = testing::RandomPrompt(3, 57);
  testing::Prefilled p = testing::PrefillAndStage(*src_pools, prompt, 16);
  auto dst_pools = testing::NewPools(256, 256);
  kv::Sequence seq(kv::SequenceOptions{dst_pools.get(), nullptr, 0, false});
  ASSERT_TRUE(AdmitFromStaging(*p.staging, *dst_pools, &seq).ok());
  const StagedKvLayout& l = p.staging->layout();
  EXPECT_EQ(seq.length(), 57);
  for (int i = 0; i < l.full_pages(); ++i) {
    ASSERT_EQ(std::memcmp(dst_pools->full().PageData(seq.full_pages()[i]),
                          p.staging->full_region() + i * l.full_page_bytes, l.full_page_bytes),
              0)
        << "full page " << i;
  }
  const int first = l.first_swa_token / kPage;
  for (int j = 0; j < l.swa_pages(); ++j) {
    ASSERT_EQ(std::memcmp(dst_pools->swa().PageData(seq.swa_page(first + j)),
                          p.staging->swa_region() + j * l.swa_page_bytes, l.swa_page_bytes),
              0)
        << "SWA page " << first + j;
  }
  EXPECT_EQ(dst_pools->swa().num_in_use(), l.swa_pages());
  seq.Abort();
  EXPECT_EQ(dst_pools->full().num_free(), dst_pools->full().num_pages());
}

TEST(KvStaging, ReleasedWindowAndFullPoolsAreErrors) {
  auto pools = testing::NewPools(256, 256);
  kv::Sequence seq(kv::SequenceOptions{pools.get(), nullptr, 0, false});
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(seq.Append(8).ok());
  seq.TrimWindow();
  // Staging for the first 12 tokens needs SWA KV the sequence released.
  auto staging = KvStaging::Create(StagedKvLayout::For(pools->shape(), 12));
  ASSERT_TRUE(staging.ok());
  EXPECT_EQ(CopySequenceToStaging(seq, *pools, staging->get()).code(),
            absl::StatusCode::kFailedPrecondition);
  auto big = KvStaging::Create(StagedKvLayout::For(pools->shape(), 200));
  EXPECT_EQ(CopySequenceToStaging(seq, *pools, big->get()).code(),
            absl::StatusCode::kFailedPrecondition);
  // Admission into pools too small changes nothing.
  auto tiny = testing::NewPools(4, 64);
  kv::Sequence dst(kv::SequenceOptions{tiny.get(), nullptr, 0, false});
  EXPECT_EQ(AdmitFromStaging(**big, *tiny, &dst).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(dst.length(), 0);
  EXPECT_EQ(tiny->full().num_in_use(), 0);
}

}  // namespace
}  // namespace swaserve::worker
