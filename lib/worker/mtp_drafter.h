// MTP speculative decoding in the decode loop: per-request state
// of the model's chained MTP layers, the batched draft step, and the
// adaptive choice of how many tokens to draft.
//
// Positions and layers. Main position p holds token t_p; the main model at p
// gives hidden h_p, whose logits predict t_{p+1}. MTP layer j at position p
// reads (t_{p+j+1}, the hidden of layer j−1 at p — h_p for j = 0), writes its
// KV at p (SWA pool layer num_swa_layers + j) and predicts t_{p+j+2}; this is
// how the layers were trained (teacher-forced) and how prefill runs them
// over a prompt (lib/worker/prefill_core.cc RunMtp).
//
// One draft step of a request whose committed tokens are t_0..t_m (main KV
// through m − 1, t_m sampled and not yet fed) and that drafts k tokens: every
// layer j runs over positions [f_j, e_j] in one ForwardMtp of the batch,
// where f_j is the layer's frontier (its KV is exact below it) and
//   e_j = m − 1       for j < k: the last row's logits draft d_{j+1}, the
//                     token at m + j + 1; positions p > m − j − 1 read drafts
//                     d_1..d_j for their unknown tokens (provisional KV,
//                     rewritten next step);
//   e_j = m − j − 1   for j >= k: true tokens only, no logits (catch-up).
// Then f_j = m − j. The main model verifies t_m, d_1..d_k in one forward;
// the accepted prefix's main hidden states feed layer 0 next step
// (AddMainRows). So every MTP layer's KV below its frontier equals a
// teacher-forced run over the final tokens — bit for bit, with the
// batch-invariant kernels — and a rejected draft leaves nothing behind that a
// later step reads: the main KV is rolled back (kv::Sequence::Rollback) and
// the MTP layers' provisional positions are recomputed.
//
// Starting point: prefill ships the main hidden states of the last
// min(n, num MTP layers) prompt positions (PrefillResult::tail_hidden) and
// the SWA KV from that many tokens earlier; Reset() starts every frontier
// there (rewriting positions prefill already wrote, with identical values).
// A request that stops drafting for long (adaptive drafting off, or a
// preemption, whose recompute does not run the MTP layers) keeps only the
// last resume_tokens main hidden rows and restarts from them: MTP KV before
// that point is then not rewritten (it only affects the quality of drafts
// whose window reaches back there, never the output).
//
// Adaptive drafting. Per request, an exponential moving average of the
// conditional acceptance at each draft position (a_i: draft i accepted given
// drafts 1..i−1 were) gives the expected tokens per step
// E(k) = 1 + Σ_{i<=k} Π_{l<=i} a_l; the step costs 1 + C(k) plain steps, C
// measured on this machine (MtpCostModel); k maximises E(k) / (1 + C(k)). When that is 0 the
// request decodes plainly and probes every probe_interval steps with the
// draft length that looks best, the interval doubling after each rejected
// probe (up to max_probe_interval), so random text costs next to nothing.
// Now and then the cost model asks for a step in which every request drafts
// its best length (MtpCostModel::TakeDraftStep), so that a cost measured too
// high once (a noisy machine) is measured again instead of stopping
// drafting for good.
//
// Thread-safety: none; the decode loop thread owns the states and calls
// RunDraftStep.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "lib/kv/sequence.h"
#include "lib/model/forward.h"
#include "lib/model/sampling.h"
#include "lib/worker/engine_lock.h"

