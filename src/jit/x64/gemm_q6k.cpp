// Q6_K x Q8_K block body: 16 sub-blocks of 16 6-bit weights (low nibbles and high bit pairs stored
// apart, merged in registers). Each sub-block's int32 dot starts at -32 * (sum of its 16 activations),
// which makes it ggml's sum((q - 32) * a) with q in 0..63 kept unsigned for vpdpbusd; it is then scaled
// by the signed 8-bit sub-block scale into the super-block sum. Then acc += (d_w*d_a) * sumi.
#include "jit/x64/gemm_gen.h"

namespace dllm::jit {

template <class Vmm>
void GemmGenerator<Vmm>::body_q6k() {
  const Vmm hbits = vtmp(0), raw = vtmp(1), q1 = vtmp(2), q2 = vtmp(3), sc0 = vtmp(4), sc1 = vtmp(5);
  for (int v = 0; v < 8; ++v) {
    // Scales of sub-blocks 2v, 2v+1 as int16 pairs per row; split into two int32 vectors.
    load_i8_pairs_to_i16(sc1, reg_wm_ + meta::q6k_scales(kP) + v * 2 * kP);
    vpslld(sc0, sc1, 16);
    vpsrad(sc0, sc0, 16);
    vpsrad(sc1, sc1, 16);
    for (int h = 0; h < 2; ++h) {
      const int u = 2 * v + h;
      const int64_t base = u * 3 * kVB;
      for (int r = 0; r < m_; ++r) vpbroadcastd(vdot(r), ptr[xc(r, u)]);
      load_vec(hbits, reg_wq_ + base + 2 * kVB);
      for (int j = 0; j < 2; ++j) {
        // q1: k = 16u + 4j + (0..3), high bits at 2j; q2: k + 8, high bits at 2(j+2).
        load_vec(raw, reg_wq_ + base + j * kVB);
        vpsrlw(q2, raw, 4);
        and_mask0f(q2, q2);
        and_mask0f(q1, raw);
        if (j == 0) vpsllw(raw, hbits, 4);  // bits 0-1 -> 4-5 (bits crossing into the next byte are masked off)
        else vpsllw(raw, hbits, 2);         // bits 2-3 -> 4-5
        or_masked30(q1, raw, raw);
        if (j == 0) {
          or_masked30(q2, hbits, raw);      // bits 4-5 already in place
        } else {
          vpsrlw(raw, hbits, 2);            // bits 6-7 -> 4-5
          or_masked30(q2, raw, raw);
        }
        for (int r = 0; r < m_; ++r) dot_u8s8(vdot(r), q1, xq(r, 16 * u + 4 * j));
        for (int r = 0; r < m_; ++r) dot_u8s8(vdot(r), q2, xq(r, 16 * u + 4 * j + 8));
      }
      for (int r = 0; r < m_; ++r) scale_into_sum(r, h == 0 ? sc0 : sc1, u == 0);
    }
  }
  const Vmm dw = q1, scale = q2;
  load_f16_to_f32(dw, reg_wm_ + meta::q6k_d(kP));
  for (int r = 0; r < m_; ++r) {
    mul_bcast_f32(scale, dw, xd(r));
    vcvtdq2ps(vsumi(r), vsumi(r));
    fma_acc(r, scale, vsumi(r), false);
  }
}

template void GemmGenerator<Xbyak::Zmm>::body_q6k();
template void GemmGenerator<Xbyak::Ymm>::body_q6k();

}  // namespace dllm::jit
