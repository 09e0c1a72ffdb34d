"""Self-checks of mimo_reference.py (run before regenerating the fixture).

  /usr/bin/python3 tools/reference/selftest.py --checkpoint /tmp/tiny-golden

1. The blocked, GQA-grouped attention equals a literal Hugging Face style
   eager attention (repeat_kv, full T x T scores, causal + sliding-window
   mask `k > q - W`, softmax over cat([scores, sink]) with the sink column
   dropped) written independently below.
2. Query-block size and --swa-keys (mask / window) do not change results.
3. Causality: the logits of a prefix equal the first rows of the full run,
   for the main model and every MTP layer.
4. float32 and float64 runs agree within 1e-4 relative (the golden test's
   tolerance is met by a plain f32 implementation).
"""

import argparse
import os
import sys

import torch

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mimo_reference as mr  # noqa: E402


def literal_attention(self, p, x, geom, swa, positions):
    w = self.w
    T = x.shape[0]
    Hq, Hkv, D, Dv = geom.heads, geom.kv_heads, geom.head_dim, geom.v_head_dim
    q = (x @ w[p + "self_attn.q_proj.weight"].T).view(1, T, Hq, D).transpose(1, 2)
    k = (x @ w[p + "self_attn.k_proj.weight"].T).view(1, T, Hkv, D).transpose(1, 2)
    v = (x @ w[p + "self_attn.v_proj.weight"].T).view(1, T, Hkv, Dv).transpose(1, 2)
    v = v * self.c.v_scale
    rd = geom.rotary_dim
    inv_freq = 1.0 / (geom.theta ** (torch.arange(0, rd, 2, dtype=torch.float64) / rd))
    freqs = torch.outer(positions.double(), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    def rot(t):
        tr, tp = t[..., :rd], t[..., rd:]
        x1, x2 = tr[..., : rd // 2], tr[..., rd // 2:]
        tr = tr * cos + torch.cat((-x2, x1), dim=-1) * sin
        return torch.cat((tr, tp), dim=-1)

    q, k = rot(q), rot(k)
    rep = Hq // Hkv
    k = k[:, :, None].expand(1, Hkv, rep, T, D).reshape(1, Hq, T, D)  # repeat_kv
    v = v[:, :, None].expand(1, Hkv, rep, T, Dv).reshape(1, Hq, T, Dv)
    scores = q @ k.transpose(2, 3) * D ** -0.5
    qi = torch.arange(T)[:, None]
    ki = torch.arange(T)[None, :]
    allowed = ki <= qi
    if swa:
        allowed &= ki > qi - self.c.window
    scores = scores.masked_fill(~allowed, float("-inf"))
    if geom.sink:
        sinks = w[p + "self_attn.attention_sink_bias"].reshape(1, -1, 1, 1).expand(1, Hq, T, 1)
        comb = torch.cat([scores, sinks], dim=-1)
        comb = comb - comb.max(dim=-1, keepdim=True).values
        probs = torch.softmax(comb, dim=-1)[..., :-1]
    else:
        probs = torch.softmax(scores, dim=-1)
    o = (probs @ v).transpose(1, 2).reshape(T, Hq * Dv)
    return o @ w[p + "self_attn.o_proj.weight"].T


def rel(a, b):
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def run(ref, tokens):
    logits, mtp = ref.forward_with_mtp(tokens)
    return [logits] + mtp


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoint", required=True)
    args = ap.parse_args()
    g = torch.Generator().manual_seed(5)
    base = mr.MimoReference.load(args.checkpoint, dtype=torch.float64)
    V = base.c.vocab_size
    tokens = torch.randint(0, V, (3 * base.c.window + 11,), generator=g).tolist()
    want = run(base, tokens)
    failures = 0

    def check(name, got, tol):
        nonlocal failures
        worst = max(rel(a, b) for a, b in zip(got, want))
        ok = worst < tol and len(got) == len(want)
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {name}: worst relative difference {worst:.3g} "
              f"(tolerance {tol:g})")

    lit = mr.MimoReference(base.c, base.w, torch.float64)
    lit.attention = literal_attention.__get__(lit)
    check("literal HF-style attention", run(lit, tokens), 1e-12)
    for block in (1, 5, 16):
        r = mr.MimoReference(base.c, base.w, torch.float64, attn_block=block)
        check(f"attention block {block}", run(r, tokens), 1e-12)
    r = mr.MimoReference(base.c, base.w, torch.float64, attn_block=8, swa_keys="window")
    check("SWA keys by window", run(r, tokens), 1e-12)
    m = len(tokens) - 9
    pre = run(base, tokens[:m])
    worst = max(rel(a, b[: a.shape[0]]) for a, b in zip(pre, want))
    ok = worst < 1e-12
    failures += not ok
    print(f"{'ok  ' if ok else 'FAIL'} causality (prefix of {m} tokens): {worst:.3g}")
    r32 = mr.MimoReference.load(args.checkpoint, dtype=torch.float32)
    got32 = [t.double() for t in run(r32, tokens)]
    check("float32 vs float64", got32, 1e-4)
    if failures:
        sys.exit(f"{failures} check(s) failed")
    print("all reference self-checks passed")


if __name__ == "__main__":
    main()
