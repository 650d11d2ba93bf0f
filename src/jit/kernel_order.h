// The float contract of the GEMM kernels: for one output (one weight row against one activation row) the
// exact f32 operations, in order, that every kernel family performs after its integer dot products. The
// JIT families (avx2, avx-vnni, avx512-vnni) emit this sequence in vector form, one output per lane; the
// portable family runs it here in plain C++. So every family gives bit-identical GEMM results.
//
// Per K-quant super-block (activation scale d_a, weight scales d, dmin as f32):
//   sum = float(dot_0) * (float(scale_0) * d)                  (a rounded product, then a rounded product)
//   sum = fma(float(dot_s), float(scale_s) * d, sum)           for the sub-blocks s = 1, 2, ... in order
//   sum = fma(-float(mins), dmin, sum)                         (Q4_K, Q5_K: mins = sum_j bsums[j] * min[j/2])
//   acc = fma(sum, d_a, acc)                                   (acc starts at 0, blocks in order)
// Per Q8_0 or Q5_0 block: acc = fma(float(dot), d_w * d_a, acc).
// The integer dots are exact in every family (dot_s = sum over the sub-block of q_w * q_a, Q6_K's q_w in
// -32..31, Q4_K's in 0..15, Q5_K's in 0..31, Q5_0's in -16..15 (ggml's q - 16), Q8_0's in -128..127).
#pragma once
#include <cstdint>

#include "model/quant.h"

namespace dllm::jit {

// n elements (a multiple of the block size) of one weight row with one activation row, in the order above.
float kernel_order_dot_q4_K(int64_t n, const quant::BlockQ4_K* w, const quant::BlockQ8_K* a);
float kernel_order_dot_q5_K(int64_t n, const quant::BlockQ5_K* w, const quant::BlockQ8_K* a);
float kernel_order_dot_q6_K(int64_t n, const quant::BlockQ6_K* w, const quant::BlockQ8_K* a);
float kernel_order_dot_q8_0(int64_t n, const quant::BlockQ8_0* w, const quant::BlockQ8_0* a);
float kernel_order_dot_q5_0(int64_t n, const quant::BlockQ5_0* w, const quant::BlockQ8_0* a);

}  // namespace dllm::jit
