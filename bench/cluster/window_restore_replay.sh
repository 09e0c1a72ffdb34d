#!/usr/bin/env bash
# Window restore on a real local cluster: `swaserve up` with the
# demo model (10 SWA + 2 full layers, 3 MTP layers, W = 128: a restore
# recomputes ~1.7K tokens before the full-KV match end), one prefill bucket,
# a prefill SWA pool of 2% of its full pool's tokens (--kv.swa_full_ratio=0.02:
# full KV stays cached while SWA windows are evicted), and a synthetic
# Mooncake-format trace of conversations that share a long prompt and
# diverge mid-prompt at random block boundaries. Replayed one request at a
# time, five times: window restore on (computed as a pyramid, starting at the
# window-safe hit when that lies inside the stretch: the defaults), restore
# only from the stretch's start (`stretch`,
# --prefill.window_restore_from_window_safe=false), restore computing every
# layer over the whole stretch (`rect`, --prefill.window_restore_pyramid=false
# --prefill.window_restore_from_window_safe=false), restore plus SWA checkpoints every
# 2048 tokens (the worker's defaults), and neither; prints the prefill compute
# (prompt minus cached tokens, from the replay's usage), the restores (the
# prefill worker's counters), the prefill worker's busy seconds (the sum of
# its step times) and TTFT and wall time from the replay report.
#
#   bash bench/cluster/window_restore_replay.sh      # BUILD=build CONV=8 REQ=6 BLOCKS=48
#
# Knobs (environment): BUILD, OUT (result dir), MODES (a subset of
# "on stretch rect ckpt ckptstay off"; off is needed for the savings), CONV (conversations), REQ
# (requests per conversation after the first), BLOCKS (blocks per shared
# prompt), SCALE (tokens per block = 512 x SCALE), RATIO (prefill SWA/full
# token ratio).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
MODES=${MODES:-on stretch rect ckpt off}
OUT=${OUT:-/tmp/swaserve-window-restore}
CONV=${CONV:-8}
REQ=${REQ:-5}
BLOCKS=${BLOCKS:-48}
SCALE=${SCALE:-0.25}
RATIO=${RATIO:-0.02}
mkdir -p "$OUT"

python3 - "$OUT/trace.jsonl" "$CONV" "$REQ" "$BLOCKS" <<'EOF'
import json, random, sys
path, conv, req, blocks = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rng = random.Random(20)
rows, t, fresh = [], 0, 10**6
bases = [[c * 10000 + j for j in range(blocks)] for c in range(conv)]
# Every conversation's whole prompt first, then rounds in which each
# conversation diverges at a random block (its tail: one new block).
order = [(c, blocks) for c in range(conv)]
for _ in range(req):
    order += [(c, rng.randrange(blocks // 3, blocks)) for c in range(conv)]
for c, k in order:
    fresh += 1
    ids = bases[c][:k] + [fresh]
    rows.append({"timestamp": t, "input_length": 512 * len(ids), "output_length": 4, "hash_ids": ids})
    t += 10
with open(path, "w") as f:
    for r in rows:
        f.write(json.dumps(r) + "\n")
print(f"trace: {len(rows)} requests, {sum(r['input_length'] for r in rows)} tokens before scaling", file=sys.stderr)
EOF

metric() {  # port name{labels}: one sample's value (0 when absent)
  curl -s "http://127.0.0.1:$1/metrics" | awk -v k="$2" '$1 == k {print $2; found=1} END {if (!found) print 0}'
}

# on: restore only; stretch: restore only from the stretch's start; rect: and
# without the pyramid; ckpt: restore + SWA checkpoints every 2048 tokens (the
# worker's defaults); ckptstay: the same with the checkpoints kept while hot
# windows go (--prefill.swa_checkpoints_yield=false); off: neither.
for mode in $MODES; do
  pyr=true safe=true yield=true
  case $mode in on) work=64 ckpt=0 ;; stretch) work=64 ckpt=0 safe=false ;;
    rect) work=64 ckpt=0 pyr=false safe=false ;;
    ckpt) work=64 ckpt=2048 ;; ckptstay) work=64 ckpt=2048 yield=false ;;
    off) work=-1 ckpt=0 ;; esac
  rm -rf "$OUT/run-$mode"
  "$BUILD/bin/swaserve" up --run_dir="$OUT/run-$mode" --buckets=65536 --http_port=0 --grpc_port=50071 \
      --workers.prefill.kv.swa_full_ratio="$RATIO" --workers.prefill.metrics.port=9471 \
      --workers.prefill.prefill.window_restore_min_saved_work=$work \
      --workers.prefill.prefill.window_restore_pyramid=$pyr \
      --workers.prefill.prefill.window_restore_from_window_safe=$safe \
      --workers.prefill.prefill.swa_checkpoint_tokens=$ckpt \
      --workers.prefill.prefill.swa_checkpoints_yield=$yield >"$OUT/up-$mode.log" 2>&1 &
  up=$!
  for _ in $(seq 1 600); do grep -q "Ctrl-C" "$OUT/up-$mode.log" 2>/dev/null && break; sleep 0.2; done
  "$BUILD/bin/swaserve" replay "$OUT/trace.jsonl" --router=127.0.0.1:50071 --concurrency=1 --time_scale=0 \
      --length_scale="$SCALE" --vocab_size=4096 --first_token_id=8 --quiet --json="$OUT/replay-$mode.json" \
      >"$OUT/replay-$mode.txt"
  sleep 2  # the last prefill's counters land after its ship completes
  {
    echo "mode=$mode"
    for k in 'swaserve_prefill_prompt_tokens_total' 'swaserve_prefill_tokens_total{source="computed"}' \
             'swaserve_prefill_tokens_total{source="cached"}' 'swaserve_prefill_window_restore_requests_total' \
             'swaserve_prefill_window_restore_tokens_total' 'swaserve_prefill_window_restore_saved_tokens_total' \
             'swaserve_prefill_window_restore_from_window_safe_total' 'swaserve_prefill_step_seconds_sum'; do
      echo "$k $(metric 9471 "$k")"
    done
  } >"$OUT/metrics-$mode.txt"
  kill -TERM $up; wait $up || true
