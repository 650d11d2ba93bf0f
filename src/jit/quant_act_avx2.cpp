// AVX2 activation quantizers, the same arithmetic as quant::quantize_row_q8_K / q8_0 in vector form (the
// AVX-512 twins' method on 8-lane registers): products rounded once (compiled without FMA, so nothing is
// contracted), round-half-even (Q8_K) and round-half-away (Q8_0) exactly as the scalar code, the first
// element of largest magnitude picked as the reference does; a block holding an infinity or NaN is handed
// to the reference code.
#include <immintrin.h>

#include "jit/quant_act_simd.h"

namespace dllm::jit {

#define DLLM_AVX2 __attribute__((target("avx2")))

namespace {

DLLM_AVX2 inline __m256 abs_ps(__m256 v) {
  return _mm256_castsi256_ps(_mm256_and_si256(_mm256_castps_si256(v), _mm256_set1_epi32(0x7fffffff)));
}

// True when every lane is finite (exponent not all ones).
DLLM_AVX2 inline bool all_finite(__m256 v) {
  const __m256i e = _mm256_and_si256(_mm256_castps_si256(v), _mm256_set1_epi32(0x7f800000));
  return _mm256_movemask_epi8(_mm256_cmpeq_epi32(e, _mm256_set1_epi32(0x7f800000))) == 0;
}

DLLM_AVX2 inline float hmax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

DLLM_AVX2 inline int hsum_epi32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}

// 32 int32 values in [-128, 127] (four registers, in order) stored as 32 int8.
DLLM_AVX2 inline void store_32_int8(const __m256i q[4], int8_t* out) {
  const __m256i a = _mm256_packs_epi32(q[0], q[1]);  // lanes: q0[0:4] q1[0:4] | q0[4:8] q1[4:8]
  const __m256i b = _mm256_packs_epi32(q[2], q[3]);
  const __m256i c = _mm256_packs_epi16(a, b);  // lanes: q0[0:4] q1[0:4] q2[0:4] q3[0:4] | q0[4:8] ...
  const __m256i in_order = _mm256_permutevar8x32_epi32(c, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), in_order);
}

}  // namespace

DLLM_AVX2 void quantize_row_q8_K_avx2(const float* x, quant::BlockQ8_K* y, int64_t k) {
  for (int64_t b = 0; b < k / 256; ++b, x += 256) {
    quant::BlockQ8_K& out = y[b];
    __m256 v[32];
    __m256 amax = _mm256_setzero_ps();
    bool finite = true;
    for (int i = 0; i < 32; ++i) {
      v[i] = _mm256_loadu_ps(x + 8 * i);
      finite = finite && all_finite(v[i]);
      amax = _mm256_max_ps(amax, abs_ps(v[i]));
    }
    if (!finite) {
      quant::quantize_row_q8_K(x, &out, 256);
      continue;
    }
    const float am = hmax(amax);
    if (am == 0) {
      out = quant::BlockQ8_K{};
      continue;
    }
    // The first element whose magnitude is the maximum (the reference keeps the first on ties).
    float max = 0;
    const __m256 amv = _mm256_set1_ps(am);
    for (int i = 0; i < 32; ++i) {
      const int m = _mm256_movemask_ps(_mm256_cmp_ps(abs_ps(v[i]), amv, _CMP_EQ_OQ));
      if (m) {
        max = x[8 * i + __builtin_ctz(static_cast<unsigned>(m))];
        break;
      }
    }
    const float iscale = -127.f / max;
    const __m256 is = _mm256_set1_ps(iscale);
    const __m256i top = _mm256_set1_epi32(127);
    for (int g = 0; g < 8; ++g) {  // 32 values at a time
      __m256i q[4];
      for (int i = 0; i < 4; ++i) {
        // nearest_int: round half to even (the default rounding mode), then min(127, .).
        q[i] = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(is, v[4 * g + i])), top);
      }
      store_32_int8(q, out.qs + 32 * g);
      out.bsums[2 * g] = static_cast<int16_t>(hsum_epi32(_mm256_add_epi32(q[0], q[1])));
      out.bsums[2 * g + 1] = static_cast<int16_t>(hsum_epi32(_mm256_add_epi32(q[2], q[3])));
    }
    out.d = 1 / iscale;
  }
}

DLLM_AVX2 void quantize_row_q8_0_avx2(const float* x, quant::BlockQ8_0* y, int64_t k) {
  const __m256 half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
  for (int64_t b = 0; b < k / 32; ++b, x += 32) {
    __m256 v[4];
    bool finite = true;
    __m256 amax = _mm256_setzero_ps();
    for (int i = 0; i < 4; ++i) {
      v[i] = _mm256_loadu_ps(x + 8 * i);
      finite = finite && all_finite(v[i]);
      amax = _mm256_max_ps(amax, abs_ps(v[i]));
    }
    if (!finite) {
      quant::quantize_row_q8_0(x, &y[b], 32);
      continue;
    }
    const float d = hmax(amax) / 127;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    y[b].d = quant::f32_to_fp16(d);
    const __m256 idv = _mm256_set1_ps(id);
    __m256i q[4];
    for (int i = 0; i < 4; ++i) {
      const __m256 p = _mm256_mul_ps(v[i], idv);
      // round half away from zero (std::round): trunc, plus sign(p) when |p - trunc| >= 0.5 (exact).
      const __m256 t = _mm256_round_ps(p, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
      const __m256 up = _mm256_cmp_ps(abs_ps(_mm256_sub_ps(p, t)), half, _CMP_GE_OQ);
      const __m256 step = _mm256_and_ps(up, _mm256_or_ps(one, _mm256_and_ps(p, sign)));
      q[i] = _mm256_cvttps_epi32(_mm256_add_ps(t, step));
    }
    store_32_int8(q, y[b].qs);
  }
}

}  // namespace dllm::jit
