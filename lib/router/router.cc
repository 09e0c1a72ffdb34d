#include "lib/router/router.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <random>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lib/base/hash.h"
#include "lib/base/logging.h"
#include "lib/base/status.h"
#include "lib/metrics/buckets.h"
#include "lib/model/chat_template.h"
#include "lib/router/cache_breakpoints.h"
#include "lib/router/chat_input.h"
#include "lib/router/failure.h"
#include "lib/router/media.h"
#include "lib/router/router_metrics.h"
#include "lib/router/router_request.h"
#include "lib/router/text_stream.h"
#include "lib/rpc/status_conversion.h"
#include "swaserve/v1/worker.grpc.pb.h"

namespace swaserve::router {
namespace {

bool CanPrefill(v1::Role r) { return r == v1::ROLE_PREFILL || r == v1::ROLE_BOTH; }
bool CanDecode(v1::Role r) { return r == v1::ROLE_DECODE || r == v1::ROLE_BOTH; }

absl::string_view Label(std::string_view s) { return absl::string_view(s.data(), s.size()); }

using Endpoints = std::vector<std::shared_ptr<const WorkerEndpoint>>;

// Drops candidates whose KV pool cannot hold the prompt (prefill) or the
// prompt plus one generated token (decode); RESOURCE_EXHAUSTED
// (TOO_LARGE_FOR_WORKER, naming the largest pool) when none is left. Records
// without pool sizes (0) fit.
absl::Status KeepThoseThatFit(int64_t n, Endpoints* pre, Endpoints* dec) {
  auto capacity = [](const cluster::WorkerInfo& i) -> int64_t {
    return i.full_pages > 0 && i.page_size > 0 ? i.full_pages * i.page_size : INT64_MAX;
  };
  int64_t largest = 0;
  Endpoints fit;
  for (const auto& w : *pre) {
    largest = std::max(largest, capacity(w->info));
    if (n <= capacity(w->info)) fit.push_back(w);
  }
  if (fit.empty()) {
    return rpc::ErrorWithDetail(
        absl::StatusCode::kResourceExhausted, v1::ERROR_CODE_TOO_LARGE_FOR_WORKER,
        absl::StrCat("prompt of ", n, " tokens is larger than the KV pool of every prefill "
                     "worker for it (the largest holds ", largest, " tokens)"));
  }
  *pre = std::move(fit);
  Endpoints dfit;
  largest = 0;
  for (const auto& w : *dec) {
    largest = std::max(largest, capacity(w->info));
    if (n + 1 <= capacity(w->info)) dfit.push_back(w);
  }
  if (!dec->empty() && dfit.empty()) {
    return rpc::ErrorWithDetail(
        absl::StatusCode::kResourceExhausted, v1::ERROR_CODE_TOO_LARGE_FOR_WORKER,
        absl::StrCat("prompt of ", n, " tokens (plus one generated) is larger than the KV "
                     "pool of every decode worker (the largest holds ", largest, " tokens)"));
  }
  *dec = std::move(dfit);
  return absl::OkStatus();
}

// The decode policy's view of each decode candidate (`loads[i]` is dec[i]'s).
std::vector<DecodeCandidate> DecodeCandidates(
    const Endpoints& dec, absl::Span<const std::optional<v1::WorkerLoad>> loads,
    WorkerSource& directory) {
  std::vector<DecodeCandidate> dc(dec.size());
  for (size_t i = 0; i < dec.size(); ++i) {
    DecodeCandidate& c = dc[i];
    c.id = dec[i]->info.id;
    c.healthy = directory.Healthy(c.id);
    c.max_running_requests = dec[i]->info.max_running_requests;
    c.total_full_pages = dec[i]->info.full_pages;
    c.total_swa_pages = dec[i]->info.swa_pages;
    const std::optional<v1::WorkerLoad>& l = loads[i];
    c.has_load = l.has_value();
    if (l) {
      c.free_full_pages = static_cast<int64_t>(l->free_full_pages());
      c.total_full_pages = static_cast<int64_t>(l->total_full_pages());
      c.free_swa_pages = static_cast<int64_t>(l->free_swa_pages());
      c.total_swa_pages = static_cast<int64_t>(l->total_swa_pages());
      c.running_requests = static_cast<int32_t>(l->running_requests());
      c.staged_requests = static_cast<int32_t>(l->staged_requests());
    }
  }
  return dc;
}

}  // namespace

int64_t NowNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string ExclusionKey(const cluster::WorkerInfo& i) {
  return absl::StrCat(i.id, "#", i.incarnation);
}

absl::Status Overloaded(std::string message, double retry_after_seconds) {
  absl::Status s = rpc::ErrorWithDetail(absl::StatusCode::kResourceExhausted,
                                        v1::ERROR_CODE_OVERLOADED, message, "",
                                        /*retryable=*/true);
  std::optional<v1::ErrorDetail> d = rpc::GetErrorDetail(s);
  if (!d) return s;
  d->set_retry_after_ms(static_cast<uint32_t>(
      std::clamp(std::ceil(retry_after_seconds * 1000.0), 1.0, 3600.0 * 1000.0)));
  return rpc::WithErrorDetail(std::move(s), *d);
}

void CancelFlag::Cancel() {
  cancelled_.store(true, std::memory_order_release);
  absl::MutexLock lock(&mu_);
  if (fn_) fn_();
}

void CancelFlag::OnCancel(std::function<void()> fn) {
  absl::MutexLock lock(&mu_);
  fn_ = std::move(fn);
  if (cancelled_.load(std::memory_order_acquire) && fn_) fn_();
}

void CancelFlag::Clear() {
  absl::MutexLock lock(&mu_);
  fn_ = nullptr;
}


Router::Router(const RouterOptions& options)
    : options_(options), id_salt_(std::random_device{}() ^ static_cast<uint64_t>(NowNanos())) {}

Router::~Router() {
  // Control tasks may set timers; timer callbacks post control tasks (those
  // that fire meanwhile are dropped: the services wait for idle first).
  media_.reset();
  control_.reset();
  timers_.reset();
}

void Router::OnControl(std::function<void()> fn) { control_->Schedule(std::move(fn)); }
void Router::OnMedia(std::function<void()> fn) { media_->Schedule(std::move(fn)); }

absl::StatusOr<std::unique_ptr<Router>> Router::Create(const RouterOptions& options) {
  if ((options.view == nullptr && options.state == nullptr) || options.directory == nullptr ||
      options.tokenizer == nullptr) {
    return absl::InvalidArgumentError("Router needs a view (or state), a directory and a tokenizer");
  }
  if (options.max_prefill_attempts < 1 || options.max_decode_attempts < 1) {
    return absl::InvalidArgumentError("attempts per leg must be >= 1");
  }
  if (options.default_max_tokens == 0 || options.default_max_tokens > options.max_max_tokens) {
    return absl::InvalidArgumentError("default_max_tokens must be in [1, max_max_tokens]");
  }
  RETURN_IF_ERROR(BucketFor(1, options.policy).status());
  if (!(options.shed_backlog_seconds >= 0) || std::isinf(options.shed_backlog_seconds)) {
    return absl::InvalidArgumentError("shed_backlog_seconds must be finite and >= 0");
  }
  nlohmann::ordered_json kwargs = nlohmann::ordered_json::object();
  if (!options.default_template_kwargs.empty()) {
    kwargs = nlohmann::ordered_json::parse(options.default_template_kwargs, nullptr, false);
    if (!kwargs.is_object()) {
      return absl::InvalidArgumentError("default_template_kwargs must be a JSON object");
    }
  }
  std::unique_ptr<Router> r(new Router(options));
  r->default_kwargs_ = std::move(kwargs);
  r->builtin_template_ = model::ChatTemplate::Builtin();
  r->chat_format_ = model::DetectChatFormat(
      options.chat_template != nullptr ? *options.chat_template : *r->builtin_template_);
  if (options.state != nullptr) {
    r->state_ = options.state;
  } else {
    r->own_state_ = std::make_unique<ClusterViewState>(options.view);
    r->state_ = r->own_state_.get();
  }
  metrics::Registry* reg =
      options.registry != nullptr ? options.registry : &metrics::DefaultRegistry();
  ASSIGN_OR_RETURN(r->metrics_, Metrics::Create(reg));
  // Per-bucket series exist from the start (a rate needs a sample from
  // before a bucket's first request).
  for (size_t b = 0; b < std::max<size_t>(1, options.policy.bucket_bounds.size()); ++b) {
    const std::string label = absl::StrCat(b);
    r->metrics_->prompt_tokens->WithLabels({label});
    r->metrics_->cached_tokens->WithLabels({label});
    r->metrics_->ttft->WithLabels({label});
    r->metrics_->tpot->WithLabels({label});
    r->metrics_->e2e->WithLabels({label});
  }
  r->record_pool_ =
      std::make_unique<base::ThreadPool>(std::max(1, options.record_threads), "record");
  r->control_ =
      std::make_unique<base::ThreadPool>(std::max(1, options.control_threads), "control");
  r->media_ = std::make_unique<base::ThreadPool>(std::max(1, options.media_threads), "media");
  r->timers_ = std::make_unique<base::TimerQueue>();
  if (options.stall_report_after > absl::ZeroDuration()) {
    Router* raw = r.get();
    r->timers_->Schedule(absl::Now() + r->StallScanInterval(), [raw] { raw->ScanStalled(); });
  }
  return r;
}

v1::ListModelsResponse Router::ListModels() const {
  v1::ListModelsResponse out;
  v1::ModelInfo* m = out.add_models();
  m->set_id(options_.model_name);
  m->set_created(options_.created_unix_seconds);
  m->set_owned_by("swaserve");
  if (!options_.policy.bucket_bounds.empty()) {
    m->set_max_prompt_tokens(static_cast<uint32_t>(
        std::min<int64_t>(options_.policy.bucket_bounds.back() - 1, UINT32_MAX)));
  }
  if (options_.media != nullptr && options_.media->modalities().has_value()) {
    for (v1::Modality mod : *options_.media->modalities()) m->add_modalities(mod);
  }
  return out;
}

absl::Status Router::Health() {
  ASSIGN_OR_RETURN(auto workers, options_.directory->Workers());
  bool prefill = false, decode = false;
  for (const auto& w : workers) {
    prefill |= CanPrefill(w->info.role);
    decode |= CanDecode(w->info.role);
  }
  if (!prefill || !decode) {
    return absl::UnavailableError(absl::StrCat("no ", !prefill ? "prefill" : "decode",
                                               " worker registered"));
  }
  return absl::OkStatus();
}

namespace {

constexpr size_t kMaxCacheKeyBytes = 1024;
// Tokens at the end of a chat prompt read to see whether it opens a
// reasoning block.
constexpr size_t kReasoningTailTokens = 8;

absl::Status Invalid(absl::string_view msg) {
  return rpc::ErrorWithDetail(absl::StatusCode::kInvalidArgument, v1::ERROR_CODE_INVALID_REQUEST,
                              msg);
}

// The tool fields of `in` against what the template can do with them.
absl::Status CheckTools(const v1::GenerateRequest& in, const model::ChatInput& input,
                        const model::ChatFormat& format, absl::string_view origin) {
  const bool tools = input.tools.is_array() && !input.tools.empty();
  const v1::ToolChoice& choice = in.tool_choice();
  if (!tools) {
    if (choice.mode() == v1::ToolChoice::MODE_REQUIRED ||
        choice.mode() == v1::ToolChoice::MODE_FUNCTION) {
      return Invalid("tool_choice requires tools");
    }
    return absl::OkStatus();
  }
  if (!format.tools_supported) {
    return Invalid(absl::StrCat("this model's chat template (", origin,
                                ") does not render tool definitions, so the model cannot be "
                                "given tools"));
  }
  if (format.tool_format == model::ToolCallFormat::kUnknown) {
    return Invalid(absl::StrCat("this model's chat template (", origin,
                                ") writes tool calls in a format the router cannot parse "
                                "(it reads MiMo's <function=...> and Qwen3's JSON "
                                "<tool_call> formats)"));
  }
  if (choice.mode() == v1::ToolChoice::MODE_FUNCTION) {
    bool found = false;
    for (const model::ToolDefinition& t : ToolDefinitions(input.tools)) {
      found = found || t.name == choice.function_name();
    }
    if (!found) {
      return Invalid(absl::StrCat("tool_choice names function '", choice.function_name(),
                                  "', which is not among the tools"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Router::PrepareChat(const v1::GenerateRequest& in,
                                 absl::Span<const std::string> markers,
                                 std::vector<model::MarkerCut>* cuts, Request& r) {
  if (in.chat().messages().empty()) return Invalid("chat has no messages");
  absl::StatusOr<model::ChatInput> input = ChatInputFromProto(in.chat(), chat_format_.null_content);
  if (!input.ok()) return Invalid(absl::StrCat("chat: ", input.status().message()));
  const model::ChatTemplate* t =
      options_.chat_template != nullptr ? options_.chat_template : builtin_template_.get();
  // The template's file name, not its path: errors go to clients.
  RETURN_IF_ERROR(CheckTools(in, *input, chat_format_,
                             std::filesystem::path(t->origin()).filename().string()));
  for (auto it = default_kwargs_.begin(); it != default_kwargs_.end(); ++it) {
    if (!input->kwargs.contains(it.key())) input->kwargs[it.key()] = it.value();
  }
  const model::Tokenizer& tok = *options_.tokenizer;
  absl::StatusOr<std::vector<uint32_t>> ids = t->EncodeWithMarkers(tok, *input, markers, cuts);
  if (!ids.ok()) return Invalid(absl::StrCat("messages: ", ids.status().message()));
  r.tokens = *std::move(ids);
  // Breakpoints are placed in text without media (whose placeholders are
  // expanded later).
  if (in.chat().cache_breakpoints_size() > 0 && markers.empty()) {
    absl::StatusOr<std::vector<v1::CachePin>> pins =
        CachePinsFor(*t, tok, *input, in.chat().cache_breakpoints(), r.tokens);
    if (!pins.ok()) return Invalid(absl::StrCat("chat: ", pins.status().message()));
    r.cache_pins = *std::move(pins);
  }
  const size_t tail = std::min(r.tokens.size(), kReasoningTailTokens);
  r.opens_reasoning = model::OpensReasoning(
      tok.Decode(absl::MakeConstSpan(r.tokens).subspan(r.tokens.size() - tail)), chat_format_);
  return absl::OkStatus();
}

absl::Status Router::CheckRequest(const v1::GenerateRequest& in) const {
  // Everything that needs no tokenization, first: a bad request costs no
  // tokenizer time, whatever its prompt's size.
  const RouterOptions& o = options_;
  if (in.request_id().size() > o.max_request_id_bytes) {
    return Invalid(absl::StrCat("request_id is longer than ", o.max_request_id_bytes, " bytes"));
  }
  const v1::SamplingParams& s = in.sampling();
  if (!(s.temperature() >= 0.0f) || s.temperature() > 100.0f) {
    return Invalid("temperature must be in [0, 100]");
  }
  if (!(s.top_p() >= 0.0f) || s.top_p() > 1.0f) return Invalid("top_p must be in [0, 1]");
  if (s.top_logprobs() > 20) return Invalid("top_logprobs must be in [0, 20]");
  if (s.max_tokens() > o.max_max_tokens) {
    return Invalid(absl::StrCat("max_tokens ", s.max_tokens(), " is above the limit ",
                                o.max_max_tokens));
  }
  if (static_cast<size_t>(s.stop_size()) > o.max_stop_strings) {
    return Invalid(absl::StrCat("at most ", o.max_stop_strings, " stop strings are allowed"));
  }
  for (const std::string& stop : s.stop()) {
    if (stop.empty() || stop.size() > o.max_stop_string_bytes) {
      return Invalid(absl::StrCat("a stop string must be 1 to ", o.max_stop_string_bytes,
                                  " bytes long"));
    }
  }
  const uint32_t vocab = static_cast<uint32_t>(options_.tokenizer->vocab_size());
  if (static_cast<size_t>(s.stop_token_ids_size()) > o.max_stop_token_ids) {
    return Invalid(absl::StrCat("at most ", o.max_stop_token_ids, " stop_token_ids are allowed"));
  }
  for (uint32_t id : s.stop_token_ids()) {
    if (id >= vocab) {
      return Invalid(absl::StrCat("stop_token_ids: token id ", id, " is outside the vocabulary (",
                                  vocab, " tokens)"));
    }
  }
  if (s.logit_bias_size() > 300) return Invalid("logit_bias has more than 300 entries");
  for (const auto& [token, bias] : s.logit_bias()) {
    if (token >= vocab) {
      return Invalid(absl::StrCat("logit_bias: token id ", token, " is outside the vocabulary (",
                                  vocab, " tokens)"));
    }
    if (!(bias >= -100.0f && bias <= 100.0f)) {
      return Invalid(absl::StrCat("logit_bias[", token, "] must be in [-100, 100]"));
    }
  }
  if (in.priority() < -1000000 || in.priority() > 1000000) {
    return Invalid("priority must be in [-1000000, 1000000]");
  }
  if (in.cache_key().size() > kMaxCacheKeyBytes) {
    return Invalid(absl::StrCat("cache_key is longer than ", kMaxCacheKeyBytes, " bytes"));
  }
  if (in.cache_salt().size() > kMaxCacheKeyBytes) {
    return Invalid(absl::StrCat("cache_salt is longer than ", kMaxCacheKeyBytes, " bytes"));
  }
  if (in.progress_interval_ms() != 0 && in.progress_interval_ms() < 10) {
    // Served by the gRPC service (services/router/grpc_service.cc).
    return Invalid("progress_interval_ms must be 0 (no progress messages) or at least 10");
  }
  if (in.prompt_case() == v1::GenerateRequest::kTokenIds) {
    for (uint32_t id : in.token_ids().ids()) {
      if (id >= vocab) {
        return Invalid(absl::StrCat("token id ", id, " is outside the vocabulary (", vocab,
                                    " tokens)"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status Router::Prepare(const v1::GenerateRequest& in, Request& r) {
  auto invalid = [](absl::string_view msg) { return Invalid(msg); };
  if (!in.model().empty() && in.model() != options_.model_name) {
    return rpc::ErrorWithDetail(absl::StatusCode::kNotFound, v1::ERROR_CODE_UNKNOWN_MODEL,
                                absl::StrCat("model '", in.model(), "' is not served here (",
                                             options_.model_name, " is)"));
  }
  RETURN_IF_ERROR(CheckRequest(in));
  const bool media = in.multimodal_size() > 0;
  if (media && options_.media == nullptr) {
    return invalid("multimodal inputs need the encoder service, and this router has none "
                   "configured");
  }
  // With multimodal items the prompt is cut at their markers (media.h).
  std::vector<model::MarkerCut> cuts;
  const std::vector<std::string> no_markers;
  const std::vector<std::string>& markers = media ? MediaMarkers() : no_markers;
  const model::Tokenizer& tok = *options_.tokenizer;
  switch (in.prompt_case()) {
    case v1::GenerateRequest::kText: {
      absl::StatusOr<std::vector<uint32_t>> ids =
          model::EncodeTextWithMarkers(tok, in.text(), markers, &cuts);
      if (!ids.ok()) return invalid(absl::StrCat("prompt: ", ids.status().message()));
      r.tokens = *std::move(ids);
      break;
    }
    case v1::GenerateRequest::kTokenIds: {
      if (media) {
        return invalid("multimodal items need a text or chat prompt (their markers place them)");
      }
      r.tokens.assign(in.token_ids().ids().begin(), in.token_ids().ids().end());
      break;
    }
    case v1::GenerateRequest::kChat:
      RETURN_IF_ERROR(PrepareChat(in, markers, &cuts, r));
      break;
    case v1::GenerateRequest::PROMPT_NOT_SET:
      return invalid("a prompt (text, token_ids or chat) is required");
  }
  if (media) RETURN_IF_ERROR(PrepareMedia(in, cuts, r));
  if (r.tokens.empty()) return invalid("the prompt is empty");
  r.sampling = in.sampling();
  if (r.sampling.max_tokens() == 0) r.sampling.set_max_tokens(options_.default_max_tokens);
  RETURN_IF_ERROR(PrepareConstraint(in, r));
  if (r.sampling.max_tokens() > options_.max_max_tokens) {
    return invalid(absl::StrCat("max_tokens ", r.sampling.max_tokens(), " is above the limit ",
                                options_.max_max_tokens));
  }
  // A caller may not be served before its floor: a more urgent ask is
  // served at the floor.
  r.priority = std::max(in.priority(), r.caller.min_priority);
  r.cache_key = in.cache_key();
  r.page_hash_seed = base::PageHashSeedFor(r.caller.cache_domain, in.cache_salt());
  absl::StatusOr<int> bucket = BucketFor(static_cast<int64_t>(r.tokens.size()), options_.policy);
  if (!bucket.ok()) {
    return rpc::ErrorWithDetail(absl::StatusCode::kOutOfRange, v1::ERROR_CODE_PROMPT_TOO_LONG,
                                absl::StrCat("prompt of ", r.tokens.size(), " tokens: ",
                                             bucket.status().message()));
  }
  r.bucket = *bucket;
  r.bucket_label = absl::StrCat(r.bucket);
  r.id = in.request_id().empty()
             ? absl::StrFormat("req-%08x-%d", static_cast<uint32_t>(id_salt_), next_id_++)
             : in.request_id();
  if (r.caller.admit_tokens) {
    RETURN_IF_ERROR(r.caller.admit_tokens(static_cast<int64_t>(r.tokens.size()) +
                                          r.sampling.max_tokens()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<uint32_t>> Router::Tokenize(const v1::GenerateRequest& request) {
  if (request.multimodal_size() > 0) {
    return Invalid("tokenize does not take images, audio or video");
  }
  Request r;
  RETURN_IF_ERROR(Prepare(request, r));
  return std::move(r.tokens);
}

absl::StatusOr<Router::RouteResult> Router::Route(const v1::GenerateRequest& request) {
  Request r;
  r.start_ns = NowNanos();
  RETURN_IF_ERROR(Prepare(request, r));
  ASSIGN_OR_RETURN(Choice c, Decide(r, /*record=*/false));
  RouteResult out;
  out.prefill_worker = c.prefill->info.id;
  out.decode_worker = c.decode->info.id;
  out.bucket = r.bucket;
  out.prompt_tokens = static_cast<int64_t>(r.tokens.size());
  out.expected_cached_tokens = c.expected_cached_tokens;
  return out;
}

absl::Status Router::Candidates(const Request& r, bool larger_bucket, Endpoints* pre,
                               Endpoints* dec) const {
  const int64_t n = static_cast<int64_t>(r.tokens.size());
  absl::StatusOr<Endpoints> all = options_.directory->Workers();
  if (!all.ok()) {
    return rpc::ErrorWithDetail(absl::StatusCode::kUnavailable, v1::ERROR_CODE_NO_WORKERS,
                                absl::StrCat("worker registry unreadable: ",
                                             all.status().message()),
                                "", /*retryable=*/true);
  }
  auto model_ok = [&](const WorkerEndpoint& w) {
    return w.info.model.empty() || w.info.model == options_.model_name;
  };
  auto prefill_ok = [&](const WorkerEndpoint& w) {
    return model_ok(w) && CanPrefill(w.info.role) &&
           !r.excluded_prefill.contains(ExclusionKey(w.info));
  };
  // With `larger_bucket`: the lowest range starting above the prompt.
  int64_t above = INT64_MAX;
  if (larger_bucket) {
    for (const auto& w : *all) {
      if (prefill_ok(*w) && w->info.bucket_min_tokens > n) {
        above = std::min(above, w->info.bucket_min_tokens);
      }
    }
  }
  for (const auto& w : *all) {
    if (!model_ok(*w)) continue;
    if (prefill_ok(*w) && (larger_bucket ? w->info.bucket_min_tokens == above
                                         : w->info.bucket == r.bucket)) {
      pre->push_back(w);
    }
    if (CanDecode(w->info.role) && !r.excluded_decode.contains(ExclusionKey(w->info))) {
      dec->push_back(w);
    }
  }
  if (pre->empty() && !larger_bucket) {
    // No worker configured for this bucket: any prefill worker whose range
    // admits the prompt (small deployments run one worker for all lengths).
    for (const auto& w : *all) {
      const cluster::WorkerInfo& i = w->info;
      if (model_ok(*w) && CanPrefill(i.role) && !r.excluded_prefill.contains(ExclusionKey(i)) &&
          i.bucket_min_tokens <= n && (i.bucket_max_tokens == 0 || n <= i.bucket_max_tokens)) {
        pre->push_back(w);
      }
    }
  }
  if (pre->empty()) {
    return rpc::ErrorWithDetail(absl::StatusCode::kUnavailable, v1::ERROR_CODE_NO_WORKERS,
                                absl::StrCat("no prefill worker for a prompt of ", n,
                                             " tokens (bucket ", r.bucket, ")",
                                             r.attempt > 0 ? " left after failures" : ""),
                                "", /*retryable=*/true);
  }
  return absl::OkStatus();
}

std::vector<PrefillCandidate> Router::ScorePrefill(
    Request& r, const Endpoints& pre, const Endpoints& dec,
    std::vector<std::optional<v1::WorkerLoad>>* loads) {
  const int64_t n = static_cast<int64_t>(r.tokens.size());
  std::vector<std::string> ids;
  for (const auto& w : pre) ids.push_back(w->info.id);
  for (const auto& w : dec) ids.push_back(w->info.id);
  const int page = pre[0]->info.page_size > 0 ? pre[0]->info.page_size : 16;
  if (r.hash_page_size != page) {
    r.hashes = base::ChainedPageHashes(r.tokens, page, r.spans, r.page_hash_seed);
    r.hash_page_size = page;
  }
  std::vector<int64_t> depths(pre.size(), 0);
  loads->assign(ids.size(), std::nullopt);
  // Window-safe depths (pages; INT64_MAX: not known, credit the depth).
  std::vector<int64_t> safe_pages(pre.size(), INT64_MAX);
  std::vector<int64_t> l1_pages;
  // Each match's window-safe depth (all workers serve one model), searched
  // as far below its depth as the worker's credit needs (policy.h).
  const int window_pages = WindowPages(pre[0]->info.sliding_window, page);
  std::vector<PrefixCreditInputs> window(pre.size());
  std::vector<int64_t> scan(pre.size());
  for (size_t i = 0; i < pre.size(); ++i) {
    const cluster::WorkerInfo& info = pre[i]->info;
    window[i] = {.sliding_window = info.sliding_window,
                 .page_size = info.page_size > 0 ? info.page_size : page,
                 .swa_chain_layers = info.swa_chain_layers,
                 .window_restore = info.window_restore,
                 .restore_work = info.window_restore_work};
    scan[i] = WindowScanPages(window[i], options_.policy.window_scan_pages);
  }
  absl::StatusOr<cluster::ClusterView::PrefixesAndLoads> got = state_->MatchPrefixesAndLoads(
      r.hashes, absl::MakeConstSpan(ids).subspan(0, pre.size()), ids, window_pages, scan);
  if (got.ok() && got->depths.size() == pre.size() && got->loads.size() == ids.size()) {
    depths = std::move(got->depths);
    *loads = std::move(got->loads);
    if (got->safe_pages.size() == pre.size()) safe_pages = std::move(got->safe_pages);
    if (got->l1_pages.size() == pre.size()) l1_pages = std::move(got->l1_pages);
    if (got->redis_unreadable) {  // the index mirror's depths, no loads
      metrics_->redis_fallbacks->Increment();
      metrics_->mirror_fallbacks->Increment();
    }
  } else {
    // Redis unreadable: route on what the registry snapshot gives.
    metrics_->redis_fallbacks->Increment();
  }
  std::vector<PrefillCandidate> pc(pre.size());
  for (size_t i = 0; i < pre.size(); ++i) {
    PrefillCandidate& c = pc[i];
    c.id = pre[i]->info.id;
    const int wp = window[i].page_size;
    // A match whose last window lost its SWA KV is worth its window-safe
    // depth or what the worker's window restore reuses (policy.h PrefixCredit).
    PrefixCreditInputs in = window[i];
    in.full_tokens = depths[i] * wp;
    in.window_safe_tokens = safe_pages[i] >= depths[i] ? INT64_MAX
                            : safe_pages[i] < 0        ? -1
                                                       : safe_pages[i] * wp;
    const int64_t credit = PrefixCredit(in);
    // Pages in the worker's L2 count less (a load-back first).
    c.cached_tokens = std::min<int64_t>(
        l1_pages.empty() ? credit
                         : TieredCredit(credit, l1_pages[i] * wp, options_.policy.lower_tier_credit),
        n);
    if (safe_pages[i] < depths[i]) metrics_->window_unsafe_matches->Increment();
    c.healthy = options_.directory->Healthy(c.id);
    const std::optional<v1::WorkerLoad>& l = (*loads)[i];
    c.has_load = l.has_value();
    if (l) {
      c.queued_uncached_tokens = static_cast<int64_t>(l->queued_uncached_tokens());
      c.running_requests = static_cast<int32_t>(l->running_requests());
      c.queued_requests = static_cast<int32_t>(l->queued_requests());
      c.tokens_per_second = l->prefill_tokens_per_second();
    }
  }
  return pc;
}

absl::StatusOr<std::shared_ptr<const WorkerEndpoint>> Router::ChooseDecodeFor(
    const Request& r, const std::shared_ptr<const WorkerEndpoint>& prefill, const Endpoints& dec,
    absl::Span<const std::optional<v1::WorkerLoad>> dec_loads, uint64_t tie) {
  if (prefill->info.role == v1::ROLE_BOTH &&
      !r.excluded_decode.contains(ExclusionKey(prefill->info))) {
    metrics_->decisions->WithLabels({"decode", "monolithic"}).Increment();
    return prefill;  // monolithic worker: its own decode
  }
  const int64_t n = static_cast<int64_t>(r.tokens.size());
  std::vector<DecodeCandidate> dc = DecodeCandidates(dec, dec_loads, *options_.directory);
  absl::StatusOr<Decision> dd =
      dc.empty() ? absl::UnavailableError("none registered")
                 : ChooseDecode(n, r.sampling.max_tokens(), dc, options_.policy, tie);
  while (dd.ok() && !options_.directory->Pick(dc[dd->index].id)) {
    dc[dd->index].healthy = false;
    dd = ChooseDecode(n, r.sampling.max_tokens(), dc, options_.policy, tie);
  }
  if (!dd.ok()) {
    return rpc::ErrorWithDetail(absl::StatusCode::kUnavailable, v1::ERROR_CODE_NO_WORKERS,
                                absl::StrCat("no healthy decode worker: ", dd.status().message()),
                                "", /*retryable=*/true);
  }
  metrics_->decisions->WithLabels({absl::string_view("decode"), Label(ReasonName(dd->reason))}).Increment();
  return dec[dd->index];
}

absl::StatusOr<Router::Choice> Router::Decide(Request& r, bool record) {
  absl::StatusOr<Choice> own = DecideIn(r, record, /*larger_bucket=*/false);
  if (own.ok() || !options_.bucket_fallback) return own;
  std::optional<v1::ErrorDetail> d = rpc::GetErrorDetail(own.status());
  if (!d || d->code() != v1::ERROR_CODE_NO_WORKERS) return own;
  absl::StatusOr<Choice> up = DecideIn(r, record, /*larger_bucket=*/true);
  if (!up.ok()) return own;  // the bucket's own error says more
  if (record) metrics_->bucket_fallbacks->WithLabels({r.bucket_label}).Increment();
  SWA_LOG(debug, "request {}: no prefill worker of bucket {} can take it; {} (range from {} "
          "tokens) does", r.id, r.bucket, up->prefill->info.id,
          up->prefill->info.bucket_min_tokens);
  return up;
}

absl::StatusOr<Router::Choice> Router::DecideIn(Request& r, bool record, bool larger_bucket) {
  const int64_t t0 = NowNanos();
  const int64_t n = static_cast<int64_t>(r.tokens.size());
  Endpoints pre, dec;
  RETURN_IF_ERROR(Candidates(r, larger_bucket, &pre, &dec));
  // A prompt no candidate's KV pool can hold is a request error (413 /
  // RESOURCE_EXHAUSTED naming the limit), found before any worker call and
  // never counted against a worker.
  RETURN_IF_ERROR(KeepThoseThatFit(n, &pre, &dec));
  // Loads of every candidate and the prefix depth of every prefill
  // candidate: one round trip (the index's match script also reads the load
  // reports).
  std::vector<std::optional<v1::WorkerLoad>> loads;
  std::vector<PrefillCandidate> pc = ScorePrefill(r, pre, dec, &loads);
  // Load shedding: only a new request (a retry or a migration was admitted
  // already and must not be dropped now).
  if (r.attempt == 0 && options_.shed_backlog_seconds > 0) {
    const double bound = options_.shed_backlog_seconds * (r.priority < 0 ? 2.0 : 1.0);
    if (std::optional<double> retry = ShedRetryAfterSeconds(pc, bound)) {
      metrics_->shed->WithLabels({"backlog"}).Increment();
      return Overloaded(absl::StrFormat("every prefill worker for bucket %d has more than "
                                        "%.0f s of prefill queued; retry in %.0f s",
                                        r.bucket, bound, std::ceil(*retry)),
                        *retry);
    }
  }
  // Ties (e.g. fresh prompts on idle workers) spread by request id instead
  // of piling onto the lowest id.
  const uint64_t tie = base::Hash64(r.cache_key.empty() ? r.id : r.cache_key);
  // A half-open breaker's trial is taken only by the worker the policy
  // picks (Pick); when another request took it first, choose again.
  absl::StatusOr<Decision> pd = ChoosePrefill(n, pc, options_.policy, tie);
  while (pd.ok() && !options_.directory->Pick(pc[pd->index].id)) {
    pc[pd->index].healthy = false;
    pd = ChoosePrefill(n, pc, options_.policy, tie);
  }
  if (!pd.ok()) {
    return rpc::ErrorWithDetail(absl::StatusCode::kUnavailable, v1::ERROR_CODE_NO_WORKERS,
                                absl::StrCat("no healthy prefill worker for bucket ", r.bucket,
                                             ": ", pd.status().message()),
                                "", /*retryable=*/true);
  }
  Choice choice;
  choice.prefill = pre[pd->index];
  choice.expected_cached_tokens = pc[pd->index].cached_tokens;
  metrics_->decisions->WithLabels({absl::string_view("prefill"), Label(ReasonName(pd->reason))}).Increment();
  ASSIGN_OR_RETURN(choice.decode,
                   ChooseDecodeFor(r, choice.prefill, dec,
                                   absl::MakeConstSpan(loads).subspan(pre.size()), tie));
  metrics_->decision_seconds->Observe(static_cast<double>(NowNanos() - t0) * 1e-9);
  // Predicted index entries, off the request's path.
  if (record && !r.hashes.empty()) {
    RoutingState* state = state_;
    record_pool_->Schedule([state, id = choice.prefill->info.id, hashes = r.hashes] {
      absl::Status s = state->RecordDispatch(id, hashes);
      if (!s.ok()) SWA_LOG(debug, "recording a dispatch to {} failed: {}", id, s.ToString());
    });
  }
  return choice;
}

}  // namespace swaserve::router
