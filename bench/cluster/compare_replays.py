#!/usr/bin/env python3
"""Compares two `swaserve replay --json_requests` reports of the same trace
request by request: TTFT percentiles of each, the P90 reduction, and how many
requests waited more than 2x their wait under the baseline (first file).

  python3 bench/cluster/compare_replays.py BASELINE.json CANDIDATE.json
"""
import json
import sys


def pct(values, q):
    v = sorted(values)
    if not v:
        return float("nan")
    k = (len(v) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def main():
    base, cand = (json.load(open(p)) for p in sys.argv[1:3])
    b = {r["index"]: r for r in base["results"]}
    c = {r["index"]: r for r in cand["results"]}
    both = [i for i in b if i in c and b[i]["ok"] and c[i]["ok"] and b[i]["ttft_s"] >= 0
            and c[i]["ttft_s"] >= 0]
    fails = sum(1 for r in base["results"] if not r["ok"]), sum(
        1 for r in cand["results"] if not r["ok"])
    print(f"requests compared: {len(both)} (failed: baseline {fails[0]}, candidate {fails[1]})")
    for name, rs in (("baseline", b), ("candidate", c)):
        t = [rs[i]["ttft_s"] for i in both]
        print(f"  {name:9s} TTFT p50 {pct(t, .5)*1e3:8.1f} ms  p90 {pct(t, .9)*1e3:8.1f} ms"
              f"  p99 {pct(t, .99)*1e3:8.1f} ms  mean {sum(t)/len(t)*1e3:8.1f} ms")
    p90b = pct([b[i]["ttft_s"] for i in both], .9)
    p90c = pct([c[i]["ttft_s"] for i in both], .9)
    ratios = [c[i]["ttft_s"] / b[i]["ttft_s"] for i in both if b[i]["ttft_s"] > 0]
    over = sum(1 for r in ratios if r > 2)
    print(f"  P90 TTFT change: {100*(p90c/p90b-1):+.1f}% (target <= -30%)")
    print(f"  per-request TTFT ratio candidate/baseline: p50 {pct(ratios,.5):.2f}"
          f"  p99 {pct(ratios,.99):.2f}  max {max(ratios):.2f};"
          f" {over} of {len(ratios)} over 2x (target 0)")
    slow = [(b[i]["ttft_s"], c[i]["ttft_s"]) for i in both
            if b[i]["ttft_s"] > 0 and c[i]["ttft_s"] > 2 * b[i]["ttft_s"]]
    big = sum(1 for bb, cc in slow if cc - bb > 0.1)
    print(f"  of those over 2x: {big} also waited > 100 ms longer; worst absolute increase"
          f" {max([cc - bb for bb, cc in slow], default=0)*1e3:.0f} ms")


if __name__ == "__main__":
    main()
