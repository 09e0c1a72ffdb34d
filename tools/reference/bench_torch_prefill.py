"""PyTorch eager prefill throughput of a swaserve checkpoint: the baseline a
user would otherwise run on a CPU (the engine's "against PyTorch eager"
figure).

Runs tools/reference/mimo_reference.py's dense model in float32 (bf16/f16
weights are widened to f32 at load), torch.set_num_threads(--threads,
default 2), over random prompts of each length, and reports prefill tokens/s
(one forward over the whole prompt, logits of the last position only, as a
serving prefill does; no KV cache is kept).

How it computes (efficient eager PyTorch, not a strawman):
  - every projection is one matmul over the whole prompt (BLAS/oneDNN);
  - attention is batched matmuls over all heads of a KV group (GQA without
    repeating K/V), in query blocks so the score tensor stays ~2^27 floats;
    keys after a block's last query are not scored (causal);
  - SWA layers use masking (--swa-keys=mask, the default): each query block
    scores every causal key and masks those outside the window, as Hugging
    Face eager attention does; --swa-keys=window scores only the keys inside
    the window (what a hand-optimised user implementation could do);
  - MoE: sigmoid router, then each expert runs one matmul chain over the
    tokens routed to it (HF's per-expert loop);
  - RoPE in place on the rotary dims, softmax in place in a reused score
    buffer, cached masks;
  - process settings a tuned CPU deployment uses: OMP_WAIT_POLICY=PASSIVE
    unless set (the default spinning wait is pathological when the cores are
    shared) and glibc malloc kept from returning memory to the OS
    (--no-malloc-tuning to disable).

Usage:
  /usr/bin/python3 tools/reference/bench_torch_prefill.py \
      --checkpoint /tmp/pro-mini --lengths 2048,16384 --json /tmp/torch_prefill.json
Without --checkpoint it uses a tiny checkpoint at /tmp/swaserve-ref-tiny,
creating it with `swaserve make-model --shape=tiny` (the binary from
--swaserve, or build*/bin/swaserve) when absent.
"""

import argparse
import glob
import json
import os
import platform
import subprocess
import sys
import time

# libgomp's default (active, spinning) wait policy turns every parallel op
# into a scheduler time slice (~10 ms) when the 2 cores are shared with
# other processes: measured 20x slower attention on a loaded 2-core machine.
# Passive waiting costs nothing measurable on an idle one. Must be set before
# torch loads libgomp; an explicit setting in the environment wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mimo_reference import MimoReference  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_TINY = "/tmp/swaserve-ref-tiny"


def ensure_tiny(path, swaserve):
    if os.path.exists(os.path.join(path, "model.safetensors")):
        return path
    candidates = [swaserve] if swaserve else sorted(
        glob.glob(os.path.join(REPO, "build*", "bin", "swaserve")))
    candidates = [c for c in candidates if c and os.access(c, os.X_OK)]
    if not candidates:
        sys.exit(f"no checkpoint at {path} and no swaserve binary to make one; build "
                 f"it (ninja -C build swaserve_cli) or pass --checkpoint")
    cmd = [candidates[0], "make-model", "--shape=tiny", "--seed=1", "--vocab=256",
           "--tokenizer=none", f"--out={path}"]
    print("creating the tiny checkpoint:", " ".join(cmd), file=sys.stderr)
    subprocess.run(cmd, check=True)
    return path


