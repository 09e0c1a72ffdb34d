#!/usr/bin/env bash
# A long prompt over gRPC with progress messages, on the default local
# cluster (`swaserve up`, demo model): `swaserve generate --prompt_file`
# with --progress_interval (GenerateRequest.progress_interval_ms), which
# prints a line on stderr for every progress message the router sends
# while the first token is awaited. Reports how many came, the largest gap
# between two (a proxy's stream idle timeout must never see one longer
# than the interval plus a little), whether the prefill's done tokens only
# grew, the time to the first token and the usage. The default prompt
# (280,000 words, ~305K demo-model tokens) lands in the 256K-1M bucket and
# takes ~20 min on a 2-core VM.
#
#   bash bench/cluster/long_grpc_progress.sh               # WORDS=280000, INTERVAL=15s
#   WORDS=50000 INTERVAL=2s bash bench/cluster/long_grpc_progress.sh
#
# Knobs (environment): BUILD, OUT, WORDS, INTERVAL, UP_FLAGS.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
OUT=${OUT:-/tmp/swaserve-long-grpc}
WORDS=${WORDS:-280000}
INTERVAL=${INTERVAL:-15s}
mkdir -p "$OUT"
PROMPT="$OUT/prompt.txt"
/usr/bin/python3 bench/cluster/kjv_words.py "$WORDS" "$PROMPT"
. bench/cluster/up.sh
grpc=$(grep -o "^  gRPC *[0-9.]*:[0-9]*" "$OUT/up.log" | awk '{print $2}')
echo "== $WORDS words over gRPC ($grpc), progress every $INTERVAL"
/usr/bin/python3 - "$BUILD/bin/swaserve" "$grpc" "$PROMPT" "$INTERVAL" <<'PY'
import re, subprocess, sys, threading, time
cli, grpc, prompt, interval = sys.argv[1:5]
t0 = time.time()
p = subprocess.Popen([cli, "generate", f"--router={grpc}", "--prompt_file", prompt,
                      "--max_tokens=8", f"--progress_interval={interval}", "--deadline=3h"],
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
first_text = []
def read_stdout():
    while True:
        c = p.stdout.read(1)
        if not c:
            return
        if not first_text and not c.isspace():
            first_text.append(time.time() - t0)
threading.Thread(target=read_stdout, daemon=True).start()
times, done, usage, other = [], [], "", []
for line in p.stderr:
    now = time.time() - t0
    line = line.rstrip("\n")
    if line.startswith("[waiting for the first token"):
        times.append(now)
        m = re.search(r"prefill ([\d,]+) of ([\d,]+)", line)
        if m:
            done.append(int(m.group(1).replace(",", "")))
        if len(times) % 8 == 1:
            print(f"  t={now:7.1f}s {line}", flush=True)
        last = line
    elif line.startswith("[usage"):
        usage = line
    else:
        other.append(line)
rc = p.wait()
gaps = [b - a for a, b in zip([0.0] + times, times)]
print(f"  last: {last if times else '-'}")
print(f"exit {rc}; {len(times)} progress lines; largest gap {max(gaps) if gaps else 0:.1f} s; "
      f"done tokens only grew: {all(b >= a for a, b in zip(done, done[1:]))} "
      f"({len(done)} with a token count); first token after "
      f"{first_text[0] if first_text else float('nan'):.1f} s; total {time.time() - t0:.1f} s")
print(f"  {usage}")
for line in other[:5]:
    print(f"  stderr: {line}")
PY
