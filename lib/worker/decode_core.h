// The decode worker's engine loop (docs/architecture.md#request-path step 4), without gRPC:
// staged requests wait with their prompt KV in host memory (KvStaging) and
// are admitted into the running batch, oldest first, when the pools can take
// their pages (the staged bytes are copied into pool pages only then);
// continuous batching with iteration-level scheduling runs one Forward over
// one new token of every running request per iteration; stop conditions end
// requests; cancellation frees everything; when the pools run out mid-
// generation the most recently admitted request is preempted: its pages are
// freed and it is re-queued at the head of the waiting queue, to be
// recomputed (prompt + generated tokens) when pages free up. The recompute
// runs in the batch, one recompute_chunk per iteration riding in the same
// ragged Forward as the other requests' decode tokens (so a preemption
// does not stall the batch); admission only checks that its pages fit.
// Batch-invariant kernels make the recomputed KV, and so the continuation,
// identical to an uninterrupted run. The policy (admission order, the batch,
// the preemption victim) is sched::DecodeScheduler's, which also exports the
// swaserve_sched_*{role="decode"} metrics; this loop owns the requests, the
// KV and the engine calls.
//
// Threading: one internal thread runs the loop and owns the engine calls,
// the pools and every sequence. Submit/Cancel/GetLoad are thread-safe. Token
// sinks run on the loop thread and must not block (queue and return).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "lib/kv/page_pool.h"
#include "lib/metrics/registry.h"
#include "lib/model/forward.h"
#include "lib/model/sampling.h"
#include "lib/model/tokenizer.h"
#include "lib/worker/engine_lock.h"
#include "lib/worker/kv_staging.h"
#include "lib/worker/mtp_drafter.h"
#include "lib/worker/stop_checker.h"

namespace swaserve::worker {

enum class FinishReason { kNone, kStop, kLength, kCancelled, kError };

// What a request's sink receives: new tokens, and on the last event the
// finish reason (kError: `error` says why).
struct TokenEvent {
  std::vector<model::SampledToken> tokens;
  FinishReason finish = FinishReason::kNone;
  absl::Status error;
  int prompt_tokens = 0;
  int generated_tokens = 0;  // so far, including these
  int cached_tokens = 0;     // as reported by prefill
  // MTP draft tokens so far, proposed and accepted (including these).
  int draft_tokens = 0;
  int accepted_draft_tokens = 0;
};
using TokenSink = std::function<void(const TokenEvent&)>;

struct DecodeJob {
  std::string id;
  std::vector<uint32_t> prompt;
  model::SamplingOptions sampling;
  StopOptions stop;
  // Sampled by prefill: the token at position prompt.size().
  model::SampledToken first_token;
  // The prompt's KV (layout for prompt.size() tokens), committed.
  std::unique_ptr<KvStaging> staging;
  // Main hidden states of the last min(prompt, MTP layers) prompt positions
  // (rows × hidden_size floats, PrefillResult::tail_hidden): where the MTP
  // layers start. Empty: the request decodes without MTP until it has them.
  std::vector<float> tail_hidden;
  int cached_tokens = 0;
  TokenSink sink;
};

struct DecodeCoreOptions {
  // Not owned; must outlive the core. `engine` is shared through the lock
  // (monolithic mode runs a prefill core on the same engine).
  EngineLock* engine = nullptr;
  kv::KvPools* pools = nullptr;
  // For stop strings; may be null.
  const model::Tokenizer* tokenizer = nullptr;
  // Requests in the batch at most. The verify logits for that many
  // requests (max_batch_size × (draft tokens + 1) rows of the vocabulary,
  // f32) are allocated at Create, so the worker's memory does not creep up
  // as it meets larger batches (tests/e2e's leak check reads it).
  int max_batch_size = 32;
  // Tokens of a preempted request's recompute per decode iteration.
  int recompute_chunk = 512;
  // MTP speculative decoding (mtp_drafter.h); used when the model has MTP
  // layers. The staged KV's SWA part must then start num MTP layers tokens
  // earlier than the window needs (the first draft step rewrites those
  // positions): KvReceiverOptions::mtp_lookback.
  MtpOptions mtp;
  // Optional: swaserve_decode_* metrics.
  metrics::Registry* registry = nullptr;
  // For tests: called on the loop thread with a request's sequence, its
  // tokens (prompt + generated) and its MTP state (null without) just
  // before its KV is released.
  std::function<void(const std::string& id, const kv::Sequence& seq,
                     absl::Span<const uint32_t> tokens, const MtpState* mtp)>
      inspect_kv;
};

struct DecodeLoad {
  int staged = 0;   // waiting for admission (incl. preempted)
  int running = 0;  // in the batch
  int64_t admitted_total = 0;
  int64_t preempted_total = 0;
  int64_t finished_total = 0;
  // Recompute chunks of preempted requests run, and how many of them rode
  // in a forward that also decoded other requests' tokens (the batch kept
  // moving while the recompute ran).
  int64_t recompute_chunks_total = 0;
  int64_t recompute_chunks_with_decode_total = 0;
  // MTP: verify steps (a request's forward with drafts), drafts, accepted.
  int64_t mtp_steps_total = 0;
  int64_t mtp_drafted_total = 0;
  int64_t mtp_accepted_total = 0;
  // Draft vocabulary (MtpOptions::draft_vocab_tokens): heads built, and the
  // tokens of the one in use (0: drafts over the whole vocabulary).
  int64_t mtp_draft_vocab_builds_total = 0;
  int mtp_draft_vocab_tokens = 0;
};

class DecodeCore {
 public:
  static absl::StatusOr<std::unique_ptr<DecodeCore>> Create(const DecodeCoreOptions& options);
  // Stops the loop; requests still staged or running end with kCancelled.
  ~DecodeCore();
  DecodeCore(const DecodeCore&) = delete;
  DecodeCore& operator=(const DecodeCore&) = delete;

  // Queues a committed request. InvalidArgument for a malformed job (no
  // sink, staging not matching the prompt, bad sampling or stop options),
  // FailedPrecondition after Stop, AlreadyExists for a duplicate id. The
  // sink then receives the first token once the request is admitted.
  absl::Status Submit(DecodeJob job);
  // Several jobs queued at once (all or none), so that the loop sees them in
  // one iteration, in this order.
  absl::Status SubmitAll(std::vector<DecodeJob> jobs);
  // Ends the request with kCancelled (staged or running); no-op if unknown.
  void Cancel(const std::string& id);
  DecodeLoad GetLoad() const;
  // Ends every request with kCancelled and joins the loop. Idempotent.
  void Stop();

  struct Impl;

 private:
  explicit DecodeCore(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace swaserve::worker
