#include "lib/router/router.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/notification.h"
#include "lib/base/hash.h"
#include "lib/base/logging.h"
#include "lib/base/status.h"
#include "lib/metrics/buckets.h"
#include "lib/model/chat_template.h"
#include "lib/router/failure.h"
#include "lib/router/media.h"
#include "lib/router/router_metrics.h"
#include "lib/router/router_request.h"
#include "lib/router/text_stream.h"
#include "lib/rpc/status_conversion.h"
#include "swaserve/v1/worker.grpc.pb.h"

namespace swaserve::router {
namespace {

int64_t NowNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

bool CanPrefill(v1::Role r) { return r == v1::ROLE_PREFILL || r == v1::ROLE_BOTH; }
bool CanDecode(v1::Role r) { return r == v1::ROLE_DECODE || r == v1::ROLE_BOTH; }

// A worker incarnation: id + the random incarnation of its record.
std::string ExclusionKey(const cluster::WorkerInfo& i) {
  return absl::StrCat(i.id, "#", i.incarnation);
}

absl::string_view Label(std::string_view s) { return absl::string_view(s.data(), s.size()); }

std::string CodeLabel(absl::StatusCode code) {
  std::string s = absl::StatusCodeToString(code);
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char ch) {
    return ch == ' ' ? '_' : static_cast<char>(std::tolower(ch));
  });
  return s;
}

using Endpoints = std::vector<std::shared_ptr<const WorkerEndpoint>>;

// ResourceExhausted (OVERLOADED, retryable) telling the client when to come
// back (ErrorDetail.retry_after_ms: the HTTP API's Retry-After).
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


struct Router::Outcome {
  absl::Status status;
  FailureKind kind = FailureKind::kWorker;
  std::string leg;     // "prefill" | "decode" (failed attempts)
  std::string worker;  // whose fault, when a worker's
  std::string exclusion_key;  // that worker's incarnation (ExclusionKey)
  bool draining = false;
  // The prefill worker could not fetch a by-reference embedding.
  bool embeddings_unavailable = false;
};

struct Router::Choice {
  std::shared_ptr<const WorkerEndpoint> prefill;
  std::shared_ptr<const WorkerEndpoint> decode;
  int64_t expected_cached_tokens = 0;
};

Router::Router(const RouterOptions& options)
    : options_(options), id_salt_(std::random_device{}() ^ static_cast<uint64_t>(NowNanos())) {}

Router::~Router() = default;

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
  std::unique_ptr<Router> r(new Router(options));
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
  r->timers_ = std::make_unique<base::TimerQueue>();
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

absl::Status Router::Prepare(const v1::GenerateRequest& in, Request& r) {
  auto invalid = [](absl::string_view msg) {
    return rpc::ErrorWithDetail(absl::StatusCode::kInvalidArgument,
                                v1::ERROR_CODE_INVALID_REQUEST, msg);
  };
  if (!in.model().empty() && in.model() != options_.model_name) {
    return rpc::ErrorWithDetail(absl::StatusCode::kNotFound, v1::ERROR_CODE_UNKNOWN_MODEL,
                                absl::StrCat("model '", in.model(), "' is not served here (",
                                             options_.model_name, " is)"));
  }
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
      const uint32_t vocab = static_cast<uint32_t>(tok.vocab_size());
      for (uint32_t id : in.token_ids().ids()) {
        if (id >= vocab) {
          return invalid(absl::StrCat("token id ", id, " is outside the vocabulary (", vocab,
                                      " tokens)"));
        }
      }
      r.tokens.assign(in.token_ids().ids().begin(), in.token_ids().ids().end());
      break;
    }
    case v1::GenerateRequest::kChat: {
      std::vector<model::ChatMessage> msgs;
      for (const v1::ChatMessage& m : in.chat().messages()) msgs.push_back({m.role(), m.content()});
      if (msgs.empty()) return invalid("chat has no messages");
      model::ChatTemplateOptions co;
      co.add_generation_prompt = in.chat().add_generation_prompt();
      absl::StatusOr<std::vector<uint32_t>> ids =
          options_.chat_template != nullptr
              ? options_.chat_template->EncodeWithMarkers(tok, model::ToChatInput(msgs, co),
                                                          markers, &cuts)
              : model::EncodeChatWithMarkers(tok, msgs, co, markers, &cuts);
      if (!ids.ok()) return invalid(absl::StrCat("messages: ", ids.status().message()));
      r.tokens = *std::move(ids);
      break;
    }
    case v1::GenerateRequest::PROMPT_NOT_SET:
      return invalid("a prompt (text, token_ids or chat) is required");
  }
  if (media) RETURN_IF_ERROR(PrepareMedia(in, cuts, r));
  if (r.tokens.empty()) return invalid("the prompt is empty");
  r.sampling = in.sampling();
  if (r.sampling.max_tokens() == 0) r.sampling.set_max_tokens(options_.default_max_tokens);
  if (r.sampling.max_tokens() > options_.max_max_tokens) {
    return invalid(absl::StrCat("max_tokens ", r.sampling.max_tokens(), " is above the limit ",
                                options_.max_max_tokens));
  }
  if (!(r.sampling.temperature() >= 0.0f) || r.sampling.temperature() > 100.0f) {
    return invalid("temperature must be in [0, 100]");
  }
  if (!(r.sampling.top_p() >= 0.0f) || r.sampling.top_p() > 1.0f) {
    return invalid("top_p must be in [0, 1]");
  }
  if (r.sampling.top_logprobs() > 20) return invalid("top_logprobs must be in [0, 20]");
  if (in.priority() < -1000000 || in.priority() > 1000000) {
    return invalid("priority must be in [-1000000, 1000000]");
  }
  r.priority = in.priority();
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
  return absl::OkStatus();
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

