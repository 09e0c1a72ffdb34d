#!/usr/bin/env python3
"""Compares `swaserve replay --json_requests` reports of the same trace request
by request: TTFT percentiles, the P90 reduction, and how many requests took
more than 2x their TTFT under the baseline.

  python3 bench/cluster/compare_replays.py BASELINE.json CANDIDATE.json
  python3 bench/cluster/compare_replays.py --baseline F1.json F2.json F3.json \\
      --candidate C1.json C2.json C3.json [--metric wait] [--floor SECONDS] [--worst N]

--metric wait compares the prefill scheduling wait instead (each request's
Usage.prefill_queue_seconds: arrival at the prefill worker to the step that
started its first chunk), which the scheduler's target "no request waits more
than 2x its FCFS wait" bounds. A request counts as over 2x when its wait exceeds
2 x max(reference wait, floor); the floor (default 0.1 s, about one prefill
step on the CPU cluster) keeps requests FCFS served at once (reference wait
~0) from counting a one-step wait as "infinitely" longer.

With several baseline runs a request's reference TTFT is its median over them,
and the noise floor is shown: each baseline run compared, the same way, with
the median of the other baseline runs (same policy, so every request "over 2x"
there is run-to-run noise). Near saturation that floor is not small, and a
candidate can only be judged against it.
"""
import argparse
import json
import statistics
import sys


def pct(values, q):
    v = sorted(values)
    if not v:
        return float("nan")
    k = (len(v) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def load(path, field):
    rep = json.load(open(path))
    out = {r["index"]: r.get(field, -1) for r in rep["results"] if r["ok"]}
    out = {i: v for i, v in out.items() if v is not None and v >= 0}
    if not out:
        sys.exit(f"{path}: no successful request has {field}")
    return out


def reference(runs):
    common = set.intersection(*(set(r) for r in runs))
    return {i: statistics.median(r[i] for r in runs) for i in common}


def compare(ref, cand, label, floor, worst):
    both = [i for i in ref if i in cand]
    t_ref = [ref[i] for i in both]
    t_c = [cand[i] for i in both]
    ratios = {i: cand[i] / max(ref[i], floor) for i in both if max(ref[i], floor) > 0}
    slow = sorted((i for i, r in ratios.items() if r > 2), key=lambda i: -ratios[i])
    big = sum(1 for i in slow if cand[i] - ref[i] > 0.1)
    p90r, p90c = pct(t_ref, .9), pct(t_c, .9)
    print(f"  {label:28s} p50 {pct(t_c, .5)*1e3:7.1f}  p90 {p90c*1e3:7.1f}  p99 "
          f"{pct(t_c, .99)*1e3:7.1f} ms | P90 vs ref {100*(p90c/p90r-1):+6.1f}% | over 2x: "
          f"{len(slow):3d} of {len(ratios)} ({big} also > 100 ms longer), ratio p99 "
          f"{pct(ratios.values(), .99):.2f} max {max(ratios.values()):.2f}")
    if worst and slow:
        print("      worst: " + ", ".join(f"#{i} {cand[i]:.2f}s vs {ref[i]:.2f}s"
                                         for i in slow[:worst]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="*", help="BASELINE.json CANDIDATE.json")
    ap.add_argument("--baseline", nargs="+", default=[])
    ap.add_argument("--candidate", nargs="+", default=[])
    ap.add_argument("--metric", choices=["ttft", "wait"], default="ttft")
    ap.add_argument("--floor", type=float, default=None,
                    help="least reference value in seconds (default: 0 for ttft, 0.1 for wait)")
    ap.add_argument("--worst", type=int, default=0, help="list the N largest ratios over 2x")
    a = ap.parse_args()
    base_paths, cand_paths = a.baseline, a.candidate
    if not base_paths and not cand_paths and len(a.runs) == 2:
        base_paths, cand_paths = a.runs[:1], a.runs[1:]
    if not base_paths or not cand_paths or (a.runs and a.baseline):
        sys.exit(__doc__)
    field = "ttft_s" if a.metric == "ttft" else "prefill_queue_s"
    floor = a.floor if a.floor is not None else (0.1 if a.metric == "wait" else 0.0)
    base = [load(p, field) for p in base_paths]
    cands = [load(p, field) for p in cand_paths]
    ref = reference(base)
    t = list(ref.values())
    print(f"{field} (over 2x: > 2 x max(reference, {floor:g} s))")
    print(f"reference: median of {len(base)} baseline run(s) per request, {len(ref)} requests;"
          f" p50 {pct(t, .5)*1e3:.1f}  p90 {pct(t, .9)*1e3:.1f}  p99 {pct(t, .99)*1e3:.1f} ms")
    if len(base) >= 3:
        print("noise floor (each baseline run vs the median of the other baseline runs):")
        for k, run in enumerate(base):
            compare(reference(base[:k] + base[k + 1:]), run, f"baseline {base_paths[k]}",
                    floor, a.worst)
    print("candidates vs the reference:")
    for path, run in zip(cand_paths, cands):
        compare(ref, run, path, floor, a.worst)
    if len(cands) > 1:
        compare(ref, {i: statistics.median(r[i] for r in cands)
                      for i in set.intersection(*(set(r) for r in cands))},
                "median of the candidates", floor, a.worst)


if __name__ == "__main__":
    main()
