// Q5_0 x Q8_0 body for one or two consecutive blocks of 32 (two: one int32 chain per block and row), on the
// GGUF's own bytes (repack.h): per group of 4 values the nibble (masked, or shifted down and masked) gets
// its fifth bit from the high-bit vector moved to bit 4, as Q5_K's body does, giving ggml's q in 0..31 as
// the unsigned operand of vpdpbusd (vpmaddubsw on AVX2: pairs of 31 * 128 cannot saturate int16). Each
// chain starts at -16 * (sum of the block's 32 activations), the Q8_0 activations' -128 * sum shifted
// right by 3 (exact), so it ends at ggml's sum of (q - 16) * x. Then, as ggml: acc += float(sumi) * (d_w*d_a).
#include "jit/x64/gemm_gen.h"

namespace dllm::jit {

template <class Vmm>
void GemmGenerator<Vmm>::body_q5_0(int blocks) {
  const Vmm raw = vtmp(0), lo = vtmp(1), hi = vtmp(2), h = vtmp(3), tmp = vtmp(4);
  const bool two = blocks == 2;
  for (int r = 0; r < m_; ++r) {
    vpbroadcastd(vdot_a(r), ptr[xc(r, 0)]);
    vpsrad(vdot_a(r), vdot_a(r), 3);
    if (two) {
      vpbroadcastd(vdot_b(r), ptr[xc(r, 1)]);
      vpsrad(vdot_b(r), vdot_b(r), 3);
    }
  }
  for (int g = 0; g < 4; ++g) {
    for (int i = 0; i < blocks; ++i) {
      const Xbyak::RegExp q = reg_wq_ + i * layout_.quant_bytes;
      load_weights(raw, q + g * kVB);
      and_bytes(lo, raw, l_mask0f_);
      vpsrlw(hi, raw, 4);
      and_bytes(hi, hi, l_mask0f_);
      // H: bit 2g to bit 4 (for lo), then bit 2g + 1 (for hi); shifts within 16-bit lanes by at most 4
      // keep every byte's bit 4 its own.
      if (g == 0) load_weights(h, q + 4 * kVB);
      else load_vec(h, q + 4 * kVB);
      if (g < 2) vpsllw(h, h, 4 - 2 * g);
      else if (g == 3) vpsrlw(h, h, 2);
      or_bit4(lo, h, tmp);
      vpsrlw(h, h, 1);
      or_bit4(hi, h, tmp);
      for (int r = 0; r < m_; ++r) dot_u8s8(i == 0 ? vdot_a(r) : vdot_b(r), lo, xq(r, 32 * i + 4 * g));
      for (int r = 0; r < m_; ++r) dot_u8s8(i == 0 ? vdot_a(r) : vdot_b(r), hi, xq(r, 32 * i + 16 + 4 * g));
    }
  }
  q8_0_scale_and_accumulate(blocks, raw, lo, hi);
}

template void GemmGenerator<Xbyak::Zmm>::body_q5_0(int);
template void GemmGenerator<Xbyak::Ymm>::body_q5_0(int);

}  // namespace dllm::jit
