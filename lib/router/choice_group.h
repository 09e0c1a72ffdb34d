// ChoiceGroup: a request with several choices (GenerateRequest.n > 1) run as
// n single-choice requests that share the client's sink.
//
// The prompt is computed once: choice 0 (the leader) starts at once, and
// choices 1..n-1 start when the leader has written its first token (or its
// last message), that is once its prefill is done and the prompt's KV is in
// the prefill worker's prefix cache, where their own prefill finds it (the
// router's index sends them there) and computes at most the last partial
// page. Each choice is an ordinary request from then on: its own decode
// sequence, retries and migrations. A seeded request's choice i samples with
// seed + i; an unseeded one's choices draw their own seeds.
//
// The sink sees every choice's messages, each with GenerateResponse.index
// set, one Write at a time; OnPrompt and progress probes come from the
// leader only; OnReady is shared (each choice's pending callback runs when
// the sink has room). `done` runs once, after every started choice ended:
// OK when all ended OK, else the first error (the other choices are
// cancelled at that error). The client's cancel flag cancels every choice.
//
// Ownership: Start keeps the group alive until `done` ran; it holds the
// sink and the cancel flag until then.
// Thread-safety: the sink side is called from any thread; the group
// serialises what it forwards.
#pragma once

#include <functional>
#include <memory>

#include "lib/router/router.h"
#include "swaserve/v1/router.pb.h"

namespace swaserve::router {

// Starts one single-choice request (Router::Start for n <= 1).
using StartOneFn = std::function<void(const v1::GenerateRequest&, std::shared_ptr<GenerateSink>,
                                      std::shared_ptr<CancelFlag>, GenerateDone)>;

// Runs `request` (request.n() > 1; request_id set, so that every choice
// reports the same id) through `start_one`, as described above.
void StartChoiceGroup(const v1::GenerateRequest& request, std::shared_ptr<GenerateSink> sink,
                      std::shared_ptr<CancelFlag> cancel, GenerateDone done,
                      StartOneFn start_one);

}  // namespace swaserve::router
