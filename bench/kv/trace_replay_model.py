#!/usr/bin/env python3
"""Independent cross-check of kv_trace_replay_bench's infinite-cache figures.

A symbolic model of the same replay, sharing no code with lib/kv: no token ids
and no hashing. A 16-token page is named by (block id its tokens come from,
page index in the block), following the continuation recipes of the traces
README (a new block that continues an earlier request's partial last block
takes its first t tokens from that block); equal names mean equal chained
hashes. A page is "live" (has SWA KV) when it lies in the window kept at some
earlier prompt's end, pages covering [len - (W-1) - (page-1), len), which is
what lib/kv's Sequence keeps at Finish, plus, when the window-safe rule cut
a hit back from a full-KV match of D tokens, the pages covering
[D - W + 1, D) that the request recomputed (its divergence window, kept by
default since Sequence's keep_divergence_window; --no-divergence-window
leaves it out). A hit of m pages (capped at (len - 1) // page) is window-safe
when pages covering [16m - W + 1, 16m) are all live.

Prints the token hit rate of an infinite cache for plain synthesis and with
continuations reconstructed, full attention (single pool) and SWA (dual).
Takes about 40 s.

Usage: bench/kv/trace_replay_model.py [--no-divergence-window] [TRACE]
"""
import json
import sys

PAGE = 16
BLOCK = 512
W = 128


def replay(requests, reconstruct, swa, divergence_window=True):
    per_block = BLOCK // PAGE
    recipe = {}        # block id -> (source block id, t tokens)
    seen = set()
    by_last_full = {}  # last full block id -> [(input_length, tail block id)]
    cached, live = set(), set()
    hit = total = 0
    for r in requests:
        ids, n = r["hash_ids"], r["input_length"]
        if reconstruct:
            p = 0
            while p < len(ids) and ids[p] in seen:
                p += 1
            if 0 < p < len(ids):
                for length, tail in reversed(by_last_full.get(ids[p - 1], [])):
                    if length < n:
                        recipe[ids[p]] = (tail, length - BLOCK * p)
                        break
        seen.update(ids)
        k = n // BLOCK
        if reconstruct and k >= 1 and n % BLOCK:
            by_last_full.setdefault(ids[k - 1], []).append((n, ids[k]))
        keys = []
        for page in range(n // PAGE):
            block, j = ids[page // per_block], page % per_block
            while block in recipe and (j + 1) * PAGE <= recipe[block][1]:
                block = recipe[block][0]
            keys.append((block, j))
        limit = (n - 1) // PAGE
        m = 0
        while m < limit and keys[m] in cached:
            m += 1
        if swa:
            safe = 0
            for mm in range(m, 0, -1):
                first = max(0, mm * PAGE - W + 1) // PAGE
                if all(keys[q] in live for q in range(first, mm)):
                    safe = mm
                    break
            if divergence_window and m > safe:
                d = m * PAGE
                live.update(keys[max(safe, max(0, d - W + 1) // PAGE):m])
            m = safe
        hit += m * PAGE
        total += n
        cached.update(keys)
        keep_from = max(0, n - (W - 1) - (PAGE - 1)) // PAGE
        live.update(keys[keep_from:])
    return hit / total


def main():
    args = sys.argv[1:]
    divergence_window = "--no-divergence-window" not in args
    args = [a for a in args if a != "--no-divergence-window"]
    # Data input outside the repository (docs/benchmarks.md#traces).
    path = args[0] if args else "../shared/traces/mooncake_conversation_trace.jsonl"
    with open(path) as f:
        requests = [json.loads(line) for line in f if line.strip()]
    requests.sort(key=lambda r: r["timestamp"])
    for reconstruct in (False, True):
        for swa in (False, True):
            rate = replay(requests, reconstruct, swa, divergence_window)
            print(f"{'reconstructed' if reconstruct else 'plain':13s} "
                  f"{'SWA (dual)' if swa else 'full attention':15s} {100 * rate:6.2f}%")


if __name__ == "__main__":
    main()
