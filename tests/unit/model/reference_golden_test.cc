// The C++ engine against golden logits of the independent PyTorch reference
// (tools/reference/mimo_reference.py, float64), stored in
// tests/fixtures/model/tiny_golden.json by tools/reference/make_golden.py.
//
// The test regenerates the fixture's checkpoint (BuiltinConfig(shape, vocab)
// + WriteRandomCheckpoint(config, seed, dir)), checks that its files hash to
// what the fixture was made from, runs lib/model's Engine over paged KV and
// compares every main-model and MTP logits row with the golden row:
// max |engine - golden| / max |golden| over the row must be < 1e-4.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "lib/base/subprocess.h"
#include "lib/kv/page_pool.h"
#include "lib/kv/sequence.h"
#include "lib/model/checkpoint.h"
#include "lib/model/config.h"
#include "lib/model/forward.h"
#include "tests/unit/model/golden_util.h"
#include "nlohmann/json.hpp"

namespace swaserve::model {
namespace {

using Json = nlohmann::json;

constexpr char kFixture[] = SWASERVE_SOURCE_DIR "/tests/fixtures/model/tiny_golden.json";
constexpr double kTolerance = 1e-4;
constexpr int kPage = 4;

using testing_util::Fnv1a64Hex;
using testing_util::ReadFile;

struct GoldenSeq {
  std::vector<uint32_t> tokens;
  std::vector<std::vector<double>> logits;               // per position
  std::vector<std::vector<std::vector<double>>> mtp;     // [layer][position]
};

struct Fixture {
  std::string shape;
  uint64_t seed = 0;
  int vocab = 0;
  std::string dtype;
  std::string config_hash;
  std::string safetensors_hash;
  std::vector<GoldenSeq> seqs;
};

std::string RegenerateHint(const Fixture& f) {
  return absl::StrCat(
      "The checkpoint generator (BuiltinConfig(\"", f.shape,
      "\") / WriteRandomCheckpoint / ModelConfig::ToJson) changed, so the golden "
      "logits in ", kFixture,
      " no longer describe the checkpoint this test builds. If that change was "
      "not intended, fix the generator (its output must be identical on every "
      "machine); if it was, regenerate the fixture (tools/reference/README.md):\n"
      "  ninja -C build swaserve_cli\n"
      "  rm -rf /tmp/tiny-golden && build/bin/swaserve make-model --shape=", f.shape,
      " --seed=", f.seed, " --vocab=", f.vocab,
      " --tokenizer=none --out=/tmp/tiny-golden\n"
      "  /usr/bin/python3 tools/reference/make_golden.py --checkpoint /tmp/tiny-golden "
      "--shape ", f.shape, " --seed ", f.seed,
      " --out tests/fixtures/model/tiny_golden.json");
}

using testing_util::RowRelDiff;

class ReferenceGoldenTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string text = ReadFile(kFixture);
    Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      load_error_ = new std::string(absl::StrCat("cannot read or parse ", kFixture));
      return;
    }
    fixture_ = new Fixture;
    const Json& c = j["checkpoint"];
    fixture_->shape = c["shape"].get<std::string>();
    fixture_->seed = c["seed"].get<uint64_t>();
    fixture_->vocab = c["vocab"].get<int>();
    fixture_->dtype = c["dtype"].get<std::string>();
    fixture_->config_hash = c["config_fnv1a64"].get<std::string>();
    fixture_->safetensors_hash = c["safetensors_fnv1a64"].get<std::string>();
    for (const Json& s : j["sequences"]) {
      GoldenSeq g;
      g.tokens = s["tokens"].get<std::vector<uint32_t>>();
      g.logits = s["logits"].get<std::vector<std::vector<double>>>();
      for (const Json& m : s["mtp"]) {
        const size_t layer = m["layer"].get<size_t>();
        if (g.mtp.size() <= layer) g.mtp.resize(layer + 1);
        g.mtp[layer] = m["logits"].get<std::vector<std::vector<double>>>();
      }
      fixture_->seqs.push_back(std::move(g));
    }

