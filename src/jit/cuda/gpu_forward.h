// The whole transformer forward pass on the GPU: the canvas's embeddings go up once per step, every
// layer runs on the device (RMSNorm fused into the activation quantiser, Q/K/V/O and FFN products on int8
// tensor cores, bias + RoPE fused into the f16 packing for flash attention, SwiGLU fused into the
// quantiser of the down projection, residual additions fused into the GEMM epilogue), and only the
// logits of the requested rows come back. Same contract as model::forward (forward.h).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "jit/cuda/gpu_ops.h"
#include "model/forward.h"
#include "model/thread_pool.h"

namespace dllm::jit::cuda {

// Per-step time split, measured only when profiling (DLLM_GPU_PROFILE=1): the device is synchronised
// after every group of kernels, which slows the step down, so these numbers are not for benchmarking.
struct GpuProfile {
  int steps = 0;
  double gemm_s = 0;       // activation quantisers + projections of every layer
  double attention_s = 0;  // head packing + flash attention
  double lm_head_s = 0;    // final norm + vocabulary projection
  double transfer_s = 0;   // embeddings up, logits down
  // Mean milliseconds per step of one of the totals above (0 before the first step).
  double per_step_ms(double total_s) const { return steps > 0 ? 1e3 * total_s / steps : 0.0; }
  std::string report() const;  // one line for --verbose
};

class GpuForward {
 public:
  // weights: the uploaded matrices, indexed by WeightHandle (GpuExecutor's table). Uploads the norm
  // weights and biases, and compiles (or loads from the cache) the model's kernel unit.
  GpuForward(Device& dev, ThreadPool& pool, const model::HParams& hp, const model::ForwardWeights& fw,
             const std::vector<GpuWeight>& weights, const model::Executor& host);

  // Checks the request like model::forward (same errors) and writes the logits of the requested rows.
  void forward(const model::ForwardRequest& req);

  void set_profiling(bool on) { profiling_ = on; }
  const GpuProfile& profile() const { return profile_; }
  // Device memory the forward pass itself needs for a canvas of n rows and m logit rows.
  static size_t workspace_bytes(const model::HParams& hp, int64_t n, int64_t m);

 private:
  struct LayerBuffers {
    DeviceBuffer attn_norm, ffn_norm, bq, bk, bv;
  };
  const GpuWeight& weight(model::WeightHandle h) const;
  void ensure_positions(int64_t n);
  template <class F>
  void timed(double& slot, F&& f);

  Device& dev_;
  ThreadPool& pool_;
  const model::HParams hp_;
  const model::ForwardWeights& fw_;
  const std::vector<GpuWeight>& weights_;
  std::vector<LayerBuffers> layers_;
  DeviceBuffer output_norm_;
  // RoPE tables and row positions 0..cap-1
  int64_t pos_cap_ = 0;
  DeviceBuffer cos_, sin_, pos_;
  // per-step scratch
  ActPair act_;
  Scratch x_, qf_, kf_, vf_, qh_, kh_, vt_, att_, gate_, up_, rows_, logits_;
  std::vector<float> host_x_;
  bool profiling_ = false;
  GpuProfile profile_;
};

}  // namespace dllm::jit::cuda
