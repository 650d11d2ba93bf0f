// The forward program over a batch of sequences (forward.h), written once against the executor's
// operations (executor.h). The computed rows of every sequence are concatenated; each operation runs over
// all of them, attention per sequence over its own keys and values. Every operation works row by row, so
// asking for a subset of logit rows, or sharing the batch with other sequences, gives exactly the rows of
// the sequence's own all-rows result.
#include "model/forward.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include "model/arch.h"
#include "common/error.h"
#include "model/quant.h"

namespace dllm::model {

namespace {

// A small tensor's values decoded to f32 (empty for none).
std::vector<float> host_values(const gguf::TensorInfo* t) {
  if (!t) return {};
  std::vector<float> v(static_cast<size_t>(t->n_elements()));
  quant::dequantize_row(t->type(), t->data, v.data(), t->n_elements());
  return v;
}

VectorHandle prepare_vector(Executor& ex, const gguf::TensorInfo* t) {
  if (!t) return {};
  return ex.prepare_vector(host_values(t));
}

// A one-value tensor (Gemma-4's per-layer scalars); 1 when the file has none.
float scalar_of(const gguf::TensorInfo* t) { return t ? host_values(t)[0] : 1.0f; }

// The activation buffers of the program.
enum Slot : int32_t { kX, kQ, kK, kV, kAtt, kGate, kUp, kMlp, kMoe, kTmp };

// One sequence's place in the batch.
struct Part {
  const ForwardRequest* req = nullptr;
  int64_t n = 0;           // canvas length (keys/values attended over)
  int64_t r0 = 0, r1 = 0;  // computed positions [r0, r1)
  int64_t off = 0;         // first batch row of its computed positions
  int64_t qoff = 0;        // first batch row of its logit rows after the last layer
  KvHandle kv;             // where its keys/values go
  bool per_layer = false;  // kv holds every layer (the dual cache); otherwise one layer, reused
  int64_t n_prompt = 0;    // prompt_regions: positions [0, n_prompt) are the prompt
  std::vector<int64_t> positions;  // r0 .. r1-1
  int64_t rows() const { return r1 - r0; }
  int64_t m() const { return static_cast<int64_t>(req->logit_rows.size()); }
  int64_t layer(int64_t l) const { return per_layer ? l : 0; }
};

// Checks one request's cache rules and returns the positions it computes.
std::pair<int64_t, int64_t> computed_range(const HParams& hp, const ForwardRequest& req) {
  check_canvas(hp, req.tokens, req.logit_rows);
  const int64_t n = static_cast<int64_t>(req.tokens.size());
  if (req.cache_mode != CacheMode::None && !req.cache) throw Error("internal error: cache mode without a cache");
  if (!req.logit_rows.empty() && !req.logits) throw Error("internal error: forward without a logits buffer");
  if (req.n_prompt < 0 || req.n_prompt > n) throw Error("internal error: the prompt is longer than the tokens");
  if (req.n_prompt > 0 && !hp.prompt_regions) throw Error("internal error: prompt regions on a model without them");
  if (req.self_cond_logits && (!hp.prompt_regions || !(req.self_cond_temperature > 0)))
    throw Error("internal error: self-conditioning without a canvas or a positive temperature");
  if (req.cache_mode == CacheMode::Extend || req.cache_mode == CacheMode::Prefix) {
    if (!hp.prompt_regions) throw Error("internal error: a cached prefix on a model without a causal prompt");
    const int64_t c = req.cache->handle.valid() ? req.cache->n : 0;
    if (c > req.n_prompt) throw Error("internal error: the cached prefix is longer than the prompt");
    if (req.cache_mode == CacheMode::Extend && n > req.n_prompt)
      throw Error("internal error: only prompt positions extend the cached prefix");
    if (c >= n) throw Error("internal error: nothing to compute after the cached prefix");
    if (req.self_cond_logits && c > req.n_prompt) throw Error("internal error: self-conditioning needs the whole canvas");
    for (int64_t r : req.logit_rows)
      if (r < c) throw Error("internal error: a logit row inside the cached prefix");
    return {c, n};
  }
  if (req.cache_mode != CacheMode::Reuse) return {0, n};
  const int64_t r0 = req.row_begin, r1 = req.row_end;
  if (req.cache->n != n || !req.cache->handle.valid()) {
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
  return {r0, r1};
}

}  // namespace

void KVCache::reset() {
  if (owner && handle.valid()) owner->kv_close(handle);
  handle = {};
  owner = nullptr;
  n = 0;
}

ForwardWeights prepare_forward_weights(const HParams& hp, const ModelTensors& t, Executor& ex) {
  ex.prepare_model(hp);
  ForwardWeights w;
  w.token_embd = t.token_embd;
  if (t.self_cond_gate) ex.keep_mapped(*t.token_embd);  // soft_embed reads the table every step
  w.output_norm = prepare_vector(ex, t.output_norm);
  w.output = ex.prepare_weight(*t.output);
  w.rope_freqs = host_values(t.rope_freqs);
  if (t.self_cond_gate) {
    w.sc_pre_norm = prepare_vector(ex, t.self_cond_pre_norm);
    w.sc_gate = ex.prepare_weight(*t.self_cond_gate);
    w.sc_up = ex.prepare_weight(*t.self_cond_up);
    w.sc_down = ex.prepare_weight(*t.self_cond_down);
    const WeightHandle gate_up[2] = {w.sc_gate, w.sc_up};
    ex.prepare_shared(gate_up, 2);
  }
  w.layers.resize(t.layers.size());
  for (size_t i = 0; i < t.layers.size(); ++i) {
    const LayerTensors& lt = t.layers[i];
    ForwardWeights::Layer& l = w.layers[i];
    l.attn_norm = prepare_vector(ex, lt.attn_norm);
    l.ffn_norm = prepare_vector(ex, lt.ffn_norm);
    l.bq = prepare_vector(ex, lt.bq);
    l.bk = prepare_vector(ex, lt.bk);
    l.bv = prepare_vector(ex, lt.bv);
    l.wq = ex.prepare_weight(*lt.wq);
    l.wk = ex.prepare_weight(*lt.wk);
    if (lt.wv) l.wv = ex.prepare_weight(*lt.wv);  // absent: the values are the raw keys (Gemma-4 global layers)
    l.wo = ex.prepare_weight(*lt.wo);
    if (!hp.prompt_regions) ex.prepare_output_projection(l.wo);  // attention's quantising launch (expect_projection)
    l.q_norm = prepare_vector(ex, lt.attn_q_norm);
    l.k_norm = prepare_vector(ex, lt.attn_k_norm);
    l.post_attn_norm = prepare_vector(ex, lt.post_attention_norm);
    l.post_ffw_norm_1 = prepare_vector(ex, lt.post_ffw_norm_1);
    l.pre_ffw_norm_2 = prepare_vector(ex, lt.pre_ffw_norm_2);
    l.post_ffw_norm_2 = prepare_vector(ex, lt.post_ffw_norm_2);
    l.post_ffw_norm = prepare_vector(ex, lt.post_ffw_norm);
    l.enc_scale = scalar_of(lt.enc_layer_output_scale);
    l.dec_scale = scalar_of(lt.layer_output_scale);
    {  // the products norm_matmul takes together: Q, K(, V), and K(, V) alone at the last layer
      const WeightHandle qkv[3] = {l.wq, l.wk, l.wv};
      const int n = l.wv.valid() ? 3 : 2;
      ex.prepare_shared(qkv, n);
      if (n - 1 > 1) ex.prepare_shared(qkv + 1, n - 1);
    }
    if (!hp.moe() || lt.ffn_gate) {  // dense, or the shared MLP beside the experts
      l.ffn_gate = ex.prepare_weight(*lt.ffn_gate);
      l.ffn_up = ex.prepare_weight(*lt.ffn_up);
      l.ffn_down = ex.prepare_weight(*lt.ffn_down);
      const WeightHandle gate_up[2] = {l.ffn_gate, l.ffn_up};
      ex.prepare_shared(gate_up, 2);
      if (!hp.prompt_regions) ex.prepare_swiglu_ffn(l.ffn_gate, l.ffn_up, l.ffn_down);  // norm_swiglu_ffn's products
    }
    if (!hp.moe()) continue;
    MoeLayer& m = l.moe;
    m.n_expert = hp.n_expert, m.n_used = hp.n_expert_used, m.n_ff = hp.n_ff_exp;
    m.norm_weights = hp.expert_weights_norm;
    m.router = prepare_vector(ex, lt.ffn_gate_inp);  // [D, E]: row e is expert e's D weights
    m.glu = hp.prompt_regions ? Glu::GeluTanh : Glu::SiLU;
    m.router_scale = prepare_vector(ex, lt.ffn_gate_inp_scale);
    m.expert_scale = host_values(lt.ffn_down_exps_scale);
    std::string name, half;
    for (int64_t e = 0; e < hp.n_expert; ++e) {
      if (lt.ffn_gate_up_exps) {  // fused: each expert's first n_ff rows are the gate, the next n_ff the up
        const gguf::TensorInfo both = expert_slice(*lt.ffn_gate_up_exps, e, name);
        m.gate.push_back(ex.prepare_weight(row_slice(both, 0, hp.n_ff_exp, half)));
        m.up.push_back(ex.prepare_weight(row_slice(both, hp.n_ff_exp, hp.n_ff_exp, half)));
      } else {
        m.gate.push_back(ex.prepare_weight(expert_slice(*lt.ffn_gate_exps, e, name)));
        m.up.push_back(ex.prepare_weight(expert_slice(*lt.ffn_up_exps, e, name)));
      }
      m.down.push_back(ex.prepare_weight(expert_slice(*lt.ffn_down_exps, e, name)));
    }
  }
  return w;
}

gguf::TensorInfo row_slice(const gguf::TensorInfo& t, int64_t r0, int64_t n, std::string& name) {
  if (t.n_dims != 2 || r0 < 0 || n < 1 || r0 + n > t.ne[1])
    throw Error("internal error: rows " + std::to_string(r0) + "+" + std::to_string(n) + " of " + std::string(t.name));
  gguf::TensorInfo s = t;
  name = std::string(t.name) + "[" + std::to_string(r0) + ":" + std::to_string(r0 + n) + "]";
  s.name = name;
  s.ne[1] = n;
  s.offset = t.offset + static_cast<uint64_t>(r0) * t.row_bytes();
  s.data = t.data + static_cast<uint64_t>(r0) * t.row_bytes();
  s.nbytes = static_cast<uint64_t>(n) * t.row_bytes();
  return s;
}

gguf::TensorInfo expert_slice(const gguf::TensorInfo& t, int64_t e, std::string& name) {
  if (t.n_dims != 3 || e < 0 || e >= t.ne[2]) throw Error("internal error: no expert " + std::to_string(e) + " in " + std::string(t.name));
  gguf::TensorInfo s = t;
  const uint64_t bytes = t.row_bytes() * static_cast<uint64_t>(t.ne[1]);
  name = std::string(t.name) + "[" + std::to_string(e) + "]";
  s.name = name;
  s.n_dims = 2;
  s.ne[2] = 1;
  s.offset = t.offset + static_cast<uint64_t>(e) * bytes;
  s.data = t.data + static_cast<uint64_t>(e) * bytes;
  s.nbytes = bytes;
  return s;
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

namespace {

// Adds the wall time of its scope to one PassTimes field.
class Timed {
 public:
  Timed(PassTimes& t, double PassTimes::*slot) : t_(t), slot_(slot), t0_(std::chrono::steady_clock::now()) {}
  ~Timed() { t_.*slot_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0_).count(); }
  Timed(const Timed&) = delete;
  Timed& operator=(const Timed&) = delete;

 private:
  PassTimes& t_;
  double PassTimes::*slot_;
  std::chrono::steady_clock::time_point t0_;
};

// The forward program over one batch (the blocks of LayerProgram, and the layout they share).
class Program : public LayerProgram {
 public:
  Program(const HParams& hp, const ForwardWeights& w, Executor& ex, std::vector<Part>& parts)
      : hp_(hp), w_(w), ex_(ex), parts_(parts) {
    for (const Part& p : parts) total_ += p.rows(), M_ += p.m();
    // After the last layer's keys and values only the rows whose logits are wanted go on.
    keep_.reserve(static_cast<size_t>(M_));
    for (const Part& p : parts)
      for (int64_t r : p.req->logit_rows) keep_.push_back(p.off + r - p.r0);
    // Each carried row's sequence and position (the region scalars and the masks read them).
    for (size_t i = 0; i < parts.size(); ++i)
      for (int64_t pos : parts[i].positions) row_part_.push_back(static_cast<int32_t>(i)), row_pos_.push_back(pos);
  }

  void run(std::span<float*> logits) {
    run_timed(logits);
    PassTimes& all = ex_.pass_times();
    if (M_ == 0) {  // only caches were filled
      all.encode_ms += t_.total_ms();
      return;
    }
    all.embed_ms += t_.embed_ms, all.self_cond_ms += t_.self_cond_ms, all.attention_ms += t_.attention_ms;
    all.mlp_ms += t_.mlp_ms, all.experts_ms += t_.experts_ms, all.other_ms += t_.other_ms;
    all.lm_head_ms += t_.lm_head_ms;
    ++all.passes;
  }

  void run_timed(std::span<float*> logits) {
    // --- embedding of every computed position ---
    {
      Timed t(t_, &PassTimes::embed_ms);
      x_ = ex_.activation(kX, std::max(total_, M_), hp_.n_embd);
      std::vector<int32_t> ids;
      ids.reserve(static_cast<size_t>(total_));
      for (const Part& p : parts_) ids.insert(ids.end(), p.req->tokens.begin() + p.r0, p.req->tokens.begin() + p.r1);
      ex_.embed(*w_.token_embd, ids, x_);
      rows_ = total_;
      if (hp_.embd_scale != 1.0f) ex_.scale_rows(x_, std::vector<float>(static_cast<size_t>(total_), hp_.embd_scale));
    }
    if (hp_.prompt_regions) canvas_input();
    const ArchSpec& arch = arch_spec(hp_.arch);
    for (int64_t l = 0; l < static_cast<int64_t>(w_.layers.size()); ++l) arch.build_layer(*this, l);
    if (M_ == 0) return;  // only caches were filled
    Timed t(t_, &PassTimes::lm_head_ms);
    if (rows_ != M_) ex_.gather(x_, keep_, x_);  // no layers at all: select the rows here

    // --- final norm and LM head, requested rows only ---
    const int64_t V = hp_.n_vocab;
    std::vector<float> all;
    float* out = logits[0];
    if (parts_.size() > 1) {
      all.resize(static_cast<size_t>(M_ * V));
      out = all.data();
    }
    ex_.final_logits(w_.output, x_, M_, w_.output_norm, hp_.rms_eps, out);
    if (hp_.final_softcap > 0) ex_.softcap(out, M_ * V, hp_.final_softcap);
    if (parts_.size() == 1) return;
    for (size_t i = 0; i < parts_.size(); ++i)
      std::copy_n(all.data() + parts_[i].qoff * V, parts_[i].m() * V, logits[i]);
  }

  void self_attention(int64_t l) override {
    Timed t(t_, &PassTimes::attention_ms);
    const ForwardWeights::Layer& L = w_.layers[static_cast<size_t>(l)];
    const bool last = l + 1 == static_cast<int64_t>(w_.layers.size());
    const LayerAttention g = hp_.attn(l);
    const AttentionShape shape{hp_.n_head, g.n_head_kv, g.head_dim,
                               hp_.attn_scale > 0 ? hp_.attn_scale
                                                  : static_cast<float>(1.0 / std::sqrt(static_cast<double>(g.head_dim)))};
    const RopeSpec rope{hp_.rope_style, g.n_rot, g.rope_base,
                        g.rope_freqs && !w_.rope_freqs.empty() ? w_.rope_freqs.data() : nullptr};
    const int64_t Q = hp_.n_head * g.head_dim, KV = shape.kv_dim();
    // Keys and values of the computed positions (the queries too, but at the last layer).
    const Act k = ex_.activation(kK, total_, KV), v = ex_.activation(kV, total_, KV);
    Act q = ex_.activation(kQ, total_, Q);
    const bool own_v = L.wv.valid();
    {
      WeightHandle ws[3] = {L.wq, L.wk, L.wv};
      Act ys[3] = {q, k, v};
      const int first = last ? 1 : 0, n = own_v ? 3 : 2;
      ex_.norm_matmul(x_, total_, L.attn_norm, hp_.rms_eps, ws + first, ys + first, n - first);
    }
    if (!last && L.q_norm.valid()) ex_.head_norm(q, total_, hp_.n_head, g.head_dim, L.q_norm, hp_.rms_eps);
    if (!own_v) ex_.gather(k, identity(total_), v);  // the raw key projection
    if (hp_.prompt_regions) ex_.head_norm(v, total_, g.n_head_kv, g.head_dim, VectorHandle{}, hp_.rms_eps);
    if (L.k_norm.valid()) ex_.head_norm(k, total_, g.n_head_kv, g.head_dim, L.k_norm, hp_.rms_eps);
    for (const Part& p : parts_)
      ex_.kv_store(p.kv, p.layer(l), k, v, p.off, p.rows(), p.r0, L.bk, L.bv, rope, shape);
    if (last) {  // the residual stream and the queries of the requested rows only
      ex_.gather(x_, keep_, x_);
      std::vector<int32_t> part(keep_.size());
      std::vector<int64_t> pos(keep_.size());
      for (size_t i = 0; i < keep_.size(); ++i)
        part[i] = row_part_[static_cast<size_t>(keep_[i])], pos[i] = row_pos_[static_cast<size_t>(keep_[i])];
      row_part_ = std::move(part), row_pos_ = std::move(pos);
      rows_ = M_;
      q = ex_.activation(kQ, M_, Q);
      ex_.norm_matmul(x_, M_, L.attn_norm, hp_.rms_eps, &L.wq, &q, 1);
      if (L.q_norm.valid()) ex_.head_norm(q, M_, hp_.n_head, g.head_dim, L.q_norm, hp_.rms_eps);
    }
    const Act att = ex_.activation(kAtt, rows_, Q);
    if (!L.post_attn_norm.valid()) ex_.expect_projection(att, rows_, L.wo);
    for (const Part& p : parts_) {
      if (last && p.m() == 0) continue;
      const std::span<const int64_t> qpos = last ? p.req->logit_rows : std::span<const int64_t>(p.positions);
      const std::vector<KeyRange> ranges = key_ranges(p, qpos, g.sliding);
      ex_.attend(p.kv, p.layer(l), p.n, q, last ? p.qoff : p.off, qpos, L.bq, rope, shape, att, ranges);
    }
    if (L.post_attn_norm.valid()) ex_.matmul_norm_add(L.wo, att, rows_, L.post_attn_norm, hp_.rms_eps, x_);
    else ex_.matmul_add(L.wo, att, rows_, x_);
  }

  void swiglu_ffn(int64_t l) override {
    Timed t(t_, &PassTimes::mlp_ms);
    const ForwardWeights::Layer& L = w_.layers[static_cast<size_t>(l)];
    const Act gate = ex_.activation(kGate, rows_, hp_.n_ff), up = ex_.activation(kUp, rows_, hp_.n_ff);
    ex_.norm_swiglu_ffn(x_, rows_, L.ffn_norm, hp_.rms_eps, L.ffn_gate, L.ffn_up, L.ffn_down, gate, up);
  }

  void moe_ffn(int64_t l) override {
    Timed t(t_, &PassTimes::experts_ms);
    const ForwardWeights::Layer& L = w_.layers[static_cast<size_t>(l)];
    ex_.moe_ffn(L.moe, x_, rows_, L.ffn_norm, hp_.rms_eps);
  }

  void parallel_ffn(int64_t l) override {
    const ForwardWeights::Layer& L = w_.layers[static_cast<size_t>(l)];
    const float eps = hp_.rms_eps;
    const Act mlp = ex_.activation(kMlp, rows_, hp_.n_embd), moe = ex_.activation(kMoe, rows_, hp_.n_embd);
    {
      Timed t(t_, &PassTimes::mlp_ms);
      geglu_mlp(x_, rows_, L.ffn_norm, L.ffn_gate, L.ffn_up, L.ffn_down, mlp);
    }
    {
      Timed t(t_, &PassTimes::experts_ms);
      ex_.moe_ffn_to(L.moe, x_, rows_, L.pre_ffw_norm_2, eps, moe);
    }
    Timed t(t_, &PassTimes::other_ms);
    ex_.norm(mlp, rows_, L.post_ffw_norm_1, eps, mlp);
    ex_.norm(moe, rows_, L.post_ffw_norm_2, eps, moe);
    ex_.add(moe, rows_, mlp);
    ex_.norm_add(mlp, rows_, L.post_ffw_norm, eps, x_);
  }

  void region_scale(int64_t l) override {
    Timed t(t_, &PassTimes::other_ms);
    const ForwardWeights::Layer& L = w_.layers[static_cast<size_t>(l)];
    std::vector<float> s(static_cast<size_t>(rows_));
    for (size_t i = 0; i < s.size(); ++i)
      s[i] = row_pos_[i] < parts_[static_cast<size_t>(row_part_[i])].n_prompt ? L.enc_scale : L.dec_scale;
    ex_.scale_rows(x_, s);
  }

 private:
  // y = down(gelu(gate(norm(x))) * up(norm(x))), r < rows (Gemma's MLPs: the shared one and self-conditioning's).
  void geglu_mlp(Act x, int64_t rows, VectorHandle norm, WeightHandle gate_w, WeightHandle up_w, WeightHandle down_w,
                 Act y) {
    const Act gate = ex_.activation(kGate, rows, hp_.n_ff), up = ex_.activation(kUp, rows, hp_.n_ff);
    const WeightHandle ws[2] = {gate_w, up_w};
    const Act ys[2] = {gate, up};
    ex_.norm_matmul(x, rows, norm, hp_.rms_eps, ws, ys, 2);
    ex_.glu_matmul(Glu::GeluTanh, down_w, gate, up, rows, y);
  }

  // Gemma-4's canvas input: rmsnorm(embedding + self-conditioning signal) without weight, on canvas rows.
  void canvas_input() {
    std::vector<int64_t> canvas, sc;  // batch rows of canvas positions; those with self-conditioning
    std::vector<float> sc_logits;
    const int64_t V = hp_.n_vocab;
    for (const Part& p : parts_) {
      for (int64_t pos = std::max(p.r0, p.n_prompt); pos < p.r1; ++pos) {
        canvas.push_back(p.off + pos - p.r0);
        if (!p.req->self_cond_logits) continue;
        sc.push_back(p.off + pos - p.r0);
      }
    }
    if (canvas.empty()) return;
    const int64_t nc = static_cast<int64_t>(canvas.size()), D = hp_.n_embd;
    if (!sc.empty()) {
      Timed t(t_, &PassTimes::self_cond_ms);
      if (!w_.sc_gate.valid()) throw Error("this model file has no self-conditioning tensors (self_cond_*)");
      // One soft embedding per sequence (its own temperature), then the MLP over every such row at once.
      const Act s = ex_.activation(kMoe, static_cast<int64_t>(sc.size()), D);
      int64_t at = 0;
      for (const Part& p : parts_) {
        if (!p.req->self_cond_logits) continue;
        const int64_t first = std::max(p.r0, p.n_prompt), rows = p.r1 - first;
        const float* lg = p.req->self_cond_logits + (first - p.n_prompt) * V;
        const Act part = ex_.activation(kTmp, rows, D);
        ex_.soft_embed(*w_.token_embd, lg, rows, p.req->self_cond_temperature, p.req->self_cond_top_k,
                       hp_.embd_scale, part);
        std::vector<int64_t> dst(static_cast<size_t>(rows));
        std::iota(dst.begin(), dst.end(), at);
        ex_.scatter(part, dst, s);
        at += rows;
      }
      const Act g = ex_.activation(kMlp, at, D);
      geglu_mlp(s, at, w_.sc_pre_norm, w_.sc_gate, w_.sc_up, w_.sc_down, g);
      const Act xs = ex_.activation(kAtt, at, D);
      ex_.gather(x_, sc, xs);
      ex_.add(g, at, xs);
      ex_.scatter(xs, sc, x_);
    }
    Timed t(t_, &PassTimes::embed_ms);
    const Act xc = ex_.activation(kAtt, nc, D);
    ex_.gather(x_, canvas, xc);
    ex_.norm(xc, nc, VectorHandle{}, hp_.rms_eps, xc);
    ex_.scatter(xc, canvas, x_);
  }

  // The keys each query row (at positions qpos of part p) attends to; empty = all (no regions).
  std::vector<KeyRange> key_ranges(const Part& p, std::span<const int64_t> qpos, bool sliding) const {
    std::vector<KeyRange> r;
    if (!hp_.prompt_regions) return r;
    r.reserve(qpos.size());
    const int64_t P = p.n_prompt, w = hp_.n_swa;
    for (int64_t q : qpos) {
      if (q < P) r.push_back({sliding ? std::max<int64_t>(0, q - w + 1) : 0, q + 1});  // causal prompt
      else r.push_back({sliding ? std::max<int64_t>(0, P - w + 1) : 0, p.n});         // the canvas
    }
    return r;
  }

  const std::vector<int64_t>& identity(int64_t n) {
    if (static_cast<int64_t>(iota_.size()) != n) {
      iota_.resize(static_cast<size_t>(n));
      std::iota(iota_.begin(), iota_.end(), 0);
    }
    return iota_;
  }

  const HParams& hp_;
  const ForwardWeights& w_;
  Executor& ex_;
  std::vector<Part>& parts_;
  int64_t total_ = 0, M_ = 0;  // computed rows; logit rows
  int64_t rows_ = 0;           // rows of x still carried
  std::vector<int64_t> keep_;
  std::vector<int32_t> row_part_;  // per carried row: its part
  std::vector<int64_t> row_pos_;   // per carried row: its position
  std::vector<int64_t> iota_;
  Act x_;
  PassTimes t_;  // this pass's
};

}  // namespace

namespace {

std::vector<int64_t> layer_widths(const HParams& hp, int64_t n_layer) {  // each layer's own Hkv * d
  std::vector<int64_t> widths(static_cast<size_t>(n_layer));
  for (int64_t l = 0; l < n_layer; ++l) widths[static_cast<size_t>(l)] = hp.attn(l).n_head_kv * hp.attn(l).head_dim;
  return widths;
}

}  // namespace

std::vector<float> read_prefix(const KVCache& cache) {
  if (!cache.owner || !cache.handle.valid()) return {};
  return cache.owner->kv_read(cache.handle, cache.n);
}

void restore_prefix(const HParams& hp, Executor& ex, KVCache& cache, int64_t positions, std::span<const float> data,
                    int64_t data_positions, int64_t capacity) {
  cache.reset();
  cache.handle = ex.kv_open(layer_widths(hp, hp.n_layer), std::max(capacity, positions));
  cache.owner = &ex;
  cache.capacity = std::max(capacity, positions);
  ex.kv_write(cache.handle, positions, data, data_positions);
  cache.n = positions;
}

void forward_batch(const HParams& hp, const ForwardWeights& w, Executor& ex, std::span<const ForwardRequest> reqs) {
  const int64_t KV = hp.max_kv_dim();
  const std::vector<int64_t> widths = layer_widths(hp, static_cast<int64_t>(w.layers.size()));

  // --- the batch's layout: every request checked before any work ---
  std::vector<Part> parts;
  for (const ForwardRequest& req : reqs) {
    const auto [r0, r1] = computed_range(hp, req);
    const bool fills = req.cache_mode != CacheMode::None && req.cache_mode != CacheMode::Prefix;
    if (req.logit_rows.empty() && !fills) continue;  // nothing to compute
    Part p;
    p.req = &req;
    p.n = static_cast<int64_t>(req.tokens.size());
    p.r0 = r0, p.r1 = r1;
    p.n_prompt = req.n_prompt;
    parts.push_back(std::move(p));
  }
  if (parts.empty()) return;
  int64_t total = 0, M = 0;
  for (Part& p : parts) {
    p.off = total, p.qoff = M;
    total += p.rows(), M += p.m();
    p.positions.resize(static_cast<size_t>(p.rows()));
    std::iota(p.positions.begin(), p.positions.end(), p.r0);
  }
  struct Stores {  // opens each sequence's key/value store; closes the exact passes' scratch ones
    Executor& ex;
    std::vector<Part>& parts;
    ~Stores() {
      for (Part& p : parts)
        if (!p.per_layer && p.kv.valid()) ex.kv_close(p.kv);
    }
  } stores{ex, parts};
  for (Part& p : parts) {
    if (p.req->cache_mode == CacheMode::None) {
      p.kv = ex.kv_open(std::span<const int64_t>(&KV, 1), p.n);  // scratch: one layer at a time, the widest
      continue;
    }
    KVCache& c = *p.req->cache;
    if (p.req->cache_mode == CacheMode::Fill) {
      c.reset();
      c.handle = ex.kv_open(widths, p.n);
      c.owner = &ex;
      c.n = c.capacity = p.n;
    } else if (p.req->cache_mode == CacheMode::Extend || p.req->cache_mode == CacheMode::Prefix) {
      if (!c.handle.valid()) {
        c.handle = ex.kv_open(widths, p.n);
        c.owner = &ex;
        c.n = 0, c.capacity = p.n;
      } else if (c.capacity < p.n) {
        const int64_t cap = std::min(hp.n_ctx, std::max(p.n, 2 * c.capacity));
        ex.kv_grow(c.handle, cap);
        c.capacity = cap;
      }
    }
    p.kv = c.handle;
    p.per_layer = true;
  }
  std::vector<float*> logits;
  for (const Part& p : parts) logits.push_back(p.req->logits);
  Program(hp, w, ex, parts).run(logits);
  for (const Part& p : parts)
    if (p.req->cache_mode == CacheMode::Extend) p.req->cache->n = p.n;
}

void forward(const HParams& hp, const ForwardWeights& w, Executor& ex, const ForwardRequest& req) {
  forward_batch(hp, w, ex, std::span<const ForwardRequest>(&req, 1));
}

}  // namespace dllm::model
