// Element-wise math in f32 that the compiler can vectorise (no calls, no branches).
#pragma once
#include <bit>
#include <cstdint>

namespace dllm::model {

// e^x in f32 for x in [-87.3, 88.3] (clamped outside; NaN counts as 0), within 2 ulp: Cody-Waite range reduction
// x = n ln2 + r and Cephes' degree-6 polynomial for e^r, then 2^n through the exponent bits. Written so
// that the compiler vectorises a loop over it (no calls, no branches).
inline float exp_f32(float x) {
  x = x < -87.3f ? -87.3f : x > 88.3f ? 88.3f : x == x ? x : 0.0f;  // the int conversion below needs a number
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round to nearest
  const float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float er = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  return er * std::bit_cast<float>(bits);
}

}  // namespace dllm::model
