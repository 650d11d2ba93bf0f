// The forward program over a batch of sequences (forward.h), written once against the executor's
// operations (executor.h). The computed rows of every sequence are concatenated; each operation runs over
// all of them, attention per sequence over its own keys and values. Every operation works row by row, so
// asking for a subset of logit rows, or sharing the batch with other sequences, gives exactly the rows of
// the sequence's own all-rows result.
#include "model/forward.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "model/arch.h"
#include "common/error.h"
#include "model/quant.h"

namespace dllm::model {

namespace {

VectorHandle prepare_vector(Executor& ex, const gguf::TensorInfo* t) {
  if (!t) return {};
  std::vector<float> v(static_cast<size_t>(t->n_elements()));
  quant::dequantize_row(t->type(), t->data, v.data(), t->n_elements());
  return ex.prepare_vector(v);
}

// The activation buffers of the program.
enum Slot : int32_t { kX, kQ, kK, kV, kAtt, kGate, kUp };

// One sequence's place in the batch.
struct Part {
  const ForwardRequest* req = nullptr;
  int64_t n = 0;           // canvas length (keys/values attended over)
  int64_t r0 = 0, r1 = 0;  // computed positions [r0, r1)
  int64_t off = 0;         // first batch row of its computed positions
  int64_t qoff = 0;        // first batch row of its logit rows after the last layer
  KvHandle kv;             // where its keys/values go
  bool per_layer = false;  // kv holds every layer (the dual cache); otherwise one layer, reused
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
  w.output_norm = prepare_vector(ex, t.output_norm);
  w.output = ex.prepare_weight(*t.output);
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
    l.wv = ex.prepare_weight(*lt.wv);
    l.wo = ex.prepare_weight(*lt.wo);
    l.q_norm = prepare_vector(ex, lt.attn_q_norm);
    l.k_norm = prepare_vector(ex, lt.attn_k_norm);
    if (!hp.moe()) {
      l.ffn_gate = ex.prepare_weight(*lt.ffn_gate);
      l.ffn_up = ex.prepare_weight(*lt.ffn_up);
      l.ffn_down = ex.prepare_weight(*lt.ffn_down);
      continue;
    }
    MoeLayer& m = l.moe;
    m.n_expert = hp.n_expert, m.n_used = hp.n_expert_used, m.n_ff = hp.n_ff_exp;
    m.norm_weights = hp.expert_weights_norm;
    m.router = prepare_vector(ex, lt.ffn_gate_inp);  // [D, E]: row e is expert e's D weights
    std::string name;
    for (int64_t e = 0; e < hp.n_expert; ++e) {
      m.gate.push_back(ex.prepare_weight(expert_slice(*lt.ffn_gate_exps, e, name)));
      m.up.push_back(ex.prepare_weight(expert_slice(*lt.ffn_up_exps, e, name)));
      m.down.push_back(ex.prepare_weight(expert_slice(*lt.ffn_down_exps, e, name)));
    }
  }
  return w;
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

// The forward program over one batch (the blocks of LayerProgram, and the layout they share).
class Program : public LayerProgram {
 public:
  Program(const HParams& hp, const ForwardWeights& w, Executor& ex, std::vector<Part>& parts)
      : hp_(hp), w_(w), ex_(ex), parts_(parts),
        rope_{hp.rope_style, hp.n_rot, hp.rope_base},
        shape_{hp.n_head, hp.n_head_kv, hp.head_dim,
               static_cast<float>(1.0 / std::sqrt(static_cast<double>(hp.head_dim)))} {
    for (const Part& p : parts) total_ += p.rows(), M_ += p.m();
    // After the last layer's keys and values only the rows whose logits are wanted go on.
    keep_.reserve(static_cast<size_t>(M_));
    for (const Part& p : parts)
      for (int64_t r : p.req->logit_rows) keep_.push_back(p.off + r - p.r0);
  }

  void run(std::span<float*> logits) {
    // --- embedding (no scaling) of every computed position ---
    x_ = ex_.activation(kX, std::max(total_, M_), hp_.n_embd);
    std::vector<int32_t> ids;
    ids.reserve(static_cast<size_t>(total_));
    for (const Part& p : parts_) ids.insert(ids.end(), p.req->tokens.begin() + p.r0, p.req->tokens.begin() + p.r1);
    ex_.embed(*w_.token_embd, ids, x_);
    rows_ = total_;
    const ArchSpec& arch = arch_spec(hp_.arch);
    for (int64_t l = 0; l < static_cast<int64_t>(w_.layers.size()); ++l) arch.build_layer(*this, l);
    if (M_ == 0) return;  // only caches were filled
    if (rows_ != M_) ex_.gather(x_, keep_, x_);  // no layers at all: select the rows here

    // --- final norm and LM head, requested rows only ---
    if (parts_.size() == 1) {
      ex_.final_logits(w_.output, x_, M_, w_.output_norm, hp_.rms_eps, logits[0]);
      return;
    }
    const int64_t V = hp_.n_vocab;
    std::vector<float> all(static_cast<size_t>(M_ * V));
    ex_.final_logits(w_.output, x_, M_, w_.output_norm, hp_.rms_eps, all.data());
    for (size_t i = 0; i < parts_.size(); ++i)
      std::copy_n(all.data() + parts_[i].qoff * V, parts_[i].m() * V, logits[i]);
  }

