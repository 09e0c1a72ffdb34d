// KV staging plans, the KvDestination proto, page copies from a
// kv::Sequence, and an end-to-end ship of a sequence's KV between two
// engines with every token of every layer checked.
#include "lib/transfer/kv_destination.h"

#include <cstring>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/kv/page_pool.h"
#include "lib/kv/sequence.h"
#include "tests/unit/transfer/transfer_test_util.h"

namespace swaserve::transfer {
namespace {

using ::testing::HasSubstr;

kv::KvShape SmallShape() {
  kv::KvShape s;
  s.full_layers = 2;
  s.full_kv_heads = 2;
  s.full_k_head_dim = 8;
  s.full_v_head_dim = 4;
  s.swa_layers = 3;  // e.g. 2 SWA layers + 1 MTP layer
  s.swa_kv_heads = 2;
  s.swa_k_head_dim = 8;
  s.swa_v_head_dim = 4;
  s.sliding_window = 8;
  s.page_size = 4;
  s.dtype = kv::DType::kBF16;
  return s;
}

TEST(KvDestination, FirstSwaTokenIsTheNextTokensWindowAndASequenceHoldsIt) {
  const kv::KvShape shape = SmallShape();
  for (int slack : {0, 1, 4, 9}) {
    for (int n = 1; n <= 60; ++n) {
      auto pools = kv::KvPools::Create({shape, 64, 64, false});
      ASSERT_TRUE(pools.ok());
      kv::Sequence seq({pools->get(), nullptr, slack});
      ASSERT_TRUE(seq.Append(n).ok());
      seq.TrimWindow();
      const int first = FirstSwaToken(shape, n, slack);
      EXPECT_EQ(first % shape.page_size, 0);
      // A trimmed sequence with the same slack still holds it...
      EXPECT_GE(first, seq.swa_first_page() * shape.page_size)
          << "n=" << n << " slack=" << slack;
      // ...and it covers the window of the first generated token (position
      // n sees tokens > n - W) and `slack` tokens more.
      EXPECT_LE(first, std::max(0, n - slack - shape.sliding_window + 1));
      EXPECT_GT(first + shape.page_size,
                std::max(0, n - slack - shape.sliding_window + 1));
      if (slack == 0) {
        EXPECT_EQ(first,
                  kv::SwaWindowStart(n, shape.sliding_window, shape.page_size));
      }
    }
  }
}

TEST(KvDestination, PlanStagingForMiMoV25Pro) {
  const kv::KvShape shape = kv::KvShape::MiMoV25Pro();
  auto plan = PlanStaging(shape, 32768);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->full_pages, 2048);
  EXPECT_EQ(plan->full_page_bytes, 51200u * 16);
  EXPECT_EQ(plan->first_swa_token, 32640);  // floor((32768-127)/16)*16
  EXPECT_EQ(plan->swa_pages, 8);
  EXPECT_EQ(plan->swa_page_bytes, 307200u * 16);
  EXPECT_EQ(plan->total_bytes(), 2048ull * 819200 + 8ull * 4915200);
  EXPECT_EQ(NaiveTransferBytes(shape, 32768), 2048ull * (819200 + 4915200));
  EXPECT_FALSE(PlanStaging(shape, 0).ok());
  EXPECT_FALSE(PlanStaging(shape, 10, -1).ok());
  // Short prompts: everything is inside the window.
  auto small = PlanStaging(shape, 100);
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(small->first_swa_token, 0);
  EXPECT_EQ(small->swa_pages, small->full_pages);
}

TEST(KvDestination, LayoutMismatchNamesTheField) {
  const kv::KvShape shape = SmallShape();
  EXPECT_TRUE(CheckLayout(LayoutOf(shape), shape).ok());
  kv::KvShape other = shape;
  other.swa_layers = 4;
  absl::Status s = CheckLayout(LayoutOf(other), shape);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("swa.num_layers is 4"));
  other = shape;
  other.page_size = 8;
  EXPECT_THAT(CheckLayout(LayoutOf(other), shape).message(),
              HasSubstr("page_size"));
  other = shape;
  other.dtype = kv::DType::kF32;
  EXPECT_THAT(CheckLayout(LayoutOf(other), shape).message(),
              HasSubstr("full.dtype"));
}

TEST(KvDestination, ProtoRoundTrip) {
  Destination d{"t-1",
                "address-bytes",
                {RemoteRegion{kv::PoolKind::kFull, 0x1000, 4096, "rk0"},
                 RemoteRegion{kv::PoolKind::kSwa, 0x3000, 1024, "rk1"}}};
  const kv::KvShape shape = SmallShape();
  auto plan = PlanStaging(shape, 30);
  ASSERT_TRUE(plan.ok());
  v1::KvDestination p = ToProto(d, shape, *plan);
  EXPECT_EQ(p.num_tokens(), 30u);
  EXPECT_EQ(p.first_swa_token(), static_cast<uint32_t>(plan->first_swa_token));
  EXPECT_EQ(p.regions(1).pool(), v1::KV_POOL_SWA);
  auto back = DestinationFromProto(p);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->transfer_id, "t-1");
  EXPECT_EQ(back->worker_address, "address-bytes");
  ASSERT_EQ(back->regions.size(), 2u);
  EXPECT_EQ(back->regions[1].pool, kv::PoolKind::kSwa);
  EXPECT_EQ(back->regions[1].base_address, 0x3000u);
  EXPECT_EQ(back->regions[0].rkey, "rk0");
  p.clear_ucx_worker_address();
  EXPECT_FALSE(DestinationFromProto(p).ok());
}

