#!/usr/bin/python3
"""Prefill and decode tokens/s of the demo model: local cluster vs PyTorch eager.

  /usr/bin/python3 bench/cluster/demo_throughput.py --build build-demo \
      --corpus /tmp/demo-corpus --json /tmp/demo_throughput.json

In one run, on the same machine, one after the other:

1. The local cluster: `swaserve up --model models/demo` (redis-server, the
   prefill workers, one decode worker, the router; KV over UCX), driven over
   its OpenAI HTTP API (/v1/completions, streaming, token-id prompts,
   temperature 0, ignore_eos so every request makes exactly --new-tokens).
   For batch size B, B requests are sent at once. Prompts are held-out KJV
   token windows of --prompt-tokens tokens whose first token is unique per
   request, so no request hits the prefix cache.
     prefill tokens/s = sum of prompt tokens / (latest first-token time)
     decode tokens/s  = sum of (completion tokens - 1) /
                        (latest last-token time - latest first-token time)
   (times from sending; with B = 1 these are prompt / TTFT and (n - 1) /
   (e2e - TTFT)). The prefill side runs the 3 MTP layers over the prompt
   as well (their KV), as the prefill worker does; decode runs the main
   model only (no MTP speculation in decode yet).
2. PyTorch eager (tools/reference/mimo_reference.py, float32, the same
   weights, --torch-threads threads): prefill = the batched forward over
   [B, prompt] (main model, then the 3 MTP layers over the prompt, logits of
   the last position); decode = one token per step for each of the B
   sequences with a per-layer KV cache (written here, checked against the
   cache-free reference at start), --new-tokens - 1 steps.

Each measurement is the best of --repeats runs. Results: a table and, with
--json, a JSON file. Numbers go to bench/RESULTS.md with this command.
"""

import argparse
import json
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import torch

sys.dont_write_bytecode = True
REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(REPO, "tools", "reference"))
import mimo_reference as mr  # noqa: E402


def load_ids(path):
    import numpy as np
    return torch.from_numpy(np.fromfile(path, dtype="<u2").astype("int64"))


class Prompts:
    """Held-out windows with a unique first token each (no cache hits)."""

    def __init__(self, ids, n):
        self.ids, self.n, self.next = ids, n, 0
        self.windows = (ids.numel() - 1) // n

    def take(self):
        k = self.next
        self.next += 1
        w = self.ids[(k % self.windows) * self.n:(k % self.windows + 1) * self.n].tolist()
        w[0] = k % 3837 + 256          # unique per request for the first 3837 requests
        return w


# ---------------------------------------------------------------------------
# The cluster.

