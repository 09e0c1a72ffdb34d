// swaserve-decode: a decode worker (swaserve.v1.Decode over gRPC, KV staged
// in host memory as prefill workers ship it over UCX, continuous batching,
// Prometheus metrics). A thin main over services/worker/worker_server.h;
// `--help` lists the options.
//
//   swaserve-decode --model=DIR --listen=127.0.0.1:0 --redis=127.0.0.1:6379
#include "services/worker/worker_server.h"

int main(int argc, char** argv) {
  return swaserve::worker_service::WorkerMain(
      {.program = "swaserve-decode",
       .description = "A swaserve decode worker (gRPC + UCX + Prometheus).",
       .fixed_role = "decode"},
      argc, argv);
}
