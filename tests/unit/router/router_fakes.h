// Fakes of the router's three dependencies:
// a RoutingState with scripted loads and prefix depths, a WorkerSource over a
// fixed worker list with real CircuitBreakers on a FakeClock, and
// WorkerClients whose prefill and decode calls follow a per-worker script.
// No Redis, no gRPC server, no model: router::Router runs its whole request
// path (decision, legs, retries, migration, breakers, shedding) against them.
//
// The fake "model" is deterministic: the token after a sequence s is
// NextToken(s) = 1000 + (7 * s.back() + |s|) mod 500, so a request migrated
// with its prompt plus the tokens already sent continues exactly as an
// uninterrupted run would (like the real engine's greedy decoding).
//
// A prefill call that succeeds "commits" its transfer id on the shared
// Fabric; the decode stream of that transfer id starts producing tokens then
// (as the real decode worker does after the KV commit).
//
// Thread-safety: all fakes are thread-safe.
#pragma once

#include <pthread.h>

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "lib/base/clock.h"
#include "lib/base/hash.h"
#include "lib/router/media.h"
#include "lib/router/routing_state.h"
#include "lib/router/worker_client.h"
#include "lib/router/worker_directory.h"

namespace swaserve::router::testing {

inline uint32_t NextToken(const std::vector<uint32_t>& s) {
  const uint32_t last = s.empty() ? 0 : s.back();
  return 1000 + (7 * last + static_cast<uint32_t>(s.size())) % 500;
}

// Commits of prefill legs, by transfer id.
class Fabric {
 public:
  void Commit(const std::string& transfer_id, uint32_t cached_tokens) {
    absl::MutexLock lock(&mu_);
    committed_[transfer_id] = cached_tokens;
  }
  // Blocks until `transfer_id` is committed (true, with its cached tokens) or
  // `*cancelled` turns true (false). Cancel callers must Poke().
  bool WaitCommit(const std::string& transfer_id, const std::atomic<bool>* cancelled,
                  uint32_t* cached_tokens) {
    absl::MutexLock lock(&mu_);
    auto ready = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return cancelled->load() || committed_.contains(transfer_id);
    };
    mu_.Await(absl::Condition(&ready));
    if (cancelled->load()) return false;
    *cached_tokens = committed_[transfer_id];
    return true;
  }
  // Wakes waiters so that they re-check their cancel flags.
  void Poke() { absl::MutexLock lock(&mu_); }

 private:
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, uint32_t> committed_ ABSL_GUARDED_BY(mu_);
};

// What one fake worker does with the calls it gets. Change between
// requests only (read when a call starts).
struct WorkerScript {
  // Decode: answer `accepted` (else the stream ends with reject_status).
  bool accept = true;
  grpc::Status reject_status = grpc::Status(grpc::StatusCode::UNAVAILABLE, "connection refused");
  // Decode: never answer (until cancelled), e.g. a hung worker.
  bool accept_hangs = false;
  // Decode: end the stream UNAVAILABLE after this many tokens (-1: never).
  int fail_after_tokens = -1;
  // Prefill: the call's status (not OK: returned without a commit).
  grpc::Status prefill_status = grpc::Status::OK;
  // Prefill: block until cancelled instead of answering.
  bool prefill_hangs = false;
  // Prefill: park the call WITHOUT a thread (as a request queued at a
  // prefill worker is to the router) until FakeWorkerClient::ReleaseParked
  // or a cancel.
  bool prefill_parks = false;
  uint32_t cached_tokens = 0;
  // Prefill: when set, a status computed from the request (OK: go on).
  std::function<grpc::Status(const v1::PrefillRequest&)> prefill_check;
};

// Everything the fake workers saw.
struct CallLog {
  absl::Mutex mu;
  std::vector<std::pair<std::string, v1::PrefillRequest>> prefills ABSL_GUARDED_BY(mu);
  std::vector<std::pair<std::string, v1::DecodeRequest>> decodes ABSL_GUARDED_BY(mu);
  int cancelled_prefills ABSL_GUARDED_BY(mu) = 0;
  int cancelled_decodes ABSL_GUARDED_BY(mu) = 0;
};