TEST(KvDestination, CommitPayloadRoundTrip) {
  v1::CommitKvRequest c;
  c.set_transfer_id("x");
  c.set_first_token(42);
  c.mutable_tail_hidden_states()->add_shape(8);
  auto back = DecodeCommitPayload(EncodeCommitPayload(c));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->first_token(), 42u);
  EXPECT_FALSE(DecodeCommitPayload("\xff\xff\xff").ok());
}

// Builds a sequence of n tokens whose pages are scattered through the pools
// (other sequences allocate and free around it).
struct ScatteredSequence {
  ScatteredSequence(const kv::KvShape& shape, int n, int slack, uint64_t seed,
                    bool memory = true) {
    pools = *kv::KvPools::Create({shape, 256, 256, memory});
    std::mt19937_64 rng(seed);
    std::vector<std::unique_ptr<kv::Sequence>> others;
    seq = std::make_unique<kv::Sequence>(
        kv::SequenceOptions{pools.get(), nullptr, slack});
    int done = 0;
    while (done < n) {
      const int chunk = std::min<int>(n - done, 1 + rng() % 13);
      others.push_back(std::make_unique<kv::Sequence>(
          kv::SequenceOptions{pools.get(), nullptr, 0}));
      EXPECT_TRUE(others.back()->Append(1 + rng() % 9).ok());
      EXPECT_TRUE(seq->Append(chunk).ok());
      seq->TrimWindow();
      done += chunk;
      if (rng() % 2) others.erase(others.begin());
    }
    if (memory) {
      testing::FillPattern(pools->full().base(), pools->full().total_bytes(),
                           seed);
      testing::FillPattern(pools->swa().base(), pools->swa().total_bytes(),
                           seed + 1);
    }
  }
  std::unique_ptr<kv::KvPools> pools;
  std::unique_ptr<kv::Sequence> seq;
};

TEST(KvDestination, PlanKvCopiesShipsAllFullPagesAndTheWindowsSwaPages) {
  const kv::KvShape shape = SmallShape();
  for (int n : {1, 3, 4, 5, 8, 13, 21, 40, 77}) {
    ScatteredSequence s(shape, n, 0, n, /*memory=*/false);
    auto plan = PlanStaging(shape, n);
    ASSERT_TRUE(plan.ok());
    v1::KvDestination dest;
    dest.set_transfer_id("t");
    *dest.mutable_layout() = LayoutOf(shape);
    dest.set_num_tokens(n);
    dest.set_first_swa_token(plan->first_swa_token);
    auto* full = dest.add_regions();
    full->set_pool(v1::KV_POOL_FULL);
    full->set_length(plan->full_bytes());
    auto* swa = dest.add_regions();
    swa->set_pool(v1::KV_POOL_SWA);
    swa->set_length(plan->swa_bytes());
    auto copies = PlanKvCopies(*s.seq, *s.pools, dest);
    ASSERT_TRUE(copies.ok()) << copies.status();
    ASSERT_EQ(static_cast<int>(copies->size()),
              plan->full_pages + plan->swa_pages);
    EXPECT_EQ(TotalBytes(*copies), plan->total_bytes());
    for (int i = 0; i < plan->full_pages; ++i) {
      EXPECT_EQ((*copies)[i].region, 0u);
      EXPECT_EQ((*copies)[i].offset, i * plan->full_page_bytes);
    }
    for (int j = 0; j < plan->swa_pages; ++j) {
      const PageCopy& c = (*copies)[plan->full_pages + j];
      EXPECT_EQ(c.region, 1u);
      EXPECT_EQ(c.offset, j * plan->swa_page_bytes);
    }
    // A receiver that wants more window than the sequence kept.
    const int kept = s.seq->swa_first_page() * shape.page_size;
    if (kept >= shape.page_size) {
      v1::KvDestination greedy = dest;
      const int greedy_first = kept - shape.page_size;
      greedy.set_first_swa_token(greedy_first);
      greedy.mutable_regions(1)->set_length(
          (plan->full_pages - greedy_first / shape.page_size) *
          plan->swa_page_bytes);
      auto bad = PlanKvCopies(*s.seq, *s.pools, greedy);
      EXPECT_EQ(bad.status().code(), absl::StatusCode::kFailedPrecondition);
      EXPECT_THAT(bad.status().message(), HasSubstr("swa_slack"));
    }
    // More tokens than the sequence has.
    v1::KvDestination longer = dest;
    longer.set_num_tokens(n + 1);
    EXPECT_EQ(PlanKvCopies(*s.seq, *s.pools, longer).status().code(),
              absl::StatusCode::kFailedPrecondition);
  }
}

