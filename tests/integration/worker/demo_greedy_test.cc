// The trained demo model (models/demo) through real swaserve-worker
// processes: a prefill worker and a decode worker (KV over real UCX) and a
// monolithic --role=both worker. A test client plays the router (Decode()
// first, then Prefill() with its destination, then the token stream), as
// tests/integration/worker/disaggregated_test.cc does for the tiny random
// model.
//
// Check: greedy outputs are identical monolithic vs disaggregated and equal
// a straight-line in-process greedy run of lib/model's engine, for held-out
// prompts of mixed lengths (some past the 128-token window) sent
// concurrently, then a second wave that extends earlier prompts (prefix-cache
// hits); and the model stops at <|im_end|> on a chat prompt.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "gtest/gtest.h"
#include "lib/base/subprocess.h"
#include "lib/launch/service_process.h"
#include "lib/kv/sequence.h"
#include "lib/model/chat_template.h"
#include "lib/model/checkpoint.h"
#include "lib/model/forward.h"
#include "lib/model/sampling.h"
#include "lib/model/tokenizer.h"
#include "lib/rpc/channel.h"
#include "swaserve/v1/worker.grpc.pb.h"

namespace swaserve {
namespace {

constexpr char kModelDir[] = SWASERVE_SOURCE_DIR "/models/demo";
constexpr char kGolden[] =
    SWASERVE_SOURCE_DIR "/tests/fixtures/model/demo_golden.json";

struct Worker {
  std::unique_ptr<base::Subprocess> process;
  std::string address;
  std::string id;
  std::unique_ptr<v1::Decode::Stub> decode;
  std::unique_ptr<v1::Prefill::Stub> prefill;
};

struct Result {
  grpc::Status decode_status;
  grpc::Status prefill_status;
  std::vector<uint32_t> tokens;
  v1::Usage usage;
  v1::FinishReason finish = v1::FINISH_REASON_UNSPECIFIED;
};

class DemoGreedyTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(*base::MakeTempDir("demo-greedy-it"));
    auto engine = model::Engine::Create({kModelDir, 1});
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = engine->release();
  }
  static void TearDownTestSuite() {
    delete engine_;
    std::filesystem::remove_all(*dir_);
    delete dir_;
  }

  static std::unique_ptr<Worker> StartWorker(const std::string& role,
                                             const std::string& id) {
    auto w = std::make_unique<Worker>();
    w->id = id;
    // Spawned and awaited like every service (lib/launch/service_process.h).
    std::vector<std::string> argv = {SWASERVE_WORKER_BIN,
              std::string("--model=") + kModelDir,
              "--role=" + role,
              "--worker_id=" + id,
              
              "--threads=1",
              "--kv.page_size=16",
              "--prefill.chunk_tokens=64",
              "--kv.prefill_mib=32",
              "--kv.decode_mib=32",
              "--drain=2s",
              "--transfer.timeout=10s",
              "--decode.commit_timeout=30s"};
    absl::StatusOr<launch::ServiceProcess> svc =
        launch::SpawnService({.name = id, .argv = std::move(argv), .dir = *dir_});
    EXPECT_TRUE(svc.ok()) << svc.status();
    if (!svc.ok()) return w;
    absl::Status serving =
        launch::WaitServing(*svc, absl::Now() + absl::Seconds(60), absl::Seconds(60));
    w->process = std::move(svc->process);
    if (!serving.ok()) {
      ADD_FAILURE() << serving;
      return w;
    }
    w->address = absl::StrCat("127.0.0.1:", svc->grpc_port);
    auto channel = rpc::CreateChannel(w->address);
    EXPECT_TRUE(channel.ok());
    w->decode = v1::Decode::NewStub(*channel);
    w->prefill = v1::Prefill::NewStub(*channel);
    return w;
  }

