// Q6_K x Q8_K block body: 16 sub-blocks of 16 weights, repacked as whole bytes q in 0..63 (ggml's
// q + 32). Sub-blocks go two at a time in two int32 chains per row (and per vector of the panel); each
// chain starts at -32 * (sum of the sub-block's 16 activations), which makes it ggml's
// sum((q - 32) * a) (AVX2: one chain per row, reg_plan.h). Each dot is converted to f32 and scaled by
// d*scale[u] (signed 8-bit scales) into the super-block sum; then, as ggml, acc += d_a * sum.
//
// Panels of one vector read each activation group as the dot's embedded broadcast. Panels of two
// vectors (zmm) broadcast it once into a register for both vectors' dots, and copy each chain's start
// to the second vector: half the activation loads per dot, which is what bounds this body.
#include "jit/x64/gemm_gen.h"

namespace dllm::jit {

template <class Vmm>
void GemmGenerator<Vmm>::body_q6k() {
  if constexpr (kZmm) {
    if (nv_ == 2) {
      body_q6k_two_vectors();
      return;
    }
  }
  const Vmm wa = vtmp(0), wb = vtmp(1), sc = vtmp(2), dw = vtmp(3);
  // AVX2 (vpmaddubsw, no vpdpbusd): q + 32 <= 63 and |a| <= 127 bound a pair sum by 16002, so the pair
  // sums of two groups add in int16 (vpaddw) and widen once (vpmaddwd by ones): 5 instructions per two
  // groups and row instead of 6. The two groups' broadcasts take two registers. One dot chain per row
  // (reg_plan.h: chains_avx2), each sub-block a pass of its own: 5 rows a tile in the 16 registers.
  auto dots_avx2 = [&](int u, auto chain) {
    const Vmm b0 = vbcast(), b1 = vtmp(4);
    for (int g = 0; g < 4; g += 2) {
      load_weights(wa, reg_wq_ + (4 * u + g) * kVB);
      load_weights(wb, reg_wq_ + (4 * u + g + 1) * kVB);
      for (int r = 0; r < m_; ++r) {
        vpbroadcastd(b0, ptr[xq(r, 16 * u + 4 * g)]);
        vpmaddubsw(b0, wa, b0);
        vpbroadcastd(b1, ptr[xq(r, 16 * u + 4 * g + 4)]);
        vpmaddubsw(b1, wb, b1);
        vpaddw(b0, b0, b1);
        vpmaddwd(b0, b0, ptr[rip + l_ones16_]);
        vpaddd(chain(r), chain(r), b0);
      }
    }
  };
  load_f16_to_f32(dw, reg_wm_ + meta::q6k_d(kP));
  if (plan_.chains == 1) {  // AVX2: the same float operations in the same order as the two-chain loop below
    for (int u = 0; u < 16; ++u) {
      for (int r = 0; r < m_; ++r) vpbroadcastd(vdot_a(r), ptr[xc(r, u)]);
      dots_avx2(u, [&](int r) { return vdot_a(r); });
      scale_into_sum(sc, reg_wm_ + meta::q6k_scales(kP) + u * kP, true, dw, u == 0);
    }
    for (int r = 0; r < m_; ++r) acc_fma_bcast(r, vsb(r), xd(r), wa);
    return;
  }
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
    scale_into_sum(sc, reg_wm_ + meta::q6k_scales(kP) + u0 * kP, true, dw, v == 0);
    scale_into_sum(sc, reg_wm_ + meta::q6k_scales(kP) + u1 * kP, true, dw, false, true);
  }
  for (int r = 0; r < m_; ++r) acc_fma_bcast(r, vsb(r), xd(r), wa);
}

template <class Vmm>
void GemmGenerator<Vmm>::body_q6k_two_vectors() {
  const int P = layout_.p;
  const Vmm w0 = vtmp(0), w1 = vtmp(1), bx0 = vtmp(6), bx1 = vtmp(7);
  const Vmm sc[2] = {vtmp(2), vtmp(3)}, dw[2] = {vtmp(4), vtmp(5)};
  for (int v = 0; v < 2; ++v) load_f16_to_f32(dw[v], reg_wm_ + meta::q6k_d(P) + v * 2 * kP);
  auto chain_pass = [&](int u, auto chain) {  // the four groups of sub-block u into chain(r, v)
    for (int r = 0; r < m_; ++r) {
      vpbroadcastd(chain(r, 0), ptr[xc(r, u)]);
      vmovdqa32(chain(r, 1), chain(r, 0));
    }
    for (int g = 0; g < 4; ++g) {
      load_weights(w0, reg_wq_ + (4 * u + g) * pvb_);
      load_weights(w1, reg_wq_ + (4 * u + g) * pvb_ + kVB);
      for (int r = 0; r < m_; ++r) {
        const Vmm bx = r % 2 ? bx1 : bx0;
        vpbroadcastd(bx, ptr[xq(r, 16 * u + 4 * g)]);
        vpdpbusd(chain(r, 0), w0, bx, Xbyak::EvexEncoding);
        vpdpbusd(chain(r, 1), w1, bx, Xbyak::EvexEncoding);
      }
    }
  };
  auto scale_into_sum = [&](int u, auto chain, bool first) {
    for (int v = 0; v < 2; ++v) {
      load_scales_f32(sc[v], reg_wm_ + meta::q6k_scales(P) + u * P + v * kP, true, dw[v]);
      for (int r = 0; r < m_; ++r) {
        vcvtdq2ps(chain(r, v), chain(r, v));
        if (first) vmulps(vsb(r, v), chain(r, v), sc[v]);
        else vfmadd231ps(vsb(r, v), chain(r, v), sc[v]);
      }
    }
  };
  auto chain_a = [&](int r, int v) { return vdot_a(r, v); };
  auto chain_b = [&](int r, int v) { return vdot_b(r, v); };
  for (int pair = 0; pair < 8; ++pair) {
    chain_pass(2 * pair, chain_a);
    chain_pass(2 * pair + 1, chain_b);
    scale_into_sum(2 * pair, chain_a, pair == 0);
    scale_into_sum(2 * pair + 1, chain_b, false);
  }
  for (int r = 0; r < m_; ++r) {
    vbroadcastss(bx0, ptr[xd(r)]);
    for (int v = 0; v < 2; ++v) acc_fma(slot(r, v), vsb(r, v), bx0);
  }
}

template void GemmGenerator<Xbyak::Zmm>::body_q6k();
template void GemmGenerator<Xbyak::Ymm>::body_q6k();
template void GemmGenerator<Xbyak::Zmm>::body_q6k_two_vectors();

}  // namespace dllm::jit
