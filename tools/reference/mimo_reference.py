"""Independent dense PyTorch reference of a MiMo-V2-style hybrid SWA + MoE model.

Written from docs/architecture.md#model and the Hugging Face MiMo-V2 semantics
(modeling_mimo_v2*.py, gpt-oss's sink handling, DeepSeek-V3 ``noaux_tc``
routing), NOT from swaserve's C++ engine. No KV cache: every call runs the
whole sequence, with an explicit causal / sliding-window mask.

Semantics (per token position q, 0-based):
  x = embed_tokens[t]
  per layer l:
    a = RMSNorm(x) with input_layernorm
    q = a Wq, k = a Wk, v = a Wv * attention_value_scale
    NeoX RoPE (rotate_half over the first rotary_dim dims, pairs (i, i+rd/2),
      inv_freq_i = theta^(-2i/rd)), theta = rope_theta (full) or
      swa_rope_theta (SWA); rotary_dim = int(head_dim * partial_rotary_factor)
      rounded down to even; the remaining dims pass through.
    scores = q k^T * head_dim^-0.5, GQA (query head h uses KV head
      h // (heads / kv_heads)); mask: k <= q, and for SWA layers k > q - W.
    sink (if configured for the layer type): softmax over [scores, sink_h],
      sink column dropped; else plain softmax.
    x += o_proj(P v)
    m = RMSNorm(x) with post_attention_layernorm
    dense: x += down(silu(gate m) * up m)
    MoE:   s = sigmoid(m Wg^T) (fp32 or wider); top-k experts by
           s + e_score_correction_bias; weights = s of the chosen experts,
           / (sum + 1e-20) if norm_topk_prob, * routed_scaling_factor;
           x += sum_e w_e * down_e(silu(gate_e m) * up_e m)
  hidden = x (the MTP input: the last layer's output before the final norm)
  logits = lm_head(RMSNorm(x) with model.norm)

MTP layer k (model.mtp.layers.{k}), at MTP position p (RoPE position p):
  input token  = main token p + 1 + k, input hidden = h_{k}[p] where
  h_0 = main hidden and h_{k} = MTP layer k-1's block output;
  x = eh_proj(concat(enorm(embed(token)), hnorm(hidden)))   # embedding first
  x = one SWA block (sink per add_swa_attention_sink_bias, dense SwiGLU MLP
      with intermediate_size; its post-attention norm is
      post_attention_layernorm, MiMo's original name pre_mlp_layernorm is
      accepted too)
  logits = lm_head(final_layernorm(x)); x is the next MTP layer's hidden.
  MTP layer k's sequence has len(tokens) - 1 - k positions; its logits at p
  predict main token p + 2 + k.

Usable from other scripts (make_golden.py, bench_torch_prefill.py):
  ref = MimoReference.load(dir, dtype=torch.float64)
  logits, hidden = ref.forward(tokens)             # [T, V], [T, H]
  mtp_logits, mtp_hidden = ref.mtp(k, tokens[1+k:], hidden[:T-1-k])
Batched and autograd-friendly, the same semantics (tools/train/train_demo.py
trains through it):
  bp = BatchedPaths(ref)                           # weights may require grad
  h = bp.hidden(tokens_BT)                         # [B, T, H]
  logits = bp.logits(h)
  hk = bp.mtp_hidden(k, tokens_BT[:, 1+k:], h_prev[:, :T-1-k]); bp.mtp_logits(k, hk)

Run with Debian's python3 (/usr/bin/python3), which sees python3-torch.
"""

import json
import os
import struct

import torch
import torch.nn.functional as F

__all__ = ["BatchedPaths", "MimoConfig", "MimoReference", "load_safetensors", "rotary_dim"]


# ---------------------------------------------------------------------------
# Safetensors (no `safetensors` package: parse the format directly).

def _e4m3_value(code):
    """FP8 E4M3 (bias 7, S.1111.111 NaN, no infinities) by its definition."""
    sign = -1.0 if code & 0x80 else 1.0
    e, m = (code >> 3) & 15, code & 7
    if e == 15 and m == 7:
        return float("nan")
    if e == 0:
        return sign * (m / 8.0) * 2.0 ** -6
    return sign * (1.0 + m / 8.0) * 2.0 ** (e - 7)


def _e4m3_table():
    import numpy as np
    return np.array([_e4m3_value(c) for c in range(256)], dtype=np.float64)


