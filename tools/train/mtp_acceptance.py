"""MTP draft acceptance of the demo model under greedy self-speculation.

  /usr/bin/python3 tools/train/mtp_acceptance.py --model models/demo --corpus /tmp/demo-corpus

Greedy-generates --new tokens from --prompts held-out prompts (first
--prompt-tokens tokens of held-out chapters) with the main model, then asks,
at every generated position t, what MTP speculation with 3 layers (EAGLE-style
chain, as lib/model runs it) would have accepted: the main model emitted
x0 = S[t+1]; MTP layer 0 reads (x0, h[t]) and drafts d1, layer 1 reads
(d1, its hidden) and drafts d2, layer 2 drafts d3; d_j is accepted while
every earlier draft was and d_j equals the greedy token S[t+1+j]. Because a
draft is only looked at when every earlier one equalled S, running the MTP
chain teacher-forced on S gives exactly those drafts. Reports per-layer
conditional acceptance and the mean accepted length per verification step
(1 + accepted drafts, the tokens one target forward would emit).
"""

import argparse
import json
import os
import sys

import torch

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
sys.path.insert(0, HERE)
import mimo_reference as mr  # noqa: E402
import train_demo as td  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="models/demo")
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    torch.set_num_threads(1)
    ref = mr.MimoReference.load(args.model, dtype=torch.float32)
    bp = mr.BatchedPaths(ref)
    K = ref.c.num_mtp_layers
    valid = td.load_ids(os.path.join(args.corpus, "valid_ids.u16")).tolist()
    _, tok_ids, _ = td.read_tokenizer(os.path.join(args.model, "tokenizer.json"))
    eot = tok_ids["<|endoftext|>"]
    starts = [0] + [i + 1 for i, t in enumerate(valid) if t == eot][:-1]
    prompts = [valid[s:s + args.prompt_tokens] for s in starts[:args.prompts]]
    x = torch.tensor(prompts)
    with torch.no_grad():
        for _ in range(args.new):  # greedy, recomputed from scratch each step
            nxt = bp.logits(bp.hidden(x)[:, -1:]).argmax(-1)
            x = torch.cat([x, nxt], dim=1)
        h = bp.hidden(x)
        T = x.shape[1]
        drafts, hk = [], h
        for k in range(K):
            n = T - 1 - k
            hk = bp.mtp_hidden(k, x[:, 1 + k:], hk[:, :n])
            drafts.append(bp.mtp_logits(k, hk).argmax(-1))   # [B, n]: drafts S[p+2+k]
    P = args.prompt_tokens
    lengths, cond = [], [[0, 0] for _ in range(K)]
    for b in range(x.shape[0]):
        # Verification steps at t = P-1 .. T-2-K: x0 = S[t+1] is generated.
        for t in range(P - 1, T - 1 - K):
            acc = 0
            for k in range(K):
                cond[k][1] += 1
                if int(drafts[k][b, t]) == int(x[b, t + 2 + k]):
                    cond[k][0] += 1
                    acc += 1
                else:
                    break
            lengths.append(1 + acc)
    out = {"prompts": x.shape[0], "prompt_tokens": P, "generated": args.new,
           "steps": len(lengths),
           "mean_accepted_length": sum(lengths) / len(lengths),
           "conditional_acceptance": [c[0] / max(1, c[1]) for c in cond],
           "accepted_length_histogram": {str(n): lengths.count(n) for n in range(1, K + 2)}}
    print(json.dumps(out, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
