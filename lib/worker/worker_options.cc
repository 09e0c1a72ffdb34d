#include "lib/worker/worker_options.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace swaserve::worker {

void AddWorkerFlags(base::Config* config, WorkerOptions* o, absl::string_view prefix) {
  auto key = [prefix](absl::string_view k) { return absl::StrCat(prefix, k); };
  config->Add(key("role"), &o->role, "prefill, decode or both (monolithic)")
      .Add(key("model"), &o->model, "checkpoint directory (config.json + safetensors); required")
      .Add(key("worker_id"), &o->worker_id, "registry id (default: <role>-<host>-<pid>)")
      .Add(key("listen"), &o->listen, "gRPC listen address host:port (port 0: any free port)")
      .Add(key("metrics.host"), &o->metrics_host, "Prometheus /metrics bind host")
      .Add(key("metrics.port"), &o->metrics_port, "Prometheus /metrics port (0: any free port)")
      .Add(key("port_file"), &o->port_file, "write the bound ports here as JSON once serving")
      .Add(key("log_level"), &o->log_level, "trace, debug, info, warn, error")
      .Add(key("threads"), &o->threads, "kernel threads (0: all cores)")
      .Add(key("kv.page_size"), &o->page_size, "tokens per KV page")
      .Add(key("kv.prefill_mib"), &o->prefill_kv_mib, "KV pool bytes of the prefill side (MiB)")
      .Add(key("kv.decode_mib"), &o->decode_kv_mib, "KV pool bytes of the decode side (MiB)")
      .Add(key("kv.swa_full_ratio"), &o->swa_full_ratio, "SWA pool tokens per full pool token")
      .Add(key("kv.l2_ratio"), &o->l2_ratio,
           "prefill L2 tier (host memory) bytes as a multiple of kv.prefill_mib; evicted "
           "prefix-cache pages go there and come back on a hit (0: no L2)")
      .Add(key("kv.l2_swa_full_ratio"), &o->l2_swa_full_ratio,
           "SWA tokens per full token in the L2 tier (it keeps trailing windows only)")
      .Add(key("prefill.load_back_min_tokens"), &o->load_back_min_tokens,
           "load a prompt's prefix back from L2 when at least this many of its tokens are there")
      .Add(key("prefill.async_load_back_min_bytes"), &o->async_load_back_min_bytes,
           "a load-back of at least this many bytes copies on its own thread while the "
           "loop computes other requests (smaller ones copy inline)")
      .Add(key("kv.l3"), &o->l3,
           "prefill L3 tier below L2: file:<dir> (local, survives restarts) or "
           "redis:<host:port> (shared; its own Redis with allkeys-lru); empty: none")
      .Add(key("kv.l3_redis_password_file"), &o->l3_redis_password_file,
           "file holding a redis: L3's password (AUTH on every connection; empty: none, or "
           "the one in a redis:// address)")
      .Add(key("kv.l3_redis_username"), &o->l3_redis_username,
           "a redis: L3's ACL user for AUTH (empty: the default user)")
      .Add(key("kv.l3_mac_key_file"), &o->l3_mac_key_file,
           "file holding the L3 pages' MAC key (>= 32 bytes; the same on every worker "
           "sharing the L3): pages that do not verify are never read (empty: none)")
      .Add(key("kv.l3_mib"), &o->l3_mib, "bound of a file: L3 store (MiB)")
      .Add(key("kv.l3_queue_mib"), &o->l3_queue_mib,
           "bound of the L3 write-behind queue (MiB of page copies): write-through waits for "
           "room, a write-back beyond it is dropped (swaserve_kv_l3_write_queue_dropped_total)")
      .Add(key("kv.l3_write_through_hits"), &o->l3_write_through_hits,
           "write a prefix-cache node to L3 once it was on this many hits' paths (0: only "
           "write back what leaves L2)")
      .Add(key("kv.l3_write_through_near_bound"), &o->l3_write_through_near_bound,
           "write a prompt through to L3 at once when it is at least this fraction of "
           "prefill.max_prompt_tokens long, so its next, longer turn finds it from the next "
           "bucket's worker (0: off)")
      .Add(key("prefill.l3_prefetch_min_tokens"), &o->l3_prefetch_min_tokens,
           "prefetch a new prompt's pages from L3 when it extends at least this many tokens "
           "past the cached match")
      .Add(key("prefill.l3_prefetch_max_wait_ms"), &o->l3_prefetch_max_wait_ms,
           "least time a request waits for its L3 prefetch before computing without it")
      .Add(key("prefill.l3_prefetch_wait_fraction"), &o->l3_prefetch_wait_fraction,
           "a request waits for its L3 prefetch up to this fraction of the time computing the "
           "tokens it may bring would take (0: l3_prefetch_max_wait_ms alone)")
      .Add(key("prefill.l3_prefetch_assumed_tokens_per_second"),
           &o->l3_prefetch_assumed_tokens_per_second,
           "the prefill rate that wait assumes before the worker measured its own (> 0)")
      .Add(key("prefill.policy"), &o->policy, "compute_aware or fcfs")
      .Add(key("prefill.aging_tokens_per_second"), &o->aging_tokens_per_second,
           "wait-time credit of compute-aware scheduling")
      .Add(key("prefill.fcfs_wait_ratio"), &o->fcfs_wait_ratio,
           "compute_aware: start every request before this x its wait under FCFS (0: no guard)")
      .Add(key("prefill.context_cost_per_token"), &o->context_cost_per_token,
           "work per key of attention context relative to a token (< 0: from the model)")
      .Add(key("prefill.max_partial_requests"), &o->max_partial_requests,
           "prompts that may be half-done at once (a long prompt starts only below this)")
      .Add(key("prefill.chunk_tokens"), &o->chunk_tokens, "most tokens of one request per step")
      .Add(key("prefill.step_token_budget"), &o->step_token_budget, "most tokens per step")
      .Add(key("prefill.max_requests_per_step"), &o->max_requests_per_step, "most requests per step")
      .Add(key("prefill.max_prompt_tokens"), &o->max_prompt_tokens,
           "largest prompt accepted (the length bucket's upper bound; 0: any that fits)")
      .Add(key("prefill.window_restore_min_saved_work"), &o->window_restore_min_saved_work,
           "window restore: recompute only the bounded stretch before a full-KV match when "
           "that saves at least this much work in tokens (< 0: never restore; >= 0 also keeps "
           "the full KV of prompts whose SWA KV is evicted, for restores)")
      .Add(key("prefill.window_restore_pyramid"), &o->window_restore_pyramid,
           "window restore: compute each layer only over the rows later layers need (about "
           "half the work; the restored window is the same)")
      .Add(key("prefill.keep_cancelled_chunks"), &o->keep_cancelled_chunks,
           "a prefill cut short (its caller went away, a forward failed) leaves the chunks it "
           "computed in the prefix cache, so a retry of the prompt resumes there")
      .Add(key("prefill.l3_checkpoint_tokens"), &o->l3_checkpoint_tokens,
           "with --kv.l3: every this many computed prompt tokens, a long prefill writes its "
           "computed KV to L3, so a retry after the worker is killed resumes there (0: off)")
      .Add(key("prefill.cache_pin_max_fraction"), &o->cache_pin_max_fraction,
           "share of the full KV pool that prefixes pinned for clients' cache breakpoints "
           "(Anthropic cache_control) may hold; the pins due soonest give way (0: no pins)")
      .Add(key("prefill.window_restore_from_window_safe"), &o->window_restore_from_window_safe,
           "window restore: start at the window-safe hit itself when it lies inside the "
           "stretch (reading its cached window and the cached full KV) instead of recomputing "
           "from there as an ordinary prefill")
      .Add(key("kv.cold_superseded_windows"), &o->cold_superseded_windows,
           "where windows are restored: when a prompt extends a cached prompt past its end, "
           "that end's SWA window is evicted before any window still at a prompt's end")
      .Add(key("prefill.swa_checkpoint_tokens"), &o->swa_checkpoint_tokens,
           "keep the SWA window every this many prompt tokens in the prefix cache (cold: "
           "evicted first), so prompts diverging mid-way hit at most this far back (0: off)")
      .Add(key("prefill.swa_checkpoints_yield"), &o->swa_checkpoints_yield,
           "when the SWA pool is short, a running prompt's own checkpoint windows give way "
           "after the cache's cold windows and before its hot ones (false: hot windows go first)")
      .Add(key("decode.max_batch_size"), &o->max_batch_size, "most requests per decode iteration")
      .Add(key("decode.mtp_draft_tokens"), &o->mtp_draft_tokens,
           "MTP draft tokens per decode step: -1 one per MTP layer of the model, 0 no "
           "speculation (a request may ask for fewer: speculative_tokens)")
      .Add(key("decode.mtp_adaptive"), &o->mtp_adaptive,
           "adapt each request's draft length to its measured acceptance (drafting stops "
           "where it does not pay, e.g. on random text)")
      .Add(key("decode.mtp_draft_cost"), &o->mtp_draft_cost,
           "cost of one more draft token relative to a plain decode step, for the adaptive "
           "choice until the worker has measured it from its step times "
           "(swaserve_decode_mtp_draft_cost)")
      .Add(key("decode.mtp_draft_vocab_tokens"), &o->mtp_draft_vocab_tokens,
           "drafts come from the this-many tokens the worker has emitted most, so a draft "
           "reads that share of lm_head; output unchanged (-1: a quarter of the vocabulary "
           "when it has at least 32K tokens, else all; 0: all) "
           "(swaserve_decode_mtp_draft_vocab_tokens)")
      .Add(key("decode.default_max_tokens"), &o->default_max_tokens, "max_tokens when a request has 0")
      .Add(key("decode.max_max_tokens"), &o->max_max_tokens, "largest max_tokens accepted")
      .Add(key("decode.commit_timeout"), &o->commit_timeout,
           "bound on one KV transfer, from the prefill worker asking for staging (it is "
           "about to ship) to the commit; the wait for the prefill leg before that is bounded "
           "by the router keeping the stream open, not by a timer")
      .Add(key("decode.staging_budget_mib"), &o->staging_budget_mib,
           "host memory (MiB) all staged requests may hold at once, arena and heap together; "
           "past it prefill workers ready to ship wait in line "
           "(swaserve_decode_staging_budget_bytes)")
      .Add(key("decode.staging_arena_mib"), &o->staging_arena_mib,
           "host memory (MiB) for staged KV, allocated once by UCX at start-up (shared memory: "
           "single-copy puts from prefill workers on this host); requests that do not fit are "
           "staged in heap memory; 0: always heap. Blocks of failed transfers stay unused for "
           "--transfer.timeout")
      .Add(key("transfer.timeout"), &o->transfer_timeout, "deadline of one KV transfer")
      .Add(key("transfer.ucx_tls"), &o->ucx_tls, "UCX transports (UCX_TLS syntax; empty: default)")
      .Add(key("drain"), &o->drain, "how long in-flight calls may finish on SIGTERM")
      .Add(key("drain_handback"), &o->drain_handback,
           "this long before the drain deadline a prefill worker ends the prefills still "
           "computing itself, puts what they computed in L3 and answers DRAINING once it is "
           "stored, so the router's retry elsewhere resumes from there (0: off)")
      .Add(key("redis"), &o->redis, "Redis host:port for cluster membership (empty: standalone)")
      .Add(key("redis_password_file"), &o->redis_password_file,
           "file holding the Redis password (AUTH on every connection; re-read on reconnect; "
           "empty: none, or the one in a redis:// address)")
      .Add(key("redis_username"), &o->redis_username,
           "Redis ACL user for AUTH (empty: the default user)")
      .Add(key("cluster"), &o->cluster, "cluster name (Redis key prefix)")
      .Add(key("advertise_host"), &o->advertise_host, "host other processes reach this worker at")
      .Add(key("model_name"), &o->model_name, "served model name (registry record)")
      .Add(key("bucket"), &o->bucket, "length bucket index of this prefill worker")
      .Add(key("bucket_min_tokens"), &o->bucket_min_tokens,
           "smallest prompt of this worker's bucket (the largest is prefill.max_prompt_tokens)");
}

