// Vectorised twins of the reference activation quantizers (model/quant.h), bit-identical to them for
// finite input; a block holding an infinity or NaN is handed to the reference code. Compiled for
// AVX-512 F/BW (or AVX2) by function attributes: call only when the CPU has them.
#pragma once
#include <cstdint>

#include "model/quant.h"

namespace dllm::jit {

void quantize_row_q8_K_avx512(const float* x, quant::BlockQ8_K* y, int64_t k);
void quantize_row_q8_0_avx512(const float* x, quant::BlockQ8_0* y, int64_t k);

// The same on AVX2 (quant_act_avx2.cpp): call only when cpu_features().avx2 is set.
void quantize_row_q8_K_avx2(const float* x, quant::BlockQ8_K* y, int64_t k);
void quantize_row_q8_0_avx2(const float* x, quant::BlockQ8_0* y, int64_t k);

}  // namespace dllm::jit
