// The GPU operations the executor's forward program (gpu_executor.h) is built from, each one kernel
// launch with its parameter struct filled from device buffers: activation quantisation (optionally fused
// with RMSNorm or SwiGLU, optionally through a row map), the int8 GEMM against an uploaded weight (with
// the residual added in its epilogue), packing a projection into per-head f16 operands (bias + RoPE
// fused), and flash attention. Also the uploaded weight itself.
#pragma once
#include <array>
#include <cstdint>
#include <span>
#include <string>

#include "jit/cuda/device.h"
#include "jit/cuda/weight_pack.h"

namespace dllm::jit::cuda {

template <class T>
T* dev_ptr(DevAddr a) {
  return reinterpret_cast<T*>(static_cast<uintptr_t>(a));
}

// A weight matrix in device memory, packed for the GEMM (weight_pack.h).
struct GpuWeight {
  std::string name;
  PackedLayout layout;
  DeviceBuffer quants, scales;  // scales: Q6_K's d plane only
  GemmDesc desc() const { return {layout.format, layout.n, layout.k}; }
};

// int8 activation fragments with their scales (grown on demand), and what they currently hold.
struct ActBuffers {
  DeviceBuffer q, da, bs;
  ActFormat format = ActFormat::Q8_0;
  int64_t rows = 0, k = 0;  // of the last quantisation
  void ensure(Device& dev, int64_t rows, int64_t k);
};
// One set of buffers per activation format (indexed by ActFormat).
using ActPair = std::array<ActBuffers, 2>;

// A growable f32/f16/int device scratch buffer.
struct Scratch {
  DeviceBuffer buf;
  DevAddr get(Device& dev, size_t bytes);  // at least `bytes`, contents not preserved on growth
};

// The small-row GEMMs' workspace (kernel_set.h: gemm_small_part_bytes, gemm_small_counters), grown on demand; the
// counters are zeroed when allocated and every launch leaves them zero. One per stream: the launches on it take turns.
struct GemmWorkspace {
  DeviceBuffer part, count, span;  // span: the SwiGLU groups' arrival counters per (row tile, 256 columns)
  void ensure(Device& dev, size_t part_bytes, size_t counters, size_t span_counters = 0);
};

// act <- quantised rows in format `fmt`: rows of x (row stride ld floats), through row_map when given.
// RmsNorm uses w and eps; SwiGlu takes the gate from x and the up projection from x2.
void gpu_quant(Device& dev, QuantMode mode, ActFormat fmt, int64_t k, DevAddr x, DevAddr x2, DevAddr w,
               DevAddr row_map, int64_t rows, int64_t ld, float eps, ActBuffers& act);
// The same once for each format the `readers` need (they all read k = their width).
void gpu_quant_for(Device& dev, QuantMode mode, std::span<const GpuWeight* const> readers, DevAddr x, DevAddr x2,
                   DevAddr w, DevAddr row_map, int64_t rows, int64_t ld, float eps, ActPair& act);

// y[r][j] (+)= act[act_row0 + r] . W[j] for r < rows (y's row stride ldy floats; act_row0 a multiple of kRowPad).
// Checks that act holds this weight's activation format and width. ws: the small-row kernel's workspace.
void gpu_gemm(Device& dev, GemmWorkspace& ws, const GpuWeight& w, const ActBuffers& act, int64_t rows, DevAddr y,
              int64_t ldy, bool accumulate, int64_t act_row0 = 0);
// The same with the buffer of w's format taken from the pair.
inline void gpu_gemm(Device& dev, GemmWorkspace& ws, const GpuWeight& w, const ActPair& act, int64_t rows, DevAddr y,
                     int64_t ldy, bool accumulate, int64_t act_row0 = 0) {
  gpu_gemm(dev, ws, w, act[static_cast<size_t>(act_format_for(w.layout.format))], rows, y, ldy, accumulate, act_row0);
}

// The group of these products (GemmGroupDesc; gemm_group_ok says whether they can share a launch).
GemmGroupDesc gemm_group_of(std::span<const GpuWeight* const> ws);
// y_i = act . W_i for the 2 or 3 products of one activation in one launch (gemm_tc_group_body), the bits of
// gpu_gemm on each.
void gpu_gemm_group(Device& dev, GemmWorkspace& work, std::span<const GpuWeight* const> ws, const ActPair& act,
                    int64_t rows, std::span<const DevAddr> ys, std::span<const int64_t> ldys);
// A feed-forward's gate (ws[0]) and up (ws[1]) as gpu_gemm_group, whose launch also quantises silu(gate) * up into out
// (format fmt, k = their width) as gpu_quant's SwiGlu mode would: the bits of gpu_gemm_group then gpu_quant. Needs the
// group's swiglu variant (GemmGroupDesc::swiglu, swiglu_act = fmt) loaded; out must not be a buffer of act.
void gpu_gemm_group_swiglu(Device& dev, GemmWorkspace& work, std::span<const GpuWeight* const> ws, const ActPair& act,
                           int64_t rows, std::span<const DevAddr> ys, int64_t ldy, ActFormat fmt, ActBuffers& out);

// out <- split-f16 per-head layout of x ([rows][ld] f32) with bias and RoPE (double tables
// [positions][n_rot/2], positions per row in pos) as the descriptor says. out holds d.n_head * pad_rows(rows) * d.head_dim halves.
void gpu_pack(Device& dev, const PackDesc& d, DevAddr x, int64_t rows, int64_t ld, DevAddr bias, DevAddr cos_t,
              DevAddr sin_t, DevAddr pos, DevAddr out);

// One head pack's operands (see gpu_pack).
struct PackArgs {
  DevAddr x = 0;
  int64_t rows = 0, ld = 0;
  DevAddr bias = 0, pos = 0, out = 0;
};
// gpu_pack of the queries (a.q), keys (a.k, a's RoPE tables) and values (a.v) of one attention in one launch.
void gpu_pack_qkv(Device& dev, const AttentionKernels& a, const PackArgs& q, const PackArgs& k, const PackArgs& v,
                  DevAddr cos_t, DevAddr sin_t);

// Where the quantising attention (AttnDesc::quant) puts its output's quantised rows: rows [row0, row0 + n_q) of act
// (format Q8_K or Q8_0, k = H * d, sized and described by the caller), its arrival counters in work.
struct AttnQuant {
  ActBuffers* act = nullptr;
  int64_t row0 = 0;
  GemmWorkspace* work = nullptr;
};
// out[n_q][H*d] <- attention of packed queries over n_kv packed keys/values; with ranges (device ints
// [n_q][2]) query row i over keys [ranges[2i], ranges[2i+1]) only. With quant, the same launch also quantises out's
// rows plain, as gpu_quant would (the quantising variant of d must be loaded).
void gpu_attention(Device& dev, const AttnDesc& d, DevAddr q, int64_t n_q, DevAddr k, DevAddr vt, int64_t n_kv,
                   float scale, DevAddr out, DevAddr ranges = 0, const AttnQuant* quant = nullptr);

// Gather (dst row i = src row rows[i]) or scatter (dst row rows[i] = src row i) of n listed rows (device ints) of
// `cols` floats, in one launch of dllm_copy_rows.
void gpu_copy_rows(Device& dev, DevAddr dst, DevAddr src, DevAddr rows, int64_t n, int64_t cols, bool scatter);

// Bytes of the packed split-f16 operand of one projection (pack_heads output: hi and lo planes).
inline size_t packed_heads_bytes(int64_t n_head, int64_t head_dim, int64_t rows) {
  return static_cast<size_t>(n_head * head_dim * pad_rows(rows)) * 2 * 2;
}

}  // namespace dllm::jit::cuda
