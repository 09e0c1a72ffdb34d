#include "lib/worker/decode_core.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <deque>
#include <optional>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "lib/base/clock.h"
#include "lib/base/logging.h"
#include "lib/base/status.h"
#include "lib/kv/sequence.h"
#include "lib/metrics/buckets.h"
#include "lib/sched/decode_scheduler.h"

namespace swaserve::worker {

namespace {

struct Req {
  DecodeJob job;
  std::unique_ptr<kv::Sequence> seq;
  std::unique_ptr<model::Sampler> sampler;
  std::unique_ptr<StopChecker> stop;
  std::vector<uint32_t> generated;  // first token included
  bool recompute = false;           // preempted: KV to rebuild before running
  // While recomputing in the batch: prompt + generated tokens but the last
  // (the KV to rebuild) and how many of them are done.
  std::vector<uint32_t> recompute_tokens;
  int recompute_done = 0;
  // MTP (null: the model has none, or this request does not speculate):
  // its state, all committed tokens (prompt + generated), this step's draft
  // work and the tokens fed to the main model (t_m then the drafts).
  std::unique_ptr<MtpState> mtp;
  std::vector<uint32_t> context;
  DraftWork draft;
  std::vector<uint32_t> step_tokens;
  int k = 0;  // drafts this step
  // Draft tokens verified so far, and accepted (TokenEvent).
  int drafted = 0;
  int accepted = 0;
};

struct Metrics {
  metrics::Counter* admitted = nullptr;
  metrics::Counter* preempted = nullptr;
  metrics::Counter* generated = nullptr;
  metrics::Counter* finished_stop = nullptr;
  metrics::Counter* finished_length = nullptr;
  metrics::Counter* finished_cancelled = nullptr;
  metrics::Counter* finished_error = nullptr;
  metrics::Gauge* staged = nullptr;
  metrics::Gauge* running = nullptr;
  metrics::Histogram* batch = nullptr;
  metrics::Histogram* step_seconds = nullptr;
  metrics::Counter* mtp_drafted = nullptr;
  metrics::Counter* mtp_accepted = nullptr;
  metrics::Histogram* mtp_length = nullptr;
  metrics::Family<metrics::Counter>* mtp_pos_drafted = nullptr;
  metrics::Family<metrics::Counter>* mtp_pos_accepted = nullptr;
  // Their children by draft position - 1, made on first use (the decode
  // loop then does no label lookups).
  std::vector<std::pair<metrics::Counter*, metrics::Counter*>> mtp_pos;
  metrics::Histogram* mtp_draft_seconds = nullptr;
  metrics::Histogram* mtp_verify_seconds = nullptr;
  metrics::Gauge* mtp_draft_cost = nullptr;
  metrics::Gauge* mtp_draft_vocab = nullptr;

  absl::Status Init(metrics::Registry* r) {
    if (r == nullptr) return absl::OkStatus();
    ASSIGN_OR_RETURN(auto* adm, r->AddCounter("swaserve_decode_admitted_total",
                                              "Requests admitted into the running batch "
                                              "(readmissions after preemption included)."));
    admitted = &adm->WithLabels();
    ASSIGN_OR_RETURN(auto* pre, r->AddCounter("swaserve_decode_preempted_total",
                                              "Running requests preempted because the KV "
                                              "pools ran out (re-queued, not failed)."));
    preempted = &pre->WithLabels();
    ASSIGN_OR_RETURN(auto* gen, r->AddCounter("swaserve_decode_generated_tokens_total",
                                              "Tokens emitted by the decode loop (the first "
                                              "token, sampled by prefill, included)."));
    generated = &gen->WithLabels();
    ASSIGN_OR_RETURN(auto* fin, r->AddCounter("swaserve_decode_finished_total",
                                              "Requests that ended, by reason.", {"reason"}));
    finished_stop = &fin->WithLabels({"stop"});
    finished_length = &fin->WithLabels({"length"});
    finished_cancelled = &fin->WithLabels({"cancelled"});
    finished_error = &fin->WithLabels({"error"});
    ASSIGN_OR_RETURN(auto* st, r->AddGauge("swaserve_decode_staged_requests",
                                           "Requests waiting for admission with their KV in "
                                           "host memory (or preempted)."));
    staged = &st->WithLabels();
    ASSIGN_OR_RETURN(auto* run, r->AddGauge("swaserve_decode_running_requests",
                                            "Requests in the running batch."));
    running = &run->WithLabels();
    ASSIGN_OR_RETURN(auto* b, r->AddHistogram("swaserve_decode_batch_size",
                                              "Requests per decode iteration.", {},
                                              *metrics::ExponentialBuckets(1, 2, 9)));
    batch = &b->WithLabels();
    ASSIGN_OR_RETURN(auto* s, r->AddHistogram("swaserve_decode_step_seconds",
                                              "Wall time of one decode iteration.", {},
                                              *metrics::ExponentialBuckets(1e-4, 2, 16)));
    step_seconds = &s->WithLabels();
    return InitMtp(r);
  }

