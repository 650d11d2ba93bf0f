// Reference decoders for ggml block formats and the reference Q8_K / Q8_0 activation quantizers.
// One function per type, written for reading: each mirrors the arithmetic order of ggml's reference C
// code (e.g. Q4_K is (d*sc)*q - dmin*m) so that, built with -ffp-contract=off, the output is bit-identical
// to ggml's dequantize_row_* and gguf-py. Blocks are copied out of the source bytes with memcpy, so the
// source needs no alignment.
#include "model/quant.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <string>

#include "common/error.h"

static_assert(std::endian::native == std::endian::little, "GGUF blocks are little-endian");

namespace dllm::quant {

// ---------------------------------------------------------------------------------------------
// fp16 / bf16
// ---------------------------------------------------------------------------------------------

float fp16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {  // inf / NaN: keep the payload
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {  // normal
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  } else if (mant == 0) {  // +-0
    bits = sign;
  } else {  // subnormal: mant * 2^-24, renormalised
    int e = 127 - 15 + 1;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --e;
    }
    bits = sign | (static_cast<uint32_t>(e) << 23) | ((mant & 0x3ffu) << 13);
  }
  return std::bit_cast<float>(bits);
}

uint16_t f32_to_fp16(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) {  // NaN: quiet, keep the top of the payload
    return static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));
  }
  if (abs >= 0x477ff000u) {  // >= 65520 rounds to inf (65504 is the largest finite half)
    return static_cast<uint16_t>(sign | 0x7c00u);
  }
  if (abs < 0x38800000u) {  // below 2^-14: a half subnormal (or zero); units of 2^-24
    const uint32_t e = abs >> 23;
    if (e < 102) return sign;  // < 2^-25: rounds to zero (f32 subnormals included)
    const uint32_t m = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - e;  // 14..24
    uint32_t q = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (q & 1u))) ++q;  // may carry into the smallest normal
    return static_cast<uint16_t>(sign | q);
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped mantissa bits to nearest even.
  uint32_t h = (abs - (112u << 23)) >> 13;
  const uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // a carry may reach inf: correct
  return static_cast<uint16_t>(sign | h);
}

float bf16_to_f32(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

uint16_t f32_to_bf16(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

// ---------------------------------------------------------------------------------------------
// Shared pieces
// ---------------------------------------------------------------------------------------------

const int8_t kIQ4NLValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

void scale_min_k4(int j, const uint8_t* q, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// Chunk c = k/64 of a Q4_K block is 32 bytes: low nibbles are elements 0..31, high nibbles 32..63.
int q4_k_quant(const BlockQ4_K& b, int k) {
  const int c = k / 64, r = k % 64;
  const uint8_t byte = b.qs[32 * c + r % 32];
  return r < 32 ? (byte & 0xf) : (byte >> 4);
}

// Q5_K: Q4_K's nibbles plus a fifth bit: element l of chunk c takes bit 2c (l < 32 of the chunk, the low
// nibbles) or 2c+1 (the high nibbles) of qh[l % 32].
int q5_k_quant(const BlockQ5_K& b, int k) {
  const int c = k / 64, r = k % 64;
  const uint8_t byte = b.qs[32 * c + r % 32];
  const int low4 = r < 32 ? (byte & 0xf) : (byte >> 4);
  const int bit = (b.qh[r % 32] >> (2 * c + (r < 32 ? 0 : 1))) & 1;
  return low4 | bit << 4;
}

int q5_0_quant(const BlockQ5_0& b, int j) {
  const int low4 = j < 16 ? (b.qs[j] & 0xf) : (b.qs[j - 16] >> 4);
  return low4 | static_cast<int>((b.qh[j / 8] >> (j % 8)) & 1) << 4;
}

// The 6-bit quant at position k (0..255) of a Q6_K block, in -32..31. Within each half of 128:
// elements l, l+32, l+64, l+96 (l < 32) take ql[l] low, ql[l+32] low, ql[l] high, ql[l+32] high,
// with qh[l] bits 0-1, 2-3, 4-5, 6-7 on top.
int q6_k_quant(const BlockQ6_K& b, int k) {
  const int half = k / 128, r = k % 128;
  const int l = r % 32, quarter = r / 32;
  const uint8_t* ql = b.ql + 64 * half;
  const uint8_t* qh = b.qh + 32 * half;
  const int low = (quarter & 1) ? ql[l + 32] : ql[l];
  const int low4 = quarter < 2 ? (low & 0xf) : (low >> 4);
  const int high2 = (qh[l] >> (2 * quarter)) & 3;
  return (low4 | (high2 << 4)) - 32;
}

namespace {

// Block i of a row, copied out so that the source pointer may have any alignment.
template <class Block>
Block load_block(const void* src, int64_t i) {
  Block b;
  std::memcpy(&b, static_cast<const uint8_t*>(src) + i * static_cast<int64_t>(sizeof(Block)), sizeof(Block));
  return b;
}

float h2f(uint16_t h) { return fp16_to_f32(h); }

// ---------------------------------------------------------------------------------------------
// Plain floats
// ---------------------------------------------------------------------------------------------

void dequant_f32(const void* src, float* y, int64_t n) { std::memcpy(y, src, static_cast<size_t>(n) * 4); }

void dequant_f16(const void* src, float* y, int64_t n) {
  const auto* p = static_cast<const uint8_t*>(src);
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, p + 2 * i, 2);
    y[i] = fp16_to_f32(h);
  }
}

void dequant_bf16(const void* src, float* y, int64_t n) {
  const auto* p = static_cast<const uint8_t*>(src);
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, p + 2 * i, 2);
    y[i] = bf16_to_f32(h);
  }
}