// Prefill -> decode for real: random prompt lengths, scattered pages, both
// transports. The staging area then holds, for every token and every layer,
// exactly the sender's K and V (full layers: all tokens; SWA/MTP layers:
// the window).
TEST(KvDestination, ShipsASequenceEndToEnd) {
  const kv::KvShape shape = SmallShape();
  for (const char* tls : {testing::kShmTls, testing::kTcpTls}) {
    TransferEngineOptions o;
    o.ucx_tls = tls;
    o.name = "prefill";
    auto prefill = TransferEngine::Create(o);
    o.name = "decode";
    auto decode = TransferEngine::Create(o);
    ASSERT_TRUE(prefill.ok() && decode.ok());
    std::vector<uint8_t> staging(1 << 20, 0xCD);
    auto reg = (*decode)->Register(staging.data(), staging.size());
    ASSERT_TRUE(reg.ok());
    std::mt19937_64 rng(99);
    for (int trial = 0; trial < 6; ++trial) {
      const int n = 1 + static_cast<int>(rng() % 150);
      ScatteredSequence s(shape, n, 0, 1000 + trial);
      std::fill(staging.begin(), staging.end(), 0xCD);
      Completion<ReceivedTransfer> received;
      KvReceiveOptions ro;
      ro.transfer_id = absl::StrCat(tls, "-", trial);
      ro.shape = shape;
      ro.num_tokens = n;
      ro.staging = reg->get();
      ro.offset = 64;
      auto dest = ExpectKvTransfer(**decode, ro, received.Callback());
      ASSERT_TRUE(dest.ok()) << dest.status();
      auto copies = PlanKvCopies(*s.seq, *s.pools, *dest);
      ASSERT_TRUE(copies.ok()) << copies.status();
      v1::CommitKvRequest commit;
      commit.set_transfer_id(ro.transfer_id);
      commit.set_num_tokens(n);
      commit.set_first_token(7);
      auto d = DestinationFromProto(*dest);
      ASSERT_TRUE(d.ok());
      auto sent = (*prefill)->SendAndWait(
          SendRequest{*d, *copies, EncodeCommitPayload(commit)});
      ASSERT_TRUE(sent.ok()) << sent.status();
      auto got = received.Wait();
      ASSERT_TRUE(got.ok()) << got.status();
      auto c = DecodeCommitPayload(got->commit_payload);
      ASSERT_TRUE(c.ok());
      EXPECT_EQ(c->first_token(), 7u);

      const auto plan = *PlanStaging(shape, n);
      const uint8_t* full_base = staging.data() + 64;
      const uint8_t* swa_base = full_base + plan.full_bytes();
      const kv::PoolGeometry fg = shape.Full(), sg = shape.Swa();
      const size_t fk = fg.num_kv_heads * fg.k_head_dim * 2;
      const size_t fv = fg.num_kv_heads * fg.v_head_dim * 2;
      for (int t = 0; t < n; ++t) {
        const int p = t / shape.page_size, slot = t % shape.page_size;
        for (int l = 0; l < fg.num_layers; ++l) {
          kv::LayerView view = s.seq->FullLayer(l);
          const uint8_t* got_k = full_base + p * plan.full_page_bytes +
                                 fg.KOffset(l) + slot * fg.KTokenStride();
          const uint8_t* got_v = full_base + p * plan.full_page_bytes +
                                 fg.VOffset(l) + slot * fg.VTokenStride();
          ASSERT_EQ(std::memcmp(got_k, view.K(t), fk), 0)
              << "full K token " << t << " layer " << l;
          ASSERT_EQ(std::memcmp(got_v, view.V(t), fv), 0)
              << "full V token " << t << " layer " << l;
        }
        if (t < plan.first_swa_token) continue;
        const int sp = p - plan.first_swa_token / shape.page_size;
        for (int l = 0; l < sg.num_layers; ++l) {
          kv::LayerView view = s.seq->SwaLayer(l);
          const uint8_t* got_k = swa_base + sp * plan.swa_page_bytes +
                                 sg.KOffset(l) + slot * sg.KTokenStride();
          ASSERT_EQ(std::memcmp(got_k, view.K(t),
                                sg.num_kv_heads * sg.k_head_dim * 2),
                    0)
              << "SWA K token " << t << " layer " << l;
          const uint8_t* got_v = swa_base + sp * plan.swa_page_bytes +
                                 sg.VOffset(l) + slot * sg.VTokenStride();
          ASSERT_EQ(std::memcmp(got_v, view.V(t),
                                sg.num_kv_heads * sg.v_head_dim * 2),
                    0)
              << "SWA V token " << t << " layer " << l;
        }
      }
      // Nothing before or after the staging area changed.
      for (size_t i = 0; i < 64; ++i) ASSERT_EQ(staging[i], 0xCD);
      for (size_t i = 64 + plan.total_bytes(); i < staging.size(); ++i) {
        ASSERT_EQ(staging[i], 0xCD) << i;
      }
    }
  }
}

}  // namespace
}  // namespace swaserve::transfer
