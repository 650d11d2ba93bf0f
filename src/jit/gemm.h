// The JIT CPU GEMM: y[r][n] = dot(x[r], W[n]) for a prepared (repacked) weight matrix W and activation
// rows x, through shape-specialised Xbyak kernels from the kernel cache, on a thread pool.
//
//   QuantMatrix w = prepare_matrix(GgmlType::Q4_K, k, n, tensor_data, default_isa(), pool);  // at load
//   QuantizedActs a;
//   quantize_acts(act_format_for(w.type), x, rows, k, a, pool);  // once per input, shared by Q/K/V
//   gemm(w, a, y, pool);                                          // y: rows x n floats, row stride n
//
// Numerics are ggml's: activations quantised to Q8_K (Q4_K/Q6_K weights) or Q8_0 (Q8_0 weights),
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

// Quantises x (rows x w.k) first, then gemm(). For callers that do not share the quantisation.
void gemm(const QuantMatrix& w, const float* x, int64_t rows, float* y, ThreadPool& pool,
          KernelCache& cache = KernelCache::global());

// The kernels gemm() uses for `rows` activation rows (a full tile and the remainder tile), generated
// now; for `dllm kernels` and warm-up at load.
std::vector<std::shared_ptr<const Kernel>> kernels_for(const QuantMatrix& w, int64_t rows,
                                                       KernelCache& cache = KernelCache::global());

}  // namespace dllm::jit
