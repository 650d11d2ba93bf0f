// The reference executor: portable, exact, threaded C++ with no hand-written SIMD. Weights stay
// quantized in the file's mapping and are dequantized one weight row at a time (quant::dequantize_row)
// while multiplying; sums accumulate in double. Each output value is computed by one thread in a fixed
// order, so results do not depend on the thread count. It is the oracle every fast path is tested against.
#pragma once
#include <vector>

#include "model/executor.h"
#include "common/thread_pool.h"

namespace dllm::model {

class ReferenceExecutor : public Executor {
 public:
  // The pool must outlive the executor.
  explicit ReferenceExecutor(ThreadPool& pool);

  std::string name() const override { return "reference"; }
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

  ThreadPool& pool_;
  std::vector<Weight> weights_;
  // Per-thread scratch, indexed by the pool's thread index: dequantized weight rows, attention
  // scores and one head's output accumulator.
  std::vector<std::vector<float>> rows_scratch_;
  std::vector<std::vector<double>> attn_scratch_;
};

}  // namespace dllm::model
