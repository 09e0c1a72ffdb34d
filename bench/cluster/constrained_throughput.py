#!/usr/bin/python3
"""Decode tokens/s of constrained vs free output on a running cluster.

  /usr/bin/python3 bench/cluster/constrained_throughput.py --url http://127.0.0.1:8000 \\
      [--model demo] [--tokens 256] [--batches 1,16] [--repeats 3]

For batch size B, B chat requests are sent at once (streamed, temperature 0,
thinking off), each making exactly --tokens tokens:
  free:               ignore_eos, speculative_tokens 0
  constrained:        response_format json_schema --schema (never complete
                      within --tokens, so every request makes all of them):
                      ints, an integer array (content unlike the free
                      output), or text, an array of strings (text, as the
                      free output),
                      speculative_tokens 0
  free / constrained + MTP: the same with the worker's MTP speculation
decode tokens/s = sum of (completion tokens - 1) / (latest last-token time -
latest first-token time). The kinds alternate within each repeat, so load
from elsewhere on the machine falls on both; the best of --repeats is
reported, with the constrained / free ratio.
"""

import argparse
import json
import threading
import time
import urllib.request


def stream(url, body, out, i):
    req = urllib.request.Request(f"{url}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    start = time.monotonic()
    first = last = None
    tokens = 0
    with urllib.request.urlopen(req, timeout=600) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            if chunk.get("choices") and (chunk["choices"][0]["delta"].get("content")):
                now = time.monotonic() - start
                first = now if first is None else first
                last = now
    out[i] = (first, last, tokens)


SCHEMAS = {
    # Digits and commas: content the demo model's MTP layers predict poorly.
    "ints": {"type": "array", "items": {"type": "integer"}, "minItems": 4096},
    # Free text in JSON strings: the same kind of content as the free output,
    # so the ratio is nearer the constraint's own cost.
    "text": {"type": "array", "items": {"type": "string"}, "minItems": 4096},
}


def run(url, model, tokens, batch, kind, salt, schema):
    body = {
        "model": model, "max_tokens": tokens, "temperature": 0, "stream": True,
        "stream_options": {"include_usage": True},
        "chat_template_kwargs": {"enable_thinking": False},
    }
    if kind.startswith("constrained"):
        body["response_format"] = {"type": "json_schema", "json_schema": {
            "name": "c", "schema": SCHEMAS[schema]}}
    else:
        body["ignore_eos"] = True
    if not kind.endswith("_mtp"):
        body["speculative_tokens"] = 0
    out = [None] * batch
    threads = []
    for i in range(batch):
        b = dict(body, messages=[{"role": "user", "content": f"{salt} {i}: list numbers."}])
        threads.append(threading.Thread(target=stream, args=(url, b, out, i)))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    first = max(o[0] for o in out)
    last = max(o[1] for o in out)
    made = sum(o[2] - 1 for o in out)
    return made / (last - first), sum(o[2] for o in out)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--model", default="demo")
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--batches", default="1,16")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--schema", choices=sorted(SCHEMAS), default="ints")
    a = p.parse_args()
    kinds = ["free", "constrained", "free_mtp", "constrained_mtp"]
    print("| batch | free tok/s | constrained tok/s | ratio | free + MTP | constrained + MTP | ratio |")
    print("|---|---|---|---|---|---|---|")
    for b in [int(x) for x in a.batches.split(",")]:
        best = {k: 0.0 for k in kinds}
        for rep in range(a.repeats):
            for k in kinds:
                tps, made = run(a.url, a.model, a.tokens, b, k, f"{time.time()}-{rep}-{k}", a.schema)
                assert made == b * a.tokens, (k, made)
                best[k] = max(best[k], tps)
        print(f"| {b} | {best['free']:.0f} | {best['constrained']:.0f} | "
              f"{best['constrained'] / best['free']:.2f} | {best['free_mtp']:.0f} | "
              f"{best['constrained_mtp']:.0f} | {best['constrained_mtp'] / best['free_mtp']:.2f} |")


if __name__ == "__main__":
    main()
