// Q6_K x Q8_K block body: 16 sub-blocks of 16 weights, repacked as whole bytes q in 0..63 (ggml's
// q + 32). Sub-blocks go two at a time in two int32 chains per row; each chain starts at
// -32 * (sum of the sub-block's 16 activations), which makes it ggml's sum((q - 32) * a). Each dot is
// converted to f32 and scaled by d*scale[u] (signed 8-bit scales) into the super-block sum; then, as
// ggml, acc += d_a * sum.
#include "jit/x64/gemm_gen.h"

namespace dllm::jit {

template <class Vmm>
void GemmGenerator<Vmm>::body_q6k() {
  const Vmm wa = vtmp(0), wb = vtmp(1), sc = vtmp(2), dw = vtmp(3);
  load_f16_to_f32(dw, reg_wm_ + meta::q6k_d(kP));
  for (int v = 0; v < 8; ++v) {
    const int u0 = 2 * v, u1 = 2 * v + 1;
    for (int r = 0; r < m_; ++r) {
      vpbroadcastd(vdot_a(r), ptr[xc(r, u0)]);
      vpbroadcastd(vdot_b(r), ptr[xc(r, u1)]);
    }
    for (int g = 0; g < 4; ++g) {
      load_weights(wa, reg_wq_ + (4 * u0 + g) * kVB);
      load_weights(wb, reg_wq_ + (4 * u1 + g) * kVB);
      for (int r = 0; r < m_; ++r) dot_u8s8(vdot_a(r), wa, xq(r, 16 * u0 + 4 * g));
      for (int r = 0; r < m_; ++r) dot_u8s8(vdot_b(r), wb, xq(r, 16 * u1 + 4 * g));
    }
    load_scales_f32(sc, reg_wm_ + meta::q6k_scales(kP) + u0 * kP, true, dw);
    for (int r = 0; r < m_; ++r) {
      vcvtdq2ps(vdot_a(r), vdot_a(r));
      if (v == 0) vmulps(vsb(r), vdot_a(r), sc);
      else vfmadd231ps(vsb(r), vdot_a(r), sc);
    }
    load_scales_f32(sc, reg_wm_ + meta::q6k_scales(kP) + u1 * kP, true, dw);
    for (int r = 0; r < m_; ++r) {
      vcvtdq2ps(vdot_b(r), vdot_b(r));
      vfmadd231ps(vsb(r), vdot_b(r), sc);
    }
  }
  for (int r = 0; r < m_; ++r) acc_fma_bcast(r, vsb(r), xd(r), wa);
}

template void GemmGenerator<Xbyak::Zmm>::body_q6k();
template void GemmGenerator<Xbyak::Ymm>::body_q6k();

}  // namespace dllm::jit
