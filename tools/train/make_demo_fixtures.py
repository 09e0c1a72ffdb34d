"""Writes the demo model's test fixture, tests/fixtures/model/demo_golden.json.

  /usr/bin/python3 tools/train/make_demo_fixtures.py --model models/demo \
      --corpus /tmp/demo-corpus --out tests/fixtures/model/demo_golden.json

Everything comes from the committed checkpoint and the corpus' held-out ids
(tools/train/prepare_corpus.py + train_tokenizer.js), through
tools/reference/mimo_reference.py, so the C++ test (tests/unit/model/
demo_model_test.cc) needs no Python:

  checkpoint   FNV-1a 64 of model.safetensors and config.json (the test
               first checks that the committed model is the one described)
  logits       one held-out sequence of 300 tokens (> 2 windows), float64
               reference: full rows at chosen positions for the main model
               and every MTP layer (chained, as the engine runs them), plus
               for every position the row's max |logit| and its top 8
               (id, value)
  valid_slice  the first 8 held-out chunks of 256 tokens and the training
               script's mean next-token loss on them (train_demo.evaluate on
               the exported bf16 weights, f32): the engine must match it
               within 1%. Also the loss on the whole held-out split.
  greedy       a held-out prompt and the reference's greedy continuation
               (40 tokens, recomputed from scratch each step)

Router near-ties: a sequence whose MoE routing has a gap below 1e-4 between
the k-th and (k+1)-th biased score (where an f32 engine could pick another
expert) is replaced by the next held-out chunk, as make_golden.py does.
"""

import argparse
import json
import os
import sys

import torch

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
sys.path.insert(0, HERE)
import mimo_reference as mr  # noqa: E402
import train_demo as td  # noqa: E402

MIN_MARGIN = 1e-4
LOGITS_LEN = 300
SLICE_CHUNKS = 8
GREEDY_PROMPT, GREEDY_NEW = 24, 40
TOPK = 8


def fnv1a64_file(path):
    h = 0xCBF29CE484222325
    with open(path, "rb") as f:
        data = f.read()
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & ((1 << 64) - 1)
    return f"{h:016x}"


def fmt(x):
    return format(float(x), ".8g")


def rows_json(rows):
    return "[" + ",\n  ".join("[" + ",".join(fmt(v) for v in r.tolist()) + "]" for r in rows) + "]"


def positions_for(n, W):
    want = [0, 1, W - 1, W, 2 * W - 1, 2 * W, n - 1]
    return sorted({p for p in want if 0 <= p < n})


def summary(rows):
    """Per row: max |value|, top-TOPK ids and values."""
    top = torch.topk(rows, TOPK, dim=-1)
    return {"max_abs": [float(fmt(v)) for v in rows.abs().amax(-1).tolist()],
            "top_ids": top.indices.tolist(),
            "top_values": [[float(fmt(v)) for v in r] for r in top.values.tolist()]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="models/demo")
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--out", default="tests/fixtures/model/demo_golden.json")
    args = ap.parse_args()
    torch.set_num_threads(1)

    ref = mr.MimoReference.load(args.model, dtype=torch.float64)
    c = ref.c
    valid = td.load_ids(os.path.join(args.corpus, "valid_ids.u16"))
    n_chunks = valid.numel() // td.VALID_SEQ
    chunks = valid[:n_chunks * td.VALID_SEQ].view(n_chunks, td.VALID_SEQ)
    _, tok_ids, _ = td.read_tokenizer(os.path.join(args.model, "tokenizer.json"))

    # 1. Logits of one held-out sequence (no router near-tie).
    start = 0
    while True:
        tokens = valid[start:start + LOGITS_LEN].tolist()
        margins = []
        with torch.no_grad():
            logits, mtp = ref.forward_with_mtp(tokens, margins=margins)
        m = min(float(t.min()) for t in margins)
        if m >= MIN_MARGIN:
            break
        print(f"held-out offset {start}: router near-tie ({m:.3g}); next", file=sys.stderr)
        start += LOGITS_LEN
    layers = [("main", logits)] + [(f"mtp{k}", t) for k, t in enumerate(mtp)]
    logit_parts = []
    for name, rows in layers:
        pos = positions_for(rows.shape[0], c.window)
        s = summary(rows)
        logit_parts.append(
            '  {"layer": "' + name + '", "positions": ' + json.dumps(pos) +
            ',\n  "rows": ' + rows_json(rows[pos]) +
            ',\n  "max_abs": ' + json.dumps(s["max_abs"]) +
            ',\n  "top_ids": ' + json.dumps(s["top_ids"]) +
            ',\n  "top_values": ' + json.dumps(s["top_values"]) + "}")

    # 2. The training script's loss on the held-out slice (and everywhere).
    exported = mr.MimoReference.load(args.model, dtype=torch.float32)
    bp = mr.BatchedPaths(exported)
    ev_slice = td.evaluate(bp, chunks[:SLICE_CHUNKS])
    ev_all = td.evaluate(bp, chunks)

    # 3. Greedy continuation of a held-out prompt (a chapter's first tokens).
    eot = [i for i, t in enumerate(valid.tolist()) if t == tok_ids["<|endoftext|>"]]
    p0 = eot[2] + 1
    prompt = valid[p0:p0 + GREEDY_PROMPT].tolist()
    gen = []
    with torch.no_grad():
        for _ in range(GREEDY_NEW):
            lg, _ = ref.forward(prompt + gen, logits_last_only=True)
            gen.append(int(lg[0].argmax()))

    header = {
        "format": 1,
        "generator": "tools/train/make_demo_fixtures.py (see tools/train/README.md)",
        "checkpoint": {
            "dir": "models/demo",
            "config_fnv1a64": fnv1a64_file(os.path.join(args.model, "config.json")),
            "safetensors_fnv1a64": fnv1a64_file(os.path.join(args.model, "model.safetensors")),
        },
        "reference": {"implementation": "tools/reference/mimo_reference.py",
                      "compute_dtype": "float64", "torch_version": torch.__version__,
                      "min_router_margin": float(fmt(m))},
        "valid_slice": {"chunk_tokens": td.VALID_SEQ,
                        "tokens": chunks[:SLICE_CHUNKS].reshape(-1).tolist(),
                        "train_script_loss": ev_slice["loss"],
                        "train_script_mtp_loss": ev_slice["mtp_loss"],
                        "whole_valid_loss": ev_all["loss"],
                        "whole_valid_tokens": ev_all["tokens"]},
        "greedy": {"prompt": prompt, "generated": gen},
    }
    text = "{\n"
    for key in ("format", "generator", "checkpoint", "reference", "valid_slice", "greedy"):
        text += f' "{key}": {json.dumps(header[key])},\n'
    text += ' "tokens": ' + json.dumps(tokens) + ',\n'
    text += ' "logits": [\n' + ",\n".join(logit_parts) + "\n ]\n}\n"
    json.loads(text)
    with open(args.out, "w") as f:
        f.write(text)
    print(f"wrote {args.out}: {len(text)} bytes; slice loss {ev_slice['loss']:.4f}, "
          f"whole held-out loss {ev_all['loss']:.4f}, min router margin {m:.3g}")


if __name__ == "__main__":
    main()
