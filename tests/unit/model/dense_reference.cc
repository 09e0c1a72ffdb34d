#include "tests/unit/model/dense_reference.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

namespace swaserve::model::testing {
namespace {

using Vec = std::vector<double>;

std::vector<float> W(const Checkpoint& c, const std::string& name) {
  auto r = c.ReadF32(name);
  if (!r.ok()) {
    fprintf(stderr, "dense reference: %s\n", std::string(r.status().message()).c_str());
    abort();
  }
  return *r;
}

Vec Linear(const std::vector<float>& w, const Vec& x, int out) {
  const int in = static_cast<int>(x.size());
  Vec y(out, 0.0);
  for (int o = 0; o < out; ++o) {
    double s = 0;
    for (int i = 0; i < in; ++i) s += static_cast<double>(w[static_cast<size_t>(o) * in + i]) * x[i];
    y[o] = s;
  }
  return y;
}

Vec Norm(const Vec& x, const std::vector<float>& w, double eps) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double inv = 1.0 / std::sqrt(ss / x.size() + eps);
  Vec y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * inv * w[i];
  return y;
}

void Rope(Vec& v, int heads, int hd, int rot, int pos, double theta) {
  const int half = rot / 2;
  for (int h = 0; h < heads; ++h) {
    for (int i = 0; i < half; ++i) {
      const double f = pos / std::pow(theta, 2.0 * i / rot);
      const double a = v[h * hd + i], b = v[h * hd + i + half];
      v[h * hd + i] = a * std::cos(f) - b * std::sin(f);
      v[h * hd + i + half] = b * std::cos(f) + a * std::sin(f);
    }
  }
}

double Silu(double x) { return x / (1 + std::exp(-x)); }

struct LayerCache {
  std::vector<Vec> k, v;  // per position
};

// One pre-norm block at position `pos` with input x; appends to cache.
Vec Block(const Checkpoint& c, const std::string& p, bool swa, bool moe, int inter,
          const Vec& x_in, int pos, LayerCache& cache) {
  const ModelConfig& cfg = c.config();
  const AttentionConfig& g = swa ? cfg.swa : cfg.full;
  const int H = cfg.hidden_size;
  Vec x = x_in;
  Vec xn = Norm(x, W(c, p + "input_layernorm.weight"), cfg.rms_norm_eps);
  Vec q = Linear(W(c, p + "self_attn.q_proj.weight"), xn, g.num_heads * g.head_dim);
  Vec k = Linear(W(c, p + "self_attn.k_proj.weight"), xn, g.num_kv_heads * g.head_dim);
  Vec v = Linear(W(c, p + "self_attn.v_proj.weight"), xn, g.num_kv_heads * g.v_head_dim);
  for (double& e : v) e *= cfg.attention_value_scale;
  Rope(q, g.num_heads, g.head_dim, g.rotary_dim, pos, g.rope_theta);
  Rope(k, g.num_kv_heads, g.head_dim, g.rotary_dim, pos, g.rope_theta);
  cache.k.push_back(k);
  cache.v.push_back(v);
  std::vector<float> sink;
  if (g.sink) sink = W(c, p + "self_attn.attention_sink_bias");
  Vec attn(g.num_heads * g.v_head_dim, 0.0);
  const int group = g.num_heads / g.num_kv_heads;
  for (int h = 0; h < g.num_heads; ++h) {
    const int kh = h / group;
    std::vector<double> s;
    std::vector<int> idx;
    for (int j = 0; j <= pos; ++j) {
      if (swa && j <= pos - cfg.sliding_window) continue;  // sees k > q - W
      double d = 0;
      for (int i = 0; i < g.head_dim; ++i) d += q[h * g.head_dim + i] * cache.k[j][kh * g.head_dim + i];
      s.push_back(d / std::sqrt(static_cast<double>(g.head_dim)));
      idx.push_back(j);
    }
    double m = *std::max_element(s.begin(), s.end());
    if (g.sink) m = std::max(m, static_cast<double>(sink[h]));
    double z = 0;
    for (double& e : s) {
      e = std::exp(e - m);
      z += e;
    }
    if (g.sink) z += std::exp(sink[h] - m);
    for (size_t t = 0; t < s.size(); ++t) {
      for (int i = 0; i < g.v_head_dim; ++i) {
        attn[h * g.v_head_dim + i] += s[t] / z * cache.v[idx[t]][kh * g.v_head_dim + i];
      }
    }
  }
  Vec o = Linear(W(c, p + "self_attn.o_proj.weight"), attn, H);
  for (int i = 0; i < H; ++i) x[i] += o[i];
  xn = Norm(x, W(c, p + "post_attention_layernorm.weight"), cfg.rms_norm_eps);
  auto swiglu = [&](const std::string& mp, int I) {
    Vec gt = Linear(W(c, mp + "gate_proj.weight"), xn, I);
    Vec up = Linear(W(c, mp + "up_proj.weight"), xn, I);
    for (int i = 0; i < I; ++i) gt[i] = Silu(gt[i]) * up[i];
    return Linear(W(c, mp + "down_proj.weight"), gt, H);
  };
  Vec y(H, 0.0);
  if (!moe) {
    y = swiglu(p + "mlp.", inter);
  } else {
    const int E = cfg.n_routed_experts;
    Vec s = Linear(W(c, p + "mlp.gate.weight"), xn, E);
    for (double& e : s) e = 1 / (1 + std::exp(-e));
    std::vector<float> bias = W(c, p + "mlp.gate.e_score_correction_bias");
    std::vector<int> order(E);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return s[a] + bias[a] > s[b] + bias[b]; });
    double sum = 0;
    for (int j = 0; j < cfg.num_experts_per_tok; ++j) sum += s[order[j]];
    for (int j = 0; j < cfg.num_experts_per_tok; ++j) {
      const int e = order[j];
      double w = s[e];
      if (cfg.norm_topk_prob) w /= (sum + 1e-20);
      w *= cfg.routed_scaling_factor;
      Vec ye = swiglu(p + "mlp.experts." + std::to_string(e) + ".", cfg.moe_intermediate_size);
      for (int i = 0; i < H; ++i) y[i] += w * ye[i];
    }
  }
  for (int i = 0; i < H; ++i) x[i] += y[i];
  return x;
}

