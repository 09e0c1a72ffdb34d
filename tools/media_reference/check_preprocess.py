#!/usr/bin/python3
"""Checks lib/media's preprocessing against PyTorch.

Runs build/tests/unit/media/media_preprocess_dump on generated inputs and
compares with the formulas of lib/media/image_preprocess.h and mel.h written
in PyTorch:
  image: smart resize (Python round), F.interpolate(bilinear,
         align_corners=False, antialias=False), /255, (x - mean) / std,
         patches [gh*gw, 3*p*p] in [c][dy][dx] order
  mel:   torch.stft(n_fft 400, hop 160, periodic Hann, center, reflect),
         |.|^2 without the last frame, Slaney mel filters (librosa's formula,
         float64 -> float32), log10 clamp 1e-10, max - 8 floor, (x + 4) / 4

Tolerances (max |difference|): log-mel 1e-4 (measured ~6e-6); image patches
2e-4 in normalised units (measured ~1.2e-4, i.e. < 0.01 of one 8-bit level):
PyTorch 1.13's 2-D bilinear kernel rounds some blend weights differently
(its 1-D source positions match ours to float rounding; the last bits of
the 2-D case were not tracked down).

Needs python3-torch and python3-numpy (scripts/install-deps.sh --torch).
Usage: tools/media_reference/check_preprocess.py [--dump PATH]
           [--image_tolerance T] [--mel_tolerance T]
Exit status 0 when every case is within its tolerance.
"""
import argparse
import math
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

MEAN = [0.48145466, 0.4578275, 0.40821073]
STD = [0.26862954, 0.26130258, 0.27577711]


def smart_resize(h, w, f, min_px, max_px):
    hb = max(f, round(h / f) * f)
    wb = max(f, round(w / f) * f)
    if hb * wb > max_px:
        b = math.sqrt(h * w / max_px)
        hb = max(f, math.floor(h / b / f) * f)
        wb = max(f, math.floor(w / b / f) * f)
    elif hb * wb < min_px:
        b = math.sqrt(min_px / (h * w))
        hb = math.ceil(h * b / f) * f
        wb = math.ceil(w * b / f) * f
    return hb, wb


def image_reference(img, p, merge, min_px, max_px):
    h, w, _ = img.shape
    th, tw = smart_resize(h, w, p * merge, min_px, max_px)
    x = torch.from_numpy(img).permute(2, 0, 1)[None].float()
    x = F.interpolate(x, size=(th, tw), mode="bilinear", align_corners=False,
                      antialias=False)[0]
    x = x / 255.0
    x = (x - torch.tensor(MEAN)[:, None, None]) / torch.tensor(STD)[:, None, None]
    gh, gw = th // p, tw // p
    x = x.reshape(3, gh, p, gw, p).permute(1, 3, 0, 2, 4).reshape(gh * gw, 3 * p * p)
    return x.numpy(), (gh, gw)