    auto dir = base::MakeTempDir("reference-golden-test");
    ASSERT_TRUE(dir.ok()) << dir.status();
    dir_ = new std::string(*dir);
    auto config = BuiltinConfig(fixture_->shape, fixture_->vocab);
    ASSERT_TRUE(config.ok()) << config.status();
    ASSERT_TRUE(WriteRandomCheckpoint(*config, fixture_->seed, *dir_).ok());
    checkpoint_matches_ =
        Fnv1a64Hex(*dir_ + "/config.json") == fixture_->config_hash &&
        Fnv1a64Hex(*dir_ + "/model.safetensors") == fixture_->safetensors_hash;
    auto engine = Engine::Create({*dir_, 2});
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = engine->release();
  }
  static void TearDownTestSuite() {
    delete engine_;
    engine_ = nullptr;
    if (dir_ != nullptr) std::filesystem::remove_all(*dir_);
    delete dir_;
    dir_ = nullptr;
    delete fixture_;
    fixture_ = nullptr;
    delete load_error_;
    load_error_ = nullptr;
  }

  void SetUp() override {
    ASSERT_EQ(load_error_, nullptr) << *load_error_;
    ASSERT_NE(fixture_, nullptr);
    ASSERT_NE(engine_, nullptr);
    pools_ = *kv::KvPools::Create({engine_->config().KvShape(kPage), 256, 256, true});
  }

  std::unique_ptr<kv::Sequence> NewSeq() {
    return std::make_unique<kv::Sequence>(
        kv::SequenceOptions{pools_.get(), nullptr, 0, false});
  }

  // Checks `rows` (row-major, vocab floats each) against golden rows; returns
  // the worst relative difference.
  static double CheckRows(const std::vector<float>& rows,
                          const std::vector<std::vector<double>>& golden,
                          const std::string& what) {
    const int V = engine_->config().vocab_size;
    EXPECT_EQ(rows.size(), golden.size() * V) << what;
    double worst = 0;
    for (size_t p = 0; p < golden.size() && (p + 1) * V <= rows.size(); ++p) {
      EXPECT_EQ(golden[p].size(), static_cast<size_t>(V)) << what;
      const double d = RowRelDiff(rows.data() + p * V, golden[p]);
      worst = std::max(worst, d);
      EXPECT_LT(d, kTolerance) << what << " position " << p;
    }
    return worst;
  }

  static Fixture* fixture_;
  static std::string* dir_;
  static Engine* engine_;
  static bool checkpoint_matches_;
  static std::string* load_error_;
  std::unique_ptr<kv::KvPools> pools_;
};

Fixture* ReferenceGoldenTest::fixture_ = nullptr;
std::string* ReferenceGoldenTest::dir_ = nullptr;
Engine* ReferenceGoldenTest::engine_ = nullptr;
bool ReferenceGoldenTest::checkpoint_matches_ = false;
std::string* ReferenceGoldenTest::load_error_ = nullptr;

// The fixture's checkpoint is the one the C++ generator writes today (the
// logits tests need this and stop with the same message when it fails).
TEST_F(ReferenceGoldenTest, FixtureCheckpointMatchesGenerator) {
  EXPECT_EQ(Fnv1a64Hex(*dir_ + "/config.json"), fixture_->config_hash)
      << "config.json differs. " << RegenerateHint(*fixture_);
  EXPECT_EQ(Fnv1a64Hex(*dir_ + "/model.safetensors"), fixture_->safetensors_hash)
      << "model.safetensors differs. " << RegenerateHint(*fixture_);
  EXPECT_EQ(engine_->config().vocab_size, fixture_->vocab);
}

TEST_F(ReferenceGoldenTest, FixtureCoversTheWindow) {
  const int W = engine_->config().sliding_window;
  size_t longest = 0;
  for (const GoldenSeq& g : fixture_->seqs) longest = std::max(longest, g.tokens.size());
  EXPECT_GT(longest, static_cast<size_t>(3 * W)) << "a sequence must span > 3 windows";
  EXPECT_GE(engine_->config().num_mtp_layers, 1);
}

