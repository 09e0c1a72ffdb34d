#!/usr/bin/env bash
# A long prompt and short chats at once on the default local cluster: `swaserve
# up` (the demo model, buckets 0-64K / 64K-256K / 256K-1M) plus UP_FLAGS, one
# streamed /v1/completions of LONG random token ids (bucket 1 by default),
# and, 10 s after it starts, SHORTS streamed chat requests one after another
# (300 random KJV-like words, max_tokens 32: bucket 0). Prints the long
# prompt's time to its first token and the short requests' TTFT and total
# (p50, max). NOLONG=1 sends the short requests alone (the idle baseline).
#
#   bash bench/cluster/long_and_short.sh                          # defaults
#   UP_FLAGS="--prefill_nice_step=0" bash bench/cluster/long_and_short.sh
#   UP_FLAGS="--worker_threads=1" bash bench/cluster/long_and_short.sh
#
# Knobs (environment): BUILD, OUT, UP_FLAGS, LONG (tokens, 100000), SHORTS (20),
# NOLONG.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
OUT=${OUT:-/tmp/swaserve-long-and-short}
. bench/cluster/up.sh
url=$url/v1
LONG=${LONG:-100000} SHORTS=${SHORTS:-20} NOLONG=${NOLONG:-} /usr/bin/python3 - "$url" <<'PY'
import json, os, random, sys, threading, time, urllib.request
url = sys.argv[1]

def post(path, body):
    """Streams one request; returns (seconds to the first text, total seconds)."""
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0, ttft = time.time(), None
    with urllib.request.urlopen(req, timeout=7200) as r:
        for line in r:
            if ttft is None and line.startswith(b"data: {") and (b'"text"' in line or b'"content"' in line):
                ttft = time.time() - t0
    return ttft, time.time() - t0

res = {}
def long_request():
    rng = random.Random(7)
    ids = [rng.randrange(100, 4000) for _ in range(int(os.environ["LONG"]))]
    res["long"] = post("/completions", {"model": "demo", "prompt": ids, "max_tokens": 8, "stream": True})

th = None
if not os.environ.get("NOLONG"):
    th = threading.Thread(target=long_request)
    th.start()
    time.sleep(10)
words = "and the lord said unto moses behold i will bring thee to the land of israel".split()
shorts = []
for i in range(int(os.environ["SHORTS"])):
    rng = random.Random(100 + i)
    msg = " ".join(rng.choice(words) for _ in range(300))
    shorts.append(post("/chat/completions", {"model": "demo", "max_tokens": 32, "stream": True,
                                             "messages": [{"role": "user", "content": msg}]}))
if th is not None:
    th.join()
ttft = sorted(s[0] for s in shorts)
total = sorted(s[1] for s in shorts)
mid = len(shorts) // 2
print(("long prompt: first token after %.1f s; " % res["long"][0] if "long" in res else "no long prompt; ")
      + "short chats: TTFT p50 %.0f ms, max %.0f ms; total p50 %.0f ms, max %.0f ms"
      % (ttft[mid] * 1e3, ttft[-1] * 1e3, total[mid] * 1e3, total[-1] * 1e3))
PY
