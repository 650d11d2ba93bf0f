// The GPU executor: model::Executor on an NVIDIA GPU (or any Device). prepare_weight() uploads each matrix
// once (Q4_K as the file's bytes, the other types repacked for the int8 tensor-core GEMM); the weights then
// live in device memory. The forward program's operations (executor.h) run on the device over device-resident
// buffers kept across steps: the embeddings go up once per step, RMSNorm is fused into the activation
// quantiser, Q/K/V/O and FFN products run on int8 tensor cores with the residual additions fused into
// the GEMM epilogue, SwiGLU is fused into the quantiser of the down projection, bias + RoPE into the f16
// packing for flash attention, and only the requested logits come back. The per-call primitives
// (matmul, attention on host rows) work as the interface asks, copying up and down each call.
// Operations without device kernels yet (Gemma-4's post-norms, GELU-tanh GeGLU, region scalars, the
// self-conditioning soft embedding, the experts' routing) run as the default host operations on a host
// mirror of the activations they touch (on_host), their products still on the device through the
// per-call primitives; attention takes each row's key range (a causal prompt, the canvas, sliding windows)
// in the flash kernel, and every layer its own head geometry and RoPE table. Row gathers and scatters are one
// dllm_copy_rows launch each. From the second pass on, each forward pass (embed() to final_logits()) is recorded
// and launched as one CUDA Graph (device.h); a pass that needs the host on the way turns that off for the executor.
#pragma once
#include <initializer_list>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "jit/cuda/gpu_ops.h"
#include "model/executor.h"
#include "model/forward.h"
#include "common/thread_pool.h"

namespace dllm::jit::cuda {

// Per-step time split, measured only when profiling (DLLM_GPU_PROFILE=1): the device is synchronised
// around every operation, which slows the step down, so these numbers are not for benchmarking. A step
// is one pass of the forward program (one embed()).
struct GpuProfile {
  int steps = 0;
  double gemm_s = 0;       // activation quantisers + projections of every layer
  double attention_s = 0;  // key/value stores, head packing + flash attention
  double lm_head_s = 0;    // final norm + vocabulary projection
  double transfer_s = 0;   // embeddings up, logits down, row gathers on the device
  bool timers = false;     // timed by the device's timers (events on its stream), else synchronised per group
  // Mean milliseconds per step of one of the totals above (0 before the first step).
  double per_step_ms(double total_s) const { return steps > 0 ? 1e3 * total_s / steps : 0.0; }
  std::string report() const;  // one line for --verbose
};

class GpuExecutor : public model::Executor {
 public:
  // Runs on `device` (owned). The pool repacks weights at load and dequantises embeddings per step.
  GpuExecutor(std::unique_ptr<Device> device, ThreadPool& pool);
  // Opens GPU `ordinal` through the Driver API. Throws dllm::Error (see CudaDevice::open).
  static std::unique_ptr<GpuExecutor> open(ThreadPool& pool, int ordinal = 0);
  ~GpuExecutor() override;

  std::string name() const override { return "gpu"; }
  // Notes the model's attention geometry, so that one kernel unit holds everything its passes launch.
  // Throws dllm::Error for a head geometry the attention kernel cannot take.
  void prepare_model(const model::HParams& hp) override;
  // Throws dllm::Error naming the tensor when its type has no GPU kernel (F16, F32, ...).
  model::WeightHandle prepare_weight(const gguf::TensorInfo& tensor) override;
  // Q, K(, V) and gate, up of tiled formats: one launch each (a GemmGroupDesc in the model's unit).
  void prepare_shared(const model::WeightHandle* ws, int n) override;
  void prepare_swiglu_ffn(model::WeightHandle gate, model::WeightHandle up, model::WeightHandle down) override;
  void prepare_output_projection(model::WeightHandle wo) override;
  void matmul(model::WeightHandle w, const float* x, int64_t rows, float* y) override;
  // One upload and one activation quantisation for all the products of x (Q/K/V; gate/up).
  void matmul_shared(const model::WeightHandle* ws, float* const* ys, int n, const float* x, int64_t rows) override;
  // Every group's products (a mixture-of-experts layer's experts) with one upload, one quantisation and one download.
  void matmul_grouped(const model::WeightHandle* ws, float* const* ys, int m, const int64_t* row0, const int64_t* n,
                      int groups, const float* x, int64_t k) override;
  void attention(const model::AttentionShape& shape, const float* q, int64_t n_q, const float* k, const float* v,
                 int64_t n_kv, float* out) override;

