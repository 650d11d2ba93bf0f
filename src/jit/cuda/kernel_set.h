// The GPU kernels dllm instantiates, described by small descriptor structs (the single source of truth:
// a descriptor gives the kernel's name, its line in the generated source and its launch geometry), and
// KernelSet, an ordered collection of them that generates one CUDA C++ translation unit: the embedded
// device code (kernels/*.cuh) followed by one extern "C" entry point per descriptor, every shape a
// compile-time constant. kernels_for_model() lists everything the GPU forward pass of a model needs.
#pragma once
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "jit/cuda/kernels/params.cuh"
#include "model/arch.h"
#include "model/executor.h"
#include "model/ggml_types.h"

namespace dllm::jit::cuda {

// The weight formats of the int8 tensor-core kernels are the ggml types of the weight table
// (jit/weight_types.h) whose row says `gpu`; gemm.cuh's WT_* constants are their ggml type ids.
using WeightFormat = GgmlType;
// The format for a GGUF type, or false when the GPU has no kernel for it.
bool weight_format_of(GgmlType t, WeightFormat* out);
const char* weight_format_name(WeightFormat f);  // "q8_0", "q4_k", "q5_k", "q6_k"

// Activation quantiser modes (quant.cuh QR_*).
enum class QuantMode : int { Plain = 0, RmsNorm = 1, SwiGlu = 2 };
// ggml's activation formats (quant.cuh ACT_*): Q8_0 for Q8_0 weights, Q8_K for the K-quants (the table's `act`).
enum class ActFormat : int { Q8_0 = 0, Q8_K = 1 };
ActFormat act_format_for(WeightFormat f);
// RoPE styles of pack_heads (quant.cuh PK_*).
enum class PackStyle : int { None = 0, Norm = 1, Neox = 2 };

struct GemmDesc {
  WeightFormat format;
  int64_t n, k;
  auto operator<=>(const GemmDesc&) const = default;
  std::string name() const;  // dllm_gemm_q4_k_n4096_k4096
};
// Two or three tiled GEMMs of one activation (a layer's Q, K, V; K, V; gate, up) in one launch.
struct GemmGroupDesc {
  std::vector<GemmDesc> members;  // 2 or 3 (gemm_group_ok)
  bool swiglu = false;  // a feed-forward's gate and up that also quantise silu(gate) * up for the down projection,
  ActFormat swiglu_act = ActFormat::Q8_K;  // in the down projection's activation format
  auto operator<=>(const GemmGroupDesc&) const = default;
  // dllm_gemmgrp_k4096_q4_k_n4096_q4_k_n1024_q6_k_n1024, ..._swiglu (Q8_K), ..._swiglu_q8_0
  std::string name() const;
};
// True when the products can share a launch: 2 or 3 of them, every one a tiled format, one k (with swiglu: two of one
// width, a multiple of 256).
bool gemm_group_ok(const std::vector<GemmDesc>& members, bool swiglu = false);
// The SwiGLU variant of a gate/up group for this down projection (gemm_group_ok with swiglu, and down reads activations
// of the group's width; they are quantised in down's format), or an empty descriptor when down needs its own quantiser.
GemmGroupDesc swiglu_group(const GemmDesc& gate, const GemmDesc& up, const GemmDesc& down);
struct QuantDesc {
  QuantMode mode;
  ActFormat act;
  int64_t k;
  auto operator<=>(const QuantDesc&) const = default;
  std::string name() const;  // dllm_quant_rmsnorm_q8_k_k4096
};
struct PackDesc {
  int64_t n_head, head_dim, n_rot;
  PackStyle style;
  bool transpose;
  auto operator<=>(const PackDesc&) const = default;
  std::string name() const;  // dllm_pack_h32_d128_r128_norm, ..._none_t
};
// The packs of one attention geometry in one launch: queries and keys with the RoPE style, values transposed.
struct PackQkvDesc {
  int64_t n_head, n_head_kv, head_dim, n_rot;
  PackStyle style;
  auto operator<=>(const PackQkvDesc&) const = default;
  std::string name() const;  // dllm_packqkv_h32_kv8_d128_r128_norm
};
struct AttnDesc {
  int64_t n_head, n_head_kv, head_dim;
  bool quant = false;  // also quantises its output plain for the output projection (attn_quant_ok),
  ActFormat quant_act = ActFormat::Q8_K;  // in its activation format
  auto operator<=>(const AttnDesc&) const = default;
  std::string name() const;  // dllm_attn_h32_kv32_d128, ..._quant (Q8_K), ..._quant_q8_0
};

// Launch geometry (grid x/y, block x) of each kernel for a given number of rows.
struct Launch {
  unsigned grid_x = 1, grid_y = 1, block_x = 1;
  unsigned shared_bytes = 0;  // dynamic shared memory
};
inline constexpr int64_t kRowPad = 64;  // activation rows are padded to a multiple of this
inline int64_t pad_rows(int64_t rows) { return (rows + kRowPad - 1) / kRowPad * kRowPad; }
// k-blocks of 32 per row, padded to a multiple of 4 (quant.cuh KBP).
inline int64_t padded_kblocks(int64_t k) { return act_kblocks(static_cast<int>(k)); }
// 8-column weight tiles, padded to a whole GEMM block (16 tiles).
inline int64_t padded_ntiles(int64_t n) { return (n / 8 + 15) / 16 * 16; }

// arch: 10 * major + minor of the device (0: the emulator), which sets the tiled GEMM's pipeline depth; sms: its SM
// count. Every format takes the small-row kernel at 1-32 rows (kTcSmallRows; split-K over persistent blocks),
// otherwise the wide tiling unless its grid has fewer blocks than SMs or its stages do not fit the device's shared
// memory (Q8_0 on sm_86/87/89; then the split one). All three give every output the same bits. sms 0 (the emulator's
// tests) always takes the wide tiling.
enum class TcTiling { Wide, Split, Small };
TcTiling gemm_tiling(const GemmDesc& d, int64_t rows, int arch, int sms);
Launch gemm_launch(const GemmDesc& d, int64_t rows, int arch, int sms);
std::string gemm_kernel_name(const GemmDesc& d, int64_t rows, int arch, int sms);  // d.name() + "", "_split" or "_small"
// A group's tiling (as one product whose wide grid is the members' together), launch and name.
TcTiling gemm_group_tiling(const GemmGroupDesc& g, int64_t rows, int arch, int sms);
Launch gemm_group_launch(const GemmGroupDesc& g, int64_t rows, int arch, int sms);
std::string gemm_group_kernel_name(const GemmGroupDesc& g, int64_t rows, int arch, int sms);
// The small-row kernel's workspace for one product: bytes of chunk sums and arrival counters (0 with one chunk).
size_t gemm_small_part_bytes(const GemmDesc& d);
size_t gemm_small_counters(const GemmDesc& d);
// True for the weight formats the tiled GEMM (kernels/gemm_tc.cuh) runs: every one with a GPU kernel.
bool tiled_gemm(WeightFormat f);
Launch quant_launch(int64_t rows);
Launch pack_launch(const PackDesc& d, int64_t rows);
// Blocks of a pack_launch (for PackQkvParams::blocks_q / blocks_k); the fused launch has the three counts' sum.
unsigned pack_blocks(const PackDesc& d, int64_t rows);
Launch attn_launch(const AttnDesc& d, int64_t n_q);

// Bytes of the int8 activation fragments, of each f32 scale array and of the int16 sums for `rows` rows of k values.
size_t act_bytes(int64_t rows, int64_t k);
size_t act_scale_bytes(int64_t rows, int64_t k);
size_t act_sum_bytes(int64_t rows, int64_t k);

class KernelSet {
 public:
  void add(const GemmDesc& d) { gemm_.insert(d); }
  void add(const QuantDesc& d) { quant_.insert(d); }
  void add(const PackDesc& d) { pack_.insert(d); }
  void add(const AttnDesc& d) { attn_.insert(d); }
  void add(const PackQkvDesc& d) { pack_qkv_.insert(d); }
  void add(const GemmGroupDesc& d) { group_.insert(d); }
  void add(const KernelSet& other);
  void add_row_copy() { row_copy_ = true; }  // dllm_copy_rows (kRowCopyKernel): the executor's gathers and scatters
  bool contains(const std::string& kernel_name) const;
  bool contains(const GemmGroupDesc& d) const { return group_.count(d) != 0; }  // a set lookup, for every step
  bool contains(const AttnDesc& d) const { return attn_.count(d) != 0; }
  bool empty() const {
    return gemm_.empty() && group_.empty() && quant_.empty() && pack_.empty() && pack_qkv_.empty() && attn_.empty() &&
           !row_copy_;
  }