std::vector<std::string> WorkerFlags(WorkerOptions o) {
  WorkerOptions defaults;
  base::Config config("worker", "");
  AddWorkerFlags(&config, &defaults);  // records the defaults
  defaults = std::move(o);             // the values to render
  return config.ChangedFlags();
}

absl::Status FinishWorkerOptions(WorkerOptions* o) {
  if (!HasPrefill(*o) && !HasDecode(*o)) {
    return absl::InvalidArgumentError("--role must be prefill, decode or both, got " + o->role);
  }
  if (o->model.empty()) return absl::InvalidArgumentError("--model is required");
  if (o->l2_ratio < 0 || o->l2_ratio > 1024 || o->l2_swa_full_ratio < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--kv.l2_ratio must be between 0 (no L2) and 1024 and --kv.l2_swa_full_ratio >= 0, got ",
        o->l2_ratio, " and ", o->l2_swa_full_ratio));
  }
  if (!o->l3.empty()) {
    const bool file = absl::StartsWith(o->l3, "file:") && o->l3.size() > 5;
    const bool redis = absl::StartsWith(o->l3, "redis:") && o->l3.size() > 6;
    if (!file && !redis) {
      return absl::InvalidArgumentError(
          "--kv.l3 must be file:<dir> or redis:<host:port>, got " + o->l3);
    }
    if (o->l2_ratio <= 0) {
      return absl::InvalidArgumentError("--kv.l3 needs an L2 tier (--kv.l2_ratio > 0)");
    }
    if (o->l3_mib <= 0 || o->l3_queue_mib <= 0 || o->l3_write_through_hits < 0 || o->l3_prefetch_min_tokens < 0 ||
        o->l3_prefetch_max_wait_ms < 0 || !(o->l3_prefetch_wait_fraction >= 0) ||
        !(o->l3_prefetch_assumed_tokens_per_second > 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--kv.l3_mib, --kv.l3_queue_mib and --prefill.l3_prefetch_assumed_tokens_per_second "
          "must be > 0 and "
          "--kv.l3_write_through_hits, --prefill.l3_prefetch_min_tokens, "
          "--prefill.l3_prefetch_max_wait_ms, --prefill.l3_prefetch_wait_fraction >= 0, got ",
          o->l3_mib, ", ", o->l3_queue_mib, ", ", o->l3_prefetch_assumed_tokens_per_second, ", ",
          o->l3_write_through_hits, ", ", o->l3_prefetch_min_tokens, ", ",
          o->l3_prefetch_max_wait_ms, ", ", o->l3_prefetch_wait_fraction));
    }
  }
  if (!(o->l3_write_through_near_bound >= 0 && o->l3_write_through_near_bound <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--kv.l3_write_through_near_bound must be in [0, 1] (a fraction of "
        "--prefill.max_prompt_tokens), got ",
        o->l3_write_through_near_bound));
  }
  if (!(o->cache_pin_max_fraction >= 0 && o->cache_pin_max_fraction <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--prefill.cache_pin_max_fraction must be between 0 and 1, got ",
        o->cache_pin_max_fraction));
  }
  if (o->l3_checkpoint_tokens < 0 || o->l3_checkpoint_tokens > (1 << 30)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--prefill.l3_checkpoint_tokens must be between 0 (off) and 2^30, got ",
        o->l3_checkpoint_tokens));
  }
  if (o->swa_checkpoint_tokens < 0 || o->swa_checkpoint_tokens > (1 << 30)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--prefill.swa_checkpoint_tokens must be between 0 (off) and 2^30, got ",
        o->swa_checkpoint_tokens));
  }
  if (o->policy != "compute_aware" && o->policy != "fcfs") {
    return absl::InvalidArgumentError("--prefill.policy must be compute_aware or fcfs, got " +
                                      o->policy);
  }
  if (o->mtp_draft_vocab_tokens < -1 || o->mtp_draft_vocab_tokens > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--decode.mtp_draft_vocab_tokens must be >= -1, got ", o->mtp_draft_vocab_tokens));
  }
  if (o->mtp_draft_tokens < -1 || o->mtp_draft_cost < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--decode.mtp_draft_tokens must be >= -1 and --decode.mtp_draft_cost >= 0, got ",
        o->mtp_draft_tokens, " and ", o->mtp_draft_cost));
  }
  if (o->staging_arena_mib < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--decode.staging_arena_mib must be >= 0, got ", o->staging_arena_mib));
  }
  if (o->staging_budget_mib <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--decode.staging_budget_mib must be > 0, got ", o->staging_budget_mib));
  }
  return absl::OkStatus();
}

