// swaserve generate / swaserve chat: clients of the router's gRPC
// swaserve.v1.Router/Generate, printing the streamed text as it arrives and
// the usage (prompt / cached / completion tokens) on stderr.
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "lib/api/openai_response.h"
#include "lib/base/request_defaults.h"
#include "lib/base/config.h"
#include "lib/rpc/channel.h"
#include "lib/rpc/status_conversion.h"
#include "swaserve/v1/router.grpc.pb.h"
#include "tools/swaserve/commands.h"

namespace swaserve::cli {
namespace {

struct ClientOptions {
  std::string router;
  std::string model;
  int64_t max_tokens = 0;
  double temperature = 0;
  double top_p = 0;
  int64_t top_k = 0;
  int64_t seed = -1;
  bool ignore_eos = false;
  absl::Duration deadline = absl::Minutes(10);
  absl::Duration connect_timeout = absl::Seconds(10);
  // While the first token is awaited, the router's progress messages this
  // often (GenerateRequest.progress_interval_ms), printed on stderr; 0: off.
  absl::Duration progress_interval = absl::Seconds(5);
  bool quiet = false;  // no usage or progress lines
};

void AddClientFlags(base::Config& config, ClientOptions& o) {
  config.Add("router", &o.router, "router gRPC address host:port (required)")
      .Add("model", &o.model, "model id (empty: the router's default)")
      .Add("max_tokens", &o.max_tokens,
           "most tokens to generate (0: the router's default)")
      .Add("temperature", &o.temperature, "sampling temperature (0: greedy)")
      .Add("top_p", &o.top_p, "nucleus sampling (0 or 1: off)")
      .Add("top_k", &o.top_k, "top-k sampling (0: off)")
      .Add("seed", &o.seed, "sampling seed (-1: the server picks one)")
      .Add("ignore_eos", &o.ignore_eos, "keep generating after end-of-sequence")
      .Add("deadline", &o.deadline, "deadline of each request")
      .Add("connect_timeout", &o.connect_timeout,
           "how long to wait for the router")
      .Add("progress_interval", &o.progress_interval,
           "while waiting for the first token, print where the prompt's prefill "
           "stands (queued, tokens done, tokens/s) on stderr this often (0: off; "
           "else at least 10ms)")
      .Add("quiet", &o.quiet, "do not print usage or progress lines on stderr");
}

absl::Status CheckClientOptions(const ClientOptions& o) {
  if (o.router.empty())
    return absl::InvalidArgumentError("--router=HOST:PORT is required");
  if (o.max_tokens < 0 || o.max_tokens > 0xFFFFFFFFll) {
    return absl::InvalidArgumentError("key 'max_tokens': out of range");
  }
  if (o.temperature < 0)
    return absl::InvalidArgumentError("key 'temperature': must be >= 0");
  if (o.top_k < 0 || o.top_k > 0xFFFFFFFFll) {
    return absl::InvalidArgumentError("key 'top_k': out of range");
  }
  if (o.deadline <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("key 'deadline': must be > 0");
  }
  if (o.progress_interval != absl::ZeroDuration() &&
      (o.progress_interval < absl::Milliseconds(10) ||
       o.progress_interval > absl::Milliseconds(0xFFFFFFFFll))) {
    return absl::InvalidArgumentError(
        "key 'progress_interval': must be 0 (off) or between 10ms and 49d");
  }
  return absl::OkStatus();
}

void FillSampling(const ClientOptions& o, v1::GenerateRequest& req) {
  req.set_model(o.model);
  req.set_progress_interval_ms(
      static_cast<uint32_t>(absl::ToInt64Milliseconds(o.progress_interval)));
  v1::SamplingParams* s = req.mutable_sampling();
  s->set_max_tokens(static_cast<uint32_t>(o.max_tokens));
  s->set_temperature(static_cast<float>(o.temperature));
  s->set_top_p(static_cast<float>(o.top_p));
  s->set_top_k(static_cast<uint32_t>(o.top_k));
  if (o.seed >= 0) s->set_seed(static_cast<uint64_t>(o.seed));
  s->set_ignore_eos(o.ignore_eos);
}

std::string GrpcCodeName(grpc::StatusCode code) {
  return absl::StatusCodeToString(rpc::FromGrpcCode(code));
}

// "router error UNAVAILABLE: message [WORKER_UNAVAILABLE, worker w, retryable]"
std::string DescribeError(const grpc::Status& status) {
  std::string out =
      absl::StrCat("router error ", GrpcCodeName(status.error_code()), ": ",
                   status.error_message());
  if (std::optional<v1::ErrorDetail> d = rpc::GetErrorDetail(status);
      d.has_value()) {
    std::string extra = v1::ErrorCode_Name(d->code());
    if (!d->message().empty() && d->message() != status.error_message()) {
      absl::StrAppend(&extra, ": ", d->message());
    }
    if (!d->worker_id().empty())
      absl::StrAppend(&extra, ", worker ", d->worker_id());
    if (d->retryable()) absl::StrAppend(&extra, ", retryable");
    absl::StrAppend(&out, " [", extra, "]");
  }
  return out;
}

std::string FinishName(v1::FinishReason r) {
  std::string n = v1::FinishReason_Name(r);
  absl::string_view v = n;
  absl::ConsumePrefix(&v, "FINISH_REASON_");
  return absl::AsciiStrToLower(v);
}

class RouterClient {
 public:
  static absl::StatusOr<RouterClient> Connect(const ClientOptions& o) {
    absl::StatusOr<std::shared_ptr<grpc::Channel>> ch =
        rpc::CreateChannel(o.router);
    if (!ch.ok()) return ch.status();
    if (absl::Status s = rpc::WaitForConnected(**ch, o.connect_timeout);
        !s.ok()) {
      return absl::UnavailableError(absl::StrCat("cannot reach the router at ",
                                                 o.router, ": ", s.message()));
    }
    return RouterClient(o, *ch);
  }

