// End to end: images (a data: URL and an http URL the router
// fetches), audio (input_audio WAV) and video (a data: URL, streamed) sent
// with the official OpenAI npm client (tests/e2e/openai_multimodal.mjs), and
// an image over the gRPC API from a C++ stub,
// through a real local cluster: router -> encoder (swaserve-encoder, the
// tiny random vision and audio towers) -> prefill -> decode. Checks:
//   - every request answers, usage counting the placeholder tokens;
//   - bad media is a 400 naming the problem, and the cluster keeps serving;
//   - an encoder killed with SIGKILL loses no request (the next encoder on
//     the hash ring takes its items);
//   - greedy output is identical with the embedding cache cold and warm
//     (the second pass hits the encoder's cache), with embeddings sent by
//     reference (fetched by the prefill worker from the encoder) instead of
//     inline, and monolithic (one "both" worker) vs disaggregated (prefill +
//     decode workers);
//   - the prefix cache tells images apart: the same image again reuses the
//     KV past its placeholders, another image of the same size does not.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/e2e/e2e_util.h"
#include "tests/integration/router/local_cluster.h"
#include "tests/unit/media/media_test_util.h"

namespace swaserve {
namespace {

using nlohmann::json;
namespace mt = media::testing;

std::string B64(const std::vector<uint8_t>& bytes) {
  return absl::Base64Escape(
      absl::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
}

// Runs the npm client against `router`; the parsed JSON it prints.
json RunClient(testing::LocalCluster& c, const std::string& router, const std::string& inputs) {
  return e2e::RunJsonCommand(absl::StrCat("node ", SWASERVE_SOURCE_DIR,
                                          "/tests/e2e/openai_multimodal.mjs http://127.0.0.1:",
                                          c.Get(router)->http_port, " tiny ", inputs));
}

std::vector<std::string> Texts(const json& r) {
  std::vector<std::string> out;
  for (const char* k : {"image", "image_b", "text_only", "audio", "video", "http_image", "two_images"}) {
    out.push_back(r[k].value("text", "<none>"));
  }
  return out;
}

TEST(MultimodalE2E, ImageAudioAndVideoThroughTheOpenAiClient) {
  auto cluster = testing::LocalCluster::Create({.cli_bin = SWASERVE_CLI_BIN,
                                                .worker_bin = SWASERVE_WORKER_BIN,
                                                .router_bin = SWASERVE_ROUTER_BIN,
                                                .worker_flags = {"--model_name=tiny"},
                                                .router_flags = {"--media.fetch_allow_private",
                                                                 "--media.fetch_allow_http"},
                                                .model_flags = {"--vision", "--audio"},
                                                .encoder_bin = SWASERVE_ENCODER_BIN});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  testing::LocalCluster& c = **cluster;
  for (auto [role, id] : {std::pair{"prefill", "p1"}, {"decode", "d1"}}) {
    auto w = c.StartWorker(role, id);
    ASSERT_TRUE(w.ok()) << w.status();
  }
  auto e1 = c.StartEncoder("e1");
  ASSERT_TRUE(e1.ok()) << e1.status();
  auto r1 = c.StartRouter("r1");
  ASSERT_TRUE(r1.ok()) << r1.status();
  ASSERT_TRUE(c.WaitHealthy("r1", absl::Seconds(60)).ok());

  // Inputs, generated here; the second image has the first one's size
  // (224 × 224: 16 × 16 patches of 14, merged 2 × 2 into 64 tokens).
  const std::vector<uint8_t> png = mt::EncodePng(mt::MakePattern(224, 224, 1));
  const std::vector<uint8_t> png_b = mt::EncodePng(mt::MakePattern(224, 224, 2));
  const std::vector<uint8_t> wav = mt::WriteWav(mt::Sine(440, 1.5, 16000), 1, 16000, 16);
  const std::string video_path = mt::TempPath("mm_e2e.mkv");
  ASSERT_TRUE(mt::WriteTestVideo(video_path, {.num_frames = 20}).ok());
  auto video = mt::ReadFileBytes(video_path);
  ASSERT_TRUE(video.ok());
  httplib::Server media_server;
  media_server.Get("/pattern.png", [&](const httplib::Request&, httplib::Response& res) {
    res.set_content(std::string(png.begin(), png.end()), "image/png");
  });
  const int media_port = media_server.bind_to_any_port("127.0.0.1");
  std::thread serve([&] { media_server.listen_after_bind(); });
  const std::string inputs = c.dir() + "/mm_inputs.json";
  std::ofstream(inputs) << json{{"png", B64(png)},
                                {"png_b", B64(png_b)},
                                {"wav", B64(wav)},
                                {"video", B64(*video)},
                                {"video_mime", "video/x-matroska"},
                                {"http_png", absl::StrCat("http://127.0.0.1:", media_port,
                                                          "/pattern.png")}}
                               .dump();

  const json cold = RunClient(c, "r1", inputs);
  ASSERT_FALSE(cold.contains("error")) << cold.dump();
  for (const std::string& k : {"image", "image_b", "text_only", "audio", "video", "http_image",
                               "two_images"}) {
    const json& r = cold[k];
    ASSERT_TRUE(r.contains("usage") && r["usage"].is_object()) << k << ": " << r.dump();
    EXPECT_GT(r["usage"]["completion_tokens"].get<int>(), 0) << k;
    EXPECT_TRUE(r["finish_reason"] == "length" || r["finish_reason"] == "stop") << k;
  }
  // Usage counts the placeholders: the image request is the text-only one
  // plus the image's 64 tokens (and at most one for the newline joining the
  // parts, which the tokenizer may merge with the text before it).
  const int text_only = cold["text_only"]["usage"]["prompt_tokens"];
  const int with_image = cold["image"]["usage"]["prompt_tokens"];
  EXPECT_GE(with_image, text_only + 64) << cold.dump();
  EXPECT_LE(with_image, text_only + 65) << cold.dump();
  EXPECT_EQ(cold["image_b"]["usage"]["prompt_tokens"], with_image);
  EXPECT_EQ(cold["http_image"]["usage"]["prompt_tokens"], with_image);
  EXPECT_GT(cold["audio"]["usage"]["prompt_tokens"].get<int>(), 5);
  // 20 frames of 64 × 48 at 10 fps, sampled at the encoder's fps.
  EXPECT_GT(cold["video"]["usage"]["prompt_tokens"].get<int>(), text_only + 4);
  // The http image is the same bytes as the data: one: the same answer.
  EXPECT_EQ(cold["http_image"]["text"], cold["image"]["text"]);
  // Bad input: 400 naming the problem.
  EXPECT_EQ(cold["corrupt_image"].value("status", 0), 400) << cold["corrupt_image"].dump();
  EXPECT_EQ(cold["mp3"].value("status", 0), 400) << cold["mp3"].dump();
  EXPECT_NE(cold["mp3"].value("error", "").find("wav"), std::string::npos);
  // The same image request through the gRPC API (GenerateRequest.multimodal,
  // its marker in the message text), from a C++ stub: the same answer.
  {
    std::unique_ptr<v1::Router::Stub> stub = c.RouterStub("r1");
    v1::GenerateRequest req;
    req.set_model("tiny");
    v1::ChatMessage* m = req.mutable_chat()->add_messages();
    m->set_role("user");
    m->set_content("Describe this picture:\n<|image_pad|>");
    req.mutable_chat()->set_add_generation_prompt(true);
    v1::MultimodalItem* item = req.add_multimodal();
    item->set_modality(v1::MODALITY_IMAGE);
    item->set_data(std::string(png.begin(), png.end()));
    req.mutable_sampling()->set_max_tokens(8);
    grpc::ClientContext ctx;
    auto reader = stub->Generate(&ctx, req);
    v1::GenerateResponse r;
    std::string text;
    uint32_t prompt_tokens = 0;
    while (reader->Read(&r)) {
      text += r.text();
      if (r.has_usage()) prompt_tokens = r.usage().prompt_tokens();
    }
    const grpc::Status st = reader->Finish();
    ASSERT_TRUE(st.ok()) << st.error_message();
    EXPECT_EQ(text, cold["image"]["text"]);
    EXPECT_EQ(static_cast<int>(prompt_tokens), with_image);
    // ListModels says what the model takes: it has both towers.
    v1::ListModelsResponse models;
    grpc::ClientContext lctx;
    ASSERT_TRUE(stub->ListModels(&lctx, {}, &models).ok());
    ASSERT_EQ(models.models_size(), 1);
    const std::vector<int> modalities(models.models(0).modalities().begin(),
                                      models.models(0).modalities().end());
    EXPECT_EQ(modalities, (std::vector<int>{v1::MODALITY_IMAGE, v1::MODALITY_VIDEO,
                                            v1::MODALITY_AUDIO}));
  }
  const double hits_cold =
      c.Metric("r1", "swaserve_router_media_items_total{modality=\"image\",cache=\"hit\"}");

  // Warm: the encoder's cache answers; the output is the same.
  const json warm = RunClient(c, "r1", inputs);
  ASSERT_FALSE(warm.contains("error")) << warm.dump();
  EXPECT_EQ(Texts(warm), Texts(cold));
  EXPECT_GE(c.Metric("r1", "swaserve_router_media_items_total{modality=\"image\",cache=\"hit\"}"),
            hits_cold + 4);
  EXPECT_GE(c.Metric("r1", "swaserve_router_media_items_total{modality=\"audio\",cache=\"hit\"}"),
            1);
  // The prefix cache tells images apart: in the cold pass image_b followed
  // the image with the same text and reused at most the text before its
  // placeholders; the image again (warm) reuses its placeholders' KV too.
  auto cached = [](const json& r) {
    return r["usage"]["prompt_tokens_details"].value("cached_tokens", -1);
  };
  EXPECT_LT(cached(cold["image_b"]), text_only) << cold["image_b"].dump();
  EXPECT_GT(cached(warm["image"]), text_only) << warm["image"].dump();

  // Embeddings by reference: a router sending every embedding larger than
  // 1 byte by reference (the prefill worker fetches it from the encoder,
  // Encoder.Fetch): the same output.
  auto r2 = c.StartRouter("r2", {"--media.inline_max_bytes=1"});
  ASSERT_TRUE(r2.ok()) << r2.status();
  ASSERT_TRUE(c.WaitHealthy("r2", absl::Seconds(60)).ok());
  const json by_ref = RunClient(c, "r2", inputs);
  ASSERT_FALSE(by_ref.contains("error")) << by_ref.dump();
  EXPECT_EQ(Texts(by_ref), Texts(cold));
  EXPECT_EQ(c.Metric("r2", "swaserve_router_media_by_reference_total"), 7);  // every item

  // An encoder killed: its items go to the other encoder on the ring (cache
  // misses there), every request still answers, the output is the same.
  auto e2 = c.StartEncoder("e2");
  ASSERT_TRUE(e2.ok()) << e2.status();
  absl::SleepFor(absl::Seconds(1));  // the routers' registry refresh
  ASSERT_TRUE(c.Kill("e1").ok());
  const json after_kill = RunClient(c, "r1", inputs);
  ASSERT_FALSE(after_kill.contains("error")) << after_kill.dump();
  EXPECT_EQ(Texts(after_kill), Texts(cold));
  EXPECT_GT(c.Metric("e2", "swaserve_encoder_cache_lookups_total{result=\"miss\"}"), 0);
  EXPECT_GT(c.Metric("r1", "swaserve_router_media_failovers_total"), 0);  // e1 owned some

  // Monolithic: one worker does both legs; the same greedy output.
  ASSERT_TRUE(c.Terminate("p1", absl::Seconds(20)).ok());
  ASSERT_TRUE(c.Terminate("d1", absl::Seconds(20)).ok());
  auto m1 = c.StartWorker("both", "m1");
  ASSERT_TRUE(m1.ok()) << m1.status();
  absl::SleepFor(absl::Seconds(1));  // the router's registry refresh
  const json mono = RunClient(c, "r1", inputs);
  ASSERT_FALSE(mono.contains("error")) << mono.dump();
  EXPECT_EQ(Texts(mono), Texts(cold));
  EXPECT_LT(cached(mono["image_b"]), text_only) << mono["image_b"].dump();

  media_server.stop();
  serve.join();
}

}  // namespace
}  // namespace swaserve
