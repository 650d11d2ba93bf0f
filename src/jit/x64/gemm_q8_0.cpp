// Q8_0 x Q8_0 body for one or two consecutive blocks of 32 (two: one int32 chain per block and row).
// VNNI families: weights stored as w + 128 (unsigned for vpdpbusd), each chain starting at
// -128 * (sum of the block's 32 activations); AVX2: |w| times the activations carrying w's sign
// (vpsignb), so vpmaddubsw cannot saturate. Then, as ggml: acc += float(sumi) * (d_w*d_a).
#include "jit/x64/gemm_gen.h"

namespace dllm::jit {

template <class Vmm>
void GemmGenerator<Vmm>::body_q8_0(int blocks) {
  const Vmm wa = vtmp(0), wb = vtmp(1), ta = vtmp(2), tb = vtmp(3), prod = vtmp(4);
  const bool avx2 = desc_.isa == Isa::Avx2, two = blocks == 2;
  for (int r = 0; r < m_; ++r) {
    if (avx2) {
      vzero(vdot_a(r));
      if (two) vzero(vdot_b(r));
    } else {
      vpbroadcastd(vdot_a(r), ptr[xc(r, 0)]);
      if (two) vpbroadcastd(vdot_b(r), ptr[xc(r, 1)]);
    }
  }
  for (int g = 0; g < 8; ++g) {
    load_weights(wa, reg_wq_ + g * kVB);
    if (two) load_weights(wb, reg_wq_ + layout_.quant_bytes + g * kVB);
    if (avx2) {
      vpabsb(ta, wa);
      if (two) vpabsb(tb, wb);
      for (int r = 0; r < m_; ++r) dot_s8s8_avx2(vdot_a(r), ta, wa, xq(r, 4 * g));
      if (two)
        for (int r = 0; r < m_; ++r) dot_s8s8_avx2(vdot_b(r), tb, wb, xq(r, 32 + 4 * g));
    } else {
      for (int r = 0; r < m_; ++r) dot_u8s8(vdot_a(r), wa, xq(r, 4 * g));
      if (two)
        for (int r = 0; r < m_; ++r) dot_u8s8(vdot_b(r), wb, xq(r, 32 + 4 * g));
    }
  }
  q8_0_scale_and_accumulate(blocks, ta, tb, prod);
}

template <class Vmm>
void GemmGenerator<Vmm>::q8_0_scale_and_accumulate(int blocks, const Vmm& da, const Vmm& db, const Vmm& prod) {
  const bool two = blocks == 2;
  load_f16_to_f32(da, reg_wm_ + meta::q8_0_d(kP));
  if (two) load_f16_to_f32(db, reg_wm_ + layout_.meta_bytes + meta::q8_0_d(kP));
  for (int r = 0; r < m_; ++r) {
    mul_bcast_f32(prod, da, xd(r, 0));
    vcvtdq2ps(vdot_a(r), vdot_a(r));
    acc_fma(r, vdot_a(r), prod);
    if (two) {
      mul_bcast_f32(prod, db, xd(r, 1));
      vcvtdq2ps(vdot_b(r), vdot_b(r));
      acc_fma(r, vdot_b(r), prod);
    }
  }
}

template void GemmGenerator<Xbyak::Zmm>::body_q8_0(int);
template void GemmGenerator<Xbyak::Ymm>::body_q8_0(int);
template void GemmGenerator<Xbyak::Zmm>::q8_0_scale_and_accumulate(int, const Xbyak::Zmm&, const Xbyak::Zmm&,
                                                                   const Xbyak::Zmm&);
template void GemmGenerator<Xbyak::Ymm>::q8_0_scale_and_accumulate(int, const Xbyak::Ymm&, const Xbyak::Ymm&,
                                                                   const Xbyak::Ymm&);

}  // namespace dllm::jit
