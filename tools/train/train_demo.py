"""Trains swaserve's demo model (models/demo) on the King James Version.

  nice -n 19 /usr/bin/python3 tools/train/train_demo.py \
      --corpus /tmp/demo-corpus --tokenizer models/demo/tokenizer.json \
      --out models/demo            # see tools/train/README.md for the whole recipe

The model is defined once, in tools/reference/mimo_reference.py: training
runs its batched autograd paths (BatchedPaths) over a dict of leaf tensors
named as in the checkpoint, so what is trained is exactly what the reference
(and lib/model) runs. Every feature of the served family: hybrid SWA / full
attention (5:1), W = 128, attention sinks on SWA layers, partial NeoX RoPE
with a different theta per layer type, 4 KV heads on full and 8 on SWA
layers, Q/K head dim != V head dim, V scale, a dense first layer then MoE
(8 experts top-2, sigmoid router with correction bias, DeepSeek-V3's
auxiliary-loss-free balance update of that bias), and 3 MTP layers trained
jointly, chained as the engine runs them (layer k takes main token p+1+k and
layer k-1's block output at p), each with its own loss weight.

Deterministic for a given torch build: seeded batches and init, one thread
(torch.set_num_threads(1)); it never runs in CI.

Writes into --out: config.json, model.safetensors (bf16), training_log.jsonl
(one JSON object per logged step plus a final summary), and, with
--fixtures, the C++ tests' fixtures (tests/fixtures/model/demo_*.json).
"""

import argparse
import json
import math
import os
import struct
import sys
import time

import torch
import torch.nn.functional as F

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
import mimo_reference as mr  # noqa: E402

SEED = 20251201
SEQ = 256                 # training context (2 windows)
BATCH = 16
MTP_WEIGHTS = [0.3, 0.2, 0.1]   # loss weight of MTP layer 0, 1, 2
MTP_LOSS_FRACTION = 0.5   # of MTP positions whose LM head runs in a training step
BIAS_UPDATE = 1e-2        # aux-free balance: bias += u * sign(mean load - load)
PEAK_LR = 3e-3
MIN_LR_FRAC = 0.1
WARMUP = 60
WEIGHT_DECAY = 0.1
CLIP = 1.0

VALID_SEQ = 256           # KJV validation chunk length (fixed, so runs compare)
# The special tokens' ids, read from the tokenizer (train_tokenizer.js puts
# them after the merges, then the added non-special tokens).
ENDOFTEXT, IM_START, IM_END = 4093, 4094, 4095


def read_tokenizer(path):
    """(vocab size, {token text: id}) of a tokenizer.json, added tokens included."""
    with open(path) as f:
        j = json.load(f)
    ids = dict(j["model"]["vocab"])
    for t in j["added_tokens"]:
        ids[t["content"]] = t["id"]
    n = max(ids.values()) + 1
    if sorted(ids.values()) != list(range(n)):
        sys.exit(f"{path}: token ids are not 0..{n - 1}")
    return n, ids, [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in j["model"]["merges"]]


def init_from(w, base_dir, base_tok, tok_ids, merges):
    """Fine-tuning start: every tensor of the checkpoint in base_dir; the
    embedding and LM-head rows of a token the base tokenizer has are copied
    by token text; a new merge's rows are the mean of its two halves' rows
    (merges in order, so both exist); any other new token (the added tokens)
    keeps its fresh embedding row and gets the mean LM-head row."""
    base = mr.load_safetensors(base_dir, torch.float32)
    _, base_ids, _ = read_tokenizer(base_tok)
    for name, t in w.items():
        if name in ("model.embed_tokens.weight", "lm_head.weight"):
            continue
        if tuple(base[name].shape) != tuple(t.shape):
            sys.exit(f"{name}: base shape {tuple(base[name].shape)} != {tuple(t.shape)}")
        with torch.no_grad():
            t.copy_(base[name])
    by_id = {i: k for k, i in tok_ids.items()}
    merge_of = {l + r: (l, r) for l, r in merges}
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        src, dst = base[name], w[name]
        mean = src.mean(0)
        with torch.no_grad():
            for i in range(dst.shape[0]):
                k = by_id[i]
                if k in base_ids:
                    dst[i] = src[base_ids[k]]
                elif k in merge_of:
                    l, r = merge_of[k]
                    dst[i] = 0.5 * (dst[tok_ids[l]] + dst[tok_ids[r]])
                elif name == "lm_head.weight":
                    dst[i] = mean


