// The GEMM kernel descriptor: the single source of truth of a generated kernel. The generators read
// only this, the kernel cache is keyed by it, and kernel names and dumps derive from it.
//
// A kernel computes, for a tile of M activation rows and a run of weight panels (P weight rows each),
//   y[r][n] = sum over blocks of the weight type's integer dot products, scaled as ggml does,
// reading weights in the repacked layout of repack.h and activations quantised by quant_act.h.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "jit/cpu_features.h"
#include "jit/weight_types.h"
#include "model/ggml_types.h"

namespace dllm::jit {

// Weight rows interleaved per vector register: 16 dwords in a zmm (and an AMX tile row), 8 in a ymm.
inline constexpr int vector_rows(Isa isa) { return isa_has_avx512(isa) ? 16 : 8; }

// Weight rows per panel for rows of k values: one vector, except Q6_K on avx512-vnni with k up to
// kTwoVectorMaxK, whose panels are two vectors (32 rows) wide. The Q6_K body is bound by loads (a
// broadcast per vpdpbusd, plus each sub-block's offset), and a tile of 4 rows x 2 vectors broadcasts each
// activation once for two dots: 65% -> 72% of the int8 peak with its weights in L2, and the LM heads
// (k 3584, 4096) 9-12% faster at 32-288 rows, on a Zen 5. With long rows the 4-row tiles lose: each tile re-reads a
// pair's weights (k x 32 bytes) from L2, twice as often per output as 8-row tiles, and Dream's ffn_down
// (k 18944) ran 10% slower.
inline constexpr int64_t kTwoVectorMaxK = 8192;
inline int panel_rows(Isa isa, GgmlType wtype, int64_t k) {
  const WeightTypeTraits* w = weight_traits(wtype);
  return isa == Isa::Avx512Vnni && w && w->two_vector_panels && k <= kTwoVectorMaxK ? 32 : vector_rows(isa);
}

// The family whose kernels a matrix of type t runs when the executor's family is isa: under amx, a type
// without an AMX body (the weight table's `amx`) runs the avx512-vnni kernels (the AMX machine has them).
// The tiles ran Q4_K, Q6_K and Q8_0 20-40% faster than avx512-vnni from 16 rows (docs/benchmarks.md, "AMX
// as the default"); Q4_K's rows past the last full tile of 16 run avx512-vnni kernels on the AMX panels
// (plan_row_tiles). The experts of a mixture of experts run the tiles too (9% faster on LLaDA-MoE's 8-row
// groups, group by group, than avx512-vnni's one grouped pass).
inline Isa matrix_family(Isa isa, GgmlType t) {
  const WeightTypeTraits* w = weight_traits(t);
  return isa == Isa::Amx && (!w || !w->amx) ? Isa::Avx512Vnni : isa;
}

struct GemmDesc {
  Isa isa = Isa::Avx512Vnni;
  GgmlType wtype = GgmlType::Q4_K;  // a type of the weight table (weight_types.h)
  int64_t n = 0;                    // weight rows (outputs): the row stride of y
  int64_t k = 0;                    // row length (inputs), a multiple of the block size
  int m = 1;                        // activation rows per call (the row tile)
  // Software-prefetch the weight stream (the type's prefetch_bytes ahead) although m < 4 (kernels of 4+ rows
  // always do): the first row tile over a run of panels, whose weights come from memory (first_tile_prefetches).
  bool prefetch = false;

  int p() const { return panel_rows(isa, wtype, k); }
  bool operator==(const GemmDesc& o) const {
    return isa == o.isa && wtype == o.wtype && n == o.n && k == o.k && m == o.m && prefetch == o.prefetch;
  }

  // XNNPACK-style: types, op, tile (rows x weight rows per panel), ISA, then the specialised shape, e.g.
  // "q4k_q8k_gemm_8x16__avx512vnni_k4096_n12288"; "_pf" at the end when `prefetch`.
  std::string name() const;
};

struct GemmDescHash {
  size_t operator()(const GemmDesc& d) const;
};

// The largest row tile whose registers fit the family's register file (checked again by the generator).
int max_row_tile(Isa isa, GgmlType wtype, int64_t k);

// Whether the first row tile of a GEMM, which streams the weights from memory for the tiles after it, gets
// a prefetching kernel although it has fewer than 4 rows. The avx2 family only, where every K-quant tile has
// at most 3 rows: on a Zen 3 the 1- to 3-row kernels stream their weights 10-30% faster with it (dllm bench
// gemm), while the tiles after the first, which read the weights from cache, lose about 3% to the extra
// instructions and so do without. Expert GEMMs (a few rows per expert, every expert's weights from memory)
// are where it counts.
bool first_tile_prefetches(Isa isa, int m);

// What a generated kernel reads and writes. Row strides are compile-time constants of the kernel.
struct GemmKernelArgs {
  const uint8_t* w;     // the first weight panel of this call (repack.h layout)
  const int8_t* xq;     // activation row 0 of the tile: int8 quants (stride k)
  const float* xd;      // row 0: block scales (stride k / block)
  const int16_t* xs;    // row 0: Q8_K: sums of 32 quants (stride k / 32)
  const int32_t* xc;    // row 0: init corrections: Q8_K -32*bsum per 16 (stride k/16); Q8_0 -128*sum per 32
  float* y;             // y[0][n0]: the first output column of this call (row stride n)
  int64_t n_panels;     // panels to compute, >= 1
  int64_t tail_cols;    // valid columns of the last panel (1..P); P when the call ends on a full panel
};
using GemmKernelFn = void (*)(const GemmKernelArgs*);

}  // namespace dllm::jit
