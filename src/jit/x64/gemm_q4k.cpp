// Q4_K and Q5_K x Q8_K block body. A super-block is 4 pairs of 32-weight sub-blocks; one 64-byte load holds a
// pair's group of 4 weights per row: low nibbles sub-block 2t, high nibbles 2t+1. The two sub-blocks
// accumulate in two int32 chains per row. The VNNI families keep the high nibbles in place (16*q, just
// masked), folding the 1/16 into that sub-block's scale; AVX2 shifts them down, since vpmaddubsw pairs
// of 16*q would saturate. AVX2 has no vpdpbusd, so its products go through vpmaddubsw (u8 x s8 pairs to
// int16); q <= 15 and |a| <= 127 make a pair at most 3810, so the 8 groups of a sub-block (16 products per
// int16 lane, at most 30480) accumulate in int16 with vpaddw and widen once per sub-block (vpmaddwd by
// ones): 2 vector instructions per group and row instead of 3, the same exact integer dot.
// Each sub-block's dot is converted to f32 and scaled by d*scale[s] into the
// super-block sum (exact for unit scales); the mins term sum_s mins[s] * (sum of the 32 activations of
// s) is an exact int32 (vpdpwssd, two sub-blocks per instruction). Then, as ggml:
//   acc += d_a * (sum_s d*scale[s]*dot_s - dmin * summins).
// Q5_K is the same with a fifth bit per weight (repack.h: one high-bit vector per group j, ggml's qh
// bytes): each group ORs bit 4 into both nibbles after shifting the high nibbles down (16*q would not
// fit a byte), so its scales use d. On AVX2 a pair of q <= 31 products reaches 7874 and 8 groups would
// overflow int16: its body (body_q5k_avx2) takes each sub-block in a pass of its own, 4 groups per int16 sum.
#include "jit/x64/gemm_gen.h"

