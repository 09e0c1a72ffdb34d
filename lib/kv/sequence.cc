#include "lib/kv/sequence.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "lib/base/status.h"

namespace swaserve::kv {

int SwaWindowStart(int n_tokens, int window, int page_size) {
  return std::max(0, n_tokens - window + 1) / page_size * page_size;
}

int WindowRestoreStart(int full_tokens, int window, int page_size, int swa_chain_layers) {
  const int64_t first = SwaWindowStart(full_tokens, window, page_size);
  const int64_t reach = int64_t{std::max(0, swa_chain_layers - 1)} * std::max(0, window - 1);
  return static_cast<int>(std::max<int64_t>(0, first - reach));
}

WindowRestorePyramid WindowRestoreRows(int full_tokens, int window, int page_size,
                                       const std::vector<bool>& swa_layer, int mtp_layers) {
  const int swa = static_cast<int>(std::count(swa_layer.begin(), swa_layer.end(), true));
  const int chain = swa + std::max(0, mtp_layers);
  const int64_t w0 = SwaWindowStart(full_tokens, window, page_size);
  const int64_t hop = std::max(0, window - 1);
  // A(e), clamped; e == chain (past the chain's end): nothing below M.
  auto a = [&](int e) -> int {
    if (e >= chain) return full_tokens;
    return static_cast<int>(std::clamp<int64_t>(w0 - int64_t{chain - 1 - e} * hop, 0, full_tokens));
  };
  WindowRestorePyramid p;
  const int n = static_cast<int>(swa_layer.size());
  p.input_from.assign(n, full_tokens);
  p.output_from.assign(n, full_tokens);
  p.mtp_layers = std::max(0, mtp_layers);
  p.mtp_from = mtp_layers > 0 ? a(swa) : full_tokens;
  // Backwards: what each layer's output must cover is what the next needs.
  int need = p.mtp_from;
  int e = swa;  // chain index of the next SWA layer met going back, + 1
  for (int i = n - 1; i >= 0; --i) {
    p.output_from[i] = need;
    if (swa_layer[i]) {
      --e;
      p.input_from[i] = std::min(a(e), need);
    } else {
      p.input_from[i] = need;
    }
    need = p.input_from[i];
  }
  return p;
}

double WindowRestorePyramidWork(const WindowRestorePyramid& p, int from, int full_tokens) {
  auto rows = [&](int lo) { return std::max(0, full_tokens - std::max(from, lo)); };
  double sum = 0;
  for (int lo : p.output_from) sum += rows(lo);
  sum += static_cast<double>(p.mtp_layers) * rows(p.mtp_from);
  const size_t layers = p.output_from.size() + static_cast<size_t>(p.mtp_layers);
  return layers == 0 ? 0.0 : sum / static_cast<double>(layers);
}

int WindowRestoreWorkPerRestore(int window, int page_size, const std::vector<bool>& swa_layer,
                                int mtp_layers) {
  const int chain =
      static_cast<int>(std::count(swa_layer.begin(), swa_layer.end(), true)) + mtp_layers;
  if (window <= 1 || page_size <= 0 || chain <= 0) return 0;
  // Past the stretch plus a window, rounded up to a page: s > 0.
  const int64_t reach = int64_t{chain} * window + 2 * page_size;
  const int m = static_cast<int>((reach + page_size - 1) / page_size * page_size);
  const int s = WindowRestoreStart(m, window, page_size, chain);
  return static_cast<int>(std::llround(WindowRestorePyramidWork(
      WindowRestoreRows(m, window, page_size, swa_layer, mtp_layers), s, m)));
}

WindowRestoreStretch PlanWindowRestoreStretch(int full_tokens, int window_safe_tokens, int window,
                                              int page_size, const std::vector<bool>& swa_layer,
                                              int mtp_layers, bool pyramid, bool from_window_safe) {
  const int chain =
      static_cast<int>(std::count(swa_layer.begin(), swa_layer.end(), true)) + mtp_layers;
  WindowRestoreStretch st;
  st.from = WindowRestoreStart(full_tokens, window, page_size, chain);
  if (from_window_safe && window_safe_tokens >= st.from && window_safe_tokens < full_tokens) {
    st.from = window_safe_tokens;
    st.from_window_safe = window_safe_tokens > 0;
  }
  st.work = pyramid ? WindowRestorePyramidWork(
                          WindowRestoreRows(full_tokens, window, page_size, swa_layer, mtp_layers),
                          st.from, full_tokens)
                    : full_tokens - st.from;
  return st;
}

Sequence::Sequence(const SequenceOptions& options, CacheHit hit)
    : pools_(options.pools),
      cache_(options.cache),
      page_size_(options.pools->shape().page_size),
      window_(options.pools->shape().sliding_window),
      swa_slack_(std::max(0, options.swa_slack)),
      evict_on_demand_(options.evict_on_demand),
      checkpoints_yield_(options.checkpoints_yield),
      hit_(std::move(hit)) {
  hit_tokens_ = hit_.tokens();
  hit_pages_ = hit_tokens_ / page_size_;
  length_ = hit_tokens_;
  full_pages_.assign(hit_.full_pages().begin(), hit_.full_pages().end());
  swa_pages_.assign(hit_pages_, kNoPage);
  swa_first_page_ = hit_.swa_first_page();
  for (size_t j = 0; j < hit_.swa_pages().size(); ++j) {
    swa_pages_[swa_first_page_ + j] = hit_.swa_pages()[j];
  }
  swa_shared_end_ = hit_pages_;
  frontier_ = length_;
  const int diverge = hit_.matched_tokens() / page_size_ * page_size_;
  if (options.keep_divergence_window && diverge > hit_tokens_) {
    keep_end_ = diverge / page_size_;
    keep_begin_ = std::max(hit_pages_, std::max(0, diverge - (window_ - 1)) / page_size_);
  }
  if (options.swa_checkpoint_tokens > 0 && window_ > 1) {
    checkpoint_pages_ = (options.swa_checkpoint_tokens + page_size_ - 1) / page_size_;
    checkpoint_floor_ = hit_tokens_;
  }
}

bool Sequence::Kept(int p) const {
  if (p >= keep_begin_ && p < keep_end_) return true;
  if (checkpoint_pages_ == 0) return false;
  // Checkpoints after page p whose window reaches back to it (several when
  // the interval is shorter than the window); the window start grows with
  // the checkpoint, so the first one past the floor decides.
  for (int cp_page = (p / checkpoint_pages_ + 1) * checkpoint_pages_;; cp_page += checkpoint_pages_) {
    const int start = SwaWindowStart(cp_page * page_size_, window_, page_size_);
    if (start / page_size_ > p) return false;
    if (start >= checkpoint_floor_) return true;
  }
}

bool Sequence::DropKept() {
  bool freed = false;
  const int below = std::min(swa_first_page_, static_cast<int>(swa_pages_.size()));
  for (int p = swa_shared_end_; p < below; ++p) {
    if (swa_pages_[p] == kNoPage) continue;
    // Restored stretch pages (restore_from_ <= p < keep_begin_) are freed
    // too: they never go to the cache.
    pools_->swa().Free({&swa_pages_[p], 1});
    swa_pages_[p] = kNoPage;
    freed = true;
  }
  keep_begin_ = keep_end_ = 0;
  checkpoint_pages_ = 0;
  kept_dropped_ = true;  // no window is kept from now on
  return freed;
}

int64_t Sequence::DropCheckpoints(int64_t need) {
  if (checkpoint_pages_ == 0) return 0;
  int64_t freed = 0;
  const int below = std::min(swa_first_page_, static_cast<int>(swa_pages_.size()));
  for (int p = std::max(swa_shared_end_, checkpoint_floor_ / page_size_); p < below; ++p) {
    if (p >= keep_begin_ && p < keep_end_) continue;  // the divergence / restored window
    if (swa_pages_[p] != kNoPage) {
      pools_->swa().Free({&swa_pages_[p], 1});
      swa_pages_[p] = kNoPage;
      ++freed;
    }
    // A checkpoint's window ends at a multiple of the interval: stop there.
    if (freed >= need && (p + 1) % checkpoint_pages_ == 0) break;
  }
  return freed;
}

void Sequence::MakeRoom(int64_t n_full, int64_t n_swa) {
  auto swa_short = [&] { return std::max<int64_t>(0, n_swa - pools_->swa().num_free()); };
  const int64_t full_short = std::max<int64_t>(0, n_full - pools_->full().num_free());
  if (!checkpoints_yield_ || checkpoint_pages_ == 0 || swa_short() == 0) {
    cache_->Evict(full_short, swa_short());
    return;
  }
  cache_->Evict(full_short, 0);  // deleted leaves free their SWA pages too
  if (swa_short() > 0) cache_->EvictColdSwa(swa_short());
  if (swa_short() > 0) checkpoint_pages_yielded_ += DropCheckpoints(swa_short());
  if (swa_short() > 0) cache_->Evict(0, swa_short());
}

Sequence::~Sequence() {
  if (!done_) Abort();
}

int Sequence::KeepFromToken(int length) const {
  return std::max(0, length - swa_slack_ - (window_ - 1) - (page_size_ - 1));
}

PageId Sequence::swa_page(int page_index) const {
  if (page_index < 0 || page_index >= static_cast<int>(swa_pages_.size())) {
    return kNoPage;
  }
  return swa_pages_[page_index];
}

Sequence::PageNeeds Sequence::NeedsFor(int n_tokens) const {
  const int64_t pages =
      (int64_t{length_} + std::max(0, n_tokens) + page_size_ - 1) / page_size_;
  PageNeeds needs;
  needs.full = std::max<int64_t>(0, pages - static_cast<int64_t>(full_pages_.size()));
  needs.swa = std::max<int64_t>(0, pages - static_cast<int64_t>(swa_pages_.size()));
  return needs;
}

void Sequence::TrimWindow() {
  if (done_) return;
  const int new_first = KeepFromToken(std::min(length_, frontier_)) / page_size_;
  for (int p = swa_first_page_; p < new_first && p < static_cast<int>(swa_pages_.size()); ++p) {
    if (Kept(p)) continue;  // divergence / restored / checkpoint window
    PageId page = swa_pages_[p];
    if (page == kNoPage) continue;
    if (!IsSharedSwa(p)) pools_->swa().Free({&page, 1});
    swa_pages_[p] = kNoPage;
  }
  swa_first_page_ = std::max(swa_first_page_, new_first);
  if (hit_.swa_locked() && swa_first_page_ >= swa_shared_end_ && cache_ != nullptr) {
    cache_->ReleaseSwa(hit_);
  }
}

absl::Status Sequence::Append(int n_tokens) {
  if (done_) return absl::FailedPreconditionError("sequence is finished");
  if (n_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat("cannot append ", n_tokens, " tokens"));
  }
  if (n_tokens == 0) return absl::OkStatus();
  if (frontier_ < length_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot append at length ", length_, ": the window restore is at ", frontier_));
  }
  TrimWindow();
  const PageNeeds needs = NeedsFor(n_tokens);
  RETURN_IF_ERROR(Allocate(needs.full, static_cast<int>(swa_pages_.size()),
                           static_cast<int>(full_pages_.size() + needs.full), "append", n_tokens));
  length_ += n_tokens;
  frontier_ = length_;
  return absl::OkStatus();
}

