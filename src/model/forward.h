// The transformer forward pass of llada and dream over one canvas (algorithms.md 1.4), written once on
// top of the Executor interface: embedding, per layer RMSNorm -> Q/K/V (+ biases) -> RoPE ->
// bidirectional GQA -> output projection -> residual -> RMSNorm -> SwiGLU FFN -> residual, then the final
// norm and the LM head for the requested rows only. Activations are f32; element-wise work accumulates
// in double. Rows whose logits are not requested skip the last layer's attention output, FFN, final norm
// and LM head (they cannot influence any requested row after the last layer's keys and values).
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "model/arch.h"
#include "model/executor.h"
#include "model/thread_pool.h"

namespace dllm::model {

// The weights of one model, prepared for one executor. 1-D tensors (norm weights, biases: a few
// thousand values each) are decoded to f32 here; matrices stay with the executor.
struct ForwardWeights {
  struct Layer {
    std::vector<float> attn_norm, ffn_norm;
    std::vector<float> bq, bk, bv;  // empty when the architecture has no Q/K/V biases
    WeightHandle wq, wk, wv, wo, ffn_gate, ffn_up, ffn_down;
  };
  const gguf::TensorInfo* token_embd = nullptr;  // rows are dequantized on lookup
  std::vector<float> output_norm;
  WeightHandle output;
  std::vector<Layer> layers;
};

ForwardWeights prepare_forward_weights(const HParams& hp, const ModelTensors& tensors, Executor& executor);

// One forward pass. tokens: the whole canvas (token i sits at position i). logit_rows: canvas positions
// whose raw logits are wanted, in the order they are written to `logits` ([logit_rows.size(), n_vocab],
// row-major); any order, repeats allowed. Logits are raw rows: Dream's shift is the sampler's business.
//
// Room to grow: a dual-cache mode will add "rows to compute" plus keys/values of the other positions
// supplied by the caller; Executor::attention already takes query rows and key/value rows separately.
struct ForwardRequest {
  std::span<const int32_t> tokens;
  std::span<const int64_t> logit_rows;
  float* logits = nullptr;
};

// Throws dllm::Error for an empty canvas, a canvas longer than the context, an id outside the
// vocabulary or a row outside the canvas (messages name the offending value and its position).
void check_canvas(const HParams& hp, std::span<const int32_t> tokens, std::span<const int64_t> logit_rows);

void forward(const HParams& hp, const ForwardWeights& weights, Executor& executor, ThreadPool& pool,
             const ForwardRequest& request);

}  // namespace dllm::model