// ---------------------------------------------------------------------------------------------
// 32-element blocks. Element j of a block is the low nibble of qs[j], element j+16 the high nibble.
// ---------------------------------------------------------------------------------------------

void dequant_q4_0(const void* src, float* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK; ++i, y += kQK) {
    const auto b = load_block<BlockQ4_0>(src, i);
    const float d = h2f(b.d);
    for (int j = 0; j < kQK / 2; ++j) {
      const int x0 = (b.qs[j] & 0x0f) - 8;
      const int x1 = (b.qs[j] >> 4) - 8;
      y[j] = x0 * d;
      y[j + kQK / 2] = x1 * d;
    }
  }
}

void dequant_q4_1(const void* src, float* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK; ++i, y += kQK) {
    const auto b = load_block<BlockQ4_1>(src, i);
    const float d = h2f(b.d);
    const float m = h2f(b.m);
    for (int j = 0; j < kQK / 2; ++j) {
      const int x0 = b.qs[j] & 0x0f;
      const int x1 = b.qs[j] >> 4;
      y[j] = x0 * d + m;
      y[j + kQK / 2] = x1 * d + m;
    }
  }
}

// Bit j of qh (a little-endian u32) is the 5th bit of element j, for j in 0..31.
uint32_t q5_high_bits(const uint8_t qh[4]) {
  uint32_t v;
  std::memcpy(&v, qh, 4);
  return v;
}

void dequant_q5_0(const void* src, float* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK; ++i, y += kQK) {
    const auto b = load_block<BlockQ5_0>(src, i);
    const float d = h2f(b.d);
    const uint32_t qh = q5_high_bits(b.qh);
    for (int j = 0; j < kQK / 2; ++j) {
      const int h0 = ((qh >> j) & 1u) << 4;
      const int h1 = ((qh >> (j + 16)) & 1u) << 4;
      const int x0 = ((b.qs[j] & 0x0f) | h0) - 16;
      const int x1 = ((b.qs[j] >> 4) | h1) - 16;
      y[j] = x0 * d;
      y[j + kQK / 2] = x1 * d;
    }
  }
}

void dequant_q5_1(const void* src, float* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK; ++i, y += kQK) {
    const auto b = load_block<BlockQ5_1>(src, i);
    const float d = h2f(b.d);
    const float m = h2f(b.m);
    const uint32_t qh = q5_high_bits(b.qh);
    for (int j = 0; j < kQK / 2; ++j) {
      const int h0 = ((qh >> j) & 1u) << 4;
      const int h1 = ((qh >> (j + 16)) & 1u) << 4;
      const int x0 = (b.qs[j] & 0x0f) | h0;
      const int x1 = (b.qs[j] >> 4) | h1;
      y[j] = x0 * d + m;
      y[j + kQK / 2] = x1 * d + m;
    }
  }
}

