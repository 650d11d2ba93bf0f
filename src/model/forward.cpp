// The forward pass over a canvas (see forward.h): element-wise steps here, matrix products and attention
// through the Executor. Every row is computed with the same arithmetic whichever other rows are present,
// so asking for a subset of logit rows gives exactly those rows of the all-rows result.
#include "model/forward.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "model/error.h"
#include "model/fast_math.h"
#include "model/quant.h"

namespace dllm::model {

namespace {

std::vector<float> decode_vector(const gguf::TensorInfo* t) {
  if (!t) return {};
  std::vector<float> v(static_cast<size_t>(t->n_elements()));
  quant::dequantize_row(t->type(), t->data, v.data(), t->n_elements());
  return v;
}

// --- element-wise steps, each parallel over rows ---

// out[r] = w * x[r] / sqrt(mean(x[r]^2) + eps)
void rmsnorm(ThreadPool& pool, const float* x, int64_t rows, int64_t n, const std::vector<float>& w, float eps,
             float* out) {
  pool.parallel_for(rows, [&](int64_t r, int) {
    const float* xr = x + r * n;
    float* yr = out + r * n;
    double ss = 0;
    for (int64_t c = 0; c < n; ++c) ss += static_cast<double>(xr[c]) * xr[c];
    const double scale = 1.0 / std::sqrt(ss / static_cast<double>(n) + static_cast<double>(eps));
    for (int64_t c = 0; c < n; ++c) yr[c] = static_cast<float>(static_cast<double>(xr[c]) * scale * w[c]);
  });
}

void add_bias(ThreadPool& pool, float* y, int64_t rows, int64_t n, const std::vector<float>& b) {
  if (b.empty()) return;
  pool.parallel_for(rows, [&](int64_t r, int) {
    float* yr = y + r * n;
    for (int64_t c = 0; c < n; ++c) yr[c] += b[c];
  });
}

void add_rows(ThreadPool& pool, float* x, const float* y, int64_t rows, int64_t n) {
  pool.parallel_for(rows, [&](int64_t r, int) {
    for (int64_t c = 0; c < n; ++c) x[r * n + c] += y[r * n + c];
  });
}

// gate[i] = silu(gate[i]) * up[i] in f32 (as llama.cpp), compiled for AVX-512, AVX2 and baseline x86-64
// and picked at run time.
__attribute__((target_clones("avx512f", "avx2", "default"))) void swiglu_row(float* gate, const float* up,
                                                                            int64_t n) {
  for (int64_t c = 0; c < n; ++c) {
    const float g = gate[c];
    gate[c] = g / (1.0f + exp_f32(-g)) * up[c];
  }
}

void swiglu(ThreadPool& pool, float* gate, const float* up, int64_t rows, int64_t n) {
  pool.parallel_for(rows, [&](int64_t r, int) { swiglu_row(gate + r * n, up + r * n, n); });
}

// cos/sin of position * base^(-2p/n_rot) for positions 0..n_pos-1 and pairs p < n_rot/2, in double.
class RopeTable {
 public:
  RopeTable(const HParams& hp, int64_t n_pos) : half_(hp.n_rot / 2), cos_(n_pos * half_), sin_(n_pos * half_) {
    for (int64_t p = 0; p < half_; ++p) {
      const double inv_freq = std::pow(static_cast<double>(hp.rope_base),
                                       -2.0 * static_cast<double>(p) / static_cast<double>(hp.n_rot));
      for (int64_t pos = 0; pos < n_pos; ++pos) {
        const double theta = static_cast<double>(pos) * inv_freq;
        cos_[static_cast<size_t>(pos * half_ + p)] = std::cos(theta);
        sin_[static_cast<size_t>(pos * half_ + p)] = std::sin(theta);
      }
    }
  }
  int64_t half() const { return half_; }
  const double* cos_at(int64_t pos) const { return cos_.data() + pos * half_; }
  const double* sin_at(int64_t pos) const { return sin_.data() + pos * half_; }

