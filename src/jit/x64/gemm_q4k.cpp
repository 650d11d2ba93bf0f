// Q4_K x Q8_K block body: 8 sub-blocks of 32 4-bit weights. Per sub-block the int8 dot products go into
// one int32 register per row, which is then scaled by the 6-bit sub-block scale into the super-block
// sum (ggml's sumi, exact); the mins term is sum_j mins[j] * (sum of the 32 activations of sub-block j),
// two sub-blocks per vpdpwssd. Then, as ggml: acc += (d_w*d_a) * sumi - (dmin_w*d_a) * summins.
#include "jit/x64/gemm_gen.h"

namespace dllm::jit {

template <class Vmm>
void GemmGenerator<Vmm>::body_q4k() {
  const Vmm raw = vtmp(0), lo = vtmp(1), hi = vtmp(2), sc = vtmp(3);
  for (int s = 0; s < 8; ++s) {
    for (int r = 0; r < m_; ++r) vzero(vdot(r));
    for (int j = 0; j < 4; ++j) {
      // Low nibbles: k = 32s + 4j + (0..3); high nibbles: the same + 16.
      load_vec(raw, reg_wq_ + (4 * s + j) * kVB);
      and_mask0f(lo, raw);
      vpsrlw(hi, raw, 4);
      and_mask0f(hi, hi);
      for (int r = 0; r < m_; ++r) dot_u8s8(vdot(r), lo, xq(r, 32 * s + 4 * j));
      for (int r = 0; r < m_; ++r) dot_u8s8(vdot(r), hi, xq(r, 32 * s + 4 * j + 16));
    }
    load_u8_to_i32(sc, reg_wm_ + meta::q4k_scales(kP) + s * kP);
    for (int r = 0; r < m_; ++r) scale_into_sum(r, sc, s == 0);
  }
  // Mins: (m[2t], m[2t+1]) word pairs times (sum32[2t], sum32[2t+1]).
  for (int r = 0; r < m_; ++r) vzero(vdot(r));
  for (int t = 0; t < 4; ++t) {
    load_u8_pairs_to_i16(sc, reg_wm_ + meta::q4k_mins(kP) + t * 2 * kP);
    for (int r = 0; r < m_; ++r) dot_pairs(vdot(r), sc, xs(r, 2 * t));
  }
  const Vmm dw = lo, dmin = hi, scale = raw;
  load_f16_to_f32(dw, reg_wm_ + meta::q4k_d(kP));
  load_f16_to_f32(dmin, reg_wm_ + meta::q4k_dmin(kP));
  for (int r = 0; r < m_; ++r) {
    mul_bcast_f32(scale, dw, xd(r));
    vcvtdq2ps(vsumi(r), vsumi(r));
    fma_acc(r, scale, vsumi(r), false);
    mul_bcast_f32(scale, dmin, xd(r));
    vcvtdq2ps(vdot(r), vdot(r));
    fma_acc(r, scale, vdot(r), true);
  }
}

template void GemmGenerator<Xbyak::Zmm>::body_q4k();
template void GemmGenerator<Xbyak::Ymm>::body_q4k();

}  // namespace dllm::jit