int64_t PrefillSwaWorkingTokens(const WorkerOptions& o, const kv::KvShape& shape) {
  return o.chunk_tokens + shape.sliding_window + shape.page_size;
}

absl::Status CheckPrefillPoolHoldsBucket(const WorkerOptions& o, const kv::KvShape& shape) {
  if (!HasPrefill(o) || o.max_prompt_tokens <= 0) return absl::OkStatus();
  absl::StatusOr<kv::PoolSizes> sizes =
      kv::SizePools(shape, o.prefill_kv_mib << 20, o.swa_full_ratio);
  if (!sizes.ok()) return sizes.status();
  const int64_t holds = sizes->full_pages * shape.page_size;
  const int64_t swa_holds = sizes->swa_pages * shape.page_size;
  const int64_t swa_need = PrefillSwaWorkingTokens(o, shape);
  if (holds >= o.max_prompt_tokens && swa_holds >= swa_need) return absl::OkStatus();
  absl::StatusOr<int64_t> need =
      kv::MinBudgetForFullTokens(shape, o.max_prompt_tokens, o.swa_full_ratio, swa_need);
  if (!need.ok()) return need.status();
  return absl::FailedPreconditionError(absl::StrCat(
      "--prefill.max_prompt_tokens=", o.max_prompt_tokens, " does not fit this worker's KV pool: ",
      "--kv.prefill_mib=", o.prefill_kv_mib, " holds ", holds, " tokens of this model and ",
      swa_holds, " SWA tokens (a step needs ", swa_need, "; --kv.swa_full_ratio=",
      o.swa_full_ratio, "), so prompts above that would be refused; give it --kv.prefill_mib=",
      *need >> 20, " or more, or a smaller bucket"));
}

int L3WriteThroughFromTokens(const WorkerOptions& o) {
  if (o.l3.empty() || o.max_prompt_tokens <= 0 || !(o.l3_write_through_near_bound > 0)) return 0;
  return static_cast<int>(std::min<double>(
      std::ceil(o.l3_write_through_near_bound * static_cast<double>(o.max_prompt_tokens)),
      std::numeric_limits<int>::max()));
}

}  // namespace swaserve::worker