  // --- the forward program's operations, on the device ---
  model::VectorHandle prepare_vector(std::span<const float> v) override;
  model::Act activation(int32_t slot, int64_t rows, int64_t cols) override;
  void embed(const gguf::TensorInfo& table, std::span<const int32_t> ids, model::Act x) override;
  void norm_matmul(model::Act x, int64_t rows, model::VectorHandle norm, float eps, const model::WeightHandle* ws,
                   const model::Act* ys, int n) override;
  void matmul_add(model::WeightHandle w, model::Act x, int64_t rows, model::Act y) override;
  void swiglu_matmul_add(model::WeightHandle w, model::Act gate, model::Act up, int64_t rows, model::Act y) override;
  // The gate/up launch quantises silu(gate) * up for the down projection (gpu_gemm_group_swiglu), when prepare_swiglu_ffn
  // announced the three and fusion is on: 3 kernels instead of 4. Otherwise the two ops.
  void norm_swiglu_ffn(model::Act x, int64_t rows, model::VectorHandle norm, float eps, model::WeightHandle gate_w,
                       model::WeightHandle up_w, model::WeightHandle down_w, model::Act gate, model::Act up) override;
  // attend() quantises its rows for the announced output projection (the quantising attention) when it can; matmul_add
  // then skips its quantiser if every row came that way.
  void expect_projection(model::Act out, int64_t rows, model::WeightHandle w) override;
  // Fusion of the quantisers into their producers (norm_swiglu_ffn, expect_projection): on by default; tests turn it off
  // to compare bits.
  void set_fusion(bool on) { fusion_ = on; }
  void glu_matmul(model::Glu glu, model::WeightHandle w, model::Act gate, model::Act up, int64_t rows,
                  model::Act y) override;
  void matmul_norm_add(model::WeightHandle w, model::Act x, int64_t rows, model::VectorHandle norm, float eps,
                       model::Act y) override;
  void norm(model::Act x, int64_t rows, model::VectorHandle norm, float eps, model::Act y) override;
  void norm_add(model::Act x, int64_t rows, model::VectorHandle norm, float eps, model::Act y) override;
  void add(model::Act x, int64_t rows, model::Act y) override;
  void scale_rows(model::Act x, std::span<const float> s) override;
  void soft_embed(const gguf::TensorInfo& table, const float* logits, int64_t rows, float temperature, int64_t top_k,
                  float scale, model::Act x) override;
  void gather(model::Act src, std::span<const int64_t> rows, model::Act dst) override;
  void scatter(model::Act src, std::span<const int64_t> rows, model::Act dst) override;
  // Mixture-of-experts layers: the rows go to the host for the per-head norms and the router (a few values
  // per row), the experts' GEMMs run on the device (matmul_shared / matmul per expert over its rows).
  void head_norm(model::Act x, int64_t rows, int64_t n_heads, int64_t head_dim, model::VectorHandle w,
                 float eps) override;
  void moe_ffn(const model::MoeLayer& m, model::Act x, int64_t rows, model::VectorHandle norm, float eps) override;
  void moe_ffn_to(const model::MoeLayer& m, model::Act x, int64_t rows, model::VectorHandle norm, float eps,
                  model::Act out) override;
  // One buffer for the keys and one for the values, each layer's positions at its own width.
  model::KvHandle kv_open(std::span<const int64_t> widths, int64_t positions) override;
  void kv_close(model::KvHandle kv) override;
  void kv_grow(model::KvHandle kv, int64_t positions) override;
  std::vector<float> kv_read(model::KvHandle kv, int64_t positions) override;
  void kv_write(model::KvHandle kv, int64_t positions, std::span<const float> data, int64_t data_positions) override;
  void kv_store(model::KvHandle kv, int64_t layer, model::Act k, model::Act v, int64_t row0, int64_t rows,
                int64_t pos0, model::VectorHandle bk, model::VectorHandle bv, const model::RopeSpec& rope,
                const model::AttentionShape& shape) override;
  void attend(model::KvHandle kv, int64_t layer, int64_t n_kv, model::Act q, int64_t row0,
              std::span<const int64_t> positions, model::VectorHandle bq, const model::RopeSpec& rope,
              const model::AttentionShape& shape, model::Act out, std::span<const model::KeyRange> ranges) override;
  void final_logits(model::WeightHandle output, model::Act x, int64_t rows, model::VectorHandle norm, float eps,
                    float* logits) override;