absl::StatusOr<Router::Choice> Router::Decide(Request& r, bool record) {
  const int64_t t0 = NowNanos();
  const int64_t n = static_cast<int64_t>(r.tokens.size());
  absl::StatusOr<std::vector<std::shared_ptr<const WorkerEndpoint>>> all =
      options_.directory->Workers();
  if (!all.ok()) {
    return rpc::ErrorWithDetail(absl::StatusCode::kUnavailable, v1::ERROR_CODE_NO_WORKERS,
                                absl::StrCat("worker registry unreadable: ",
                                             all.status().message()),
                                "", /*retryable=*/true);
  }
  auto model_ok = [&](const WorkerEndpoint& w) {
    return w.info.model.empty() || w.info.model == options_.model_name;
  };
  std::vector<std::shared_ptr<const WorkerEndpoint>> pre, dec;
  for (const auto& w : *all) {
    if (!model_ok(*w)) continue;
    if (CanPrefill(w->info.role) && w->info.bucket == r.bucket &&
        !r.excluded_prefill.contains(ExclusionKey(w->info))) {
      pre.push_back(w);
    }
    if (CanDecode(w->info.role) && !r.excluded_decode.contains(ExclusionKey(w->info))) {
      dec.push_back(w);
    }
  }
  if (pre.empty()) {
    // No worker configured for this bucket: any prefill worker whose range
    // admits the prompt (small deployments run one worker for all lengths).
    for (const auto& w : *all) {
      const cluster::WorkerInfo& i = w->info;
      if (model_ok(*w) && CanPrefill(i.role) && !r.excluded_prefill.contains(ExclusionKey(i)) &&
          i.bucket_min_tokens <= n && (i.bucket_max_tokens == 0 || n <= i.bucket_max_tokens)) {
        pre.push_back(w);
      }
    }
  }
  if (pre.empty()) {
    return rpc::ErrorWithDetail(absl::StatusCode::kUnavailable, v1::ERROR_CODE_NO_WORKERS,
                                absl::StrCat("no prefill worker for a prompt of ", n,
                                             " tokens (bucket ", r.bucket, ")",
                                             r.attempt > 0 ? " left after failures" : ""),
                                "", /*retryable=*/true);
  }
  // A prompt no candidate's KV pool can hold is a request error (413 /
  // RESOURCE_EXHAUSTED naming the limit), found before any worker call and
  // never counted against a worker.
  RETURN_IF_ERROR(KeepThoseThatFit(n, &pre, &dec));
  // Loads of every candidate and the prefix depth of every prefill
  // candidate: one round trip (the index's match script also reads the load
  // reports).
  std::vector<std::string> ids;
  for (const auto& w : pre) ids.push_back(w->info.id);
  for (const auto& w : dec) ids.push_back(w->info.id);
  const int page = pre[0]->info.page_size > 0 ? pre[0]->info.page_size : 16;
  if (r.hash_page_size != page) {
    r.hashes = base::ChainedPageHashes(r.tokens, page, r.spans);
    r.hash_page_size = page;
  }
  std::vector<int64_t> depths(pre.size(), 0);
  std::vector<std::optional<v1::WorkerLoad>> loads(ids.size());
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
                 .window_restore = info.window_restore};
    scan[i] = WindowScanPages(window[i], options_.policy.window_scan_pages);
  }
  absl::StatusOr<cluster::ClusterView::PrefixesAndLoads> got = state_->MatchPrefixesAndLoads(
      r.hashes, absl::MakeConstSpan(ids).subspan(0, pre.size()), ids, window_pages, scan);
  if (got.ok() && got->depths.size() == pre.size() && got->loads.size() == ids.size()) {
    depths = std::move(got->depths);
    loads = std::move(got->loads);
    if (got->safe_pages.size() == pre.size()) safe_pages = std::move(got->safe_pages);
    if (got->l1_pages.size() == pre.size()) l1_pages = std::move(got->l1_pages);
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
    const std::optional<v1::WorkerLoad>& l = loads[i];
    c.has_load = l.has_value();
    if (l) {
      c.queued_uncached_tokens = static_cast<int64_t>(l->queued_uncached_tokens());
      c.running_requests = static_cast<int32_t>(l->running_requests());
      c.queued_requests = static_cast<int32_t>(l->queued_requests());
      c.tokens_per_second = l->prefill_tokens_per_second();
    }
  }
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
  const uint64_t tie = base::Hash64(r.id);
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
  if (choice.prefill->info.role == v1::ROLE_BOTH &&
      !r.excluded_decode.contains(ExclusionKey(choice.prefill->info))) {
    choice.decode = choice.prefill;  // monolithic worker: its own decode
    metrics_->decisions->WithLabels({"decode", "monolithic"}).Increment();
  } else {
    std::vector<DecodeCandidate> dc =
        DecodeCandidates(dec, absl::MakeConstSpan(loads).subspan(pre.size()), *options_.directory);
    absl::StatusOr<Decision> dd =
        dc.empty() ? absl::UnavailableError("none registered")
                   : ChooseDecode(n, r.sampling.max_tokens(), dc, options_.policy, tie);
    while (dd.ok() && !options_.directory->Pick(dc[dd->index].id)) {
      dc[dd->index].healthy = false;
      dd = ChooseDecode(n, r.sampling.max_tokens(), dc, options_.policy, tie);
    }
    if (!dd.ok()) {
      return rpc::ErrorWithDetail(absl::StatusCode::kUnavailable, v1::ERROR_CODE_NO_WORKERS,
                                  absl::StrCat("no healthy decode worker: ",
                                               dd.status().message()),
                                  "", /*retryable=*/true);
    }
    choice.decode = dec[dd->index];
    metrics_->decisions->WithLabels({absl::string_view("decode"), Label(ReasonName(dd->reason))}).Increment();
  }
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

