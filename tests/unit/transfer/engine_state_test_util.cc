#include "tests/unit/transfer/engine_state_test_util.h"

#include <cstdlib>
#include <cstring>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "lib/transfer/ucx_util.h"
#include "tests/unit/transfer/transfer_test_util.h"

namespace swaserve::transfer::testing {

using internal::EngineState;

TransferEngineOptions StateOptions(const std::string& name,
                                   const std::string& tls) {
  TransferEngineOptions options;
  options.name = name;
  options.ucx_tls = tls;
  options.default_timeout = absl::Seconds(10);
  options.max_message_bytes = 64 << 10;
  options.max_inflight_messages = 2;
  return options;
}

std::unique_ptr<EngineState> MakeState(const TransferEngineOptions& options) {
  auto state = EngineState::Create(options);
  EXPECT_TRUE(state.ok()) << state.status();
  return state.ok() ? *std::move(state) : nullptr;
}

std::unique_ptr<EngineState> MakeState(const std::string& name,
                                       const std::string& tls) {
  return MakeState(StateOptions(name, tls));
}

bool MakeTwoStates(std::unique_ptr<EngineState>* a,
                   std::unique_ptr<EngineState>* b) {
  *a = MakeState("a", kShmTls);
  *b = MakeState("b", kShmTls);
  return *a != nullptr && *b != nullptr;
}

void Step(const std::vector<EngineState*>& states) {
  for (EngineState* s : states) {
    s->NewRound();
    s->Progress();
    s->ProcessDeferred();
    const int64_t now = internal::NowNanos();
    if (s->DeadlineCheckDue(now)) s->CheckDeadlines(now);
    s->PublishStats();
  }
}

bool DriveUntil(const std::vector<EngineState*>& states,
                const std::function<bool()>& done, absl::Duration timeout) {
  const absl::Time end = absl::Now() + timeout;
  while (!done()) {
    if (absl::Now() > end) return false;
    Step(states);
  }
  return true;
}

bool ShutDown(const std::vector<EngineState*>& states) {
  std::vector<EngineState*> live;
  for (EngineState* s : states) {
    if (s != nullptr) live.push_back(s);
  }
  for (EngineState* s : live) s->BeginShutdown();
  const bool quiet = DriveUntil(
      live,
      [&] {
        for (EngineState* s : live) {
          if (!s->Quiescent()) return false;
        }
        return true;
      },
      absl::Seconds(10));
  for (EngineState* s : live) s->DestroyWorker();
  return quiet;
}

MappedBuffer::MappedBuffer(EngineState* state, uint64_t id, size_t size,
                           uint8_t fill)
    : state_(state),
      id_(id),
      size_(size),
      data_(static_cast<uint8_t*>(
          std::aligned_alloc(4096, (size + 4095) / 4096 * 4096))) {
  std::memset(data_, fill, size);
  auto mapped = state_->Register(id, data_, size, /*allocate=*/false);
  EXPECT_TRUE(mapped.ok()) << mapped.status();
  ok_ = mapped.ok() && *mapped == data_;
}

MappedBuffer::~MappedBuffer() {
  state_->registrations().Unmap(id_);
  std::free(data_);
}

}  // namespace swaserve::transfer::testing