std::vector<float> ToFloat(const Vec& v) { return std::vector<float>(v.begin(), v.end()); }

std::vector<float> Head(const Checkpoint& c, const Vec& x, const std::string& norm_name) {
  const ModelConfig& cfg = c.config();
  Vec xn = Norm(x, W(c, norm_name), cfg.rms_norm_eps);
  return ToFloat(Linear(W(c, cfg.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight"),
                        xn, cfg.vocab_size));
}

}  // namespace

DenseResult DenseForward(const Checkpoint& c, const std::vector<uint32_t>& tokens) {
  const ModelConfig& cfg = c.config();
  const int H = cfg.hidden_size;
  std::vector<float> embed = W(c, "model.embed_tokens.weight");
  std::vector<LayerCache> caches(cfg.num_layers);
  DenseResult out;
  for (size_t pos = 0; pos < tokens.size(); ++pos) {
    Vec x(embed.begin() + static_cast<size_t>(tokens[pos]) * H,
          embed.begin() + static_cast<size_t>(tokens[pos] + 1) * H);
    for (int l = 0; l < cfg.num_layers; ++l) {
      x = Block(c, "model.layers." + std::to_string(l) + ".",
                cfg.layer_types[l] == AttentionType::kSwa, cfg.moe_layers[l],
                cfg.intermediate_size, x, static_cast<int>(pos), caches[l]);
    }
    out.hidden.push_back(ToFloat(x));
    out.logits.push_back(Head(c, x, "model.norm.weight"));
  }
  return out;
}

DenseResult DenseMtp(const Checkpoint& c, int k, const std::vector<uint32_t>& tokens,
                     const std::vector<std::vector<float>>& hidden) {
  const ModelConfig& cfg = c.config();
  const int H = cfg.hidden_size;
  const std::string p = "model.mtp.layers." + std::to_string(k) + ".";
  std::vector<float> embed = W(c, "model.embed_tokens.weight");
  LayerCache cache;
  DenseResult out;
  for (size_t pos = 0; pos + 1 + k < tokens.size(); ++pos) {
    const uint32_t t = tokens[pos + 1 + k];
    Vec e(embed.begin() + static_cast<size_t>(t) * H,
          embed.begin() + static_cast<size_t>(t + 1) * H);
    Vec h(hidden[pos].begin(), hidden[pos].end());
    Vec cat = Norm(e, W(c, p + "enorm.weight"), cfg.rms_norm_eps);
    Vec hn = Norm(h, W(c, p + "hnorm.weight"), cfg.rms_norm_eps);
    cat.insert(cat.end(), hn.begin(), hn.end());
    Vec x = Linear(W(c, p + "eh_proj.weight"), cat, H);
    x = Block(c, p, /*swa=*/true, /*moe=*/false, cfg.intermediate_size, x,
              static_cast<int>(pos), cache);
    out.hidden.push_back(ToFloat(x));
    out.logits.push_back(Head(c, x, p + "final_layernorm.weight"));
  }
  return out;
}

}  // namespace swaserve::model::testing