def slaney_mel_filters(sr, n_fft, n_mels):
    f_sp = 200.0 / 3
    min_log_hz, min_log_mel, logstep = 1000.0, 1000.0 / f_sp, math.log(6.4) / 27.0

    def hz_to_mel(f):
        return min_log_mel + math.log(f / min_log_hz) / logstep if f >= min_log_hz else f / f_sp

    def mel_to_hz(m):
        return min_log_hz * np.exp(logstep * (m - min_log_mel)) if m >= min_log_mel else f_sp * m

    fft_freqs = np.linspace(0, sr / 2, 1 + n_fft // 2)
    mels = np.linspace(hz_to_mel(0.0), hz_to_mel(sr / 2), n_mels + 2)
    mel_f = np.array([mel_to_hz(m) for m in mels])
    fdiff = np.diff(mel_f)
    ramps = mel_f[:, None] - fft_freqs[None, :]
    weights = np.zeros((n_mels, len(fft_freqs)))
    for i in range(n_mels):
        lower = -ramps[i] / fdiff[i]
        upper = ramps[i + 2] / fdiff[i + 1]
        weights[i] = np.maximum(0, np.minimum(lower, upper))
    weights *= (2.0 / (mel_f[2:n_mels + 2] - mel_f[:n_mels]))[:, None]
    return weights.astype(np.float32)


def mel_reference(audio, n_mels, sr=16000, n_fft=400, hop=160):
    x = torch.from_numpy(audio)
    stft = torch.stft(x, n_fft, hop, window=torch.hann_window(n_fft), return_complex=True)
    mag = stft[..., :-1].abs() ** 2
    mel = torch.from_numpy(slaney_mel_filters(sr, n_fft, n_mels)) @ mag
    log_spec = torch.clamp(mel, min=1e-10).log10()
    log_spec = torch.maximum(log_spec, log_spec.max() - 8.0)
    return ((log_spec + 4.0) / 4.0).T.contiguous().numpy()


def run(dump, args):
    out = subprocess.run([dump] + [str(a) for a in args], check=True, capture_output=True,
                         text=True)
    return [int(v) for v in out.stdout.split()]


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser()
    parser.add_argument("--dump", default=os.path.join(
        here, "../../build/tests/unit/media/media_preprocess_dump"))
    parser.add_argument("--image_tolerance", type=float, default=2e-4)
    parser.add_argument("--mel_tolerance", type=float, default=1e-4)
    a = parser.parse_args()
    rng = np.random.default_rng(23)
    worst = 0.0
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        for (w, h, p, merge, min_px, max_px) in [(640, 480, 14, 2, 3136, 1003520),
                                                  (37, 23, 14, 2, 3136, 1003520),
                                                  (1000, 201, 16, 2, 4096, 200000),
                                                  (300, 300, 14, 1, 3136, 50000)]:
            img = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
            img[: h // 2] = np.linspace(0, 255, w, dtype=np.uint8)[None, :, None]  # smooth half
            img.tofile(f"{tmp}/in.rgb")
            gh, gw = run(a.dump, ["image", w, h, f"{tmp}/in.rgb", f"{tmp}/out.f32", p, merge,
                                  min_px, max_px])
            ref, (rh, rw) = image_reference(img, p, merge, min_px, max_px)
            got = np.fromfile(f"{tmp}/out.f32", dtype=np.float32).reshape(gh * gw, 3 * p * p)
            diff = float(np.abs(got - ref).max()) if (gh, gw) == (rh, rw) else math.inf
            worst = max(worst, diff)
            ok = diff <= a.image_tolerance
            failed |= not ok
            print(f"image {w}x{h} p={p} merge={merge}: grid {gh}x{gw} (torch {rh}x{rw}), "
                  f"max |diff| {diff:.3g} {'ok' if ok else 'FAIL'}")
        for seconds, n_mels in [(1.3, 80), (4.0, 128)]:
            t = np.arange(int(seconds * 16000)) / 16000
            audio = (0.3 * np.sin(2 * np.pi * 440 * t) + 0.1 * rng.standard_normal(t.size))
            audio = audio.astype(np.float32)
            audio.tofile(f"{tmp}/in.f32")
            frames, mels = run(a.dump, ["mel", f"{tmp}/in.f32", f"{tmp}/out.f32", n_mels])
            ref = mel_reference(audio, n_mels)
            got = np.fromfile(f"{tmp}/out.f32", dtype=np.float32).reshape(frames, mels)
            diff = float(np.abs(got - ref).max()) if got.shape == ref.shape else math.inf
            worst = max(worst, diff)
            ok = diff <= a.mel_tolerance
            failed |= not ok
            print(f"log-mel {seconds} s, {n_mels} mels: {frames} frames (torch {ref.shape[0]}), "
                  f"max |diff| {diff:.3g} {'ok' if ok else 'FAIL'}")
    print(f"worst max |diff| {worst:.3g}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
