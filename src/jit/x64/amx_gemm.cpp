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
constexpr int kLag = 3;
// zmm register names: rows 0..m-1 hold per-row sums (K-quants) or accumulators (Q8_0).
const Zmm vS(16), vT(17), vDw(18), vDw16(19), vMi(24), vDmin(25), vRaw(26), vLo(27), vHi(28), vHb(29), vBit(30);
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

void AmxGemmGenerator::tile_product(int i, int64_t k0, const Xbyak::RegExp& b_at, bool b_signed) {
  const Tmm c(i % 4), a(4 + i % 2), b(6 + i % 2);
  lea(reg_addr_, ptr[reg_xq_ + (k0 / 64) * 1024 + k0 % 64]);
  tileloadd(a, ptr[reg_addr_ + reg_stride_64_]);
  lea(reg_addr_, ptr[b_at]);
  tileloadd(b, ptr[reg_addr_ + reg_stride_64_]);
  tilezero(c);
  if (b_signed) tdpbssd(c, a, b);
  else tdpbsud(c, a, b);
}

void AmxGemmGenerator::tile_store(int i) {
  lea(reg_addr_, ptr[rsp + kCbufOff + (i % 4) * 1024]);
  tilestored(ptr[reg_addr_ + reg_stride_64_], Tmm(i % 4));
}

// The tile unit runs its instructions in order: a C tile stored right after its product waits for the
// product's latency and holds up the loads of the next one. So product i's store follows product i + 1,
// and its scaling (reading the stored int32) follows product i + kLag: four C tiles and buffers rotate.
// One pipeline runs across a panel's bodies (a super-block, or four Q8_0 blocks): the first kLag products
// of a body overlap the scaling of the previous body's last ones, then that body's finish (its metadata
// lies one body back: the pointers move on at the end of each body).
template <class Process, class Finish>
void AmxGemmGenerator::after_product(int i, int n, bool has_prev, Process process, Finish finish_prev) {
  if (i >= 1) tile_store(i - 1);
  else if (has_prev) tile_store(n - 1);
  if (i >= kLag) {
    process(i - kLag, false);
  } else if (has_prev) {
    process(i + n - kLag, true);
    if (i == kLag - 1) finish_prev();
  }
}

template <class Process, class Finish>
void AmxGemmGenerator::drain(int n, bool prev, Process process, Finish finish) {
  tile_store(n - 1);
  for (int u = std::max(0, n - kLag); u < n; ++u) process(u, prev);
  finish();
}

template <class Body>
void AmxGemmGenerator::bodies(int64_t count, bool distinct_last, Body body) {
  if (count <= 0) return;
  body(false, count == 1);
  const bool last_apart = distinct_last && count > 1;
  const int64_t looped = count - 1 - (last_apart ? 1 : 0);
  if (looped > 0) {
    Xbyak::Label l_body;
    mov(reg_blk_, looped);
    align(16);
    L(l_body);
    body(true, false);
    dec(reg_blk_);
    jnz(l_body, T_NEAR);
  }
  if (last_apart) body(true, true);
}