absl::Status Sequence::Allocate(int64_t n_full, int swa_from_page, int swa_to_page,
                                const char* what, int n_tokens) {
  const int pages_after = static_cast<int>(full_pages_.size() + n_full);
  std::vector<int> swa_missing;
  for (int p = swa_from_page; p < swa_to_page; ++p) {
    if (p >= static_cast<int>(swa_pages_.size()) || swa_pages_[p] == kNoPage) {
      swa_missing.push_back(p);
    }
  }
  const int64_t n_swa = static_cast<int64_t>(swa_missing.size());
  absl::StatusOr<Reservation> r = pools_->Reserve(n_full, n_swa);
  if (!r.ok() && cache_ != nullptr && evict_on_demand_) {
    MakeRoom(n_full, n_swa);
    r = pools_->Reserve(n_full, n_swa);
  }
  if (!r.ok() && n_swa > pools_->swa().num_free() && !kept_dropped_ && DropKept()) {
    // The windows kept for the cache give way to the request itself.
    r = pools_->Reserve(n_full, n_swa);
  }
  if (!r.ok()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot ", what, " ", n_tokens, " tokens at length ", length_, ": ",
        r.status().message()));
  }
  full_pages_.insert(full_pages_.end(), r->full.begin(), r->full.end());
  if (static_cast<int>(swa_pages_.size()) < pages_after) swa_pages_.resize(pages_after, kNoPage);
  for (size_t i = 0; i < swa_missing.size(); ++i) swa_pages_[swa_missing[i]] = r->swa[i];
  pools_->Commit(*r);
  return absl::OkStatus();
}