  void self_attention(int64_t l) override {
    const ForwardWeights::Layer& L = w_.layers[static_cast<size_t>(l)];
    const bool last = l + 1 == static_cast<int64_t>(w_.layers.size());
    const int64_t Q = hp_.q_dim(), KV = hp_.kv_dim();
    // Keys and values of the computed positions (the queries too, but at the last layer).
    const Act k = ex_.activation(kK, total_, KV), v = ex_.activation(kV, total_, KV);
    Act q = ex_.activation(kQ, total_, Q);
    if (!last) {
      const WeightHandle ws[3] = {L.wq, L.wk, L.wv};
      const Act ys[3] = {q, k, v};
      ex_.norm_matmul(x_, total_, L.attn_norm, hp_.rms_eps, ws, ys, 3);
      if (L.q_norm.valid()) ex_.head_norm(q, total_, hp_.n_head, hp_.head_dim, L.q_norm, hp_.rms_eps);
    } else {
      const WeightHandle ws[2] = {L.wk, L.wv};
      const Act ys[2] = {k, v};
      ex_.norm_matmul(x_, total_, L.attn_norm, hp_.rms_eps, ws, ys, 2);
    }
    if (L.k_norm.valid()) ex_.head_norm(k, total_, hp_.n_head_kv, hp_.head_dim, L.k_norm, hp_.rms_eps);
    for (const Part& p : parts_)
      ex_.kv_store(p.kv, p.layer(l), k, v, p.off, p.rows(), p.r0, L.bk, L.bv, rope_, shape_);
    if (last) {  // the residual stream and the queries of the requested rows only
      ex_.gather(x_, keep_, x_);
      rows_ = M_;
      q = ex_.activation(kQ, M_, Q);
      ex_.norm_matmul(x_, M_, L.attn_norm, hp_.rms_eps, &L.wq, &q, 1);
      if (L.q_norm.valid()) ex_.head_norm(q, M_, hp_.n_head, hp_.head_dim, L.q_norm, hp_.rms_eps);
    }
    const Act att = ex_.activation(kAtt, rows_, Q);
    for (const Part& p : parts_) {
      if (last && p.m() == 0) continue;
      if (last) ex_.attend(p.kv, p.layer(l), p.n, q, p.qoff, p.req->logit_rows, L.bq, rope_, shape_, att);
      else ex_.attend(p.kv, p.layer(l), p.n, q, p.off, p.positions, L.bq, rope_, shape_, att);
    }
    ex_.matmul_add(L.wo, att, rows_, x_);
  }

  void swiglu_ffn(int64_t l) override {
    const ForwardWeights::Layer& L = w_.layers[static_cast<size_t>(l)];
    const Act gate = ex_.activation(kGate, rows_, hp_.n_ff), up = ex_.activation(kUp, rows_, hp_.n_ff);
    const WeightHandle ws[2] = {L.ffn_gate, L.ffn_up};
    const Act ys[2] = {gate, up};
    ex_.norm_matmul(x_, rows_, L.ffn_norm, hp_.rms_eps, ws, ys, 2);
    ex_.swiglu_matmul_add(L.ffn_down, gate, up, rows_, x_);
  }

  void moe_ffn(int64_t l) override {
    const ForwardWeights::Layer& L = w_.layers[static_cast<size_t>(l)];
    ex_.moe_ffn(L.moe, x_, rows_, L.ffn_norm, hp_.rms_eps);
  }

 private:
  const HParams& hp_;
  const ForwardWeights& w_;
  Executor& ex_;
  std::vector<Part>& parts_;
  const RopeSpec rope_;
  const AttentionShape shape_;
  int64_t total_ = 0, M_ = 0;  // computed rows; logit rows
  int64_t rows_ = 0;           // rows of x still carried
  std::vector<int64_t> keep_;
  Act x_;
};

}  // namespace

void forward_batch(const HParams& hp, const ForwardWeights& w, Executor& ex, std::span<const ForwardRequest> reqs) {
  const int64_t n_layer = static_cast<int64_t>(w.layers.size());
  const int64_t KV = hp.kv_dim();

  // --- the batch's layout: every request checked before any work ---
  std::vector<Part> parts;
  for (const ForwardRequest& req : reqs) {
    const auto [r0, r1] = computed_range(hp, req);
    if (req.logit_rows.empty() && req.cache_mode == CacheMode::None) continue;  // nothing to compute
    Part p;
    p.req = &req;
    p.n = static_cast<int64_t>(req.tokens.size());
    p.r0 = r0, p.r1 = r1;
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
      p.kv = ex.kv_open(1, p.n, KV);  // scratch: one layer at a time
      continue;
    }
    KVCache& c = *p.req->cache;
    if (p.req->cache_mode == CacheMode::Fill) {
      c.reset();
      c.handle = ex.kv_open(n_layer, p.n, KV);
      c.owner = &ex;
      c.n = p.n;
    }
    p.kv = c.handle;
    p.per_layer = true;
  }
  std::vector<float*> logits;
  for (const Part& p : parts) logits.push_back(p.req->logits);
  Program(hp, w, ex, parts).run(logits);
}

void forward(const HParams& hp, const ForwardWeights& w, Executor& ex, const ForwardRequest& req) {
  forward_batch(hp, w, ex, std::span<const ForwardRequest>(&req, 1));
}

}  // namespace dllm::model