void dequant_q8_0(const void* src, float* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK; ++i, y += kQK) {
    const auto b = load_block<BlockQ8_0>(src, i);
    const float d = h2f(b.d);
    for (int j = 0; j < kQK; ++j) y[j] = b.qs[j] * d;
  }
}

void dequant_iq4_nl(const void* src, float* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK; ++i, y += kQK) {
    const auto b = load_block<BlockIQ4_NL>(src, i);
    const float d = h2f(b.d);
    for (int j = 0; j < kQK / 2; ++j) {
      y[j] = d * kIQ4NLValues[b.qs[j] & 0x0f];
      y[j + kQK / 2] = d * kIQ4NLValues[b.qs[j] >> 4];
    }
  }
}

// ---------------------------------------------------------------------------------------------
// K-quants: super-blocks of 256.
// ---------------------------------------------------------------------------------------------

// Q2_K: two halves of 128; in each, 4 bit-planes (shift 0,2,4,6) of 32 bytes, each plane two
// sub-blocks of 16 with their own 4-bit scale and min.
void dequant_q2_k(const void* src, float* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const auto b = load_block<BlockQ2_K>(src, i);
    const float d = h2f(b.d);
    const float min = h2f(b.dmin);
    const uint8_t* q = b.qs;
    int is = 0;
    for (int half = 0; half < 2; ++half, q += 32) {
      for (int shift = 0; shift < 8; shift += 2) {
        for (int sub = 0; sub < 2; ++sub) {
          const uint8_t sc = b.scales[is++];
          const float dl = d * (sc & 0xf);
          const float ml = min * (sc >> 4);
          for (int l = 0; l < 16; ++l) *y++ = dl * ((q[l + 16 * sub] >> shift) & 3) - ml;
        }
      }
    }
  }
}

// The 16 signed 6-bit scales of a Q3_K block (offset 32 removed).
void q3_k_scales(const uint8_t packed[12], int out[16]) {
  for (int j = 0; j < 16; ++j) {
    const int low = j < 8 ? (packed[j] & 0xf) : (packed[j - 8] >> 4);
    const int high = (packed[8 + j % 4] >> (2 * (j / 4))) & 3;
    out[j] = (low | (high << 4)) - 32;
  }
}

// Q3_K: layout like Q2_K; a quant is its 2 low bits minus 4 unless its hmask bit is set. The hmask bit
// walks one position per bit-plane across both halves (bit 0..3 in the first half, 4..7 in the second).
void dequant_q3_k(const void* src, float* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const auto b = load_block<BlockQ3_K>(src, i);
    const float d_all = h2f(b.d);
    int scales[16];
    q3_k_scales(b.scales, scales);
    const uint8_t* q = b.qs;
    uint8_t m = 1;
    int is = 0;
    for (int half = 0; half < 2; ++half, q += 32) {
      for (int shift = 0; shift < 8; shift += 2, m = static_cast<uint8_t>(m << 1)) {
        for (int sub = 0; sub < 2; ++sub) {
          const float dl = d_all * scales[is++];
          for (int l = 0; l < 16; ++l) {
            const int k = l + 16 * sub;
            const int v = ((q[k] >> shift) & 3) - ((b.hmask[k] & m) ? 0 : 4);
            *y++ = dl * v;
          }
        }
      }
    }
  }
}

// Q4_K: 4 chunks of 64; each chunk is 32 bytes, low nibbles = sub-block 2c, high nibbles = 2c+1.
void dequant_q4_k(const void* src, float* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const auto b = load_block<BlockQ4_K>(src, i);
    const float d = h2f(b.d);
    const float min = h2f(b.dmin);
    const uint8_t* q = b.qs;
    for (int c = 0; c < 4; ++c, q += 32) {
      uint8_t sc, m;
      scale_min_k4(2 * c, b.scales, &sc, &m);
      const float d1 = d * sc;
      const float m1 = min * m;
      scale_min_k4(2 * c + 1, b.scales, &sc, &m);
      const float d2 = d * sc;
      const float m2 = min * m;
      for (int l = 0; l < 32; ++l) *y++ = d1 * (q[l] & 0xf) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * (q[l] >> 4) - m2;
    }
  }
}