Router::Outcome Router::RunLegs(Request& r, const Choice& c, GenerateSink& sink,
                                CancelFlag* cancel) {
  // Unique per dispatch even when clients reuse request ids (a decode
  // worker refuses a transfer id it has seen recently).
  const std::string transfer_id = absl::StrFormat("%s/%08x-%d-%d", r.id,
                                                  static_cast<uint32_t>(id_salt_),
                                                  next_id_.fetch_add(1), r.attempt);
  // Workers key requests by id (scheduling, cancellation): they get the
  // per-dispatch id, which starts with the client's for the logs.
  v1::DecodeRequest dreq;
  dreq.set_request_id(transfer_id);  // also names the KV transfer
  dreq.mutable_prompt_token_ids()->Assign(r.tokens.begin(), r.tokens.end());
  *dreq.mutable_sampling() = r.sampling;
  std::unique_ptr<DecodeCall> stream = c.decode->client->StartDecode(dreq, r.deadline);
  std::unique_ptr<PrefillCall> pcall = c.prefill->client->NewPrefill(r.deadline);
  // Which calls this router cancelled itself (their CANCELLED is nobody's
  // fault), and whether the client left.
  std::atomic<bool> d_cancelled{false}, p_cancelled{false}, client_left{false};
  auto cancel_decode = [&] {
    d_cancelled = true;
    stream->Cancel();
  };
  auto cancel_prefill = [&] {
    p_cancelled = true;
    pcall->Cancel();
  };
  if (cancel != nullptr) {
    cancel->OnCancel([&] {
      client_left = true;
      cancel_decode();
      cancel_prefill();
    });
  }
  struct ClearOnExit {
    CancelFlag* f;
    ~ClearOnExit() {
      if (f != nullptr) f->Clear();
    }
  } clear_on_exit{cancel};
  const std::string& pid = c.prefill->info.id;
  const std::string& did = c.decode->info.id;
  auto outcome = [&](const grpc::Status& s, bool self_cancelled, const std::string& leg,
                     const std::string& worker, absl::string_view what) {
    Outcome o;
    std::optional<v1::ErrorDetail> d = rpc::GetErrorDetail(s);
    o.kind = client_left ? FailureKind::kCancelled
                         : ClassifyFailure(rpc::FromGrpcCode(s.error_code()), d, self_cancelled);
    o.leg = leg;
    o.worker = worker;
    o.exclusion_key = ExclusionKey(leg == "prefill" ? c.prefill->info : c.decode->info);
    o.draining = d && d->code() == v1::ERROR_CODE_DRAINING;
    o.embeddings_unavailable = d && d->code() == v1::ERROR_CODE_EMBEDDINGS_UNAVAILABLE;
    if (o.kind == FailureKind::kCancelled) {
      o.status = absl::CancelledError("client went away");
    } else if (o.kind == FailureKind::kRequest && d) {
      o.status = rpc::ErrorWithDetail(rpc::FromGrpcCode(s.error_code()), d->code(),
                                      s.error_message(), worker, /*retryable=*/false);
    } else {
      o.status = rpc::ErrorWithDetail(
          rpc::FromGrpcCode(s.error_code()),
          o.kind == FailureKind::kOverload ? v1::ERROR_CODE_OVERLOADED : v1::ERROR_CODE_WORKER_LOST,
          absl::StrCat(leg, " worker ", worker, what, s.error_message()), worker,
          RetryElsewhere(o.kind));
    }
    return o;
  };

  // The decode worker answers `accepted` at once (it allocates nothing
  // yet): bound that answer by destination_timeout.
  std::atomic<bool> accept_timed_out{false};
  const uint64_t timer = timers_->Schedule(absl::Now() + options_.destination_timeout, [&] {
    accept_timed_out = true;
    stream->Cancel();
  });
  v1::DecodeResponse msg;
  const bool accepted = stream->Read(&msg) && msg.has_accepted();
  timers_->Cancel(timer);
  if (!accepted) {
    grpc::Status s = stream->Finish();
    if (s.ok()) s = grpc::Status(grpc::StatusCode::INTERNAL, "no `accepted` first message");
    if (accept_timed_out) {
      s = grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                       absl::StrCat("no answer within ",
                                    absl::FormatDuration(options_.destination_timeout)));
    }
    return outcome(s, d_cancelled && !accept_timed_out, "decode", did, ": ");
  }

  // Prefill leg, concurrently with reading the token stream: an
  // asynchronous call (no thread of its own, issue 22), whose completion
  // may run on any thread. It may queue at the prefill worker as long as
  // the request's deadline allows; the decode stream waits for it without
  // a timer of its own. The completion's state is shared (it may finish
  // after this frame stops reading it, but never after leg->done).
  struct PrefillLeg {
    absl::Mutex mu;
    bool tokens_seen ABSL_GUARDED_BY(mu) = false;
    bool returned ABSL_GUARDED_BY(mu) = false;
    grpc::Status status;  // written before `done`
    v1::PrefillResponse response;
    absl::Notification done;
  };
  auto leg = std::make_shared<PrefillLeg>();
  {
    v1::PrefillRequest preq;
    preq.set_request_id(transfer_id);
    preq.set_priority(r.priority);
    preq.mutable_token_ids()->Assign(r.tokens.begin(), r.tokens.end());
    for (const v1::MultimodalItem& m : r.media) *preq.add_multimodal() = m;
    *preq.mutable_sampling() = r.sampling;
    v1::DecodeTarget* t = preq.mutable_decode();
    t->set_worker_id(did);
    t->set_grpc_address(c.decode->info.grpc_address);
    t->set_transfer_id(transfer_id);
    pcall->Start(std::move(preq), &leg->response, [leg, &cancel_decode](grpc::Status s) {
      {
        // Without its KV the decode leg would wait for a commit that will
        // not come: cancel it — unless tokens already flow, which means the
        // commit arrived and the decode leg no longer needs the prefill
        // worker (it may die between committing and answering).
        absl::MutexLock lock(&leg->mu);
        leg->status = std::move(s);
        leg->returned = true;
        if (!leg->status.ok() && !leg->tokens_seen) cancel_decode();
      }
      leg->done.Notify();  // last: RunLegs may return once it is notified
    });
  }
  bool finished = false;
  bool sink_refused = false;
  v1::GenerateResponse out;
  while (!finished && stream->Read(&msg)) {
    if (!msg.has_tokens()) continue;
    const v1::TokenChunk& chunk = msg.tokens();
    if (chunk.token_ids_size() > 0 || chunk.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
      absl::MutexLock lock(&leg->mu);
      leg->tokens_seen = true;
    }
    out.Clear();
    out.set_request_id(r.id);
    std::string piece;
    for (uint32_t id : chunk.token_ids()) {
      out.add_token_ids(id);
      piece += r.text->Add(id);
      r.generated.push_back(id);
    }
    *out.mutable_logprobs() = chunk.logprobs();
    r.completion_tokens += static_cast<uint32_t>(chunk.token_ids_size());
    const int64_t now = NowNanos();
    if (chunk.token_ids_size() > 0) {
      if (r.first_token_ns == 0) r.first_token_ns = now;
      r.last_token_ns = now;
    }
    if (chunk.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
      piece += r.text->Finish();
      out.set_finish_reason(chunk.finish_reason());
      v1::Usage* u = out.mutable_usage();
      *u = chunk.usage();  // cached_tokens and the queue wait: as prefill reported them
      u->set_prompt_tokens(r.prompt_tokens);
      u->set_completion_tokens(r.completion_tokens);
      // After a migration the last leg's prompt included generated tokens:
      // what it reused of the client's prompt is at most the prompt.
      u->set_cached_tokens(std::min(u->cached_tokens(), r.prompt_tokens));
      r.cached_tokens = u->cached_tokens();
      finished = true;
    }
    out.set_text(std::move(piece));
    if (!sink.Write(out)) {
      sink_refused = true;
      client_left = true;
      cancel_decode();
      cancel_prefill();
      break;
    }
    r.sent_any = true;
  }
  if (!finished && !sink_refused) {
    // A failed decode leg cancels the prefill leg at once (its KV has
    // nowhere to go; the prefill worker keeps it in its prefix cache).
    cancel_decode();
    absl::MutexLock lock(&leg->mu);
    if (!leg->returned) cancel_prefill();
  }
  grpc::Status dstatus = stream->Finish();
  if (finished) {
    // The prefill answer carries only statistics (the commit, which the
    // stream needed, came before the first token): no grace wait for it on
    // the answer path — a prefill worker hung after committing must not
    // hold the end of the client's stream.
    absl::MutexLock lock(&leg->mu);
    if (!leg->returned) cancel_prefill();
  }
  leg->done.WaitForNotification();
  const grpc::Status& pstatus = leg->status;
  if (client_left) return outcome(grpc::Status::CANCELLED, true, "decode", did, "");
  if (finished) {
    options_.directory->ReportSuccess(did);
    if (pstatus.ok()) {
      options_.directory->ReportSuccess(pid);
    } else if (!(p_cancelled && pstatus.error_code() == grpc::StatusCode::CANCELLED)) {
      // Died after committing: its fault, though the request succeeded.
      const Outcome late = outcome(pstatus, false, "prefill", pid, ": ");
      if (FeedsBreaker(late.kind)) options_.directory->ReportFailure(pid);
    }
    Outcome ok;
    ok.status = absl::OkStatus();
    return ok;
  }
  // Failed. Whose fault? A failed prefill call cancels the decode stream;
  // but a prefill that failed to ship KV to a dead decode worker names that
  // worker in its ErrorDetail: then the decode leg is the one to retry.
  std::optional<v1::ErrorDetail> pdetail = rpc::GetErrorDetail(pstatus);
  // Its own failure, unless this router cancelled it (and that is what
  // ended it).
  const bool prefill_failed =
      !pstatus.ok() && !(p_cancelled && pstatus.error_code() == grpc::StatusCode::CANCELLED);
  const bool decode_fault = prefill_failed && pdetail && pdetail->worker_id() == did && did != pid;
  if (prefill_failed && !decode_fault) return outcome(pstatus, false, "prefill", pid, ": ");
  if (decode_fault) return outcome(pstatus, false, "decode", did, ": ");
  if (dstatus.ok()) dstatus = grpc::Status(grpc::StatusCode::INTERNAL, "stream ended early");
  // CANCELLED that this router asked for because the prefill leg failed was
  // handled above; any other CANCELLED came from the worker (shutdown).
  return outcome(dstatus, d_cancelled && !r.sent_any && prefill_failed, "decode", did,
                 r.sent_any ? " failed mid-stream: " : ": ");
}