_E4M3 = None  # filled on first use (numpy imported lazily)


def _read_safetensors_file(path, dtype):
    """Returns {name: tensor in `dtype`} for one .safetensors file."""
    import numpy as np
    global _E4M3
    if _E4M3 is None:
        _E4M3 = _e4m3_table()

    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise ValueError(f"{path}: too short for a safetensors header")
    (n,) = struct.unpack("<Q", raw[:8])
    if 8 + n > len(raw):
        raise ValueError(f"{path}: header length {n} exceeds the file")
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        shape = list(info["shape"])
        numel = 1
        for d in shape:
            numel *= d
        buf = raw[base + begin: base + end]
        st = info["dtype"]
        size = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8, "F8_E4M3": 1}.get(st)
        if size is None:
            raise ValueError(f"{path}: tensor {name}: unsupported dtype {st}")
        if len(buf) != numel * size:
            raise ValueError(f"{path}: tensor {name}: {len(buf)} bytes, shape "
                             f"{shape} needs {numel * size}")
        if st == "F32":
            arr = np.frombuffer(buf, dtype="<f4", count=numel).astype(np.float32)
        elif st == "F16":
            arr = np.frombuffer(buf, dtype="<f2", count=numel).astype(np.float32)
        elif st == "BF16":
            u16 = np.frombuffer(buf, dtype="<u2", count=numel).astype(np.uint32)
            arr = (u16 << 16).view(np.float32)
        elif st == "F8_E4M3":
            arr = _E4M3[np.frombuffer(buf, dtype=np.uint8, count=numel)]
        else:
            arr = np.frombuffer(buf, dtype="<f8", count=numel)
        out[name] = torch.from_numpy(arr.copy()).reshape(shape).to(dtype)
    return out


def load_safetensors(ckpt_dir, dtype=torch.float64):
    """All tensors of a checkpoint directory (single file or sharded)."""
    single = os.path.join(ckpt_dir, "model.safetensors")
    if os.path.exists(single):
        return _read_safetensors_file(single, dtype)
    index = os.path.join(ckpt_dir, "model.safetensors.index.json")
    with open(index) as f:
        weight_map = json.load(f)["weight_map"]
    out = {}
    for fname in sorted(set(weight_map.values())):
        out.update(_read_safetensors_file(os.path.join(ckpt_dir, fname), dtype))
    return out


# ---------------------------------------------------------------------------
# Config.

def rotary_dim(head_dim, factor):
    """int(head_dim * partial_rotary_factor), rounded down to even."""
    d = int(head_dim * factor)
    return d - (d % 2)


class AttnGeom:
    def __init__(self, heads, kv_heads, head_dim, v_head_dim, theta, sink, factor):
        self.heads = heads
        self.kv_heads = kv_heads
        self.head_dim = head_dim
        self.v_head_dim = v_head_dim
        self.theta = float(theta)
        self.sink = bool(sink)
        self.rotary_dim = rotary_dim(head_dim, factor)


