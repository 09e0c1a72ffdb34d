"""Writes the golden-logits fixture of the tiny checkpoint.

Usage (see tools/reference/README.md for the full regeneration recipe):
  /usr/bin/python3 tools/reference/make_golden.py \
      --checkpoint /tmp/tiny-golden --shape tiny --seed 20240611 \
      --out tests/fixtures/model/tiny_golden.json

The checkpoint must have been written by
`swaserve make-model --shape=<shape> --seed <seed> --vocab <V> --out <dir>`
(or WriteRandomCheckpoint(BuiltinConfig(shape, V), seed, dir) from C++);
--shape and --seed are recorded so the C++ test can regenerate the same
checkpoint, and FNV-1a 64 hashes of its config.json and model.safetensors
are recorded so the test can tell when the generator changed.

Fixture layout (tests/fixtures/model/tiny_golden.json):
  {
    "format": 1,
    "generator": "tools/reference/make_golden.py",
    "checkpoint": {"shape", "seed", "vocab", "dtype",
                   "config_fnv1a64", "safetensors_fnv1a64" (16 hex digits)},
    "reference": {"compute_dtype": "float64", "min_router_margin": m},
    "sequences": [
      {"tokens": [...],
       "logits": [[V floats] per position],          # main model, every position
       "mtp": [{"layer": k, "logits": [[V floats] per MTP position]}]}
    ]
  }
Every row is stored in full: the tiny vocabulary (256) keeps the file well
under 2 MB. MTP layer k's row p is the MTP logits at MTP position p, whose
input token is tokens[p + 1 + k] (see mimo_reference.py); it predicts
tokens[p + 2 + k]. Values are float64 results rounded to 9 significant
digits.

min_router_margin is the smallest gap, over every MoE routing decision of
every sequence, between the k-th and (k+1)-th biased router score. A
sequence whose routing has a gap below 1e-4 (where an f32 engine could
legitimately pick a different expert) is replaced deterministically by the
next seed (seed + 1000, ...).
"""

import argparse
import json
import os
import sys

import torch

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mimo_reference import MimoReference  # noqa: E402

MIN_MARGIN = 1e-4


def fnv1a64_file(path):
    """FNV-1a 64 of a file's bytes, as 16 lower-case hex digits."""
    h = 0xCBF29CE484222325
    prime = 0x100000001B3
    mask = (1 << 64) - 1
    with open(path, "rb") as f:
        data = f.read()
    # Plain loop; the tiny checkpoint is about 1 MB.
    for b in data:
        h = ((h ^ b) * prime) & mask
    return f"{h:016x}"


def lcg_tokens(seed, n, vocab):
    """Deterministic token ids: 64-bit LCG (Knuth MMIX constants), top bits."""
    x = seed & ((1 << 64) - 1)
    out = []
    for _ in range(n):
        x = (x * 6364136223846793005 + 1442695040888963407) & ((1 << 64) - 1)
        out.append((x >> 33) % vocab)
    return out


def make_sequence(kind, seed, n, vocab):
    if kind == "random":
        return lcg_tokens(seed, n, vocab)
    # "pattern": a period-7 motif with every 5th token replaced: attention
    # with sharp peaks on earlier repeats.
    motif = lcg_tokens(seed, 7, vocab)
    return [(motif[i % 7] if i % 5 else (motif[i % 7] * 7 + 3) % vocab) for i in range(n)]


# The fixture's sequences (W = 16 for tiny): (kind, first seed, length).
SEQUENCES = [
    ("random", 1, 1),    # one token: embedding -> logits, no MTP position
    ("random", 2, 9),    # inside one window
    ("pattern", 3, 40),  # > 2 windows
    ("random", 4, 70),   # > 4 windows
]


def fmt(x):
    return format(float(x), ".9g")


def row_json(row):
    return "[" + ",".join(fmt(v) for v in row.tolist()) + "]"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--checkpoint", required=True, help="checkpoint directory")
    ap.add_argument("--shape", default="tiny", help="make-model shape used")
    ap.add_argument("--seed", type=int, required=True, help="make-model seed used")
    ap.add_argument("--out", default="tests/fixtures/model/tiny_golden.json")
    args = ap.parse_args()

    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    ref = MimoReference.load(args.checkpoint, dtype=torch.float64)
    with open(os.path.join(args.checkpoint, "config.json")) as f:
        cfg = json.load(f)
    vocab = ref.c.vocab_size

    seq_json = []
    min_margin = float("inf")
    for kind, seed, n in SEQUENCES:
        # Deterministic retry: the first seed (seed, seed + 1000, ...) whose
        # routing has no near-tie.
        while True:
            tokens = make_sequence(kind, seed, n, vocab)
            margins = []
            logits, mtp = ref.forward_with_mtp(tokens, margins=margins)
            m = min((float(t.min()) for t in margins), default=float("inf"))
            if m >= MIN_MARGIN:
                break
            print(f"{kind} sequence of {n} tokens, seed {seed}: router near-tie "
                  f"(margin {m:.3g}); trying seed {seed + 1000}", file=sys.stderr)
            seed += 1000
        min_margin = min(min_margin, m)
        parts = ['    {"tokens": ' + json.dumps(tokens) + ',\n     "logits": [\n      '
                 + ",\n      ".join(row_json(r) for r in logits) + "],\n"]
        mtp_parts = []
        for k, ml in enumerate(mtp):
            mtp_parts.append('      {"layer": ' + str(k) + ', "logits": [\n       '
                             + ",\n       ".join(row_json(r) for r in ml) + "]}")
        parts.append('     "mtp": [' + ("\n" + ",\n".join(mtp_parts) + "\n     " if mtp_parts else "")
                     + "]}")
        seq_json.append("".join(parts))

    header = {
        "format": 1,
        "generator": "tools/reference/make_golden.py (see tools/reference/README.md)",
        "checkpoint": {
            "shape": args.shape,
            "seed": args.seed,
            "vocab": vocab,
            "dtype": cfg.get("torch_dtype", "float32"),
            "config_fnv1a64": fnv1a64_file(os.path.join(args.checkpoint, "config.json")),
            "safetensors_fnv1a64": fnv1a64_file(
                os.path.join(args.checkpoint, "model.safetensors")),
        },
        "reference": {
            "implementation": "tools/reference/mimo_reference.py",
            "compute_dtype": "float64",
            "torch_version": torch.__version__,
            "min_router_margin": float(fmt(min_margin)) if min_margin != float("inf") else None,
        },
    }
    text = "{\n"
    for key in ("format", "generator", "checkpoint", "reference"):
        text += f' "{key}": {json.dumps(header[key])},\n'
    text += ' "sequences": [\n' + ",\n".join(seq_json) + "\n ]\n}\n"
    json.loads(text)  # well-formed
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(text)
    print(f"wrote {args.out}: {len(seq_json)} sequences, {len(text)} bytes, "
          f"min router margin {min_margin:.3g}")


if __name__ == "__main__":
    main()