// ---- Q4_K: one pipeline across the super-blocks of a panel ----
// Super-block b's nibbles were widened into the wide buffer [rsp + rax] (low nibbles as they are, high
// nibbles as 16*q with the 1/16 folded into the scale) while super-block b - 1 ran; its 8 products of
// k = 32 run while AVX-512 scales products b - 1 / 5..7 and b / 0..4, finishes super-block b - 1 (mins,
// acc), and widens super-block b + 1 into the other buffer ([rsp + (rax ^ 4096)]). So the tile unit never
// waits for a just-written B tile or for a drained pipeline at a super-block boundary (the layout reads
// "previous" metadata at negative offsets: the pointers move on at the end of each body).
// Vector q = 8t + j of the super-block at src (its quant stream) into the wide buffer at dst: the low nibbles
// (sub-block 2t) and the high ones (2t + 1, Q4_K in place as 16*q). Q5_K (repack.h: the high-bit vector H[j]
// after the 32 nibble vectors; bits 2t and 2t + 1 are the fifth bits of the low and the high quants) shifts the
// high nibbles down and puts each fifth bit on bit 4: q in 0..31 in a byte, its scales take d.
void AmxGemmGenerator::q4k_widen_vector(int q, const Xbyak::RegExp& src, const Xbyak::RegExp& dst) {
  const int t = q / 8, j = q % 8;
  vmovdqu32(vRaw, ptr[src + (8 * t + j) * 64]);
  vpandd(vLo, vRaw, ptr_b[rip + l_mask0f_]);
  if (desc_.wtype == GgmlType::Q5_K) {
    vpsrlw(vHi, vRaw, 4);
    vpandd(vHi, vHi, ptr_b[rip + l_mask0f_]);
    vmovdqu32(vHb, ptr[src + (32 + j) * 64]);  // within a 16-bit lane a shift by at most 4 keeps a byte's bit 4 its own
    if (t < 2) vpsllw(vHb, vHb, 4 - 2 * t);
    else if (t == 3) vpsrlw(vHb, vHb, 2);
    vpandd(vBit, vHb, ptr_b[rip + l_mask10_]);
    vpord(vLo, vLo, vBit);
    vpsrlw(vHb, vHb, 1);
    vpandd(vBit, vHb, ptr_b[rip + l_mask10_]);
    vpord(vHi, vHi, vBit);
  } else {
    vpandd(vHi, vRaw, ptr_b[rip + l_mask_f0_]);
  }
  vmovdqa32(ptr[dst + (2 * t) * 512 + j * 64], vLo);
  vmovdqa32(ptr[dst + (2 * t + 1) * 512 + j * 64], vHi);
}

void AmxGemmGenerator::q4k_widen(int q) {  // q = 0..31: one 64-byte vector of super-block b + 1
  if (q % 4 == 0) {  // the first of a group of four (tile_product clobbered reg_addr_ in between)
    mov(reg_addr_, rax);
    xor_(reg_addr_, kWideBytes);
  }
  q4k_widen_vector(q, reg_wq_ + layout_.quant_bytes, rsp + reg_addr_ + kWideOff);
}

void AmxGemmGenerator::q4k_widen_first() {
  for (int q = 0; q < 32; ++q) q4k_widen_vector(q, reg_wq_, rsp + rax + kWideOff);
}

// Scales product u of the current super-block (prev: of the one before, whose metadata lies meta_bytes back).
void AmxGemmGenerator::q4k_process(int u, bool prev) {
  const int64_t back = prev ? -layout_.meta_bytes : 0;
  vpmovzxbd(vS, ptr[reg_wm_ + back + meta::q4k_scales(16) + u * 16]);
  vcvtdq2ps(vS, vS);
  // Q4_K's odd sub-blocks are the high nibbles in place, 16*q (Q5_K's are shifted down).
  vmulps(vS, vS, u % 2 && desc_.wtype == GgmlType::Q4_K ? vDw16 : vDw);
  for (int r = 0; r < m_; ++r) {
    vcvtdq2ps(vT, cbuf(u, r));
    if (u == 0) vmulps(Zmm(r), vT, vS);
    else vfmadd231ps(Zmm(r), vT, vS);
  }
}

// The previous super-block's mins, sum_s mins[s] * sum32[s] in exact int16 pairs, then
// acc += d_a * (sum - dmin * mins).
void AmxGemmGenerator::q4k_finish_prev() {
  const int64_t back = -layout_.meta_bytes;
  for (int t = 0; t < 4; ++t) vpmovzxbw(vMp(t), ptr[reg_wm_ + back + meta::q4k_mins(16) + t * 32]);
  vcvtph2ps(vDmin, ptr[reg_wm_ + back + meta::q4k_dmin(16)]);
  for (int r = 0; r < m_; ++r) {
    vpxord(vMi, vMi, vMi);
    for (int t = 0; t < 4; ++t) vpdpwssd(vMi, vMp(t), ptr_b[reg_xs_ - 16 + r * (desc_.k / 32) * 2 + 4 * t]);
    vcvtdq2ps(vMi, vMi);
    vfnmadd231ps(Zmm(r), vMi, vDmin);
    vmovaps(vT, accbuf(r));  // acc += sum * d_a in one rounding, as the avx512-vnni kernels do
    vfmadd231ps(vT, Zmm(r), ptr_b[reg_xd_ - 4 + r * layout_.nblocks * 4]);
    vmovaps(accbuf(r), vT);
  }
}

