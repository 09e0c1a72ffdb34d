#!/usr/bin/env bash
# Embedding cache on a real local cluster: `swaserve up` with the
# tiny random model plus its tiny vision tower (one encoder), and a replay of
# chat requests that each carry one image drawn from a pool with a Zipf
# popularity (repeated images, as in a product-photo or screenshot workload).
# Every prompt starts with its own text, so the KV prefix cache cannot reuse
# an image's placeholders: what a repeat saves here is the encoder's work
# (decode, preprocessing, the tower's forward). Replayed one request at a time
# (streamed; TTFT = time to the first content chunk), twice: the encoder's
# embedding cache on (--cache_mib 1024, the default) and off (--cache_mib 0).
# Prints the cache hit rate (the router's swaserve_router_media_items_total)
# and TTFT of first occurrences vs repeats in both modes.
#
#   bash bench/cluster/multimodal_replay.sh      # BUILD=build N=150 POOL=30 SIDE=448
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
OUT=${OUT:-/tmp/swaserve-multimodal-replay}
N=${N:-150}
POOL=${POOL:-30}
SIDE=${SIDE:-448}
PORT=${PORT:-18473}
mkdir -p "$OUT"
if [ ! -f "$OUT/model/visual.safetensors" ]; then
  "$BUILD/bin/swaserve" make-model --shape=tiny --vision --out="$OUT/model" --force >/dev/null
fi

up=""
trap '[ -n "$up" ] && kill -TERM $up 2>/dev/null; true' EXIT
for mode in on off; do
  case $mode in on) mib=1024 ;; off) mib=0 ;; esac
  rm -rf "$OUT/run-$mode"
  "$BUILD/bin/swaserve" up --model="$OUT/model" --run_dir="$OUT/run-$mode" --buckets=65536 \
      --http_port=$PORT --grpc_port=0 --extra_flags.encoder="--cache_mib=$mib" >"$OUT/up-$mode.log" 2>&1 &
  up=$!
  for _ in $(seq 1 600); do grep -q "Ctrl-C" "$OUT/up-$mode.log" 2>/dev/null && break; sleep 0.2; done
  python3 - "$PORT" "$N" "$POOL" "$SIDE" "$OUT/replay-$mode.json" <<'EOF'
import json, random, struct, sys, time, urllib.request, zlib, base64
port, n, pool, side, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]

def png(seed):  # an RGB gradient-and-checker pattern, different per seed
    rows = []
    for y in range(side):
        row = bytearray([0])
        for x in range(side):
            row += bytes(((x * 255 // side + seed * 37) % 256, (y * 255 // side + seed * 11) % 256,
                          255 if ((x // 16 + y // 16 + seed) % 2) else 0))
        rows.append(bytes(row))
    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xffffffff)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)) +
            chunk(b"IDAT", zlib.compress(b"".join(rows), 6)) + chunk(b"IEND", b""))

model = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models"))["data"][0]["id"]
images = [base64.b64encode(png(s)).decode() for s in range(pool)]
rng = random.Random(23)
weights = [1 / (k + 1) ** 1.1 for k in range(pool)]
seen, rows = set(), []
for i in range(n):
    k = rng.choices(range(pool), weights)[0]
    body = json.dumps({"model": model, "max_tokens": 2, "temperature": 0, "stream": True,
                       "messages": [{"role": "user", "content": [
                           {"type": "text", "text": f"Request {i}: what is in this picture?"},
                           {"type": "image_url", "image_url": {"url": "data:image/png;base64," + images[k]}}]}]})
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", body.encode(),
                                 {"Content-Type": "application/json"})
    t0 = time.monotonic()
    ttft = None
    with urllib.request.urlopen(req, timeout=120) as r:
        for line in r:
            if line.startswith(b"data: ") and b'"content"' in line and ttft is None:
                ttft = time.monotonic() - t0
    rows.append({"image": k, "repeat": k in seen, "ttft_s": ttft, "e2e_s": time.monotonic() - t0})
    seen.add(k)
json.dump(rows, open(out, "w"))
EOF
  curl -s "http://127.0.0.1:$PORT/metrics" | grep '^swaserve_router_media_items_total' >"$OUT/metrics-$mode.txt" || true
  kill -TERM $up; wait $up || true
  up=""
done

python3 - "$OUT" <<'EOF'
import json, statistics, sys
out = sys.argv[1]
def pct(v, q):
    v = sorted(v); return v[min(len(v) - 1, int(q * len(v)))]
print(f"{'cache':6} {'items':>5} {'hits':>5} {'hit rate':>8} {'first-seen TTFT p50 ms':>22} {'repeat TTFT p50 ms':>18} "
      f"{'all TTFT mean ms':>16} {'repeat TTFT p90 ms':>18}")
res = {}
for mode in ("on", "off"):
    rows = json.load(open(f"{out}/replay-{mode}.json"))
    hits = miss = 0
    for line in open(f"{out}/metrics-{mode}.txt"):
        k, v = line.split()
        if 'cache="hit"' in k: hits += float(v)
        if 'cache="miss"' in k: miss += float(v)
    first = [r["ttft_s"] for r in rows if not r["repeat"]]
    rep = [r["ttft_s"] for r in rows if r["repeat"]]
    res[mode] = statistics.mean(r["ttft_s"] for r in rows)
    print(f"{mode:6} {hits + miss:5.0f} {hits:5.0f} {100 * hits / max(hits + miss, 1):7.1f}% "
          f"{1000 * statistics.median(first):22.1f} {1000 * statistics.median(rep):18.1f} "
          f"{1000 * res[mode]:16.1f} {1000 * pct(rep, 0.9):18.1f}")
print(f"mean TTFT saved by the embedding cache: {1000 * (res['off'] - res['on']):.1f} ms per request "
      f"({100 * (res['off'] - res['on']) / res['off']:.1f}%)")
EOF
