#!/usr/bin/python3
"""PyTorch reference of the audio tower and its golden fixture.

Written from the formulas in lib/model/audio.h, not from audio.cc: float64,
torch.nn.functional.conv1d (padding 1, stride 1 then 2), F.layer_norm,
softmax attention over all frames, torch.erf GELU, Whisper's sinusoids, and
mean pooling of merge_size frames (the last token pools what is left).

Usage:
  build/bin/swaserve make-model --shape=tiny --seed=7 --vocab=256 \
      --tokenizer=none --audio --out=/tmp/tiny-audio
  /usr/bin/python3 tools/reference/audio_reference.py --checkpoint /tmp/tiny-audio \
      --seed 7 --out tests/fixtures/model/audio_tiny_golden.json

Inputs come from a formula both sides compute (clip i, frame t, mel bin c):
  x = sin(0.21 * t + 0.07 * c + 0.3 * i) * 0.8 + 0.1 * cos(0.05 * c * t)
Fixture: {"format": 1, "seed", "audio_fnv1a64", "audio_config",
          "clips": [{"frames", "embeddings": [[out_hidden] per token]}]}
tests/unit/model/audio_test.cc checks every embedding within 1e-4.
"""
import argparse
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mimo_reference import _read_safetensors_file  # noqa: E402
from vision_reference import fnv1a64  # noqa: E402

FRAMES = [7, 24, 1, 33]


def mel(i, frames, bins):
    t = torch.arange(frames, dtype=torch.float64).unsqueeze(1)
    c = torch.arange(bins, dtype=torch.float64).unsqueeze(0)
    x = torch.sin(0.21 * t + 0.07 * c + 0.3 * i) * 0.8 + 0.1 * torch.cos(0.05 * c * t)
    return x.to(torch.float32).to(torch.float64)


def gelu(x):
    return 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))


def encode(cfg, w, x):
    d = cfg["d_model"]
    heads = cfg["encoder_attention_heads"]
    hd = d // heads
    eps = cfg["layer_norm_eps"]
    m = cfg["merge_size"]
    p = "audio_tower."
    y = x.T.unsqueeze(0)  # [1, mels, T]
    y = gelu(F.conv1d(y, w[p + "conv1.weight"], w[p + "conv1.bias"], padding=1))
    y = gelu(F.conv1d(y, w[p + "conv2.weight"], w[p + "conv2.bias"], padding=1, stride=2))
    h = y[0].T  # [T', d]
    n = h.shape[0]
    half = d // 2
    inv = torch.exp(-math.log(10000.0) / (half - 1) * torch.arange(half, dtype=torch.float64))
    ang = torch.arange(n, dtype=torch.float64).unsqueeze(1) * inv.unsqueeze(0)
    h = h + torch.cat([ang.sin(), ang.cos()], dim=1)
    for i in range(cfg["encoder_layers"]):
        q_ = f"{p}layers.{i}."
        a = F.layer_norm(h, (d,), w[q_ + "self_attn_layer_norm.weight"],
                         w[q_ + "self_attn_layer_norm.bias"], eps)
        q = a @ w[q_ + "self_attn.q_proj.weight"].T + w[q_ + "self_attn.q_proj.bias"]
        k = a @ w[q_ + "self_attn.k_proj.weight"].T
        v = a @ w[q_ + "self_attn.v_proj.weight"].T + w[q_ + "self_attn.v_proj.bias"]
        q, k, v = (t.reshape(n, heads, hd).transpose(0, 1) for t in (q, k, v))
        o = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(hd), dim=-1) @ v
        o = o.transpose(0, 1).reshape(n, d)
        h = h + o @ w[q_ + "self_attn.out_proj.weight"].T + w[q_ + "self_attn.out_proj.bias"]
        b = F.layer_norm(h, (d,), w[q_ + "final_layer_norm.weight"],
                         w[q_ + "final_layer_norm.bias"], eps)
        h = h + gelu(b @ w[q_ + "fc1.weight"].T + w[q_ + "fc1.bias"]) @ w[q_ + "fc2.weight"].T \
            + w[q_ + "fc2.bias"]
    u = F.layer_norm(h, (d,), w[p + "layer_norm.weight"], w[p + "layer_norm.bias"], eps)
    pooled = torch.stack([u[s:s + m].mean(dim=0) for s in range(0, n, m)])
    return pooled @ w[p + "proj.weight"].T + w[p + "proj.bias"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    with open(os.path.join(args.checkpoint, "config.json")) as fh:
        cfg = json.load(fh)["audio_config"]
    path = os.path.join(args.checkpoint, "audio.safetensors")
    with open(path, "rb") as fh:
        digest = fnv1a64(fh.read())
    w = _read_safetensors_file(path, torch.float64)
    clips = []
    for i, frames in enumerate(FRAMES):
        y = encode(cfg, w, mel(i, frames, cfg["num_mel_bins"]))
        clips.append({"frames": frames,
                      "embeddings": [[float(v) for v in row] for row in y]})
    fixture = {"format": 1, "generator": "tools/reference/audio_reference.py",
               "seed": args.seed, "audio_fnv1a64": f"{digest:016x}",
               "audio_config": cfg, "clips": clips}
    with open(args.out, "w") as fh:
        json.dump(fixture, fh)
        fh.write("\n")
    print(f"wrote {args.out}: {len(clips)} clips, "
          f"{sum(len(c['embeddings']) for c in clips)} tokens")


if __name__ == "__main__":
    main()
