#include "lib/model/forward.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "lib/base/status.h"
#include "lib/model/attention.h"
#include "lib/model/cpu_kernels.h"
#include "lib/model/kv_io.h"

namespace swaserve::model {

namespace {

struct AttnWeights {
  PackedWeight q, k, v, o;
  std::vector<float> sink;
};
struct DenseMlp {
  PackedWeight gate_up;  // H -> 2I: gate columns then up columns
  PackedWeight down;     // I -> H
  int inter = 0;
};
struct MoeMlp {
  PackedWeight router;      // H -> E
  std::vector<float> bias;  // [E]
  std::vector<DenseMlp> experts;
};
struct Block {
  AttentionType type = AttentionType::kFull;
  const AttentionConfig* geo = nullptr;
  int pool_layer = 0;
  std::vector<float> in_norm, post_norm;
  AttnWeights attn;
  bool moe = false;
  DenseMlp dense;
  MoeMlp moe_mlp;
};
struct MtpLayer {
  std::vector<float> enorm, hnorm, final_norm;
  PackedWeight eh_proj;  // 2H -> H
  Block block;
};

// Per-row bookkeeping of a batch.
struct RowInfo {
  int item;
  int pos;
};

void Grow(std::vector<float>& v, size_t n) {
  if (v.size() < n) v.resize(n);
}

}  // namespace

struct Engine::Impl {
  ModelConfig c;
  std::unique_ptr<Checkpoint> ckpt;
  // The embedding rows as stored (F32, BF16 or F16; never FP8).
  std::vector<uint8_t> embed;
  WeightFormat embed_format = WeightFormat::kF32;
  std::vector<float> final_norm;
  PackedWeight lm_head;
  std::vector<Block> layers;
  std::vector<MtpLayer> mtp;
  // Scratch, grown on demand and reused (no allocation in steady state).
  std::vector<float> x, xn, q, k, v, attn, o, gu, act, mlp, router, slot_out,
      gather, gather_out, cat, final_rows;
  std::vector<RowInfo> rows;
  std::vector<AttentionSpan> spans;
  // Whether each main layer is a SWA layer (the restore pyramid's input).
  std::vector<bool> swa_pattern;
  // Per item of the current call: first position and count of its live rows
  // (fewer than its tokens once a window restore's pyramid dropped some),
  // and its pyramid (input_from empty when the item does not restore).
  std::vector<int> item_start, item_n;
  std::vector<kv::WindowRestorePyramid> pyramid;
  bool any_restore = false;  // some item of the call has a pyramid
  // MoE routing scratch.
  std::vector<int> chosen, order, need;
  std::vector<float> route_weight;
  std::vector<std::vector<int>> by_expert;

