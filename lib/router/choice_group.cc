#include "lib/router/choice_group.h"

#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace swaserve::router {

namespace {

class Group : public std::enable_shared_from_this<Group> {
 public:
  Group(const v1::GenerateRequest& request, std::shared_ptr<GenerateSink> sink,
        std::shared_ptr<CancelFlag> cancel, GenerateDone done, StartOneFn start_one)
      : request_(request),
        sink_(std::move(sink)),
        cancel_(std::move(cancel)),
        done_(std::move(done)),
        start_one_(std::move(start_one)),
        n_(request.n()) {
    for (uint32_t i = 0; i < n_; ++i) flags_.push_back(std::make_shared<CancelFlag>());
  }

  void Run() {
    if (cancel_ != nullptr) {
      cancel_->OnCancel([weak = weak_from_this()] {
        if (std::shared_ptr<Group> g = weak.lock()) g->CancelAll();
      });
    }
    StartChoice(0);
  }

  void OnPrompt(uint32_t index, const PromptInfo& info) {
    if (index == 0) sink_->OnPrompt(info);
  }

  void SetProgressProbe(uint32_t index, GenerateSink::ProgressProbe probe) {
    if (index == 0) sink_->SetProgressProbe(std::move(probe));
  }

  bool Write(uint32_t index, const v1::GenerateResponse& response) {
    v1::GenerateResponse out = response;
    out.set_index(index);
    bool ok;
    {
      absl::MutexLock lock(&write_mu_);
      ok = sink_->Write(out);
    }
    if (ok && index == 0 &&
        (response.token_ids_size() > 0 ||
         response.finish_reason() != v1::FINISH_REASON_UNSPECIFIED)) {
      StartFollowers();
    }
    return ok;
  }

  void OnReady(std::function<void()> ready) {
    {
      absl::MutexLock lock(&mu_);
      waiting_.push_back(std::move(ready));
      if (ready_pending_) return;
      ready_pending_ = true;
    }
    sink_->OnReady([self = shared_from_this()] { self->RunReady(); });
  }

 private:
  void RunReady() {
    std::vector<std::function<void()>> run;
    {
      absl::MutexLock lock(&mu_);
      run.swap(waiting_);
      ready_pending_ = false;
    }
    for (std::function<void()>& f : run) f();
  }

  void StartChoice(uint32_t i);

  void StartFollowers() {
    {
      absl::MutexLock lock(&mu_);
      if (followers_decided_) return;
      followers_decided_ = true;
      if (!first_error_.ok()) return;
      started_ += static_cast<int>(n_) - 1;
    }
    for (uint32_t i = 1; i < n_; ++i) StartChoice(i);
  }

  void CancelAll() {
    for (const std::shared_ptr<CancelFlag>& f : flags_) f->Cancel();
  }

  void ChoiceDone(uint32_t index, absl::Status st) {
    bool cancel_others = false;
    bool complete = false;
    absl::Status result;
    {
      absl::MutexLock lock(&mu_);
      ++ended_;
      if (!st.ok() && first_error_.ok()) {
        first_error_ = std::move(st);
        cancel_others = true;
      }
      // A leader that ended without writing a token: the followers never
      // start (its error is the request's; an OK end without output cannot
      // happen, every request's last message carries its finish reason).
      if (index == 0 && !followers_decided_) followers_decided_ = true;
      complete = followers_decided_ && ended_ == started_;
      if (complete) result = first_error_;
    }
    if (cancel_others) CancelAll();
    if (!complete) return;
    if (cancel_ != nullptr) cancel_->Clear();
    GenerateDone done = std::move(done_);
    done(std::move(result));
  }

  friend class ChoiceSink;

  const v1::GenerateRequest request_;
  const std::shared_ptr<GenerateSink> sink_;
  const std::shared_ptr<CancelFlag> cancel_;
  GenerateDone done_;
  const StartOneFn start_one_;
  const uint32_t n_;
  std::vector<std::shared_ptr<CancelFlag>> flags_;

  absl::Mutex write_mu_;  // one sink Write at a time
  absl::Mutex mu_;
  bool followers_decided_ ABSL_GUARDED_BY(mu_) = false;
  int started_ ABSL_GUARDED_BY(mu_) = 1;  // the leader
  int ended_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status first_error_ ABSL_GUARDED_BY(mu_);
  std::vector<std::function<void()>> waiting_ ABSL_GUARDED_BY(mu_);
  bool ready_pending_ ABSL_GUARDED_BY(mu_) = false;
};

class ChoiceSink final : public GenerateSink {
 public:
  ChoiceSink(std::shared_ptr<Group> group, uint32_t index)
      : group_(std::move(group)), index_(index) {}
  void OnPrompt(const PromptInfo& info) override { group_->OnPrompt(index_, info); }
  bool Write(const v1::GenerateResponse& response) override {
    return group_->Write(index_, response);
  }
  void OnReady(std::function<void()> ready) override { group_->OnReady(std::move(ready)); }
  void SetProgressProbe(ProgressProbe probe) override {
    group_->SetProgressProbe(index_, std::move(probe));
  }

 private:
  const std::shared_ptr<Group> group_;
  const uint32_t index_;
};

void Group::StartChoice(uint32_t i) {
  v1::GenerateRequest one = request_;
  one.set_n(1);
  if (one.sampling().has_seed()) {
    one.mutable_sampling()->set_seed(one.sampling().seed() + i);
  }
  // Only the leader reports progress while it waits for its first token;
  // the followers start after it.
  if (i > 0) one.set_progress_interval_ms(0);
  auto sink = std::make_shared<ChoiceSink>(shared_from_this(), i);
  start_one_(one, std::move(sink), flags_[i],
             [self = shared_from_this(), i](absl::Status st) { self->ChoiceDone(i, std::move(st)); });
}

}  // namespace

void StartChoiceGroup(const v1::GenerateRequest& request, std::shared_ptr<GenerateSink> sink,
                      std::shared_ptr<CancelFlag> cancel, GenerateDone done,
                      StartOneFn start_one) {
  auto group = std::make_shared<Group>(request, std::move(sink), std::move(cancel),
                                       std::move(done), std::move(start_one));
  group->Run();
}

}  // namespace swaserve::router
