#include "lib/worker/staging_arena.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace swaserve::worker {
namespace {

constexpr size_t kAlign = 4096;

// Page-aligned heap memory for an arena; the arena keeps it alive.
std::shared_ptr<void> Memory(size_t bytes) {
  return std::shared_ptr<void>(std::aligned_alloc(kAlign, bytes),
                               [](void* p) { std::free(p); });
}

std::unique_ptr<StagingArena> NewArena(size_t bytes) {
  std::shared_ptr<void> mem = Memory(bytes);
  auto a = StagingArena::Create({mem.get(), bytes, kAlign, mem});
  EXPECT_TRUE(a.ok()) << a.status();
  return std::move(*a);
}

TEST(StagingArena, RejectsBadOptions) {
  std::shared_ptr<void> mem = Memory(4 * kAlign);
  EXPECT_EQ(StagingArena::Create({nullptr, 4 * kAlign}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(StagingArena::Create({mem.get(), kAlign - 1}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(StagingArena::Create({mem.get(), 4 * kAlign, 3000}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      StagingArena::Create({static_cast<char*>(mem.get()) + 8, 2 * kAlign})
          .status()
          .code(),
      absl::StatusCode::kInvalidArgument);
  // A size that is not a multiple of the alignment is rounded down.
  auto a = StagingArena::Create({mem.get(), 3 * kAlign + 100});
  ASSERT_TRUE(a.ok());
  EXPECT_EQ((*a)->capacity(), 3 * kAlign);
}

TEST(StagingArena, RoundsUpBestFitsAndCoalesces) {
  auto a = NewArena(16 * kAlign);
  EXPECT_EQ(a->capacity(), 16 * kAlign);
  EXPECT_EQ(a->largest_free(), 16 * kAlign);
  EXPECT_FALSE(a->Allocate(0).has_value());
  EXPECT_FALSE(a->Allocate(16 * kAlign + 1).has_value());
  auto b0 = a->Allocate(1);  // one unit
  ASSERT_TRUE(b0.has_value());
  EXPECT_EQ(b0->offset, 0u);
  EXPECT_EQ(b0->size, kAlign);
  auto b1 = a->Allocate(3 * kAlign);  // [1, 4)
  auto b2 = a->Allocate(kAlign);      // [4, 5)
  auto b3 = a->Allocate(2 * kAlign);  // [5, 7)
  auto b5 = a->Allocate(kAlign);      // [7, 8)
  ASSERT_TRUE(b1 && b2 && b3 && b5);
  EXPECT_EQ(a->bytes_in_use(), 8 * kAlign);
  // Free [1, 4) and [5, 7): runs of 3, 2 and 8 units. A 2-unit request takes
  // the 2-unit hole (best fit), not the first one that fits.
  ASSERT_TRUE(a->Free(b1->offset).ok());
  ASSERT_TRUE(a->Free(b3->offset).ok());
  EXPECT_EQ(a->num_free_runs(), 3u);
  auto b4 = a->Allocate(2 * kAlign);
  ASSERT_TRUE(b4.has_value());
  EXPECT_EQ(b4->offset, 5 * kAlign);
  EXPECT_EQ(a->Free(b1->offset).code(),
            absl::StatusCode::kNotFound);  // double free
  EXPECT_EQ(a->Free(123).code(), absl::StatusCode::kNotFound);
  for (const auto& b : {b0, b2, b4, b5}) ASSERT_TRUE(a->Free(b->offset).ok());
  EXPECT_EQ(a->bytes_in_use(), 0u);
  EXPECT_EQ(a->num_free_runs(), 1u);
  EXPECT_EQ(a->largest_free(), a->capacity());
  EXPECT_EQ(a->num_blocks(), 0u);
}

TEST(StagingArena, KeepsItsOwnerAlive) {
  std::shared_ptr<void> mem = Memory(2 * kAlign);
  std::weak_ptr<void> weak = mem;
  auto a = StagingArena::Create({mem.get(), 2 * kAlign, kAlign, mem});
  ASSERT_TRUE(a.ok());
  mem.reset();
  EXPECT_FALSE(weak.expired());
  a->reset();
  EXPECT_TRUE(weak.expired());
}

// The model of the arena: live blocks by offset. Its free runs are the
// maximal gaps between them, which a fully coalescing arena must match.
std::vector<std::pair<size_t, size_t>> Gaps(
    const std::map<size_t, size_t>& live, size_t cap) {
  std::vector<std::pair<size_t, size_t>> gaps;  // (offset, size)
  size_t at = 0;
  for (const auto& [off, size] : live) {
    if (off > at) gaps.push_back({at, off - at});
    at = off + size;
  }
  if (cap > at) gaps.push_back({at, cap - at});
  return gaps;
}

TEST(StagingArena, PropertyRandomAllocFreeKeepsInvariants) {
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    SCOPED_TRACE(absl::StrCat("seed ", seed));
    std::mt19937_64 rng(seed);
    const size_t cap_units = 64 + rng() % 512;
    auto a = NewArena(cap_units * kAlign);
    ASSERT_EQ(a->capacity(), cap_units * kAlign);
    std::map<size_t, size_t> live;  // offset -> size
    size_t in_use = 0;
    for (int step = 0; step < 2000; ++step) {
      SCOPED_TRACE(absl::StrCat("step ", step));
      const bool alloc = live.empty() || rng() % 100 < 55;
      if (alloc) {
        // Mostly small, sometimes large, sizes not multiples of the alignment.
        const size_t max_units = rng() % 8 == 0 ? cap_units / 2 : 16;
        const size_t bytes = 1 + rng() % (max_units * kAlign);
        const size_t need = (bytes + kAlign - 1) / kAlign * kAlign;
        // Expected: the smallest gap that fits, lowest offset among equals.
        std::optional<std::pair<size_t, size_t>> best;
        for (const auto& g : Gaps(live, a->capacity())) {
          if (g.second >= need && (!best || g.second < best->second)) best = g;
        }
        const std::optional<StagingArena::Block> b = a->Allocate(bytes);
        ASSERT_EQ(b.has_value(), best.has_value());
        if (b) {
          EXPECT_EQ(b->size, need);
          EXPECT_EQ(b->offset, best->first) << "not best fit";
          EXPECT_EQ(b->offset % kAlign, 0u);
          ASSERT_LE(b->offset + b->size, a->capacity());
          // No overlap with any live block.
          auto next = live.lower_bound(b->offset);
          if (next != live.end()) {
            ASSERT_LE(b->offset + b->size, next->first);
          }
          if (next != live.begin()) {
            auto prev = std::prev(next);
            ASSERT_LE(prev->first + prev->second, b->offset);
          }
          live.emplace(b->offset, b->size);
          in_use += b->size;
        }
      } else {
        auto it = live.begin();
        std::advance(it, rng() % live.size());
        ASSERT_TRUE(a->Free(it->first).ok());
        in_use -= it->second;
        live.erase(it);
      }
      // Invariants after every step.
      ASSERT_EQ(a->bytes_in_use(), in_use);
      ASSERT_EQ(a->num_blocks(), live.size());
      const auto gaps = Gaps(live, a->capacity());
      ASSERT_EQ(a->num_free_runs(), gaps.size())
          << "free runs not fully coalesced";
      size_t largest = 0;
      for (const auto& g : gaps) largest = std::max(largest, g.second);
      ASSERT_EQ(a->largest_free(), largest);
    }
    // Free the rest in random order: back to one free run.
    std::vector<size_t> rest;
    for (const auto& [off, size] : live) rest.push_back(off);
    std::shuffle(rest.begin(), rest.end(), rng);
    for (size_t off : rest) ASSERT_TRUE(a->Free(off).ok());
    EXPECT_EQ(a->bytes_in_use(), 0u);
    EXPECT_EQ(a->num_free_runs(), 1u);
    EXPECT_EQ(a->largest_free(), a->capacity());
  }
}

}  // namespace
}  // namespace swaserve::worker
