// KvLayoutFingerprint (lib/kv/page_store.h): stable, and different for every
// field that changes a page's bytes or meaning.
#include "lib/kv/page_store.h"

#include <functional>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "gtest/gtest.h"

namespace swaserve::kv {
namespace {

TEST(KvLayoutFingerprintTest, DeterministicAndPinned) {
  const KvShape shape = KvShape::MiMoV25Pro();
  EXPECT_EQ(KvLayoutFingerprint(shape, PoolKind::kFull),
            KvLayoutFingerprint(shape, PoolKind::kFull));
  // Pinned: the value is part of stored keys (files, Redis); a change here
  // orphans every stored page and needs a version bump, not a new pin.
  EXPECT_EQ(KvLayoutFingerprint(shape, PoolKind::kFull), 0x69b33c28acfd6404ULL)
      << std::hex << KvLayoutFingerprint(shape, PoolKind::kFull);
}

TEST(KvLayoutFingerprintTest, EveryFieldMatters) {
  const KvShape base = KvShape::MiMoV25Pro();
  const std::vector<std::function<void(KvShape&)>> full_changes = {
      [](KvShape& s) { s.full_layers += 1; },
      [](KvShape& s) { s.full_kv_heads += 1; },
      [](KvShape& s) { s.full_k_head_dim += 1; },
      [](KvShape& s) { s.full_v_head_dim += 1; },
      [](KvShape& s) { s.page_size *= 2; },
      [](KvShape& s) { s.dtype = DType::kF16; },
      [](KvShape& s) { s.dtype = DType::kF32; },
  };
  absl::flat_hash_set<uint64_t> seen = {
      KvLayoutFingerprint(base, PoolKind::kFull),
      KvLayoutFingerprint(base, PoolKind::kSwa),  // same geometry, other kind
      KvLayoutFingerprint(base, PoolKind::kFull, /*model=*/1),
      KvLayoutFingerprint(base, PoolKind::kFull, /*model=*/2),
  };
  EXPECT_EQ(seen.size(), 4u);
  for (const auto& change : full_changes) {
    KvShape s = base;
    change(s);
    EXPECT_TRUE(seen.insert(KvLayoutFingerprint(s, PoolKind::kFull)).second);
  }
  // SWA-only fields change the SWA fingerprint and not the full one.
  KvShape s = base;
  s.swa_layers += 1;
  EXPECT_EQ(KvLayoutFingerprint(s, PoolKind::kFull),
            KvLayoutFingerprint(base, PoolKind::kFull));
  EXPECT_NE(KvLayoutFingerprint(s, PoolKind::kSwa),
            KvLayoutFingerprint(base, PoolKind::kSwa));
  // The window does not change a page's layout.
  s = base;
  s.sliding_window *= 2;
  EXPECT_EQ(KvLayoutFingerprint(s, PoolKind::kSwa),
            KvLayoutFingerprint(base, PoolKind::kSwa));
}

}  // namespace
}  // namespace swaserve::kv
