#!/usr/bin/env bash
# KV tiers on a real local cluster: `swaserve up` with the demo
# model, one prefill bucket with a small L1 (--workers.prefill.kv.prefill_mib)
# so that the scaled Mooncake conversation trace evicts, replayed with its
# timing four times:
#   none      no tiers (kv.l2_ratio=0): eviction deletes
#   l2        L2 host pool of L2X x L1 bytes (the worker default is 2)
#   l2l3      L2 + an L3 file store (kv.l3=file:DIR, bounded by L3_MIB)
#   restart   the same as l2l3 in a NEW cluster over l2l3's L3 directory:
#             a restarted worker that comes back warm
# and prints TTFT P50/P90, cached tokens (replay usage) and the tier
# counters of the prefill worker.
#
#   bash bench/cluster/tier_replay.sh       # BUILD=build LIMIT=400 KV_MIB=24
#
# Knobs (environment): BUILD, OUT (result dir), LIMIT (requests), SCALE
# (length scale), TIME_SCALE, KV_MIB (prefill L1 MiB), BUCKET (the bucket's
# largest prompt: at most what KV_MIB holds, or the prefill worker refuses to
# start; 24 MiB holds 6,160 tokens of the demo model), L2X, L3_MIB,
# MAX_OUT (max output tokens).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
OUT=${OUT:-/tmp/swaserve-tiers}
LIMIT=${LIMIT:-400}
SCALE=${SCALE:-0.0625}
TIME_SCALE=${TIME_SCALE:-0.05}
KV_MIB=${KV_MIB:-24}
BUCKET=${BUCKET:-6144}
L2X=${L2X:-2}
L3_MIB=${L3_MIB:-1024}
MAX_OUT=${MAX_OUT:-8}
# Data input outside the repository (docs/benchmarks.md#traces).
TRACE=../shared/traces/mooncake_conversation_trace.jsonl
mkdir -p "$OUT"
rm -rf "$OUT/l3"

metric() {  # port name{labels}: one sample's value (0 when absent)
  curl -s "http://127.0.0.1:$1/metrics" | awk -v k="$2" '$1 == k {print $2; found=1} END {if (!found) print 0}'
}

for mode in none l2 l2l3 restart; do
  case $mode in
    none) tiers=(--workers.prefill.kv.l2_ratio=0) ;;
    l2) tiers=(--workers.prefill.kv.l2_ratio="$L2X") ;;
    l2l3|restart) tiers=(--workers.prefill.kv.l2_ratio="$L2X" --workers.prefill.kv.l3="file:$OUT/l3"
                         --workers.prefill.kv.l3_mib="$L3_MIB") ;;
  esac
  rm -rf "$OUT/run-$mode"
  "$BUILD/bin/swaserve" up --run_dir="$OUT/run-$mode" --buckets="$BUCKET" --http_port=0 --grpc_port=50072 \
      --workers.prefill.kv.prefill_mib="$KV_MIB" --workers.prefill.metrics.port=9472 \
      "${tiers[@]}" >"$OUT/up-$mode.log" 2>&1 &
  up=$!
  for _ in $(seq 1 600); do grep -q "Ctrl-C" "$OUT/up-$mode.log" 2>/dev/null && break; sleep 0.2; done
  "$BUILD/bin/swaserve" replay "$TRACE" --router=127.0.0.1:50072 --limit="$LIMIT" --concurrency=64 \
      --time_scale="$TIME_SCALE" --length_scale="$SCALE" --max_output_tokens="$MAX_OUT" \
      --reconstruct_continuations --vocab_size=4096 --first_token_id=8 --quiet \
      --json="$OUT/replay-$mode.json" >"$OUT/replay-$mode.txt"
  sleep 2
  {
    echo "mode=$mode"
    for k in 'swaserve_prefix_cache_tier_moved_pages_total{direction="demoted"}' \
             'swaserve_prefix_cache_tier_moved_pages_total{direction="loaded_back"}' \
             'swaserve_prefix_cache_l3_pages_total{op="written"}' \
             'swaserve_prefix_cache_l3_pages_total{op="attached"}' \
             'swaserve_prefill_l3_prefetch_total{result="hit"}' \
             'swaserve_prefill_l3_prefetch_total{result="miss"}' \
             'swaserve_prefill_l3_prefetch_total{result="timeout"}'; do
      echo "$k $(metric 9472 "$k")"
    done
  } >"$OUT/metrics-$mode.txt"
  kill -TERM $up; wait $up || true  # SIGTERM: the worker writes its cache back to L3
done

python3 - "$OUT" <<'EOF'
import json, sys
out = sys.argv[1]
modes = ("none", "l2", "l2l3", "restart")
def load(mode):
    m = {}
    for line in open(f"{out}/metrics-{mode}.txt"):
        k, _, v = line.strip().rpartition(" ")
        if k: m[k] = float(v)
    return m, json.load(open(f"{out}/replay-{mode}.json"))
print(f"{'tiers':8} {'ok':>5} {'fail':>4} {'prompt tok':>10} {'cached':>9} {'hit %':>6} "
      f"{'TTFT p50 ms':>11} {'TTFT p90 ms':>11} {'demoted':>8} {'loaded':>7} {'to L3':>7} "
      f"{'from L3':>7} {'pf hit/miss/timeout':>19}")
def g(m, name, label):
    return m.get(name + "{" + label + "}", 0)
mv = "swaserve_prefix_cache_tier_moved_pages_total"
l3 = "swaserve_prefix_cache_l3_pages_total"
pf = "swaserve_prefill_l3_prefetch_total"
for mode in modes:
    m, rep = load(mode)
    hit = 100 * rep["cached_tokens"] / max(rep["prompt_tokens"], 1)
    prefetch = "%.0f/%.0f/%.0f" % (g(m, pf, 'result="hit"'), g(m, pf, 'result="miss"'),
                                   g(m, pf, 'result="timeout"'))
    print("%-8s %5d %4d %10d %9d %6.1f %11.1f %11.1f %8.0f %7.0f %7.0f %7.0f %19s" % (
        mode, rep["succeeded"], rep["failed"], rep["prompt_tokens"], rep["cached_tokens"], hit,
        1000 * rep["ttft_s"]["p50"], 1000 * rep["ttft_s"]["p90"],
        g(m, mv, 'direction="demoted"'), g(m, mv, 'direction="loaded_back"'),
        g(m, l3, 'op="written"'), g(m, l3, 'op="attached"'), prefetch))
EOF