done

python3 - "$OUT" $MODES <<'EOF'
import json, sys
out = sys.argv[1]
modes = sys.argv[2:]
def load(mode):
    m = {}
    for line in open(f"{out}/metrics-{mode}.txt"):
        k, _, v = line.strip().rpartition(" ")
        if k: m[k] = float(v)
    return m, json.load(open(f"{out}/replay-{mode}.json"))
# Prompt and cached tokens from the replay's usage (every request; a restored
# hit counts its full-KV match minus the stretch recomputed); restores from
# the prefill worker's counters.
res = {mode: load(mode) for mode in modes}
print(f"{'restore':8} {'requests':>8} {'prompt tok':>11} {'cached':>10} {'computed':>10} {'computed/req':>12} "
      f"{'restores':>8} {'from L':>6} {'recomputed':>10} {'saved':>8} {'busy s':>7} {'TTFT p50 ms':>11} {'TTFT mean ms':>12} {'wall s':>7} {'failed':>6}")
computed = {}
for mode, (m, rep) in res.items():
    n = rep["succeeded"]
    computed[mode] = rep["prompt_tokens"] - rep["cached_tokens"]
    print(f"{mode:8} {n:8d} {rep['prompt_tokens']:11d} {rep['cached_tokens']:10d} {computed[mode]:10d} "
          f"{computed[mode] / max(n, 1):12.0f} "
          f"{m['swaserve_prefill_window_restore_requests_total']:8.0f} "
          f"{m.get('swaserve_prefill_window_restore_from_window_safe_total', 0):6.0f} "
          f"{m['swaserve_prefill_window_restore_tokens_total']:10.0f} "
          f"{m['swaserve_prefill_window_restore_saved_tokens_total']:8.0f} "
          f"{m['swaserve_prefill_step_seconds_sum']:7.1f} "
          f"{1000 * rep['ttft_s']['p50']:11.1f} {1000 * rep['ttft_s']['mean']:12.1f} "
          f"{rep['duration_s']:7.1f} {rep['failed']:6d}")
names = {"rect": "window restore without the pyramid",
         "stretch": "window restore from the stretch's start only", "on": "window restore",
         "ckpt": "window restore + SWA checkpoints",
         "ckptstay": "window restore + SWA checkpoints that do not yield"}
for mode, what in names.items():
    if mode not in res or "off" not in res:
        continue
    saved = computed["off"] - computed[mode]
    print(f"prefill compute saved by {what}: {saved} tokens "
          f"({100 * saved / max(computed['off'], 1):.1f}% of the prefill compute without it), "
          f"{saved / max(res[mode][1]['succeeded'], 1):.0f} per request")
busy = {mode: res[mode][0]['swaserve_prefill_step_seconds_sum'] for mode in res}
print("prefill busy seconds: " + ", ".join(f"{mode} {b:.1f}" for mode, b in busy.items()))
EOF