absl::Status Sequence::BeginWindowRestore(int from_token) {
  if (done_) return absl::FailedPreconditionError("sequence is finished");
  if (!hit_.needs_window_restore() || length_ != hit_tokens_ || restore_from_ >= 0) {
    return absl::InvalidArgumentError(
        "a window restore needs a sequence fresh from a full-KV prefix-cache hit");
  }
  if (from_token < 0 || from_token >= hit_tokens_) {
    return absl::InvalidArgumentError(absl::StrCat("window restore from token ", from_token,
                                                   " of a ", hit_tokens_, "-token hit"));
  }
  if (hit_.swa_locked() && from_token != hit_.window_safe_tokens()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a window restore over a hit with its window at ", hit_.window_safe_tokens(),
        " starts there, not at ", from_token));
  }
  restore_from_ = from_token;
  frontier_ = from_token;
  if (hit_.swa_locked()) {
    // Restoring from L: SWA keys before L are the hit's window (shared).
    swa_shared_end_ = from_token / page_size_;
    swa_key_start_ = swa_first_page_ * page_size_;
  } else {
    swa_shared_end_ = 0;  // the hit locked no SWA page
    swa_first_page_ = from_token / page_size_;
    swa_key_start_ = from_token;
  }
  // Keep the restored window (what a query at the hit's end reads) for the
  // cache; the rest of the stretch goes as the window moves on.
  keep_begin_ = std::max(from_token / page_size_,
                         SwaWindowStart(hit_tokens_, window_, page_size_) / page_size_);
  keep_end_ = hit_pages_;
  restore_exact_page_ = keep_begin_;
  return absl::OkStatus();
}

