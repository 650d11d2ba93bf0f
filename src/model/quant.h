// Reference (portable, exact) decoders for ggml block formats: the ground truth every fast kernel is
// tested against. Plain float32 arithmetic in the order ggml's reference C code uses, compiled without
// floating-point contraction, so results are bit-identical to ggml's dequantize_row_* functions.
#pragma once
#include <cstddef>
#include <cstdint>

#include "model/ggml_types.h"

namespace dllm::quant {

// fp16 / bf16 <-> f32, exact (round to nearest even when narrowing).
float fp16_to_f32(uint16_t h);
uint16_t f32_to_fp16(float f);
float bf16_to_f32(uint16_t h);

// True when dequantize_row can decode this type:
// F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K Q4_K Q5_K Q6_K Q8_K IQ4_NL IQ4_XS.
bool can_dequantize(GgmlType t);

// Decodes n elements (n a multiple of the type's block size) starting at src into dst.
// Throws dllm::Error("unsupported GGUF tensor type: NAME") for a type it cannot decode.
void dequantize_row(GgmlType t, const void* src, float* dst, int64_t n);

}  // namespace dllm::quant