// Whole-sequence prefill (one chunk) of every sequence: all positions'
// logits, then every MTP layer chained on the main hidden states.
TEST_F(ReferenceGoldenTest, MainAndMtpLogitsMatchGolden) {
  ASSERT_TRUE(checkpoint_matches_) << RegenerateHint(*fixture_);
  const ModelConfig& c = engine_->config();
  double worst_main = 0, worst_mtp = 0;
  for (size_t s = 0; s < fixture_->seqs.size(); ++s) {
    const GoldenSeq& g = fixture_->seqs[s];
    const int T = static_cast<int>(g.tokens.size());
    ASSERT_EQ(g.logits.size(), g.tokens.size());
    auto seq = NewSeq();
    ASSERT_TRUE(seq->Append(T).ok());
    ForwardItem item{seq.get(), g.tokens, 0, true};
    ForwardOutput out;
    ASSERT_TRUE(engine_->Forward({&item, 1}, &out, /*keep_all_hidden=*/true).ok());
    worst_main = std::max(
        worst_main, CheckRows(out.logits, g.logits, absl::StrCat("sequence ", s, " main")));

    std::vector<float> hidden = out.all_hidden;
    const int layers = std::min<int>(c.num_mtp_layers, std::max(0, T - 1));
    ASSERT_EQ(g.mtp.size(), static_cast<size_t>(layers)) << "sequence " << s;
    for (int k = 0; k < layers; ++k) {
      // MTP layer k, position p: main token p + 1 + k, hidden row p.
      const int n = T - 1 - k;
      ASSERT_EQ(g.mtp[k].size(), static_cast<size_t>(n));
      ForwardItem mi{seq.get(), absl::MakeConstSpan(g.tokens).subspan(1 + k, n), 0, true};
      std::vector<float> h(hidden.begin(), hidden.begin() + static_cast<size_t>(n) * c.hidden_size);
      ForwardOutput mo;
      ASSERT_TRUE(engine_->ForwardMtp(k, {&mi, 1}, h, &mo).ok());
      worst_mtp = std::max(worst_mtp, CheckRows(mo.logits, g.mtp[k],
                                                absl::StrCat("sequence ", s, " MTP layer ", k)));
      hidden = mo.all_hidden;
    }
  }
  std::printf("worst relative difference: main %.3g, MTP %.3g (tolerance %.0e)\n", worst_main,
              worst_mtp, kTolerance);
}

// Chunked prefill over paged KV (chunks crossing page and window boundaries)
// gives the same golden logits.
TEST_F(ReferenceGoldenTest, ChunkedPrefillMatchesGolden) {
  ASSERT_TRUE(checkpoint_matches_) << RegenerateHint(*fixture_);
  const int V = engine_->config().vocab_size;
  const std::vector<int> chunks = {5, 1, 17, 3};
  for (size_t s = 0; s < fixture_->seqs.size(); ++s) {
    const GoldenSeq& g = fixture_->seqs[s];
    const int T = static_cast<int>(g.tokens.size());
    auto seq = NewSeq();
    std::vector<float> rows;
    int pos = 0;
    for (size_t ci = 0; pos < T; ++ci) {
      const int n = std::min(chunks[ci % chunks.size()], T - pos);
      ASSERT_TRUE(seq->Append(n).ok());
      ForwardItem item{seq.get(), absl::MakeConstSpan(g.tokens).subspan(pos, n), pos, true};
      ForwardOutput out;
      ASSERT_TRUE(engine_->Forward({&item, 1}, &out).ok());
      ASSERT_EQ(out.logits.size(), static_cast<size_t>(n) * V);
      rows.insert(rows.end(), out.logits.begin(), out.logits.end());
      pos += n;
    }
    CheckRows(rows, g.logits, absl::StrCat("sequence ", s, " chunked"));
  }
}

}  // namespace
}  // namespace swaserve::model