absl::Status Router::Migrate(Request& r, const Outcome& o) {
  // Re-dispatch prompt + every token already sent; the stream continues.
  const std::string reason = o.draining ? "draining" : "worker_lost";
  metrics_->migrations->WithLabels({reason}).Increment();
  const size_t sent = r.generated.size() - r.generated_in_tokens;
  r.tokens.insert(r.tokens.end(), r.generated.begin() + r.generated_in_tokens, r.generated.end());
  r.generated_in_tokens = r.generated.size();
  r.hash_page_size = 0;  // recompute the page hashes of the longer prompt
  r.sampling.set_max_tokens(r.max_tokens - r.completion_tokens);
  r.excluded_decode.insert(o.exclusion_key);
  ++r.migrations;
  SWA_LOG(warn, "request {}: decode worker {} {} after {} tokens; migrating ({} tokens re-sent)",
          r.id, o.worker, o.draining ? "is draining" : "failed", r.completion_tokens, sent);
  absl::StatusOr<int> bucket = BucketFor(static_cast<int64_t>(r.tokens.size()), options_.policy);
  if (!bucket.ok()) {
    return rpc::ErrorWithDetail(absl::StatusCode::kUnavailable, v1::ERROR_CODE_WORKER_LOST,
                                absl::StrCat("decode worker ", o.worker,
                                             " failed mid-stream and the continued prompt (",
                                             r.tokens.size(), " tokens) fits no bucket"),
                                o.worker, false);
  }
  r.bucket = *bucket;
  return absl::OkStatus();
}

