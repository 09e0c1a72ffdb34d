"""Teacher-forced tool-use check of a checkpoint with the PyTorch reference.

  node tools/train/render_eval.mjs --tokenizer models/demo/tokenizer.json --out /tmp/eval_ids.jsonl
  /usr/bin/python3 tools/train/eval_tools_reference.py --model models/demo \\
      --ids /tmp/eval_ids.jsonl [--limit N]

One forward pass per assistant turn over the server's prompt followed by the
reference completion (make_agent_corpus.mjs's), then the model's argmax at
every completion position. Greedy decoding emits a span exactly when the
argmax matches it at each of its positions, given what comes before it. So:

  call_exact     (needs a tool) after the reference <think> block (thinking
                 on) or the prompt's <think></think> (off), greedy decoding
                 emits exactly the reference calls and <|im_end|>
  call_decision  the first token there is <tool_call>
  call_name      every call's function name is argmax (the rest of the call
                 given: the right tool, teacher-forced)
  call_args      every call's parameter values are argmax (the rest given:
                 the right arguments, teacher-forced)
  no_call        (needs no tool) the first token there is not <tool_call>
  answer_exact   (second turn, after the true tool results) the reference
                 answer text after the reference <think> block, exactly
  answer_result  the answer's tokens that spell the tool results are all
                 argmax (the rest of the answer given)

With thinking on these are conditioned on the reference reasoning text (the
model may reason in other words); with thinking off they are exactly what
greedy decoding at temperature 0 produces. eval_tools.mjs measures the
served model with free decoding instead.
"""

import argparse
import json
import os
import re
import sys

import torch

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
import mimo_reference as mr  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--ids", required=True, help="render_eval.mjs output")
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--out")
    args = ap.parse_args()
    torch.set_num_threads(1)
    with open(os.path.join(args.model, "tokenizer.json")) as f:
        tj = json.load(f)
    tid = {t["content"]: t["id"] for t in tj["added_tokens"]}
    vocab = dict(tj["model"]["vocab"])
    THINK_END, CALL = tid["</think>"], tid["<tool_call>"]
    inv = {i: k for k, i in vocab.items()}

    def positions(comp, start, pattern):
        """Completion positions (from start) of the tokens that overlap a
        match of group 1 of pattern in the decoded completion."""
        text, spans = "", []
        for j in range(start, len(comp)):
            s = inv.get(comp[j], "").replace("\u0120", " ").replace("\u010a", "\n")
            spans.append((len(text), len(text) + len(s), j))
            text += s
        want = set()
        for m in re.finditer(pattern, text, re.S):
            a0, b0 = m.span(1)
            want |= {j for a, b, j in spans if a < b0 and b > a0}
        return want
    ref = mr.MimoReference.load(args.model, dtype=torch.float32)
    bp = mr.BatchedPaths(ref)
    items = [json.loads(l) for l in open(args.ids) if l.strip()]
    if args.limit:
        items = items[:args.limit]

    def argmax_after(prompt, comp):
        x = torch.tensor([prompt + comp])
        with torch.no_grad():
            lg = bp.logits(bp.hidden(x))[0]
        # prediction of completion token j is at position len(prompt) - 1 + j
        return lg[len(prompt) - 1:len(prompt) - 1 + len(comp)].argmax(-1).tolist()

    rows = []
    for it in items:
        r = {k: it[k] for k in ("id", "kind", "phrasing", "thinking", "tool")}
        t1 = it["turns"][0]
        comp = t1["completion"]
        start = comp.index(THINK_END) + 1 if it["thinking"] else 0
        pred = argmax_after(t1["prompt"], comp)
        if it["kind"] == "chat":
            r["no_call"] = pred[start] != CALL
        else:
            r["call_decision"] = pred[start] == CALL
            r["call_exact"] = pred[start:] == comp[start:]
            names = positions(comp, start, r"<function=([^>\n]+)>")
            values = positions(comp, start, r"<parameter=[^>\n]+>(.*?)</parameter>")
            r["call_name"] = bool(names) and all(pred[j] == comp[j] for j in names)
            r["call_args"] = bool(values) and all(pred[j] == comp[j] for j in values)
            if len(it["turns"]) > 1:
                t2 = it["turns"][1]
                c2 = t2["completion"]
                s2 = c2.index(THINK_END) + 1 if it["thinking"] else 0
                p2 = argmax_after(t2["prompt"], c2)
                r["answer_exact"] = p2[s2:] == c2[s2:]
                # Positions of the result tokens: the answer's tokens that lie
                # in a result's text (token strings compared by decoded text).
                inv = {i: k for k, i in vocab.items()}
                text, spans = "", []
                for j in range(s2, len(c2)):
                    s = inv.get(c2[j], "")
                    spans.append((len(text), len(text) + len(s), j))
                    text += s
                want = set()
                for res in it["results"]:
                    m = re.match(r"^(.+? \d+:\d+) ", res)
                    needle = (m.group(1) if m and it["tool"] == "search_verses" else res)
                    needle = needle.replace(" ", "\u0120")
                    k = text.find(needle)
                    if k >= 0:
                        want |= {j for a, b, j in spans if a < k + len(needle) and b > k}
                r["answer_result"] = bool(want) and all(p2[j] == c2[j] for j in want)
        rows.append(r)
        print(json.dumps(r), flush=True)

    def rate(rs, key):
        v = [x[key] for x in rs if key in x]
        return {"rate": round(sum(v) / len(v), 4), "n": sum(v), "of": len(v)} if v else None

    keys = ["call_decision", "call_name", "call_args", "call_exact", "no_call", "answer_exact",
            "answer_result"]
    summary = {"model": args.model, "prompts": len(rows),
               "overall": {k: rate(rows, k) for k in keys}}
    for group in ("phrasing", "thinking", "tool"):
        summary["by_" + group] = {str(g): {k: rate([x for x in rows if x[group] == g], k) for k in keys}
                                  for g in sorted({x[group] for x in rows}, key=str)}
    text = json.dumps(summary, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
