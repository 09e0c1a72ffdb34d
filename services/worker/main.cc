// swaserve-worker: a prefill worker, a decode worker, or both in one process
// (--role=prefill|decode|both; both = monolithic serving), serving
// swaserve.v1.Prefill / swaserve.v1.Decode over gRPC, moving KV over UCX,
// exporting Prometheus metrics. swaserve-prefill and swaserve-decode are
// the same server with the role fixed. The wiring: worker_server.h.
//
//   swaserve-worker --model=DIR --role=both --listen=127.0.0.1:0
//                   --port_file=/tmp/w.json   # {"grpc_port": N, "metrics_port": M}
#include "services/worker/worker_server.h"

int main(int argc, char** argv) {
  return swaserve::worker_service::WorkerMain(
      {.program = "swaserve-worker",
       .description = "A swaserve prefill and/or decode worker (gRPC + UCX + Prometheus).",
       .fixed_role = ""},
      argc, argv);
}
