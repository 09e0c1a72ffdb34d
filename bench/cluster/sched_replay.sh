#!/usr/bin/env bash
# Real-cluster trace replay of the prefill scheduling policies:
# the Mooncake conversation trace, scaled to CPU sizes, replayed through a
# local cluster (redis-server, 1 prefill worker, 1 decode worker, a router —
# real processes on loopback, KV over UCX) once with FCFS prefill scheduling
# and once with compute-aware priority + aging, then compared request by
# request (bench/cluster/compare_replays.py): TTFT, and each request's
# prefill scheduling wait (Usage.prefill_queue_seconds) against 2x its FCFS
# wait.
#
#   bash bench/cluster/sched_replay.sh            # BUILD=build N=600 ...
#
# Knobs (environment): BUILD (build dir), N (requests), LENGTH_SCALE (token
# lengths x this), TIME_SCALE (arrival times x this: smaller = busier),
# MAX_OUT (output token cap), OUT (result dir), THREADS (prefill threads),
# AGING (compute-aware wait credit, tokens per second waited; empty: the
# worker's default), POLICIES (default "fcfs compute_aware"; also
# "compute_aware_noguard": compute-aware with the FCFS-wait guard off),
# REPEAT (rounds, default 1: each round runs every policy once, in order, so
# that slow drifts of the machine hit every policy alike), PIN (1, the
# default with >= 2 CPUs: the prefill worker on CPU 0 and every other
# process on the other CPUs, so that the rest of the cluster does not slow
# prefill steps down by a different amount under each policy; 0: no pinning).
#
# Each run leaves $OUT/<run>.json (per request), <run>.txt (summary) and
# p1-<run>.metrics (the prefill worker's Prometheus metrics at the end).
#
# Near saturation two runs of the SAME policy differ a lot request by
# request; with REPEAT >= 3 the comparison uses each request's median TTFT
# over the FCFS runs and prints the FCFS-vs-FCFS noise floor
# (compare_replays.py).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
N=${N:-600}
LENGTH_SCALE=${LENGTH_SCALE:-0.0625}
TIME_SCALE=${TIME_SCALE:-0.15}
MAX_OUT=${MAX_OUT:-8}
THREADS=${THREADS:-1}
AGING=${AGING:-}
POLICIES=${POLICIES:-fcfs compute_aware}
REPEAT=${REPEAT:-1}
PIN=${PIN:-$([ "$(nproc)" -ge 2 ] && echo 1 || echo 0)}
pin_prefill=(); pin_rest=()
if [ "$PIN" = 1 ]; then
  pin_prefill=(taskset -c 0); pin_rest=(taskset -c "1-$(( $(nproc) - 1 ))")
fi
OUT=${OUT:-/tmp/swaserve-sched-replay}
# Data input outside the repository (docs/benchmarks.md#traces).
TRACE=${TRACE:-../shared/traces/mooncake_conversation_trace.jsonl}
mkdir -p "$OUT"
[ -f "$OUT/model/config.json" ] || "$BUILD/bin/swaserve" make-model --shape=tiny --out="$OUT/model" >/dev/null

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

port_of() {  # file key: waits for a port file and prints one of its ports
  for _ in $(seq 1 600); do [ -s "$1" ] && break; sleep 0.1; done
  python3 -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$1" "$2"
}

for round in $(seq 1 "$REPEAT"); do
for label in $POLICIES; do
  case "$label" in
    fcfs|compute_aware) policy=$label; extra=() ;;
    compute_aware_noguard) policy=compute_aware; extra=(--prefill.fcfs_wait_ratio=0) ;;
    *) echo "unknown policy $label" >&2; exit 2 ;;
  esac
  run=$label; [ "$REPEAT" -gt 1 ] && run=$label-$round
  rm -f "$OUT"/*.ports
  rport=$(python3 -c "import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); print(s.getsockname()[1])")
  "${pin_rest[@]}" redis-server --port "$rport" --bind 127.0.0.1 --save "" --appendonly no >"$OUT/redis-$run.log" 2>&1 &
  pids+=($!)
  common=(--model="$OUT/model" --model_name=tiny --redis=127.0.0.1:$rport --listen=127.0.0.1:0
          --metrics.host=127.0.0.1 --kv.prefill_mib=256 --kv.decode_mib=256 --log_level=warn)
  "${pin_prefill[@]}" "$BUILD/bin/swaserve-worker" "${common[@]}" --role=prefill --worker_id=p1 --threads="$THREADS" \
      --prefill.policy="$policy" ${AGING:+--prefill.aging_tokens_per_second=$AGING} "${extra[@]}" \
      --port_file="$OUT/p1.ports" >"$OUT/p1-$run.log" 2>&1 &
  pids+=($!)
  "${pin_rest[@]}" "$BUILD/bin/swaserve-worker" "${common[@]}" --role=decode --worker_id=d1 --threads=1 \
      --port_file="$OUT/d1.ports" >"$OUT/d1-$run.log" 2>&1 &
  pids+=($!)
  port_of "$OUT/p1.ports" grpc_port >/dev/null
  port_of "$OUT/d1.ports" grpc_port >/dev/null
  "${pin_rest[@]}" "$BUILD/bin/swaserve-router" --model="$OUT/model" --model_name=tiny --redis=127.0.0.1:$rport \
      --listen=127.0.0.1:0 --http.host=127.0.0.1 --http.port=0 --log_level=warn \
      --port_file="$OUT/r1.ports" >"$OUT/r1-$run.log" 2>&1 &
  pids+=($!)
  gport=$(port_of "$OUT/r1.ports" grpc_port)
  hport=$(port_of "$OUT/r1.ports" http_port)
  for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$hport/health" >/dev/null && break; sleep 0.1; done
  echo "== $run: replaying $N requests (length x$LENGTH_SCALE, time x$TIME_SCALE)" >&2
  "${pin_rest[@]}" "$BUILD/bin/swaserve" replay "$TRACE" --router=127.0.0.1:$gport --limit="$N" \
      --length_scale="$LENGTH_SCALE" --time_scale="$TIME_SCALE" --max_output_tokens="$MAX_OUT" \
      --concurrency=1024 --vocab_size=50000 --first_token_id=100 --reconstruct_continuations \
      --model=tiny --json="$OUT/$run.json" --json_requests --quiet | tee "$OUT/$run.txt"
  # The prefill worker's metrics after the run (scheduling wait histogram,
  # guarded starts, queue depth...), for looking into a run afterwards.
  curl -sf "http://127.0.0.1:$(port_of "$OUT/p1.ports" metrics_port)/metrics" \
      >"$OUT/p1-$run.metrics" || echo "note: could not scrape the prefill worker's metrics" >&2
  cleanup
  pids=()
done
done
for label in $POLICIES; do
  [ "$label" = fcfs ] && continue
  echo "== $label vs fcfs"
  if [ "$REPEAT" -gt 1 ]; then
    runs=(--baseline "$OUT"/fcfs-*.json --candidate "$OUT/$label"-*.json)
  else
    runs=("$OUT/fcfs.json" "$OUT/$label.json")
  fi
  for metric in ttft wait; do
    python3 bench/cluster/compare_replays.py --metric $metric --worst 5 "${runs[@]}"
  done
done
