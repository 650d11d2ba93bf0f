// Reference integer dot products of quantized weights with quantized activations, as ggml's CPU kernels
// compute them: Q4_K, Q5_K and Q6_K x Q8_K (the activation row quantized by quantize_row_q8_K), and
// Q8_0 and Q5_0 x Q8_0 (the activation row quantized by quantize_row_q8_0). Besides the float result they expose each super-block's exact integer parts, so a fast
// (JIT, GPU) kernel can be checked integer for integer, and its float result against an exact value.
#pragma once
#include <cstdint>
#include <vector>

#include "model/quant.h"

namespace dllm::quant {

// One 256-element super-block of a Q4_K (or Q5_K) x Q8_K dot product. Its value is
//   d_w*d_a*sum_scaled_q - dmin_w*d_a*sum_mins.
struct DotPartsQ4K {
  float d_w = 0, dmin_w = 0;  // the weight block's fp16 scales, as floats
  float d_a = 0;              // the Q8_K activation scale
  uint8_t scales[8] = {};     // 6-bit sub-block scales
  uint8_t mins[8] = {};       // 6-bit sub-block mins
  int32_t sum_scaled_q = 0;   // sum over sub-blocks j of scales[j] * sum(q_w * q_a), q_w in 0..15 (Q5_K: 0..31)
  int32_t sum_mins = 0;       // sum over j < 16 of bsums[j] * mins[j/2]
  int32_t sum_abs_scaled_q = 0;  // sum over elements of |scale * q_w * q_a|

  double exact_f64() const;  // the value above in float64
  // |d_w*d_a|*sum_abs_scaled_q + |dmin_w*d_a*sum_mins|: the scale for tolerances (dot.json's abs_sum).
  double abs_f64() const;
};

// One 256-element super-block of a Q6_K x Q8_K dot product. Its value is d_w*d_a*sum_scaled_q.
struct DotPartsQ6K {
  float d_w = 0, d_a = 0;
  int8_t scales[16] = {};    // int8 scales of the 16 sub-blocks of 16
  int32_t sum_scaled_q = 0;  // sum over sub-blocks j of scales[j] * sum(q_w * q_a), q_w in -32..31
  int32_t sum_abs_scaled_q = 0;  // sum over elements of |scale * q_w * q_a|

  double exact_f64() const;
  double abs_f64() const;  // |d_w*d_a|*sum_abs_scaled_q (dot.json's abs_sum)
};

// The integer parts of one super-block.
DotPartsQ4K dot_parts_q4_K_q8_K(const BlockQ4_K& w, const BlockQ8_K& a);
DotPartsQ4K dot_parts_q5_K_q8_K(const BlockQ5_K& w, const BlockQ8_K& a);
DotPartsQ6K dot_parts_q6_K_q8_K(const BlockQ6_K& w, const BlockQ8_K& a);

// Dot product of n elements (n a multiple of 256) of a weight row w (Q4_K / Q5_K / Q6_K blocks) with an
// activation row a (Q8_K blocks). Float result: per super-block (d_w*d_a)*float(sum_scaled_q)
// [ - (dmin_w*d_a)*float(sum_mins) ], summed in float in block order (ggml's scalar kernel sums the
// same terms in 8 lanes; the results agree to within float rounding of the terms).
// When parts is not null it receives one entry per super-block. w and a need no alignment.
float vec_dot_q4_K_q8_K(int64_t n, const void* w, const void* a, std::vector<DotPartsQ4K>* parts = nullptr);
float vec_dot_q5_K_q8_K(int64_t n, const void* w, const void* a, std::vector<DotPartsQ4K>* parts = nullptr);
float vec_dot_q6_K_q8_K(int64_t n, const void* w, const void* a, std::vector<DotPartsQ6K>* parts = nullptr);

// Dot product of n elements (n a multiple of 32) of two Q8_0 rows, as ggml's scalar kernel does it:
// per block sumi = sum(x.qs*y.qs) (exact int), then sum += float(sumi) * (d_x*d_y), in float.
float vec_dot_q8_0_q8_0(int64_t n, const void* x, const void* y);

// Dot product of n elements (n a multiple of 32) of a Q5_0 weight row w with a Q8_0 activation row a, as
// ggml's vec_dot_q5_0_q8_0: per block sumi = sum((q_w - 16) * a.qs) with q_w = nibble | high bit << 4 in
// 0..31 (exact int), then sum += float(sumi) * (d_w*d_a), in float. When sumi is not null it receives
// each block's integer sum.
float vec_dot_q5_0_q8_0(int64_t n, const void* w, const void* a, std::vector<int32_t>* sumi = nullptr);

}  // namespace dllm::quant
