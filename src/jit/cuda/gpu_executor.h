// The GPU executor: model::Executor on an NVIDIA GPU (or any Device). prepare_weight() repacks each
// Q4_K / Q6_K / Q8_0 matrix for the int8 tensor-core GEMM and uploads it once; the weights then live in
// device memory. The per-call interface (matmul, attention, lm_head on host rows) works as the interface
// asks, copying activations up and results down each call; run_forward() runs the whole forward pass on
// the device (GpuForward) with only the requested logits coming back, which is what --device gpu uses
// once the model layer calls it (see the proposed Executor hook in the report / gpu_forward.h).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "jit/cuda/gpu_forward.h"
#include "jit/cuda/gpu_ops.h"
#include "model/executor.h"
#include "model/forward.h"
#include "model/thread_pool.h"

namespace dllm::jit::cuda {

class GpuExecutor : public model::Executor {
 public:
  // Runs on `device` (owned). The pool repacks weights at load and dequantises embeddings per step.
  GpuExecutor(std::unique_ptr<Device> device, ThreadPool& pool);
  // Opens GPU `ordinal` through the Driver API. Throws dllm::Error (see CudaDevice::open).
  static std::unique_ptr<GpuExecutor> open(ThreadPool& pool, int ordinal = 0);
  ~GpuExecutor() override;

  std::string name() const override { return "gpu"; }
  // Throws dllm::Error naming the tensor when its type has no GPU kernel (F16, F32, Q5_K, ...).
  model::WeightHandle prepare_weight(const gguf::TensorInfo& tensor) override;
  void matmul(model::WeightHandle w, const float* x, int64_t rows, float* y) override;
  // One upload and one activation quantisation for all the products of x (Q/K/V; gate/up).
  void matmul_shared(const model::WeightHandle* ws, float* const* ys, int n, const float* x, int64_t rows) override;
  void attention(const model::AttentionShape& shape, const float* q, int64_t n_q, const float* k, const float* v,
                 int64_t n_kv, float* out) override;

  // The whole forward pass on the device (the proposed Executor::forward hook): same contract and
  // errors as model::forward. `weights` must be the ForwardWeights prepared with this executor.
  // Returns false, doing nothing, for requests it does not handle (the dual cache's Fill / Reuse
  // passes): the caller then runs model::forward, which uses the per-call operations above.
  bool run_forward(const model::HParams& hp, const model::ForwardWeights& weights,
                   const model::ForwardRequest& req);

  Device& device() { return *dev_; }
  const GpuWeight& weight(model::WeightHandle h) const;
  size_t weight_bytes() const { return weight_bytes_; }  // device memory held by the weights
  // Profiling of run_forward (DLLM_GPU_PROFILE=1 enables it at construction).
  bool profiling() const { return profiling_; }
  const GpuProfile* profile() const { return forward_ ? &forward_->profile() : nullptr; }
  // Lines for --verbose: device, kernel compile/load time, weight memory, cache notes.
  std::vector<std::string> describe() const;

 private:
  std::unique_ptr<Device> dev_;
  ThreadPool& pool_;
  std::vector<GpuWeight> weights_;
  size_t weight_bytes_ = 0;
  KernelSet matmul_kernels_;  // the GEMMs + quantisers of the per-call path, compiled at first use
  bool profiling_ = false;
  std::unique_ptr<GpuForward> forward_;
  const model::ForwardWeights* forward_weights_ = nullptr;
  // per-call scratch
  ActPair act_;
  Scratch x_, y_, q_, k_, v_, qh_, kh_, vt_, out_;
  std::vector<std::string> notes_;
};

// What `run --verbose` and `run --json` say about the executor that ran, asked for after the generation:
// for a GpuExecutor its describe() lines and, when DLLM_GPU_PROFILE=1 made it profile whole-model
// passes, the per-step split (GEMM, attention, LM head, transfers); nothing for other executors.
struct ExecutorReport {
  bool gpu = false;           // the executor was a GpuExecutor
  size_t weight_bytes = 0;    // device memory of its weights: what one whole-model pass reads
  std::vector<std::string> lines;
  bool profiled = false;  // profile holds the split of `profile.steps` whole-model passes
  GpuProfile profile;
};
ExecutorReport executor_report(const model::Executor& executor);

}  // namespace dllm::jit::cuda
