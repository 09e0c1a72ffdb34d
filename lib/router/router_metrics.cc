#include "lib/router/router_metrics.h"

#include "lib/base/status.h"
#include "lib/metrics/buckets.h"

namespace swaserve::router {

absl::StatusOr<std::unique_ptr<Router::Metrics>> Router::Metrics::Create(
    metrics::Registry* reg) {
  auto m = std::make_unique<Metrics>();
  ASSIGN_OR_RETURN(m->requests, reg->AddCounter("swaserve_router_requests_total",
                                                "Requests by final status code.", {"code"}));
  ASSIGN_OR_RETURN(m->decisions,
                   reg->AddCounter("swaserve_router_decisions_total",
                                   "Routing decisions by leg (prefill, decode) and reason.",
                                   {"leg", "reason"}));
  ASSIGN_OR_RETURN(metrics::HistogramFamily * ds,
                   reg->AddHistogram("swaserve_router_decision_seconds",
                                     "Time to pick the workers of a request: Redis reads "
                                     "(loads, prefix index) and the policy.",
                                     {}, *metrics::ExponentialBuckets(50e-6, 2, 14)));
  m->decision_seconds = &ds->WithLabels();
  ASSIGN_OR_RETURN(m->retries, reg->AddCounter("swaserve_router_retries_total",
                                               "Worker legs retried on another worker.",
                                               {"leg"}));
  ASSIGN_OR_RETURN(m->ttft, reg->AddHistogram("swaserve_router_ttft_seconds",
                                              "Time to first token as the router sees it, "
                                              "by length bucket.",
                                              {"bucket"}, metrics::DefaultLatencyBuckets()));
  ASSIGN_OR_RETURN(m->tpot, reg->AddHistogram("swaserve_router_tpot_seconds",
                                              "Time per output token after the first, by "
                                              "length bucket.",
                                              {"bucket"}, metrics::DefaultLatencyBuckets()));
  ASSIGN_OR_RETURN(m->e2e, reg->AddHistogram("swaserve_router_e2e_seconds",
                                             "Request latency from arrival to the last "
                                             "token, by length bucket.",
                                             {"bucket"}, metrics::DefaultLatencyBuckets()));
  ASSIGN_OR_RETURN(metrics::CounterFamily * pt,
                   reg->AddCounter("swaserve_router_prompt_tokens_total",
                                   "Prompt tokens of completed requests, by length bucket.",
                                   {"bucket"}));
  ASSIGN_OR_RETURN(metrics::CounterFamily * ct,
                   reg->AddCounter("swaserve_router_cached_tokens_total",
                                   "Prompt tokens served from a prefix cache, by length bucket "
                                   "(hit rate = cached / prompt).",
                                   {"bucket"}));
  ASSIGN_OR_RETURN(metrics::CounterFamily * gt,
                   reg->AddCounter("swaserve_router_generated_tokens_total",
                                   "Tokens generated."));
  ASSIGN_OR_RETURN(metrics::GaugeFamily * inf,
                   reg->AddGauge("swaserve_router_inflight_requests", "Requests in flight."));
  ASSIGN_OR_RETURN(metrics::GaugeFamily * stalled,
                   reg->AddGauge("swaserve_router_stalled_requests",
                                 "Requests in flight that made no progress (decision, worker "
                                 "answer, token, room at the client) for the router's "
                                 "stall_report_after."));
  m->stalled = &stalled->WithLabels();
  ASSIGN_OR_RETURN(metrics::CounterFamily * fb,
                   reg->AddCounter("swaserve_router_redis_fallbacks_total",
                                   "Decisions made while Redis could not be read: without "
                                   "load reports, and without the prefix index unless the "
                                   "index mirror answered (swaserve_router_mirror_fallbacks_"
                                   "total)."));
  ASSIGN_OR_RETURN(metrics::CounterFamily * mfb,
                   reg->AddCounter("swaserve_router_mirror_fallbacks_total",
                                   "Decisions made while Redis could not be read that kept "
                                   "prefix affinity: the index mirror's depths, without "
                                   "predictions (part of swaserve_router_redis_fallbacks_"
                                   "total)."));
  m->mirror_fallbacks = &mfb->WithLabels();
  ASSIGN_OR_RETURN(metrics::CounterFamily * wu,
                   reg->AddCounter("swaserve_router_window_unsafe_matches_total",
                                   "Prefill candidates whose prefix-index match ends where the "
                                   "worker dropped SWA KV (credited as a window restore)."));
  m->window_unsafe_matches = &wu->WithLabels();
  // Children that may stay at 0 exist from the start, so dashboards and
  // alerts see a 0 instead of no series.
  for (const char* leg : {"prefill", "decode"}) m->retries->WithLabels({leg});
  ASSIGN_OR_RETURN(m->migrations,
                   reg->AddCounter("swaserve_router_migrations_total",
                                   "Requests re-dispatched mid-stream (prompt + tokens already "
                                   "sent) after their decode worker died (worker_lost) or "
                                   "drained (draining).",
                                   {"reason"}));
  m->prompt_tokens = pt;
  m->cached_tokens = ct;
  m->generated_tokens = &gt->WithLabels();
  m->inflight = &inf->WithLabels();
  m->redis_fallbacks = &fb->WithLabels();
  for (const char* reason : {"worker_lost", "draining"}) m->migrations->WithLabels({reason});
  ASSIGN_OR_RETURN(m->shed, reg->AddCounter("swaserve_router_shed_total",
                                            "Requests refused with 429 before any worker "
                                            "call: too many in flight (inflight) or every "
                                            "prefill worker of the bucket too backlogged "
                                            "(backlog).",
                                            {"reason"}));
  for (const char* reason : {"inflight", "backlog"}) m->shed->WithLabels({reason});
  ASSIGN_OR_RETURN(m->bucket_fallbacks,
                   reg->AddCounter("swaserve_router_bucket_fallbacks_total",
                                   "Prefill attempts sent to a larger bucket's worker because "
                                   "no worker of the prompt's own bucket could take them "
                                   "(all gone, failed this request, or breakers open); by the "
                                   "prompt's bucket.",
                                   {"bucket"}));
  return m;
}

}  // namespace swaserve::router
