// swaserve-prefill: a prefill worker (swaserve.v1.Prefill over gRPC, KV
// shipped to decode workers over UCX, Prometheus metrics). A thin main over
// services/worker/worker_server.h; `--help` lists the options.
//
//   swaserve-prefill --model=DIR --listen=127.0.0.1:0 --redis=127.0.0.1:6379
//       --bucket=0 --prefill.max_prompt_tokens=65536
#include "services/worker/worker_server.h"

int main(int argc, char** argv) {
  return swaserve::worker_service::WorkerMain(
      {.program = "swaserve-prefill",
       .description = "A swaserve prefill worker (gRPC + UCX + Prometheus).",
       .fixed_role = "prefill"},
      argc, argv);
}
