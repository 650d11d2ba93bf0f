// The forward program over a batch of sequences (forward.h), written once against the executor's
// operations (executor.h). The computed rows of every sequence are concatenated; each operation runs over
// all of them, attention per sequence over its own keys and values. Every operation works row by row, so
// asking for a subset of logit rows, or sharing the batch with other sequences, gives exactly the rows of
// the sequence's own all-rows result.
#include "model/forward.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "model/error.h"
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

void forward_batch(const HParams& hp, const ForwardWeights& w, Executor& ex, std::span<const ForwardRequest> reqs) {
  const int64_t n_layer = static_cast<int64_t>(w.layers.size());
  const int64_t D = hp.n_embd, Q = hp.q_dim(), KV = hp.kv_dim(), F = hp.n_ff, V = hp.n_vocab;

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
    if (p.req->cache_mode == CacheMode::None) {
      p.kv = ex.kv_open(1, p.n, KV);  // scratch: one layer at a time
    } else {
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
  }
  struct ScratchStores {  // closes the exact passes' scratch stores whatever happens
    Executor& ex;
    std::vector<Part>& parts;
    ~ScratchStores() {
      for (Part& p : parts)
        if (!p.per_layer && p.kv.valid()) ex.kv_close(p.kv);
    }
  } scratch{ex, parts};

  const RopeSpec rope{hp.rope_style, hp.n_rot, hp.rope_base};
  const AttentionShape shape{hp.n_head, hp.n_head_kv, hp.head_dim,
                             static_cast<float>(1.0 / std::sqrt(static_cast<double>(hp.head_dim)))};

  // --- embedding (no scaling) of every computed position ---
  const Act x = ex.activation(kX, std::max(total, M), D);
  std::vector<int32_t> ids;
  ids.reserve(static_cast<size_t>(total));
  for (const Part& p : parts) ids.insert(ids.end(), p.req->tokens.begin() + p.r0, p.req->tokens.begin() + p.r1);
  ex.embed(*w.token_embd, ids, x);

  // After the last layer's keys and values only the rows whose logits are wanted go on.
  std::vector<int64_t> keep;
  keep.reserve(static_cast<size_t>(M));
  for (const Part& p : parts)
    for (int64_t r : p.req->logit_rows) keep.push_back(p.off + r - p.r0);

  int64_t rows = total;  // rows of x still carried
  for (int64_t l = 0; l < n_layer; ++l) {
    const ForwardWeights::Layer& L = w.layers[static_cast<size_t>(l)];
    const bool last = l + 1 == n_layer;

    // --- attention block: keys and values of the computed positions (Q too, but at the last layer) ---
    const Act k = ex.activation(kK, total, KV), v = ex.activation(kV, total, KV);
    Act q = ex.activation(kQ, total, Q);
    if (!last) {
      const WeightHandle ws[3] = {L.wq, L.wk, L.wv};
      const Act ys[3] = {q, k, v};
      ex.norm_matmul(x, total, L.attn_norm, hp.rms_eps, ws, ys, 3);
    } else {
      const WeightHandle ws[2] = {L.wk, L.wv};
      const Act ys[2] = {k, v};
      ex.norm_matmul(x, total, L.attn_norm, hp.rms_eps, ws, ys, 2);
    }
    for (const Part& p : parts)
      ex.kv_store(p.kv, p.layer(l), k, v, p.off, p.rows(), p.r0, L.bk, L.bv, rope, shape);
    if (last) {  // the residual stream and the queries of the requested rows only
      ex.gather(x, keep, x);
      rows = M;
      q = ex.activation(kQ, M, Q);
      ex.norm_matmul(x, M, L.attn_norm, hp.rms_eps, &L.wq, &q, 1);
    }
    const Act att = ex.activation(kAtt, rows, Q);
    for (const Part& p : parts) {
      if (last && p.m() == 0) continue;
      if (last) ex.attend(p.kv, p.layer(l), p.n, q, p.qoff, p.req->logit_rows, L.bq, rope, shape, att);
      else ex.attend(p.kv, p.layer(l), p.n, q, p.off, p.positions, L.bq, rope, shape, att);
    }
    ex.matmul_add(L.wo, att, rows, x);

    // --- feed-forward block (SwiGLU) ---
    const Act gate = ex.activation(kGate, rows, F), up = ex.activation(kUp, rows, F);
    const WeightHandle ws[2] = {L.ffn_gate, L.ffn_up};
    const Act ys[2] = {gate, up};
    ex.norm_matmul(x, rows, L.ffn_norm, hp.rms_eps, ws, ys, 2);
    ex.swiglu_matmul_add(L.ffn_down, gate, up, rows, x);
  }
  if (M == 0) return;  // only caches were filled
  if (rows != M) ex.gather(x, keep, x);  // no layers at all: select the rows here

  // --- final norm and LM head, requested rows only ---
  if (parts.size() == 1) {
    ex.final_logits(w.output, x, M, w.output_norm, hp.rms_eps, parts[0].req->logits);
    return;
  }
  std::vector<float> logits(static_cast<size_t>(M * V));
  ex.final_logits(w.output, x, M, w.output_norm, hp.rms_eps, logits.data());
  for (const Part& p : parts)
    std::copy_n(logits.data() + p.qoff * V, p.m() * V, p.req->logits);
}

void forward(const HParams& hp, const ForwardWeights& w, Executor& ex, const ForwardRequest& req) {
  forward_batch(hp, w, ex, std::span<const ForwardRequest>(&req, 1));
}

}  // namespace dllm::model
