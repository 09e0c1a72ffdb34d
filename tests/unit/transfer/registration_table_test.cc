// lib/transfer/registration_table.h on a real UCP context: lookup of the
// registration covering a range, users, deferred release, counters.
#include "lib/transfer/registration_table.h"

#include <cstdlib>
#include <cstring>
#include <memory>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "lib/transfer/engine_state.h"
#include "lib/transfer/wire.h"
#include "tests/unit/transfer/engine_state_test_util.h"
#include "tests/unit/transfer/transfer_test_util.h"

namespace swaserve::transfer::internal {
namespace {

using testing::MakeState;
using testing::MappedBuffer;

class RegistrationTableTest : public ::testing::Test {
 protected:
  void SetUp() override {
    state_ = MakeState("registrations", testing::kShmTls);
    ASSERT_NE(state_, nullptr);
  }
  void TearDown() override { EXPECT_TRUE(testing::ShutDown({state_.get()})); }
  RegistrationTable& table() { return state_->registrations(); }

  std::unique_ptr<EngineState> state_;
};

TEST_F(RegistrationTableTest, FindMemhCoversExactlyTheRegisteredRange) {
  MappedBuffer a(state_.get(), 1, 64 << 10);
  MappedBuffer b(state_.get(), 2, 16 << 10);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(table().count(), 2);
  EXPECT_EQ(table().bytes(), (64 << 10) + (16 << 10));
  uint64_t reg = 0;
  ucp_mem_h memh = table().FindMemh(a.data(), a.size(), &reg);
  ASSERT_NE(memh, nullptr);
  EXPECT_EQ(reg, 1u);
  EXPECT_EQ(memh, table().Find(1)->memh);
  EXPECT_NE(table().FindMemh(a.data() + 4096, 4096, &reg), nullptr);
  EXPECT_EQ(reg, 1u);
  // The last byte, and a range ending at the end, are inside.
  EXPECT_NE(table().FindMemh(a.data() + a.size() - 1, 1, &reg), nullptr);
  EXPECT_NE(table().FindMemh(a.data() + 100, a.size() - 100, &reg), nullptr);
  // One byte too many, or starting before it, is not.
  reg = 77;
  EXPECT_EQ(table().FindMemh(a.data(), a.size() + 1, &reg), nullptr);
  EXPECT_EQ(table().FindMemh(a.data() - 1, 2, &reg), nullptr);
  EXPECT_EQ(reg, 77u);  // untouched when not found
  ASSERT_NE(table().FindMemh(b.data(), b.size(), &reg), nullptr);
  EXPECT_EQ(reg, 2u);
  // Unregistered memory.
  std::unique_ptr<uint8_t[]> other(new uint8_t[4096]);
  EXPECT_EQ(table().FindMemh(other.get(), 16, &reg), nullptr);
}

TEST_F(RegistrationTableTest, RecordsThePackedRkeyOfEachRegistration) {
  MappedBuffer a(state_.get(), 1, 8192);
  ASSERT_TRUE(a.ok());
  const RegionRec* rec = table().Find(1);
  ASSERT_NE(rec, nullptr);
  EXPECT_EQ(rec->data, a.data());
  EXPECT_EQ(rec->size, a.size());
  EXPECT_FALSE(rec->ucx_rkey.empty());
  EXPECT_FALSE(rec->allocated);
  EXPECT_EQ(rec->users, 0);
  EXPECT_EQ(table().Find(2), nullptr);
}

TEST_F(RegistrationTableTest, AllocateReturnsUcxMemory) {
  auto data = state_->Register(9, nullptr, 1 << 20, /*allocate=*/true);
  ASSERT_TRUE(data.ok()) << data.status();
  ASSERT_NE(*data, nullptr);
  std::memset(*data, 0x5A, 1 << 20);  // writable, all of it
  const RegionRec* rec = table().Find(9);
  ASSERT_NE(rec, nullptr);
  EXPECT_TRUE(rec->allocated);
  EXPECT_EQ(rec->data, *data);
  uint64_t reg = 0;
  EXPECT_NE(table().FindMemh(*data, 1 << 20, &reg), nullptr);
  table().Unmap(9);
  EXPECT_EQ(table().Find(9), nullptr);
  EXPECT_EQ(table().count(), 0);
  EXPECT_EQ(table().bytes(), 0);
}

TEST_F(RegistrationTableTest, ReleaseInUseWaitsForItsUsers) {
  auto* data = static_cast<uint8_t*>(std::aligned_alloc(4096, 8192));
  ASSERT_TRUE(state_->Register(5, data, 8192, false).ok());
  table().AddUser(5);
  table().AddUser(5);
  absl::Notification released;
  EXPECT_TRUE(state_->Release(5, /*unmap_now=*/false, &released));
  ASSERT_NE(table().Find(5), nullptr);
  EXPECT_TRUE(table().Find(5)->releasing);
  // A releasing registration covers nothing any more.
  uint64_t reg = 0;
  EXPECT_EQ(table().FindMemh(data, 16, &reg), nullptr);
  table().RemoveUser(5);
  table().ReapReleased();
  EXPECT_FALSE(released.HasBeenNotified());
  EXPECT_EQ(table().count(), 1);
  table().RemoveUser(5);
  table().ReapReleased();
  EXPECT_TRUE(released.HasBeenNotified());
  EXPECT_EQ(table().Find(5), nullptr);
  EXPECT_EQ(table().count(), 0);
  std::free(data);
}

TEST_F(RegistrationTableTest, ReleaseUnusedOrStoppedUnmapsNow) {
  auto* data = static_cast<uint8_t*>(std::aligned_alloc(4096, 8192));
  ASSERT_TRUE(state_->Register(5, data, 4096, false).ok());
  ASSERT_TRUE(state_->Register(6, data + 4096, 4096, false).ok());
  EXPECT_FALSE(state_->Release(5, false, nullptr));  // no users
  EXPECT_EQ(table().Find(5), nullptr);
  table().AddUser(6);
  EXPECT_FALSE(state_->Release(6, /*unmap_now=*/true, nullptr));
  EXPECT_EQ(table().Find(6), nullptr);
  EXPECT_FALSE(state_->Release(7, false, nullptr));  // unknown
  table().AddUser(7);                                // no-op
  EXPECT_EQ(table().count(), 0);
  std::free(data);
}

TEST_F(RegistrationTableTest, RefusedOnceShuttingDown) {
  state_->BeginShutdown();
  std::unique_ptr<uint8_t[]> data(new uint8_t[4096]);
  auto mapped = state_->Register(1, data.get(), 4096, false);
  EXPECT_TRUE(absl::IsFailedPrecondition(mapped.status())) << mapped.status();
}

}  // namespace
}  // namespace swaserve::transfer::internal