  absl::StatusOr<std::vector<float>> Read(const std::string& name) {
    return ckpt->ReadF32(name);
  }
  // A projection weight [out, in] (or several stacked along out), packed
  // for MatMul in its stored format.
  absl::StatusOr<PackedWeight> ReadPacked(
      std::initializer_list<std::string> names) {
    std::vector<WeightPart> parts;
    for (const std::string& name : names) {
      ASSIGN_OR_RETURN(WeightPart part, ckpt->Weight(name));
      parts.push_back(part);
    }
    absl::StatusOr<PackedWeight> packed = PackedWeight::Pack(parts);
    if (!packed.ok()) return base::Annotate(packed.status(), *names.begin());
    return packed;
  }
  absl::StatusOr<PackedWeight> ReadPacked(const std::string& name) {
    return ReadPacked({name});
  }
  absl::Status LoadBlock(const std::string& prefix, AttentionType type,
                         bool moe, int inter, Block* b);
  // `layer`: the main layer's index (the restore pyramid applies), -1 for
  // an MTP block. Updates R when the pyramid drops rows.
  absl::Status RunBlock(const Block& b, absl::Span<const ForwardItem> items,
                        int layer, int& R);
  void Attention(const Block& b, absl::Span<const ForwardItem> items, int layer);
  // Drops the rows of window-restore items below their pyramid's bound for
  // `layer` (its input_from, or with `output` its output_from), moving the
  // kept rows of x (and, with `with_xn`, xn) down in order; returns the new
  // row count. Kernels are batch-invariant, so kept rows are unaffected.
  int DropRows(int R, int layer, bool output, bool with_xn);
  void Mlp(const Block& b, int R);
  // Fills `rows` with one (item, position) per token of `items`, in order;
  // returns the row count.
  int SetRows(absl::Span<const ForwardItem> items) {
    rows.clear();
    item_start.clear();
    item_n.clear();
    pyramid.resize(items.size());
    any_restore = false;
    for (size_t i = 0; i < items.size(); ++i) {
      item_start.push_back(items[i].start);
      item_n.push_back(static_cast<int>(items[i].tokens.size()));
      if (items[i].window_restore_end > 0) {
        any_restore = true;
        pyramid[i] = kv::WindowRestoreRows(items[i].window_restore_end, c.sliding_window,
                                           items[i].seq->FullLayer(0).page_size, swa_pattern,
                                           c.num_mtp_layers);
      } else {
        pyramid[i].input_from.clear();
      }
      for (size_t j = 0; j < items[i].tokens.size(); ++j) {
        rows.push_back({static_cast<int>(i), items[i].start + static_cast<int>(j)});
      }
    }
    return static_cast<int>(rows.size());
  }
  // `head_ids` / `head_weight` (a DraftHead's; null: the whole lm_head):
  // only those columns, the rest -infinity.
  void Logits(absl::Span<const ForwardItem> items, const std::vector<float>& norm,
              ForwardOutput* out, bool keep_all_hidden,
              const std::vector<int32_t>* head_ids = nullptr,
              const PackedWeight* head_weight = nullptr);
  std::vector<float> narrow;  // a draft head's logits before the scatter
};

absl::Status Engine::Impl::LoadBlock(const std::string& p, AttentionType type,
                                     bool moe, int inter, Block* b) {
  b->type = type;
  b->geo = type == AttentionType::kFull ? &c.full : &c.swa;
  ASSIGN_OR_RETURN(b->in_norm, Read(p + "input_layernorm.weight"));
  ASSIGN_OR_RETURN(b->post_norm, Read(p + "post_attention_layernorm.weight"));
  if (c.qkv_layout == QkvLayout::kFused) {
    const std::string name = p + "self_attn.qkv_proj.weight";
    ASSIGN_OR_RETURN(WeightPart fused, ckpt->Weight(name));
    absl::StatusOr<FusedQkvParts> parts = SplitFusedQkv(c, *b->geo, fused);
    if (!parts.ok()) return base::Annotate(parts.status(), name);
    for (auto [dst, src] : {std::pair{&b->attn.q, &parts->q}, std::pair{&b->attn.k, &parts->k},
                            std::pair{&b->attn.v, &parts->v}}) {
      absl::StatusOr<PackedWeight> packed = PackedWeight::Pack(*src);
      if (!packed.ok()) return base::Annotate(packed.status(), name);
      *dst = *std::move(packed);
    }
  } else {
    ASSIGN_OR_RETURN(b->attn.q, ReadPacked(p + "self_attn.q_proj.weight"));
    ASSIGN_OR_RETURN(b->attn.k, ReadPacked(p + "self_attn.k_proj.weight"));
    ASSIGN_OR_RETURN(b->attn.v, ReadPacked(p + "self_attn.v_proj.weight"));
  }
  ASSIGN_OR_RETURN(b->attn.o, ReadPacked(p + "self_attn.o_proj.weight"));
  if (b->geo->sink) {
    ASSIGN_OR_RETURN(b->attn.sink, Read(p + "self_attn.attention_sink_bias"));
  }
  auto load_dense = [&](const std::string& mp, int i, DenseMlp* d) -> absl::Status {
    ASSIGN_OR_RETURN(d->gate_up, ReadPacked({mp + "gate_proj.weight",
                                             mp + "up_proj.weight"}));  // [2I, H]
    ASSIGN_OR_RETURN(d->down, ReadPacked(mp + "down_proj.weight"));
    d->inter = i;
    return absl::OkStatus();
  };
  b->moe = moe;
  if (!moe) return load_dense(p + "mlp.", inter, &b->dense);
  ASSIGN_OR_RETURN(b->moe_mlp.router, ReadPacked(p + "mlp.gate.weight"));
  ASSIGN_OR_RETURN(b->moe_mlp.bias, Read(p + "mlp.gate.e_score_correction_bias"));
  b->moe_mlp.experts.resize(c.n_routed_experts);
  for (int e = 0; e < c.n_routed_experts; ++e) {
    RETURN_IF_ERROR(load_dense(absl::StrCat(p, "mlp.experts.", e, "."),
                               c.moe_intermediate_size, &b->moe_mlp.experts[e]));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(
    const EngineOptions& options) {
  if (options.threads > 0) KernelThreads::SetThreads(options.threads);
  auto impl = std::make_unique<Impl>();
  ASSIGN_OR_RETURN(impl->ckpt, Checkpoint::Open(options.checkpoint_dir));
  impl->c = impl->ckpt->config();
  const ModelConfig& c = impl->c;
  ASSIGN_OR_RETURN(WeightPart embed, impl->ckpt->Weight("model.embed_tokens.weight"));
  impl->embed_format = embed.format;
  const size_t embed_bytes = static_cast<size_t>(embed.rows) * embed.K *
                             (embed.format == WeightFormat::kF32 ? 4 : 2);
  impl->embed.assign(static_cast<const uint8_t*>(embed.data),
                     static_cast<const uint8_t*>(embed.data) + embed_bytes);
  ASSIGN_OR_RETURN(impl->final_norm, impl->Read("model.norm.weight"));
  if (c.tie_word_embeddings) {
    ASSIGN_OR_RETURN(impl->lm_head, impl->ReadPacked("model.embed_tokens.weight"));
  } else {
    ASSIGN_OR_RETURN(impl->lm_head, impl->ReadPacked("lm_head.weight"));
  }
  impl->layers.resize(c.num_layers);
  impl->swa_pattern = c.swa_layer_mask();
  for (int i = 0; i < c.num_layers; ++i) {
    RETURN_IF_ERROR(impl->LoadBlock(absl::StrCat("model.layers.", i, "."),
                                    c.layer_types[i], c.moe_layers[i],
                                    c.intermediate_size, &impl->layers[i]));
    impl->layers[i].pool_layer = c.pool_layer(i);
  }
  impl->mtp.resize(c.num_mtp_layers);
  for (int k = 0; k < c.num_mtp_layers; ++k) {
    const std::string p = absl::StrCat("model.mtp.layers.", k, ".");
    MtpLayer& m = impl->mtp[k];
    ASSIGN_OR_RETURN(m.enorm, impl->Read(p + "enorm.weight"));
    ASSIGN_OR_RETURN(m.hnorm, impl->Read(p + "hnorm.weight"));
    ASSIGN_OR_RETURN(m.eh_proj, impl->ReadPacked(p + "eh_proj.weight"));
    ASSIGN_OR_RETURN(m.final_norm, impl->Read(p + "final_layernorm.weight"));
    RETURN_IF_ERROR(impl->LoadBlock(p, AttentionType::kSwa, /*moe=*/false,
                                    c.intermediate_size, &m.block));
    m.block.pool_layer = c.mtp_pool_layer(k);
  }
  impl->ckpt.reset();  // weights are copied; release the mapping
  return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {
  config_ = impl_->c;
}
Engine::~Engine() = default;

size_t Engine::WeightBytes() const {
  auto f = [](const std::vector<float>& v) { return v.size() * sizeof(float); };
  auto dense = [](const DenseMlp& d) { return d.gate_up.bytes() + d.down.bytes(); };
  auto block = [&](const Block& b) {
    size_t n = f(b.in_norm) + f(b.post_norm) + b.attn.q.bytes() + b.attn.k.bytes() +
               b.attn.v.bytes() + b.attn.o.bytes() + f(b.attn.sink) + dense(b.dense) +
               b.moe_mlp.router.bytes() + f(b.moe_mlp.bias);
    for (const DenseMlp& e : b.moe_mlp.experts) n += dense(e);
    return n;
  };
  const Impl& s = *impl_;
  size_t n = s.embed.size() + f(s.final_norm) + s.lm_head.bytes();
  for (const Block& b : s.layers) n += block(b);
  for (const MtpLayer& m : s.mtp) {
    n += f(m.enorm) + f(m.hnorm) + f(m.final_norm) + m.eh_proj.bytes() + block(m.block);
  }
  return n;
}

void Engine::Embedding(uint32_t token, float* out) const {
  const int64_t H = config_.hidden_size;
  const size_t row = static_cast<size_t>(token) * H;
  const uint8_t* base = impl_->embed.data();
  switch (impl_->embed_format) {
    case WeightFormat::kF32:
      std::memcpy(out, base + row * 4, sizeof(float) * H);
      return;
    case WeightFormat::kBF16:
    case WeightFormat::kF16:
      for (int64_t i = 0; i < H; ++i) {
        uint16_t x;
        std::memcpy(&x, base + (row + i) * 2, 2);
        out[i] = impl_->embed_format == WeightFormat::kBF16 ? Bf16ToF32(x) : F16ToF32(x);
      }
      return;
    case WeightFormat::kFp8E4M3:
      break;  // rejected at load (DTypeProblem)
  }
}

void Engine::Impl::Attention(const Block& b, absl::Span<const ForwardItem> items,
                             int layer) {
  const AttentionConfig& g = *b.geo;
  const bool swa = b.type == AttentionType::kSwa;
  AttentionParams p;
  p.num_heads = g.num_heads;
  p.num_kv_heads = g.num_kv_heads;
  p.head_dim = g.head_dim;
  p.v_head_dim = g.v_head_dim;
  p.scale = 1.0f / std::sqrt(static_cast<float>(g.head_dim));
  p.window = swa ? c.sliding_window : 0;
  p.sinks = g.sink ? b.attn.sink.data() : nullptr;
  spans.clear();
  int r0 = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const kv::Sequence& seq = *items[i].seq;
    const int n = item_n[i];
    if (n == 0) continue;
    int first_key = 0;
    if (swa) {
      // A restore's pyramid wrote this layer's keys only from its bound.
      first_key = seq.swa_key_start();
      const kv::WindowRestorePyramid& py = pyramid[i];
      if (!py.input_from.empty()) {
        first_key = std::max(first_key, layer >= 0 ? py.input_from[layer] : py.mtp_from);
      }
    }
    spans.push_back({.view = swa ? seq.SwaLayer(b.pool_layer) : seq.FullLayer(b.pool_layer),
                     .row0 = r0,
                     .pos0 = item_start[i],
                     .n = n,
                     .first_key = first_key});
    r0 += n;
  }
  PagedAttention(p, spans, q.data(), attn.data());
}

void Engine::Impl::Mlp(const Block& b, int R) {
  const int H = c.hidden_size;
  Grow(mlp, static_cast<size_t>(R) * H);
  auto swiglu = [&](const DenseMlp& d, const float* in, int rows_n, float* out) {
    const int I = d.inter;
    Grow(gu, static_cast<size_t>(rows_n) * 2 * I);
    Grow(act, static_cast<size_t>(rows_n) * I);
    MatMul(in, rows_n, d.gate_up, gu.data());
    for (int r = 0; r < rows_n; ++r) {
      const float* g = gu.data() + static_cast<size_t>(r) * 2 * I;
      float* a = act.data() + static_cast<size_t>(r) * I;
      for (int i = 0; i < I; ++i) a[i] = Silu(g[i]) * g[I + i];
    }
    MatMul(act.data(), rows_n, d.down, out);
  };
  if (!b.moe) {
    swiglu(b.dense, xn.data(), R, mlp.data());
    return;
  }
  const int E = c.n_routed_experts, K = c.num_experts_per_tok;
  Grow(router, static_cast<size_t>(R) * E);
  MatMul(xn.data(), R, b.moe_mlp.router, router.data());
  // Per row: chosen experts (by score + bias) and their weights. Scratch
  // vectors only grow, so steady-state decode does not allocate.
  if (chosen.size() < static_cast<size_t>(R) * K) chosen.resize(static_cast<size_t>(R) * K);
  if (route_weight.size() < static_cast<size_t>(R) * K) route_weight.resize(static_cast<size_t>(R) * K);
  std::vector<float>& weight = route_weight;
  order.resize(E);
  for (int r = 0; r < R; ++r) {
    float* s = router.data() + static_cast<size_t>(r) * E;
    for (int e = 0; e < E; ++e) s[e] = 1.0f / (1.0f + std::exp(-s[e]));
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + K, order.end(), [&](int a, int bb) {
      const float ka = s[a] + b.moe_mlp.bias[a], kb = s[bb] + b.moe_mlp.bias[bb];
      return ka > kb || (ka == kb && a < bb);
    });
    float sum = 0;
    for (int j = 0; j < K; ++j) sum += s[order[j]];
    for (int j = 0; j < K; ++j) {
      chosen[static_cast<size_t>(r) * K + j] = order[j];
      float w = s[order[j]];
      if (c.norm_topk_prob) w /= (sum + 1e-20f);
      weight[static_cast<size_t>(r) * K + j] = w * static_cast<float>(c.routed_scaling_factor);
    }
  }
  // Group (row, slot) pairs per expert, run each expert once over its rows.
  Grow(slot_out, static_cast<size_t>(R) * K * H);
  by_expert.resize(E);
  for (auto& list : by_expert) {
    list.clear();  // keeps capacity; reserving for the worst case means a
    list.reserve(static_cast<size_t>(R) * K);  // batch of this size never grows it
  }
  for (int t = 0; t < R * K; ++t) by_expert[chosen[t]].push_back(t);
  for (int e = 0; e < E; ++e) {
    const std::vector<int>& list = by_expert[e];
    if (list.empty()) continue;
    const int n = static_cast<int>(list.size());
    Grow(gather, static_cast<size_t>(n) * H);
    Grow(gather_out, static_cast<size_t>(n) * H);
    for (int i = 0; i < n; ++i) {
      std::memcpy(gather.data() + static_cast<size_t>(i) * H,
                  xn.data() + static_cast<size_t>(list[i] / K) * H, sizeof(float) * H);
    }
    swiglu(b.moe_mlp.experts[e], gather.data(), n, gather_out.data());
    for (int i = 0; i < n; ++i) {
      std::memcpy(slot_out.data() + static_cast<size_t>(list[i]) * H,
                  gather_out.data() + static_cast<size_t>(i) * H, sizeof(float) * H);
    }
  }
  // Combine in slot order (fixed per token, whatever the batch).
  for (int r = 0; r < R; ++r) {
    float* out = mlp.data() + static_cast<size_t>(r) * H;
    std::fill(out, out + H, 0.0f);
    for (int j = 0; j < K; ++j) {
      Axpy(weight[static_cast<size_t>(r) * K + j],
           slot_out.data() + (static_cast<size_t>(r) * K + j) * H, out, H);
    }
  }
}

int Engine::Impl::DropRows(int R, int layer, bool output, bool with_xn) {
  if (!any_restore) return R;  // the common case: nothing to drop
  const int H = c.hidden_size;
  int kept = 0;
  for (int r = 0; r < R; ++r) {
    const int i = rows[r].item;
    const kv::WindowRestorePyramid& py = pyramid[i];
    if (!py.input_from.empty()) {
      const int lo = output ? py.output_from[layer] : py.input_from[layer];
      if (rows[r].pos < lo) {
        --item_n[i];
        item_start[i] = rows[r].pos + 1;
        continue;
      }
    }
    if (kept != r) {
      rows[kept] = rows[r];
      std::memcpy(x.data() + static_cast<size_t>(kept) * H, x.data() + static_cast<size_t>(r) * H,
                  sizeof(float) * H);
      if (with_xn) {
        std::memcpy(xn.data() + static_cast<size_t>(kept) * H,
                    xn.data() + static_cast<size_t>(r) * H, sizeof(float) * H);
      }
    }
    ++kept;
  }
  rows.resize(kept);
  return kept;
}

absl::Status Engine::Impl::RunBlock(const Block& b, absl::Span<const ForwardItem> items,
                                    int layer, int& R) {
  const int H = c.hidden_size;
  const AttentionConfig& g = *b.geo;
  const int nh = g.num_heads, nkv = g.num_kv_heads, hd = g.head_dim, vd = g.v_head_dim;
  const bool swa = b.type == AttentionType::kSwa;
  Grow(xn, static_cast<size_t>(R) * H);
  Grow(q, static_cast<size_t>(R) * nh * hd);
  Grow(k, static_cast<size_t>(R) * nkv * hd);
  Grow(v, static_cast<size_t>(R) * nkv * vd);
  Grow(attn, static_cast<size_t>(R) * nh * vd);
  Grow(o, static_cast<size_t>(R) * H);
  RmsNorm(x.data(), b.in_norm.data(), xn.data(), R, H, static_cast<float>(c.rms_norm_eps));
  MatMul(xn.data(), R, b.attn.k, k.data());
  MatMul(xn.data(), R, b.attn.v, v.data());
  const float vs = static_cast<float>(c.attention_value_scale);
  if (vs != 1.0f) {
    for (size_t i = 0; i < static_cast<size_t>(R) * nkv * vd; ++i) v[i] *= vs;
  }
  for (int r = 0; r < R; ++r) {
    ApplyRope(k.data() + static_cast<size_t>(r) * nkv * hd, nkv, hd, g.rotary_dim, rows[r].pos, g.rope_theta);
  }
  // Write the new tokens' KV into the pages. Full KV below the sequence's
  // cached prefix is the prefix cache's (shared pages, a window restore's
  // stretch): read, never written.
  for (int r = 0; r < R; ++r) {
    const kv::Sequence& seq = *items[rows[r].item].seq;
    if (!swa && rows[r].pos < seq.cached_tokens()) continue;
    const kv::LayerView view = swa ? seq.SwaLayer(b.pool_layer) : seq.FullLayer(b.pool_layer);
    const int page = rows[r].pos / view.page_size;
    if (page >= static_cast<int>(view.pages.size()) || view.pages[page] == kv::kNoPage ||
        view.pool->PageData(view.pages[page]) == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "no ", swa ? "SWA" : "full", " KV page for position ", rows[r].pos,
          " of item ", rows[r].item, " (append the tokens before Forward)"));
    }
    const kv::DType dt = view.pool->geometry().dtype;
    StoreKv(dt, view.K(rows[r].pos), k.data() + static_cast<size_t>(r) * nkv * hd, nkv * hd);
    StoreKv(dt, view.V(rows[r].pos), v.data() + static_cast<size_t>(r) * nkv * vd, nkv * vd);
  }
  // A window restore's pyramid: rows whose output no later layer needs go
  // now (their KV above is what the kept rows' attention reads).
  if (layer >= 0) R = DropRows(R, layer, /*output=*/true, /*with_xn=*/true);
  MatMul(xn.data(), R, b.attn.q, q.data());
  for (int r = 0; r < R; ++r) {
    ApplyRope(q.data() + static_cast<size_t>(r) * nh * hd, nh, hd, g.rotary_dim, rows[r].pos, g.rope_theta);
  }
  Attention(b, items, layer);
  MatMul(attn.data(), R, b.attn.o, o.data());
  for (size_t i = 0; i < static_cast<size_t>(R) * H; ++i) x[i] += o[i];
  RmsNorm(x.data(), b.post_norm.data(), xn.data(), R, H, static_cast<float>(c.rms_norm_eps));
  Mlp(b, R);
  for (size_t i = 0; i < static_cast<size_t>(R) * H; ++i) x[i] += mlp[i];
  return absl::OkStatus();
}