  absl::Status InitMtp(metrics::Registry* r) {
    ASSIGN_OR_RETURN(auto* d, r->AddCounter("swaserve_decode_mtp_drafted_tokens_total",
                                            "Tokens drafted by the MTP layers."));
    mtp_drafted = &d->WithLabels();
    ASSIGN_OR_RETURN(auto* a, r->AddCounter("swaserve_decode_mtp_accepted_tokens_total",
                                            "Drafted tokens the main model accepted."));
    mtp_accepted = &a->WithLabels();
    ASSIGN_OR_RETURN(auto* l, r->AddHistogram("swaserve_decode_mtp_acceptance_length",
                                              "Tokens emitted per verify step of a request "
                                              "(accepted drafts + 1).",
                                              {}, {1, 2, 3, 4, 5, 6, 7, 8}));
    mtp_length = &l->WithLabels();
    ASSIGN_OR_RETURN(mtp_pos_drafted,
                     r->AddCounter("swaserve_decode_mtp_position_drafted_total",
                                   "Drafts verified at each draft position (1 = the token "
                                   "after the last committed one).",
                                   {"position"}));
    ASSIGN_OR_RETURN(mtp_pos_accepted,
                     r->AddCounter("swaserve_decode_mtp_position_accepted_total",
                                   "Drafts accepted at each draft position.", {"position"}));
    ASSIGN_OR_RETURN(auto* ds, r->AddHistogram("swaserve_decode_mtp_draft_seconds",
                                               "Wall time of one iteration's MTP draft step.", {},
                                               *metrics::ExponentialBuckets(1e-5, 2, 18)));
    mtp_draft_seconds = &ds->WithLabels();
    ASSIGN_OR_RETURN(auto* vs, r->AddHistogram("swaserve_decode_mtp_verify_seconds",
                                               "Wall time of a decode iteration that verified "
                                               "drafts (main forward and acceptance).",
                                               {}, *metrics::ExponentialBuckets(1e-4, 2, 16)));
    mtp_verify_seconds = &vs->WithLabels();
    ASSIGN_OR_RETURN(auto* dc, r->AddGauge("swaserve_decode_mtp_draft_cost",
                                           "Cost of one draft token in plain decode request-steps "
                                           "at the last drafting step's batch size and draft "
                                           "length (the adaptive choice's measured model)."));
    mtp_draft_cost = &dc->WithLabels();
    ASSIGN_OR_RETURN(auto* dv, r->AddGauge("swaserve_decode_mtp_draft_vocab_tokens",
                                           "Tokens drafts are drawn from (the draft vocabulary "
                                           "learnt from emitted tokens; 0: the whole "
                                           "vocabulary)."));
    mtp_draft_vocab = &dv->WithLabels();
    return absl::OkStatus();
  }
};

}  // namespace

struct DecodeCore::Impl {
  DecodeCoreOptions options;
  Metrics m;

  mutable absl::Mutex mu;
  absl::CondVar cv;
  std::deque<std::unique_ptr<Req>> incoming ABSL_GUARDED_BY(mu);
  std::vector<std::string> cancels ABSL_GUARDED_BY(mu);
  absl::flat_hash_set<std::string> ids ABSL_GUARDED_BY(mu);
  bool stopping ABSL_GUARDED_BY(mu) = false;
  int staged_count ABSL_GUARDED_BY(mu) = 0;
  int running_count ABSL_GUARDED_BY(mu) = 0;
  std::atomic<int64_t> admitted_total{0}, preempted_total{0}, finished_total{0};
  std::atomic<int64_t> recompute_chunks{0}, recompute_chunks_with_decode{0};
  std::atomic<int64_t> mtp_steps{0}, mtp_drafted{0}, mtp_accepted{0};
  std::atomic<int64_t> draft_vocab_builds{0};
  std::atomic<int> draft_vocab_tokens{0};
  std::thread thread;

  // Loop-owned. The policy (admission order, batch, preemption victim) is
  // sched::DecodeScheduler's; the requests themselves live in `reqs`, and
  // `running` is the scheduler's batch (admission order) as pointers.
  std::unique_ptr<sched::DecodeScheduler> sched;
  absl::flat_hash_map<std::string, std::unique_ptr<Req>> reqs;
  std::vector<Req*> running;
  model::ForwardOutput out;
  std::vector<model::ForwardItem> items;
  std::unique_ptr<MtpDrafter> drafter;  // null: no MTP layers or MTP off
  int mtp_layers = 0;                   // draft tokens at most (0: MTP off)
  std::unique_ptr<MtpCostModel> cost;   // with drafter
  std::unique_ptr<DraftVocabulary> vocab;  // with drafter, unless drafts use every token
  // Per-position acceptance over this worker's requests (a request's average
  // when it ends): where new requests start.
  std::vector<double> acceptance_prior;
  int probe_interval_prior = 0;  // the last finished request's