  Device& device() { return *dev_; }
  const GpuWeight& weight(model::WeightHandle h) const;
  size_t weight_bytes() const { return weight_bytes_; }  // device memory held by the weights
  // Device memory the forward program needs besides the weights for a batch of n computed rows and m
  // logit rows (activations, quantised activations, packed heads, logits, RoPE tables, one layer's
  // key/value store; a dual cache adds n_layer * n * kv_dim * 8 bytes per sequence).
  static size_t workspace_bytes(const model::HParams& hp, int64_t n, int64_t m);
  // Profiling of the forward program's operations (DLLM_GPU_PROFILE=1 enables it at construction).
  bool profiling() const { return profiling_; }
  const GpuProfile* profile() const {
    settle_profile();
    return &profile_;
  }
  // Lines for --verbose: device, kernel compile/load time, weight memory, cache notes, graphs, the profile.
  std::vector<std::string> describe() const;
  // "gpu graphs: on, 12 step(s) as one graph each (1 built, 11 updated), 0 cut short", or off and why.
  std::string graphs_line() const;

 private:
  // An activation slot: f32 [rows, cols] row-major.
  struct DevAct {
    Scratch buf;
    int64_t rows = 0, cols = 0;
  };
  // A sequence's keys and values: the raw f32 projections, [layers][positions][kv_dim] each, as the
  // GEMM wrote them; bias and RoPE are applied when attend() packs a layer's heads (so positions can be
  // overwritten in any order and the layout stays the GEMM's). The biases each layer was stored with.
  struct DevKv {
    int64_t layers = 0, positions = 0;
    std::vector<int64_t> width;  // per layer: Hkv * d
    std::vector<int64_t> first;  // per layer: its first float (layer l holds positions * width[l] floats)
    DeviceBuffer k, v;
    std::vector<model::VectorHandle> bk, bv;
    void lay_out(std::span<const int64_t> widths, int64_t positions);  // widths, first, positions
    size_t bytes() const;  // of k (and of v)
    DevAddr k_at(int64_t layer, int64_t pos) const;
    DevAddr v_at(int64_t layer, int64_t pos) const;
  };
  // cos/sin tables of one RoPE flavour (n_rot, base, frequency factors) for positions [0, cap).
  struct RopeTable {
    model::RopeSpec spec;
    int64_t cap = 0;
    DeviceBuffer cos, sin;
  };
  DevAct& act(model::Act a);
  DevAddr at(model::Act a, int64_t row = 0);
  DevAddr vector_addr(model::VectorHandle h) const;
  DevKv& store(model::KvHandle h);
  DeviceBuffer take_buffer(size_t bytes);  // a spare buffer of at least `bytes` or a new one
  void load_model_kernels();
  const RopeTable& ensure_rope(const model::RopeSpec& rope, int64_t n_pos);
  DevAddr positions_addr(std::span<const int64_t> positions);
  DevAddr row_list(std::span<const int64_t> rows);  // the rows uploaded as device ints (for dllm_copy_rows)
  template <class F>
  void timed(double& slot, F&& f);
  // Ends the step's graph capture (if one is open) and launches it, keyed by the step's shape; `logits`: the step
  // ended with final_logits().
  void end_step_graph(bool logits);
  // Runs f (a default host operation of model::Executor) on host mirrors: every slot of `acts` downloaded
  // into the host buffer of the same slot first, those of `outs` (a subset) uploaded after.
  template <class F>
  void on_host(std::initializer_list<model::Act> acts, std::initializer_list<model::Act> outs, F&& f);