class FakeWorkerClient final : public WorkerClient {
 public:
  FakeWorkerClient(std::string id, Fabric* fabric, CallLog* log)
      : id_(std::move(id)), fabric_(fabric), log_(log) {}

  void SetScript(const WorkerScript& s) {
    absl::MutexLock lock(&mu_);
    script_ = s;
  }
  WorkerScript script() {
    absl::MutexLock lock(&mu_);
    return script_;
  }

  std::unique_ptr<DecodeCall> StartDecode(const v1::DecodeRequest& request,
                                          absl::Time deadline) override;
  std::unique_ptr<PrefillCall> NewPrefill(absl::Time deadline) override;

  // Parked prefill calls (WorkerScript::prefill_parks): each is a function
  // that completes it; ReleaseParked runs them on the caller's thread.
  void Park(std::function<void()> complete) {
    absl::MutexLock lock(&mu_);
    parked_.push_back(std::move(complete));
  }
  size_t ReleaseParked() {
    std::vector<std::function<void()>> p;
    {
      absl::MutexLock lock(&mu_);
      p.swap(parked_);
    }
    for (auto& f : p) f();
    return p.size();
  }

  const std::string& id() const { return id_; }
  Fabric* fabric() const { return fabric_; }
  CallLog* log() const { return log_; }

 private:
  const std::string id_;
  Fabric* const fabric_;
  CallLog* const log_;
  absl::Mutex mu_;
  WorkerScript script_ ABSL_GUARDED_BY(mu_);
  std::vector<std::function<void()>> parked_ ABSL_GUARDED_BY(mu_);
};

