// Q8_0 x Q8_0 block body: 32 int8 weights per row and block. VNNI families: weights stored as w + 128
// (unsigned for vpdpbusd), the dot starting at -128 * (sum of the 32 activations); AVX2: |w| times the
// activations carrying w's sign (vpsignb), so vpmaddubsw cannot saturate. Then, as ggml:
// acc += (d_w*d_a) * sumi.
#include "jit/x64/gemm_gen.h"

namespace dllm::jit {

template <class Vmm>
void GemmGenerator<Vmm>::body_q8_0() {
  const Vmm w = vtmp(0), aux = vtmp(1), dw = vtmp(2);
  const bool avx2 = desc_.isa == Isa::Avx2;
  for (int r = 0; r < m_; ++r) {
    if (avx2) vzero(vdot(r));
    else vpbroadcastd(vdot(r), ptr[xc(r, 0)]);
  }
  for (int g = 0; g < 8; ++g) {
    load_vec(w, reg_wq_ + g * kVB);
    if (avx2) {
      vpabsb(aux, w);
      for (int r = 0; r < m_; ++r) dot_s8s8_avx2(vdot(r), aux, w, xq(r, 4 * g));
    } else {
      for (int r = 0; r < m_; ++r) dot_u8s8(vdot(r), w, xq(r, 4 * g));
    }
  }
  load_f16_to_f32(dw, reg_wm_ + meta::q8_0_d(kP));
  for (int r = 0; r < m_; ++r) {
    mul_bcast_f32(aux, dw, xd(r));
    vcvtdq2ps(vdot(r), vdot(r));
    fma_acc(r, aux, vdot(r), false);
  }
}

template void GemmGenerator<Xbyak::Zmm>::body_q8_0();
template void GemmGenerator<Xbyak::Ymm>::body_q8_0();

}  // namespace dllm::jit