  void Loop();
  // Removes `id` from `reqs` and returns it.
  std::unique_ptr<Req> Take(const std::string& id);
  // Ends running request `id` (the caller removed it from `running`): out of
  // the scheduler's batch, then End().
  void EndRunning(std::string id, FinishReason finish, absl::Status error = absl::OkStatus());
  void Admit();
  void Step();
  // Step's parts: KV for this iteration's tokens of every decoding request
  // (preempting when the pools run out; false: the batch failed), the MTP
  // draft step, and acceptance + emission after the forward.
  bool ReserveTokens();
  void Draft(const std::vector<Req*>& decoding);
  // Emits request r's tokens of this iteration; false when it ended.
  bool VerifyAndEmit(Req& r, int item, int hidden_row);
  // A new or readmitted request's MTP state (null when it does not draft).
  void StartMtp(Req& r);
  // Submit's checks and the request they make.
  absl::StatusOr<std::unique_ptr<Req>> Prepare(DecodeJob job);
  absl::Status StartRecompute(Req& r);
  // Appends the next recompute chunk of the oldest recomputing request in
  // the batch to `items` (false: none, or its pages ran out).
  Req* NextRecomputeChunk(int* tokens);
  void Emit(Req& r, std::vector<model::SampledToken> tokens, FinishReason finish,
            absl::Status error = absl::OkStatus());
  void End(std::unique_ptr<Req> r, FinishReason finish, absl::Status error = absl::OkStatus());
  void Preempt(Req& r);
  void PublishCounts();
};

void DecodeCore::Impl::Emit(Req& r, std::vector<model::SampledToken> tokens,
                            FinishReason finish, absl::Status error) {
  TokenEvent e;
  e.tokens = std::move(tokens);
  e.finish = finish;
  e.error = std::move(error);
  e.prompt_tokens = static_cast<int>(r.job.prompt.size());
  e.generated_tokens = static_cast<int>(r.generated.size());
  e.cached_tokens = r.job.cached_tokens;
  e.draft_tokens = r.drafted;
  e.accepted_draft_tokens = r.accepted;
  if (m.generated != nullptr) m.generated->Increment(static_cast<double>(e.tokens.size()));
  r.job.sink(e);
}

void DecodeCore::Impl::End(std::unique_ptr<Req> r, FinishReason finish, absl::Status error) {
  if (r->seq != nullptr && options.inspect_kv) {
    std::vector<uint32_t> tokens = r->job.prompt;
    tokens.insert(tokens.end(), r->generated.begin(), r->generated.end());
    options.inspect_kv(r->job.id, *r->seq, tokens, r->mtp.get());
  }
  if (r->mtp != nullptr && r->mtp->steps() > 0) {
    // The worker's prior moves toward what this request saw.
    absl::Span<const double> a = r->mtp->acceptances();
    if (acceptance_prior.size() != a.size()) acceptance_prior.assign(a.begin(), a.end());
    for (size_t i = 0; i < a.size(); ++i) {
      acceptance_prior[i] = 0.7 * acceptance_prior[i] + 0.3 * a[i];
    }
    probe_interval_prior = r->mtp->probe_interval();
  }
  if (r->seq != nullptr) r->seq->Abort();
  r->seq.reset();
  r->job.staging.reset();
  Emit(*r, {}, finish, std::move(error));
  finished_total.fetch_add(1, std::memory_order_relaxed);
  if (m.finished_stop != nullptr) {
    switch (finish) {
      case FinishReason::kStop: m.finished_stop->Increment(); break;
      case FinishReason::kLength: m.finished_length->Increment(); break;
      case FinishReason::kCancelled: m.finished_cancelled->Increment(); break;
      default: m.finished_error->Increment(); break;
    }
  }
  absl::MutexLock lock(&mu);
  ids.erase(r->job.id);
}

std::unique_ptr<Req> DecodeCore::Impl::Take(const std::string& id) {
  auto it = reqs.find(id);
  std::unique_ptr<Req> r = std::move(it->second);
  reqs.erase(it);
  return r;
}

void DecodeCore::Impl::EndRunning(std::string id, FinishReason finish, absl::Status error) {
  (void)sched->Finish(id);
  End(Take(id), finish, std::move(error));
}

void DecodeCore::Impl::StartMtp(Req& r) {
  r.mtp.reset();
  if (drafter == nullptr) return;
  const int want = r.job.sampling.speculative_tokens;
  const int cap = want < 0 ? mtp_layers : std::min(want, mtp_layers);
  if (cap <= 0) return;
  const model::ModelConfig& c = options.engine->config();
  r.mtp = std::make_unique<MtpState>(options.mtp, c.num_mtp_layers, c.hidden_size, cap,
                                     acceptance_prior, probe_interval_prior);
  r.context = r.job.prompt;
  const int m = static_cast<int>(r.job.prompt.size());
  const int rows = static_cast<int>(r.job.tail_hidden.size()) / c.hidden_size;
  // The first draft step runs the MTP layers from m - rows, whose window
  // must be staged (KvReceiverOptions::mtp_lookback); otherwise drafting
  // starts once decode has produced its own rows.
  const int need_from = std::max(0, m - rows - (c.sliding_window - 1));
  const bool staged = r.seq->swa_first_page() * r.seq->page_size() <= need_from;
  if (rows > 0 && rows <= m && staged &&
      r.job.tail_hidden.size() == static_cast<size_t>(rows) * c.hidden_size) {
    r.mtp->Reset(m, r.job.tail_hidden);
  } else {
    r.mtp->Pause();
  }
  r.job.tail_hidden = {};
}

void DecodeCore::Impl::Preempt(Req& r) {
  if (r.mtp != nullptr) r.mtp->Pause();  // its MTP KV goes with the pages
  r.seq->Abort();
  r.seq.reset();
  r.recompute = true;
  // Readmission rebuilds the KV of prompt + generated tokens but the last.
  const int context = static_cast<int>(r.job.prompt.size() + r.generated.size()) - 1;
  absl::Status st = sched->Preempt(r.job.id, context, base::MonotonicNanos());
  if (!st.ok()) SWA_LOG(err, "decode: preempting {}: {}", r.job.id, st.ToString());
  preempted_total.fetch_add(1, std::memory_order_relaxed);
  if (m.preempted != nullptr) m.preempted->Increment();
  SWA_LOG(info, "decode: preempted {} at {} generated tokens (KV pools full)", r.job.id,
          r.generated.size());
}

absl::Status DecodeCore::Impl::StartRecompute(Req& r) {
  // The KV of prompt + generated tokens except the last (the next input) is
  // rebuilt in chunks interleaved with the running batch (Step), not here:
  // admission only checks that the pages fit now, so a long preempted
  // request does not stall everyone else's next token for its whole
  // recompute.
  r.recompute_tokens = r.job.prompt;
  r.recompute_tokens.insert(r.recompute_tokens.end(), r.generated.begin(), r.generated.end() - 1);
  r.recompute_done = 0;
  const kv::KvShape& shape = options.pools->shape();
  const int ps = shape.page_size;
  const int64_t n = static_cast<int64_t>(r.recompute_tokens.size());
  const int64_t need_full = (n + 1 + ps - 1) / ps;
  const int64_t need_swa =
      (std::min<int64_t>(n + 1, shape.sliding_window + options.recompute_chunk) + ps - 1) / ps + 1;
  if (need_full > options.pools->full().num_free() || need_swa > options.pools->swa().num_free()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("recomputing ", n, " tokens needs ", need_full, " full and ", need_swa,
                     " SWA pages; ", options.pools->full().num_free(), " and ",
                     options.pools->swa().num_free(), " are free"));
  }
  return absl::OkStatus();
}