namespace swaserve::worker {

struct MtpOptions {
  // Draft tokens per step: -1 uses the model's num_nextn_predict_layers
  // (one per MTP layer), 0 turns MTP speculation off; capped at the number
  // of MTP layers. A request may ask for fewer (SamplingOptions::
  // speculative_tokens). Default -1.
  int draft_tokens = -1;
  // Adapt each request's draft length to its measured acceptance. Default on.
  bool adaptive = true;
  // Cost of one more draft token (an MTP layer step plus one more verified
  // row) relative to a plain decode step, for the adaptive choice, where the
  // worker has not measured it yet (MtpCostModel). Default 0.3.
  double draft_cost = 0.3;
  // Measure the draft cost on this machine from step times (MtpCostModel);
  // off: draft_cost stays fixed. Default on.
  bool measure_cost = true;
  // Weight of the newest observation in the acceptance averages. Default 0.2.
  double ema_weight = 0.2;
  // Acceptance the worker's first requests start from at every position;
  // later ones start from the worker's running average over requests
  // (MtpState::Prior), so a workload where drafts fail stops drafting from
  // the first step. Default 0.6.
  double initial_acceptance = 0.6;
  // Plain steps between probes once drafting stopped paying, and the cap of
  // its doubling. Defaults 8 and 256.
  int probe_interval = 8;
  int max_probe_interval = 256;
  // Main hidden rows kept while not drafting: a restart recomputes the MTP
  // layers over this many positions. Default 8 (at least the MTP layers).
  int resume_tokens = 8;
  // Draft vocabulary (DraftVocabulary, model::DraftHead): drafts come from
  // the this-many tokens the worker has emitted most, so each drafting MTP
  // layer reads that share of lm_head instead of all of it; the output is
  // unchanged (the main model verifies against the whole vocabulary). -1:
  // a quarter of the vocabulary for a vocabulary of at least 32K tokens
  // (there lm_head is most of a drafting MTP layer's weights: MiMo-V2's
  // 152K × 4096), the whole vocabulary below; 0, or at least the
  // vocabulary: the whole vocabulary. Default -1.
  int draft_vocab_tokens = -1;
  // Emitted tokens before the first draft vocabulary is built (until then
  // drafts use the whole vocabulary); it is rebuilt each time the count
  // doubles, then every max_draft_vocab_interval tokens. Defaults 2048 and
  // 2^20.
  int64_t draft_vocab_first_tokens = 2048;
  int64_t max_draft_vocab_interval = int64_t{1} << 20;
};

// The token set of the draft head (MtpOptions::draft_vocab_tokens), learnt
// from what the worker emits: counts each emitted token; when due, the most
// emitted `size` tokens (ties: the lower id) become the head, and every
// count halves (a decayed count: each interval between builds weighs twice
// the one before, so the head follows a shift in traffic within about two
// intervals). Building one
// copies size / vocab of lm_head on the caller's thread (the decode loop:
// ~1 ms for the demo model; ~100 ms for a 152K-token vocabulary at hidden
// 4096 in bf16, at most once per max interval once warm).
class DraftVocabulary {
 public:
  // `size` in [1, vocab_size).
  DraftVocabulary(int vocab_size, int size, int64_t first_tokens, int64_t max_interval);
  void Observe(uint32_t token);
  // When due, builds the head over the current counts (in the same memory
  // as the last one); true when it changed. FillDraftHead's errors.
  absl::StatusOr<bool> MaybeRebuild(const model::Engine& engine);
  // Null until the first build.
  const model::DraftHead* head() const { return head_.get(); }
  int size() const { return size_; }
  int64_t builds() const { return builds_; }

 private:
  std::vector<int64_t> counts_;
  const int size_;
  const int64_t max_interval_;
  int64_t seen_ = 0;
  int64_t next_build_;
  int64_t builds_ = 0;
  std::unique_ptr<model::DraftHead> head_;  // refilled in place
  std::vector<int32_t> order_;              // scratch: every id, ranked
  std::vector<int32_t> top_;                // scratch: the set, ascending
};

// The draft vocabulary size `options` asks for with a `vocab_size` model: 0
// when drafts should use the whole vocabulary.
int DraftVocabularySize(const MtpOptions& options, int vocab_size);

// SWA tokens a decode sequence must keep behind its window (kv::
// SequenceOptions::swa_slack) so that MTP steps and rollbacks find their KV.
int MtpSwaSlack(const MtpOptions& options, int mtp_layers);

class MtpCostModel;

// One request's MTP state. Create with the model's layer count (> 0).
class MtpState {
 public:
  // `prior`: per-position acceptance to start from (empty: the options'
  // initial_acceptance); `probe_interval` (0: the options'): where the probe
  // interval starts (a worker passes its last requests', so that on a
  // workload where drafts fail new requests do not probe often either).
  MtpState(const MtpOptions& options, int layers, int hidden_size, int request_cap,
           absl::Span<const double> prior = {}, int probe_interval = 0);

  // (Re)starts at committed length m + 1 (tokens t_0..t_m) from the main
  // hidden states of positions [m − rows, m), rows · hidden_size floats.
  void Reset(int m, absl::Span<const float> rows);
  // Main hidden rows of newly committed positions from `first` on.
  void AddMainRows(int first, absl::Span<const float> rows);
  // After a preemption: the MTP layers' KV is gone; drafting resumes once
  // resume_tokens new rows arrived.
  void Pause();

  // Draft length for the next step of a request with committed length
  // m + 1 (0: plain decode step) in a batch of `batch`, drafting k costing
  // cost.StepCost(batch, k) plain steps. `measure`: the cost model's
  // measuring step (TakeDraftStep): the best k >= 1 even where drafting
  // does not look like it pays. Restarts the state when it resumes.
  int ChooseDraftLength(int m, const MtpCostModel& cost, int batch, bool measure = false);
  // The most draft tokens this request takes (0: it never drafts).
  int cap() const { return cap_; }
  // What the step's verification found: `drafted` drafts, the first
  // `accepted` of them accepted.
  void Observe(int drafted, int accepted);

  bool active() const { return active_; }
  int steps() const { return steps_; }  // verify steps observed
  int probe_interval() const { return probe_interval_; }
  int layers() const { return layers_; }
  int frontier(int layer) const { return frontier_[layer]; }
  double acceptance(int position) const { return accept_[position]; }
  absl::Span<const double> acceptances() const { return accept_; }

