#!/usr/bin/python3
"""PyTorch reference of the vision tower and its golden fixture.

Written from the formulas in lib/model/vision.h, not from vision.cc: dense
float64 tensors, attention through an explicit [N, N] mask (windowed layers:
same window id; full layers: all patches), torch's own RMSNorm arithmetic,
torch.erf GELU, rotary angles from torch.outer.

Usage:
  build/bin/swaserve make-model --shape=tiny --seed=7 --vocab=256 \
      --tokenizer=none --vision --out=/tmp/tiny-vision
  /usr/bin/python3 tools/reference/vision_reference.py --checkpoint /tmp/tiny-vision \
      --seed 7 --out tests/fixtures/model/vision_tiny_golden.json

Inputs are defined by a formula both sides compute (no patch data in the
fixture): image i, patch row r, value index c:
  x = sin(0.37 * r + 0.11 * c + 0.05 * i) * (1 + 0.5 * cos(0.013 * c * (i + 1)))
Fixture: {"format": 1, "seed", "visual_fnv1a64", "vision_config",
          "images": [{"grid_h", "grid_w", "embeddings": [[out_hidden] per token]}]}
tests/unit/model/vision_test.cc regenerates the tower with the same seed,
checks the hash, and compares every embedding within 1e-4.
"""
import argparse
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mimo_reference import _read_safetensors_file  # noqa: E402

GRIDS = [(4, 6), (10, 8), (2, 2)]


def fnv1a64(data):
    h = 0xCBF29CE484222325
    for b in data:
        h ^= b
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def patches(i, n, dim):
    r = torch.arange(n, dtype=torch.float64).unsqueeze(1)
    c = torch.arange(dim, dtype=torch.float64).unsqueeze(0)
    x = torch.sin(0.37 * r + 0.11 * c + 0.05 * i) * (1 + 0.5 * torch.cos(0.013 * c * (i + 1)))
    # The C++ side computes the formula in double and rounds to float.
    return x.to(torch.float32).to(torch.float64)


def rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def encode(cfg, w, x, gh, gw):
    d = cfg["hidden_size"]
    heads = cfg["num_heads"]
    hd = d // heads
    m = cfg["spatial_merge_size"]
    eps = cfg["rms_norm_eps"]
    ws = cfg["window_size"] // cfg["patch_size"] if cfg["window_size"] > 0 else 0
    full_idx = set(cfg["fullatt_block_indexes"])
    n = gh * gw
    h = x @ w["visual.patch_embed.proj.weight"].T
    gy = torch.arange(gh).repeat_interleave(gw).to(torch.float64)
    gx = torch.arange(gw).repeat(gh).to(torch.float64)
    f = hd // 4
    inv = cfg["rope_theta"] ** (-torch.arange(f, dtype=torch.float64) / f)
    ang = torch.cat([torch.outer(gy, inv), torch.outer(gx, inv)], dim=1)  # [n, hd/2]
    cos = torch.cat([ang.cos(), ang.cos()], dim=1).unsqueeze(1)           # [n, 1, hd]
    sin = torch.cat([ang.sin(), ang.sin()], dim=1).unsqueeze(1)

    def rope(t):  # t [n, heads, hd]
        t1, t2 = t[..., : hd // 2], t[..., hd // 2:]
        return t * cos + torch.cat([-t2, t1], dim=-1) * sin

    if ws > 0:
        win = (gy.long() // ws) * 100000 + (gx.long() // ws)
        window_mask = win.unsqueeze(0) == win.unsqueeze(1)
    for i in range(cfg["depth"]):
        p = f"visual.blocks.{i}."
        a = rms(h, w[p + "norm1.weight"], eps)
        qkv = a @ w[p + "attn.qkv.weight"].T + w[p + "attn.qkv.bias"]
        q, k, v = qkv.split(d, dim=-1)
        q = rope(q.reshape(n, heads, hd)).transpose(0, 1)  # [heads, n, hd]
        k = rope(k.reshape(n, heads, hd)).transpose(0, 1)
        v = v.reshape(n, heads, hd).transpose(0, 1)
        s = q @ k.transpose(1, 2) / math.sqrt(hd)
        if ws > 0 and i not in full_idx:
            s = s.masked_fill(~window_mask, float("-inf"))
        o = (torch.softmax(s, dim=-1) @ v).transpose(0, 1).reshape(n, d)
        h = h + o @ w[p + "attn.proj.weight"].T + w[p + "attn.proj.bias"]
        b = rms(h, w[p + "norm2.weight"], eps)
        g = b @ w[p + "mlp.gate_proj.weight"].T + w[p + "mlp.gate_proj.bias"]
        u = b @ w[p + "mlp.up_proj.weight"].T + w[p + "mlp.up_proj.bias"]
        h = h + (torch.nn.functional.silu(g) * u) @ w[p + "mlp.down_proj.weight"].T \
            + w[p + "mlp.down_proj.bias"]
    u = rms(h, w["visual.merger.ln_q.weight"], eps)
    # [gh/m, m, gw/m, m, d] -> tokens (by, bx) with (dy, dx) blocks in order.
    u = u.reshape(gh // m, m, gw // m, m, d).permute(0, 2, 1, 3, 4).reshape(-1, m * m * d)
    y = u @ w["visual.merger.mlp.0.weight"].T + w["visual.merger.mlp.0.bias"]
    y = 0.5 * y * (1 + torch.erf(y / math.sqrt(2)))
    return y @ w["visual.merger.mlp.2.weight"].T + w["visual.merger.mlp.2.bias"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    with open(os.path.join(args.checkpoint, "config.json")) as fh:
        cfg = json.load(fh)["vision_config"]
    path = os.path.join(args.checkpoint, "visual.safetensors")
    with open(path, "rb") as fh:
        digest = fnv1a64(fh.read())
    w = _read_safetensors_file(path, torch.float64)
    dim = 3 * cfg["patch_size"] ** 2
    images = []
    for i, (gh, gw) in enumerate(GRIDS):
        y = encode(cfg, w, patches(i, gh * gw, dim), gh, gw)
        images.append({"grid_h": gh, "grid_w": gw,
                       "embeddings": [[float(v) for v in row] for row in y]})
    fixture = {"format": 1, "generator": "tools/reference/vision_reference.py",
               "seed": args.seed, "visual_fnv1a64": f"{digest:016x}",
               "vision_config": cfg, "images": images}
    with open(args.out, "w") as fh:
        json.dump(fixture, fh)
        fh.write("\n")
    print(f"wrote {args.out}: {len(images)} images, "
          f"{sum(len(im['embeddings']) for im in images)} tokens")


if __name__ == "__main__":
    main()