def model_config(vocab):
    """config.json (MiMo-V2 field names)."""
    layers = 12
    return {
        "architectures": ["MiMoV2FlashForCausalLM"],
        "model_type": "mimo_v2_flash",
        "vocab_size": vocab,
        "hidden_size": 128,
        "num_hidden_layers": layers,
        # Gemma-3 / MiMo-style 5:1: full attention at layers 5 and 11.
        "hybrid_layer_pattern": [0 if (l + 1) % 6 == 0 else 1 for l in range(layers)],
        "sliding_window": 128,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 36,
        "v_head_dim": 24,
        "swa_num_attention_heads": 8,
        "swa_num_key_value_heads": 8,
        "swa_head_dim": 36,
        "swa_v_head_dim": 24,
        "rope_theta": 5000000.0,
        "swa_rope_theta": 10000.0,
        "partial_rotary_factor": 0.334,
        "add_swa_attention_sink_bias": True,
        "add_full_attention_sink_bias": False,
        "attention_value_scale": 0.707,
        "moe_layer_freq": [0] + [1] * (layers - 1),
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 128,
        "intermediate_size": 384,
        "scoring_func": "sigmoid",
        "topk_method": "noaux_tc",
        "n_group": 1,
        "topk_group": 1,
        "norm_topk_prob": True,
        "routed_scaling_factor": 1.0,
        "n_shared_experts": None,
        "num_nextn_predict_layers": 3,
        "hidden_act": "silu",
        "attention_bias": False,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "max_position_embeddings": 8192,
        "torch_dtype": "bfloat16",
        "bos_token_id": None,
        "eos_token_id": [IM_END, ENDOFTEXT],
    }


def expected_shapes(c):
    """name -> shape, as lib/model/checkpoint.cc ExpectedTensors."""
    H, out = c.hidden_size, {}

    def attn(p, g):
        out[p + "self_attn.q_proj.weight"] = [g.heads * g.head_dim, H]
        out[p + "self_attn.k_proj.weight"] = [g.kv_heads * g.head_dim, H]
        out[p + "self_attn.v_proj.weight"] = [g.kv_heads * g.v_head_dim, H]
        out[p + "self_attn.o_proj.weight"] = [H, g.heads * g.v_head_dim]
        if g.sink:
            out[p + "self_attn.attention_sink_bias"] = [g.heads]

    def dense(p):
        I = c.intermediate_size
        out[p + "mlp.gate_proj.weight"] = [I, H]
        out[p + "mlp.up_proj.weight"] = [I, H]
        out[p + "mlp.down_proj.weight"] = [H, I]

    out["model.embed_tokens.weight"] = [c.vocab_size, H]
    out["model.norm.weight"] = [H]
    out["lm_head.weight"] = [c.vocab_size, H]
    for l in range(c.num_layers):
        p = f"model.layers.{l}."
        out[p + "input_layernorm.weight"] = [H]
        out[p + "post_attention_layernorm.weight"] = [H]
        attn(p, c.swa if c.swa_layers[l] else c.full)
        if c.moe_layers[l]:
            E, I = c.n_routed_experts, c.moe_intermediate_size
            out[p + "mlp.gate.weight"] = [E, H]
            out[p + "mlp.gate.e_score_correction_bias"] = [E]
            for e in range(E):
                ep = f"{p}mlp.experts.{e}."
                out[ep + "gate_proj.weight"] = [I, H]
                out[ep + "up_proj.weight"] = [I, H]
                out[ep + "down_proj.weight"] = [H, I]
        else:
            dense(p)
    for k in range(c.num_mtp_layers):
        p = f"model.mtp.layers.{k}."
        for n in ("enorm", "hnorm", "final_layernorm", "input_layernorm",
                  "post_attention_layernorm"):
            out[p + n + ".weight"] = [H]
        out[p + "eh_proj.weight"] = [H, 2 * H]
        attn(p, c.swa)
        dense(p)
    return out


