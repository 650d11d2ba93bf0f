// Element-wise math that the compiler can vectorise (no calls, no branches): f32 functions, and f64 ones written
// once for a scalar and for eight lanes of a GCC vector.
#pragma once
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace dllm::model {

// The sum of eight partial sums (element i of a row into lane i % 8) in one fixed order, so that the vector width
// a clone runs with never changes a result: dot_f64, dot4_f64 and the sampler's exponential sums.
inline double sum_lanes8(const double* s) {
  return ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
}

// Cephes' single-precision exponential: e^x = 2^n * e^r with n = round(x log2 e), r = x - n ln2 (ln2 split
// in two so that n * kLn2Hi is exact), e^r = 1 + r + r^2 * P(r) with P of degree 5. Shared by exp_f32 below
// and the vector exponentials of the CPU flash attention (src/jit/attention).
namespace cephes_expf {
inline constexpr float kLog2e = 1.44269504088896341f, kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
inline constexpr float kP0 = 1.9875691500e-4f, kP1 = 1.3981999507e-3f, kP2 = 8.3334519073e-3f,
                       kP3 = 4.1665795894e-2f, kP4 = 1.6666665459e-1f, kP5 = 5.0000001201e-1f;
}  // namespace cephes_expf

// e^x in f32 for x in [-87.3, 88.3] (clamped outside, so that 2^n stays a normal number built from the
// exponent bits; NaN counts as 0), within 2 ulp. Written so that the compiler vectorises a loop over it
// (no calls, no branches).
inline float exp_f32(float x) {
  using namespace cephes_expf;
  x = x < -87.3f ? -87.3f : x > 88.3f ? 88.3f : x == x ? x : 0.0f;  // the int conversion below needs a number
  const float n = (x * kLog2e + 12582912.0f) - 12582912.0f;         // round to nearest
  const float r = (x - n * kLn2Hi) - n * kLn2Lo;
  float p = kP0;
  p = p * r + kP1;
  p = p * r + kP2;
  p = p * r + kP3;
  p = p * r + kP4;
  p = p * r + kP5;
  const float er = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  return er * std::bit_cast<float>(bits);
}

// Eight doubles in one GCC vector (a zmm on AVX-512, two ymm on AVX2, four xmm otherwise), its lane masks, and
// what turns scalar code into code on them: lanes computed with the same operations in the same order as the
// scalar code, so a vectorised sum or exponential equals the scalar one lane by lane in every clone. Functions
// that take or return them by value must be inlined (a vector argument's ABI differs between the clones).
typedef double F64x8 __attribute__((vector_size(64)));
typedef int64_t I64x8 __attribute__((vector_size(64)));
typedef float F32x8 __attribute__((vector_size(32)));
typedef float F32x16 __attribute__((vector_size(64)));  // sixteen floats (self-conditioning's sums)

// The helpers below are always inlined, so their vector arguments and results never cross a call: GCC's
// warning that such a signature's ABI differs between AVX-512 and the other clones (-Wpsabi) does not apply;
// files that use them turn it off.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"
template <class T> struct Lanes { using Int = int64_t; };
template <> struct Lanes<F64x8> { using Int = I64x8; };

// c ? a : b per lane (c: a bool, or a lane mask from a vector comparison).
template <class T, class C>
[[gnu::always_inline]] inline T select(const C& c, const T& a, const T& b) {
  return c ? a : b;
}
// v in every lane.
template <class T>
[[gnu::always_inline]] inline T splat(double v) {
  if constexpr (std::is_same_v<T, double>) return v;
  else return T{v, v, v, v, v, v, v, v};
}
// out = the eight floats at p, as doubles.
[[gnu::always_inline]] inline void load8_f64(F64x8& out, const float* p) {
  F32x8 f;
  std::memcpy(&f, p, sizeof f);
  out = __builtin_convertvector(f, F64x8);
}

// e^x in double for x in [-708, 709] (clamped outside), within about 1 ulp; NaN stays NaN. Range
// reduction x = n ln2 + r (|r| <= ln2/2, ln2 split so that n * ln2_hi is exact), then the Taylor series
// of e^r to degree 13 (truncation below 1e-17 relative) and 2^n through the exponent bits. T is double or
// F64x8 (the same operations on each lane).
template <class T>
[[gnu::always_inline]] inline void exp_f64_into(T& out, const T& x) {
  using I = typename Lanes<T>::Int;
  const T xc =
      select(x < -708.0, splat<T>(-708.0), select(x > 709.0, splat<T>(709.0), select(x == x, x, splat<T>(0.0))));
  constexpr double kShift = 6755399441055744.0;  // 1.5 * 2^52: adding it rounds to an integer in the low bits
  const T shifted = xc * 1.4426950408889634 + kShift;
  const T n = shifted - kShift;
  const T r = (xc - n * 6.93147180369123816490e-01) - n * 1.90821492927058770002e-10;
  T p = splat<T>(1.0 / 6227020800.0);  // 1/13!
  p = p * r + 1.0 / 479001600.0;
  p = p * r + 1.0 / 39916800.0;
  p = p * r + 1.0 / 3628800.0;
  p = p * r + 1.0 / 362880.0;
  p = p * r + 1.0 / 40320.0;
  p = p * r + 1.0 / 5040.0;
  p = p * r + 1.0 / 720.0;
  p = p * r + 1.0 / 120.0;
  p = p * r + 1.0 / 24.0;
  p = p * r + 1.0 / 6.0;
  p = p * r + 0.5;
  p = p * r + 1.0;
  p = p * r + 1.0;
  // n as an integer without a double -> int64 conversion (which AVX2 lacks): the difference of the bits.
  const I ni = std::bit_cast<I>(shifted) - std::bit_cast<int64_t>(kShift);
  const I bits = (ni + 1023) << 52;
  const T e = p * std::bit_cast<T>(bits);
  out = select(x == x, e, x);
}

#pragma GCC diagnostic pop

inline double exp_f64(double x) {
  double e;
  exp_f64_into(e, x);
  return e;
}

// tanh(x) in double, vectorisable (no branches, no calls): the odd Taylor polynomial below 1/16 (terms to
// x^11: relative error below 1e-14), (e^{2|x|} - 1) / (e^{2|x|} + 1) above (exp_f64; 2|x| capped at 40, where
// tanh is 1 in double), the sign put back; NaN stays NaN. Rounded to f32 it is tanhf's value up to the last bit (test_forward).
inline double tanh_f64(double x) {
  const double a = std::fabs(x), a2 = a * a;
  double p = -1382.0 / 155925.0;
  p = p * a2 + 62.0 / 2835.0;
  p = p * a2 - 17.0 / 315.0;
  p = p * a2 + 2.0 / 15.0;
  p = p * a2 - 1.0 / 3.0;
  const double small = a + a * a2 * p;
  const double e = exp_f64(a < 20.0 ? 2.0 * a : 40.0);
  const double big = (e - 1.0) / (e + 1.0);
  return x == x ? std::copysign(a < 0.0625 ? small : big, x) : x;
}

}  // namespace dllm::model
