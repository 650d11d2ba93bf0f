// The JIT CPU GEMM: y[r][n] = dot(x[r], W[n]) for a prepared (repacked) weight matrix W and activation
// rows x, through shape-specialised Xbyak kernels from the kernel cache, on a thread pool.
//
//   QuantMatrix w = prepare_matrix(GgmlType::Q4_K, k, n, tensor_data, default_isa(), pool);  // at load
//   QuantizedActs a;
//   quantize_acts(act_format_for(w.type), x, rows, k, a, pool);  // once per input, shared by Q/K/V
//   gemm(w, a, y, pool);                                          // y: rows x n floats, row stride n
//
// Numerics are ggml's: activations quantised to Q8_K (Q4_K/Q6_K weights) or Q8_0 (Q8_0 and Q5_0 weights),
// exact integer block sums, f32 accumulation per block. The portable family computes the same values
// with the reference dot products of model/quant_ref_dot.h (slowly).
#pragma once
#include <cstdint>

#include "jit/kernel_cache.h"
#include "jit/quant_act.h"
#include "jit/repack.h"

namespace dllm {
class ThreadPool;
}

namespace dllm::jit {

// y (a.rows x w.n, row stride w.n) = a times w transposed. Throws dllm::Error when a's format or row
// length does not match w. Work items (panel runs x row-tile groups) go out through the pool's counter.
void gemm(const QuantMatrix& w, const QuantizedActs& a, float* y, ThreadPool& pool,
          KernelCache& cache = KernelCache::global());

// The same for n matrices of the same row length and activation format, ys[i] = a times ws[i] transposed,
// in one pass of the pool over all their work items (Q, K and V; gate and up).
void gemm_many(const QuantMatrix* const* ws, float* const* ys, int n, const QuantizedActs& a, ThreadPool& pool,
               KernelCache& cache = KernelCache::global());

// One matrix over a contiguous range of the activation rows: y (rows x w->n) = activation rows
// [row0, row0 + rows) times w transposed.
struct GemmRange {
  const QuantMatrix* w = nullptr;
  float* y = nullptr;
  int64_t row0 = 0, rows = 0;
};

// Every range's product in one pass of the pool over all their work items: the expert GEMMs of a
// mixture-of-experts layer, each expert's rows one range of a single quantised buffer. Each output row
// is what gemm() computes for it (a row's value does not depend on the other rows). The AMX family needs
// row0 to be a multiple of 16 (its activation tiles are 16-row groups); dllm::Error otherwise.
void gemm_ranges(const GemmRange* rs, int n, const QuantizedActs& a, ThreadPool& pool,
                 KernelCache& cache = KernelCache::global());

// Quantises x (rows x w.k) first, then gemm(). For callers that do not share the quantisation.
void gemm(const QuantMatrix& w, const float* x, int64_t rows, float* y, ThreadPool& pool,
          KernelCache& cache = KernelCache::global());

// How gemm() cuts `rows` activation rows into tiles for a matrix of family isa and type t: full tiles
// of the family (max_row_tile rows), then the remainder. The AMX family computes Q4_K remainders of
// fewer than 16 rows with the avx512-vnni kernels (the layouts are the same), which beat partial tiles.
struct RowTile {
  int64_t r0 = 0;  // first row
  GemmDesc desc;   // desc.m rows from r0, by this kernel
};
std::vector<RowTile> plan_row_tiles(Isa isa, GgmlType t, int64_t n, int64_t k, int64_t rows);

// Points args' activation fields (xq, xd, xs, xc) at row r0 of a, for a kernel of family isa (AMX
// kernels read the 16-row tile form).
void point_at_rows(GemmKernelArgs& args, const QuantizedActs& a, Isa isa, int64_t r0);

// The kernels gemm() uses for `rows` activation rows, generated now; for warm-up at load.
std::vector<std::shared_ptr<const Kernel>> kernels_for(const QuantMatrix& w, int64_t rows,
                                                       KernelCache& cache = KernelCache::global());

}  // namespace dllm::jit