def tune_malloc():
    """Keep freed memory in the process (glibc mallopt: no trimming, no
    per-allocation mmap), so the multi-MB activations of each layer reuse
    pages instead of faulting fresh zeroed ones in every op. Same effect as
    the jemalloc/tcmalloc LD_PRELOAD that PyTorch CPU tuning guides
    recommend; measured 36 s -> 22 s for a 2K-token prefill of the
    mimo-v2.5-pro-mini shape. Returns whether glibc accepted it."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4
        return bool(libc.mallopt(M_TRIM_THRESHOLD, 1 << 30)) and bool(libc.mallopt(M_MMAP_MAX, 0))
    except OSError:
        return False


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--checkpoint", default="", help="checkpoint dir (default: tiny)")
    ap.add_argument("--swaserve", default="", help="swaserve binary (to make tiny)")
    ap.add_argument("--lengths", default="2048,16384", help="prompt lengths, comma-separated")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=0,
                    help="timed runs per length, best kept (0: 5 below 8K tokens, else 1)")
    ap.add_argument("--swa-keys", choices=["mask", "window"], default="mask")
    ap.add_argument("--attn-block", type=int, default=0,
                    help="query rows per attention block (0: automatic)")
    ap.add_argument("--seed", type=int, default=0, help="prompt token seed")
    ap.add_argument("--no-malloc-tuning", action="store_true",
                    help="leave glibc malloc at its defaults (see tune_malloc)")
    ap.add_argument("--json", default="", help="write results here")
    args = ap.parse_args()

    malloc_tuned = False if args.no_malloc_tuning else tune_malloc()

    torch.set_num_threads(args.threads)
    ckpt = args.checkpoint or ensure_tiny(DEFAULT_TINY, args.swaserve)
    t0 = time.perf_counter()
    ref = MimoReference.load(ckpt, dtype=torch.float32, attn_block=args.attn_block or None,
                             swa_keys=args.swa_keys)
    load_s = time.perf_counter() - t0
    c = ref.c
    params = sum(t.numel() for t in ref.w.values())
    lengths = [int(x) for x in args.lengths.split(",") if x]
    gen = torch.Generator().manual_seed(args.seed)

    with torch.inference_mode():
        # Warm-up: BLAS/oneDNN initialisation, allocator.
        warm = torch.randint(0, c.vocab_size, (64,), generator=gen).tolist()
        ref.forward(warm, logits_last_only=True)
        results = []
        for n in lengths:
            tokens = torch.randint(0, c.vocab_size, (n,), generator=gen).tolist()
            reps = args.repeats or (5 if n < 8192 else 1)
            times = []
            for _ in range(reps):
                t = time.perf_counter()
                logits, _ = ref.forward(tokens, logits_last_only=True)
                times.append(time.perf_counter() - t)
                assert torch.isfinite(logits).all()
            best = min(times)
            results.append({"prompt_tokens": n, "seconds": best, "tokens_per_s": n / best,
                            "runs": times})

    swa = sum(c.swa_layers)
    print(f"PyTorch {torch.__version__} eager prefill, float32, {args.threads} threads, "
          f"SWA keys by {args.swa_keys}, OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}, "
          f"malloc tuned {'yes' if malloc_tuned else 'no'}, "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"checkpoint {ckpt}: {c.num_layers} layers ({c.num_layers - swa} full + {swa} SWA, "
          f"W {c.window}), hidden {c.hidden_size}, vocab {c.vocab_size}, "
          f"{params / 1e6:.1f}M params (load {load_s:.1f} s)")
    print(f"{'prompt tokens':>14} {'seconds':>10} {'tokens/s':>12}")
    for r in results:
        print(f"{r['prompt_tokens']:>14} {r['seconds']:>10.3f} {r['tokens_per_s']:>12.1f}")
    if args.json:
        out = {
            "benchmark": "torch_eager_prefill",
            "torch_version": torch.__version__,
            "python": platform.python_version(),
            "machine": platform.machine(),
            "threads": args.threads,
            "dtype": "float32",
            "swa_keys": args.swa_keys,
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
            "malloc_tuned": malloc_tuned,
            "load_average_at_end": os.getloadavg(),
            "checkpoint": os.path.abspath(ckpt),
            "model": {"layers": c.num_layers, "full_layers": c.num_layers - swa,
                      "swa_layers": swa, "window": c.window, "hidden_size": c.hidden_size,
                      "vocab_size": c.vocab_size, "params": params},
            "results": results,
        }
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
            f.write("\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
