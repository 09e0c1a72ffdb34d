"""Writes the golden-logits fixtures of the mini released-layout checkpoints.

  /usr/bin/python3 tools/reference/make_layout_golden.py \
      --mini-dir /tmp/mini --seed 25 --out-dir tests/fixtures/model

--mini-dir holds the checkpoints written by
`build/tools/mini_checkpoints/make_mini_checkpoints /tmp/mini 25` (one
directory per layout of lib/model/mini_checkpoints.h: flash-bf16, flash-fp8,
flash-native, v2.5-fused-fp8). For each it writes mini_<layout>_golden.json:
the float64 reference logits (main model and MTP layer 0) of every position
of two token sequences, with FNV-1a 64 hashes of config.json and
model.safetensors so tests/unit/model/mini_checkpoints_test.cc can check it
regenerated the same checkpoint. The reference reads each layout as released
(FP8 dequantized with its block scales, the fused qkv_proj split per group,
the transformers-native config) through mimo_reference.prepare_weights.
"""

import argparse
import json
import os
import sys

import torch

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_golden import MIN_MARGIN, fnv1a64_file, make_sequence, row_json  # noqa: E402
from mimo_reference import MimoReference  # noqa: E402

LAYOUTS = ["flash-bf16", "flash-fp8", "flash-native", "v2.5-fused-fp8"]
# (kind, first seed, length); W = 8 for the mini layouts.
SEQUENCES = [("random", 2, 9), ("pattern", 3, 24)]


def golden(ckpt, layout, seed):
    ref = MimoReference.load(ckpt, dtype=torch.float64)
    vocab = ref.c.vocab_size
    seqs = []
    min_margin = float("inf")
    for kind, s, n in SEQUENCES:
        while True:  # the first seed whose routing has no near-tie
            tokens = make_sequence(kind, s, n, vocab)
            margins = []
            logits, mtp = ref.forward_with_mtp(tokens, margins=margins)
            m = min((float(t.min()) for t in margins), default=float("inf"))
            if m >= MIN_MARGIN:
                break
            s += 1000
        min_margin = min(min_margin, m)
        seqs.append('    {"tokens": ' + json.dumps(tokens) + ',\n     "logits": [\n      '
                    + ",\n      ".join(row_json(r) for r in logits) + '],\n     "mtp": [\n      '
                    + ",\n      ".join(row_json(r) for r in mtp[0]) + "]}")
    header = {
        "layout": layout,
        "seed": seed,
        "vocab": vocab,
        "config_fnv1a64": fnv1a64_file(os.path.join(ckpt, "config.json")),
        "safetensors_fnv1a64": fnv1a64_file(os.path.join(ckpt, "model.safetensors")),
        "reference": "tools/reference/mimo_reference.py, float64, torch " + torch.__version__,
        "min_router_margin": float(format(min_margin, ".9g")),
    }
    text = '{\n "checkpoint": ' + json.dumps(header) + ',\n "sequences": [\n'
    text += ",\n".join(seqs) + "\n ]\n}\n"
    json.loads(text)  # well-formed
    return text


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mini-dir", required=True)
    ap.add_argument("--seed", type=int, required=True, help="make_mini_checkpoints seed used")
    ap.add_argument("--out-dir", default="tests/fixtures/model")
    args = ap.parse_args()
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    for layout in LAYOUTS:
        text = golden(os.path.join(args.mini_dir, layout), layout, args.seed)
        out = os.path.join(args.out_dir, f"mini_{layout}_golden.json")
        with open(out, "w") as f:
            f.write(text)
        print(f"wrote {out}: {len(text)} bytes")


if __name__ == "__main__":
    main()
