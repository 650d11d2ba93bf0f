// The portable family's GEMM arithmetic: the kernels' float contract (kernel_order.h) in plain C++.
// std::fma is the fused multiply-add the kernels use (vfmadd*ps): one rounding.
#include "jit/kernel_order.h"

#include <cmath>
#include <cstring>

namespace dllm::jit {

namespace {

template <class Block>
Block load(const Block* p, int64_t i) {  // the blocks of a GGUF mapping need no alignment
  Block b;
  std::memcpy(&b, reinterpret_cast<const uint8_t*>(p) + i * static_cast<int64_t>(sizeof(Block)), sizeof(Block));
  return b;
}

// A sub-block's term of the super-block sum: its dot times float(scale) * d, into the sum by a fused
// multiply-add (the first sub-block: a plain product).
float add_sub_block(float sum, int s, int32_t dot, float scale) {
  return s == 0 ? static_cast<float>(dot) * scale : std::fma(static_cast<float>(dot), scale, sum);
}

}  // namespace

namespace {

// Q4_K and Q5_K: 8 sub-blocks of 32 with 6-bit scales and mins; quant(b, s, l) is element l of sub-block s.
template <class Block, class Quant>
float dot_scale_min(int64_t n, const Block* w, const quant::BlockQ8_K* a, Quant quant) {
  float acc = 0;
  for (int64_t i = 0; i < n / quant::kQK_K; ++i) {
    const Block b = load(w, i);
    const quant::BlockQ8_K x = load(a, i);
    const float d = quant::fp16_to_f32(b.d), dmin = quant::fp16_to_f32(b.dmin);
    float sum = 0;
    int32_t mins = 0;
    for (int s = 0; s < 8; ++s) {
      uint8_t sc = 0, m = 0;
      quant::scale_min_k4(s, b.scales, &sc, &m);
      int32_t dot = 0;
      for (int l = 0; l < 32; ++l) dot += quant(b, s, l) * x.qs[32 * s + l];
      sum = add_sub_block(sum, s, dot, static_cast<float>(sc) * d);
      mins += m * (x.bsums[2 * s] + x.bsums[2 * s + 1]);
    }
    sum = std::fma(-static_cast<float>(mins), dmin, sum);
    acc = std::fma(sum, x.d, acc);
  }
  return acc;
}

// Sub-block s: the low (even s) or high (odd s) nibbles of the 32 bytes of chunk s / 2.
int nibble(const uint8_t* qs, int s, int l) { return (qs[32 * (s / 2) + l] >> (4 * (s % 2))) & 0xF; }

}  // namespace

float kernel_order_dot_q4_K(int64_t n, const quant::BlockQ4_K* w, const quant::BlockQ8_K* a) {
  return dot_scale_min(n, w, a, [](const quant::BlockQ4_K& b, int s, int l) { return nibble(b.qs, s, l); });
}

float kernel_order_dot_q5_K(int64_t n, const quant::BlockQ5_K* w, const quant::BlockQ8_K* a) {
  // The fifth bit of sub-block s is bit s of qh[l] (chunk s / 2: bits 2c and 2c+1).
  return dot_scale_min(n, w, a, [](const quant::BlockQ5_K& b, int s, int l) {
    return nibble(b.qs, s, l) | ((b.qh[l] >> s) & 1) << 4;
  });
}

float kernel_order_dot_q6_K(int64_t n, const quant::BlockQ6_K* w, const quant::BlockQ8_K* a) {
  float acc = 0;
  for (int64_t i = 0; i < n / quant::kQK_K; ++i) {
    const quant::BlockQ6_K b = load(w, i);
    const quant::BlockQ8_K x = load(a, i);
    const float d = quant::fp16_to_f32(b.d);
    float sum = 0;
    for (int s = 0; s < 16; ++s) {
      // Sub-block s (as quant::q6_k_quant): half s / 8, quarter (s % 8) / 2, positions l0 .. l0 + 15.
      const int h = s / 8, quarter = (s % 8) / 2, l0 = 16 * (s % 2);
      const uint8_t* ql = b.ql + 64 * h + 32 * (quarter & 1);
      const uint8_t* qh = b.qh + 32 * h;
      const int lshift = quarter < 2 ? 0 : 4, hshift = 2 * quarter;
      int32_t dot = 0;
      for (int l = l0; l < l0 + 16; ++l) {
        const int q = (((ql[l] >> lshift) & 0xF) | (((qh[l] >> hshift) & 3) << 4)) - 32;
        dot += q * x.qs[16 * s + l - l0];
      }
      sum = add_sub_block(sum, s, dot, static_cast<float>(b.scales[s]) * d);
    }
    acc = std::fma(sum, x.d, acc);
  }
  return acc;
}

namespace {

// Q8_0 and Q5_0 x Q8_0: one int32 dot and one fp16 scale per block of 32; quant(b, e) is element e, signed.
template <class Block, class Quant>
float dot_32_blocks(int64_t n, const Block* w, const quant::BlockQ8_0* a, Quant quant) {
  float acc = 0;
  for (int64_t i = 0; i < n / quant::kQK; ++i) {
    const Block b = load(w, i);
    const quant::BlockQ8_0 x = load(a, i);
    int32_t dot = 0;
    for (int e = 0; e < quant::kQK; ++e) dot += quant(b, e) * x.qs[e];
    acc = std::fma(static_cast<float>(dot), quant::fp16_to_f32(b.d) * quant::fp16_to_f32(x.d), acc);
  }
  return acc;
}

}  // namespace

float kernel_order_dot_q8_0(int64_t n, const quant::BlockQ8_0* w, const quant::BlockQ8_0* a) {
  return dot_32_blocks(n, w, a, [](const quant::BlockQ8_0& b, int e) { return int{b.qs[e]}; });
}

float kernel_order_dot_q5_0(int64_t n, const quant::BlockQ5_0* w, const quant::BlockQ8_0* a) {
  return dot_32_blocks(n, w, a, [](const quant::BlockQ5_0& b, int e) { return quant::q5_0_quant(b, e) - 16; });
}

}  // namespace dllm::jit
