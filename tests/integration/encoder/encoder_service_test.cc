// swaserve-encoder as a process: registers in Redis as ROLE_ENCODER, encodes
// real PNG and WAV bytes over gRPC (embeddings shaped [tokens, hidden], the
// second call served from its cache), names bad input with INVALID_ARGUMENT,
// exports swaserve_encoder_* metrics, and leaves the registry on SIGTERM.
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <httplib.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "lib/base/port_file.h"
#include "lib/base/subprocess.h"
#include "lib/cluster/cluster_view.h"
#include "lib/cluster/redis_client.h"
#include "lib/model/audio.h"
#include "lib/model/vision.h"
#include "lib/rpc/channel.h"
#include "swaserve/v1/encoder.grpc.pb.h"
#include "tests/integration/cluster/redis_server.h"
#include "tests/unit/media/media_test_util.h"

namespace swaserve {
namespace {

std::string Str(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }

class EncoderServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto dir = base::MakeTempDir("encoder-service-test");
    ASSERT_TRUE(dir.ok());
    dir_ = *dir;
    std::ofstream(dir_ + "/config.json") << "{}\n";
    ASSERT_TRUE(model::WriteRandomVisionTower(model::TinyVisionConfig(64), 1, dir_).ok());
    ASSERT_TRUE(model::WriteRandomAudioTower(model::TinyAudioConfig(64), 1, dir_).ok());
    auto redis = cluster::testing::RedisServer::Start();
    ASSERT_TRUE(redis.ok()) << redis.status();
    redis_ = *std::move(redis);
    const cluster::RedisOptions ro = redis_->ClientOptions();
    base::SubprocessOptions so;
    so.argv = {SWASERVE_ENCODER_BIN,
               "--model=" + dir_,
               "--model_name=tiny-mm",
               "--encoder_id=enc-1",
               "--redis=" + absl::StrCat(ro.host, ":", ro.port),
               "--port_file=" + dir_ + "/ports.json",
               "--image.max_pixels=12544",
               "--batch.window=20ms",
               "--fetch_chunk_bytes=1000",
               "--drain=2s"};
    so.log_path = dir_ + "/encoder.log";
    auto p = base::Subprocess::Start(so);
    ASSERT_TRUE(p.ok()) << p.status();
    proc_ = *std::move(p);
    for (int i = 0; i < 200 && port_ == 0; ++i) {
      absl::StatusOr<int> port = base::ReadPort(dir_ + "/ports.json", "grpc_port");
      if (port.ok()) {
        port_ = *port;
        metrics_port_ = *base::ReadPort(dir_ + "/ports.json", "metrics_port");
      } else {
        absl::SleepFor(absl::Milliseconds(50));
      }
    }
    ASSERT_GT(port_, 0) << proc_->ReadLog();
    auto ch = rpc::CreateChannel(absl::StrCat("127.0.0.1:", port_));
    ASSERT_TRUE(ch.ok());
    stub_ = v1::Encoder::NewStub(*ch);
  }
  void TearDown() override {
    proc_.reset();
    std::filesystem::remove_all(dir_);
  }

  grpc::Status Encode(const std::vector<v1::MultimodalItem>& items, v1::EncodeResponse* out) {
    v1::EncodeRequest req;
    for (const auto& it : items) *req.add_items() = it;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    return stub_->Encode(&ctx, req, out);
  }
  std::vector<cluster::WorkerInfo> Workers() {
    auto client = cluster::RedisClient::Create(redis_->ClientOptions());
    auto view = cluster::ClusterView::Create({.redis = client->get()});
    auto w = (*view)->ListWorkers();
    return w.ok() ? *w : std::vector<cluster::WorkerInfo>{};
  }

  std::string dir_;
  std::unique_ptr<cluster::testing::RedisServer> redis_;
  std::unique_ptr<base::Subprocess> proc_;
  int port_ = 0, metrics_port_ = 0;
  std::unique_ptr<v1::Encoder::Stub> stub_;
};

