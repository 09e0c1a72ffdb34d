#!/usr/bin/env bash
# A rolling restart of a prefill worker in the middle of a long prompt: the
# default local cluster (demo model; one prefill worker per length bucket,
# all sharing the L3 Redis), a non-streamed ~60K-token prompt (bucket 0), and
# SIGTERM of bucket 0's worker AFTER seconds into its prefill. Its drain
# (10 s) is shorter than the prefill, so the prompt goes to bucket 1's
# worker (bucket fallback). With the hand-back (the default,
# --drain_handback=3s) bucket 0's worker ends the prefill itself 3 s before
# its drain deadline, puts what it computed in L3 and answers DRAINING once
# that is stored: the retry resumes from L3. `off` (--drain_handback=0s):
# the deadline cancels the call. One request per mode, each on a freshly
# started cluster.
#
# SIGNAL=KILL: kill -9 instead (nothing runs in the victim: no hand-back);
# `on` is then the default L3 checkpoints of long prefills (every 16,384
# computed tokens, --prefill.l3_checkpoint_tokens), `off` turns them off.
#
#   bash bench/cluster/prefill_sigterm.sh
#   SIGNAL=KILL AFTER=40 bash bench/cluster/prefill_sigterm.sh
#
# Knobs (environment): BUILD, OUT, WORDS (55000), AFTER (6), MODES ("on off"),
# VICTIM (prefill-0: bucket 0's worker; prefill-1 for a prompt of bucket 1,
# e.g. WORDS=92000, whose retry goes to bucket 2), SIGNAL (TERM, or KILL),
# PREFILL_FLAGS (extra prefill-worker flags in every mode, comma-separated,
# e.g. --kv.l3_queue_mib=4: checkpoints larger than the write-behind queue).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
OUT=${OUT:-/tmp/swaserve-prefill-sigterm}
WORDS=${WORDS:-55000}
AFTER=${AFTER:-6}
MODES=${MODES:-"on off"}
VICTIM=${VICTIM:-prefill-0}
PREFILL_FLAGS=${PREFILL_FLAGS:-}
SIGNAL=${SIGNAL:-TERM}
case "$SIGNAL" in
  TERM) OFF_FLAG="--drain_handback=0s"; WHAT="hand-back" ;;
  KILL) OFF_FLAG="--prefill.l3_checkpoint_tokens=0"; WHAT="L3 checkpoints" ;;
  *) echo "SIGNAL must be TERM or KILL" >&2; exit 2 ;;
esac
mkdir -p "$OUT"
/usr/bin/python3 bench/cluster/kjv_words.py "$WORDS" "$OUT/prompt.txt"
/usr/bin/python3 -c 'import json, sys; print(json.dumps({"model": "demo", "prompt": open(sys.argv[1]).read(), "max_tokens": 8, "temperature": 0}))' \
  "$OUT/prompt.txt" > "$OUT/body.json"
for mode in $MODES; do
  (
    flags="$PREFILL_FLAGS"
    [ "$mode" = off ] && flags="${flags:+$flags,}$OFF_FLAG"
    UP_FLAGS="${flags:+--extra_flags.prefill=$flags}"
    OUT="$OUT/$mode"
    . bench/cluster/up.sh
    echo "== $WHAT $mode: $WORDS words, SIG$SIGNAL of $VICTIM after $AFTER s"
    t0=$(date +%s.%N)
    curl -s -X POST "$url/v1/completions" -H 'Content-Type: application/json' \
      --data-binary @"$OUT/../body.json" > "$OUT/answer.json" &
    client=$!
    sleep "$AFTER"
    victim_port=$(grep -o '"metrics_port":[0-9]*' "$OUT/run/$VICTIM.ports.json" | cut -d: -f2)
    curl -s "http://127.0.0.1:$victim_port/metrics" | grep -E '^swaserve_prefill_(step_tokens_sum|l3_checkpoint)' || true
    kill -"$SIGNAL" "$(grep -o '"pid":[0-9]*' "$OUT/run/$VICTIM.ports.json" | cut -d: -f2)"
    wait $client
    echo "answered after $(echo "$(date +%s.%N) - $t0" | bc) s"
    /usr/bin/python3 -c 'import json, sys; d = json.loads(open(sys.argv[1]).read()); print("usage", json.dumps(d.get("usage")), "text", json.dumps(d["choices"][0]["text"]) if "choices" in d else d)' "$OUT/answer.json"
    grep -h "ended after" "$OUT/run/$VICTIM.log" | sed 's/ \[type.googleapis.*\])/)/' | tail -1 || true
    for f in "$OUT"/run/prefill-*.ports.json; do
      [ "$(basename "$f" .ports.json)" = "$VICTIM" ] && continue
      port=$(grep -o '"metrics_port":[0-9]*' "$f" | cut -d: -f2)
      pm=$(curl -s "http://127.0.0.1:$port/metrics" || true)
      echo "$(basename "$f" .ports.json): computed $(echo "$pm" | grep '^swaserve_prefill_step_tokens_sum' | awk '{print $2}') tokens;" \
        "L3 prefetch hits $(echo "$pm" | grep '^swaserve_prefill_l3_prefetch_total{result="hit"}' | awk '{print $2}')"
    done
  )
done