void DecodeCore::Impl::Admit() {
  while (true) {
    // can_admit places the request's KV in the pools (copy from staging, or
    // recompute after a preemption): true commits the admission. A request
    // that cannot be placed while others run waits for their pages (the
    // scheduler admits strictly in order); one that fails otherwise is
    // failed below and admission resumes behind it.
    std::string failed_id;
    absl::Status failed;
    const sched::DecodeIteration it =
        sched->NextIteration(base::MonotonicNanos(), [&](const sched::DecodeRequestInfo& info) {
          Req& r = *reqs.at(info.id);
          r.seq = std::make_unique<kv::Sequence>(kv::SequenceOptions{
              .pools = options.pools,
              .swa_slack = drafter != nullptr ? MtpSwaSlack(options.mtp, mtp_layers) : 0,
              .evict_on_demand = false});
          absl::Status st = r.recompute
                                ? StartRecompute(r)
                                : AdmitFromStaging(*r.job.staging, *options.pools, r.seq.get());
          if (st.ok()) {
            if (!r.recompute) StartMtp(r);
            return true;
          }
          r.seq.reset();  // frees whatever was placed
          if (absl::IsResourceExhausted(st) && sched->running_requests() > 0) return false;
          failed_id = info.id;
          failed = absl::IsResourceExhausted(st)
                       ? absl::ResourceExhaustedError(absl::StrCat(
                             "request does not fit in this decode worker's KV pools even alone: ",
                             st.message()))
                       : st;
          return false;
        });
    for (const std::string& id : it.admitted) {
      Req& r = *reqs.at(id);
      admitted_total.fetch_add(1, std::memory_order_relaxed);
      if (m.admitted != nullptr) m.admitted->Increment();
      if (r.recompute) continue;  // rebuilt chunk by chunk in Step
      r.job.staging.reset();  // host memory back as soon as the KV is in the pools
      r.generated.push_back(r.job.first_token.token);
      if (r.mtp != nullptr) r.context.push_back(r.job.first_token.token);
      StopReason why = r.stop->Add(r.job.first_token.token);
      if (why == StopReason::kNone && r.sampler->Terminated()) why = StopReason::kStop;
      Emit(r, {r.job.first_token}, FinishReason::kNone);
      if (why != StopReason::kNone) {
        EndRunning(id, why == StopReason::kStop ? FinishReason::kStop : FinishReason::kLength);
      }
    }
    running.clear();
    for (const std::string& id : it.batch) {
      auto r = reqs.find(id);
      if (r != reqs.end()) running.push_back(r->second.get());
    }
    if (failed_id.empty()) return;
    sched->Cancel(failed_id);
    End(Take(failed_id), FinishReason::kError, std::move(failed));
  }
}