void Engine::Impl::Logits(absl::Span<const ForwardItem> items,
                          const std::vector<float>& norm, ForwardOutput* out,
                          bool keep_all_hidden, const std::vector<int32_t>* head_ids,
                          const PackedWeight* head_weight) {
  const int H = c.hidden_size, V = c.vocab_size;
  const int R = static_cast<int>(rows.size());
  // Rows that need logits, in output order.
  need.clear();
  out->first_row.clear();
  out->first_position.clear();
  out->last_hidden.assign(static_cast<size_t>(items.size()) * H, 0.0f);
  int r0 = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const int n = item_n[i];
    out->first_position.push_back(item_start[i]);
    const bool none = items[i].no_logits || n == 0;
    out->first_row.push_back(none ? -1 : static_cast<int>(need.size()));
    if (n == 0) continue;  // a restore's pyramid kept no row of this item
    if (items[i].no_logits) {
      // KV (and hidden states) only.
    } else if (items[i].all_logits) {
      for (int j = 0; j < n; ++j) need.push_back(r0 + j);
    } else {
      need.push_back(r0 + n - 1);
    }
    std::memcpy(out->last_hidden.data() + i * H, x.data() + static_cast<size_t>(r0 + n - 1) * H,
                sizeof(float) * H);
    r0 += n;
  }
  if (keep_all_hidden) out->all_hidden.assign(x.begin(), x.begin() + static_cast<size_t>(R) * H);
  Grow(final_rows, need.size() * H);
  for (size_t j = 0; j < need.size(); ++j) {
    RmsNorm(x.data() + static_cast<size_t>(need[j]) * H, norm.data(),
            final_rows.data() + j * H, 1, H, static_cast<float>(c.rms_norm_eps));
  }
  if (head_ids != nullptr && head_weight != nullptr) {
    const std::vector<int32_t>& ids = *head_ids;
    const size_t n = ids.size();
    Grow(narrow, need.size() * n);
    MatMul(final_rows.data(), static_cast<int64_t>(need.size()), *head_weight, narrow.data());
    out->logits.assign(need.size() * static_cast<size_t>(V),
                       -std::numeric_limits<float>::infinity());
    for (size_t j = 0; j < need.size(); ++j) {
      float* row = out->logits.data() + j * V;
      const float* got = narrow.data() + j * n;
      for (size_t c = 0; c < n; ++c) row[ids[c]] = got[c];
    }
    return;
  }
  out->logits.resize(need.size() * static_cast<size_t>(V));
  MatMul(final_rows.data(), static_cast<int64_t>(need.size()), lm_head, out->logits.data());
}