TEST_F(EncoderServiceTest, EncodesImagesAndAudioRegistersAndDrains) {
  // Registered as an encoder.
  std::vector<cluster::WorkerInfo> workers;
  for (int i = 0; i < 100 && workers.empty(); ++i) {
    workers = Workers();
    if (workers.empty()) absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_EQ(workers.size(), 1u);
  EXPECT_EQ(workers[0].id, "enc-1");
  EXPECT_EQ(workers[0].role, v1::ROLE_ENCODER);
  EXPECT_EQ(workers[0].model, "tiny-mm");
  EXPECT_EQ(workers[0].grpc_address, absl::StrCat("127.0.0.1:", port_));

  v1::MultimodalItem image, audio;
  image.set_modality(v1::MODALITY_IMAGE);
  image.set_data(Str(media::testing::EncodePng(media::testing::MakePattern(80, 56, 3))));
  audio.set_mime_type("audio/wav");  // modality from the MIME type
  audio.set_data(Str(media::testing::WriteWav(media::testing::Sine(300, 1.0, 22050), 1, 22050, 16)));
  v1::EncodeResponse first;
  grpc::Status s = Encode({image, audio}, &first);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(first.embeddings_size(), 2);
  for (const v1::Embedding& e : first.embeddings()) {
    EXPECT_EQ(e.content_hash().size(), 16u);
    EXPECT_FALSE(e.cache_hit());
    ASSERT_EQ(e.embeddings().shape_size(), 2);
    EXPECT_EQ(e.embeddings().shape(1), 64);
    EXPECT_EQ(e.embeddings().dtype(), v1::DTYPE_F32);
    EXPECT_EQ(e.embeddings().data().size(),
              static_cast<size_t>(e.embeddings().shape(0) * 64 * sizeof(float)));
  }
  // 80 x 56 within 112 x 112 pixels at patch 14, merge 2: 84 x 56 -> 6 x 4 patches -> 6 tokens.
  EXPECT_EQ(first.embeddings(0).embeddings().shape(0), 6);
  // 1 s: 100 mel frames -> 50 after conv2 -> 25 tokens (merge 2).
  EXPECT_EQ(first.embeddings(1).embeddings().shape(0), 25);
  // Again, with the content hashes the encoder returned: from the cache.
  image.set_content_hash(first.embeddings(0).content_hash());
  v1::EncodeResponse again;
  ASSERT_TRUE(Encode({image, audio}, &again).ok());
  EXPECT_TRUE(again.embeddings(0).cache_hit());
  EXPECT_TRUE(again.embeddings(1).cache_hit());
  EXPECT_EQ(again.embeddings(0).embeddings().data(), first.embeddings(0).embeddings().data());

  // Bad input: named, INVALID_ARGUMENT, the service keeps serving.
  v1::MultimodalItem broken = image;
  broken.clear_content_hash();
  broken.set_data(image.data().substr(0, 40));
  v1::EncodeResponse bad;
  s = Encode({image, broken}, &bad);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(s.error_message(), "item 1 (image)")) << s.error_message();
  v1::MultimodalItem wrong_hash = image;
  wrong_hash.set_content_hash(std::string(16, 'x'));
  s = Encode({wrong_hash}, &bad);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(s.error_message(), "content_hash")) << s.error_message();
  v1::MultimodalItem url_only;
  url_only.set_modality(v1::MODALITY_IMAGE);
  url_only.set_url("https://example.com/cat.png");
  s = Encode({url_only}, &bad);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(s.error_message(), "fetched by the router")) << s.error_message();
  ASSERT_TRUE(Encode({image}, &again).ok());

  // Metrics an operator watches.
  httplib::Client http("127.0.0.1", metrics_port_);
  auto m = http.Get("/metrics");
  ASSERT_TRUE(m);
  for (const char* name : {"swaserve_encoder_batches_total{modality=\"image\",result=\"ok\"} 1",
                           "swaserve_encoder_cache_lookups_total{result=\"hit\"} 4",
                           "swaserve_encoder_cache_lookups_total{result=\"miss\"} 3",
                           "swaserve_encoder_preprocess_seconds_count{modality=\"audio\"} 1",
                           "swaserve_encoder_batch_items_count{modality=\"audio\"} 1"}) {
    EXPECT_TRUE(absl::StrContains(m->body, name)) << name << "\n" << m->body;
  }

  // SIGTERM: leaves the registry, exits 0.
  ASSERT_TRUE(proc_->Signal(SIGTERM).ok());
  absl::StatusOr<int> code = proc_->Wait(absl::Seconds(10));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0) << proc_->ReadLog();
  EXPECT_TRUE(Workers().empty());
}

}  // namespace
}  // namespace swaserve

namespace swaserve {
namespace {

// By reference: above inline_max_bytes the answer has the
// shape but no values; Fetch streams them in whole-row chunks (1000 bytes
// here: 3 rows of 64 floats) equal to the inline answer; an unknown hash is
// NOT_FOUND, a malformed one INVALID_ARGUMENT.
TEST_F(EncoderServiceTest, LargeEmbeddingsAreAnsweredByReferenceAndFetched) {
  v1::MultimodalItem image;
  image.set_modality(v1::MODALITY_IMAGE);
  image.set_data(Str(media::testing::EncodePng(media::testing::MakePattern(80, 56, 9))));
  v1::EncodeResponse inline_answer;
  ASSERT_TRUE(Encode({image}, &inline_answer).ok());
  const v1::Embedding& want = inline_answer.embeddings(0);
  ASSERT_EQ(want.embeddings().shape(0), 6);
  EXPECT_FALSE(want.by_reference());

  v1::EncodeRequest req;
  *req.add_items() = image;
  req.set_inline_max_bytes(100);
  v1::EncodeResponse ref;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->Encode(&ctx, req, &ref).ok());
  }
  ASSERT_EQ(ref.embeddings_size(), 1);
  EXPECT_TRUE(ref.embeddings(0).by_reference());
  EXPECT_TRUE(ref.embeddings(0).embeddings().data().empty());
  EXPECT_EQ(ref.embeddings(0).embeddings().shape(0), 6);
  EXPECT_EQ(ref.embeddings(0).embeddings().shape(1), 64);

  v1::FetchRequest fr;
  fr.set_content_hash(ref.embeddings(0).content_hash());
  grpc::ClientContext ctx;
  auto reader = stub_->Fetch(&ctx, fr);
  v1::FetchChunk chunk;
  std::string data;
  std::vector<uint32_t> first_rows;
  while (reader->Read(&chunk)) {
    first_rows.push_back(chunk.first_row());
    EXPECT_EQ(chunk.rows().shape(1), 64);
    data += chunk.rows().data();
  }
  ASSERT_TRUE(reader->Finish().ok());
  EXPECT_EQ(first_rows, std::vector<uint32_t>({0, 3}));
  EXPECT_EQ(data, want.embeddings().data());

  fr.set_content_hash(std::string(16, 'x'));
  grpc::ClientContext ctx2;
  auto missing = stub_->Fetch(&ctx2, fr);
  while (missing->Read(&chunk)) {
  }
  EXPECT_EQ(missing->Finish().error_code(), grpc::StatusCode::NOT_FOUND);
  fr.set_content_hash("short");
  grpc::ClientContext ctx3;
  auto bad = stub_->Fetch(&ctx3, fr);
  while (bad->Read(&chunk)) {
  }
  EXPECT_EQ(bad->Finish().error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

}  // namespace
}  // namespace swaserve
