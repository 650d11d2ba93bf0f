// AmxGemmGenerator: tile configuration, the panel and block loops, and the three weight-type bodies
// (see amx_gemm.h). Numerics as the avx512-vnni kernels: exact int32 sub-block products, f32 scaling
// per sub-block, ggml's f32 accumulation per block.
#include "jit/x64/amx_gemm.h"

#include <algorithm>
#include <cstddef>

#include "common/error.h"

namespace dllm::jit {

using Xbyak::Tmm;
using Xbyak::Zmm;

namespace {
constexpr size_t kMaxCodeBytes = 128 * 1024;
// zmm register names: rows 0..m-1 hold per-row sums (K-quants) or accumulators (Q8_0).
const Zmm vS(16), vT(17), vDw(18), vDw16(19), vMi(24), vDmin(25), vRaw(26), vLo(27), vHi(28);
Zmm vMp(int t) { return Zmm(20 + t); }
}  // namespace

AmxGemmGenerator::AmxGemmGenerator(const GemmDesc& desc)
    : JitGenerator(desc.name(), kMaxCodeBytes),
      desc_(desc),
      layout_(packed_layout(desc.isa, desc.wtype, desc.n, desc.k)),
      m_(desc.m),
      kt_(desc.wtype == GgmlType::Q6_K ? 16 : 32) {
  if (desc.isa != Isa::Amx) throw Error("cannot generate kernel " + desc.name() + ": not an AMX descriptor");
  if (!require_weight_traits(desc.wtype, desc.name()).amx)
    throw Error("cannot generate kernel " + desc.name() + ": no AMX body for " + ggml_type_name(desc.wtype));
  if (desc.m < 1 || desc.m > 16)
    throw Error("cannot generate kernel " + desc.name() + ": an AMX tile holds 1 to 16 rows, not " + std::to_string(desc.m));
}

void AmxGemmGenerator::tile_product(int i, int64_t k0, const Xbyak::Reg64& b_base, int64_t b_off, bool b_signed) {
  const Tmm c(i % 4), a(4 + i % 2), b(6 + i % 2);
  lea(reg_addr_, ptr[reg_xq_ + (k0 / 64) * 1024 + k0 % 64]);
  tileloadd(a, ptr[reg_addr_ + reg_stride_64_]);
  lea(reg_addr_, ptr[b_base + b_off]);
  tileloadd(b, ptr[reg_addr_ + reg_stride_64_]);
  tilezero(c);
  if (b_signed) tdpbssd(c, a, b);
  else tdpbsud(c, a, b);
  lea(reg_addr_, ptr[rsp + kCbufOff + (i % 4) * 1024]);
  tilestored(ptr[reg_addr_ + reg_stride_64_], c);
}

template <class Issue, class Process>
void AmxGemmGenerator::pipeline(int n, Issue issue, Process process) {
  for (int i = 0; i < n; ++i) {
    issue(i);
    if (i >= 2) process(i - 2);
  }
  for (int i = std::max(0, n - 2); i < n; ++i) process(i);
}

// ---- Q4_K: widen the nibbles, 8 tile products of k = 32, scales, mins ----
void AmxGemmGenerator::body_q4k() {
  for (int t = 0; t < 4; ++t) {
    for (int j = 0; j < 8; ++j) {
      vmovdqu32(vRaw, ptr[reg_wq_ + (8 * t + j) * 64]);
      vpandd(vLo, vRaw, ptr_b[rip + l_mask0f_]);
      vpandd(vHi, vRaw, ptr_b[rip + l_mask_f0_]);
      vmovdqa32(ptr[rsp + kWideOff + (2 * t) * 512 + j * 64], vLo);
      vmovdqa32(ptr[rsp + kWideOff + (2 * t + 1) * 512 + j * 64], vHi);
    }
  }
  vcvtph2ps(vDw, ptr[reg_wm_ + meta::q4k_d(16)]);
  vmulps(vDw16, vDw, ptr_b[rip + l_sixteenth_]);
  auto process = [&](int u) {
    vpmovzxbd(vS, ptr[reg_wm_ + meta::q4k_scales(16) + u * 16]);
    vcvtdq2ps(vS, vS);
    vmulps(vS, vS, u % 2 ? vDw16 : vDw);  // odd sub-blocks are the high nibbles: 16*q
    for (int r = 0; r < m_; ++r) {
      vcvtdq2ps(vT, cbuf(u, r));
      if (u == 0) vmulps(Zmm(r), vT, vS);
      else vfmadd231ps(Zmm(r), vT, vS);
    }
  };
  pipeline(8, [&](int s) { tile_product(s, 32 * s, rsp, kWideOff + s * 512, false); }, process);
  // Mins: sum_s mins[s] * sum32[s], int16 pairs, exact; then acc += d_a * (sum - dmin * mins).
  for (int t = 0; t < 4; ++t) vpmovzxbw(vMp(t), ptr[reg_wm_ + meta::q4k_mins(16) + t * 32]);
  vcvtph2ps(vDmin, ptr[reg_wm_ + meta::q4k_dmin(16)]);
  for (int r = 0; r < m_; ++r) {
    vpxord(vMi, vMi, vMi);
    for (int t = 0; t < 4; ++t) vpdpwssd(vMi, vMp(t), ptr_b[reg_xs_ + r * (desc_.k / 32) * 2 + 4 * t]);
    vcvtdq2ps(vMi, vMi);
    vfnmadd231ps(Zmm(r), vMi, vDmin);
    vmovaps(vT, accbuf(r));  // acc += sum * d_a in one rounding, as the avx512-vnni kernels do
    vfmadd231ps(vT, Zmm(r), ptr_b[reg_xd_ + r * layout_.nblocks * 4]);
    vmovaps(accbuf(r), vT);
  }
}

// ---- Q6_K: 16 tile products of k = 16 straight from the panel (signed q - 32), scales ----
void AmxGemmGenerator::body_q6k() {
  vcvtph2ps(vDw, ptr[reg_wm_ + meta::q6k_d(16)]);
  auto process = [&](int u) {
    vpmovsxbd(vS, ptr[reg_wm_ + meta::q6k_scales(16) + u * 16]);
    vcvtdq2ps(vS, vS);
    vmulps(vS, vS, vDw);
    for (int r = 0; r < m_; ++r) {
      vcvtdq2ps(vT, cbuf(u, r));
      if (u == 0) vmulps(Zmm(r), vT, vS);
      else vfmadd231ps(Zmm(r), vT, vS);
    }
  };
  pipeline(16, [&](int u) { tile_product(u, 16 * u, reg_wq_, u * 256, true); }, process);
  for (int r = 0; r < m_; ++r) {
    vmovaps(vT, accbuf(r));
    vfmadd231ps(vT, Zmm(r), ptr_b[reg_xd_ + r * layout_.nblocks * 4]);
    vmovaps(accbuf(r), vT);
  }
}

// ---- Q8_0: one tile product per block of 32 (signed), acc += float(sumi) * (d_w*d_a) ----
void AmxGemmGenerator::body_q8_0(int blocks) {
  pipeline(
      blocks, [&](int b) { tile_product(b, 32 * b, reg_wq_, b * layout_.quant_bytes, true); },
      [&](int b) {
        vcvtph2ps(vDw, ptr[reg_wm_ + b * layout_.meta_bytes + meta::q8_0_d(16)]);
        for (int r = 0; r < m_; ++r) {
          vmulps(vS, vDw, ptr_b[reg_xd_ + r * layout_.nblocks * 4 + 4 * b]);
          vcvtdq2ps(vT, cbuf(b, r));
          vfmadd231ps(Zmm(r), vT, vS);
        }
      });
}

void AmxGemmGenerator::store_panel(bool masked) {
  const bool q8 = desc_.wtype == GgmlType::Q8_0;
  for (int r = 0; r < m_; ++r) {
    Zmm src = Zmm(r);
    if (!q8) {
      vmovaps(vT, accbuf(r));
      src = vT;
    }
    const Xbyak::RegExp y = reg_y_ + r * desc_.n * 4;
    if (masked) vmovups(ptr[y] | k1, src);
    else vmovups(ptr[y], src);
  }
}

void AmxGemmGenerator::generate() {
  const bool q8 = desc_.wtype == GgmlType::Q8_0;
  preamble();
  sub(rsp, kFrameBytes);
  and_(rsp, -64);
  ldtilecfg(ptr[rip + l_cfg_]);
  mov(reg_stride_64_, 64);
  mov(reg_tmp_, ptr[reg_args_ + offsetof(GemmKernelArgs, tail_cols)]);
  lea(reg_addr_, ptr[rip + l_tail_]);
  kmovw(k1, ptr[reg_addr_ + reg_tmp_ * 2]);
  mov(reg_panel_, ptr[reg_args_ + offsetof(GemmKernelArgs, w)]);
  mov(reg_y_, ptr[reg_args_ + offsetof(GemmKernelArgs, y)]);
  mov(reg_np_, ptr[reg_args_ + offsetof(GemmKernelArgs, n_panels)]);

  Xbyak::Label l_panel, l_block;
  L(l_panel);
  {
    if (q8) {
      for (int r = 0; r < m_; ++r) vpxord(Zmm(r), Zmm(r), Zmm(r));
    } else {
      vpxord(vT, vT, vT);
      for (int r = 0; r < m_; ++r) vmovaps(accbuf(r), vT);
    }
    mov(reg_wq_, reg_panel_);
    lea(reg_wm_, ptr[reg_panel_ + layout_.meta_offset()]);
    mov(reg_xq_, ptr[reg_args_ + offsetof(GemmKernelArgs, xq)]);
    mov(reg_xd_, ptr[reg_args_ + offsetof(GemmKernelArgs, xd)]);
    mov(reg_xs_, ptr[reg_args_ + offsetof(GemmKernelArgs, xs)]);
    // Q8_0: four blocks (two 64-value chunks of the activation tiles) per step, then 1-3 more.
    const int per_iter = q8 ? 4 : 1;
    const int64_t iters = layout_.nblocks / per_iter, rest = layout_.nblocks % per_iter;
    if (iters > 0) {
      mov(reg_blk_, iters);
      align(16);
      L(l_block);
      switch (desc_.wtype) {
        case GgmlType::Q4_K: body_q4k(); break;
        case GgmlType::Q6_K: body_q6k(); break;
        case GgmlType::Q8_0: body_q8_0(4); break;
        default: throw Error("cannot generate kernel " + desc_.name() + ": no AMX body for " + ggml_type_name(desc_.wtype));
      }
      add(reg_wq_, static_cast<uint32_t>(per_iter * layout_.quant_bytes));
      add(reg_wm_, static_cast<uint32_t>(per_iter * layout_.meta_bytes));
      add(reg_xq_, per_iter * layout_.block / 64 * 1024);  // the activation tiles: 1 KB per 64 values
      add(reg_xd_, 4 * per_iter);
      if (!q8) add(reg_xs_, 16);
      dec(reg_blk_);
      jnz(l_block, T_NEAR);
    }
    if (rest) body_q8_0(static_cast<int>(rest));
    Xbyak::Label l_full, l_stored;
    cmp(reg_np_, 1);
    jne(l_full, T_NEAR);
    cmp(qword[reg_args_ + offsetof(GemmKernelArgs, tail_cols)], 16);
    je(l_full, T_NEAR);
    store_panel(true);
    jmp(l_stored, T_NEAR);
    L(l_full);
    store_panel(false);
    L(l_stored);
    add(reg_panel_, static_cast<uint32_t>(layout_.panel_bytes));
    add(reg_y_, 64);
    dec(reg_np_);
    jnz(l_panel, T_NEAR);
  }
  tilerelease();
  postamble();

  // Tile configuration (palette 1): C tiles 0-3: m rows x 64 bytes; A tiles 4/5: m x kt; B tiles 6/7: kt/4 x 64.
  align(64);
  L(l_cfg_);
  uint8_t cfg[64] = {};
  cfg[0] = 1;
  auto set = [&](int t, int colsb, int rows) {
    cfg[16 + 2 * t] = static_cast<uint8_t>(colsb);
    cfg[16 + 2 * t + 1] = static_cast<uint8_t>(colsb >> 8);
    cfg[48 + t] = static_cast<uint8_t>(rows);
  };
  for (int t = 0; t < 4; ++t) set(t, 64, m_);
  for (int t = 0; t < 2; ++t) {
    set(4 + t, kt_, m_);
    set(6 + t, 64, kt_ / 4);
  }
  for (uint8_t c : cfg) db(c);
  L(l_mask0f_);
  dd(0x0F0F0F0Fu);
  L(l_mask_f0_);
  dd(0xF0F0F0F0u);
  L(l_sixteenth_);
  dd(0x3D800000u);  // 1/16 as f32
  align(2);
  L(l_tail_);
  for (int t = 0; t <= 16; ++t) dw(static_cast<uint16_t>((1u << t) - 1));
}

}  // namespace dllm::jit
