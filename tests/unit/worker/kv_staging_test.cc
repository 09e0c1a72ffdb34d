#include "lib/worker/kv_staging.h"

#include <cstdlib>
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

// An arena over page-aligned heap memory that it keeps alive.
std::shared_ptr<StagingArena> NewArena(size_t bytes) {
  std::shared_ptr<void> mem(std::aligned_alloc(4096, bytes), [](void* p) { std::free(p); });
  StagingArenaOptions o;
  o.base = mem.get();
  o.size = bytes;
  o.owner = mem;
  auto a = StagingArena::Create(o);
  EXPECT_TRUE(a.ok()) << a.status();
  return std::move(*a);
}

TEST(KvStaging, InArenaHoldsTheSameBytesAndReturnsItsBlock) {
  auto pools = testing::NewPools(256, 256);
  const std::vector<uint32_t> prompt = testing::RandomPrompt(5, 45);
  testing::Prefilled p = testing::PrefillAndStage(*pools, prompt, 16);
  const StagedKvLayout l = p.staging->layout();
  auto arena = NewArena(256 << 10);
  // Something before it, so the staging does not start at offset 0.
  auto head = KvStaging::CreateIn(StagedKvLayout::For(pools->shape(), 3), arena);
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_EQ((*head)->arena(), arena.get());
  EXPECT_EQ((*head)->arena_offset(), 0u);
  auto staging = KvStaging::CreateIn(l, arena);
  ASSERT_TRUE(staging.ok()) << staging.status();
  KvStaging& s = **staging;
  EXPECT_GT(s.arena_offset(), 0u);
  EXPECT_EQ(s.arena_offset() % 4096, 0u);
  EXPECT_EQ(s.data(), arena->base() + s.arena_offset());
  EXPECT_EQ(s.swa_region(), s.data() + l.full_bytes());
  EXPECT_EQ(s.size(), l.total_bytes());
  EXPECT_EQ(s.arena_block_bytes(), (l.total_bytes() + 4095) / 4096 * 4096);
  EXPECT_GE(arena->bytes_in_use(), (*head)->size() + s.size());
  // What a transfer would write: the same bytes as the heap staging.
  std::memcpy(s.data(), p.staging->data(), s.size());
  auto dst_pools = testing::NewPools(256, 256);
  kv::Sequence seq(kv::SequenceOptions{dst_pools.get(), nullptr, 0, false});
  ASSERT_TRUE(AdmitFromStaging(s, *dst_pools, &seq).ok());
  for (int i = 0; i < l.full_pages(); ++i) {
    ASSERT_EQ(std::memcmp(dst_pools->full().PageData(seq.full_pages()[i]),
                          p.staging->full_region() + i * l.full_page_bytes, l.full_page_bytes),
              0);
  }
  seq.Abort();
  staging->reset();
  head->reset();
  EXPECT_EQ(arena->bytes_in_use(), 0u);
  EXPECT_EQ(arena->num_free_runs(), 1u);
  // Heap staging says it is not in an arena.
  EXPECT_EQ(p.staging->arena(), nullptr);
  EXPECT_EQ(p.staging->arena_block_bytes(), 0u);
}

TEST(KvStaging, FullArenaIsResourceExhaustedAndStagingOutlivesItsHandle) {
  const kv::KvShape shape = testing::TestEngine().config().KvShape(kPage);
  const StagedKvLayout l = StagedKvLayout::For(shape, 40);
  auto arena = NewArena((l.total_bytes() + 4095) / 4096 * 4096);
  EXPECT_EQ(KvStaging::CreateIn(l, nullptr).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(KvStaging::CreateIn(StagedKvLayout{}, arena).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto a = KvStaging::CreateIn(l, arena);
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = KvStaging::CreateIn(l, arena);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(b.status().message().find("no free run"), std::string::npos) << b.status();
  // The staging keeps the arena (and the memory behind it) alive.
  std::weak_ptr<StagingArena> weak = arena;
  arena.reset();
  ASSERT_FALSE(weak.expired());
  std::memset((*a)->data(), 0x5a, (*a)->size());  // still writable (ASan would catch a UAF)
  a->reset();
  EXPECT_TRUE(weak.expired());
}

}  // namespace
}  // namespace swaserve::worker