 private:
  int64_t half_;
  std::vector<double> cos_, sin_;
};

// Rotates the first n_rot dims of every head of rows x[r] (at canvas position pos[r]) in place.
// Norm: pairs (2p, 2p+1). Neox: pairs (p, p + n_rot/2).
void rope(ThreadPool& pool, const RopeTable& table, RopeStyle style, float* x, int64_t rows,
          std::span<const int64_t> pos, int64_t n_heads, int64_t head_dim) {
  const int64_t half = table.half();
  pool.parallel_for(rows, [&](int64_t r, int) {
    const double* cs = table.cos_at(pos[static_cast<size_t>(r)]);
    const double* sn = table.sin_at(pos[static_cast<size_t>(r)]);
    for (int64_t h = 0; h < n_heads; ++h) {
      float* xh = x + (r * n_heads + h) * head_dim;
      for (int64_t p = 0; p < half; ++p) {
        const int64_t i0 = style == RopeStyle::Norm ? 2 * p : p;
        const int64_t i1 = style == RopeStyle::Norm ? 2 * p + 1 : p + half;
        const double a = xh[i0], b = xh[i1];
        xh[i0] = static_cast<float>(a * cs[p] - b * sn[p]);
        xh[i1] = static_cast<float>(a * sn[p] + b * cs[p]);
      }
    }
  });
}

// dst[i] = src[rows[i]] for rows of n floats.
void gather(const float* src, std::span<const int64_t> rows, int64_t n, float* dst) {
  for (size_t i = 0; i < rows.size(); ++i) std::copy_n(src + rows[i] * n, n, dst + static_cast<int64_t>(i) * n);
}

}  // namespace

ForwardWeights prepare_forward_weights(const HParams&, const ModelTensors& t, Executor& ex) {
  ForwardWeights w;
  w.token_embd = t.token_embd;
  w.output_norm = decode_vector(t.output_norm);
  w.output = ex.prepare_weight(*t.output);
  w.layers.resize(t.layers.size());
  for (size_t i = 0; i < t.layers.size(); ++i) {
    const LayerTensors& lt = t.layers[i];
    ForwardWeights::Layer& l = w.layers[i];
    l.attn_norm = decode_vector(lt.attn_norm);
    l.ffn_norm = decode_vector(lt.ffn_norm);
    l.bq = decode_vector(lt.bq);
    l.bk = decode_vector(lt.bk);
    l.bv = decode_vector(lt.bv);
    l.wq = ex.prepare_weight(*lt.wq);
    l.wk = ex.prepare_weight(*lt.wk);
    l.wv = ex.prepare_weight(*lt.wv);
    l.wo = ex.prepare_weight(*lt.wo);
    l.ffn_gate = ex.prepare_weight(*lt.ffn_gate);
    l.ffn_up = ex.prepare_weight(*lt.ffn_up);
    l.ffn_down = ex.prepare_weight(*lt.ffn_down);
  }
  return w;
}

void check_canvas(const HParams& hp, std::span<const int32_t> tokens, std::span<const int64_t> logit_rows) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n == 0) throw Error("the canvas is empty: give at least one token");
  if (n > hp.n_ctx) {
    throw Error("the canvas has " + std::to_string(n) + " tokens, more than the model's context length " +
                std::to_string(hp.n_ctx));
  }
  for (int64_t i = 0; i < n; ++i) {
    const int32_t t = tokens[static_cast<size_t>(i)];
    if (t < 0 || t >= hp.n_vocab) {
      throw Error("token id " + std::to_string(t) + " at position " + std::to_string(i) +
                  " is out of range: the vocabulary has " + std::to_string(hp.n_vocab) + " tokens (ids 0.." +
                  std::to_string(hp.n_vocab - 1) + ")");
    }
  }
  for (int64_t r : logit_rows) {
    if (r < 0 || r >= n) {
      throw Error("row " + std::to_string(r) + " is out of range: the canvas has " + std::to_string(n) +
                  " tokens (rows 0.." + std::to_string(n - 1) + ")");
    }
  }
}