absl::Status Sequence::Prepare(int from, int n) {
  if (done_) return absl::FailedPreconditionError("sequence is finished");
  if (from == length_ && frontier_ == length_) return Append(n);
  if (restore_from_ < 0 || from != frontier_ || from >= length_ || n <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot prepare tokens [", from, ", ", from + n, ") of a ", length_,
        "-token sequence (next: ", frontier_, ")"));
  }
  TrimWindow();  // for a query at `from`: the frontier
  const int end = from + n;
  const int64_t full_needed = std::max<int64_t>(
      0, (int64_t{std::max(end, length_)} + page_size_ - 1) / page_size_ -
             static_cast<int64_t>(full_pages_.size()));
  RETURN_IF_ERROR(Allocate(full_needed, from / page_size_, (end + page_size_ - 1) / page_size_,
                           "prepare", n));
  length_ = std::max(length_, end);
  frontier_ = end;
  return absl::OkStatus();
}

absl::Status Sequence::AppendPrefilled(int n_tokens, int first_swa_token) {
  if (done_) return absl::FailedPreconditionError("sequence is finished");
  if (length_ != 0 || hit_tokens_ != 0 || !full_pages_.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "AppendPrefilled needs an empty sequence; this one has ", length_, " tokens"));
  }
  if (n_tokens <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("cannot append ", n_tokens, " tokens"));
  }
  const int need = SwaWindowStart(n_tokens, window_, page_size_);
  if (first_swa_token < 0 || first_swa_token % page_size_ != 0 || first_swa_token > need) {
    return absl::InvalidArgumentError(absl::StrCat(
        "first SWA token ", first_swa_token, " for ", n_tokens,
        " tokens must be page aligned (", page_size_, ") and at most ", need,
        " (the window of the next token)"));
  }
  const int pages = (n_tokens + page_size_ - 1) / page_size_;
  const int first_page = first_swa_token / page_size_;
  const int64_t swa_needed = pages - first_page;
  absl::StatusOr<Reservation> r = pools_->Reserve(pages, swa_needed);
  if (!r.ok() && cache_ != nullptr && evict_on_demand_) {
    cache_->Evict(std::max<int64_t>(0, pages - pools_->full().num_free()),
                  std::max<int64_t>(0, swa_needed - pools_->swa().num_free()));
    r = pools_->Reserve(pages, swa_needed);
  }
  if (!r.ok()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot place ", n_tokens, " transferred tokens: ", r.status().message()));
  }
  full_pages_ = r->full;
  swa_shared_end_ = 0;
  swa_pages_.assign(first_page, kNoPage);
  swa_pages_.insert(swa_pages_.end(), r->swa.begin(), r->swa.end());
  swa_first_page_ = first_page;
  pools_->Commit(*r);
  length_ = n_tokens;
  frontier_ = n_tokens;
  return absl::OkStatus();
}

int64_t Sequence::private_swa_pages() const {
  int64_t n = 0;
  for (int p = swa_shared_end_; p < static_cast<int>(swa_pages_.size()); ++p) {
    if (swa_pages_[p] != kNoPage) ++n;
  }
  return n;
}