  struct Result {
    std::string text;
    v1::Usage usage;
    v1::FinishReason finish = v1::FINISH_REASON_UNSPECIFIED;
  };

  // Streams `req`, writing text to stdout as it arrives (and progress
  // messages, until the first token, to stderr).
  absl::StatusOr<Result> Generate(const v1::GenerateRequest& req) {
    grpc::ClientContext ctx;
    const absl::Time start = absl::Now();
    ctx.set_deadline(absl::ToChronoTime(start + o_.deadline));
    std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader =
        stub_->Generate(&ctx, req);
    Result r;
    v1::GenerateResponse resp;
    while (reader->Read(&resp)) {
      if (resp.has_progress()) {
        if (!o_.quiet) PrintProgress(absl::Now() - start, resp.progress());
        continue;  // carries nothing else
      }
      if (!resp.text().empty()) {
        std::fwrite(resp.text().data(), 1, resp.text().size(), stdout);
        std::fflush(stdout);
        r.text += resp.text();
      }
      if (resp.has_usage()) r.usage = resp.usage();
      if (resp.finish_reason() != v1::FINISH_REASON_UNSPECIFIED)
        r.finish = resp.finish_reason();
    }
    grpc::Status st = reader->Finish();
    if (!st.ok()) {
      if (!r.text.empty()) std::fputc('\n', stdout);
      std::fflush(stdout);
      return absl::Status(rpc::FromGrpcCode(st.error_code()),
                          DescribeError(st));
    }
    return r;
  }

  // "[waiting for the first token, 45.0s: prefill 61,440 of 304,044 prompt
  // tokens (20%), 1,234 tokens/s]"
  static void PrintProgress(absl::Duration waited, const v1::PrefillProgress& p) {
    const std::string where = api::DescribePrefillProgress(p);
    std::fprintf(stderr, "[waiting for the first token, %.1fs%s%s]\n",
                 absl::ToDoubleSeconds(waited), where.empty() ? "" : ": ", where.c_str());
    std::fflush(stderr);
  }

  void PrintUsage(const Result& r) const {
    if (o_.quiet) return;
    // The MTP drafts only where the decode workers drafted.
    const std::string drafts =
        r.usage.draft_tokens() == 0
            ? std::string()
            : absl::StrCat(" accepted_draft_tokens=", r.usage.accepted_draft_tokens(), "/",
                           r.usage.draft_tokens());
    std::fprintf(stderr,
                 "[usage: prompt_tokens=%u cached_tokens=%u "
                 "completion_tokens=%u%s finish=%s]\n",
                 r.usage.prompt_tokens(), r.usage.cached_tokens(),
                 r.usage.completion_tokens(), drafts.c_str(), FinishName(r.finish).c_str());
    std::fflush(stderr);
  }