bool DecodeCore::Impl::ReserveTokens() {
  // KV for this iteration's tokens of every decoding request: t_m and its
  // drafts (recomputing ones get their next chunk in Step). When the pools
  // are full, a request first drops its drafts, then the most recently
  // admitted request (the back of `running`) is preempted.
  // Now and then a step without drafts measures a plain step's time at this
  // batch size (the adaptive choice's cost model).
  const bool plain = cost != nullptr && cost->WantPlainStep(static_cast<int>(running.size()));
  // Now and then every request drafts, so that the draft cost (measured only
  // in such steps) stays current.
  const bool measure =
      !plain && cost != nullptr && cost->TakeDraftStep(static_cast<int>(running.size()));
  size_t i = 0;
  while (i < running.size()) {
    Req& r = *running[i];
    if (r.recompute) {
      ++i;
      continue;
    }
    r.k = 0;
    if (r.mtp != nullptr && !plain) {
      const int m = static_cast<int>(r.context.size()) - 1;
      const int left = r.job.stop.max_tokens - static_cast<int>(r.generated.size());
      r.k = std::min(
          r.mtp->ChooseDraftLength(m, *cost, static_cast<int>(running.size()), measure),
          std::max(0, left - 1));
    }
    absl::Status st = r.seq->Append(1 + r.k);
    if (!st.ok() && r.k > 0) {
      r.k = 0;
      st = r.seq->Append(1);
    }
    if (st.ok()) {
      ++i;
      continue;
    }
    if (running.size() == 1) {
      const std::string id = running.back()->job.id;
      const int length = running.back()->seq->length();
      running.pop_back();
      EndRunning(id, FinishReason::kError,
                 absl::ResourceExhaustedError(absl::StrCat(
                     "request outgrew this decode worker's KV pools at ", length,
                     " tokens: ", st.message())));
      return false;
    }
    // The scheduler picks the victim (the most recently admitted request,
    // i.e. the back of the batch); requests before position i already
    // have their token's page.
    const std::optional<std::string> victim = sched->ChoosePreemptionVictim();
    auto pos = std::find_if(running.begin(), running.end(),
                            [&](const Req* q) { return victim == q->job.id; });
    if (pos == running.end()) {  // the batch mirrors the scheduler's: a bug
      SWA_LOG(err, "decode: preemption victim {} is not in the running batch",
              victim.value_or("(none)"));
      std::abort();
    }
    Req* v = *pos;
    if (static_cast<size_t>(pos - running.begin()) < i) --i;
    running.erase(pos);
    Preempt(*v);
  }
  return true;
}

void DecodeCore::Impl::Draft(const std::vector<Req*>& decoding) {
  std::vector<DraftWork*> work;
  for (Req* r : decoding) {
    if (r->k == 0) continue;
    DraftWork& d = r->draft;
    d.state = r->mtp.get();
    d.seq = r->seq.get();
    d.tokens = r->context;
    d.k = r->k;
    d.sampler = r->sampler.get();
    work.push_back(&d);
  }
  if (work.empty()) return;
  const int64_t t0 = base::MonotonicNanos();
  absl::Status st = drafter->Run(work, vocab != nullptr ? vocab->head() : nullptr);
  if (!st.ok()) {
    // A bug: decode on without drafts rather than fail the requests.
    SWA_LOG(err, "decode: MTP draft step failed: {}", st.ToString());
    for (Req* r : decoding) {
      if (r->k == 0) continue;
      (void)r->seq->Rollback(r->k);
      r->k = 0;
      r->mtp->Pause();
    }
  }
  if (m.mtp_draft_seconds != nullptr) {
    m.mtp_draft_seconds->Observe(static_cast<double>(base::MonotonicNanos() - t0) * 1e-9);
  }
}

void DecodeCore::Impl::Step() {
  const int64_t t0 = base::MonotonicNanos();
  if (!ReserveTokens() || running.empty()) return;
  std::vector<Req*> decoding;
  for (Req* r : running) {
    if (!r->recompute) decoding.push_back(r);
  }
  Draft(decoding);
  items.clear();
  bool keep_hidden = false, verifying = false;
  for (Req* r : decoding) {
    const int pos = r->seq->length() - 1 - r->k;
    r->step_tokens.assign(1, r->generated.back());
    if (r->k > 0) {
      r->step_tokens.insert(r->step_tokens.end(), r->draft.drafts.begin(),
                            r->draft.drafts.begin() + r->k);
    }
    items.push_back({.seq = r->seq.get(), .tokens = r->step_tokens, .start = pos,
                     .all_logits = r->k > 0});
    keep_hidden |= r->mtp != nullptr;
    verifying |= r->k > 0;
  }
  // One chunk of one preempted request's recompute rides in the same ragged
  // forward as the batch's decode tokens.
  int chunk = 0;
  Req* rec = NextRecomputeChunk(&chunk);
  if (items.empty()) return;
  absl::Status st = options.engine->Forward(items, &out, keep_hidden);
  if (!st.ok()) {
    // A malformed batch is a bug; fail the requests rather than spin.
    SWA_LOG(err, "decode: forward failed: {}", st.ToString());
    while (!running.empty()) {
      const std::string id = running.back()->job.id;
      running.pop_back();
      EndRunning(id, FinishReason::kError, st);
    }
    return;
  }
  if (m.batch != nullptr) m.batch->Observe(static_cast<double>(decoding.size()));
  if (rec != nullptr) {
    recompute_chunks.fetch_add(1, std::memory_order_relaxed);
    if (!decoding.empty()) recompute_chunks_with_decode.fetch_add(1, std::memory_order_relaxed);
    rec->recompute_done += chunk;
    if (rec->recompute_done == static_cast<int>(rec->recompute_tokens.size())) {
      rec->recompute = false;  // decodes from the next iteration on
      rec->recompute_tokens.clear();
      rec->seq->TrimWindow();
    }
  }
  std::vector<Req*> still;
  still.reserve(running.size());
  for (Req* r : running) {
    if (r->recompute || r == rec) still.push_back(r);
  }
  int hidden_row = 0, drafted = 0, drafting = 0, can_draft = 0;
  for (size_t k = 0; k < decoding.size(); ++k) {
    Req& r = *decoding[k];
    const int rows = 1 + r.k;
    drafted += r.k;
    drafting += r.k > 0;
    can_draft += r.mtp != nullptr && r.mtp->cap() > 0;
    if (VerifyAndEmit(r, static_cast<int>(k), hidden_row)) still.push_back(&r);
    hidden_row += rows;
  }
  running = std::move(still);
  const double seconds = static_cast<double>(base::MonotonicNanos() - t0) * 1e-9;
  if (m.step_seconds != nullptr) m.step_seconds->Observe(seconds);
  if (verifying && m.mtp_verify_seconds != nullptr) m.mtp_verify_seconds->Observe(seconds);
  if (cost != nullptr && rec == nullptr) {
    cost->Observe(static_cast<int>(decoding.size()), seconds, drafted, drafting, can_draft);
    if (m.mtp_draft_cost != nullptr && drafting > 0) {
      const int k = (drafted + drafting / 2) / drafting;
      m.mtp_draft_cost->Set(cost->StepCost(static_cast<int>(decoding.size()), k) / k);
    }
  }
  if (vocab != nullptr) {
    absl::StatusOr<bool> changed = vocab->MaybeRebuild(options.engine->engine());
    if (!changed.ok()) {
      // A bug: draft from the whole vocabulary from now on.
      SWA_LOG(err, "decode: draft vocabulary: {}", changed.status().ToString());
      vocab.reset();
      draft_vocab_tokens.store(0, std::memory_order_relaxed);
      if (m.mtp_draft_vocab != nullptr) m.mtp_draft_vocab->Set(0);
    } else if (*changed) {
      draft_vocab_builds.fetch_add(1, std::memory_order_relaxed);
      draft_vocab_tokens.store(vocab->size(), std::memory_order_relaxed);
      if (m.mtp_draft_vocab != nullptr) m.mtp_draft_vocab->Set(vocab->size());
    }
  }
}

