#!/usr/bin/env bash
# One agent session on the default local cluster (`swaserve up`, demo model):
# a long prompt that grows turn after turn (the previous prompt, its answer's
# worth of new text, a tool output), as agents send them. Each turn is a
# streamed /v1/completions whose prompt extends the previous one, so every
# turn after the first should find the previous prompt in the prefix cache.
# The session starts below the 64K-token bucket bound and grows across it:
# the turn that crosses it goes to the next bucket's prefill worker.
# For each turn: prompt tokens (usage), cached tokens (usage), the bucket,
# seconds to the first token, total seconds.
#
#   bash bench/cluster/agent_session.sh           # START=50000 STEP=4000 TURNS=5 (words)
#
# Knobs (environment): BUILD, OUT, START, STEP, TURNS (words; ~1.09
# demo-model tokens per word), UP_FLAGS (extra `swaserve up` flags), WORKERS
# (the prefill buckets whose counters are printed; "0 1").
#
#   START=231000 TURNS=4 WORKERS="1 2" bash bench/cluster/agent_session.sh   # across 256K
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
OUT=${OUT:-/tmp/swaserve-agent-session}
START=${START:-50000}
STEP=${STEP:-4000}
TURNS=${TURNS:-5}
mkdir -p "$OUT"
total=$((START + STEP * (TURNS - 1)))
/usr/bin/python3 bench/cluster/kjv_words.py "$total" "$OUT/words.txt"
. bench/cluster/up.sh
echo "== agent session: $TURNS turns, $START words growing by $STEP ($(grep -o 'buckets[^;]*' "$OUT/up.log" | head -1))"
/usr/bin/python3 - "$url" "$OUT/words.txt" "$START" "$STEP" "$TURNS" <<'PY'
import json, sys, time, urllib.request
url, path, start, step, turns = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])
words = open(path).read().split(" ")
bounds = [65536, 262144, 1048576]
print(f"{'turn':>4} {'prompt tok':>10} {'cached':>8} {'bucket':>6} {'TTFT s':>8} {'total s':>8}")
for t in range(turns):
    prompt = " ".join(words[:start + step * t])
    body = json.dumps({"model": "demo", "prompt": prompt, "max_tokens": 8, "stream": True,
                       "stream_options": {"include_usage": True}}).encode()
    req = urllib.request.Request(f"{url}/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    t0, ttft, usage = time.time(), None, {}
    with urllib.request.urlopen(req, timeout=7200) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: {"):
                continue
            c = json.loads(line[6:])
            if "error" in c:
                sys.exit(f"turn {t}: {c['error']}")
            if c.get("choices") and ttft is None:
                ttft = time.time() - t0
            if c.get("usage"):
                usage = c["usage"]
    n = usage.get("prompt_tokens", 0)
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    bucket = next(i for i, b in enumerate(bounds) if n < b)
    print(f"{t:>4} {n:>10} {cached:>8} {bucket:>6} {ttft:>8.1f} {time.time() - t0:>8.1f}",
          flush=True)
PY
m=$(curl -s "$url/metrics")
echo "router: $(echo "$m" | grep -E '^swaserve_router_(cached|prompt)_tokens_total' | tr '\n' ' ')"
# Each prefill worker's prefix-cache and L3 counters (with --kv.l3 in
# UP_FLAGS: what went to the shared tier and what a worker fetched from it).
for w in ${WORKERS:-0 1}; do
  mu=$(grep -o "prefill-$w ok (gRPC [0-9.:]*, metrics http://[0-9.:]*" "$OUT/up.log" | grep -o "http://.*")
  echo "prefill-$w: $(curl -s "$mu/metrics" | grep -E '^swaserve_(prefix_cache_l3_pages_total|prefill_l3_prefetch_total|prefill_requests_total|kv_l3_store_bytes_total|kv_l3_write_queue_dropped_total)' | tr '\n' ' ')"
done

