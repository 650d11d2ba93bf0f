// AVX-512 activation quantizers, the same arithmetic as quant::quantize_row_q8_K / q8_0 in vector form:
// products rounded once (no contraction), round-half-even (Q8_K) and round-half-away (Q8_0) exactly as
// the scalar code, the first element of largest magnitude picked as the reference does.
// GCC 12 warns "__Y may be used uninitialized" inside its own AVX-512 intrinsics (the _mm512_undefined
// pass-through operands; GCC bug 105593, fixed in GCC 13): silence that one warning for this file.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cmath>

#include "jit/quant_act_simd.h"

namespace dllm::jit {

#define DLLM_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))

namespace {

DLLM_AVX512 inline __m512 abs_ps(__m512 v) {
  return _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x7fffffff)));
}

// True when every lane is finite (exponent not all ones).
DLLM_AVX512 inline bool all_finite(__m512 v) {
  const __m512i e = _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x7f800000));
  return _mm512_cmpeq_epi32_mask(e, _mm512_set1_epi32(0x7f800000)) == 0;
}

}  // namespace

DLLM_AVX512 void quantize_row_q8_K_avx512(const float* x, quant::BlockQ8_K* y, int64_t k) {
  for (int64_t b = 0; b < k / 256; ++b, x += 256) {
    quant::BlockQ8_K& out = y[b];
    __m512 v[16];
    __m512 amax = _mm512_setzero_ps();
    bool finite = true;
    for (int i = 0; i < 16; ++i) {
      v[i] = _mm512_loadu_ps(x + 16 * i);
      finite = finite && all_finite(v[i]);
      amax = _mm512_max_ps(amax, abs_ps(v[i]));
    }
    if (!finite) {
      quant::quantize_row_q8_K(x, &out, 256);
      continue;
    }
    const float am = _mm512_reduce_max_ps(amax);
    if (am == 0) {
      out = quant::BlockQ8_K{};
      continue;
    }
    // The first element whose magnitude is the maximum (the reference keeps the first on ties).
    float max = 0;
    const __m512 amv = _mm512_set1_ps(am);
    for (int i = 0; i < 16; ++i) {
      const __mmask16 m = _mm512_cmp_ps_mask(abs_ps(v[i]), amv, _CMP_EQ_OQ);
      if (m) {
        max = x[16 * i + __builtin_ctz(m)];
        break;
      }
    }
    const float iscale = -127.f / max;
    const __m512 is = _mm512_set1_ps(iscale);
    const __m512i top = _mm512_set1_epi32(127);
    for (int i = 0; i < 16; ++i) {
      // nearest_int: round half to even (the default rounding mode), then min(127, .).
      __m512i q = _mm512_cvt_roundps_epi32(_mm512_mul_ps(is, v[i]), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      q = _mm512_min_epi32(q, top);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out.qs + 16 * i), _mm512_cvtsepi32_epi8(q));
      out.bsums[i] = static_cast<int16_t>(_mm512_reduce_add_epi32(q));
    }
    out.d = 1 / iscale;
  }
}

DLLM_AVX512 void quantize_row_q8_0_avx512(const float* x, quant::BlockQ8_0* y, int64_t k) {
  const __m512 half = _mm512_set1_ps(0.5f);
  for (int64_t b = 0; b < k / 32; ++b, x += 32) {
    const __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
    if (!all_finite(v0) || !all_finite(v1)) {
      quant::quantize_row_q8_0(x, &y[b], 32);
      continue;
    }
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(abs_ps(v0), abs_ps(v1)));
    const float d = amax / 127;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    y[b].d = quant::f32_to_fp16(d);
    const __m512 idv = _mm512_set1_ps(id);
    for (int h = 0; h < 2; ++h) {
      const __m512 p = _mm512_mul_ps(h ? v1 : v0, idv);
      // round half away from zero (std::round): trunc, plus sign(p) when |p - trunc| >= 0.5 (exact).
      const __m512 t = _mm512_roundscale_ps(p, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
      const __mmask16 up = _mm512_cmp_ps_mask(abs_ps(_mm512_sub_ps(p, t)), half, _CMP_GE_OQ);
      const __m512 one = _mm512_or_ps(_mm512_set1_ps(1.0f), _mm512_and_ps(p, _mm512_set1_ps(-0.0f)));
      const __m512 r = _mm512_mask_add_ps(t, up, t, one);
      const __m512i q = _mm512_cvttps_epi32(r);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(y[b].qs + 16 * h), _mm512_cvtsepi32_epi8(q));
    }
  }
}

}  // namespace dllm::jit
