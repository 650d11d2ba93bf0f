// The executor interface: the few heavy operations the forward pass (forward.cpp) asks of a backend.
// At load the model hands each weight matrix to prepare_weight() once; per step it multiplies f32
// activation rows by prepared weights, runs bidirectional attention over the canvas, and sends the rows
// the sampler reads through the LM head. Element-wise work (embedding lookup, RMSNorm, RoPE, SwiGLU,
// residuals) stays in forward.cpp.
//
// Implementations: ReferenceExecutor (reference_executor.h: portable C++, the oracle of every test),
// and later a JIT CPU executor and a GPU executor in src/jit. Nothing here knows which one runs.
#pragma once
#include <cstdint>
#include <string>

#include "model/gguf.h"

namespace dllm::model {

struct HParams;
struct ForwardWeights;
struct ForwardRequest;

// Opaque handle of a prepared weight; only the executor that returned it knows what it refers to.
struct WeightHandle {
  int32_t index = -1;
  bool valid() const { return index >= 0; }
};

// Geometry of one attention call. Query rows and key/value rows are separate so that a caller can ask
// for a subset of query rows (the last layer computes only the rows whose logits are wanted) or, later,
// recompute a block's rows against keys/values cached for the other positions (dual cache).
struct AttentionShape {
  int64_t n_head = 0;     // query heads H
  int64_t n_head_kv = 0;  // key/value heads Hkv; query head h reads kv head h / (H / Hkv)
  int64_t head_dim = 0;   // d
  float scale = 0;        // applied to q.k: 1/sqrt(d)
};

class Executor {
 public:
  virtual ~Executor() = default;

  // Short name for diagnostics ("reference", ...).
  virtual std::string name() const = 0;

  // Load time: prepare a 2-D weight tensor of `n` rows (ne1) of `k` values (ne0), stored as the file
  // stores it (any type quant::can_dequantize accepts). The tensor's bytes live in the file's mapping,
  // which outlives the executor. An implementation may repack; it must never expand a whole model to f32.
  virtual WeightHandle prepare_weight(const gguf::TensorInfo& tensor) = 0;

  // y[r][j] = sum_c x[r][c] * W[j][c] for r < rows, j < n:  x is [rows, k] and y is [rows, n], both f32
  // row-major with rows packed (stride k and n). No bias. Rows are independent: the result of a row
  // must not depend on which other rows are in the call.
  virtual void matmul(WeightHandle w, const float* x, int64_t rows, float* y) = 0;

  // Several products of the same input: ys[i] = x times ws[i] (each as matmul). Backends that quantise
  // activations do it once here for all of them (Q, K and V; gate and up).
  virtual void matmul_shared(const WeightHandle* ws, float* const* ys, int n, const float* x, int64_t rows) {
    for (int i = 0; i < n; ++i) matmul(ws[i], x, rows, ys[i]);
  }

  // Bidirectional (non-causal, unmasked) grouped-query attention.
  // q: [n_q, H*d] (already RoPE'd), k and v: [n_kv, Hkv*d] (k RoPE'd), out: [n_q, H*d].
  // out[i][h] = sum_j softmax_j(scale * q[i][h] . k[j][g]) * v[j][g], g = h / (H / Hkv), heads
  // concatenated in head order. A query row's result must not depend on the other query rows.
  virtual void attention(const AttentionShape& shape, const float* q, int64_t n_q, const float* k,
                         const float* v, int64_t n_kv, float* out) = 0;

  // A backend that runs the whole forward pass itself (the GPU: weights, activations and caches stay on the
  // device, only the requested logits come back) does it here and returns true; false (the default, and for
  // requests it does not take) lets forward.cpp drive the pass through the operations above.
  virtual bool run_forward(const HParams& hp, const ForwardWeights& weights, const ForwardRequest& request) {
    return false;
  }

  // The LM head: `rows` final-normed rows [rows, D] times the output weight -> logits [rows, n_vocab].
  // The caller passes only the rows it needs logits for. Same contract as matmul; a backend may
  // override it (the vocabulary projection is the largest matrix of all).
  virtual void lm_head(WeightHandle output, const float* x, int64_t rows, float* logits) {
    matmul(output, x, rows, logits);
  }
};

}  // namespace dllm::model