void forward(const HParams& hp, const ForwardWeights& w, Executor& ex, ThreadPool& pool, const ForwardRequest& req) {
  check_canvas(hp, req.tokens, req.logit_rows);
  const int64_t n = static_cast<int64_t>(req.tokens.size());
  const int64_t m = static_cast<int64_t>(req.logit_rows.size());
  const int64_t n_layer = static_cast<int64_t>(w.layers.size());
  const int64_t D = hp.n_embd, Q = hp.q_dim(), KV = hp.kv_dim(), F = hp.n_ff;

  // Positions computed through the layers: all of them, or with a reused cache only [r0, r1).
  int64_t r0 = 0, r1 = n;
  if (req.cache_mode != CacheMode::None && !req.cache) throw Error("internal error: cache mode without a cache");
  if (req.cache_mode == CacheMode::Reuse) {
    r0 = req.row_begin, r1 = req.row_end;
    if (req.cache->n != n || static_cast<int64_t>(req.cache->k.size()) != n_layer) {
      throw Error("internal error: the key/value cache holds " + std::to_string(req.cache->n) +
                  " positions, the canvas has " + std::to_string(n));
    }
    if (r0 < 0 || r1 > n || r0 >= r1) throw Error("internal error: bad cached row range");
    for (int64_t r : req.logit_rows) {
      if (r < r0 || r >= r1) {
        throw Error("internal error: row " + std::to_string(r) + " is outside the recomputed positions [" +
                    std::to_string(r0) + ", " + std::to_string(r1) + ")");
      }
    }
  } else if (req.cache_mode == CacheMode::Fill) {
    KVCache& c = *req.cache;
    c.n = n;
    c.k.resize(static_cast<size_t>(n_layer));
    c.v.resize(static_cast<size_t>(n_layer));
    for (int64_t l = 0; l < n_layer; ++l) {
      c.k[static_cast<size_t>(l)].assign(static_cast<size_t>(n * KV), 0.0f);
      c.v[static_cast<size_t>(l)].assign(static_cast<size_t>(n * KV), 0.0f);
    }
  }
  if (m == 0 && req.cache_mode == CacheMode::None) return;
  if (m > 0 && !req.logits) throw Error("internal error: forward without a logits buffer");
  const int64_t nr = r1 - r0;
  const int64_t R = std::max(nr, m);  // the last layer works on the m requested rows (repeats allowed)
  auto buf = [](int64_t rows, int64_t cols) { return std::vector<float>(static_cast<size_t>(rows * cols)); };
  std::vector<float> x = buf(R, D), a = buf(R, D), aq = buf(m, D), o = buf(R, D);
  std::vector<float> q = buf(R, Q), att = buf(R, Q);
  std::vector<float> gate = buf(R, F), up = buf(R, F);
  // Keys/values of all n positions: a scratch buffer for the exact pass, the cache's arrays otherwise.
  std::vector<float> k_local, v_local;
  if (req.cache_mode == CacheMode::None) k_local = buf(n, KV), v_local = buf(n, KV);
  auto k_of = [&](int64_t l) {
    return req.cache_mode == CacheMode::None ? k_local.data() : req.cache->k[static_cast<size_t>(l)].data();
  };
  auto v_of = [&](int64_t l) {
    return req.cache_mode == CacheMode::None ? v_local.data() : req.cache->v[static_cast<size_t>(l)].data();
  };

  std::vector<int64_t> positions(static_cast<size_t>(nr));
  std::iota(positions.begin(), positions.end(), r0);
  // The last layer's rows, as indices into the computed rows [r0, r1).
  std::vector<int64_t> local_rows(req.logit_rows.begin(), req.logit_rows.end());
  for (int64_t& r : local_rows) r -= r0;
  const RopeTable rope_table(hp, n);
  const AttentionShape shape{hp.n_head, hp.n_head_kv, hp.head_dim,
                             static_cast<float>(1.0 / std::sqrt(static_cast<double>(hp.head_dim)))};

  // --- embedding (no scaling) ---
  const gguf::TensorInfo& emb = *w.token_embd;
  pool.parallel_for(nr, [&](int64_t i, int) {
    const uint64_t id = static_cast<uint64_t>(req.tokens[static_cast<size_t>(r0 + i)]);
    quant::dequantize_row(emb.type(), emb.data + id * emb.row_bytes(), x.data() + i * D, D);
  });

  int64_t rows = nr;  // rows of x still carried
  for (int64_t l = 0; l < n_layer; ++l) {
    const ForwardWeights::Layer& L = w.layers[static_cast<size_t>(l)];
    const bool last = l + 1 == n_layer;

    // --- attention block: keys and values of the computed positions ---
    float* k = k_of(l) + r0 * KV;
    float* v = v_of(l) + r0 * KV;
    rmsnorm(pool, x.data(), nr, D, L.attn_norm, hp.rms_eps, a.data());
    if (!last) {  // Q, K and V read the same rows: one shared product (activations quantised once)
      const WeightHandle ws[3] = {L.wq, L.wk, L.wv};
      float* const ys[3] = {q.data(), k, v};
      ex.matmul_shared(ws, ys, 3, a.data(), nr);
    } else {
      const WeightHandle ws[2] = {L.wk, L.wv};
      float* const ys[2] = {k, v};
      ex.matmul_shared(ws, ys, 2, a.data(), nr);
    }
    add_bias(pool, k, nr, KV, L.bk);
    add_bias(pool, v, nr, KV, L.bv);
    rope(pool, rope_table, hp.rope_style, k, nr, positions, hp.n_head_kv, hp.head_dim);

    // Queries of every computed row, or at the last layer only of the rows whose logits are wanted.
    const float* q_in = a.data();
    std::span<const int64_t> q_pos = positions;
    if (last) {
      gather(a.data(), local_rows, D, aq.data());
      q_in = aq.data();
      q_pos = req.logit_rows;
      std::vector<float> xs = buf(m, D);  // the residual stream of the requested rows
      gather(x.data(), local_rows, D, xs.data());
      std::copy(xs.begin(), xs.end(), x.begin());
      rows = m;
    }
    if (last) ex.matmul(L.wq, q_in, rows, q.data());
    add_bias(pool, q.data(), rows, Q, L.bq);
    rope(pool, rope_table, hp.rope_style, q.data(), rows, q_pos, hp.n_head, hp.head_dim);

    ex.attention(shape, q.data(), rows, k_of(l), v_of(l), n, att.data());
    ex.matmul(L.wo, att.data(), rows, o.data());
    add_rows(pool, x.data(), o.data(), rows, D);

    // --- feed-forward block (SwiGLU) ---
    rmsnorm(pool, x.data(), rows, D, L.ffn_norm, hp.rms_eps, a.data());
    {
      const WeightHandle ws[2] = {L.ffn_gate, L.ffn_up};
      float* const ys[2] = {gate.data(), up.data()};
      ex.matmul_shared(ws, ys, 2, a.data(), rows);
    }
    swiglu(pool, gate.data(), up.data(), rows, F);
    ex.matmul(L.ffn_down, gate.data(), rows, o.data());
    add_rows(pool, x.data(), o.data(), rows, D);
  }

  // --- final norm and LM head, requested rows only ---
  if (rows != m) {  // no layers at all: select the rows here
    std::vector<float> xs = buf(m, D);
    gather(x.data(), local_rows, D, xs.data());
    std::copy(xs.begin(), xs.end(), x.begin());
  }
  rmsnorm(pool, x.data(), m, D, w.output_norm, hp.rms_eps, a.data());
  ex.lm_head(w.output, a.data(), m, req.logits);
}

}  // namespace dllm::model
