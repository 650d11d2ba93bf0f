// Q5_K models for the tests, made from the Q4_K_M fixtures (no Q5_K model with reference logits exists
// for the dense architectures): every Q4_K tensor rewritten as Q5_K, the rest of the file byte for byte.
//   Q5kMode::SameValues: the same d, dmin, scales and nibbles, high bits 0, so every weight keeps its
//     value exactly (ggml's Q5_K decoder gives d*sc*(q + 16*0) - dmin*m): the model's logits must equal
//     the Q4_K_M file's, and with it llama.cpp's agreement.
//   Q5kMode::HighBits: d halved (exact in fp16 for the fixtures' normal scales) and q5 = 2*q4 + a random
//     bit, so every high bit and nibble pattern occurs: a different model of the same shape.
#pragma once
#include <cstdint>
#include <string>

namespace dllm::test {

enum class Q5kMode { SameValues, HighBits };

// Writes `dst`; returns the number of tensors converted. Throws std::runtime_error on a malformed source.
int write_q4k_as_q5k(const std::string& src, const std::string& dst, Q5kMode mode, uint32_t seed = 1);

}  // namespace dllm::test