absl::Status Router::Generate(const v1::GenerateRequest& request, GenerateSink& sink,
                              CancelFlag* cancel) {
  Request r;
  r.start_ns = NowNanos();
  r.deadline = absl::Now() + options_.request_timeout;
  const int inflight = inflight_.fetch_add(1) + 1;
  metrics_->inflight->Increment();
  struct Leave {
    Router* self;
    ~Leave() {
      self->inflight_.fetch_sub(1);
      self->metrics_->inflight->Decrement();
    }
  } leave{this};
  absl::Status st;
  if (options_.max_inflight_requests > 0 && inflight > options_.max_inflight_requests) {
    metrics_->shed->WithLabels({"inflight"}).Increment();
    st = Overloaded(absl::StrCat("router overloaded: ", options_.max_inflight_requests,
                                 " requests in flight"),
                    1.0);
  } else {
    st = Prepare(request, r);
  }
  if (st.ok()) {
    r.prompt_tokens = static_cast<uint32_t>(r.tokens.size());
    r.max_tokens = r.sampling.max_tokens();
    r.text = std::make_unique<TextStream>(
        *options_.tokenizer,
        std::vector<std::string>(r.sampling.stop().begin(), r.sampling.stop().end()));
  }
  int prefill_attempts = 0, decode_attempts = 0;
  absl::Time worker_wait_until = std::min(r.deadline, absl::Now() + options_.worker_wait);
  while (st.ok()) {
    if (cancel != nullptr && cancel->cancelled()) {
      st = absl::CancelledError("client went away");
      break;
    }
    absl::StatusOr<Choice> choice = Decide(r);
    if (!choice.ok() && absl::IsUnavailable(choice.status()) && absl::Now() < worker_wait_until) {
      // No worker to send to (the others failed this request, are
      // restarting, or Redis restarted and they have not re-registered
      // yet): wait for one to come back rather than lose the request.
      absl::SleepFor(absl::Milliseconds(100));
      continue;
    }
    if (!choice.ok()) {
      st = choice.status();
      break;
    }
    worker_wait_until = std::min(r.deadline, absl::Now() + options_.worker_wait);
    Outcome o = RunLegs(r, *choice, sink, cancel);
    st = o.status;
    if (st.ok() || !RetryElsewhere(o.kind)) break;
    if (o.embeddings_unavailable && !r.media_inline) {
      // A by-reference embedding is gone (evicted, or its encoder died):
      // encode the items again, inline this time, and retry.
      SWA_LOG(warn, "request {}: {}; encoding its media again, inline", r.id,
              std::string(st.message()));
      st = MediaInline(r);
      if (!st.ok()) break;
      ++r.attempt;
      continue;
    }
    if (FeedsBreaker(o.kind)) options_.directory->ReportFailure(o.worker);
    if (absl::Now() >= r.deadline) break;
    if (o.leg == "decode" && r.sent_any) {
      if (r.migrations >= options_.max_migrations) break;
      if (r.completion_tokens >= r.max_tokens) {
        // Every token was sent; only the last chunk was lost.
        st = FinishLocally(r, sink);
        break;
      }
      st = Migrate(r, o);
      if (!st.ok()) break;
      ++r.attempt;
      continue;
    }
    const bool more = o.leg == "prefill" ? ++prefill_attempts < options_.max_prefill_attempts
                                         : ++decode_attempts < options_.max_decode_attempts;
    if (!more) break;
    SWA_LOG(warn, "request {}: {} leg failed ({}: {}), retrying elsewhere", r.id, o.leg,
            FailureKindName(o.kind), std::string(st.message()));
    metrics_->retries->WithLabels({o.leg}).Increment();
    // An overloaded worker is not excluded (it may have room next time);
    // a faulty one is.
    if (o.kind == FailureKind::kWorker) {
      (o.leg == "prefill" ? r.excluded_prefill : r.excluded_decode).insert(o.exclusion_key);
    }
    ++r.attempt;
    st = absl::OkStatus();
  }
  metrics_->requests->WithLabels({CodeLabel(st.code())}).Increment();
  if (st.ok()) {
    const int64_t end = NowNanos();
    metrics_->e2e->WithLabels({r.bucket_label}).Observe(static_cast<double>(end - r.start_ns) *
                                                        1e-9);
    if (r.first_token_ns > 0) {
      metrics_->ttft->WithLabels({r.bucket_label})
          .Observe(static_cast<double>(r.first_token_ns - r.start_ns) * 1e-9);
    }
    if (r.completion_tokens > 1) {
      metrics_->tpot->WithLabels({r.bucket_label})
          .Observe(static_cast<double>(r.last_token_ns - r.first_token_ns) * 1e-9 /
                   (r.completion_tokens - 1));
    }
    metrics_->prompt_tokens->WithLabels({r.bucket_label}).Increment(static_cast<double>(r.prompt_tokens));
    metrics_->cached_tokens->WithLabels({r.bucket_label}).Increment(r.cached_tokens);
    metrics_->generated_tokens->Increment(r.completion_tokens);
  }
  return st;
}

absl::Status Router::FinishLocally(Request& r, GenerateSink& sink) {
  v1::GenerateResponse out;
  out.set_request_id(r.id);
  out.set_text(r.text->Finish());
  out.set_finish_reason(v1::FINISH_REASON_LENGTH);
  v1::Usage* u = out.mutable_usage();
  u->set_prompt_tokens(r.prompt_tokens);
  u->set_completion_tokens(r.completion_tokens);
  u->set_cached_tokens(r.cached_tokens);
  if (!sink.Write(out)) return absl::CancelledError("client went away");
  return absl::OkStatus();
}

}  // namespace swaserve::router