bool DecodeCore::Impl::VerifyAndEmit(Req& r, int item, int hidden_row) {
  const int V = options.engine->config().vocab_size;
  const int H = options.engine->config().hidden_size;
  auto row = [&](int i) {
    return absl::MakeConstSpan(out.logits.data() + static_cast<size_t>(out.first_row[item] + i) * V,
                               V);
  };
  std::vector<model::SampledToken> toks;
  int accepted = 0;
  if (r.k == 0) {
    toks.push_back(r.sampler->Sample(row(0)));
  } else {
    // Drafts in order until the first rejection (which emits its
    // replacement); all accepted: one more token from the last row.
    for (int i = 0; i < r.k; ++i) {
      model::SampledToken t;
      const bool ok = r.sampler->Verify(row(i), r.draft.drafts[i], r.draft.q[i], &t);
      toks.push_back(std::move(t));
      if (!ok) break;
      ++accepted;
    }
    if (accepted == r.k) toks.push_back(r.sampler->Sample(row(r.k)));
    r.mtp->Observe(r.k, accepted);
    r.drafted += r.k;
    r.accepted += accepted;
    mtp_steps.fetch_add(1, std::memory_order_relaxed);
    mtp_drafted.fetch_add(r.k, std::memory_order_relaxed);
    mtp_accepted.fetch_add(accepted, std::memory_order_relaxed);
    if (m.mtp_drafted != nullptr) {
      m.mtp_drafted->Increment(r.k);
      m.mtp_accepted->Increment(accepted);
      m.mtp_length->Observe(accepted + 1);
      for (int i = 0; i < r.k && i <= accepted; ++i) {
        while (static_cast<int>(m.mtp_pos.size()) <= i) {
          const std::string p = std::to_string(m.mtp_pos.size() + 1);
          m.mtp_pos.emplace_back(&m.mtp_pos_drafted->WithLabels({p}),
                                 &m.mtp_pos_accepted->WithLabels({p}));
        }
        m.mtp_pos[i].first->Increment();
        if (i < accepted) m.mtp_pos[i].second->Increment();
      }
    }
    // The KV of rejected drafts goes (every layer's: the MTP layers'
    // provisional positions are rewritten by the next draft step).
    if (accepted < r.k) {
      absl::Status st = r.seq->Rollback(r.k - accepted);
      if (!st.ok()) {
        EndRunning(r.job.id, FinishReason::kError, st);
        return false;
      }
    }
  }
  if (r.mtp != nullptr) {
    // Main hidden states of the committed positions m .. m + accepted.
    const int m_pos = static_cast<int>(r.context.size()) - 1;
    r.mtp->AddMainRows(m_pos, absl::MakeConstSpan(out.all_hidden.data() +
                                                      static_cast<size_t>(hidden_row) * H,
                                                  static_cast<size_t>(accepted + 1) * H));
  }
  StopReason why = StopReason::kNone;
  size_t emitted = 0;
  while (emitted < toks.size() && why == StopReason::kNone) {
    const uint32_t t = toks[emitted++].token;
    if (vocab != nullptr) vocab->Observe(t);
    r.generated.push_back(t);
    if (r.mtp != nullptr) r.context.push_back(t);
    why = r.stop->Add(t);
    // Structured output: the grammar's end ends the choice. The constraint
    // has seen every token of this step (verification fed them in), so it
    // speaks for the last one; after an earlier end only EOS was allowed,
    // which the stop check ends at.
    if (why == StopReason::kNone && emitted == toks.size() && r.sampler->Terminated()) {
      why = StopReason::kStop;
    }
  }
  toks.resize(emitted);
  Emit(r, std::move(toks), FinishReason::kNone);
  if (why == StopReason::kNone) return true;
  EndRunning(r.job.id, why == StopReason::kStop ? FinishReason::kStop : FinishReason::kLength);
  return false;
}

