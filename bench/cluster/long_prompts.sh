#!/usr/bin/env bash
# Long prompts in every length bucket on the default local cluster: `swaserve
# up` exactly as the README starts it (the demo model, buckets 0-64K /
# 64K-256K / 256K-1M, KV pools sized per bucket), then one streamed
# /v1/completions per prompt size in WORDS (random KJV-like words, ~1.09
# demo-model tokens per word), one at a time, max_tokens 8. For each: HTTP
# status, prompt tokens (usage), seconds to the first token, the SSE
# keep-alive comments seen before it (router --http.stream_keepalive), total
# seconds, the error if any, and the last comment (where the prefill stood:
# prompt tokens done, tokens/s). The prefill of a 300K-token prompt takes
# ~20-40 min on a 2-core VM (its two full-attention layers are quadratic).
#
#   bash bench/cluster/long_prompts.sh                   # WORDS="55000 92000"
#   WORDS="280000" bash bench/cluster/long_prompts.sh    # the 256K-1M bucket
#
# Knobs (environment): BUILD, OUT (result dir), WORDS (prompt sizes in words),
# UP_FLAGS (extra `swaserve up` flags).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
OUT=${OUT:-/tmp/swaserve-long-prompts}
WORDS=${WORDS:-"55000 92000"}
. bench/cluster/up.sh
grep "KV pools" "$OUT/up.log"
/usr/bin/python3 - "$url" $WORDS <<'PY'
import json, random, sys, time, urllib.error, urllib.request
url, sizes = sys.argv[1], [int(w) for w in sys.argv[2:]]
words = ("and the lord said unto moses behold i will bring thee to the land of israel that he "
         "may go in the house of his fathers and ye shall be upon them in that day").split()
print(f"{'words':>8} {'status':>6} {'prompt tok':>10} {'comments':>8} {'TTFT s':>8} {'total s':>8}  error")
for n in sizes:
    random.seed(n)
    body = json.dumps({"model": "demo", "prompt": " ".join(random.choice(words) for _ in range(n)),
                       "max_tokens": 8, "stream": True,
                       "stream_options": {"include_usage": True}}).encode()
    req = urllib.request.Request(f"{url}/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    t0, ttft, comments, tokens, status, err = time.time(), None, 0, 0, 0, ""
    last_comment = ""
    try:
        with urllib.request.urlopen(req, timeout=7200) as r:
            status = r.status
            for raw in r:
                line = raw.decode().strip()
                if line.startswith(":"):
                    comments += 1
                    last_comment = line
                elif line.startswith("data: {"):
                    c = json.loads(line[6:])
                    if "error" in c:
                        err = c["error"].get("message", str(c["error"]))
                    if c.get("choices") and ttft is None:
                        ttft = time.time() - t0
                    if c.get("usage"):
                        tokens = c["usage"]["prompt_tokens"]
    except urllib.error.HTTPError as e:
        status, err = e.code, e.read().decode()[:200]
    total = time.time() - t0
    print(f"{n:>8} {status:>6} {tokens:>10} {comments:>8} "
          f"{(f'{ttft:.1f}' if ttft is not None else '-'):>8} {total:>8.1f}  {err}", flush=True)
    if last_comment:
        print(f"{'':>8} last keep-alive comment: {last_comment}", flush=True)
PY