 private:
  friend class MtpDrafter;
  const MtpOptions options_;
  const int layers_;
  const int hidden_;
  const int cap_;  // this request's most draft tokens
  bool active_ = false;
  // Main rows of the positions before `rows_end_` (while active: from
  // frontier_[0]; while paused: the last resume_tokens).
  int rows_end_ = 0;
  std::vector<int> frontier_;
  // pending_[j]: layer j's input rows for positions [frontier_[j],
  // frontier_[j-1]) (j > 0; layer j−1's outputs) or [frontier_[0],
  // rows_end_) (j = 0; main hidden states).
  std::vector<std::vector<float>> pending_;
  std::vector<double> accept_;
  int plain_steps_ = 0;
  int probe_interval_ = 0;
  bool probing_ = false;
  int steps_ = 0;
};

// What drafting costs, measured from the decode loop's step times, per
// batch-size bucket (powers of two): the mean time of steps without drafts,
// T0(B); a step of B requests in which all R requests that can draft drafted
// about k tokens each, taking T, gives the extra cost of one request drafting
// k as (T / T0(B) − 1) · B / R plain request-steps. Averaged per (bucket, k):
// it covers the MTP layers (their catch-up included), the extra verified
// rows and the MoE experts those touch, on this machine, for this batch size
// — no linear model. An unmeasured k costs initial_cost · k.
//
// Only steps in which every request that can draft drafted are measured. A
// step costs a fixed part (the MTP layers' and lm_head's weights are read
// once for the whole batch: on a CPU, or a GPU at small batches, most of a
// draft's cost) plus a part per drafting request; a step in which one
// request of 16 probes carries the whole fixed part alone, so dividing by R
// charged it up to 16 times over (2026-12-04: every request of a batch of 16
// then measured 1.4–1.8 plain steps per draft where all drafting costs 0.36,
// and stopped drafting: 1.0× where fixed drafting gave 1.86×). The decision
// (MtpState::ChooseDraftLength) is then per request against the cost when
// all draft, which is the case where drafting pays. Measuring steps
// (TakeDraftStep) keep those costs current.
//
// The loop runs a plain step now and then to keep T0 current
// (WantPlainStep).
class MtpCostModel {
 public:
  static constexpr int kMaxDraft = 8;
  MtpCostModel(double initial_cost, bool measure) : initial_(initial_cost), measure_(measure) {}
  // True when the next step of `batch` requests should run without drafts:
  // every 4th step until this bucket has 3 plain steps, then every 32nd.
  bool WantPlainStep(int batch) const;
  // True (once, then the count restarts) when the next step of `batch`
  // requests should be a measuring step, every request drafting its best
  // length: when this bucket has known T0 for 64 steps without a measured
  // draft step.
  bool TakeDraftStep(int batch);
  // A finished step: `drafted` drafts by `drafting` of `batch` requests, of
  // which `can_draft` could (recompute steps excluded by the caller).
  void Observe(int batch, double seconds, int drafted, int drafting, int can_draft);
  // Extra cost of one request drafting k tokens, in plain request-steps.
  double StepCost(int batch, int k) const;

 private:
  static int Bucket(int batch);
  struct PerBatch {
    double plain_seconds = 0;
    int plain_steps = 0;
    int since_plain = 0;
    int since_measured = 0;
    double cost[kMaxDraft + 1] = {};
    int cost_n[kMaxDraft + 1] = {};
  };
  PerBatch b_[12];
  double initial_;
  bool measure_;
};

// One request's part of a draft step.
struct DraftWork {
  MtpState* state = nullptr;
  kv::Sequence* seq = nullptr;
  // Committed tokens t_0..t_m.
  absl::Span<const uint32_t> tokens;
  // Drafts wanted (1..state->layers()).
  int k = 0;
  model::Sampler* sampler = nullptr;
  // Out: d_1..d_k and the draft distributions they were drawn from.
  std::vector<uint32_t> drafts;
  std::vector<model::TokenDistribution> q;
};

// Runs the MTP layers for a batch of draft steps: one ForwardMtp per layer
// over every request that needs it. Not reentrant (owns scratch).
class MtpDrafter {
 public:
  // `engine` is not owned and must outlive the drafter.
  explicit MtpDrafter(EngineLock* engine) : engine_(engine) {}
  // Allocates the logits for `max_requests` drafts per layer at once, so
  // that the drafter's memory does not grow with the batches it meets.
  void Reserve(int max_requests);
  // `head`: the draft vocabulary (null: the whole vocabulary).
  absl::Status Run(absl::Span<DraftWork* const> work, const model::DraftHead* head = nullptr);

 private:
  EngineLock* engine_;
  std::vector<model::ForwardItem> items_;
  std::vector<std::vector<uint32_t>> tokens_;
  std::vector<std::vector<float>> inputs_;  // per work: this layer's inputs
  std::vector<float> hidden_;
  model::ForwardOutput out_;
};

}  // namespace swaserve::worker