void Sequence::FreePrivateFrom(int page_index) {
  const int full_from = std::max(page_index, hit_pages_);
  for (int p = full_from; p < static_cast<int>(full_pages_.size()); ++p) {
    if (full_pages_[p] != kNoPage) pools_->full().Free({&full_pages_[p], 1});
  }
  // Restored SWA pages below the hit's end are private too.
  const int swa_from = std::max(page_index, swa_shared_end_);
  for (int p = swa_from; p < static_cast<int>(swa_pages_.size()); ++p) {
    if (swa_pages_[p] != kNoPage) pools_->swa().Free({&swa_pages_[p], 1});
    swa_pages_[p] = kNoPage;
  }
  if (full_from < static_cast<int>(full_pages_.size())) full_pages_.resize(full_from);
  const int swa_keep = std::max(page_index, hit_pages_);
  if (swa_keep < static_cast<int>(swa_pages_.size())) swa_pages_.resize(swa_keep);
}

absl::Status Sequence::Rollback(int n_tokens) {
  if (done_) return absl::FailedPreconditionError("sequence is finished");
  if (n_tokens < 0 || n_tokens > length_) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot roll back ", n_tokens, " of ", length_, " tokens"));
  }
  const int new_len = length_ - n_tokens;
  if (new_len < hit_tokens_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rollback to ", new_len, " tokens cuts into the cached prefix of ",
        hit_tokens_, " tokens"));
  }
  const int need_from = std::max(0, new_len - (window_ - 1));
  if (need_from < swa_first_page_ * page_size_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rollback to ", new_len, " tokens needs SWA KV from token ", need_from,
        " but it was released below token ", swa_first_page_ * page_size_,
        " (raise swa_slack)"));
  }
  FreePrivateFrom((new_len + page_size_ - 1) / page_size_);
  length_ = new_len;
  frontier_ = std::min(frontier_, new_len);
  return absl::OkStatus();
}

LayerView Sequence::FullLayer(int layer) const {
  const PoolGeometry& g = pools_->full().geometry();
  return LayerView{&pools_->full(), full_pages_, page_size_, g.KOffset(layer),
                   g.VOffset(layer), g.KTokenStride(), g.VTokenStride()};
}

LayerView Sequence::SwaLayer(int layer) const {
  const PoolGeometry& g = pools_->swa().geometry();
  return LayerView{&pools_->swa(), swa_pages_, page_size_, g.KOffset(layer),
                   g.VOffset(layer), g.KTokenStride(), g.VTokenStride()};
}

void Sequence::Finish(absl::Span<const uint64_t> page_hashes, int l3_written_from_page,
                      int l3_written_to_page) {
  if (done_) return;
  TrimWindow();  // the cache gets the trailing (and divergence) window only
  if (restore_from_ >= 0) {
    // The restore stretch before the restored window is exact only on the
    // first SWA layers (see WindowRestoreStart): never handed to the cache.
    const int end = std::min(restore_exact_page_, static_cast<int>(swa_pages_.size()));
    for (int p = restore_from_ / page_size_; p < end; ++p) {
      if (swa_pages_[p] != kNoPage) pools_->swa().Free({&swa_pages_[p], 1});
      swa_pages_[p] = kNoPage;
    }
  }
  const int complete = length_ / page_size_;
  const int m = std::min<int>(static_cast<int>(page_hashes.size()), complete);
  if (cache_ != nullptr && m > 0) {
    // Checkpoint windows go in cold (below the trailing and divergence
    // windows in the SWA LRU).
    std::vector<uint8_t> cold;
    if (checkpoint_pages_ > 0) {
      cold.assign(m, 0);
      for (int p = 0; p < m && p < swa_first_page_; ++p) {
        cold[p] = swa_pages_[p] != kNoPage && !(p >= keep_begin_ && p < keep_end_);
      }
    }
    cache_->Insert(page_hashes.subspan(0, m),
                   absl::MakeConstSpan(full_pages_).subspan(0, m),
                   absl::MakeConstSpan(swa_pages_).subspan(0, m), cold, l3_written_from_page,
                   l3_written_to_page);
    // The cache took over every private page below m.
    for (int p = 0; p < m; ++p) {
      full_pages_[p] = kNoPage;
      swa_pages_[p] = kNoPage;
    }
    FreePrivateFrom(m);
  } else {
    FreePrivateFrom(0);
  }
  if (cache_ != nullptr) cache_->Unlock(hit_);
  full_pages_.clear();
  swa_pages_.clear();
  length_ = 0;
  done_ = true;
}

void Sequence::Abort() {
  if (done_) return;
  FreePrivateFrom(0);
  if (cache_ != nullptr) cache_->Unlock(hit_);
  full_pages_.clear();
  swa_pages_.clear();
  length_ = 0;
  done_ = true;
}

}  // namespace swaserve::kv