def init_weights(c, gen):
    """Leaf tensors (f32, requires_grad except the router bias)."""
    n_res = 2 * (c.num_layers + c.num_mtp_layers)
    w = {}
    for name, shape in expected_shapes(c).items():
        if name.endswith("norm.weight"):
            t = torch.ones(shape)
        elif name.endswith("attention_sink_bias") or name.endswith("e_score_correction_bias"):
            t = torch.zeros(shape)
        elif name == "model.embed_tokens.weight":
            t = torch.randn(shape, generator=gen) * 0.02
        else:
            std = shape[1] ** -0.5
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                std /= math.sqrt(n_res)
            t = torch.randn(shape, generator=gen) * std
        t.requires_grad_(not name.endswith("e_score_correction_bias"))
        w[name] = t
    return w


def to_bf16_round(t):
    """f32 tensor rounded to the nearest bf16 (ties to even), as f32."""
    return t.detach().to(torch.bfloat16).to(torch.float32)


def write_safetensors(path, tensors):
    """tensors: name -> f32 tensor; written as BF16, sorted by name."""
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().to(torch.bfloat16).contiguous()
        raw = t.view(torch.int16).numpy().tobytes()
        header[name] = {"dtype": "BF16", "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def load_ids(path):
    import numpy as np
    return torch.from_numpy(np.fromfile(path, dtype="<u2").astype("int64"))


def assistant_mask(ids, im_start, assistant, im_end):
    """Per token of an agent stream: True where it is the content of an
    assistant turn (after `<|im_start|>assistant\n`, up to and including
    its `<|im_end|>`), the tokens the server makes the model produce."""
    import numpy as np
    a = ids.numpy()
    mask = np.zeros(a.shape[0], dtype=bool)
    starts = np.nonzero(a == im_start)[0]
    ends = np.nonzero(a == im_end)[0]
    for s in starts:
        if s + 1 < a.shape[0] and a[s + 1] == assistant:
            k = np.searchsorted(ends, s)
            e = ends[k] if k < ends.shape[0] else a.shape[0] - 1
            mask[s + 3:e + 1] = True
    return torch.from_numpy(mask)


def losses(bp, x, gen=None, mask=None):
    """x [B, T] -> (main loss, [MTP loss per layer], route stats).

    Main: position p predicts x[p+1]. MTP layer k at MTP position p takes
    x[p+1+k] and predicts x[p+2+k]; every layer runs over all its positions
    (its attention needs them). Its LM head (a quarter of a step's work if
    run everywhere) runs over every position with a target, or, with `gen`,
    over a seeded random MTP_LOSS_FRACTION of them (an unbiased estimate of
    the same loss). With `mask` ([B, T] bool), each loss averages only over
    the targets whose token is masked in (and the LM heads run only there).
    """
    stats = []
    h = bp.hidden(x, stats)
    rows, tgt = h[:, :-1].flatten(0, 1), x[:, 1:].flatten()
    if mask is not None:
        sel = mask[:, 1:].flatten()
        rows, tgt = rows[sel], tgt[sel]
    main = F.cross_entropy(bp.logits(rows), tgt)
    mtp, hk = [], h
    T = x.shape[1]
    for k in range(bp.c.num_mtp_layers):
        n = T - 1 - k
        hk = bp.mtp_hidden(k, x[:, 1 + k:], hk[:, :n])
        rows, tgt = hk[:, :n - 1].flatten(0, 1), x[:, 2 + k:].flatten()
        if mask is not None:
            sel = mask[:, 2 + k:].flatten()
            rows, tgt = rows[sel], tgt[sel]
        if gen is not None:
            sel = torch.randperm(rows.shape[0], generator=gen)[:int(rows.shape[0] * MTP_LOSS_FRACTION)]
            rows, tgt = rows[sel], tgt[sel]
        mtp.append(F.cross_entropy(bp.mtp_logits(k, rows), tgt))
    return main, mtp, stats


@torch.no_grad()
def evaluate(bp, chunks, batch=8):
    """Mean next-token loss (main, per MTP layer) over [N, T] chunks, and per
    MTP layer the top-1 agreement with the main model (teacher-forced: MTP k
    at p and the main model at p+1+k both predict token p+2+k) and accuracy."""
    c = bp.c
    K = c.num_mtp_layers
    tot_main, n_main = 0.0, 0
    tot = [0.0] * K
    agree = [0] * K
    correct = [0] * K
    main_correct = 0
    cnt = [0] * K
    for i in range(0, chunks.shape[0], batch):
        x = chunks[i:i + batch]
        T = x.shape[1]
        h = bp.hidden(x)
        lg = bp.logits(h)
        main_arg = lg.argmax(-1)                       # [B, T]
        tot_main += float(F.cross_entropy(lg[:, :-1].flatten(0, 1), x[:, 1:].flatten(),
                                          reduction="sum"))
        n_main += x[:, 1:].numel()
        main_correct += int((main_arg[:, :-1] == x[:, 1:]).sum())
        hk = h
        for k in range(K):
            n = T - 1 - k
            hk = bp.mtp_hidden(k, x[:, 1 + k:], hk[:, :n])
            ml = bp.mtp_logits(k, hk[:, :n - 1])
            tgt = x[:, 2 + k:]
            tot[k] += float(F.cross_entropy(ml.flatten(0, 1), tgt.flatten(), reduction="sum"))
            arg = ml.argmax(-1)
            agree[k] += int((arg == main_arg[:, 1 + k:T - 1]).sum())
            correct[k] += int((arg == tgt).sum())
            cnt[k] += tgt.numel()
    return {
        "loss": tot_main / n_main,
        "tokens": n_main,
        "top1_accuracy": main_correct / n_main,
        "mtp_loss": [tot[k] / cnt[k] for k in range(K)],
        "mtp_top1_agreement": [agree[k] / cnt[k] for k in range(K)],
        "mtp_top1_accuracy": [correct[k] / cnt[k] for k in range(K)],
    }


def lr_at(step, steps):
    if step < WARMUP:
        return PEAK_LR * (step + 1) / WARMUP
    t = (step - WARMUP) / max(1, steps - WARMUP)
    return PEAK_LR * (MIN_LR_FRAC + (1 - MIN_LR_FRAC) * 0.5 * (1 + math.cos(math.pi * t)))


def main():
    global SEQ, BATCH, PEAK_LR, WARMUP, ENDOFTEXT, IM_START, IM_END
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", required=True, help="tools/train/prepare_corpus.py output "
                    "with train_ids.u16 / valid_ids.u16 from train_tokenizer.js")
    ap.add_argument("--tokenizer", required=True, help="tokenizer.json (copied into --out)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--log-every", type=int, default=25)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--fixtures", help="write the C++ tests' fixtures into this directory")
    ap.add_argument("--seq", type=int, default=SEQ, help="training context of the KJV windows")
    ap.add_argument("--batch", type=int, default=BATCH, help="KJV windows per step")
    ap.add_argument("--agent-seq", type=int, default=768,
                    help="training context of the agent windows (each starts at a conversation)")
    ap.add_argument("--agent-batch", type=int, default=0,
                    help="agent windows per step (corpus/agent_ids.u16; 0: none)")
    ap.add_argument("--agent-loss", choices=["all", "assistant"], default="all",
                    help="agent windows' loss over every token, or only the assistant turns' "
                    "content (through their <|im_end|>)")
    ap.add_argument("--agent-weight", type=float, default=0.0,
                    help="the agent batch's share of the step's loss (0: its share of the "
                    "step's tokens)")
    ap.add_argument("--agent-call-windows", type=int, default=0,
                    help="of the agent windows per step, this many start at a conversation "
                    "whose assistant makes a tool call (the rest at any conversation)")
    ap.add_argument("--init", help="fine-tune: start from this checkpoint directory")
    ap.add_argument("--init-tokenizer", help="the tokenizer.json --init was trained with")
    ap.add_argument("--stop-at", type=int, default=0,
                    help="end after this many steps of the --steps schedule (0: all)")
    ap.add_argument("--stop-file", help="end after the current step when this file exists "
                    "(the summary records the steps run: rerun with --stop-at to reproduce)")
    ap.add_argument("--seed", type=int, default=SEED,
                    help="init and batch sampling seed (a continuation run takes a new one)")
    ap.add_argument("--peak-lr", type=float, default=PEAK_LR)
    ap.add_argument("--warmup", type=int, default=WARMUP)
    ap.add_argument("--bench-steps", type=int, default=0,
                    help="time this many steps and exit (no output)")
    args = ap.parse_args()
    SEQ, BATCH = args.seq, args.batch
    PEAK_LR, WARMUP = args.peak_lr, args.warmup

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    vocab, tok_ids, merges = read_tokenizer(args.tokenizer)
    ENDOFTEXT, IM_START, IM_END = (tok_ids[t] for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>"))
    cfg_json = model_config(vocab)
    c = mr.MimoConfig(cfg_json)
    w = init_weights(c, gen)
    if args.init:
        init_from(w, args.init, args.init_tokenizer, tok_ids, merges)
    ref = mr.MimoReference(c, w, torch.float32)
    bp = mr.BatchedPaths(ref)

    train = load_ids(os.path.join(args.corpus, "train_ids.u16"))
    valid = load_ids(os.path.join(args.corpus, "valid_ids.u16"))
    n_valid = valid.numel() // VALID_SEQ
    valid_chunks = valid[:n_valid * VALID_SEQ].view(n_valid, VALID_SEQ)
    agent = agent_starts = None
    if args.agent_batch:
        agent = load_ids(os.path.join(args.corpus, "agent_ids.u16"))
        # Conversation starts: 0 and after every <|endoftext|>, leaving room for a window.
        ends = (agent == ENDOFTEXT).nonzero().flatten() + 1
        agent_starts = torch.cat([torch.zeros(1, dtype=torch.long), ends])
        agent_starts = agent_starts[agent_starts <= agent.numel() - args.agent_seq]
        # Starts of the conversations whose assistant turns hold a <tool_call>
        # (the system turn's tool instructions name the tag too).
        in_turn = assistant_mask(agent, IM_START, tok_ids["assistant"], IM_END)
        call_at = ((agent == tok_ids["<tool_call>"]) & in_turn).nonzero().flatten()
        nxt = torch.searchsorted(call_at, agent_starts)
        conv_end = torch.cat([ends, torch.tensor([agent.numel()])])
        conv_end = conv_end[torch.searchsorted(conv_end, agent_starts, right=True)]
        has_call = (nxt < call_at.numel()) & (call_at[nxt.clamp(max=call_at.numel() - 1)] < conv_end)
        call_starts = agent_starts[has_call]
        agent_mask = in_turn if args.agent_loss == "assistant" else None

    params = [t for n, t in w.items() if t.requires_grad]
    decay = [t for n, t in w.items() if t.requires_grad and t.dim() == 2]
    no_decay = [t for n, t in w.items() if t.requires_grad and t.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=PEAK_LR, betas=(0.9, 0.95), eps=1e-8)
    n_params = sum(t.numel() for t in w.values())
    print(f"params {n_params} ({n_params * 2 / 2**20:.1f} MiB bf16); train {train.numel()} "
          f"tokens, valid {valid.numel()} ({n_valid} chunks of {VALID_SEQ})" +
          (f"; agent {agent.numel()} tokens, {agent_starts.numel()} conversation starts "
           f"({call_starts.numel()} with a tool call)"
           if agent is not None else ""), flush=True)

    steps = args.bench_steps or args.steps
    log = []
    t0 = time.time()
    steps_run = steps
    for step in range(steps):
        if step > 0 and (step == args.stop_at or (args.stop_file and os.path.exists(args.stop_file))):
            steps_run = step
            print(f"stopped after {step} of {steps} steps", flush=True)
            break
        lr = lr_at(step, steps)
        for g in opt.param_groups:
            g["lr"] = lr
        starts = torch.randint(0, train.numel() - SEQ, (BATCH,), generator=gen)
        x = torch.stack([train[s:s + SEQ] for s in starts.tolist()])
        main_loss, mtp_losses, stats = losses(bp, x, gen)
        if agent is not None:
            # A second batch of windows that start at a conversation; the step's
            # loss is the token-weighted mean over both batches.
            kc = args.agent_call_windows
            pick = torch.randint(0, agent_starts.numel(), (args.agent_batch - kc,), generator=gen)
            at = agent_starts[pick].tolist()
            if kc:
                at = call_starts[torch.randint(0, call_starts.numel(), (kc,), generator=gen)].tolist() + at
            xa = torch.stack([agent[s:s + args.agent_seq] for s in at])
            maska = None if agent_mask is None else torch.stack(
                [agent_mask[s:s + args.agent_seq] for s in at])
            ma, mtpa, sa = losses(bp, xa, gen, maska)
            fk = (1 - args.agent_weight if args.agent_weight else
                  (BATCH * SEQ) / (BATCH * SEQ + args.agent_batch * args.agent_seq))
            main_loss = fk * main_loss + (1 - fk) * ma
            mtp_losses = [fk * l + (1 - fk) * la for l, la in zip(mtp_losses, mtpa)]
            stats = [(p, l + la) for (p, l), (_, la) in zip(stats, sa)]
        loss = main_loss + sum(wk * l for wk, l in zip(MTP_WEIGHTS, mtp_losses))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = float(torch.nn.utils.clip_grad_norm_(params, CLIP))
        opt.step()
        imbalance = []
        with torch.no_grad():
            for p, load in stats:
                load = load.to(torch.float32)
                b = w[p + "mlp.gate.e_score_correction_bias"]
                b += BIAS_UPDATE * torch.sign(load.mean() - load)
                imbalance.append(float(load.max() / load.mean()))
        if args.bench_steps:
            print(f"step {step}: {time.time() - t0:.1f} s, loss {float(main_loss):.3f}", flush=True)
            continue
        if step % args.log_every == 0 or step == steps - 1:
            rec = {"step": step, "elapsed_s": round(time.time() - t0, 1), "lr": round(lr, 6),
                   "loss": round(float(main_loss), 4),
                   "mtp_loss": [round(float(l), 4) for l in mtp_losses],
                   "grad_norm": round(gnorm, 3),
                   "max_expert_load_over_mean": round(max(imbalance), 3)}
            if (step % args.eval_every == 0 and step > 0) or step == steps - 1:
                ev = evaluate(bp, valid_chunks)
                rec["valid"] = {k: (round(v, 4) if isinstance(v, float) else
                                    [round(x, 4) for x in v] if isinstance(v, list) else v)
                                for k, v in ev.items()}
            log.append(rec)
            print(json.dumps(rec), flush=True)
    if args.bench_steps:
        dt = time.time() - t0
        print(f"{steps} steps in {dt:.1f} s: {dt / steps:.2f} s/step, "
              f"{steps * BATCH * SEQ / dt:.0f} tokens/s")
        return
    train_s = time.time() - t0
    torch.save({n: t.detach() for n, t in w.items()}, os.path.join(args.out, "weights_f32.pt.tmp")) \
        if os.path.isdir(args.out) else None

    # Export: bf16 weights; everything below measures the exported model.
    os.makedirs(args.out, exist_ok=True)
    final = {n: to_bf16_round(t) for n, t in w.items()}
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(cfg_json, f, indent=2)
        f.write("\n")
    write_safetensors(os.path.join(args.out, "model.safetensors"), final)
    if os.path.abspath(args.tokenizer) != os.path.abspath(os.path.join(args.out, "tokenizer.json")):
        with open(args.tokenizer) as src, open(os.path.join(args.out, "tokenizer.json"), "w") as dst:
            dst.write(src.read())
    exported = mr.MimoReference.load(args.out, dtype=torch.float32)
    ev = evaluate(mr.BatchedPaths(exported), valid_chunks)
    summary = {"summary": True, "steps": steps, "steps_run": steps_run, "batch": BATCH, "seq": SEQ,
               "agent_batch": args.agent_batch, "agent_seq": args.agent_seq,
               "agent_loss": args.agent_loss, "agent_weight": args.agent_weight,
               "agent_call_windows": args.agent_call_windows,
               "peak_lr": PEAK_LR, "warmup": WARMUP, "init": args.init,
               "train_tokens_seen": steps_run * (BATCH * SEQ + args.agent_batch * args.agent_seq),
               "train_stream_tokens": train.numel(),
               "agent_stream_tokens": agent.numel() if agent is not None else 0,
               "train_wall_s": round(train_s, 1), "threads": 1, "params": n_params,
               "torch": torch.__version__, "seed": args.seed,
               "valid_exported_bf16": ev}
    log.append(summary)
    tmp_pt = os.path.join(args.out, "weights_f32.pt.tmp")
    if os.path.exists(tmp_pt):
        os.remove(tmp_pt)
    with open(os.path.join(args.out, "training_log.jsonl"), "w") as f:
        for rec in log:
            f.write(json.dumps(rec) + "\n")
    print(json.dumps(summary), flush=True)
    if args.fixtures:
        import make_demo_fixtures
        make_demo_fixtures.write(args.out, valid_chunks, args.fixtures)


if __name__ == "__main__":
    main()