  std::unique_ptr<Device> dev_;
  ThreadPool& pool_;
  std::vector<GpuWeight> weights_;
  size_t weight_bytes_ = 0;
  model::HParams hp_;  // what prepare_model() was given (n_embd 0 before it ran)
  KernelSet kernels_;                  // the model's unit: GEMMs, quantisers, head packers, attention
  bool kernels_loaded_ = false;
  AttentionKernels attn_checked_{};  // the attention geometry last found launchable
  bool attn_checked_valid_ = false;
  bool profiling_ = false;
  // The split so far; with device timers (Device::has_timers) the groups' times are read lazily, so the profile
  // never waits inside a step: pending_times_ holds each timed group's marks until settle_profile() adds them up.
  struct PendingTime {
    double* slot;
    size_t from, to;
  };
  mutable GpuProfile profile_;
  mutable std::vector<PendingTime> pending_times_;
  void settle_profile() const;
  // One graph per step (device.h): each forward pass is captured from embed() to final_logits() and launched as
  // one graph, unless DLLM_GPU_GRAPHS=0, profiling, a device without graphs, or a pass that needed the host.
  bool graphs_wanted_ = true;
  std::string graphs_off_;  // why this executor stopped capturing ("" while it captures)
  bool in_capture_ = false;
  std::vector<int64_t> step_key_;  // the captured step's shape: rows, each attention's (rows, keys, ranges), logit rows
  // the forward program's state
  std::vector<DeviceBuffer> vectors_;  // by VectorHandle (empty buffer: an empty vector)
  std::map<int32_t, DevAct> acts_;
  std::vector<std::unique_ptr<DevKv>> kv_;  // null = closed (index reused)
  std::vector<DeviceBuffer> spare_;         // buffers of closed stores, reused by kv_open
  ActPair act_;
  GemmWorkspace gemm_ws_;  // the small-row GEMMs' chunk sums and counters
  ActBuffers act_ffn_;     // silu(gate) * up quantised by the gate/up launch, beside act_ (which that launch reads)
  ActBuffers act_att_;     // the attention output quantised by the attention's launches
  struct Projection {      // what expect_projection announced, and how many rows attend() quantised since
    int32_t slot = -1, weight = -1;
    int64_t rows = 0, covered = 0;
  } proj_;
  bool fusion_ = true;
  Scratch qh_, kh_, vt_, logits_, gather_, pos_list_, ranges_, row_list_;
  std::vector<float> host_x_, host_y_;  // embeddings going up; matmul_grouped's outputs coming down
  std::vector<RopeTable> ropes_;  // one per RoPE flavour in use (Gemma-4: sliding and global layers)
  int64_t pos_cap_ = 0;
  DeviceBuffer pos_;  // positions 0..pos_cap_-1 (contiguous rows read their positions from it)
  // per-call scratch
  Scratch x_, y_, q_, k_, v_, out_;
};

// What `run --verbose` and `run --json` say about the executor that ran, asked for after the generation:
// for a GpuExecutor its describe() lines and, when DLLM_GPU_PROFILE=1 made it profile the forward
// program, the per-step split (GEMM, attention, LM head, transfers); nothing for other executors.
struct ExecutorReport {
  bool gpu = false;           // the executor was a GpuExecutor
  size_t weight_bytes = 0;    // device memory of its weights: what one whole-model pass reads
  std::vector<std::string> lines;
  bool profiled = false;  // profile holds the split of `profile.steps` forward passes
  GpuProfile profile;
};
ExecutorReport executor_report(const model::Executor& executor);

}  // namespace dllm::jit::cuda