 private:
  RouterClient(const ClientOptions& o, std::shared_ptr<grpc::Channel> ch)
      : o_(o), stub_(v1::Router::NewStub(ch)) {}
  ClientOptions o_;
  std::unique_ptr<v1::Router::Stub> stub_;
};

}  // namespace

int Generate(int argc, const char* const* argv) {
  ClientOptions o;
  std::string prompt;
  bool chat = false;
  base::Config config(
      "swaserve generate",
      "Usage: swaserve generate --router=HOST:PORT (--prompt TEXT | --prompt_file PATH) [options]\n"
      "Sends one swaserve.v1.Router/Generate request and prints the generated "
      "text as it "
      "streams in (stdout), then the usage on stderr. The prompt is raw text, "
      "or with --chat "
      "one user message rendered with the model's chat template. Exit 0 on "
      "success, 1 when "
      "the router is unreachable or answers with an error, 2 for bad flags.");
  AddClientFlags(config, o);
  std::string prompt_file;
  config.Add("prompt", &prompt, "the prompt text (this or --prompt_file)")
      .Add("prompt_file", &prompt_file,
           "read the prompt from this file ('-': stdin), for prompts longer than a "
           "command line takes (128 KiB per argument on Linux)")
      .Add("chat", &chat,
           "send the prompt as a user chat message (chat template)");
  base::ParseConfigOrExit(config, argc, argv);
  auto fail = [](int code, absl::string_view msg) {
    std::fprintf(stderr, "swaserve generate: %s\n", std::string(msg).c_str());
    return code;
  };
  if (absl::Status s = CheckClientOptions(o); !s.ok())
    return fail(2, s.message());
  if (!prompt.empty() && !prompt_file.empty()) {
    return fail(2, "--prompt and --prompt_file exclude each other");
  }
  if (!prompt_file.empty()) {
    std::ifstream file;
    std::istream* in = &std::cin;
    if (prompt_file != "-") {
      file.open(prompt_file, std::ios::binary);
      if (!file) return fail(2, absl::StrCat("--prompt_file: cannot read ", prompt_file));
      in = &file;
    }
    prompt.assign(std::istreambuf_iterator<char>(*in), std::istreambuf_iterator<char>());
    if (in->bad()) return fail(2, absl::StrCat("--prompt_file: error reading ", prompt_file));
  }
  if (prompt.empty()) return fail(2, "--prompt TEXT or --prompt_file PATH is required");
  absl::StatusOr<RouterClient> client = RouterClient::Connect(o);
  if (!client.ok()) return fail(1, client.status().message());
  v1::GenerateRequest req;
  FillSampling(o, req);
  if (chat) {
    v1::ChatMessages* m = req.mutable_chat();
    v1::ChatMessage* u = m->add_messages();
    u->set_role("user");
    u->set_content(prompt);
    m->set_add_generation_prompt(true);
  } else {
    req.set_text(prompt);
  }
  absl::StatusOr<RouterClient::Result> r = client->Generate(req);
  if (!r.ok()) return fail(1, r.status().message());
  std::fputc('\n', stdout);
  std::fflush(stdout);
  client->PrintUsage(*r);
  return 0;
}

int Chat(int argc, const char* const* argv) {
  ClientOptions o;
  o.temperature = 0.7;
  o.max_tokens = base::kDefaultMaxTokens;
  std::string system;
  base::Config config(
      "swaserve chat",
      "Usage: swaserve chat --router=HOST:PORT [--system TEXT] [options]\n"
      "A chat over swaserve.v1.Router/Generate: reads one user message per "
      "line from stdin, "
      "sends the whole conversation (rendered with the model's chat template; "
      "earlier turns "
      "hit the prefix cache) and prints the assistant's answer as it streams "
      "in, and the "
      "usage on stderr. '/exit' or end of input ends the chat; '/reset' "
      "forgets the "
      "conversation. Exit 0 when every turn succeeded, 1 otherwise, 2 for bad "
      "flags.");
  AddClientFlags(config, o);
  config.Add("system", &system,
             "system message at the start of the conversation");
  base::ParseConfigOrExit(config, argc, argv);
  auto fail = [](int code, absl::string_view msg) {
    std::fprintf(stderr, "swaserve chat: %s\n", std::string(msg).c_str());
    return code;
  };
  if (absl::Status s = CheckClientOptions(o); !s.ok())
    return fail(2, s.message());
  absl::StatusOr<RouterClient> client = RouterClient::Connect(o);
  if (!client.ok()) return fail(1, client.status().message());
  const bool tty = ::isatty(STDIN_FILENO) != 0;
  if (tty) {
    std::fprintf(
        stderr,
        "connected to %s; type a message, /exit to quit, /reset to forget\n",
        o.router.c_str());
  }
  std::vector<v1::ChatMessage> history;
  if (!system.empty()) {
    v1::ChatMessage m;
    m.set_role("system");
    m.set_content(system);
    history.push_back(m);
  }
  const size_t base_len = history.size();
  bool failed = false;
  std::string line;
  while (true) {
    if (tty) {
      std::fputs("> ", stdout);
      std::fflush(stdout);
    }
    if (!std::getline(std::cin, line)) break;
    const std::string text(absl::StripAsciiWhitespace(line));
    if (text.empty()) continue;
    if (text == "/exit" || text == "/quit") break;
    if (text == "/reset") {
      history.resize(base_len);
      std::fprintf(stderr, "[conversation reset]\n");
      continue;
    }
    v1::ChatMessage user;
    user.set_role("user");
    user.set_content(text);
    history.push_back(user);
    v1::GenerateRequest req;
    FillSampling(o, req);
    v1::ChatMessages* m = req.mutable_chat();
    for (const v1::ChatMessage& h : history) *m->add_messages() = h;
    m->set_add_generation_prompt(true);
    absl::StatusOr<RouterClient::Result> r = client->Generate(req);
    if (!r.ok()) {
      history.pop_back();  // the turn did not happen
      failed = true;
      std::fprintf(stderr, "swaserve chat: %s\n",
                   std::string(r.status().message()).c_str());
      std::fflush(stderr);
      continue;
    }
    std::fputc('\n', stdout);
    std::fflush(stdout);
    client->PrintUsage(*r);
    v1::ChatMessage answer;
    answer.set_role("assistant");
    answer.set_content(r->text);
    history.push_back(answer);
  }
  return failed ? 1 : 0;
}

}  // namespace swaserve::cli
