// The reference executor: portable, exact, threaded C++ with no hand-written SIMD. Weights stay
// quantized in the file's mapping and are dequantized one weight row at a time (quant::dequantize_row)
// while multiplying; sums accumulate in double. Each output value is computed by one thread in a fixed
// order, so results do not depend on the thread count. It is the oracle every fast path is tested against.
//
// Two arithmetics (Activations): F32 multiplies the f32 activations with the dequantized weights (the exact
// product of what the file stores; the float64 forward of tests/data/logits). Quantized computes what
// llama.cpp's CPU kernels and the JIT kernels compute: the activation row quantized as ggml does
// (Q8_K for Q4_K / Q5_K / Q6_K weights, Q8_0 for Q8_0 weights), each block's integer dot product exact,
// its scaled value and the row's sum in double; other weight types stay on f32 activations, as the JIT's
// fallback does. A fast path with int8 activations must equal it up to float rounding of the sums.
#pragma once
#include <vector>

#include "model/executor.h"
#include "common/thread_pool.h"

namespace dllm::model {

class ReferenceExecutor : public Executor {
 public:
  enum class Activations { F32, Quantized };
  // The pool must outlive the executor.
  explicit ReferenceExecutor(ThreadPool& pool, Activations acts = Activations::F32);

  std::string name() const override { return acts_ == Activations::F32 ? "reference" : "reference (int8 activations)"; }
  Activations activations() const { return acts_; }
  WeightHandle prepare_weight(const gguf::TensorInfo& tensor) override;
  void matmul(WeightHandle w, const float* x, int64_t rows, float* y) override;
  void attention(const AttentionShape& shape, const float* q, int64_t n_q, const float* k, const float* v,
                 int64_t n_kv, float* out) override;

 private:
  struct Weight {
    gguf::TensorInfo tensor;  // a copy (an expert's slice is a temporary); data points into the mapping; no name
    int64_t n, k;                    // rows, values per row
  };
  const Weight& weight(WeightHandle h) const;

  // The quantized-activations product of one matrix whose type has an integer dot (Quantized mode).
  void matmul_quantized(const Weight& w, const float* x, int64_t rows, float* y);

  ThreadPool& pool_;
  Activations acts_;
  std::vector<Weight> weights_;
  std::vector<uint8_t> acts_scratch_;  // the quantized activation rows of one matmul
  // Per-thread scratch, indexed by the pool's thread index: dequantized weight rows, attention
  // scores and one head's output accumulator.
  std::vector<std::vector<float>> rows_scratch_;
  std::vector<std::vector<double>> attn_scratch_;
};

}  // namespace dllm::model