void AmxGemmGenerator::q4k_body(bool has_prev, bool widen_next) {
  auto process = [&](int u, bool prev) {
    if (u == 0 && !prev) {
      vcvtph2ps(vDw, ptr[reg_wm_ + meta::q4k_d(16)]);
      vmulps(vDw16, vDw, ptr_b[rip + l_sixteenth_]);
    }
    q4k_process(u, prev);
  };
  for (int s = 0; s < 8; ++s) {
    tile_product(s, 32 * s, rsp + rax + kWideOff + s * 512, false);
    after_product(s, 8, has_prev, process, [&] { q4k_finish_prev(); });
    // Super-block b + 2's bytes are requested now (a prefetch past the panel is harmless): spread over the
    // body, the widening's loads alone keep too few misses in flight when the weights stream from memory.
    for (int q = 4 * s; q < 4 * s + 4; ++q) prefetcht0(ptr[reg_wq_ + 2 * layout_.quant_bytes + q * 64]);
    if (desc_.wtype == GgmlType::Q5_K && s < 2)  // and Q5_K's 8 high-bit vectors
      for (int q = 32 + 4 * s; q < 36 + 4 * s; ++q) prefetcht0(ptr[reg_wq_ + 2 * layout_.quant_bytes + q * 64]);
    if (widen_next)
      for (int q = 4 * s; q < 4 * s + 4; ++q) q4k_widen(q);
  }
  q4k_advance();
}

void AmxGemmGenerator::q4k_advance() {
  add(reg_wq_, static_cast<uint32_t>(layout_.quant_bytes));
  add(reg_wm_, static_cast<uint32_t>(layout_.meta_bytes));
  add(reg_xq_, layout_.block / 64 * 1024);  // the activation tiles: 1 KB per 64 values
  add(reg_xd_, 4);
  add(reg_xs_, 16);
  xor_(rax, kWideBytes);
}

// The last super-block has nothing to widen after it (the bytes past a panel's last quant block need not exist).
void AmxGemmGenerator::q4k_panel() {
  xor_(eax, eax);
  q4k_widen_first();
  bodies(layout_.nblocks, true, [&](bool has_prev, bool last) { q4k_body(has_prev, !last); });
  drain(8, true, [&](int u, bool prev) { q4k_process(u, prev); }, [&] { q4k_finish_prev(); });
}

// ---- Q6_K: 16 tile products of k = 16 straight from the panel (signed q - 32), one pipeline across a
// panel's super-blocks as Q4_K's: super-block b's first products run while AVX-512 scales b - 1's last
// ones and adds b - 1's sum into the accumulators (its metadata meta_bytes back, its d_a 4 bytes back).
void AmxGemmGenerator::q6k_process(int u, bool prev) {
  const int64_t back = prev ? -layout_.meta_bytes : 0;
  vpmovsxbd(vS, ptr[reg_wm_ + back + meta::q6k_scales(16) + u * 16]);
  vcvtdq2ps(vS, vS);
  vmulps(vS, vS, vDw);
  for (int r = 0; r < m_; ++r) {
    vcvtdq2ps(vT, cbuf(u, r));
    if (u == 0) vmulps(Zmm(r), vT, vS);
    else vfmadd231ps(Zmm(r), vT, vS);
  }
}

void AmxGemmGenerator::q6k_finish_prev() {
  for (int r = 0; r < m_; ++r) {
    vmovaps(vT, accbuf(r));
    vfmadd231ps(vT, Zmm(r), ptr_b[reg_xd_ - 4 + r * layout_.nblocks * 4]);
    vmovaps(accbuf(r), vT);
  }
}

void AmxGemmGenerator::q6k_body(bool has_prev) {
  auto process = [&](int u, bool prev) {
    if (u == 0 && !prev) vcvtph2ps(vDw, ptr[reg_wm_ + meta::q6k_d(16)]);
    q6k_process(u, prev);
  };
  for (int u = 0; u < 16; ++u) {
    tile_product(u, 16 * u, reg_wq_ + u * 256, true);
    // The next super-block's 4 KB, 4 lines a product (the tiles load straight from the panel).
    for (int l = 0; l < 4; ++l) prefetcht0(ptr[reg_wq_ + layout_.quant_bytes + (4 * u + l) * 64]);
    after_product(u, 16, has_prev, process, [&] { q6k_finish_prev(); });
  }
  add(reg_wq_, static_cast<uint32_t>(layout_.quant_bytes));
  add(reg_wm_, static_cast<uint32_t>(layout_.meta_bytes));
  add(reg_xq_, layout_.block / 64 * 1024);
  add(reg_xd_, 4);
}

