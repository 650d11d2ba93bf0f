// Helpers of the JIT tests: random ggml weight blocks, random activations, and the reference result of
// one GEMM (model/quant_ref_dot.h per output, plus the exact float64 value and its scale).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "jit/cpu_features.h"
#include "jit/quant_act.h"
#include "model/ggml_types.h"
#include "model/quant.h"
#include "model/quant_ref_dot.h"

namespace dllm::jit::test {

inline size_t row_bytes(GgmlType t, int64_t k) {
  const auto info = ggml_type_info(static_cast<uint32_t>(t));
  return static_cast<size_t>(k / info->block_size * info->type_size);
}

inline uint16_t fp16(float f) { return quant::f32_to_fp16(f); }

// n rows of k values of type t with random but plausible contents (every byte pattern is a valid
// block; scales are kept finite). Q8_0 includes -128, which ggml's quantizer never writes.
inline std::vector<uint8_t> random_weights(GgmlType t, int64_t n, int64_t k, std::mt19937& rng) {
  std::vector<uint8_t> out(row_bytes(t, k) * n);
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& b : out) b = static_cast<uint8_t>(byte(rng));
  std::uniform_real_distribution<float> mag(1e-4f, 3e-2f);
  std::uniform_int_distribution<int> coin(0, 9);
  const int64_t blocks = static_cast<int64_t>(out.size() / ggml_type_info(static_cast<uint32_t>(t))->type_size);
  for (int64_t i = 0; i < blocks; ++i) {
    if (t == GgmlType::Q4_K) {
      auto* b = reinterpret_cast<quant::BlockQ4_K*>(out.data()) + i;
      b->d = fp16(coin(rng) == 0 ? 0.f : mag(rng));
      b->dmin = fp16(coin(rng) == 0 ? 0.f : mag(rng));
    } else if (t == GgmlType::Q5_K) {
      auto* b = reinterpret_cast<quant::BlockQ5_K*>(out.data()) + i;
      b->d = fp16(coin(rng) == 0 ? 0.f : mag(rng));
      b->dmin = fp16(coin(rng) == 0 ? 0.f : mag(rng));
    } else if (t == GgmlType::Q6_K) {
      auto* b = reinterpret_cast<quant::BlockQ6_K*>(out.data()) + i;
      b->d = fp16((coin(rng) < 5 ? -1.f : 1.f) * mag(rng));
    } else if (t == GgmlType::Q5_0) {
      auto* b = reinterpret_cast<quant::BlockQ5_0*>(out.data()) + i;
      b->d = fp16((coin(rng) < 5 ? -1.f : 1.f) * mag(rng));
    } else {
      auto* b = reinterpret_cast<quant::BlockQ8_0*>(out.data()) + i;
      b->d = fp16((coin(rng) < 5 ? -1.f : 1.f) * mag(rng));
    }
  }
  return out;
}

// Activation rows: normal values with a few outliers, one all-zero row when rows > 2.
inline std::vector<float> random_acts(int64_t rows, int64_t k, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_int_distribution<int> coin(0, 99);
  std::vector<float> x(rows * k);
  for (auto& v : x) v = coin(rng) == 0 ? 30.f * nd(rng) : nd(rng);
  if (rows > 2) std::fill(x.begin() + k, x.begin() + 2 * k, 0.f);
  return x;
}

struct RefResult {
  std::vector<float> ref;     // the reference kernel's float result
  std::vector<double> exact;  // sum over blocks of the exact block values, float64
  std::vector<double> scale;  // sum of |block values|: the tolerance scale
};

// Reference y[r][n] for weights w (ggml rows) and quantised activations a.
inline RefResult reference_gemm(GgmlType t, const uint8_t* w, int64_t n, const QuantizedActs& a) {
  RefResult out;
  const int64_t k = a.k;
  const size_t rb = row_bytes(t, k);
  out.ref.resize(a.rows * n);
  out.exact.resize(a.rows * n);
  out.scale.resize(a.rows * n);
  for (int64_t r = 0; r < a.rows; ++r) {
    for (int64_t j = 0; j < n; ++j) {
      const uint8_t* wr = w + j * rb;
      const void* ar = a.row_blocks(r);
      double exact = 0, scale = 0;
      float v = 0;
      if (t == GgmlType::Q4_K || t == GgmlType::Q5_K) {
        std::vector<quant::DotPartsQ4K> parts;
        v = t == GgmlType::Q4_K ? quant::vec_dot_q4_K_q8_K(k, wr, ar, &parts) : quant::vec_dot_q5_K_q8_K(k, wr, ar, &parts);
        for (const auto& p : parts) exact += p.exact_f64(), scale += p.abs_f64();
      } else if (t == GgmlType::Q6_K) {
        std::vector<quant::DotPartsQ6K> parts;
        v = quant::vec_dot_q6_K_q8_K(k, wr, ar, &parts);
        for (const auto& p : parts) exact += p.exact_f64(), scale += p.abs_f64();
      } else if (t == GgmlType::Q5_0) {
        std::vector<int32_t> sumi;
        v = quant::vec_dot_q5_0_q8_0(k, wr, ar, &sumi);
        const auto* wb = reinterpret_cast<const quant::BlockQ5_0*>(wr);
        const auto* ab = static_cast<const quant::BlockQ8_0*>(ar);
        for (int64_t b = 0; b < k / 32; ++b) {
          const double term = static_cast<double>(quant::fp16_to_f32(wb[b].d)) * quant::fp16_to_f32(ab[b].d) * sumi[b];
          exact += term;
          scale += std::fabs(term);
        }
      } else {
        v = quant::vec_dot_q8_0_q8_0(k, wr, ar);
        const auto* wb = reinterpret_cast<const quant::BlockQ8_0*>(wr);
        const auto* ab = static_cast<const quant::BlockQ8_0*>(ar);
        for (int64_t b = 0; b < k / 32; ++b) {
          int sumi = 0;
          for (int e = 0; e < 32; ++e) sumi += wb[b].qs[e] * ab[b].qs[e];
          const double term = static_cast<double>(quant::fp16_to_f32(wb[b].d)) * quant::fp16_to_f32(ab[b].d) * sumi;
          exact += term;
          scale += std::fabs(term);
        }
      }
      out.ref[r * n + j] = v;
      out.exact[r * n + j] = exact;
      out.scale[r * n + j] = scale;
    }
  }
  return out;
}

}  // namespace dllm::jit::test
