// Window restore arithmetic (lib/kv/sequence.h): where a restore starts
// (WindowRestoreStart), which rows each layer computes (the pyramid,
// WindowRestoreRows) and what that costs (WindowRestorePyramidWork,
// WindowRestoreWorkPerRestore).
#include <algorithm>
#include <vector>

#include "gtest/gtest.h"
#include "lib/kv/sequence.h"

namespace swaserve::kv {
namespace {

TEST(WindowRestoreStartTest, ReachesBackOneWindowPerChainLayer) {
  // The window a query at 1000 reads starts at page-aligned 880 (W = 121,
  // pages of 16): one SWA layer needs nothing earlier; each further layer of
  // the chain W - 1 = 120 more positions.
  EXPECT_EQ(SwaWindowStart(1000, 121, 16), 880);
  EXPECT_EQ(WindowRestoreStart(1000, 121, 16, 1), 880);
  EXPECT_EQ(WindowRestoreStart(1000, 121, 16, 2), 760);
  EXPECT_EQ(WindowRestoreStart(1000, 121, 16, 7), 880 - 6 * 120);
  EXPECT_EQ(WindowRestoreStart(1000, 121, 16, 9), 0);  // clamped at the start
  // MiMo-V2.5-Pro: 60 SWA layers + 1 MTP layer, W = 128, pages of 64: R ~ 7.7K.
  EXPECT_EQ(100000 - WindowRestoreStart(100000, 128, 64, 61), 100000 - (99840 - 60 * 127));
  // No window: nothing to restore before the end.
  EXPECT_EQ(WindowRestoreStart(64, 0, 16, 5), 64);
}

TEST(WindowRestoreRowsTest, EachChainLayerStartsOneWindowLaterAndFullLayersFollow) {
  // full, swa, swa, full, swa + 2 MTP layers: a chain of 5; W = 121, pages
  // of 16, M = 1000: A(e) = 880 - (4 - e) * 120.
  const std::vector<bool> swa = {false, true, true, false, true};
  const WindowRestorePyramid p = WindowRestoreRows(1000, 121, 16, swa, 2);
  const int s = WindowRestoreStart(1000, 121, 16, 5);
  ASSERT_EQ(s, 400);
  EXPECT_EQ(p.input_from, (std::vector<int>{400, 400, 520, 640, 640}));
  EXPECT_EQ(p.output_from, (std::vector<int>{400, 520, 640, 640, 760}));
  EXPECT_EQ(p.mtp_from, 760);
  EXPECT_EQ(p.mtp_layers, 2);
  // Work: rows from output_from per main layer, from mtp_from per MTP layer.
  const double rows = (600 + 480 + 360 + 360 + 240 + 2 * 240) / 7.0;
  EXPECT_DOUBLE_EQ(WindowRestorePyramidWork(p, s, 1000), rows);
  // From later than the pyramid's base, each layer's rows are cut there.
  EXPECT_DOUBLE_EQ(WindowRestorePyramidWork(p, 700, 1000),
                   (300 + 300 + 300 + 300 + 240 + 2 * 240) / 7.0);
  // Without MTP layers nothing after the last SWA layer is needed below M.
  const WindowRestorePyramid q = WindowRestoreRows(1000, 121, 16, swa, 0);
  EXPECT_EQ(q.mtp_from, 1000);
  EXPECT_EQ(q.input_from.back(), 880);
  EXPECT_EQ(q.output_from.back(), 1000);
  // Clamped at 0 when the chain reaches past the start.
  const WindowRestorePyramid c = WindowRestoreRows(200, 121, 16, swa, 2);
  for (size_t i = 0; i < swa.size(); ++i) {
    EXPECT_GE(c.input_from[i], 0);
    EXPECT_LE(c.input_from[i], c.output_from[i]);
    EXPECT_LE(c.output_from[i], 200);
  }
}

TEST(WindowRestoreRowsTest, TheMiMoProPyramidIsAboutHalfTheStretch) {
  // 70 layers, full at every 7th; W = 128; no MTP layer (the trace bench's
  // chain) and with one.
  std::vector<bool> swa;
  for (int l = 0; l < 70; ++l) swa.push_back(l % 7 != 0);
  for (int mtp : {0, 1}) {
    const int m = 100000;
    const int s = WindowRestoreStart(m, 128, 16, 60 + mtp);
    const double work = WindowRestorePyramidWork(WindowRestoreRows(m, 128, 16, swa, mtp), s, m);
    EXPECT_GT(work, 0.45 * (m - s)) << mtp;
    EXPECT_LT(work, 0.55 * (m - s)) << mtp;
  }
}

// The work a worker publishes is the pyramid's for every page-aligned M whose
// stretch does not clamp, and more than the pyramid's where it does.
TEST(WindowRestoreRowsTest, ThePublishedWorkIsEveryUnclampedMatchsWork) {
  std::vector<bool> mimo;
  for (int l = 0; l < 70; ++l) mimo.push_back(l % 7 != 0);
  const std::vector<bool> small = {true, true, false, true, false, true};
  for (const auto& [swa, window, page, mtp] :
       std::vector<std::tuple<std::vector<bool>, int, int, int>>{
           {mimo, 128, 16, 1}, {mimo, 128, 16, 0}, {small, 8, 4, 2}, {small, 17, 8, 0}}) {
    const int chain = static_cast<int>(std::count(swa.begin(), swa.end(), true)) + mtp;
    const int work = WindowRestoreWorkPerRestore(window, page, swa, mtp);
    ASSERT_GT(work, 0);
    int unclamped = 0;
    for (int m = page; m <= (chain + 4) * window + 8 * page; m += page) {
      const int s = WindowRestoreStart(m, window, page, chain);
      const double w = WindowRestorePyramidWork(WindowRestoreRows(m, window, page, swa, mtp), s, m);
      if (s > 0) {
        ++unclamped;
        EXPECT_EQ(std::llround(w), work) << "M " << m;
      } else {
        EXPECT_LE(w, work + 0.5) << "M " << m;
      }
    }
    EXPECT_GT(unclamped, 4);
  }
  EXPECT_EQ(WindowRestoreWorkPerRestore(0, 16, mimo, 1), 0);
  EXPECT_EQ(WindowRestoreWorkPerRestore(128, 16, std::vector<bool>(4, false), 0), 0);
}

}  // namespace
}  // namespace swaserve::kv
