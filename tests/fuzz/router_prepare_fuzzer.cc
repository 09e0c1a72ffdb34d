// libFuzzer target: router::Router's preparation of a request (Prepare:
// the checks, the prompt's tokenization or the chat's rendering with the
// demo model's own template, the structured-output constraint, the length
// bucket) on arbitrary GenerateRequest protobufs, as a gRPC client can send
// them. Route() runs Prepare and the decision; with no worker registered the
// decision ends Unavailable, so every input exercises the whole of Prepare.
// Oracles: never a crash, and only the documented error codes.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "lib/metrics/registry.h"
#include "lib/model/chat_template.h"
#include "lib/model/tokenizer.h"
#include "lib/router/router.h"
#include "tests/unit/router/router_fakes.h"

namespace {

using namespace swaserve;

struct Setup {
  std::unique_ptr<model::Tokenizer> tokenizer;
  std::unique_ptr<model::ChatTemplate> chat_template;
  base::FakeClock clock;
  router::testing::FakeRoutingState state;
  std::unique_ptr<router::testing::FakeWorkerSource> source;
  metrics::Registry registry;
  std::unique_ptr<router::Router> router;
};

Setup* Get() {
  static Setup* s = [] {
    auto* s = new Setup;
    const std::string dir = std::string(SWASERVE_SOURCE_DIR) + "/models/demo";
    auto tok = model::Tokenizer::Load(dir + "/tokenizer.json");
    auto tmpl = model::ChatTemplate::FromCheckpointDir(dir);
    if (!tok.ok() || !tmpl.ok()) std::abort();
    s->tokenizer = *std::move(tok);
    s->chat_template = *std::move(tmpl);
    s->source = std::make_unique<router::testing::FakeWorkerSource>(
        router::CircuitBreakerOptions{}, &s->clock);
    router::RouterOptions o;
    o.state = &s->state;
    o.directory = s->source.get();
    o.tokenizer = s->tokenizer.get();
    o.chat_template = s->chat_template.get();
    o.model_name = "demo";
    o.policy.bucket_bounds = {4096, 65536};
    o.registry = &s->registry;
    o.worker_wait = absl::ZeroDuration();
    auto r = router::Router::Create(o);
    if (!r.ok()) std::abort();
    s->router = *std::move(r);
    return s;
  }();
  return s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  v1::GenerateRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  absl::StatusOr<router::Router::RouteResult> r = Get()->router->Route(request);
  switch (r.status().code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kResourceExhausted:
      break;
    default:
      std::abort();  // OK (no worker exists) or an undocumented code
  }
  return 0;
}