namespace {

// Copies `it`'s embedding overrides over its rows of `x` (row stride
// `stride` floats): all of them, or only its token `only` (>= 0).
void ApplyOverrides(const ForwardItem& it, int H, float* x, int64_t stride, int only = -1) {
  for (const EmbeddingOverride& e : it.embeddings) {
    for (int j = 0; j < e.rows; ++j) {
      if (only >= 0 && e.offset + j != only) continue;
      std::memcpy(x + (e.offset + j) * stride, e.data + static_cast<size_t>(j) * H,
                  sizeof(float) * H);
    }
  }
}

absl::Status CheckItems(const ModelConfig& c, absl::Span<const ForwardItem> items) {
  if (items.empty()) return absl::InvalidArgumentError("empty batch");
  const kv::KvShape want = c.KvShape(16);
  for (size_t i = 0; i < items.size(); ++i) {
    const ForwardItem& it = items[i];
    if (it.seq == nullptr) return absl::InvalidArgumentError(absl::StrCat("item ", i, ": no sequence"));
    if (it.tokens.empty()) return absl::InvalidArgumentError(absl::StrCat("item ", i, ": no tokens"));
    if (it.start < 0 || it.seq->length() < it.start + static_cast<int>(it.tokens.size())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "item ", i, ": tokens [", it.start, ", ", it.start + it.tokens.size(),
          ") exceed the sequence's ", it.seq->length(), " tokens"));
    }
    for (uint32_t t : it.tokens) {
      if (t >= static_cast<uint32_t>(c.vocab_size)) {
        return absl::InvalidArgumentError(absl::StrCat("item ", i, ": token id ", t,
                                                       " >= vocab size ", c.vocab_size));
      }
    }
    if (it.window_restore_end != 0 &&
        (it.seq->restore_from() < 0 || it.window_restore_end != it.seq->cached_tokens())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "item ", i, ": window_restore_end ", it.window_restore_end,
          " is not the restoring sequence's cached prefix (", it.seq->cached_tokens(), ")"));
    }
    int next = 0;  // overrides sorted, disjoint, inside the tokens
    for (const EmbeddingOverride& e : it.embeddings) {
      if (e.offset < next || e.rows <= 0 || e.data == nullptr ||
          e.offset + static_cast<int64_t>(e.rows) > static_cast<int64_t>(it.tokens.size())) {
        return absl::InvalidArgumentError(absl::StrCat(
            "item ", i, ": embedding override of ", e.rows, " rows at ", e.offset,
            " is out of order, overlapping, empty or outside its ", it.tokens.size(),
            " tokens"));
      }
      next = e.offset + e.rows;
    }
    const kv::PoolGeometry& fg = it.seq->FullLayer(0).pool->geometry();
    const kv::PoolGeometry& sg = it.seq->SwaLayer(0).pool->geometry();
    if (fg.num_layers != want.full_layers || fg.num_kv_heads != want.full_kv_heads ||
        fg.k_head_dim != want.full_k_head_dim || fg.v_head_dim != want.full_v_head_dim ||
        sg.num_layers != want.swa_layers || sg.num_kv_heads != want.swa_kv_heads ||
        sg.k_head_dim != want.swa_k_head_dim || sg.v_head_dim != want.swa_v_head_dim) {
      return absl::InvalidArgumentError(absl::StrCat(
          "item ", i, ": the sequence's KV pools do not have the model's shape"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Engine::Forward(absl::Span<const ForwardItem> items,
                             ForwardOutput* out, bool keep_all_hidden) {
  RETURN_IF_ERROR(CheckItems(config_, items));
  Impl& s = *impl_;
  const int H = config_.hidden_size;
  const int R = s.SetRows(items);
  Grow(s.x, static_cast<size_t>(R) * H);
  int r = 0;
  for (const ForwardItem& it : items) {
    for (uint32_t t : it.tokens) {
      Embedding(t, s.x.data() + static_cast<size_t>(r++) * H);
    }
    ApplyOverrides(it, H, s.x.data() + static_cast<size_t>(r - it.tokens.size()) * H, H);
  }
  int live = R;
  if (!s.layers.empty()) live = s.DropRows(live, 0, /*output=*/false, /*with_xn=*/false);
  for (size_t i = 0; i < s.layers.size(); ++i) {
    RETURN_IF_ERROR(s.RunBlock(s.layers[i], items, static_cast<int>(i), live));
  }
  s.Logits(items, s.final_norm, out, keep_all_hidden);
  return absl::OkStatus();
}

DraftHead::DraftHead() = default;
DraftHead::~DraftHead() = default;

absl::StatusOr<std::shared_ptr<const DraftHead>> Engine::MakeDraftHead(
    std::vector<int32_t> ids) const {
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  auto head = std::make_shared<DraftHead>();
  RETURN_IF_ERROR(FillDraftHead(ids, head.get()));
  return std::shared_ptr<const DraftHead>(std::move(head));
}

absl::Status Engine::FillDraftHead(absl::Span<const int32_t> ids, DraftHead* head) const {
  if (ids.empty()) return absl::InvalidArgumentError("draft head: no token ids");
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= config_.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("draft head: token id ", ids[i],
                                                     " out of range [0, ", config_.vocab_size,
                                                     ")"));
    }
    if (i > 0 && ids[i] <= ids[i - 1]) {
      return absl::InvalidArgumentError("draft head: ids must be ascending and unique");
    }
  }
  head->ids_.assign(ids.begin(), ids.end());
  if (head->weight_ == nullptr) head->weight_ = std::make_unique<PackedWeight>();
  impl_->lm_head.ColumnsInto(head->ids_, head->weight_.get());
  return absl::OkStatus();
}