Req* DecodeCore::Impl::NextRecomputeChunk(int* tokens) {
  *tokens = 0;
  for (size_t i = 0; i < running.size(); ++i) {
    Req* r = running[i];
    if (!r->recompute) continue;
    const int n = static_cast<int>(r->recompute_tokens.size());
    const int c = std::min(options.recompute_chunk, n - r->recompute_done);
    absl::Status st = r->seq->Append(c);
    if (!st.ok()) {
      // Pages ran out since admission (the batch grew into them): back to
      // the waiting requests, to start over when pages free up.
      running.erase(running.begin() + static_cast<long>(i));
      Preempt(*r);
      return nullptr;
    }
    items.push_back({r->seq.get(),
                     absl::MakeConstSpan(r->recompute_tokens).subspan(r->recompute_done, c),
                     r->recompute_done, false});
    *tokens = c;
    return r;
  }
  return nullptr;
}

void DecodeCore::Impl::PublishCounts() {
  absl::MutexLock lock(&mu);
  staged_count = sched->waiting_requests() + static_cast<int>(incoming.size());
  running_count = static_cast<int>(running.size());
  if (m.staged != nullptr) m.staged->Set(staged_count);
  if (m.running != nullptr) m.running->Set(running_count);
}

void DecodeCore::Impl::Loop() {
  std::deque<std::unique_ptr<Req>> arrived;
  while (true) {
    std::vector<std::string> to_cancel;
    {
      absl::MutexLock lock(&mu);
      while (!stopping && incoming.empty() && cancels.empty() && running.empty() &&
             sched->waiting_requests() == 0) {
        cv.Wait(&mu);
      }
      if (stopping) break;
      arrived.swap(incoming);
      to_cancel.swap(cancels);
    }
    for (std::unique_ptr<Req>& r : arrived) {
      const std::string id = r->job.id;
      absl::Status st = sched->Stage(
          {id, static_cast<int>(r->job.prompt.size()), base::MonotonicNanos()});
      if (!st.ok()) {  // Submit checked the id is unique; a bug otherwise
        End(std::move(r), FinishReason::kError, st);
        continue;
      }
      reqs.emplace(id, std::move(r));
    }
    arrived.clear();
    for (const std::string& id : to_cancel) {
      if (!reqs.contains(id)) continue;  // ended meanwhile
      const bool was_running = sched->IsRunning(id);
      sched->Cancel(id);
      if (was_running) {
        running.erase(std::find(running.begin(), running.end(), reqs.at(id).get()));
      }
      End(Take(id), FinishReason::kCancelled);
    }
    Admit();
    PublishCounts();
    if (!running.empty()) Step();
    PublishCounts();
  }
  // Stopping: everything still here ends as cancelled.
  std::deque<std::unique_ptr<Req>> rest;
  {
    absl::MutexLock lock(&mu);
    rest.swap(incoming);
  }
  for (auto& r : rest) End(std::move(r), FinishReason::kCancelled);
  running.clear();
  std::vector<std::string> ids_left;
  for (const auto& [id, r] : reqs) ids_left.push_back(id);
  for (const std::string& id : ids_left) {
    sched->Cancel(id);
    End(Take(id), FinishReason::kCancelled);
  }
  PublishCounts();
}