  // Greedy, straight-line, in this process (stops at an EOS id like the
  // workers unless ignore_eos).
  static std::vector<uint32_t> Reference(const std::vector<uint32_t>& prompt,
                                         int n, bool ignore_eos) {
    const auto& eos = engine_->config().eos_token_ids;
    auto pools =
        *kv::KvPools::Create({engine_->config().KvShape(16), 256, 256, true});
    kv::Sequence seq(kv::SequenceOptions{pools.get(), nullptr, 0, false});
    model::ForwardOutput out;
    EXPECT_TRUE(seq.Append(static_cast<int>(prompt.size())).ok());
    model::ForwardItem item{&seq, prompt, 0, false};
    EXPECT_TRUE(engine_->Forward({&item, 1}, &out).ok());
    std::vector<uint32_t> gen{model::Argmax(out.logits)};
    auto stop = [&] {
      return !ignore_eos &&
             std::find(eos.begin(), eos.end(), static_cast<int>(gen.back())) !=
                 eos.end();
    };
    while (static_cast<int>(gen.size()) < n && !stop()) {
      EXPECT_TRUE(seq.Append(1).ok());
      model::ForwardItem step{&seq, absl::MakeConstSpan(&gen.back(), 1),
                              seq.length() - 1, false};
      EXPECT_TRUE(engine_->Forward({&step, 1}, &out).ok());
      gen.push_back(model::Argmax(out.logits));
    }
    return gen;
  }

  static Result Generate(Worker& p, Worker& d, const std::string& id,
                         const std::vector<uint32_t>& prompt, int max_tokens,
                         bool ignore_eos) {
    Result r;
    grpc::ClientContext dctx;
    dctx.set_deadline(std::chrono::system_clock::now() +
                      std::chrono::seconds(300));
    v1::DecodeRequest dreq;
    dreq.set_request_id("t-" + id);
    for (uint32_t t : prompt) dreq.add_prompt_token_ids(t);
    dreq.mutable_sampling()->set_max_tokens(max_tokens);
    dreq.mutable_sampling()->set_ignore_eos(ignore_eos);
    auto stream = d.decode->Decode(&dctx, dreq);
    // The first message announces the request: `accepted` (the decode worker
    // allocates staging later, when the prefill worker asks for it).
    v1::DecodeResponse first;
    if (!stream->Read(&first) || !first.has_accepted()) {
      r.decode_status = stream->Finish();
      return r;
    }
    std::thread prefill([&] {
      grpc::ClientContext pctx;
      pctx.set_deadline(std::chrono::system_clock::now() +
                        std::chrono::seconds(300));
      v1::PrefillRequest preq;
      preq.set_request_id(id);
      for (uint32_t t : prompt) preq.add_token_ids(t);
      preq.mutable_sampling()->set_max_tokens(max_tokens);
      preq.mutable_sampling()->set_ignore_eos(ignore_eos);
      v1::DecodeTarget* target = preq.mutable_decode();
      target->set_worker_id(d.id);
      target->set_grpc_address(d.address);
      target->set_transfer_id("t-" + id);
      v1::PrefillResponse presp;
      r.prefill_status = p.prefill->Prefill(&pctx, preq, &presp);
    });
    v1::DecodeResponse msg;
    while (stream->Read(&msg)) {
      for (uint32_t t : msg.tokens().token_ids()) r.tokens.push_back(t);
      if (msg.tokens().finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
        r.finish = msg.tokens().finish_reason();
        r.usage = msg.tokens().usage();
      }
    }
    r.decode_status = stream->Finish();
    prefill.join();
    return r;
  }

  static std::string* dir_;
  static model::Engine* engine_;
};

std::string* DemoGreedyTest::dir_ = nullptr;
model::Engine* DemoGreedyTest::engine_ = nullptr;