absl::Status Engine::ForwardMtp(int k, absl::Span<const ForwardItem> items,
                                absl::Span<const float> hidden,
                                ForwardOutput* out, const DraftHead* head) {
  if (k < 0 || k >= config_.num_mtp_layers) {
    return absl::InvalidArgumentError(absl::StrCat("no MTP layer ", k, " (model has ",
                                                   config_.num_mtp_layers, ")"));
  }
  RETURN_IF_ERROR(CheckItems(config_, items));
  Impl& s = *impl_;
  const int H = config_.hidden_size;
  const int R = s.SetRows(items);
  if (hidden.size() != static_cast<size_t>(R) * H) {
    return absl::InvalidArgumentError(absl::StrCat("MTP needs ", R, " hidden rows of ", H,
                                                   " floats, got ", hidden.size(), " floats"));
  }
  const MtpLayer& m = s.mtp[k];
  Grow(s.cat, static_cast<size_t>(R) * 2 * H);
  Grow(s.x, static_cast<size_t>(R) * H);
  int r = 0;
  for (const ForwardItem& it : items) {
    const int r0 = r;
    for (uint32_t t : it.tokens) {
      float* row = s.cat.data() + static_cast<size_t>(r) * 2 * H;
      const float eps = static_cast<float>(config_.rms_norm_eps);
      Embedding(t, row);
      ApplyOverrides(it, H, s.cat.data() + static_cast<size_t>(r0) * 2 * H, 2 * H,
                     r - r0);
      RmsNorm(row, m.enorm.data(), row, 1, H, eps);  // in place
      RmsNorm(hidden.data() + static_cast<size_t>(r) * H, m.hnorm.data(), row + H, 1, H, eps);
      ++r;
    }
  }
  MatMul(s.cat.data(), R, m.eh_proj, s.x.data());
  int live = R;
  RETURN_IF_ERROR(s.RunBlock(m.block, items, /*layer=*/-1, live));
  s.Logits(items, m.final_norm, out, /*keep_all_hidden=*/true,
           head != nullptr ? &head->ids_ : nullptr,
           head != nullptr ? head->weight_.get() : nullptr);
  return absl::OkStatus();
}

}  // namespace swaserve::model
