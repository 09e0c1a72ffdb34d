// The wiring of one worker process, shared by the thin mains
// services/prefill (swaserve-prefill), services/decode (swaserve-decode) and
// services/worker (swaserve-worker --role=prefill|decode|both, monolithic
// serving): options (lib/worker/worker_options.h) → engine, pools, prefix
// cache, lib/worker cores, KV sender/receiver over one UCX TransferEngine,
// the gRPC services, /metrics, Redis membership; then serve until SIGTERM
// or SIGINT (health goes NOT_SERVING, new calls get ERROR_CODE_DRAINING,
// calls in flight drain within --drain, then everything is freed in
// reverse order).
//
// Exit codes: 0 after a clean stop, 1 on a start-up error, 2 on bad flags.
#pragma once

#include <string>

namespace swaserve::worker_service {

struct WorkerMainSpec {
  std::string program;      // "swaserve-prefill"
  std::string description;  // the --help line
  // "prefill" or "decode": the role is fixed (no --role flag); empty: the
  // --role flag chooses (default both).
  std::string fixed_role;
};

// main() of a worker binary. Call it first in main(): it blocks the
// termination signals before any thread starts.
int WorkerMain(const WorkerMainSpec& spec, int argc, char** argv);

}  // namespace swaserve::worker_service