// Q5_K: Q4_K plus a 5th bit; chunk c takes bits 2c (low nibbles) and 2c+1 (high nibbles) of qh[l].
void dequant_q5_k(const void* src, float* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const auto b = load_block<BlockQ5_K>(src, i);
    const float d = h2f(b.d);
    const float min = h2f(b.dmin);
    const uint8_t* ql = b.qs;
    for (int c = 0; c < 4; ++c, ql += 32) {
      uint8_t sc, m;
      scale_min_k4(2 * c, b.scales, &sc, &m);
      const float d1 = d * sc;
      const float m1 = min * m;
      scale_min_k4(2 * c + 1, b.scales, &sc, &m);
      const float d2 = d * sc;
      const float m2 = min * m;
      const uint8_t u1 = static_cast<uint8_t>(1u << (2 * c));
      const uint8_t u2 = static_cast<uint8_t>(2u << (2 * c));
      for (int l = 0; l < 32; ++l) *y++ = d1 * ((ql[l] & 0xf) + ((b.qh[l] & u1) ? 16 : 0)) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * ((ql[l] >> 4) + ((b.qh[l] & u2) ? 16 : 0)) - m2;
    }
  }
}

// Q6_K: 16 sub-blocks of 16, int8 scales; x = (d * sc) * q (q6_k_quant's layout, written as loops over
// 32 elements that vectorise: the self-conditioning decodes the whole embedding table every step).
void dequant_q6_k(const void* src, float* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i, y += kQK_K) {
    const auto b = load_block<BlockQ6_K>(src, i);
    const float d = h2f(b.d);
    for (int half = 0; half < 2; ++half) {
      const uint8_t* ql = b.ql + 64 * half;
      const uint8_t* qh = b.qh + 32 * half;
      for (int quarter = 0; quarter < 4; ++quarter) {
        const uint8_t* low = ql + ((quarter & 1) ? 32 : 0);
        const int shift = quarter < 2 ? 0 : 4;
        const int k0 = 128 * half + 32 * quarter;
        const float ds0 = d * static_cast<float>(b.scales[k0 / 16]), ds1 = d * static_cast<float>(b.scales[k0 / 16 + 1]);
        float* out = y + k0;
        for (int l = 0; l < 32; ++l) {
          const int q = (((low[l] >> shift) & 0xf) | (((qh[l] >> (2 * quarter)) & 3) << 4)) - 32;
          out[l] = (l < 16 ? ds0 : ds1) * static_cast<float>(q);
        }
      }
    }
  }
}

void dequant_q8_k(const void* src, float* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i, y += kQK_K) {
    const auto b = load_block<BlockQ8_K>(src, i);
    for (int k = 0; k < kQK_K; ++k) y[k] = b.d * b.qs[k];
  }
}

// IQ4_XS: 8 sub-blocks of 32 with 6-bit scales (offset 32); quants index the IQ4_NL code book.
void dequant_iq4_xs(const void* src, float* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const auto b = load_block<BlockIQ4_XS>(src, i);
    const float d = h2f(b.d);
    const uint8_t* qs = b.qs;
    for (int ib = 0; ib < kQK_K / 32; ++ib, y += 32, qs += 16) {
      const int ls = ((b.scales_l[ib / 2] >> (4 * (ib % 2))) & 0xf) | (((b.scales_h >> (2 * ib)) & 3) << 4);
      const float dl = d * (ls - 32);
      for (int j = 0; j < 16; ++j) {
        y[j] = dl * kIQ4NLValues[qs[j] & 0xf];
        y[j + 16] = dl * kIQ4NLValues[qs[j] >> 4];
      }
    }
  }
}

using DequantFn = void (*)(const void*, float*, int64_t);

