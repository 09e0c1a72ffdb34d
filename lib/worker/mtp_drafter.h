// MTP speculative decoding in the decode loop (issue 19): per-request state
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
// E(k) = 1 + Σ_{i<=k} Π_{l<=i} a_l; the step costs about 1 + draft_cost · k
// decode steps; k maximises E(k) / (1 + draft_cost · k). When that is 0 the
// request decodes plainly and probes with one draft every probe_interval
// steps, the interval doubling after each rejected probe (up to
// max_probe_interval), so random text costs next to nothing.
//
// Thread-safety: none; the decode loop thread owns the states and calls
// RunDraftStep.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
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
  // row) relative to a plain decode step, for the adaptive choice. Default
  // 0.1 (measured with the demo model on the 2-core dev VM: bench/RESULTS.md).
  double draft_cost = 0.1;
  // Weight of the newest observation in the acceptance averages. Default 0.2.
  double ema_weight = 0.2;
  // Acceptance a new request starts from at every position. Default 0.6.
  double initial_acceptance = 0.6;
  // Plain steps between probes once drafting stopped paying, and the cap of
  // its doubling. Defaults 8 and 256.
  int probe_interval = 8;
  int max_probe_interval = 256;
  // Main hidden rows kept while not drafting: a restart recomputes the MTP
  // layers over this many positions. Default 8 (at least the MTP layers).
  int resume_tokens = 8;
};

// SWA tokens a decode sequence must keep behind its window (kv::
// SequenceOptions::swa_slack) so that MTP steps and rollbacks find their KV.
int MtpSwaSlack(const MtpOptions& options, int mtp_layers);

// One request's MTP state. Create with the model's layer count (> 0).
class MtpState {
 public:
  MtpState(const MtpOptions& options, int layers, int hidden_size, int request_cap);

  // (Re)starts at committed length m + 1 (tokens t_0..t_m) from the main
  // hidden states of positions [m − rows, m), rows · hidden_size floats.
  void Reset(int m, absl::Span<const float> rows);
  // Main hidden rows of newly committed positions from `first` on.
  void AddMainRows(int first, absl::Span<const float> rows);
  // After a preemption: the MTP layers' KV is gone; drafting resumes once
  // resume_tokens new rows arrived.
  void Pause();

  // Draft length for the next step of a request with committed length
  // m + 1 (0: plain decode step). Restarts the state when it resumes.
  int ChooseDraftLength(int m);
  // What the step's verification found: `drafted` drafts, the first
  // `accepted` of them accepted.
  void Observe(int drafted, int accepted);

  bool active() const { return active_; }
  int layers() const { return layers_; }
  int frontier(int layer) const { return frontier_[layer]; }
  double acceptance(int position) const { return accept_[position]; }

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
  absl::Status Run(absl::Span<DraftWork* const> work);

 private:
  EngineLock* engine_;
  std::vector<model::ForwardItem> items_;
  std::vector<std::vector<uint32_t>> tokens_;
  std::vector<std::vector<float>> inputs_;  // per work: this layer's inputs
  std::vector<float> hidden_;
  model::ForwardOutput out_;
};

}  // namespace swaserve::worker