class MimoConfig:
    """The fields of docs/architecture.md#model from a HF-style config.json."""

    def __init__(self, j):
        def get(name, default=None, *aliases):
            for n in (name,) + aliases:
                if n in j and j[n] is not None:
                    return j[n]
            return default

        self.vocab_size = int(j["vocab_size"])
        self.hidden_size = int(j["hidden_size"])
        self.num_layers = int(j["num_hidden_layers"])
        heads = int(j["num_attention_heads"])
        pattern = get("hybrid_layer_pattern")
        if pattern is None and get("layer_types") is not None:
            pattern = [1 if t == "sliding_attention" else 0 for t in j["layer_types"]]
        if pattern is None:
            pattern = [0] * self.num_layers
        self.swa_layers = [bool(p) for p in pattern]
        moe = get("moe_layer_freq")
        if moe is None and get("mlp_layer_types") is not None:
            moe = [1 if t == "sparse" else 0 for t in j["mlp_layer_types"]]
        if moe is None or isinstance(moe, int):
            moe = [0] * self.num_layers
        self.moe_layers = [bool(m) for m in moe]
        assert len(self.swa_layers) == self.num_layers
        assert len(self.moe_layers) == self.num_layers
        self.window = int(get("sliding_window", 0, "sliding_window_size") or 0)
        kv = int(get("num_key_value_heads", heads))
        hd = int(get("head_dim", self.hidden_size // heads))
        vhd = int(get("v_head_dim", hd))
        rp = get("rope_parameters")
        if rp is not None:
            # transformers-native (MiMoV2FlashConfig): RoPE per layer type;
            # MiMoV2FlashAttention gives SWA layers 2 x the KV heads and sinks.
            full_rp = rp.get("full_attention", rp)
            swa_rp = rp.get("sliding_attention", full_rp)
            factor = float(full_rp["partial_rotary_factor"])
            assert float(swa_rp["partial_rotary_factor"]) == factor
            mimo = j.get("model_type") == "mimo_v2_flash"
            self.full = AttnGeom(heads, kv, hd, vhd, full_rp["rope_theta"], False, factor)
            self.swa = AttnGeom(heads, 2 * kv if mimo else kv, hd, vhd,
                                swa_rp["rope_theta"], mimo, factor)
        else:
            factor = float(get("partial_rotary_factor", 1.0))
            theta = float(get("rope_theta", 10000.0))
            self.full = AttnGeom(heads, kv, hd, vhd, theta,
                                 get("add_full_attention_sink_bias", False), factor)
            self.swa = AttnGeom(int(get("swa_num_attention_heads", heads)),
                                int(get("swa_num_key_value_heads", kv)),
                                int(get("swa_head_dim", hd)),
                                int(get("swa_v_head_dim", vhd)),
                                float(get("swa_rope_theta", theta)),
                                get("add_swa_attention_sink_bias", False), factor)
        self.partial_rotary_factor = factor
        q = get("quantization_config")
        self.fp8_block = None
        if q is not None:
            assert q["quant_method"] == "fp8" and q.get("fmt", "e4m3") == "e4m3", q
            self.fp8_block = tuple(int(b) for b in q["weight_block_size"])
        self.fused_qkv = get("attention_projection_layout") == "fused_qkv"
        # SGLang's MiMo-V2 loader: num_key_value_heads tensor-parallel groups.
        self.qkv_groups = kv
        self.v_scale = float(get("attention_value_scale", 1.0))
        self.intermediate_size = int(get("intermediate_size", 0))
        self.moe_intermediate_size = int(get("moe_intermediate_size", 0))
        self.n_routed_experts = int(get("n_routed_experts", 0))
        self.top_k = int(get("num_experts_per_tok", 0))
        self.norm_topk_prob = bool(get("norm_topk_prob", True))
        self.routed_scaling_factor = float(get("routed_scaling_factor", 1.0))
        self.num_mtp_layers = int(get("num_nextn_predict_layers", 0))
        self.eps = float(get("rms_norm_eps", 1e-6, "layernorm_epsilon"))
        self.tie_word_embeddings = bool(get("tie_word_embeddings", False))

    @staticmethod
    def load(ckpt_dir):
        with open(os.path.join(ckpt_dir, "config.json")) as f:
            return MimoConfig(json.load(f))


# ---------------------------------------------------------------------------
# Released-checkpoint layouts: FP8 block scales, fused qkv_proj, HF names.

def _dequant_blocks(w, scale, block):
    """w * scale, each scale covering a block[0] x block[1] block (edges partial)."""
    bo, bi = block
    full = scale.repeat_interleave(bo, dim=0).repeat_interleave(bi, dim=1)
    return w * full[: w.shape[0], : w.shape[1]].to(w.dtype)


def _fused_geometry(config, name):
    if name.startswith("model.layers."):
        layer = int(name.split(".")[2])
        return config.swa if config.swa_layers[layer] else config.full
    return config.swa  # MTP layers


def prepare_weights(config, weights):
    """Dequantizes FP8 weights with their *_scale_inv block scales, splits a
    fused self_attn.qkv_proj into q/k/v_proj, and accepts transformers'
    self_attn.sinks for attention_sink_bias. A fused qkv_proj is
    num_key_value_heads groups of [q | k | v] rows (its scales laid out per
    group, each padded to whole blocks): dequantized group by group, then
    the groups' q, k and v rows concatenated in head order."""
    w = dict(weights)
    for name in [n for n in w if n.endswith(".weight_scale_inv")]:
        scale = w.pop(name)
        wname = name[: -len("_scale_inv")]
        q = w[wname]
        if wname.endswith("self_attn.qkv_proj.weight"):
            g = config.qkv_groups
            gr = q.shape[0] // g
            sg = -(-gr // config.fp8_block[0])
            w[wname] = torch.cat([
                _dequant_blocks(q[i * gr:(i + 1) * gr], scale[i * sg:(i + 1) * sg],
                                config.fp8_block) for i in range(g)])
        else:
            w[wname] = _dequant_blocks(q, scale, config.fp8_block)
    for name in [n for n in w if n.endswith("self_attn.qkv_proj.weight")]:
        qkv = w.pop(name)
        geom = _fused_geometry(config, name)
        g = config.qkv_groups
        rows = [geom.heads // g * geom.head_dim, geom.kv_heads // g * geom.head_dim,
                geom.kv_heads // g * geom.v_head_dim]
        groups = qkv.view(g, sum(rows), qkv.shape[1]).split(rows, dim=1)
        prefix = name[: -len("qkv_proj.weight")]
        for part, t in zip(("q_proj", "k_proj", "v_proj"), groups):
            w[prefix + part + ".weight"] = t.reshape(-1, qkv.shape[1]).contiguous()
    for name in [n for n in w if n.endswith(".self_attn.sinks")]:
        w[name[: -len("sinks")] + "attention_sink_bias"] = w.pop(name)
    return w


# ---------------------------------------------------------------------------
# The model.

def rms_norm(x, w, eps):
    var = x.pow(2).mean(-1, keepdim=True)
    return x * torch.rsqrt(var + eps) * w


def rope_cos_sin(positions, rd, theta, dtype):
    """HF default RoPE tables, [T, rd] (emb = cat(freqs, freqs))."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, rd, 2, dtype=torch.float64) / rd))
    freqs = positions.to(torch.float64)[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


def apply_partial_rope_(x, cos, sin, rd):
    """In place on x [heads, T, head_dim]: rotates the first rd dims (NeoX
    halves); the other head_dim - rd dims pass through untouched."""
    xr = x[..., :rd]
    xr.copy_(xr * cos + rotate_half(xr) * sin)
    return x


class MimoReference:
    """Dense, cache-free forward of a checkpoint directory.

    dtype: compute dtype (torch.float64 for golden values, torch.float32 for
    benchmarks). attn_block: query rows per attention block (bounds memory;
    the result does not depend on it beyond rounding). swa_keys: "mask" (a
    SWA query block scores every causal key and masks those outside the
    window, as HF eager attention does) or "window" (scores only the keys
    inside the window). logits_last_only: forward() computes logits for the
    last position only (prefill for serving).
    """

    def __init__(self, config, weights, dtype=torch.float64, attn_block=None,
                 swa_keys="mask"):
        self.c = config
        self.w = weights
        self.dtype = dtype
        self.attn_block = attn_block
        assert swa_keys in ("mask", "window")
        self.swa_keys = swa_keys
        self._rope_cache = {}
        self._mask_cache = {}
        self._scores = None

    @staticmethod
    def load(ckpt_dir, dtype=torch.float64, **kw):
        config = MimoConfig.load(ckpt_dir)
        weights = load_safetensors(ckpt_dir, dtype)
        return MimoReference(config, prepare_weights(config, weights), dtype, **kw)

    def _lm_head(self):
        if "lm_head.weight" in self.w:
            return self.w["lm_head.weight"]
        assert self.c.tie_word_embeddings, "lm_head.weight missing"
        return self.w["model.embed_tokens.weight"]

    # -- attention ---------------------------------------------------------

    def _rope(self, positions, geom):
        key = (positions.numel(), geom.rotary_dim, geom.theta)
        if key not in self._rope_cache:
            self._rope_cache[key] = rope_cos_sin(positions, geom.rotary_dim, geom.theta,
                                                 self.dtype)
        return self._rope_cache[key]

    def _mask(self, positions, qs, qe, ks, swa):
        """Bool [n, nk]: True where query qs+i must not see key ks+j (after
        it, or for SWA at or beyond W positions before it). Cached: the same
        blocks recur in every layer."""
        key = (positions.numel(), qs, qe, ks, swa, self.c.window)
        m = self._mask_cache.get(key)
        if m is None:
            qi = positions[qs:qe][:, None]
            ki = positions[ks:qe][None, :]
            m = ki > qi
            if swa:
                m = m | (ki <= qi - self.c.window)
            if len(self._mask_cache) > 4096:
                self._mask_cache.clear()
            self._mask_cache[key] = m
        return m

    def attention(self, p, x, geom, swa, positions):
        """Pre-normed input x [T, H] → o_proj output [T, H]."""
        w = self.w
        T = x.shape[0]
        Hq, Hkv, D, Dv = geom.heads, geom.kv_heads, geom.head_dim, geom.v_head_dim
        rep = Hq // Hkv
        q = (x @ w[p + "self_attn.q_proj.weight"].t()).view(T, Hq, D).transpose(0, 1)
        k = (x @ w[p + "self_attn.k_proj.weight"].t()).view(T, Hkv, D).transpose(0, 1)
        v = (x @ w[p + "self_attn.v_proj.weight"].t()).view(T, Hkv, Dv).transpose(0, 1)
        v = (v * self.c.v_scale).contiguous()
        cos, sin = self._rope(positions, geom)
        q = apply_partial_rope_(q, cos, sin, geom.rotary_dim)
        k = apply_partial_rope_(k, cos, sin, geom.rotary_dim)
        scale = D ** -0.5
        kt = k.transpose(-1, -2).contiguous()         # [Hkv, D, T]
        sink = None
        if geom.sink:
            # [Hkv, rep, 1, 1]: query head h = g * rep + r uses KV head g.
            sink = w[p + "self_attn.attention_sink_bias"].view(Hkv, rep, 1, 1)
        W = self.c.window
        # GQA without repeating K/V: the rep query heads of KV head g are
        # stacked along the row axis, [Hkv, rep, T, D].
        qg = q.reshape(Hkv, rep, T, D)
        out = torch.empty(Hkv, rep, T, Dv, dtype=self.dtype)
        block = self.attn_block
        if not block:
            # Score blocks of ~2^21 elements (8 MB in f32): small enough to
            # stay cache-friendly, large enough that per-block overhead is
            # negligible (measured on 2 EPYC cores: 2^21 beats 2^23-2^27).
            block = min(T, max(64, (1 << 21) // max(1, Hq * T)))
        # One score buffer reused by every block and layer: allocating a
        # fresh multi-MB tensor per block costs more in page faults than the
        # matmul itself.
        need = Hq * min(block, T) * T
        if self._scores is None or self._scores.numel() < need or self._scores.dtype != self.dtype:
            self._scores = torch.empty(need, dtype=self.dtype)
        for qs in range(0, T, block):
            qe = min(T, qs + block)
            n = qe - qs
            ks = 0
            if swa and self.swa_keys == "window":
                ks = max(0, qs - W + 1)
            nk = qe - ks
            # Keys after qe are masked for every query of the block (causal),
            # so they are not scored at all.
            s = self._scores[:Hkv * rep * n * nk].view(Hkv, rep * n, nk)
            torch.baddbmm(s, qg[:, :, qs:qe].reshape(Hkv, rep * n, D), kt[:, :, ks:qe],
                          beta=0, alpha=scale, out=s)
            s = s.view(Hkv, rep, n, nk)
            s.masked_fill_(self._mask(positions, qs, qe, ks, swa), float("-inf"))
            # Softmax in place; with a sink, over [scores, sink] with the sink
            # column dropped: m = max(max_j s_j, sink), p_j = e^(s_j - m) /
            # (sum_j e^(s_j - m) + e^(sink - m)).
            m = s.amax(dim=-1, keepdim=True)
            if sink is not None:
                m = torch.maximum(m, sink)
            s.sub_(m).exp_()
            denom = s.sum(dim=-1, keepdim=True)
            if sink is not None:
                denom = denom + torch.exp(sink - m)
            s.div_(denom)
            out[:, :, qs:qe] = torch.bmm(s.view(Hkv, rep * n, nk),
                                         v[:, ks:qe]).view(Hkv, rep, n, Dv)
        o = out.reshape(Hq, T, Dv).transpose(0, 1).reshape(T, Hq * Dv)
        return o @ w[p + "self_attn.o_proj.weight"].t()

    # -- MLPs --------------------------------------------------------------

    def dense_mlp(self, p, x):
        w = self.w
        g = x @ w[p + "mlp.gate_proj.weight"].t()
        u = x @ w[p + "mlp.up_proj.weight"].t()
        return (F.silu(g) * u) @ w[p + "mlp.down_proj.weight"].t()

    def route(self, p, x):
        """(top-k expert ids [T, k], weights [T, k], margin [T]).

        margin = (k-th best biased score) - ((k+1)-th best): how close the
        selection was to a tie (for checking that a lower-precision engine
        must make the same choice)."""
        w = self.w
        rdt = torch.float64 if self.dtype == torch.float64 else torch.float32
        logits = x.to(rdt) @ w[p + "mlp.gate.weight"].to(rdt).t()
        scores = torch.sigmoid(logits)
        biased = scores + w[p + "mlp.gate.e_score_correction_bias"].to(rdt)[None, :]
        k = self.c.top_k
        top = torch.topk(biased, min(k + 1, biased.shape[1]), dim=-1, sorted=True)
        idx = top.indices[:, :k]
        if biased.shape[1] > k:
            margin = top.values[:, k - 1] - top.values[:, k]
        else:
            margin = torch.full((x.shape[0],), float("inf"), dtype=rdt)
        weight = scores.gather(1, idx)
        if self.c.norm_topk_prob:
            weight = weight / (weight.sum(dim=-1, keepdim=True) + 1e-20)
        weight = weight * self.c.routed_scaling_factor
        return idx, weight.to(self.dtype), margin

    def moe(self, p, x, margins=None):
        idx, weight, margin = self.route(p, x)
        if margins is not None:
            margins.append(margin)
        out = torch.zeros_like(x)
        w = self.w
        for e in range(self.c.n_routed_experts):
            tok, slot = torch.where(idx == e)
            if tok.numel() == 0:
                continue
            ep = f"{p}mlp.experts.{e}."
            xe = x[tok]
            h = F.silu(xe @ w[ep + "gate_proj.weight"].t()) * (xe @ w[ep + "up_proj.weight"].t())
            y = h @ w[ep + "down_proj.weight"].t()
            out.index_add_(0, tok, y * weight[tok, slot][:, None])
        return out

    # -- blocks ------------------------------------------------------------

    def block(self, p, x, geom, swa, positions, moe, margins=None):
        c, w = self.c, self.w
        a = rms_norm(x, w[p + "input_layernorm.weight"], c.eps)
        x = x + self.attention(p, a, geom, swa, positions)
        post = p + "post_attention_layernorm.weight"
        if post not in w:
            post = p + "pre_mlp_layernorm.weight"  # MiMo's original MTP name
        m = rms_norm(x, w[post], c.eps)
        if moe:
            x = x + self.moe(p, m, margins)
        else:
            x = x + self.dense_mlp(p, m)
        return x

    def forward(self, tokens, logits_last_only=False, margins=None):
        """Main model. Returns (logits [T or 1, V], hidden [T, H]); hidden is
        the last layer's output before the final norm."""
        c, w = self.c, self.w
        tok = torch.as_tensor(list(tokens), dtype=torch.long)
        positions = torch.arange(tok.numel(), dtype=torch.long)
        x = w["model.embed_tokens.weight"][tok]
        for l in range(c.num_layers):
            swa = c.swa_layers[l]
            x = self.block(f"model.layers.{l}.", x, c.swa if swa else c.full, swa,
                           positions, c.moe_layers[l], margins)
        hidden = x
        y = hidden[-1:] if logits_last_only else hidden
        logits = rms_norm(y, w["model.norm.weight"], c.eps) @ self._lm_head().t()
        return logits, hidden

    def mtp(self, k, tokens, hidden):
        """MTP layer k over MTP positions 0..n-1: tokens[p] is main token
        p + 1 + k, hidden[p] the main hidden (k = 0) or MTP layer k-1's block
        output at position p. Returns (logits [n, V], block output [n, H])."""
        c, w = self.c, self.w
        p = f"model.mtp.layers.{k}."
        tok = torch.as_tensor(list(tokens), dtype=torch.long)
        n = tok.numel()
        assert hidden.shape[0] == n, (hidden.shape, n)
        positions = torch.arange(n, dtype=torch.long)
        e = rms_norm(w["model.embed_tokens.weight"][tok], w[p + "enorm.weight"], c.eps)
        h = rms_norm(hidden, w[p + "hnorm.weight"], c.eps)
        x = torch.cat([e, h], dim=-1) @ w[p + "eh_proj.weight"].t()
        x = self.block(p, x, c.swa, True, positions, False)
        logits = rms_norm(x, w[p + "final_layernorm.weight"], c.eps) @ self._lm_head().t()
        return logits, x

    def forward_with_mtp(self, tokens, margins=None):
        """Main logits [T, V] and, per MTP layer k, logits [T-1-k, V]."""
        logits, hidden = self.forward(tokens, margins=margins)
        mtp = []
        h = hidden
        T = len(tokens)
        for k in range(self.c.num_mtp_layers):
            n = T - 1 - k
            if n <= 0:
                break
            ml, h = self.mtp(k, list(tokens)[1 + k:], h[:n])
            mtp.append(ml)
        return logits, mtp


# ---------------------------------------------------------------------------
# Batched, autograd-friendly paths (tools/train/train_demo.py).
#
# The same semantics as block()/forward()/mtp() above, for a batch of
# sequences [B, T] and without in-place updates of tensors autograd needs, so
# gradients flow to the weights in `self.w` (leaf tensors with
# requires_grad). Differences that are not numerics: the whole [T, T] score
# matrix is formed (no query blocks), the sink is a key column with a zero
# value, q is scaled before Q.K, and the MoE router's top-k choice
# is made without gradient (the chosen experts' unbiased sigmoid scores carry
# it). These give the same values as the paths above up to rounding
# (tools/train/train_demo.py checks it against forward_with_mtp on export).

def _rope_batched(x, cos, sin, rd):
    """x [..., T, D]: NeoX RoPE on the first rd dims, out of place."""
    xr, xp = x[..., :rd], x[..., rd:]
    return torch.cat([xr * cos + rotate_half(xr) * sin, xp], dim=-1)


class BatchedPaths:
    """Batched forward over a MimoReference's config and weights.

    route_stats: when a list, each MoE layer appends (prefix, expert load
    [E] = tokens routed to each expert) for the auxiliary-free balance
    update of e_score_correction_bias.
    """

    def __init__(self, ref):
        self.r = ref
        self.c = ref.c
        self.w = ref.w
        self._masks = {}

    def _mask(self, T, swa, device):
        """Additive [T, T] mask: 0 where query q may see key k, -inf else."""
        key = (T, swa)
        m = self._masks.get(key)
        if m is None:
            qi = torch.arange(T, device=device)[:, None]
            ki = torch.arange(T, device=device)[None, :]
            hide = ki > qi
            if swa:
                hide = hide | (ki <= qi - self.c.window)
            m = torch.zeros(T, T).masked_fill(hide, float("-inf"))
            self._masks[key] = m
        return m

    def attention(self, p, x, geom, swa):
        """x [B, T, H] (pre-normed) -> o_proj output [B, T, H].

        GQA without repeating K/V: the rep query heads of KV head g are
        stacked along the row axis. A sink is one more key whose K and V are
        zero and whose score bias is the sink logit, so the softmax over
        [scores, sink] is one softmax and needs no slicing."""
        w, c = self.w, self.c
        B, T, _ = x.shape
        Hq, Hkv, D, Dv = geom.heads, geom.kv_heads, geom.head_dim, geom.v_head_dim
        rep = Hq // Hkv
        q = (x @ w[p + "self_attn.q_proj.weight"].t()).view(B, T, Hkv, rep, D).permute(0, 2, 3, 1, 4)
        k = (x @ w[p + "self_attn.k_proj.weight"].t()).view(B, T, Hkv, D).permute(0, 2, 1, 3)
        v = (x @ w[p + "self_attn.v_proj.weight"].t()).view(B, T, Hkv, Dv).permute(0, 2, 1, 3)
        v = v * c.v_scale
        cos, sin = rope_cos_sin(torch.arange(T), geom.rotary_dim, geom.theta, x.dtype)
        q = _rope_batched(q, cos, sin, geom.rotary_dim) * (D ** -0.5)
        k = _rope_batched(k, cos, sin, geom.rotary_dim)
        bias = self._mask(T, swa, x.device).expand(Hkv, rep, T, T)
        if geom.sink:
            # One extra key: zero K (score 0) plus the sink logit as its bias,
            # zero V. The [T, T + 1] bias is per head, not per sequence.
            sink = w[p + "self_attn.attention_sink_bias"].view(Hkv, rep, 1, 1)
            bias = torch.cat([bias, sink.expand(Hkv, rep, T, 1)], dim=-1)
            k = torch.cat([k, k.new_zeros(B, Hkv, 1, D)], dim=2)
            v = torch.cat([v, v.new_zeros(B, Hkv, 1, Dv)], dim=2)
        nk = k.shape[2]
        s = (q.reshape(B, Hkv, rep * T, D) @ k.transpose(-1, -2)).view(B, Hkv, rep, T, nk)
        s = s + bias
        probs = torch.softmax(s, dim=-1)
        o = (probs.reshape(B, Hkv, rep * T, -1) @ v).view(B, Hkv, rep, T, Dv)
        o = o.permute(0, 3, 1, 2, 4).reshape(B, T, Hq * Dv)
        return o @ w[p + "self_attn.o_proj.weight"].t()

    def dense_mlp(self, p, x):
        w = self.w
        h = F.silu(x @ w[p + "mlp.gate_proj.weight"].t()) * (x @ w[p + "mlp.up_proj.weight"].t())
        return h @ w[p + "mlp.down_proj.weight"].t()

    def moe(self, p, x, route_stats=None):
        w, c = self.w, self.c
        shape = x.shape
        xf = x.reshape(-1, shape[-1])
        scores = torch.sigmoid(xf @ w[p + "mlp.gate.weight"].t())       # [N, E]
        with torch.no_grad():
            biased = scores + w[p + "mlp.gate.e_score_correction_bias"][None, :]
            idx = torch.topk(biased, c.top_k, dim=-1).indices          # [N, k]
        weight = scores.gather(1, idx)
        if c.norm_topk_prob:
            weight = weight / (weight.sum(dim=-1, keepdim=True) + 1e-20)
        weight = weight * c.routed_scaling_factor
        E = c.n_routed_experts
        if route_stats is not None:
            route_stats.append((p, torch.bincount(idx.reshape(-1), minlength=E)))
        out = torch.zeros_like(xf)
        for e in range(E):
            tok, slot = torch.where(idx == e)
            if tok.numel() == 0:
                continue
            ep = f"{p}mlp.experts.{e}."
            xe = xf[tok]
            h = F.silu(xe @ w[ep + "gate_proj.weight"].t()) * (xe @ w[ep + "up_proj.weight"].t())
            y = (h @ w[ep + "down_proj.weight"].t()) * weight[tok, slot][:, None]
            out = out.index_add(0, tok, y)
        return out.view(shape)

    def block(self, p, x, geom, swa, moe, route_stats=None):
        c, w = self.c, self.w
        x = x + self.attention(p, rms_norm(x, w[p + "input_layernorm.weight"], c.eps), geom, swa)
        post = p + "post_attention_layernorm.weight"
        if post not in w:
            post = p + "pre_mlp_layernorm.weight"
        m = rms_norm(x, w[post], c.eps)
        return x + (self.moe(p, m, route_stats) if moe else self.dense_mlp(p, m))

    def hidden(self, tokens, route_stats=None):
        """tokens [B, T] long -> last layer output before the final norm [B, T, H]."""
        c, w = self.c, self.w
        x = w["model.embed_tokens.weight"][tokens]
        for l in range(c.num_layers):
            swa = c.swa_layers[l]
            x = self.block(f"model.layers.{l}.", x, c.swa if swa else c.full, swa,
                           c.moe_layers[l], route_stats)
        return x

    def logits(self, h, norm="model.norm.weight"):
        return rms_norm(h, self.w[norm], self.c.eps) @ self.r._lm_head().t()

    def mtp_hidden(self, k, tokens, hidden):
        """MTP layer k over [B, n]: tokens[:, p] = main token p + 1 + k,
        hidden[:, p] = h_k at p -> block output [B, n, H] (before
        final_layernorm)."""
        c, w = self.c, self.w
        p = f"model.mtp.layers.{k}."
        e = rms_norm(w["model.embed_tokens.weight"][tokens], w[p + "enorm.weight"], c.eps)
        h = rms_norm(hidden, w[p + "hnorm.weight"], c.eps)
        x = torch.cat([e, h], dim=-1) @ w[p + "eh_proj.weight"].t()
        return self.block(p, x, c.swa, True, False)

    def mtp_logits(self, k, x):
        return self.logits(x, f"model.mtp.layers.{k}.final_layernorm.weight")


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="Run the reference on a checkpoint.")
    ap.add_argument("checkpoint")
    ap.add_argument("tokens", nargs="+", type=int)
    args = ap.parse_args()
    ref = MimoReference.load(args.checkpoint)
    logits, mtp = ref.forward_with_mtp(args.tokens)
    print("argmax per position:", logits.argmax(-1).tolist())
    for k, m in enumerate(mtp):
        print(f"MTP {k} argmax:", m.argmax(-1).tolist())