namespace dllm::jit {

template <class Vmm>
void GemmGenerator<Vmm>::body_q4k() {
  const bool q5 = desc_.wtype == GgmlType::Q5_K;
  const Vmm raw = vtmp(0), lo = vtmp(1), hi = vtmp(2), sc = vtmp(3), dw = vtmp(4);
  const Vmm dw16 = q5 ? dw : vtmp(5);
  const bool hi16 = desc_.isa != Isa::Avx2 && !q5;  // high nibbles kept in place, 1/16 in the scale
  const bool i16 = desc_.isa == Isa::Avx2 && !q5;   // AVX2 Q4_K: a sub-block's pair sums in int16
  load_f16_to_f32(dw, reg_wm_ + meta::q4k_d(kP));
  if (hi16) {
    if constexpr (kZmm) vmulps(dw16, dw, ptr_b[rip + l_sixteenth_]);
    else vmulps(dw16, dw, ptr[rip + l_sixteenth_]);
  }
  // Q5_K: bits 2t and 2t+1 of the high-bit vector H[j] are the fifth bits of lo and hi; shifted to bit 4
  // of each byte (shifts within 16-bit lanes by at most 4 keep every byte's bit 4 its own).
  if constexpr (!kZmm) {
    if (q5 && desc_.isa == Isa::Avx2) {
      body_q5k_avx2();
      return;
    }
    if (plan_.chains == 1) {
      body_q4k_avx2_one_chain();
      return;
    }
  }
  for (int t = 0; t < 4; ++t) {
    if (!i16) {
      for (int r = 0; r < m_; ++r) {
        vzero(vdot_a(r));
        vzero(vdot_b(r));
      }
    }
    for (int j = 0; j < 8; ++j) {
      load_weights(raw, reg_wq_ + (8 * t + j) * kVB);
      and_bytes(lo, raw, l_mask0f_);
      if (hi16) {
        and_bytes(hi, raw, l_mask_f0_);
      } else {
        vpsrlw(hi, raw, 4);
        and_bytes(hi, hi, l_mask0f_);
      }
      if (q5) {  // raw = H[j] moved so that bit 2t lands on bit 4; then bit 2t+1 after one more shift
        load_vec(raw, reg_wq_ + (32 + j) * kVB);
        if (t < 2) vpsllw(raw, raw, 4 - 2 * t);
        else if (t == 3) vpsrlw(raw, raw, 2);
        or_bit4(lo, raw, sc);
        vpsrlw(raw, raw, 1);
        or_bit4(hi, raw, sc);
      }
      if (i16) {
        for (int r = 0; r < m_; ++r) dot_u8s8_i16(vdot_a(r), lo, xq(r, 64 * t + 4 * j), j == 0);
        for (int r = 0; r < m_; ++r) dot_u8s8_i16(vdot_b(r), hi, xq(r, 64 * t + 32 + 4 * j), j == 0);
      } else {
        for (int r = 0; r < m_; ++r) dot_u8s8(vdot_a(r), lo, xq(r, 64 * t + 4 * j));
        for (int r = 0; r < m_; ++r) dot_u8s8(vdot_b(r), hi, xq(r, 64 * t + 32 + 4 * j));
      }
    }
    if (i16) {  // the int16 sums of each sub-block widened to its int32 dot
      for (int r = 0; r < m_; ++r) {
        vpmaddwd(vdot_a(r), vdot_a(r), ptr[rip + l_ones16_]);
        vpmaddwd(vdot_b(r), vdot_b(r), ptr[rip + l_ones16_]);
      }
    }
    scale_into_sum(sc, reg_wm_ + meta::q4k_scales(kP) + 2 * t * kP, false, dw, t == 0);
    scale_into_sum(sc, reg_wm_ + meta::q4k_scales(kP) + (2 * t + 1) * kP, false, hi16 ? dw16 : dw, false, true);
  }
  q4k_mins_and_accumulate();
}

// AVX2 Q4_K with one dot chain per row (reg_plan.h: chains_avx2), so that a tile has 5 rows in the 16
// registers instead of 3: each sub-block is a pass of its own over the pair's 8 weight vectors (the high
// nibbles' pass loads them again, from L1), its int16 sums widened, converted and scaled as the two-chain
// body does, sub-block 2t before 2t+1: the same integer dots and the same float operations in the same order.
template <class Vmm>
void GemmGenerator<Vmm>::body_q4k_avx2_one_chain() {
  const Vmm raw = vtmp(0), w = vtmp(1), mask = vtmp(2), sc = vtmp(3), dw = vtmp(4);
  load_f16_to_f32(dw, reg_wm_ + meta::q4k_d(kP));
  vmovdqu(mask, ptr[rip + l_mask0f_]);
  for (int t = 0; t < 4; ++t) {
    for (int half = 0; half < 2; ++half) {
      for (int j = 0; j < 8; ++j) {
        nibbles_avx2(w, raw, reg_wq_ + (8 * t + j) * kVB, half, &mask);
        for (int r = 0; r < m_; ++r) dot_u8s8_i16(vdot_a(r), w, xq(r, 64 * t + 32 * half + 4 * j), j == 0);
      }
      for (int r = 0; r < m_; ++r) vpmaddwd(vdot_a(r), vdot_a(r), ptr[rip + l_ones16_]);
      scale_into_sum(sc, reg_wm_ + meta::q4k_scales(kP) + (2 * t + half) * kP, false, dw, t == 0 && half == 0);
    }
  }
  q4k_mins_and_accumulate();
}

template <class Vmm>
void GemmGenerator<Vmm>::nibbles_avx2(const Vmm& w, const Vmm& raw, const Xbyak::RegExp& e, int half,
                                      const Vmm* mask) {
  if (half == 0) {
    load_weights(raw, e);
    if (mask) vpand(w, raw, *mask);
    else and_bytes(w, raw, l_mask0f_);
    return;
  }
  load_vec(raw, e);  // (a shift with a memory operand exists only in EVEX)
  vpsrlw(w, raw, 4);
  if (mask) vpand(w, w, *mask);
  else and_bytes(w, w, l_mask0f_);
}

// Mins: (m[2t], m[2t+1]) word pairs times (sum32[2t], sum32[2t+1]), then acc += d_a * (sum - dmin * mins).
template <class Vmm>
void GemmGenerator<Vmm>::q4k_mins_and_accumulate() {
  const Vmm raw = vtmp(0), sc = vtmp(3), dmin = vtmp(4);
  for (int r = 0; r < m_; ++r) vzero(vdot_a(r));
  for (int t = 0; t < 4; ++t) {
    load_u8_pairs_to_i16(sc, reg_wm_ + meta::q4k_mins(kP) + t * 2 * kP);
    for (int r = 0; r < m_; ++r) dot_pairs(vdot_a(r), sc, xs(r, 2 * t));
  }
  load_f16_to_f32(dmin, reg_wm_ + meta::q4k_dmin(kP));
  for (int r = 0; r < m_; ++r) {
    vcvtdq2ps(vdot_a(r), vdot_a(r));
    vfnmadd231ps(vsb(r), vdot_a(r), dmin);
    acc_fma_bcast(r, vsb(r), xd(r), raw);
  }
}

// AVX2 Q5_K: a pair of q <= 31 products reaches 7874, so 4 groups fit int16, not 8. Each sub-block is a
// pass of its own (the pair's raw and high-bit vectors loaded again for the high nibbles, shared by the
// rows): groups 0-3 add in int16 in one register, 4-7 in the other, widened once each: per group and row
// vpbroadcastd + vpmaddubsw + vpaddw, as Q4_K, instead of 4 instructions. The same exact int32 dots and
// the same f32 operations in the same order as every other family.
template <class Vmm>
void GemmGenerator<Vmm>::body_q5k_avx2() {
  const Vmm raw = vtmp(0), w = vtmp(1), sc = vtmp(3), dw = vtmp(4);
  for (int t = 0; t < 4; ++t) {
    for (int half = 0; half < 2; ++half) {
      for (int j = 0; j < 8; ++j) {
        nibbles_avx2(w, raw, reg_wq_ + (8 * t + j) * kVB, half, nullptr);
        load_vec(raw, reg_wq_ + (32 + j) * kVB);  // H[j]: bit 2t + half to bit 4
        const int shift = 4 - 2 * t - half;
        if (shift > 0) vpsllw(raw, raw, shift);
        else if (shift < 0) vpsrlw(raw, raw, -shift);
        vpand(raw, raw, ptr[rip + l_mask10_]);
        vpor(w, w, raw);
        for (int r = 0; r < m_; ++r)
          dot_u8s8_i16(j < 4 ? vdot_a(r) : vdot_b(r), w, xq(r, 64 * t + 32 * half + 4 * j), j == 0 || j == 4);
      }
      for (int r = 0; r < m_; ++r) {
        vpmaddwd(vdot_a(r), vdot_a(r), ptr[rip + l_ones16_]);
        vpmaddwd(vdot_b(r), vdot_b(r), ptr[rip + l_ones16_]);
        vpaddd(vdot_a(r), vdot_a(r), vdot_b(r));
      }
      scale_into_sum(sc, reg_wm_ + meta::q4k_scales(kP) + (2 * t + half) * kP, false, dw, t == 0 && half == 0);
    }
  }
  q4k_mins_and_accumulate();
}

template <class Vmm>
void GemmGenerator<Vmm>::or_bit4(const Vmm& dst, const Vmm& h, const Vmm& tmp) {
  if constexpr (kZmm) {
    vpandd(tmp, h, ptr_b[rip + l_mask10_]);
    vpord(dst, dst, tmp);
  } else {
    vpand(tmp, h, ptr[rip + l_mask10_]);
    vpor(dst, dst, tmp);
  }
}

template void GemmGenerator<Xbyak::Zmm>::or_bit4(const Xbyak::Zmm&, const Xbyak::Zmm&, const Xbyak::Zmm&);
template void GemmGenerator<Xbyak::Ymm>::or_bit4(const Xbyak::Ymm&, const Xbyak::Ymm&, const Xbyak::Ymm&);
template void GemmGenerator<Xbyak::Zmm>::body_q4k();
template void GemmGenerator<Xbyak::Ymm>::body_q4k();
template void GemmGenerator<Xbyak::Zmm>::q4k_mins_and_accumulate();
template void GemmGenerator<Xbyak::Ymm>::q4k_mins_and_accumulate();
template void GemmGenerator<Xbyak::Ymm>::body_q5k_avx2();
template void GemmGenerator<Xbyak::Ymm>::body_q4k_avx2_one_chain();
template void GemmGenerator<Xbyak::Ymm>::nibbles_avx2(const Xbyak::Ymm&, const Xbyak::Ymm&, const Xbyak::RegExp&, int,
                                                      const Xbyak::Ymm*);

}  // namespace dllm::jit
