#!/usr/bin/env bash
# This engine against llama.cpp (node-llama-cpp's prebuilt CPU library) on the
# same checkpoint, threads and prompts, in one run: the checkpoint exported
# as stored (bf16 for the demo model) with `swaserve export-gguf`, then
# tools/llama_oracle/speed.mjs and build/bench/model/llama_compare_bench, each
# printing prefill tokens/s per prompt length, decode tokens/s after the first
# prompt and peak RSS; a table of both and their ratio at the end.
#
#   bash bench/llama_compare.sh [MODEL_DIR=models/demo] [THREADS=2] [PROMPTS=512,4096] [DECODE=64] [GGUF_DTYPE=stored]
# GGUF_DTYPE: how llama.cpp gets the weights (stored: as this engine holds
# them; f32: llama.cpp's f32 kernels on the same values).
# llama.cpp decodes one sequence here (batch 1); this engine also 8 and 16.
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-models/demo}
threads=${2:-2}
prompts=${3:-512,4096}
decode=${4:-64}
gguf_dtype=${5:-stored}
out=$(mktemp -d /tmp/llama-compare-XXXXXX)
trap 'rm -rf "$out"' EXIT
build/bin/swaserve export-gguf --model="$model" --out="$out/model.gguf" --dtype="$gguf_dtype" --log_level=warn
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
node tools/llama_oracle/speed.mjs "$out/model.gguf" "$threads" "$prompts" "$decode" > "$out/llama.jsonl"
build/bench/model/llama_compare_bench --checkpoint "$model" --threads "$threads" \
    --prompts "$prompts" --decode "$decode" --batches 1,8,16 > "$out/ours.jsonl"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$out/llama.jsonl" "$out/ours.jsonl" <<'PY'
import json, sys
def rows(path):
    out = {}
    for line in open(path):
        line = line.strip()
        if not line.startswith("{"): continue
        r = json.loads(line)
        if r["what"] == "prefill": out[("prefill", r["tokens"], 1)] = r["tokens_per_s"]
        elif r["what"] == "decode": out[("decode", r["context"], r.get("batch", 1))] = r["tokens_per_s"]
        else: out[("peak_rss_mib", 0, 0)] = r["value"]
    return out
theirs, ours = rows(sys.argv[1]), rows(sys.argv[2])
print(f"{'row':34} {'ours':>10} {'llama.cpp':>10} {'ratio':>7}")
for k in sorted(set(theirs) | set(ours), key=str):
    name = k[0] if k[0] == "peak_rss_mib" else f"{k[0]} ctx {k[1]} batch {k[2]} tok/s"
    o, t = ours.get(k), theirs.get(k)
    ratio = f"{o / t:.2f}" if o and t else "-"
    print(f"{name:34} {o if o is not None else '-':>10} {t if t is not None else '-':>10} {ratio:>7}")
PY
