// What the GEMM generators share, templated on the vector register (Zmm: AVX-512-VNNI, 16 weight rows
// per vector; Ymm: AVX-VNNI or AVX2, 8 rows): the panel loop, the block loop, the stores (masked for a
// partial last panel), register naming with range checks, and the few instructions that differ by
// family (the int8 dot product, broadcasts, constants). Each weight type supplies a body: one
// block (256 values for the K-quants, 32 for Q8_0) of one panel for the tile's M activation rows.
//
// Kernel contract (GemmKernelArgs in gemm_desc.h): for each of n_panels panels starting at w,
//   y[r][p] = sum over blocks of the block's scaled integer dot products, r < M, p < P (tail_cols on the
// last panel), y rows n floats apart; the activation rows are k (quants) apart.
#pragma once
#include <type_traits>

#include "jit/gemm_desc.h"
#include "jit/repack.h"
#include "jit/x64/jit_generator.h"
#include "jit/x64/reg_plan.h"

namespace dllm::jit {

template <class Vmm>
class GemmGenerator : public JitGenerator {
 public:
  explicit GemmGenerator(const GemmDesc& desc);

 protected:
  static constexpr bool kZmm = std::is_same_v<Vmm, Xbyak::Zmm>;
  static constexpr int kP = kZmm ? 16 : 8;  // weight rows per vector
  static constexpr int kVB = 4 * kP;        // bytes per vector

  // One block of one panel for all M rows, per weight type (gemm_q4k.cpp, gemm_q6k.cpp, gemm_q8_0.cpp).
  // Pointers on entry: reg_wq_ (this block's quants), reg_wm_ (its meta record), reg_xq_/xd_/xs_/xc_
  // (this block of activation row 0).
  void body_q4k();
  void body_q6k();
  void body_q8_0();

  // ---- registers ----
  // Row registers come first (dot, super-block sum, accumulator), temporaries after them.
  Vmm vdot(int r) const;   // int32 dot of the current sub-block (Q8_0: of the block)
  Vmm vsumi(int r) const;  // int32 scaled sum of the current super-block (K-quants only)
  Vmm vacc(int r) const;   // f32 accumulator (only when !plan_.acc_in_mem)
  Vmm vtmp(int i) const;   // temporaries 0 .. plan_.temps-1 (the last one is vbcast() on ymm)
  Vmm vbcast() const;      // ymm: the broadcast activation register

  // ---- activation addresses (row r of the tile, current block) ----
  Xbyak::RegExp xq(int r, int byte) const { return reg_xq_ + r * desc_.k + byte; }
  Xbyak::RegExp xd(int r) const { return reg_xd_ + r * layout_.nblocks * 4; }
  Xbyak::RegExp xs(int r, int i) const { return reg_xs_ + r * (desc_.k / 32) * 2 + 2 * i; }
  Xbyak::RegExp xc(int r, int i) const { return reg_xc_ + r * corr_stride() + 4 * i; }
  int64_t corr_stride() const { return (desc_.wtype == GgmlType::Q8_0 ? desc_.k / 32 : desc_.k / 16) * 4; }

  // ---- instructions that differ by family ----
  void vzero(const Vmm& v);
  void load_vec(const Vmm& v, const Xbyak::RegExp& e);
  // acc += sum of 4 products u8(w) * s8(x), per dword; x = 4 bytes at e, broadcast.
  void dot_u8s8(const Vmm& acc, const Vmm& w, const Xbyak::RegExp& e);
  // acc += w0*x0 + w1*x1 per dword: int16 pairs w times the int16 pair at e, broadcast.
  void dot_pairs(const Vmm& acc, const Vmm& w, const Xbyak::RegExp& e);
  void and_mask0f(const Vmm& dst, const Vmm& src);  // dst = src & 0x0F (bytes)
  void and_mask30(const Vmm& dst, const Vmm& src);  // dst = src & 0x30 (bytes)
  // dst = src * (f32 at e, broadcast); dst != src.
  void mul_bcast_f32(const Vmm& dst, const Vmm& src, const Xbyak::RegExp& e);
  // acc[r] += d * f (negate: -=); f is clobbered.
  void fma_acc(int r, const Vmm& d, const Vmm& f, bool negate);
  // sumi[r] = dot[r] * sc (first) or sumi[r] += dot[r] * sc; dot is clobbered.
  void scale_into_sum(int r, const Vmm& sc, bool first);
  // AVX2 only: acc += sum of 4 products s8(w) * s8(x): |w| (wabs) times x with w's sign (vpsignb).
  void dot_s8s8_avx2(const Vmm& acc, const Vmm& wabs, const Vmm& w, const Xbyak::RegExp& e);
  // q |= (src & 0x30) per byte: the Q6_K high bits merged into the low nibbles.
  void or_masked30(const Vmm& q, const Vmm& src, const Vmm& tmp);
  // vpmovzx/sx of P bytes into dwords, 2P bytes into words, P halves into floats.
  void load_u8_to_i32(const Vmm& v, const Xbyak::RegExp& e);
  void load_u8_pairs_to_i16(const Vmm& v, const Xbyak::RegExp& e);
  void load_i8_pairs_to_i16(const Vmm& v, const Xbyak::RegExp& e);
  void load_f16_to_f32(const Vmm& v, const Xbyak::RegExp& e);

  const GemmDesc desc_;
  const PackedLayout layout_;
  const RegPlan plan_;
  const int m_;

  // General registers (System V: rdi holds the argument pointer).
  const Xbyak::Reg64 reg_args_ = rdi;
  const Xbyak::Reg64 reg_wq_ = rsi, reg_wm_ = rdx;
  const Xbyak::Reg64 reg_xq_ = rcx, reg_xd_ = r8, reg_xs_ = r9, reg_xc_ = r10;
  const Xbyak::Reg64 reg_y_ = r11, reg_np_ = r12, reg_blk_ = r13, reg_panel_ = r14, reg_tail_ = r15;
  const Xbyak::Reg64 reg_tmp_ = rax;

 private:
  void generate() override;
  void zero_accumulators();
  void store_panel(bool masked);
  void emit_constants();

  Xbyak::Label l_mask0f_, l_mask30_, l_ones16_, l_tail_;
};

}  // namespace dllm::jit