  // Every entry point, in source order.
  std::vector<std::string> names() const;
  // The complete translation unit (deterministic: the same set always gives the same text).
  std::string source() const;
  // A short name for the unit: "dllm_kernels_" + 16 hex digits of the source's hash.
  std::string unit_name() const;

  const std::set<GemmDesc>& gemms() const { return gemm_; }
  const std::set<GemmGroupDesc>& groups() const { return group_; }
  const std::set<AttnDesc>& attns() const { return attn_; }

 private:
  std::set<GemmDesc> gemm_;
  std::set<GemmGroupDesc> group_;
  std::set<QuantDesc> quant_;
  std::set<PackDesc> pack_;
  std::set<PackQkvDesc> pack_qkv_;
  std::set<AttnDesc> attn_;
  bool row_copy_ = false;
};

inline constexpr const char* kRowCopyKernel = "dllm_copy_rows";
Launch row_copy_launch(int64_t rows);

// The head packers and the attention kernel of one attention geometry: queries and keys with its RoPE,
// values transposed.
struct AttentionKernels {
  PackDesc q, k, v;
  PackQkvDesc qkv;  // q, k and v in one launch (what the forward program runs)
  AttnDesc attn;
  bool operator==(const AttentionKernels&) const = default;
};
AttentionKernels attention_kernels(const model::RopeSpec& rope, const model::AttentionShape& shape);
// The fused packs and attention of every layer's geometry (Gemma-4: sliding and global layers) added to `set`, with the
// variants that quantise their output in each of the output projections' activation formats `quant_acts`.
void add_attention_kernels(KernelSet& set, const model::HParams& hp, const std::vector<ActFormat>& quant_acts);

// The pack descriptors of the forward pass (the model's scalar geometry): queries/keys with the model's RoPE, values transposed.
PackDesc q_pack_desc(const model::HParams& hp);
PackDesc k_pack_desc(const model::HParams& hp);
PackDesc v_pack_desc(const model::HParams& hp);
AttnDesc attn_desc(const model::HParams& hp);

// Everything the GPU executor's forward program launches for this model: a GEMM per distinct (format, N, K) of its matrices,
// the activation quantisers, the head packers and attention. Throws dllm::Error naming the first matrix
// whose type has no GPU kernel (see gpu_support_error()).
KernelSet kernels_for_model(const model::HParams& hp, const model::ModelTensors& tensors);

// Every kernel a model with these hyperparameters could need: all its projection shapes in each of
// `formats`, plus what the per-call executor path adds (a plain quantiser per input width, packers
// without RoPE). For compile tests and for listing kernels without a model file.
KernelSet kernels_for_hparams(const model::HParams& hp, const std::vector<WeightFormat>& formats);

// "" when every matrix of the model has a GPU kernel, else the error for the first one that has not:
// "tensor blk.0.attn_q.weight is F16: the GPU backend has matrix kernels for Q4_K, Q5_K, Q6_K, Q8_0 and Q5_0
//  (run with --device cpu)" (the list from the weight table). Also rejects shapes the kernels cannot take (N not a multiple of 8).
std::string gpu_support_error(const model::ModelTensors& tensors);

// "" when the GPU attention kernel takes this head geometry (a multiple of 16 up to 128 or of 128 up to 512, an even number
// of rotated dimensions), else the error naming it.
std::string head_dim_error(int64_t head_dim, int64_t n_rot);
// head_dim_error() of the first layer whose geometry the kernel cannot take (naming the layer when layers differ).
std::string attention_geometry_error(const model::HParams& hp);
// Everything that keeps a model off the GPU: gpu_support_error() of its tensors, then attention_geometry_error().
// "" when the GPU can run it. For the CLI's --device choice (select_device's `unsupported`).
std::string gpu_model_error(const model::HParams& hp, const model::ModelTensors& tensors);

// FNV-1a 64-bit hash of a byte string, as 16 hex digits.
std::string hash_hex(const std::string& bytes);

}  // namespace dllm::jit::cuda
