#include "lib/worker/mtp_drafter.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "lib/base/status.h"

namespace swaserve::worker {

int MtpSwaSlack(const MtpOptions& options, int mtp_layers) {
  if (mtp_layers <= 0) return 0;
  return std::max(options.resume_tokens, mtp_layers) + mtp_layers + 1;
}

MtpState::MtpState(const MtpOptions& options, int layers, int hidden_size, int request_cap,
                   absl::Span<const double> prior, int probe_interval)
    : options_(options),
      layers_(layers),
      hidden_(hidden_size),
      cap_(std::clamp(request_cap, 0, layers)),
      frontier_(layers, 0),
      pending_(layers),
      accept_(layers, options.initial_acceptance),
      probe_interval_(std::clamp(probe_interval > 0 ? probe_interval : options.probe_interval, 1,
                                 std::max(1, options.max_probe_interval))) {
  if (prior.size() == accept_.size()) accept_.assign(prior.begin(), prior.end());
}

void MtpState::Reset(int m, absl::Span<const float> rows) {
  const int n = static_cast<int>(rows.size()) / hidden_;
  for (int j = 0; j < layers_; ++j) {
    frontier_[j] = m - n;
    pending_[j].clear();
  }
  pending_[0].assign(rows.begin(), rows.end());
  rows_end_ = m;
  active_ = n > 0;
}

void MtpState::AddMainRows(int first, absl::Span<const float> rows) {
  if (first != rows_end_) {
    // A gap (a bug upstream, or rows skipped): restart later from new rows.
    pending_[0].clear();
    active_ = false;
  }
  std::vector<float>& p = pending_[0];
  p.insert(p.end(), rows.begin(), rows.end());
  rows_end_ = first + static_cast<int>(rows.size()) / hidden_;
  // Not drafting, or lagging far behind: keep only what a restart reads.
  const size_t keep = static_cast<size_t>(std::max(options_.resume_tokens, layers_)) * hidden_;
  const size_t lag_cap = keep + static_cast<size_t>(layers_ + 1) * hidden_;
  if (!active_ || p.size() > lag_cap) {
    active_ = false;
    if (p.size() > keep) p.erase(p.begin(), p.end() - static_cast<long>(keep));
  }
}

void MtpState::Pause() {
  active_ = false;
  for (auto& p : pending_) p.clear();
  rows_end_ = -1;  // the next AddMainRows starts afresh
}

int MtpCostModel::Bucket(int batch) {
  int b = 0;
  while (b + 1 < 12 && (1 << (b + 1)) <= batch) ++b;
  return b;
}

bool MtpCostModel::WantPlainStep(int batch) const {
  if (!measure_) return false;
  const PerBatch& p = b_[Bucket(batch)];
  return p.plain_steps < 3 ? p.since_plain >= 4 : p.since_plain >= 32;
}

bool MtpCostModel::TakeDraftStep(int batch) {
  if (!measure_) return false;
  PerBatch& p = b_[Bucket(batch)];
  if (p.plain_steps < 3 || p.since_measured < 64) return false;
  p.since_measured = 0;
  return true;
}

void MtpCostModel::Observe(int batch, double seconds, int drafted, int drafting, int can_draft) {
  if (!measure_ || batch <= 0 || seconds <= 0) return;
  PerBatch& p = b_[Bucket(batch)];
  if (p.plain_steps >= 3) ++p.since_measured;
  if (drafted == 0) {
    // Plain steps of this bucket: their mean time (recent ones weigh more).
    p.plain_seconds = p.plain_steps == 0 ? seconds : 0.8 * p.plain_seconds + 0.2 * seconds;
    ++p.plain_steps;
    p.since_plain = 0;
    return;
  }
  ++p.since_plain;
  // Only steps where everyone who could draft did (see the class comment).
  if (p.plain_steps < 3 || drafting <= 0 || drafting < can_draft) return;
  p.since_measured = 0;
  const int k = std::clamp(static_cast<int>(std::lround(static_cast<double>(drafted) / drafting)),
                           1, kMaxDraft);
  const double c = std::max(0.0, seconds / p.plain_seconds - 1.0) * batch / drafting;
  p.cost[k] = p.cost_n[k] == 0 ? c : 0.9 * p.cost[k] + 0.1 * c;
  ++p.cost_n[k];
}

double MtpCostModel::StepCost(int batch, int k) const {
  if (k <= 0) return 0;
  k = std::min(k, kMaxDraft);
  const PerBatch& p = b_[Bucket(batch)];
  return p.cost_n[k] > 0 ? p.cost[k] : initial_ * k;
}

int MtpState::ChooseDraftLength(int m, const MtpCostModel& cost, int batch, bool measure) {
  if (cap_ == 0) return 0;
  int k = cap_;
  if (options_.adaptive) {
    // The best k >= 1 and whether it beats a plain step (rate 1).
    double best = 0, e = 1.0, run = 1.0;
    for (int i = 1; i <= cap_; ++i) {
      run *= accept_[i - 1];
      e += run;
      const double rate = e / (1.0 + cost.StepCost(batch, i));
      if (rate > best) {
        best = rate;
        k = i;
      }
    }
    probing_ = false;
    if (best <= 1.0 && !measure) {
      // A probe with the length that looks best, so that its acceptance
      // (and, at batch 1, its cost) is measured again.
      if (++plain_steps_ < probe_interval_) return 0;
      probing_ = true;
    }
  }
  if (!active_) {
    // Restart from the main rows kept while not drafting.
    const int have = static_cast<int>(pending_[0].size()) / hidden_;
    if (rows_end_ != m || have < std::min(layers_, m)) return 0;
    std::vector<float> rows = std::move(pending_[0]);
    Reset(m, rows);
  }
  return k;
}

void MtpState::Observe(int drafted, int accepted) {
  const double w = options_.ema_weight;
  ++steps_;
  for (int i = 0; i < drafted && i <= accepted; ++i) {
    const double x = i < accepted ? 1.0 : 0.0;
    accept_[i] = (1 - w) * accept_[i] + w * x;
  }
  if (probing_) {
    plain_steps_ = 0;
    probe_interval_ = accepted > 0 ? std::max(1, options_.probe_interval)
                                   : std::min(probe_interval_ * 2,
                                              std::max(1, options_.max_probe_interval));
  } else if (drafted > 0) {
    plain_steps_ = 0;
  }
}

int DraftVocabularySize(const MtpOptions& options, int vocab_size) {
  const int n = options.draft_vocab_tokens >= 0 ? options.draft_vocab_tokens
                : vocab_size >= 32768              ? vocab_size / 4
                                                   : 0;
  return n > 0 && n < vocab_size ? n : 0;
}

DraftVocabulary::DraftVocabulary(int vocab_size, int size, int64_t first_tokens,
                                 int64_t max_interval)
    : counts_(std::max(0, vocab_size), 0),
      size_(size),
      max_interval_(std::max<int64_t>(1, max_interval)),
      next_build_(std::max<int64_t>(1, first_tokens)) {}

void DraftVocabulary::Observe(uint32_t token) {
  if (token < counts_.size()) ++counts_[token];
  ++seen_;
}

absl::StatusOr<bool> DraftVocabulary::MaybeRebuild(const model::Engine& engine) {
  if (seen_ < next_build_) return false;
  next_build_ = seen_ + std::min(seen_, max_interval_);
  order_.resize(counts_.size());
  for (size_t i = 0; i < order_.size(); ++i) order_[i] = static_cast<int32_t>(i);
  const size_t n = std::min(order_.size(), static_cast<size_t>(size_));
  std::partial_sort(order_.begin(), order_.begin() + static_cast<long>(n), order_.end(),
                    [&](int32_t a, int32_t b) {
                      return counts_[a] != counts_[b] ? counts_[a] > counts_[b] : a < b;
                    });
  top_.assign(order_.begin(), order_.begin() + static_cast<long>(n));
  std::sort(top_.begin(), top_.end());
  // Older intervals weigh half as much at each build: the set follows what
  // the worker emits now (a shift in traffic takes over within about two
  // intervals; with plain counts, as long as the history it outweighs).
  for (int64_t& c : counts_) c >>= 1;
  if (head_ != nullptr && head_->ids() == top_) return false;
  if (head_ == nullptr) head_ = std::make_unique<model::DraftHead>();
  if (absl::Status st = engine.FillDraftHead(top_, head_.get()); !st.ok()) {
    head_.reset();  // never an empty or half-filled head
    return st;
  }
  ++builds_;
  return true;
}

void MtpDrafter::Reserve(int max_requests) {
  const size_t V = static_cast<size_t>(engine_->config().vocab_size);
  out_.logits.reserve(static_cast<size_t>(std::max(0, max_requests)) * V);
}

absl::Status MtpDrafter::Run(absl::Span<DraftWork* const> work, const model::DraftHead* head) {
  const model::ModelConfig& c = engine_->config();
  const int H = c.hidden_size;
  const int K = c.num_mtp_layers;
  const size_t W = work.size();
  inputs_.resize(W);
  tokens_.resize(W);
  std::vector<int> ends(W), starts(W);
  std::vector<bool> live(W, true);
  for (size_t w = 0; w < W; ++w) {
    DraftWork& d = *work[w];
    MtpState& st = *d.state;
    if (!st.active_ || st.layers_ != K || d.k < 1 || d.k > K || d.tokens.empty()) {
      return absl::InternalError("MTP draft step without an active state or a valid k");
    }
    const int m = static_cast<int>(d.tokens.size()) - 1;
    if (st.rows_end_ != m ||
        static_cast<int>(st.pending_[0].size()) != (m - st.frontier_[0]) * H) {
      return absl::InternalError(absl::StrCat("MTP rows out of step: frontier ", st.frontier_[0],
                                              ", rows to ", st.rows_end_, ", committed ", m));
    }
    d.drafts.clear();
    d.q.clear();
    d.q.resize(d.k);
    inputs_[w] = std::move(st.pending_[0]);
    st.pending_[0].clear();
  }
  for (int j = 0; j < K; ++j) {
    items_.clear();
    hidden_.clear();
    std::vector<size_t> who;
    for (size_t w = 0; w < W; ++w) {
      if (!live[w]) continue;
      DraftWork& d = *work[w];
      MtpState& st = *d.state;
      const int m = static_cast<int>(d.tokens.size()) - 1;
      const int f = st.frontier_[j];
      const int e = j < d.k ? m - 1 : m - j - 1;
      const int n = e - f + 1;
      if (n <= 0 || static_cast<int>(inputs_[w].size()) < n * H) {
        live[w] = false;  // nothing this layer can do; later layers neither
        st.active_ = false;  // restart from fresh rows
        if (j < d.k) return absl::InternalError("MTP layer has no positions to draft from");
        continue;
      }
      std::vector<uint32_t>& t = tokens_[w];
      t.resize(n);
      for (int i = 0; i < n; ++i) {
        const int idx = f + i + j + 1;
        t[i] = idx <= m ? d.tokens[idx] : d.drafts[idx - m - 1];
      }
      starts[w] = f;
      ends[w] = e;
      items_.push_back({.seq = d.seq, .tokens = t, .start = f, .no_logits = j >= d.k});
      hidden_.insert(hidden_.end(), inputs_[w].begin(), inputs_[w].begin() + n * H);
      who.push_back(w);
    }
    if (items_.empty()) break;
    RETURN_IF_ERROR(engine_->ForwardMtp(j, items_, hidden_, &out_, head));
    const int V = c.vocab_size;
    size_t row = 0;
    for (size_t i = 0; i < who.size(); ++i) {
      const size_t w = who[i];
      DraftWork& d = *work[w];
      MtpState& st = *d.state;
      const int m = static_cast<int>(d.tokens.size()) - 1;
      const int f = starts[w];
      const int n = ends[w] - f + 1;
      if (j < d.k) {
        const float* logits = out_.logits.data() + static_cast<size_t>(out_.first_row[i]) * V;
        d.drafts.push_back(d.sampler->Draft(absl::MakeConstSpan(logits, V), &d.q[j]));
      }
      const float* outs = out_.all_hidden.data() + row * H;
      row += n;
      // Layer j is exact below m - j now.
      st.frontier_[j] = m - j;
      if (j + 1 < K) {
        // Layer j+1's inputs: its pending rows, then this layer's outputs;
        // it keeps the output at m - j - 1 (exact) as its next pending row.
        std::vector<float> next = std::move(st.pending_[j + 1]);
        next.insert(next.end(), outs, outs + static_cast<size_t>(n) * H);
        const int keep_pos = m - j - 1;  // == new frontier of layer j+1
        st.pending_[j + 1].assign(outs + static_cast<size_t>(keep_pos - f) * H,
                                  outs + static_cast<size_t>(keep_pos - f + 1) * H);
        inputs_[w] = std::move(next);
      }
    }
  }
  for (size_t w = 0; w < W; ++w) {
    if (static_cast<int>(work[w]->drafts.size()) != work[w]->k) {
      return absl::InternalError("MTP draft step drafted fewer tokens than asked");
    }
  }
  return absl::OkStatus();
}

}  // namespace swaserve::worker