// The scripted decode stream, blocking (ThreadedDecodeCall makes it the
// asynchronous DecodeCall the router uses).
class FakeDecodeCall {
 public:
  FakeDecodeCall(FakeWorkerClient* w, const v1::DecodeRequest& req)
      : w_(w), req_(req), script_(w->script()) {
    seq_.assign(req.prompt_token_ids().begin(), req.prompt_token_ids().end());
  }
  bool Read(v1::DecodeResponse* msg) {
    msg->Clear();
    if (cancelled_) return End(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
    if (!accepted_) {
      if (script_.accept_hangs) {
        uint32_t unused = 0;
        w_->fabric()->WaitCommit("never committed", &cancelled_, &unused);
        return End(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
      }
      if (!script_.accept) return End(script_.reject_status);
      accepted_ = true;
      msg->mutable_accepted()->set_worker_id(w_->id());
      return true;
    }
    if (!committed_) {
      if (!w_->fabric()->WaitCommit(req_.request_id(), &cancelled_, &cached_)) {
        return End(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
      }
      committed_ = true;
    }
    if (done_) return End(grpc::Status::OK);
    if (script_.fail_after_tokens >= 0 && sent_ >= script_.fail_after_tokens) {
      return End(grpc::Status(grpc::StatusCode::UNAVAILABLE, "decode worker died"));
    }
    const uint32_t t = NextToken(seq_);
    seq_.push_back(t);
    ++sent_;
    v1::TokenChunk* c = msg->mutable_tokens();
    c->add_token_ids(t);
    // MTP drafts so far on this stream, as a drafting worker reports them:
    // 2 per token, 1 accepted.
    c->set_draft_tokens(2 * sent_);
    c->set_accepted_draft_tokens(sent_);
    if (sent_ >= static_cast<int>(req_.sampling().max_tokens())) {
      c->set_finish_reason(v1::FINISH_REASON_LENGTH);
      c->mutable_usage()->set_prompt_tokens(req_.prompt_token_ids_size());
      c->mutable_usage()->set_completion_tokens(sent_);
      c->mutable_usage()->set_cached_tokens(cached_);
      c->mutable_usage()->set_draft_tokens(2 * sent_);
      c->mutable_usage()->set_accepted_draft_tokens(sent_);
      done_ = true;
    }
    return true;
  }
  grpc::Status Finish() { return status_; }
  void Cancel() {
    if (!cancelled_.exchange(true)) {
      absl::MutexLock lock(&w_->log()->mu);
      ++w_->log()->cancelled_decodes;
    }
    w_->fabric()->Poke();
  }

 private:
  bool End(grpc::Status s) {
    status_ = std::move(s);
    return false;
  }
  FakeWorkerClient* const w_;
  const v1::DecodeRequest req_;
  const WorkerScript script_;
  std::vector<uint32_t> seq_;
  std::atomic<bool> cancelled_{false};
  bool accepted_ = false, committed_ = false, done_ = false;
  uint32_t cached_ = 0;
  int sent_ = 0;
  grpc::Status status_;
};

// A blocking FakeDecodeCall as an asynchronous DecodeCall: its Reads and
// Finish run in order on a thread of the call's own; callbacks run there.
// The router may drop the call on that thread (from a callback): then the
// thread is detached, and it exits as soon as the callback returns.
class ThreadedDecodeCall final : public DecodeCall {
 public:
  // The name of its threads (tests that count the router's threads skip
  // them: they are the fake worker's, not the router's).
  static constexpr const char* kThreadName = "fake-decode";
  explicit ThreadedDecodeCall(std::unique_ptr<FakeDecodeCall> inner)
      : inner_(std::move(inner)), state_(std::make_shared<State>()) {
    thread_ = std::thread([state = state_] {
      pthread_setname_np(pthread_self(), kThreadName);
      Loop(state);
    });
  }
  ~ThreadedDecodeCall() override {
    {
      absl::MutexLock lock(&state_->mu);
      state_->stop = true;
    }
    if (thread_.get_id() == std::this_thread::get_id()) {
      thread_.detach();
    } else {
      thread_.join();
    }
  }
  void Read(v1::DecodeResponse* msg, ReadDone done) override {
    Post([inner = inner_, msg, done = std::move(done)] { done(inner->Read(msg)); });
  }
  void Finish(FinishDone done) override {
    Post([inner = inner_, done = std::move(done)] { done(inner->Finish()); });
  }
  void Cancel() override { inner_->Cancel(); }

 private:
  struct State {
    absl::Mutex mu;
    std::vector<std::function<void()>> jobs ABSL_GUARDED_BY(mu);
    bool stop ABSL_GUARDED_BY(mu) = false;
  };
  static void Loop(std::shared_ptr<State> state) {
    for (;;) {
      std::function<void()> job;
      {
        absl::MutexLock lock(&state->mu);
        auto ready = [&]() ABSL_SHARED_LOCKS_REQUIRED(state->mu) {
          return state->stop || !state->jobs.empty();
        };
        state->mu.Await(absl::Condition(&ready));
        if (state->jobs.empty()) return;  // stopping, nothing left
        job = std::move(state->jobs.front());
        state->jobs.erase(state->jobs.begin());
      }
      job();
    }
  }
  void Post(std::function<void()> job) {
    absl::MutexLock lock(&state_->mu);
    state_->jobs.push_back(std::move(job));
  }
  std::shared_ptr<FakeDecodeCall> inner_;
  std::shared_ptr<State> state_;
  std::thread thread_;
};

// Runs the scripted prefill on a thread of its own (joined on destruction,
// or detached when the router drops the call from its `done`).
class FakePrefillCall final : public PrefillCall {
 public:
  explicit FakePrefillCall(FakeWorkerClient* w) : w_(w) {}
  ~FakePrefillCall() override {
    std::thread t;
    {
      absl::MutexLock lock(&mu_);  // a canceller may be assigning it
      t = std::move(thread_);
    }
    if (!t.joinable()) return;
    if (t.get_id() == std::this_thread::get_id()) {
      t.detach();  // dropped from `done`, on this thread
    } else {
      t.join();
    }
  }
  void Start(v1::PrefillRequest request, v1::PrefillResponse* response, Done done) override {
    if (w_->script().prefill_parks) {
      // `done` holds the router's leg, which owns this call: the slot is
      // emptied when it runs, so that on_cancel_ keeps no cycle alive.
      auto once = std::make_shared<std::atomic<bool>>(false);
      auto slot = std::make_shared<Done>(std::move(done));
      auto finish = [w = w_, request, slot, once](bool cancelled) {
        if (once->exchange(true)) return;
        Done done = std::move(*slot);
        *slot = nullptr;
        if (cancelled) {
          done(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
          return;
        }
        w->fabric()->Commit(request.decode().transfer_id(), w->script().cached_tokens);
        done(grpc::Status::OK);
      };
      FakeWorkerClient* const w = w_;
      w->Park([finish] { finish(false); });
      {
        // A cancel completes it from a thread of its own (never inline: the
        // router may hold its leg lock while cancelling, as with gRPC).
        absl::MutexLock lock(&mu_);
        // (Runs with mu_ held: Cancel, or just below.)
        on_cancel_ = [this, finish] { thread_ = std::thread([finish] { finish(true); }); };
        if (cancelled_) on_cancel_();  // cancelled before it started
      }
      // Logged last, once parked: a test that waits for the log and then
      // calls ReleaseParked must find every logged call parked (logging
      // first lost one release to this race in CI), and a release may
      // destroy this call, so nothing of `this` is touched after it.
      absl::MutexLock lock(&w->log()->mu);
      w->log()->prefills.emplace_back(w->id(), request);
      return;
    }
    absl::MutexLock lock(&mu_);
    thread_ = std::thread([this, request = std::move(request), response,
                           done = std::move(done)] { done(Run(request, response)); });
  }
  void Cancel() override {
    absl::MutexLock lock(&mu_);
    if (cancelled_) return;
    cancelled_ = true;
    {
      absl::MutexLock log_lock(&w_->log()->mu);
      ++w_->log()->cancelled_prefills;
    }
    if (on_cancel_) on_cancel_();
  }

 private:
  grpc::Status Run(const v1::PrefillRequest& request, v1::PrefillResponse* response) {
    const WorkerScript s = w_->script();
    {
      absl::MutexLock lock(&w_->log()->mu);
      w_->log()->prefills.emplace_back(w_->id(), request);
    }
    if (s.prefill_hangs) {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(&cancelled_));
    }
    {
      absl::MutexLock lock(&mu_);
      if (cancelled_) return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
    }
    if (!s.prefill_status.ok()) return s.prefill_status;
    if (s.prefill_check) {
      if (grpc::Status st = s.prefill_check(request); !st.ok()) return st;
    }
    w_->fabric()->Commit(request.decode().transfer_id(), s.cached_tokens);
    response->set_request_id(request.request_id());
    response->set_cached_tokens(s.cached_tokens);
    return grpc::Status::OK;
  }

  FakeWorkerClient* const w_;
  absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::function<void()> on_cancel_ ABSL_GUARDED_BY(mu_);
  std::thread thread_ ABSL_GUARDED_BY(mu_);
};

inline std::unique_ptr<DecodeCall> FakeWorkerClient::StartDecode(const v1::DecodeRequest& request,
                                                                 absl::Time) {
  {
    absl::MutexLock lock(&log_->mu);
    log_->decodes.emplace_back(id_, request);
  }
  return std::make_unique<ThreadedDecodeCall>(std::make_unique<FakeDecodeCall>(this, request));
}

inline std::unique_ptr<PrefillCall> FakeWorkerClient::NewPrefill(absl::Time) {
  return std::make_unique<FakePrefillCall>(this);
}

// A fixed worker list with real breakers.
class FakeWorkerSource final : public WorkerSource {
 public:
  FakeWorkerSource(const CircuitBreakerOptions& breaker, base::Clock* clock)
      : breakers_(breaker, clock) {}
  void Add(std::shared_ptr<const WorkerEndpoint> w) {
    absl::MutexLock lock(&mu_);
    workers_.push_back(std::move(w));
  }
  absl::StatusOr<std::vector<std::shared_ptr<const WorkerEndpoint>>> Workers() override {
    absl::MutexLock lock(&mu_);
    return workers_;
  }
  bool Healthy(absl::string_view id) override { return breakers_.Healthy(id); }
  bool Pick(absl::string_view id) override { return breakers_.Pick(id); }
  void ReportSuccess(absl::string_view id) override {
    breakers_.ReportSuccess(id);
    absl::MutexLock lock(&mu_);
    ++successes_[std::string(id)];
  }
  void ReportFailure(absl::string_view id) override {
    breakers_.ReportFailure(id);
    absl::MutexLock lock(&mu_);
    ++failures_[std::string(id)];
  }
  int failures(const std::string& id) {
    absl::MutexLock lock(&mu_);
    return failures_[id];
  }
  int successes(const std::string& id) {
    absl::MutexLock lock(&mu_);
    return successes_[id];
  }
  CircuitBreakers& breakers() { return breakers_; }

 private:
  CircuitBreakers breakers_;
  absl::Mutex mu_;
  std::vector<std::shared_ptr<const WorkerEndpoint>> workers_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int> failures_ ABSL_GUARDED_BY(mu_), successes_ ABSL_GUARDED_BY(mu_);
};

// Loads and prefix depths by worker id; Unavailable while `down`, unless
// `mirrored` (an index mirror answers for Redis: the depths without loads,
// redis_unreadable set).
class FakeRoutingState final : public RoutingState {
 public:
  void SetLoad(const std::string& id, const v1::WorkerLoad& load) {
    absl::MutexLock lock(&mu_);
    loads_[id] = load;
  }
  void SetDepth(const std::string& id, int64_t pages) {
    absl::MutexLock lock(&mu_);
    depths_[id] = pages;
  }
  // The window-safe depth of `id`'s match (pages; -1: below the scan the
  // router asked for); default: its depth (the match ends window-safe).
  void SetSafeDepth(const std::string& id, int64_t pages) {
    absl::MutexLock lock(&mu_);
    safe_[id] = pages;
  }
  // The window scan (pages) the last match asked for, per candidate id.
  std::map<std::string, int64_t> last_scan() {
    absl::MutexLock lock(&mu_);
    return last_scan_;
  }
  // Loads that replace the current ones once `calls` matches were answered
  // (a cluster that saturates while a request runs).
  void SetLoadLater(int calls, const std::string& id, const v1::WorkerLoad& load) {
    absl::MutexLock lock(&mu_);
    later_.push_back({calls, id, load});
  }
  void SetDown(bool down, bool mirrored = false) {
    absl::MutexLock lock(&mu_);
    down_ = down;
    mirrored_ = mirrored;
  }
  int recorded() {
    absl::MutexLock lock(&mu_);
    return recorded_;
  }
  // The page hashes of the last match.
  std::vector<uint64_t> last_hashes() {
    absl::MutexLock lock(&mu_);
    return last_hashes_;
  }
  absl::StatusOr<cluster::ClusterView::PrefixesAndLoads> MatchPrefixesAndLoads(
      absl::Span<const uint64_t> hashes, absl::Span<const std::string> candidates,
      absl::Span<const std::string> load_ids, int window_pages,
      absl::Span<const int64_t> window_scan_pages) override {
    absl::MutexLock lock(&mu_);
    ++matches_;
    last_hashes_.assign(hashes.begin(), hashes.end());
    for (const Later& l : later_) {
      if (matches_ > l.calls) loads_[l.id] = l.load;
    }
    if (down_ && !mirrored_) return absl::UnavailableError("redis down");
    cluster::ClusterView::PrefixesAndLoads out;
    out.redis_unreadable = down_;
    last_scan_.clear();
    for (size_t i = 0; i < candidates.size(); ++i) {
      const std::string& c = candidates[i];
      auto it = depths_.find(c);
      const int64_t d = it == depths_.end() ? 0 : it->second;
      out.depths.push_back(std::min<int64_t>(d, static_cast<int64_t>(hashes.size())));
      auto safe = safe_.find(c);
      out.safe_pages.push_back(safe == safe_.end() ? out.depths.back()
                                                   : std::min(safe->second, out.depths.back()));
      out.l1_pages.push_back(out.depths.back());
      if (i < window_scan_pages.size()) last_scan_[c] = window_scan_pages[i];
    }
    for (const std::string& id : load_ids) {
      auto it = down_ ? loads_.end() : loads_.find(id);
      out.loads.push_back(it == loads_.end() ? std::nullopt
                                             : std::optional<v1::WorkerLoad>(it->second));
    }
    return out;
  }
  absl::Status RecordDispatch(absl::string_view, absl::Span<const uint64_t>) override {
    absl::MutexLock lock(&mu_);
    ++recorded_;
    return absl::OkStatus();
  }

 private:
  absl::Mutex mu_;
  bool down_ ABSL_GUARDED_BY(mu_) = false;
  bool mirrored_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, v1::WorkerLoad> loads_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int64_t> depths_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int64_t> safe_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int64_t> last_scan_ ABSL_GUARDED_BY(mu_);
  int recorded_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<uint64_t> last_hashes_ ABSL_GUARDED_BY(mu_);
  struct Later {
    int calls;
    std::string id;
    v1::WorkerLoad load;
  };
  std::vector<Later> later_ ABSL_GUARDED_BY(mu_);
  int matches_ ABSL_GUARDED_BY(mu_) = 0;
};

// An encoder: item bytes b -> b.size() % 7 + 1 rows of `hidden` values
// (row r, column c = b[0] + r + c / 8), content hash Hash128Of(b); a
// scripted status instead when set. Counts calls and remembers the bytes
// it saw (the cache answer: hit when it saw them before).
class FakeEncoderClient final : public EncoderClient {
 public:
  FakeEncoderClient(std::string id, int hidden) : id_(std::move(id)), hidden_(hidden) {}
  void Fail(absl::Status s) {
    absl::MutexLock lock(&mu_);
    fail_ = std::move(s);
  }
  int calls() {
    absl::MutexLock lock(&mu_);
    return calls_;
  }
  // While blocked, Encode calls wait (a slow encoder); calls waiting now.
  void SetBlocked(bool blocked) {
    absl::MutexLock lock(&mu_);
    blocked_ = blocked;
  }
  int waiting() {
    absl::MutexLock lock(&mu_);
    return waiting_;
  }
  absl::StatusOr<v1::EncodeResponse> Encode(const v1::EncodeRequest& request,
                                            absl::Time) override {
    absl::MutexLock lock(&mu_);
    ++waiting_;
    mu_.Await(absl::Condition(+[](bool* b) { return !*b; }, &blocked_));
    --waiting_;
    ++calls_;
    if (!fail_.ok()) return fail_;
    v1::EncodeResponse out;
    for (const v1::MultimodalItem& it : request.items()) {
      const std::string& b = it.data();
      const int rows = static_cast<int>(b.size() % 7) + 1;
      std::vector<float> v(static_cast<size_t>(rows) * hidden_);
      for (int r = 0; r < rows; ++r) {
        for (int c = 0; c < hidden_; ++c) {
          v[static_cast<size_t>(r) * hidden_ + c] =
              static_cast<float>(static_cast<unsigned char>(b[0]) + r) + c / 8.0f;
        }
      }
      v1::Embedding* e = out.add_embeddings();
      e->set_content_hash(base::Hash128Of(b).ToBytes());
      e->set_cache_hit(!seen_.insert(b).second);
      v1::Tensor* t = e->mutable_embeddings();
      t->set_dtype(v1::DTYPE_F32);
      t->add_shape(rows);
      t->add_shape(hidden_);
      if (request.inline_max_bytes() > 0 && v.size() * sizeof(float) > request.inline_max_bytes()) {
        e->set_by_reference(true);  // as the encoder: shape only
        continue;
      }
      t->set_data(std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float)));
    }
    return out;
  }
  const std::string& id() const { return id_; }

 private:
  const std::string id_;
  const int hidden_;
  absl::Mutex mu_;
  absl::Status fail_ ABSL_GUARDED_BY(mu_);
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
  bool blocked_ ABSL_GUARDED_BY(mu_) = false;
  int waiting_ ABSL_GUARDED_BY(mu_) = 0;
  std::set<std::string> seen_ ABSL_GUARDED_BY(mu_);
};

}  // namespace swaserve::router::testing
