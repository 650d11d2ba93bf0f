// Reference (portable, exact) decoders for ggml block formats: the ground truth every fast kernel is
// tested against. Plain float32 arithmetic in the order ggml's reference C code uses, compiled without
// floating-point contraction, so results are bit-identical to ggml's dequantize_row_* functions.
// Also: the block layouts themselves and the reference int8 activation quantizers (Q8_K, Q8_0).
#pragma once
#include <cstddef>
#include <cstdint>

#include "model/ggml_types.h"

namespace dllm::quant {

// fp16 / bf16 <-> f32, exact (round to nearest even when narrowing).
float fp16_to_f32(uint16_t h);
uint16_t f32_to_fp16(float f);
float bf16_to_f32(uint16_t h);
// f32 -> bf16 as ggml does it: round to nearest even; NaN stays NaN (forced quiet), sign kept.
uint16_t f32_to_bf16(float f);

// True when dequantize_row can decode this type:
// F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K Q4_K Q5_K Q6_K Q8_K IQ4_NL IQ4_XS.
bool can_dequantize(GgmlType t);

// Decodes n elements (n a multiple of the type's block size) starting at src into dst.
// Throws dllm::Error("unsupported GGUF tensor type: NAME") for a type it cannot decode.
// src needs no particular alignment.
void dequantize_row(GgmlType t, const void* src, float* dst, int64_t n);

// ---- Block layouts, byte for byte as GGUF stores them (little-endian; fp16 scales as raw bits). ----
// Field names follow ggml's ggml-common.h so the two can be read side by side.

inline constexpr int kQK = 32;    // elements per block of the 32-element formats
inline constexpr int kQK_K = 256; // elements per K-quant super-block

struct BlockQ4_0 { uint16_t d; uint8_t qs[kQK / 2]; };                    // q = nibble - 8
struct BlockQ4_1 { uint16_t d, m; uint8_t qs[kQK / 2]; };                 // x = q*d + m
struct BlockQ5_0 { uint16_t d; uint8_t qh[4]; uint8_t qs[kQK / 2]; };     // 5th bits in qh (LE u32)
struct BlockQ5_1 { uint16_t d, m; uint8_t qh[4]; uint8_t qs[kQK / 2]; };
struct BlockQ8_0 { uint16_t d; int8_t qs[kQK]; };
struct BlockQ2_K {
  uint8_t scales[kQK_K / 16];  // low nibble: scale, high nibble: min (per 16 elements)
  uint8_t qs[kQK_K / 4];       // 2-bit quants
  uint16_t d, dmin;
};
struct BlockQ3_K {
  uint8_t hmask[kQK_K / 8];  // high bit of each quant (set = no -4 offset)
  uint8_t qs[kQK_K / 4];     // low 2 bits
  uint8_t scales[12];        // 16 6-bit scales, offset by 32
  uint16_t d;
};
struct BlockQ4_K {
  uint16_t d, dmin;
  uint8_t scales[12];  // 8 6-bit scales and 8 6-bit mins (see scale_min_k4)
  uint8_t qs[kQK_K / 2];
};
struct BlockQ5_K {
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qh[kQK_K / 8];
  uint8_t qs[kQK_K / 2];
};
struct BlockQ6_K {
  uint8_t ql[kQK_K / 2];  // low 4 bits
  uint8_t qh[kQK_K / 4];  // high 2 bits
  int8_t scales[kQK_K / 16];
  uint16_t d;
};
struct BlockQ8_K {
  float d;                      // a float32, not fp16
  int8_t qs[kQK_K];
  int16_t bsums[kQK_K / 16];    // sums of 16 consecutive qs
};
struct BlockIQ4_NL { uint16_t d; uint8_t qs[kQK / 2]; };
struct BlockIQ4_XS {
  uint16_t d;
  uint16_t scales_h;            // high 2 bits of the 8 6-bit sub-block scales
  uint8_t scales_l[kQK_K / 64]; // low 4 bits
  uint8_t qs[kQK_K / 2];
};

static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ5_0) == 22 &&
              sizeof(BlockQ5_1) == 24 && sizeof(BlockQ8_0) == 34 && sizeof(BlockIQ4_NL) == 18);
static_assert(sizeof(BlockQ2_K) == 84 && sizeof(BlockQ3_K) == 110 && sizeof(BlockQ4_K) == 144 &&
              sizeof(BlockQ5_K) == 176 && sizeof(BlockQ6_K) == 210 && sizeof(BlockQ8_K) == 292 &&
              sizeof(BlockIQ4_XS) == 136);

// The non-linear 4-bit code book of IQ4_NL / IQ4_XS.
extern const int8_t kIQ4NLValues[16];

// Sub-block j (0..7) scale and min of a Q4_K / Q5_K block: 6-bit values packed into 12 bytes.
void scale_min_k4(int j, const uint8_t* scales, uint8_t* sc, uint8_t* m);
// Quant k (0..255) of a super-block, in element order: Q4_K in 0..15, Q5_K in 0..31, Q6_K in -32..31.
int q4_k_quant(const BlockQ4_K& b, int k);
int q5_k_quant(const BlockQ5_K& b, int k);
int q6_k_quant(const BlockQ6_K& b, int k);
// Quant j (0..31) of a Q5_0 block in 0..31 (the value is d * (q - 16)): the low nibble of qs[j % 16]
// (j < 16) or its high nibble, with bit j of qh (a little-endian u32) as bit 4.
int q5_0_quant(const BlockQ5_0& b, int j);

// ---- Reference activation quantizers ----

// ggml's quantize_row_q8_K_ref. Per block of 256: max = the element of largest |x| (first on ties, sign
// kept); all-zero block -> d = 0, qs = 0, bsums = 0; else iscale = -127/max,
// qs = min(127, round-half-even(iscale*x)), d = 1/iscale (negative when max > 0), bsums = sums of 16 qs.
// n must be a multiple of 256.
void quantize_row_q8_K(const float* x, BlockQ8_K* y, int64_t n);

// ggml's quantize_row_q8_0_ref. Per block of 32: d = amax/127 (stored as fp16), id = 1/d (0 when d = 0),
// qs = roundf(x*id) (half away from zero; the float d, not its fp16 rounding, sets id).
// n must be a multiple of 32.
void quantize_row_q8_0(const float* x, BlockQ8_0* y, int64_t n);

}  // namespace dllm::quant