TEST_F(DemoGreedyTest, GreedyIdenticalMonolithicAndDisaggregated) {
  std::ifstream in(kGolden);
  const nlohmann::json golden = nlohmann::json::parse(in);
  const auto held_out =
      golden["valid_slice"]["tokens"].get<std::vector<uint32_t>>();
  ASSERT_GE(held_out.size(), 2048u);
  auto tok = model::Tokenizer::Load(std::string(kModelDir) + "/tokenizer.json");
  ASSERT_TRUE(tok.ok()) << tok.status();

  // Held-out prompts: lengths 5..400 (past the window) and two chat prompts
  // that stop at <|im_end|>, sent at once; then a second wave that extends
  // every other first-wave prompt by 20 tokens (prefix-cache hits).
  struct Case {
    std::vector<uint32_t> prompt;
    int max_tokens;
    bool ignore_eos;
  };
  std::vector<Case> cases;
  const std::vector<int> lengths = {5, 40, 130, 260, 400, 17, 129, 300};
  size_t off = 0;
  for (int len : lengths) {
    cases.push_back({std::vector<uint32_t>(held_out.begin() + off,
                                           held_out.begin() + off + len),
                     24, true});
    off += len + 20;
  }
  // The chat prompts are rendered by the checkpoint's own template
  // (models/demo/chat_template.jinja, MiMo's), thinking off: the prompt ends
  // in "<think></think>" and the model answers at once.
  auto tmpl = model::ChatTemplate::FromCheckpointDir(kModelDir);
  ASSERT_TRUE(tmpl.ok()) << tmpl.status();
  ASSERT_FALSE((*tmpl)->is_builtin());
  for (const char* q : {"And God said unto Noah", "The LORD is my shepherd"}) {
    auto ids = (*tmpl)->Encode(
        **tok, model::ToChatInput({{"user", q}}, {.enable_thinking = false}));
    ASSERT_TRUE(ids.ok()) << ids.status();
    cases.push_back({*ids, 64, false});
  }
  const size_t first_wave = cases.size();
  off = 0;
  for (size_t i = 0; i < lengths.size(); ++i) {
    if (i % 2 == 1) {
      cases.push_back(
          {std::vector<uint32_t>(held_out.begin() + off,
                                 held_out.begin() + off + lengths[i] + 20),
           16, true});
    }
    off += lengths[i] + 20;
  }

  auto prefill = StartWorker("prefill", "p1");
  auto decode = StartWorker("decode", "d1");
  auto both = StartWorker("both", "m1");
  ASSERT_FALSE(prefill->address.empty());
  ASSERT_FALSE(decode->address.empty());
  ASSERT_FALSE(both->address.empty());
  const size_t n = cases.size();
  std::vector<Result> disagg(n), mono(n);
  for (auto [begin, end] :
       {std::pair<size_t, size_t>{0, first_wave}, {first_wave, n}}) {
    std::vector<std::thread> threads;
    for (size_t i = begin; i < end; ++i) {
      threads.emplace_back([&, i] {
        disagg[i] =
            Generate(*prefill, *decode, absl::StrCat("d", i), cases[i].prompt,
                     cases[i].max_tokens, cases[i].ignore_eos);
      });
      threads.emplace_back([&, i] {
        mono[i] = Generate(*both, *both, absl::StrCat("m", i), cases[i].prompt,
                           cases[i].max_tokens, cases[i].ignore_eos);
      });
    }
    for (auto& t : threads) t.join();
  }
  int hits = 0, stopped = 0;
  for (size_t i = 0; i < n; ++i) {
    SCOPED_TRACE(absl::StrCat("case ", i, " (", cases[i].prompt.size(),
                              " prompt tokens)"));
    ASSERT_TRUE(disagg[i].prefill_status.ok())
        << disagg[i].prefill_status.error_message();
    ASSERT_TRUE(disagg[i].decode_status.ok())
        << disagg[i].decode_status.error_message();
    ASSERT_TRUE(mono[i].decode_status.ok())
        << mono[i].decode_status.error_message();
    const auto ref =
        Reference(cases[i].prompt, cases[i].max_tokens, cases[i].ignore_eos);
    EXPECT_EQ(disagg[i].tokens, mono[i].tokens);
    EXPECT_EQ(disagg[i].tokens, ref);
    hits += disagg[i].usage.cached_tokens() > 0;
    stopped += disagg[i].finish == v1::FINISH_REASON_STOP;
    std::printf("case %zu: %s\n", i, (*tok)->Decode(disagg[i].tokens).c_str());
  }
  EXPECT_GT(hits, 0) << "prefix hits were not exercised";
  EXPECT_GE(stopped, 1) << "no chat answer ended at <|im_end|>";
  for (auto* w : {prefill.get(), decode.get(), both.get()}) {
    auto rc = w->process->Stop();
    ASSERT_TRUE(rc.ok());
    EXPECT_EQ(*rc, 0) << w->id << " did not stop cleanly:\n"
                      << w->process->ReadLog();
  }
}

}  // namespace
}  // namespace swaserve