absl::StatusOr<std::unique_ptr<DecodeCore>> DecodeCore::Create(const DecodeCoreOptions& options) {
  RETURN_IF_ERROR(CheckEngineAndPools("DecodeCore", options.engine, options.pools));
  if (options.max_batch_size <= 0 || options.recompute_chunk <= 0) {
    return absl::InvalidArgumentError("max_batch_size and recompute_chunk must be > 0");
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  RETURN_IF_ERROR(impl->m.Init(options.registry));
  ASSIGN_OR_RETURN(impl->sched, sched::DecodeScheduler::Create(
                                    {options.max_batch_size, options.registry}));
  const int K = options.engine->config().num_mtp_layers;
  if (options.mtp.draft_tokens < -1 || options.mtp.draft_cost < 0 ||
      !(options.mtp.ema_weight > 0 && options.mtp.ema_weight <= 1) ||
      options.mtp.resume_tokens < 1 || options.mtp.probe_interval < 1 ||
      options.mtp.max_probe_interval < options.mtp.probe_interval) {
    return absl::InvalidArgumentError(
        "MTP options: draft_tokens >= -1, draft_cost >= 0, ema_weight in (0, 1], "
        "resume_tokens >= 1, 1 <= probe_interval <= max_probe_interval");
  }
  impl->mtp_layers = options.mtp.draft_tokens < 0 ? K : std::min(options.mtp.draft_tokens, K);
  if (impl->mtp_layers > 0) {
    impl->drafter = std::make_unique<MtpDrafter>(options.engine);
    // Fixed draft lengths need no cost model (nor its plain steps).
    impl->cost = std::make_unique<MtpCostModel>(
        options.mtp.draft_cost, options.mtp.measure_cost && options.mtp.adaptive);
    const int vocab = options.engine->config().vocab_size;
    if (const int n = DraftVocabularySize(options.mtp, vocab); n > 0) {
      impl->vocab = std::make_unique<DraftVocabulary>(vocab, n, options.mtp.draft_vocab_first_tokens,
                                                      options.mtp.max_draft_vocab_interval);
    }
  }
  {
    const size_t V = static_cast<size_t>(options.engine->config().vocab_size);
    const size_t batch = static_cast<size_t>(std::max(1, options.max_batch_size));
    impl->out.logits.reserve(batch * static_cast<size_t>(impl->mtp_layers + 1) * V);
    if (impl->drafter != nullptr) impl->drafter->Reserve(options.max_batch_size);
  }
  Impl* p = impl.get();
  impl->thread = std::thread([p] { p->Loop(); });
  return std::unique_ptr<DecodeCore>(new DecodeCore(std::move(impl)));
}

DecodeCore::DecodeCore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

DecodeCore::~DecodeCore() { Stop(); }

void DecodeCore::Stop() { StopLoop(&impl_->mu, &impl_->cv, &impl_->stopping, &impl_->thread); }

absl::StatusOr<std::unique_ptr<Req>> DecodeCore::Impl::Prepare(DecodeJob job) {
  if (!job.sink) return absl::InvalidArgumentError("decode job without a token sink");
  if (job.prompt.empty()) return absl::InvalidArgumentError("empty prompt");
  if (job.staging == nullptr || job.staging->layout().num_tokens != static_cast<int>(job.prompt.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "request ", job.id, ": staged KV does not cover its ", job.prompt.size(),
        " prompt tokens"));
  }
  const StagedKvLayout want = StagedKvLayout::For(options.pools->shape(),
                                                  static_cast<int>(job.prompt.size()));
  const StagedKvLayout& have = job.staging->layout();
  if (have.first_swa_token > want.first_swa_token || have.first_swa_token % have.page_size != 0 ||
      have.full_page_bytes != want.full_page_bytes ||
      have.swa_page_bytes != want.swa_page_bytes || have.page_size != want.page_size) {
    return absl::InvalidArgumentError(absl::StrCat("request ", job.id,
                                                   ": staged KV layout does not match this "
                                                   "worker's KV pools"));
  }
  const int V = options.engine->config().vocab_size;
  if (job.first_token.token >= static_cast<uint32_t>(V)) {
    return absl::InvalidArgumentError(absl::StrCat("first token ", job.first_token.token,
                                                   " >= vocab size ", V));
  }
  RETURN_IF_ERROR(model::Sampler::Validate(job.sampling));
  RETURN_IF_ERROR(StopChecker::Validate(job.stop, options.tokenizer));
  auto r = std::make_unique<Req>();
  r->sampler = std::make_unique<model::Sampler>(job.sampling);
  // Prefill sampled the first token from the same seed: continue its random
  // stream (drawing its number again made the second token depend on the
  // first's draw).
  r->sampler->Skip(1);
  if (!r->sampler->Observe(job.first_token.token)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "first token ", job.first_token.token, " is not allowed by the request's constraint"));
  }
  r->stop = std::make_unique<StopChecker>(job.stop, options.tokenizer);
  r->job = std::move(job);
  return r;
}

absl::Status DecodeCore::Submit(DecodeJob job) {
  std::vector<DecodeJob> one;
  one.push_back(std::move(job));
  return SubmitAll(std::move(one));
}

absl::Status DecodeCore::SubmitAll(std::vector<DecodeJob> jobs) {
  std::vector<std::unique_ptr<Req>> reqs;
  for (DecodeJob& job : jobs) {
    ASSIGN_OR_RETURN(std::unique_ptr<Req> r, impl_->Prepare(std::move(job)));
    reqs.push_back(std::move(r));
  }
  absl::MutexLock lock(&impl_->mu);
  if (impl_->stopping) return absl::FailedPreconditionError("decode core is stopping");
  absl::flat_hash_set<std::string> batch;
  for (const auto& r : reqs) {
    if (impl_->ids.contains(r->job.id) || !batch.insert(r->job.id).second) {
      return absl::AlreadyExistsError(absl::StrCat("request ", r->job.id, " is already here"));
    }
  }
  for (auto& r : reqs) {
    impl_->ids.insert(r->job.id);
    impl_->incoming.push_back(std::move(r));
    impl_->staged_count++;
  }
  impl_->cv.Signal();
  return absl::OkStatus();
}

void DecodeCore::Cancel(const std::string& id) {
  absl::MutexLock lock(&impl_->mu);
  if (!impl_->ids.contains(id)) return;
  impl_->cancels.push_back(id);
  impl_->cv.Signal();
}

DecodeLoad DecodeCore::GetLoad() const {
  DecodeLoad l;
  {
    absl::MutexLock lock(&impl_->mu);
    l.staged = impl_->staged_count;
    l.running = impl_->running_count;
  }
  l.admitted_total = impl_->admitted_total.load();
  l.preempted_total = impl_->preempted_total.load();
  l.finished_total = impl_->finished_total.load();
  l.recompute_chunks_total = impl_->recompute_chunks.load();
  l.recompute_chunks_with_decode_total = impl_->recompute_chunks_with_decode.load();
  l.mtp_steps_total = impl_->mtp_steps.load();
  l.mtp_drafted_total = impl_->mtp_drafted.load();
  l.mtp_accepted_total = impl_->mtp_accepted.load();
  l.mtp_draft_vocab_builds_total = impl_->draft_vocab_builds.load();
  l.mtp_draft_vocab_tokens = impl_->draft_vocab_tokens.load();
  return l;
}

}  // namespace swaserve::worker