void AmxGemmGenerator::q6k_panel() {
  bodies(layout_.nblocks, false, [&](bool has_prev, bool) { q6k_body(has_prev); });
  drain(16, true, [&](int u, bool prev) { q6k_process(u, prev); }, [&] { q6k_finish_prev(); });
}

// ---- Q8_0: one tile product per block of 32 (signed), acc += float(sumi) * (d_w*d_a) ----
// Four blocks (two 64-value chunks of the activation tiles) a body, one pipeline across the bodies of a
// panel: block b - kLag is scaled after block b's product, the previous body's last blocks at negative
// offsets (the pointers move on at the end of each body).
void AmxGemmGenerator::q8_0_process(int b) {  // b: -kLag .. 3, relative to this body's first block
  vcvtph2ps(vDw, ptr[reg_wm_ + b * layout_.meta_bytes + meta::q8_0_d(16)]);
  for (int r = 0; r < m_; ++r) {
    vmulps(vS, vDw, ptr_b[reg_xd_ + r * layout_.nblocks * 4 + 4 * b]);
    vcvtdq2ps(vT, cbuf(b + 4, r));
    vfmadd231ps(Zmm(r), vT, vS);
  }
}

void AmxGemmGenerator::q8_0_product(int b) {
  tile_product(b, 32 * b, reg_wq_ + b * layout_.quant_bytes, true);
  // 4 KB ahead (eight blocks), one block's lines a product.
  for (int64_t l = 0; l < layout_.quant_bytes; l += 64) prefetcht0(ptr[reg_wq_ + (b + 8) * layout_.quant_bytes + l]);
}

void AmxGemmGenerator::q8_0_body(bool has_prev) {
  for (int b = 0; b < 4; ++b) {
    q8_0_product(b);
    after_product(b, 4, has_prev, [&](int u, bool prev) { q8_0_process(prev ? u - 4 : u); }, [] {});
  }
  add(reg_wq_, static_cast<uint32_t>(4 * layout_.quant_bytes));
  add(reg_wm_, static_cast<uint32_t>(4 * layout_.meta_bytes));
  add(reg_xq_, 2 * 1024);  // the activation tiles: 1 KB per 64 values
  add(reg_xd_, 4 * 4);
}

void AmxGemmGenerator::q8_0_panel() {
  auto process = [&](int u, bool prev) { q8_0_process(prev ? u - 4 : u); };
  const int64_t full = layout_.nblocks / 4;
  bodies(full, false, [&](bool has_prev, bool) { q8_0_body(has_prev); });
  if (full > 0) drain(4, true, process, [] {});
  // The last 1-3 blocks: a pipeline of their own (the pointers stay).
  const int rest = static_cast<int>(layout_.nblocks % 4);
  if (rest == 0) return;
  for (int b = 0; b < rest; ++b) {
    q8_0_product(b);
    after_product(b, rest, false, process, [] {});
  }
  drain(rest, false, process, [] {});
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

  Xbyak::Label l_panel;
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
    switch (desc_.wtype) {
      case GgmlType::Q4_K:
      case GgmlType::Q5_K: q4k_panel(); break;
      case GgmlType::Q6_K: q6k_panel(); break;
      case GgmlType::Q8_0: q8_0_panel(); break;
      default: throw Error("cannot generate kernel " + desc_.name() + ": no AMX body for " + ggml_type_name(desc_.wtype));
    }
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
  L(l_mask10_);
  dd(0x10101010u);
  L(l_sixteenth_);
  dd(0x3D800000u);  // 1/16 as f32
  align(2);
  L(l_tail_);
  for (int t = 0; t <= 16; ++t) dw(static_cast<uint16_t>((1u << t) - 1));
}

}  // namespace dllm::jit