def start_cluster(swaserve, model, run_dir, worker_threads):
    cmd = [swaserve, "up", f"--model={model}", "--http_port=0", "--grpc_port=0",
           f"--run_dir={run_dir}", f"--worker_threads={worker_threads}"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url, lines = None, []
    deadline = time.time() + 180
    while time.time() < deadline:
        line = p.stdout.readline()
        if not line:
            break
        lines.append(line)
        m = re.search(r"OpenAI HTTP\s+(http://\S+)/v1", line)
        if m:
            url = m.group(1)
        if "Press Ctrl-C" in line:
            break
    if url is None:
        p.kill()
        sys.exit("swaserve up did not come up:\n" + "".join(lines))
    threading.Thread(target=lambda: [None for _ in p.stdout], daemon=True).start()
    return p, url


def stream_completion(url, model_name, prompt, new_tokens, out):
    body = json.dumps({"model": model_name, "prompt": prompt, "max_tokens": new_tokens,
                       "temperature": 0, "ignore_eos": True, "stream": True,
                       "stream_options": {"include_usage": True}}).encode()
    req = urllib.request.Request(url + "/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    first = last = None
    usage = None
    with urllib.request.urlopen(req, timeout=600) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            j = json.loads(data)
            if j.get("usage"):
                usage = j["usage"]
            if j.get("choices") and j["choices"][0].get("text") is not None:
                now = time.perf_counter()
                if first is None:
                    first = now
                last = now
    out.update({"first": first - t0, "last": last - t0, "usage": usage})


def cluster_run(url, model_name, prompts, batch, new_tokens):
    results = [dict() for _ in range(batch)]
    threads = [threading.Thread(target=stream_completion,
                                args=(url, model_name, prompts.take(), new_tokens, results[i]))
               for i in range(batch)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    prompt_tokens = sum(r["usage"]["prompt_tokens"] for r in results)
    completion = sum(r["usage"]["completion_tokens"] for r in results)
    first = max(r["first"] for r in results)
    last = max(r["last"] for r in results)
    return {"prefill_tokens_per_s": prompt_tokens / first,
            "decode_tokens_per_s": (completion - batch) / max(1e-9, last - first),
            "prompt_tokens": prompt_tokens, "completion_tokens": completion,
            "latest_first_token_s": first, "latest_last_token_s": last}


# ---------------------------------------------------------------------------
# PyTorch eager with a KV cache.

class CachedModel:
    """Eager decode over the reference's weights with per-layer K/V caches."""

    def __init__(self, ref):
        self.r, self.c, self.w = ref, ref.c, ref.w
        self.bp = mr.BatchedPaths(ref)

    def _attn(self, p, x, geom, swa, cache, start):
        w, c = self.w, self.c
        B, n, _ = x.shape
        Hq, Hkv, D, Dv = geom.heads, geom.kv_heads, geom.head_dim, geom.v_head_dim
        rep = Hq // Hkv
        pos = torch.arange(start, start + n)
        cos, sin = mr.rope_cos_sin(pos, geom.rotary_dim, geom.theta, x.dtype)
        q = (x @ w[p + "self_attn.q_proj.weight"].t()).view(B, n, Hkv, rep, D).permute(0, 2, 3, 1, 4)
        k = (x @ w[p + "self_attn.k_proj.weight"].t()).view(B, n, Hkv, D).permute(0, 2, 1, 3)
        v = (x @ w[p + "self_attn.v_proj.weight"].t()).view(B, n, Hkv, Dv).permute(0, 2, 1, 3)
        q = mr._rope_batched(q, cos, sin, geom.rotary_dim) * D ** -0.5
        k = mr._rope_batched(k, cos, sin, geom.rotary_dim)
        v = v * c.v_scale
        if p in cache:
            k = torch.cat([cache[p][0], k], dim=2)
            v = torch.cat([cache[p][1], v], dim=2)
        if swa:  # keep the last W - 1 + n keys: all any of the n queries needs
            keep = c.window - 1 + n
            k, v = k[:, :, -keep:], v[:, :, -keep:]
        cache[p] = (k[:, :, -(c.window - 1):] if swa else k,
                    v[:, :, -(c.window - 1):] if swa else v)
        nk = k.shape[2]
        kpos = torch.arange(start + n - nk, start + n)
        hide = kpos[None, :] > pos[:, None]
        if swa:
            hide = hide | (kpos[None, :] <= pos[:, None] - c.window)
        s = (q.reshape(B, Hkv, rep * n, D) @ k.transpose(-1, -2)).view(B, Hkv, rep, n, nk)
        s = s.masked_fill(hide, float("-inf"))
        if geom.sink:
            sink = w[p + "self_attn.attention_sink_bias"].view(1, Hkv, rep, 1, 1)
            s = torch.cat([s, sink.expand(B, Hkv, rep, n, 1)], dim=-1)
            v = torch.cat([v, v.new_zeros(B, Hkv, 1, Dv)], dim=2)
        probs = torch.softmax(s, dim=-1)
        o = (probs.reshape(B, Hkv, rep * n, -1) @ v).view(B, Hkv, rep, n, Dv)
        o = o.permute(0, 3, 1, 2, 4).reshape(B, n, Hq * Dv)
        return o @ w[p + "self_attn.o_proj.weight"].t()

    def _block(self, p, x, geom, swa, moe, cache, start):
        c, w = self.c, self.w
        x = x + self._attn(p, mr.rms_norm(x, w[p + "input_layernorm.weight"], c.eps), geom, swa,
                           cache, start)
        m = mr.rms_norm(x, w[p + "post_attention_layernorm.weight"], c.eps)
        return x + (self.bp.moe(p, m) if moe else self.bp.dense_mlp(p, m))

    def forward(self, tokens, cache, start, last_only=True):
        c, w = self.c, self.w
        x = w["model.embed_tokens.weight"][tokens]
        for l in range(c.num_layers):
            swa = c.swa_layers[l]
            x = self._block(f"model.layers.{l}.", x, c.swa if swa else c.full, swa,
                            c.moe_layers[l], cache, start)
        h = x
        return self.bp.logits(h[:, -1:] if last_only else h), h

    def mtp_prefill(self, tokens, hidden, cache):
        """The MTP layers over a prompt (their KV, as the prefill worker does)."""
        c, w = self.c, self.w
        h = hidden
        T = tokens.shape[1]
        for k in range(c.num_mtp_layers):
            n = T - 1 - k
            p = f"model.mtp.layers.{k}."
            e = mr.rms_norm(w["model.embed_tokens.weight"][tokens[:, 1 + k:]], w[p + "enorm.weight"],
                            c.eps)
            x = torch.cat([e, mr.rms_norm(h[:, :n], w[p + "hnorm.weight"], c.eps)], -1) \
                @ w[p + "eh_proj.weight"].t()
            h = self._block(p, x, c.swa, True, False, cache, 0)
        return self.bp.mtp_logits(c.num_mtp_layers - 1, h[:, -1:])


def torch_run(cm, prompts, batch, new_tokens):
    x = torch.tensor([prompts.take() for _ in range(batch)])
    cache = {}
    t0 = time.perf_counter()
    logits, hidden = cm.forward(x, cache, 0)
    cm.mtp_prefill(x, hidden, cache)
    t1 = time.perf_counter()
    tok = logits[:, -1].argmax(-1, keepdim=True)
    pos = x.shape[1]
    for _ in range(new_tokens - 1):
        logits, _ = cm.forward(tok, cache, pos)
        tok = logits[:, -1].argmax(-1, keepdim=True)
        pos += 1
    t2 = time.perf_counter()
    return {"prefill_tokens_per_s": x.numel() / (t1 - t0),
            "decode_tokens_per_s": batch * (new_tokens - 1) / (t2 - t1),
            "prefill_s": t1 - t0, "decode_s": t2 - t1}


def check_cache(cm, ids):
    """The cached decode equals the cache-free reference forward."""
    toks = ids[:300].view(1, -1)
    want, _ = cm.bp.hidden(toks), None
    want = cm.bp.logits(want)[0]
    cache = {}
    got = [cm.forward(toks[:, :200], cache, 0, last_only=False)[0][0]]
    for t in range(200, 300):
        got.append(cm.forward(toks[:, t:t + 1], cache, t)[0][0])
    got = torch.cat(got)
    err = float((got - want).abs().max() / want.abs().max())
    assert err < 1e-4, f"cached decode differs from the reference: {err}"
    return err


def best(runs):
    return {"prefill_tokens_per_s": max(r["prefill_tokens_per_s"] for r in runs),
            "decode_tokens_per_s": max(r["decode_tokens_per_s"] for r in runs),
            "runs": runs}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build", help="build dir with bin/swaserve")
    ap.add_argument("--model", default=os.path.join(REPO, "models", "demo"))
    ap.add_argument("--corpus", required=True, help="tools/train corpus dir (valid_ids.u16)")
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--worker-threads", type=int, default=2)
    ap.add_argument("--torch-threads", type=int, default=2)
    ap.add_argument("--skip-cluster", action="store_true")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    ids = load_ids(os.path.join(args.corpus, "valid_ids.u16"))
    prompts = Prompts(ids, args.prompt_tokens)
    out = {"benchmark": "demo_throughput", "model": os.path.abspath(args.model),
           "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens,
           "repeats": args.repeats, "cpus": os.cpu_count(), "machine": platform.machine(),
           "cluster": {}, "torch": {}}

    if not args.skip_cluster:
        swaserve = os.path.join(args.build, "bin", "swaserve")
        run_dir = tempfile.mkdtemp(prefix="demo-bench-")
        proc, url = start_cluster(swaserve, args.model, run_dir, args.worker_threads)
        try:
            cluster_run(url, "demo", prompts, 1, 4)  # warm-up
            for b in batches:
                out["cluster"][str(b)] = best([cluster_run(url, "demo", prompts, b, args.new_tokens)
                                               for _ in range(args.repeats)])
                print(f"cluster batch {b}: {out['cluster'][str(b)]['prefill_tokens_per_s']:.0f} "
                      f"prefill tok/s, {out['cluster'][str(b)]['decode_tokens_per_s']:.1f} "
                      f"decode tok/s", flush=True)
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=60)
        out["load_average_after_cluster"] = os.getloadavg()
        time.sleep(5)  # let the stopped processes go
        out["cluster_worker_threads"] = args.worker_threads
        out["cluster_run_dir"] = run_dir

    torch.set_num_threads(args.torch_threads)
    ref = mr.MimoReference.load(args.model, dtype=torch.float32)
    cm = CachedModel(ref)
    with torch.inference_mode():
        out["torch_cache_check_rel_err"] = check_cache(cm, ids)
        torch_run(cm, prompts, 1, 4)  # warm-up
        for b in batches:
            out["torch"][str(b)] = best([torch_run(cm, prompts, b, args.new_tokens)
                                         for _ in range(args.repeats)])
            print(f"torch batch {b}: {out['torch'][str(b)]['prefill_tokens_per_s']:.0f} prefill "
                  f"tok/s, {out['torch'][str(b)]['decode_tokens_per_s']:.1f} decode tok/s",
                  flush=True)
    out["torch_version"] = torch.__version__
    out["torch_threads"] = args.torch_threads
    out["load_average_at_end"] = os.getloadavg()

    print(f"\ndemo model, prompt {args.prompt_tokens} tokens, {args.new_tokens} new tokens, "
          f"best of {args.repeats}; load average {os.getloadavg()[0]:.1f}")
    print(f"{'':24}{'prefill tok/s':>16}{'decode tok/s':>16}")
    for b in batches:
        for name in ("cluster", "torch"):
            r = out[name].get(str(b))
            if r:
                label = f"{'swaserve cluster' if name == 'cluster' else 'PyTorch eager'} B={b}"
                print(f"{label:24}{r['prefill_tokens_per_s']:>16.0f}{r['decode_tokens_per_s']:>16.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
            f.write("\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
