// The weight-type table: everything the kernels (CPU JIT and GPU) know about a ggml weight type, in one
// row per type. The register plans, the repack layouts, kernel names, the GPU's weight formats, the
// portable twin and the reference dot product, and every "which types have kernels" message read it.
// Adding a weight type is a row here, a kernel body (x64/gemm_<type>.cpp, the GPU's gemm.cuh), a repack
// (repack.cpp, cuda/weight_pack.cpp) and a reference twin (model/quant_ref_dot.cpp, kernel_order.cpp).
// A type without a row has no kernel: the executors run it on the reference path (and say so).
#pragma once
#include <cstdint>
#include <string>

#include "model/ggml_types.h"

namespace dllm::jit {

// The activation format each weight type multiplies with (ggml's vec_dot_type).
enum class ActFormat { Q8_K, Q8_0 };
inline int act_block(ActFormat f) { return f == ActFormat::Q8_K ? 256 : 32; }

struct WeightTypeTraits {
  GgmlType type;
  const char* name;        // ggml's spelling: "Q5_K"
  const char* tag;         // lower case, in GPU kernel names: "q5_k"
  const char* cpu_tag;     // in CPU kernel names: "q5k_q8k"
  int block;               // values per block (256 for the K-quants, 32 for Q8_0 and Q5_0)
  int block_bytes;         // bytes of one ggml block
  ActFormat act;           // the activation format

  // ---- CPU JIT (repack.h, x64/reg_plan.h) ----
  int quant_bytes;         // repacked quant bytes per block and panel row
  int meta_bytes;          // repacked meta bytes per block and panel row
  int temps;               // vector temporaries of the body (one-vector panels, zmm; ymm add a broadcast)
  int temps_avx2;          // the same on AVX2 (broadcast included)
  int row_regs;            // vector registers per activation row: two dot chains, super-block sum, accumulator
  int chains_avx2;         // int32 dot chains per row on AVX2 (the other families: 2); one frees a register a row
  bool nibble_masks;       // the body masks nibbles (0x0F, and 0xF0 on the VNNI families)
  bool two_vector_panels;  // panels two zmm wide on avx512-vnni for k <= kTwoVectorMaxK (gemm_desc.h)
  int prefetch_bytes;      // software prefetch distance of the weight stream (4+ row tiles)
  bool amx;                // the amx family has a body (else its matrices run avx512-vnni kernels: matrix_family)
  // The portable family's dot of one ggml weight row with one activation row (kernel_order.h).
  float (*portable_dot)(int64_t k, const void* w_row, const void* act_row);
  // The reference dot product of the same (model/quant_ref_dot.h), ggml's scalar kernel.
  float (*reference_dot)(int64_t k, const void* w_row, const void* act_row);

  // ---- GPU (cuda/kernel_set.h, cuda/weight_pack.h, kernels/gemm_tc.cuh) ----
  bool gpu;                // the tiled int8 tensor-core GEMM takes it
};

// The row of a weight type with CPU kernels, or null.
const WeightTypeTraits* weight_traits(GgmlType t);
// The row named `name` ("Q5_K", as ggml spells it), or null.
const WeightTypeTraits* weight_traits_by_name(const std::string& name);
// The row of t, or a dllm::Error "<what> is <type>: the JIT kernels take Q4_K, Q5_K, Q6_K, Q8_0 and Q5_0".
const WeightTypeTraits& require_weight_traits(GgmlType t, const std::string& what);
// The weight types with CPU kernels, in table order: "Q4_K, Q5_K, Q6_K, Q8_0 and Q5_0" (for messages).
std::string jit_type_list();
// The same for the GPU kernels.
std::string gpu_type_list();
// Every row, for tests and listings: the rows are table[0 .. count-1].
const WeightTypeTraits* weight_table(int* count);

// The weight types the JIT kernels handle (weight_traits(t) != null).
inline bool jit_supports_type(GgmlType t) { return weight_traits(t) != nullptr; }
// The activation format for a weight type with kernels (Q8_K for types without, never read).
inline ActFormat act_format_for(GgmlType t) {
  const WeightTypeTraits* w = weight_traits(t);
  return w ? w->act : ActFormat::Q8_K;
}

}  // namespace dllm::jit
