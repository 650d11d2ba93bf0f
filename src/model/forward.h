// The transformer forward pass of llada, dream, llada-moe and rnd1 over one canvas (algorithms.md 1.4), written once on
// top of the Executor interface: embedding, per layer RMSNorm -> Q/K/V (+ biases) -> RoPE ->
// bidirectional GQA -> output projection -> residual -> RMSNorm -> SwiGLU FFN -> residual, then the final
// norm and the LM head for the requested rows only. Activations are f32; element-wise work accumulates
// in double. Rows whose logits are not requested skip the last layer's attention output, FFN, final norm
// and LM head (they cannot influence any requested row after the last layer's keys and values).
// For LLaDA's dual cache a pass can also keep every layer's keys/values (KVCache) and a later pass can
// recompute only a block of positions against them (CacheMode).
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "model/arch.h"
#include "model/executor.h"

namespace dllm::model {

// The weights of one model, prepared for one executor: matrices (prepare_weight) and 1-D tensors (norm
// weights, biases: decoded to f32 and handed to prepare_vector) stay with the executor.
struct ForwardWeights {
  struct Layer {
    VectorHandle attn_norm, ffn_norm;
    VectorHandle bq, bk, bv;  // invalid when the architecture has no Q/K/V biases
    WeightHandle wq, wk, wv, wo, ffn_gate, ffn_up, ffn_down;  // ffn_*: dense layers only
    VectorHandle q_norm, k_norm;  // per-head q/k norms (qk_norm architectures), else invalid
    MoeLayer moe;                 // mixture-of-experts layers (n_expert > 0)
    // diffusion-gemma: post-norms (invalid elsewhere), the shared MLP is ffn_gate/up/down beside moe, and the
    // per-layer scalars of prompt (encoder) and canvas (decoder) rows
    VectorHandle post_attn_norm, post_ffw_norm_1, pre_ffw_norm_2, post_ffw_norm_2, post_ffw_norm;
    float enc_scale = 1, dec_scale = 1;
  };
  const gguf::TensorInfo* token_embd = nullptr;  // rows are dequantized on lookup
  VectorHandle output_norm;
  WeightHandle output;
  std::vector<Layer> layers;
  std::vector<float> rope_freqs;  // diffusion-gemma's global layers (empty: none)
  // diffusion-gemma's self-conditioning MLP (invalid when the file has none)
  VectorHandle sc_pre_norm;
  WeightHandle sc_gate, sc_up, sc_down;
};

// Expert e of a 3-D expert tensor [k, n, E] as a 2-D tensor [k, n] over the same bytes, named
// "NAME[e]" in `name` (which must outlive the returned value's use).
gguf::TensorInfo expert_slice(const gguf::TensorInfo& t, int64_t e, std::string& name);
// Rows [r0, r0 + n) of a 2-D tensor as a 2-D tensor over the same bytes, named "NAME[r0:r0+n]" in `name`
// (the gate and up halves of a fused gate_up matrix).
gguf::TensorInfo row_slice(const gguf::TensorInfo& t, int64_t r0, int64_t n, std::string& name);

ForwardWeights prepare_forward_weights(const HParams& hp, const ModelTensors& tensors, Executor& executor);

// Keys (after RoPE) and values of every canvas position in every layer, kept by the executor for LLaDA's
// dual cache (algorithms.md 3.12): one per sequence, released when it is destroyed or reset.
class KVCache {
 public:
  KVCache() = default;
  ~KVCache() { reset(); }
  KVCache(const KVCache&) = delete;
  KVCache& operator=(const KVCache&) = delete;
  void reset();  // frees the executor's store
  bool empty() const { return n == 0; }

