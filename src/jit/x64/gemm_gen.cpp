// GemmGenerator: the panel and block loops, stores, register naming and the family-specific instructions
// shared by the weight-type bodies.
#include "jit/x64/gemm_gen.h"

#include <cstddef>
#include <cstdint>

#include "common/error.h"

namespace dllm::jit {

using Xbyak::RegExp;

namespace {
constexpr size_t kMaxCodeBytes = 256 * 1024;
}

template <class Vmm>
GemmGenerator<Vmm>::GemmGenerator(const GemmDesc& desc)
    : JitGenerator(desc.name(), kMaxCodeBytes),
      desc_(desc),
      layout_(packed_layout(desc.isa, desc.wtype, desc.n, desc.k)),
      plan_(plan_registers(desc.isa, desc.wtype, desc.m, desc.k)),
      m_(desc.m),
      nv_(plan_.vectors),
      mv_(m_ * nv_),
      pvb_(nv_ * kVB) {
  if ((desc.isa == Isa::Avx512Vnni) != kZmm || desc.isa == Isa::Portable)
    throw Error("cannot generate kernel " + desc.name() + ": family and register width disagree");
  if (desc.m < 1 || plan_.m != desc.m || desc.m > row_tile_cap(desc.wtype) || (!kZmm && desc.m > 6))
    throw Error("cannot generate kernel " + desc.name() + ": a row tile of " + std::to_string(desc.m) +
                " does not fit the " + std::to_string(vector_registers(desc.isa)) + " vector registers");
  if (layout_.p != nv_ * kP || (nv_ == 2 && (!kZmm || !require_weight_traits(desc.wtype, desc.name()).two_vector_panels)))
    throw Error("cannot generate kernel " + desc.name() + ": no body for panels of " + std::to_string(layout_.p) +
                " rows");
  masks_in_regs_ = require_weight_traits(desc.wtype, desc.name()).nibble_masks &&
                   plan_.total() + mask_regs() <= vector_registers(desc.isa);
}

template <class Vmm>
RegExp GemmGenerator<Vmm>::xq(int r, int byte) const {
  switch (r) {
    case 0: return reg_xq_ + byte;
    case 1: return reg_xq_ + reg_kstride_ + byte;
    case 2: return reg_xq_ + reg_kstride_ * 2 + byte;
    case 3: return reg_xq3_ + byte;
    case 4: return reg_xq_ + reg_kstride_ * 4 + byte;
    case 5: return reg_xq3_ + reg_kstride_ * 2 + byte;
    case 6: return reg_xq6_ + byte;
    case 7: return reg_xq6_ + reg_kstride_ + byte;
    default: throw Error(kernel_name() + ": activation row index out of range");
  }
}

// ---- registers ----

template <class Vmm>
int GemmGenerator<Vmm>::slot(int r, int v) const {
  if (r < 0 || r >= m_ || v < 0 || v >= nv_) throw Error(kernel_name() + ": row or vector index out of range");
  return r * nv_ + v;
}

template <class Vmm>
Vmm GemmGenerator<Vmm>::vdot_a(int r, int v) const {
  return Vmm(slot(r, v));
}

template <class Vmm>
Vmm GemmGenerator<Vmm>::vdot_b(int r, int v) const {
  if (plan_.chains < 2) throw Error(kernel_name() + ": a second dot chain in a one-chain plan");
  return Vmm(mv_ + slot(r, v));
}

template <class Vmm>
Vmm GemmGenerator<Vmm>::vsb(int r, int v) const {
  if (act_format_for(desc_.wtype) == ActFormat::Q8_0) throw Error(kernel_name() + ": super-block sum misuse");
  return Vmm(plan_.chains * mv_ + slot(r, v));
}

template <class Vmm>
Vmm GemmGenerator<Vmm>::vacc(int s) const {
  if (s < 0 || s >= mv_ || plan_.acc_in_mem) throw Error(kernel_name() + ": accumulator register misuse");
  return Vmm((plan_.per_row / nv_ - 1) * mv_ + s);
}

template <class Vmm>
Vmm GemmGenerator<Vmm>::vtmp(int i) const {
  if (i < 0 || i >= plan_.temps) throw Error(kernel_name() + ": temporary register index out of range");
  return Vmm(plan_.per_row * m_ + i);
}

template <class Vmm>
Vmm GemmGenerator<Vmm>::vbcast() const {
  if (kZmm) throw Error(kernel_name() + ": zmm kernels broadcast from memory");
  return vtmp(plan_.temps - 1);
}

// ---- family-specific instructions ----

template <class Vmm>
void GemmGenerator<Vmm>::vzero(const Vmm& v) {
  if constexpr (kZmm) vpxord(v, v, v);
  else vpxor(v, v, v);
}

template <class Vmm>
void GemmGenerator<Vmm>::load_vec(const Vmm& v, const RegExp& e) {
  if constexpr (kZmm) vmovdqu32(v, ptr[e]);
  else vmovdqu(v, ptr[e]);
}

template <class Vmm>
void GemmGenerator<Vmm>::load_weights(const Vmm& v, const RegExp& e) {
  load_vec(v, e);
  // Measured: with 4+ rows (weights read from L2 by many row tiles) a software prefetch 4 KB ahead (8 KB
  // for Q8_0) gains 5-15% over 1 KB on a Zen 5 (the first row tile over a run of panels streams the
  // weights from memory, and the longer distance keeps enough lines in flight); with fewer rows the
  // hardware prefetcher does as well alone there; the avx2 family's first tiles prefetch at any row count
  // (desc.prefetch, first_tile_prefetches).
  if (m_ >= 4 || desc_.prefetch) prefetcht0(ptr[e + require_weight_traits(desc_.wtype, kernel_name()).prefetch_bytes]);
}

template <class Vmm>
void GemmGenerator<Vmm>::dot_u8s8(const Vmm& acc, const Vmm& w, const RegExp& e) {
  if constexpr (kZmm) {
    vpdpbusd(acc, w, ptr_b[e], Xbyak::EvexEncoding);
  } else if (desc_.isa == Isa::AvxVnni) {
    vpbroadcastd(vbcast(), ptr[e]);
    vpdpbusd(acc, w, vbcast(), Xbyak::VexEncoding);
  } else {  // AVX2: u8*s8 pairs to int16, pairs to int32, add
    const Vmm b = vbcast();
    vpbroadcastd(b, ptr[e]);
    vpmaddubsw(b, w, b);
    vpmaddwd(b, b, ptr[rip + l_ones16_]);
    vpaddd(acc, acc, b);
  }
}

template <class Vmm>
void GemmGenerator<Vmm>::dot_u8s8_i16(const Vmm& acc16, const Vmm& w, const RegExp& e, bool first) {
  if (kZmm || desc_.isa != Isa::Avx2) throw Error(kernel_name() + ": int16 accumulation is the AVX2 body's");
  const Vmm b = vbcast();
  vpbroadcastd(b, ptr[e]);
  if (first) {
    vpmaddubsw(acc16, w, b);
    return;
  }
  vpmaddubsw(b, w, b);
  vpaddw(acc16, acc16, b);
}

template <class Vmm>
void GemmGenerator<Vmm>::dot_s8s8_avx2(const Vmm& acc, const Vmm& wabs, const Vmm& w, const RegExp& e) {
  const Vmm b = vbcast();
  vpbroadcastd(b, ptr[e]);
  vpsignb(b, b, w);  // x * sign(w): then |w| * that = w * x, and |pair sums| <= 2*128*127 fits int16
  vpmaddubsw(b, wabs, b);
  vpmaddwd(b, b, ptr[rip + l_ones16_]);
  vpaddd(acc, acc, b);
}

template <class Vmm>
void GemmGenerator<Vmm>::dot_pairs(const Vmm& acc, const Vmm& w, const RegExp& e) {
  if constexpr (kZmm) {
    vpdpwssd(acc, w, ptr_b[e], Xbyak::EvexEncoding);
  } else if (desc_.isa == Isa::AvxVnni) {
    vpbroadcastd(vbcast(), ptr[e]);
    vpdpwssd(acc, w, vbcast(), Xbyak::VexEncoding);
  } else {
    const Vmm b = vbcast();
    vpbroadcastd(b, ptr[e]);
    vpmaddwd(b, b, w);
    vpaddd(acc, acc, b);
  }
}

template <class Vmm>
void GemmGenerator<Vmm>::and_bytes(const Vmm& dst, const Vmm& src, const Xbyak::Label& mask) {
  if (masks_in_regs_) {
    const Vmm m = &mask == &l_mask0f_ ? vmask0f() : vmaskf0();
    if constexpr (kZmm) vpandd(dst, src, m);
    else vpand(dst, src, m);
    return;
  }
  if constexpr (kZmm) vpandd(dst, src, ptr_b[rip + mask]);
  else vpand(dst, src, ptr[rip + mask]);
}

template <class Vmm>
void GemmGenerator<Vmm>::mul_bcast_f32(const Vmm& dst, const Vmm& src, const RegExp& e) {
  if constexpr (kZmm) {
    vmulps(dst, src, ptr_b[e]);
  } else {
    vbroadcastss(dst, ptr[e]);
    vmulps(dst, src, dst);
  }
}

template <class Vmm>
void GemmGenerator<Vmm>::acc_fma(int s, const Vmm& a, const Vmm& b) {
  if (!plan_.acc_in_mem) {
    vfmadd231ps(vacc(s), a, b);
    return;
  }
  if (s < 0 || s >= mv_) throw Error(kernel_name() + ": accumulator slot out of range");
  const Xbyak::Address acc = ptr[rsp + s * kVB];
  vfmadd213ps(a, b, acc);  // a = b*a + acc
  vmovaps(acc, a);
}

template <class Vmm>
void GemmGenerator<Vmm>::acc_fma_bcast(int s, const Vmm& a, const RegExp& e, const Vmm& tmp) {
  if (kZmm && !plan_.acc_in_mem) {
    vfmadd231ps(vacc(s), a, ptr_b[e]);
    return;
  }
  vbroadcastss(tmp, ptr[e]);
  acc_fma(s, a, tmp);
}

template <class Vmm>
void GemmGenerator<Vmm>::load_scales_f32(const Vmm& dst, const RegExp& e, bool is_signed, const Vmm& d) {
  if (is_signed) vpmovsxbd(dst, ptr[e]);
  else vpmovzxbd(dst, ptr[e]);
  vcvtdq2ps(dst, dst);
  vmulps(dst, dst, d);
}

template <class Vmm>
void GemmGenerator<Vmm>::scale_into_sum(const Vmm& sc, const RegExp& e, bool is_signed, const Vmm& d, bool first,
                                        bool chain_b) {
  load_scales_f32(sc, e, is_signed, d);
  for (int r = 0; r < m_; ++r) {
    const Vmm c = chain_b ? vdot_b(r) : vdot_a(r);
    vcvtdq2ps(c, c);
    if (first) vmulps(vsb(r), c, sc);
    else vfmadd231ps(vsb(r), c, sc);
  }
}

template <class Vmm>
void GemmGenerator<Vmm>::load_u8_pairs_to_i16(const Vmm& v, const RegExp& e) { vpmovzxbw(v, ptr[e]); }
template <class Vmm>
void GemmGenerator<Vmm>::load_f16_to_f32(const Vmm& v, const RegExp& e) { vcvtph2ps(v, ptr[e]); }

// ---- the kernel ----

template <class Vmm>
void GemmGenerator<Vmm>::zero_accumulators() {
  if (!plan_.acc_in_mem) {
    for (int s = 0; s < mv_; ++s) vzero(vacc(s));
    return;
  }
  vzero(vtmp(0));
  for (int s = 0; s < mv_; ++s) vmovaps(ptr[rsp + s * kVB], vtmp(0));
}

template <class Vmm>
void GemmGenerator<Vmm>::store_panel(bool masked) {
  if (masked && !kZmm) vmovdqu(vtmp(0), ptr[reg_tail_]);  // lanes < tail_cols all ones
  for (int r = 0; r < m_; ++r) {
    for (int v = 0; v < nv_; ++v) {
      const int s = slot(r, v);
      Vmm src = plan_.acc_in_mem ? vtmp(1) : vacc(s);
      if (plan_.acc_in_mem) vmovaps(src, ptr[rsp + s * kVB]);
      const RegExp y = reg_y_ + r * desc_.n * 4 + v * kVB;
      if (!masked) {
        vmovups(ptr[y], src);
      } else if constexpr (kZmm) {
        vmovups(ptr[y] | (v == 0 ? k1 : k2), src);
      } else {
        vmaskmovps(ptr[y], vtmp(0), src);
      }
    }
  }
}

template <class Vmm>
void GemmGenerator<Vmm>::generate() {
  const bool q8k = act_format_for(desc_.wtype) == ActFormat::Q8_K;
  preamble();
  if (plan_.acc_in_mem) {
    sub(rsp, mv_ * kVB);
    and_(rsp, -64);
  }
  // Tail mask of a partial last panel: k1 (zmm; k2 for a panel's second vector), or a pointer to P lanes
  // of the ones/zeros table (ymm).
  mov(reg_tmp_, ptr[reg_args_ + offsetof(GemmKernelArgs, tail_cols)]);
  lea(reg_tail_, ptr[rip + l_tail_]);
  if constexpr (kZmm) {
    if (nv_ == 2) {  // lanes of the second vector: max(tail - 16, 0); of the first: min(tail, 16)
      xor_(reg_kstride_, reg_kstride_);
      lea(reg_blk_, ptr[reg_tmp_ - kP]);
      cmp(reg_blk_, 0);
      cmovg(reg_kstride_, reg_blk_);
      kmovw(k2, ptr[reg_tail_ + reg_kstride_ * 2]);
      mov(reg_blk_, kP);
      cmp(reg_tmp_, kP);
      cmovg(reg_tmp_, reg_blk_);
    }
    kmovw(k1, ptr[reg_tail_ + reg_tmp_ * 2]);
  } else {
    neg(reg_tmp_);
    lea(reg_tail_, ptr[reg_tail_ + reg_tmp_ * 4 + 4 * kP]);
  }
  mov(reg_kstride_, desc_.k);
  if (masks_in_regs_) {
    if constexpr (kZmm) {  // Q5_K keeps one mask register (0x0F): vmaskf0() is then the same register
      vmovdqu32(vmask0f(), ptr[rip + l_mask0f_]);
      if (mask_regs() == 2) vmovdqu32(vmaskf0(), ptr[rip + l_mask_f0_]);
    } else {
      vmovdqu(vmask0f(), ptr[rip + l_mask0f_]);
      if (mask_regs() == 2) vmovdqu(vmaskf0(), ptr[rip + l_mask_f0_]);
    }
  }
  mov(reg_panel_, ptr[reg_args_ + offsetof(GemmKernelArgs, w)]);
  mov(reg_y_, ptr[reg_args_ + offsetof(GemmKernelArgs, y)]);
  mov(reg_np_, ptr[reg_args_ + offsetof(GemmKernelArgs, n_panels)]);

  Xbyak::Label l_panel, l_block;
  L(l_panel);
  {
    zero_accumulators();
    mov(reg_wq_, reg_panel_);
    lea(reg_wm_, ptr[reg_panel_ + layout_.meta_offset()]);
    mov(reg_xq_, ptr[reg_args_ + offsetof(GemmKernelArgs, xq)]);
    if (m_ > 3) {
      lea(reg_xq3_, ptr[reg_xq_ + reg_kstride_ * 2]);
      add(reg_xq3_, reg_kstride_);
    }
    if (m_ > 6) {
      lea(reg_xq6_, ptr[reg_xq3_ + reg_kstride_ * 2]);
      add(reg_xq6_, reg_kstride_);
    }
    mov(reg_xd_, ptr[reg_args_ + offsetof(GemmKernelArgs, xd)]);
    mov(reg_xs_, ptr[reg_args_ + offsetof(GemmKernelArgs, xs)]);
    mov(reg_xc_, ptr[reg_args_ + offsetof(GemmKernelArgs, xc)]);
    // Q8_0 blocks go two at a time (two independent dot chains per row), an odd last one alone.
    const int per_iter = q8k ? 1 : 2;
    const int64_t iters = layout_.nblocks / per_iter, rest = layout_.nblocks % per_iter;
    auto advance = [&](int blocks) {
      add(reg_wq_, static_cast<uint32_t>(blocks * layout_.quant_bytes));
      add(reg_wm_, static_cast<uint32_t>(blocks * layout_.meta_bytes));
      add(reg_xq_, blocks * layout_.block);
      if (m_ > 3) add(reg_xq3_, blocks * layout_.block);
      if (m_ > 6) add(reg_xq6_, blocks * layout_.block);
      add(reg_xd_, 4 * blocks);
      if (q8k) add(reg_xs_, 16 * blocks);
      add(reg_xc_, (q8k ? 64 : 4) * blocks);
    };
    if (iters > 0) {
      mov(reg_blk_, iters);
      align(16);
      L(l_block);
      switch (desc_.wtype) {
        case GgmlType::Q4_K:
        case GgmlType::Q5_K: body_q4k(); break;
        case GgmlType::Q6_K: body_q6k(); break;
        case GgmlType::Q8_0: body_q8_0(2); break;
        case GgmlType::Q5_0: body_q5_0(2); break;
        default: throw Error("cannot generate kernel " + desc_.name() + ": no body for " + ggml_type_name(desc_.wtype));
      }
      advance(per_iter);
      dec(reg_blk_);
      jnz(l_block, T_NEAR);
    }
    if (rest && desc_.wtype == GgmlType::Q5_0) body_q5_0(1);
    else if (rest) body_q8_0(1);
    Xbyak::Label l_full, l_stored;
    cmp(reg_np_, 1);
    jne(l_full, T_NEAR);
    cmp(qword[reg_args_ + offsetof(GemmKernelArgs, tail_cols)], layout_.p);
    je(l_full, T_NEAR);
    store_panel(true);
    jmp(l_stored, T_NEAR);
    L(l_full);
    store_panel(false);
    L(l_stored);
    add(reg_panel_, static_cast<uint32_t>(layout_.panel_bytes));
    add(reg_y_, pvb_);
    dec(reg_np_);
    jnz(l_panel, T_NEAR);
  }
  postamble();
  emit_constants();
}

template <class Vmm>
void GemmGenerator<Vmm>::emit_constants() {
  align(64);
  L(l_mask0f_);
  for (int i = 0; i < 64; ++i) db(0x0F);
  L(l_mask_f0_);
  for (int i = 0; i < 64; ++i) db(0xF0);
  L(l_mask10_);
  for (int i = 0; i < 64; ++i) db(0x10);
  L(l_ones16_);
  for (int i = 0; i < 32; ++i) dw(1);
  L(l_sixteenth_);
  for (int i = 0; i < 16; ++i) dd(0x3D800000u);  // 1/16 as f32
  L(l_tail_);
  if constexpr (kZmm) {
    for (int t = 0; t <= kP; ++t) dw(static_cast<uint16_t>((1u << t) - 1));
  } else {
    for (int i = 0; i < kP; ++i) dd(0xFFFFFFFFu);
    for (int i = 0; i < kP; ++i) dd(0);
  }
}

template class GemmGenerator<Xbyak::Zmm>;
template class GemmGenerator<Xbyak::Ymm>;

}  // namespace dllm::jit