DequantFn dequant_fn(GgmlType t) {
  switch (t) {
    case GgmlType::F32: return dequant_f32;
    case GgmlType::F16: return dequant_f16;
    case GgmlType::BF16: return dequant_bf16;
    case GgmlType::Q4_0: return dequant_q4_0;
    case GgmlType::Q4_1: return dequant_q4_1;
    case GgmlType::Q5_0: return dequant_q5_0;
    case GgmlType::Q5_1: return dequant_q5_1;
    case GgmlType::Q8_0: return dequant_q8_0;
    case GgmlType::Q2_K: return dequant_q2_k;
    case GgmlType::Q3_K: return dequant_q3_k;
    case GgmlType::Q4_K: return dequant_q4_k;
    case GgmlType::Q5_K: return dequant_q5_k;
    case GgmlType::Q6_K: return dequant_q6_k;
    case GgmlType::Q8_K: return dequant_q8_k;
    case GgmlType::IQ4_NL: return dequant_iq4_nl;
    case GgmlType::IQ4_XS: return dequant_iq4_xs;
    default: return nullptr;
  }
}

// ggml's nearest_int: round to nearest, ties to even (valid for |x| < 2^22, which callers guarantee).
int nearest_int(float x) { return static_cast<int>(std::nearbyint(x)); }

}  // namespace

bool can_dequantize(GgmlType t) { return dequant_fn(t) != nullptr; }

void dequantize_row(GgmlType t, const void* src, float* dst, int64_t n) {
  const DequantFn fn = dequant_fn(t);
  if (fn == nullptr) throw Error("unsupported GGUF tensor type: " + ggml_type_name(t));
  const auto info = ggml_type_info(static_cast<uint32_t>(t));
  if (n < 0 || (info && n % info->block_size != 0)) {
    throw Error("cannot decode " + std::to_string(n) + " elements of " + ggml_type_name(t) +
                ": not a multiple of its block size " + std::to_string(info ? info->block_size : 1));
  }
  fn(src, dst, n);
}

// ---------------------------------------------------------------------------------------------
// Activation quantizers
// ---------------------------------------------------------------------------------------------

void quantize_row_q8_K(const float* x, BlockQ8_K* y, int64_t n) {
  if (n < 0 || n % kQK_K != 0) throw Error("quantize_row_q8_K: n = " + std::to_string(n) + " is not a multiple of 256");
  for (int64_t i = 0; i < n / kQK_K; ++i, x += kQK_K) {
    BlockQ8_K& b = y[i];
    float max = 0, amax = 0;
    for (int j = 0; j < kQK_K; ++j) {
      const float ax = std::fabs(x[j]);
      if (ax > amax) {
        amax = ax;
        max = x[j];
      }
    }
    if (amax == 0) {  // ggml leaves bsums untouched here; we zero them
      b = BlockQ8_K{};
      continue;
    }
    const float iscale = -127.f / max;
    for (int j = 0; j < kQK_K; ++j) {
      const int v = nearest_int(iscale * x[j]);
      b.qs[j] = static_cast<int8_t>(v < 127 ? v : 127);
    }
    for (int j = 0; j < kQK_K / 16; ++j) {
      int sum = 0;
      for (int l = 0; l < 16; ++l) sum += b.qs[16 * j + l];
      b.bsums[j] = static_cast<int16_t>(sum);
    }
    b.d = 1 / iscale;
  }
}

void quantize_row_q8_0(const float* x, BlockQ8_0* y, int64_t n) {
  if (n < 0 || n % kQK != 0) throw Error("quantize_row_q8_0: n = " + std::to_string(n) + " is not a multiple of 32");
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK) {
    float amax = 0;
    for (int j = 0; j < kQK; ++j) {
      const float ax = std::fabs(x[j]);
      amax = amax > ax ? amax : ax;
    }
    const float d = amax / 127;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    y[i].d = f32_to_fp16(d);
    for (int j = 0; j < kQK; ++j) y[i].qs[j] = static_cast<int8_t>(std::round(x[j] * id));
  }
}

}  // namespace dllm::quant
