// Reference integer dot products (Q4_K, Q5_K and Q6_K x Q8_K, Q8_0 and Q5_0 x Q8_0): the oracles of the JIT and GPU
// GEMM kernels. Integer parts are exact; the float result follows ggml's scalar kernels.
#include "model/quant_ref_dot.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common/error.h"

namespace dllm::quant {

namespace {

template <class Block>
Block load_block(const void* src, int64_t i) {
  Block b;
  std::memcpy(&b, static_cast<const uint8_t*>(src) + i * static_cast<int64_t>(sizeof(Block)), sizeof(Block));
  return b;
}

void check_n(int64_t n, int64_t block, const char* what) {
  if (n < 0 || n % block != 0) {
    throw Error(std::string(what) + ": n = " + std::to_string(n) + " is not a multiple of " + std::to_string(block));
  }
}

}  // namespace

double DotPartsQ4K::exact_f64() const {
  const double da = d_a;
  return double(d_w) * da * sum_scaled_q - double(dmin_w) * da * sum_mins;
}
double DotPartsQ4K::abs_f64() const {
  const double da = d_a;
  return std::fabs(double(d_w) * da) * sum_abs_scaled_q + std::fabs(double(dmin_w) * da * sum_mins);
}
double DotPartsQ6K::exact_f64() const { return double(d_w) * double(d_a) * sum_scaled_q; }
double DotPartsQ6K::abs_f64() const { return std::fabs(double(d_w) * double(d_a)) * sum_abs_scaled_q; }

namespace {

// Q4_K and Q5_K share everything but the quant: 6-bit scales and mins per sub-block of 32 (scale_min_k4).
template <class Block, class Quant>
DotPartsQ4K dot_parts_scale_min(const Block& w, const BlockQ8_K& a, Quant quant) {
  DotPartsQ4K p;
  p.d_w = fp16_to_f32(w.d);
  p.dmin_w = fp16_to_f32(w.dmin);
  p.d_a = a.d;
  for (int j = 0; j < 8; ++j) scale_min_k4(j, w.scales, &p.scales[j], &p.mins[j]);
  for (int j = 0; j < 8; ++j) {  // sub-blocks of 32
    int32_t s = 0;
    for (int k = 32 * j; k < 32 * j + 32; ++k) {
      const int t = quant(w, k) * a.qs[k];
      s += t;
      p.sum_abs_scaled_q += p.scales[j] * std::abs(t);
    }
    p.sum_scaled_q += p.scales[j] * s;
  }
  for (int j = 0; j < 16; ++j) p.sum_mins += a.bsums[j] * p.mins[j / 2];
  return p;
}

template <class Block, class Parts>
float vec_dot_scale_min(int64_t n, const void* w, const void* a, std::vector<DotPartsQ4K>* parts, Parts dot_parts,
                        const char* what) {
  check_n(n, kQK_K, what);
  if (parts) parts->clear();
  float sum = 0;
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const DotPartsQ4K p = dot_parts(load_block<Block>(w, i), load_block<BlockQ8_K>(a, i));
    const float d = p.d_w * p.d_a;
    const float dmin = p.dmin_w * p.d_a;
    sum += d * static_cast<float>(p.sum_scaled_q);
    sum -= dmin * static_cast<float>(p.sum_mins);
    if (parts) parts->push_back(p);
  }
  return sum;
}

}  // namespace

DotPartsQ4K dot_parts_q4_K_q8_K(const BlockQ4_K& w, const BlockQ8_K& a) {
  return dot_parts_scale_min(w, a, q4_k_quant);
}

DotPartsQ4K dot_parts_q5_K_q8_K(const BlockQ5_K& w, const BlockQ8_K& a) {
  return dot_parts_scale_min(w, a, q5_k_quant);
}

DotPartsQ6K dot_parts_q6_K_q8_K(const BlockQ6_K& w, const BlockQ8_K& a) {
  DotPartsQ6K p;
  p.d_w = fp16_to_f32(w.d);
  p.d_a = a.d;
  for (int j = 0; j < 16; ++j) {  // sub-blocks of 16
    p.scales[j] = w.scales[j];
    int32_t s = 0;
    for (int k = 16 * j; k < 16 * j + 16; ++k) {
      const int t = q6_k_quant(w, k) * a.qs[k];
      s += t;
      p.sum_abs_scaled_q += std::abs(p.scales[j] * t);
    }
    p.sum_scaled_q += p.scales[j] * s;
  }
  return p;
}

float vec_dot_q4_K_q8_K(int64_t n, const void* w, const void* a, std::vector<DotPartsQ4K>* parts) {
  return vec_dot_scale_min<BlockQ4_K>(n, w, a, parts, dot_parts_q4_K_q8_K, "vec_dot_q4_K_q8_K");
}

float vec_dot_q5_K_q8_K(int64_t n, const void* w, const void* a, std::vector<DotPartsQ4K>* parts) {
  return vec_dot_scale_min<BlockQ5_K>(n, w, a, parts, dot_parts_q5_K_q8_K, "vec_dot_q5_K_q8_K");
}

float vec_dot_q6_K_q8_K(int64_t n, const void* w, const void* a, std::vector<DotPartsQ6K>* parts) {
  check_n(n, kQK_K, "vec_dot_q6_K_q8_K");
  if (parts) parts->clear();
  float sum = 0;
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const DotPartsQ6K p = dot_parts_q6_K_q8_K(load_block<BlockQ6_K>(w, i), load_block<BlockQ8_K>(a, i));
    const float d = p.d_w * p.d_a;
    sum += d * static_cast<float>(p.sum_scaled_q);
    if (parts) parts->push_back(p);
  }
  return sum;
}

float vec_dot_q8_0_q8_0(int64_t n, const void* x, const void* y) {
  check_n(n, kQK, "vec_dot_q8_0_q8_0");
  float sum = 0;
  for (int64_t i = 0; i < n / kQK; ++i) {
    const auto bx = load_block<BlockQ8_0>(x, i);
    const auto by = load_block<BlockQ8_0>(y, i);
    int32_t sumi = 0;
    for (int j = 0; j < kQK; ++j) sumi += bx.qs[j] * by.qs[j];
    sum += static_cast<float>(sumi) * (fp16_to_f32(bx.d) * fp16_to_f32(by.d));
  }
  return sum;
}

float vec_dot_q5_0_q8_0(int64_t n, const void* w, const void* a, std::vector<int32_t>* sumi) {
  check_n(n, kQK, "vec_dot_q5_0_q8_0");
  if (sumi) sumi->clear();
  float sum = 0;
  for (int64_t i = 0; i < n / kQK; ++i) {
    const auto bw = load_block<BlockQ5_0>(w, i);
    const auto ba = load_block<BlockQ8_0>(a, i);
    int32_t s = 0;
    for (int j = 0; j < kQK; ++j) s += (q5_0_quant(bw, j) - 16) * ba.qs[j];
    sum += static_cast<float>(s) * (fp16_to_f32(bw.d) * fp16_to_f32(ba.d));
    if (sumi) sumi->push_back(s);
  }
  return sum;
}

}  // namespace dllm::quant