  int64_t n = 0;  // canvas length the cache was filled for (Fill), or positions encoded (Extend); 0 = empty
  int64_t capacity = 0;  // positions the executor's store has room for
  KvHandle handle;
  Executor* owner = nullptr;
};

// A sequence's cached prefix copied out (the keys and values of its cache.n positions, Executor::kv_read's
// layout) and into an empty cache (opened with every layer's width and room for `capacity` positions, the
// first `positions` of `data`'s `data_positions` written): the cross-request prefix cache (prefix_cache.h).
std::vector<float> read_prefix(const KVCache& cache);
void restore_prefix(const HParams& hp, Executor& ex, KVCache& cache, int64_t positions, std::span<const float> data,
                    int64_t data_positions, int64_t capacity);

// How a pass uses a KVCache.
enum class CacheMode {
  None,    // the exact pass; the cache is not touched
  Fill,    // the exact pass, and every layer's keys/values of all positions are stored in the cache
  Reuse,   // only positions [row_begin, row_end) are computed, against the cached keys/values of the
           // other positions; their own keys/values overwrite the cache's (approximate by design)
  // Architectures with a causal prompt (HParams::prompt_regions) and an exact prompt KV cache:
  Extend,  // positions [cache->n, tokens.size()) are computed against the cached keys/values of [0, cache->n)
           // and their own, and appended to the cache (cache->n becomes tokens.size()): the prompt encoded
           // once (an empty cache is opened); must all lie in the prompt (tokens.size() <= n_prompt)
  Prefix,  // the same computation, the cache left as it was: a canvas step against the cached prompt
};

// One sequence's part of a forward pass. tokens: its whole canvas (token i sits at position i).
// logit_rows: canvas positions whose raw logits are wanted, in the order they are written to `logits`
// ([logit_rows.size(), n_vocab], row-major); any order, repeats allowed. Logits are raw rows: Dream's
// shift is the sampler's business. With CacheMode::Reuse the logit rows must lie in [row_begin, row_end)
// and the cache must have been filled for a canvas of the same length.
struct ForwardRequest {
  std::span<const int32_t> tokens;
  std::span<const int64_t> logit_rows;
  float* logits = nullptr;
  KVCache* cache = nullptr;
  CacheMode cache_mode = CacheMode::None;
  int64_t row_begin = 0, row_end = 0;  // Reuse: the positions recomputed
  // Architectures with prompt regions: tokens [0, n_prompt) are the prompt, the rest the canvas.
  int64_t n_prompt = 0;
  // Self-conditioning (diffusion-gemma): the previous step's raw logits of every canvas position
  // ([tokens.size() - n_prompt, n_vocab], host memory) at this temperature; null = none.
  const float* self_cond_logits = nullptr;
  float self_cond_temperature = 1;
  int64_t self_cond_top_k = 0;  // > 0: each row's top_k most probable tokens only (Executor::soft_embed)
};

// The forward program of one pass as an architecture's layer builder (ArchSpec::build_layer) sees it: the
// blocks a layer is made of, each a few executor operations over the whole batch. The residual stream x
// holds every computed row of every sequence; at the last layer, once the keys and values are stored,
// only the rows whose logits are wanted go on.
class LayerProgram {
 public:
  virtual ~LayerProgram() = default;
  // RMSNorm -> Q/K/V (+ biases) -> per-head q/k norms (qk_norm) -> RoPE -> keys/values stored per sequence -> bidirectional attention per
  // sequence -> output projection -> residual.
  virtual void self_attention(int64_t layer) = 0;
  // RMSNorm -> gate/up -> SwiGLU -> down projection -> residual.
  virtual void swiglu_ffn(int64_t layer) = 0;
  // RMSNorm -> router, top-k -> per expert: gate/up -> SwiGLU -> down over its rows -> weighted sum ->
  // residual (Executor::moe_ffn).
  virtual void moe_ffn(int64_t layer) = 0;
  // Gemma-4: a shared GeGLU MLP and the routed experts side by side over the same residual, each post-normed,
  // summed, normed and added: x += post_ffw_norm(post_ffw_norm_1(mlp(ffn_norm(x))) +
  // post_ffw_norm_2(experts(pre_ffw_norm_2(x)))).
  virtual void parallel_ffn(int64_t layer) = 0;
  // The whole residual times the layer's scalar of each row's region (prompt: encoder, canvas: decoder).
  virtual void region_scale(int64_t layer) = 0;
};

// Throws dllm::Error for an empty canvas, a canvas longer than the context, an id outside the
// vocabulary or a row outside the canvas (messages name the offending value and its position).
void check_canvas(const HParams& hp, std::span<const int32_t> tokens, std::span<const int64_t> logit_rows);

// One forward pass over a batch of sequences: every sequence's computed rows go through each operation
// together (one GEMM per weight for the whole batch), attention runs per sequence over its own keys and
// values. A sequence's logits are bit-identical whichever other sequences share the batch (every operation
// works row by row). Checks every request first (check_canvas and the cache's rules; dllm::Error).
void forward_batch(const HParams& hp, const ForwardWeights& weights, Executor& executor,
                   std::span<const ForwardRequest> requests);
// One sequence.
void forward(const HParams& hp, const ForwardWeights& weights, Executor& executor, const ForwardRequest& request);

}  // namespace dllm::model
