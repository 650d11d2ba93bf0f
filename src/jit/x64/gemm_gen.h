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

  // One block of one panel for all M rows, per weight type (gemm_q4k.cpp: Q4_K and Q5_K, gemm_q6k.cpp,
  // gemm_q8_0.cpp).
  // Pointers on entry: reg_wq_ (this block's quants), reg_wm_ (its meta record), reg_xq_/xd_/xs_/xc_
  // (this block of activation row 0). Q8_0 and Q5_0 handle `blocks` (1 or 2) consecutive blocks at once.
  void body_q4k();          // Q4_K and Q5_K
  void body_q5k_avx2();     // Q5_K on AVX2 (ymm only)
  void body_q4k_avx2_one_chain();  // Q4_K on AVX2 (ymm only): one dot chain per row
  // AVX2: w = the 4-bit weights of sub-block `half` of the pair whose vector is at e (low nibbles, or the high
  // ones shifted down), masked with *mask or the 0x0F constant; raw holds the vector (loaded with the
  // stream's prefetch for half 0).
  void nibbles_avx2(const Vmm& w, const Vmm& raw, const Xbyak::RegExp& e, int half, const Vmm* mask);
  void q4k_mins_and_accumulate();  // their mins term and the accumulator update
  // One sub-block's dots into the super-block sums (K-quants): sc = its P scales at e times d, then for each row
  // sb = float(chain) * sc (first) or sb += float(chain) * sc; chain: vdot_a, or vdot_b when chain_b.
  void scale_into_sum(const Vmm& sc, const Xbyak::RegExp& e, bool is_signed, const Vmm& d, bool first,
                      bool chain_b = false);
  void body_q6k();
  void body_q6k_two_vectors();  // zmm only (instantiated for Zmm), panels of two vectors
  void body_q8_0(int blocks);
  void body_q5_0(int blocks);   // gemm_q5_0.cpp
  // Q8_0 and Q5_0: acc += float(chain) * (d_w * d_a) for the `blocks` blocks whose int32 dots are in vdot_a
  // (and vdot_b), d_w from the meta records; da, db and prod are temporaries.
  void q8_0_scale_and_accumulate(int blocks, const Vmm& da, const Vmm& db, const Vmm& prod);
  // dst |= h & 0x10 per byte (the fifth bits of Q5_K and Q5_0, moved to bit 4); tmp is clobbered.
  void or_bit4(const Vmm& dst, const Vmm& h, const Vmm& tmp);

  // ---- registers ----
  // Per row and vector of the panel (in this order, each kind M x V registers, V = vectors per panel):
  // two int32 dot chains (one where the plan says so: AVX2 Q4_K and Q6_K), the f32 super-block sum
  // (K-quants), the f32 accumulator (unless on the stack);
  // then the temporaries. Row r, vector v is slot r * V + v; the accumulators are addressed by slot.
  int slot(int r, int v = 0) const;
  Vmm vdot_a(int r, int v = 0) const;
  Vmm vdot_b(int r, int v = 0) const;
  Vmm vsb(int r, int v = 0) const;
  Vmm vacc(int s) const;
  Vmm vtmp(int i) const;  // temporaries 0 .. plan_.temps-1 (the last one is vbcast() on ymm)
  Vmm vbcast() const;     // ymm: the broadcast activation register

  // ---- activation addresses (row r of the tile, current block) ----
  // Row r's quants are r * k bytes after row 0: addressed as a base plus the stride register times 1, 2
  // or 4, so that the displacement is the byte within the block and fits the short (disp8) encoding.
  Xbyak::RegExp xq(int r, int byte) const;
  Xbyak::RegExp xd(int r, int block = 0) const { return reg_xd_ + r * layout_.nblocks * 4 + 4 * block; }
  Xbyak::RegExp xs(int r, int i) const { return reg_xs_ + r * (desc_.k / 32) * 2 + 2 * i; }
  Xbyak::RegExp xc(int r, int i) const { return reg_xc_ + r * corr_stride() + 4 * i; }
  int64_t corr_stride() const { return (act_format_for(desc_.wtype) == ActFormat::Q8_0 ? desc_.k / 32 : desc_.k / 16) * 4; }

  // ---- instructions that differ by family ----
  void vzero(const Vmm& v);
  void load_vec(const Vmm& v, const Xbyak::RegExp& e);
  // load_vec of the weight stream, with a software prefetch of the same stream ahead (4+ rows).
  void load_weights(const Vmm& v, const Xbyak::RegExp& e);
  // acc += sum of 4 products u8(w) * s8(x), per dword; x = 4 bytes at e, broadcast.
  // AVX2 (vpmaddubsw) needs u8(w) <= 128 so that pairs cannot saturate int16.
  void dot_u8s8(const Vmm& acc, const Vmm& w, const Xbyak::RegExp& e);
  // AVX2 only: int16 lanes acc16 += the vpmaddubsw pair sums of u8(w) * s8(x) (first: acc16 = them); the
  // caller bounds the sums so that they fit int16 and widens acc16 with vpmaddwd by ones.
  void dot_u8s8_i16(const Vmm& acc16, const Vmm& w, const Xbyak::RegExp& e, bool first);
  // AVX2 only: acc += sum of 4 products s8(w) * s8(x): |w| (wabs) times x with w's sign (vpsignb).
  void dot_s8s8_avx2(const Vmm& acc, const Vmm& wabs, const Vmm& w, const Xbyak::RegExp& e);
  // acc += w0*x0 + w1*x1 per dword: int16 pairs w times the int16 pair at e, broadcast.
  void dot_pairs(const Vmm& acc, const Vmm& w, const Xbyak::RegExp& e);
  // dst = src & mask (bytes); the mask from a register when masks_in_regs_ (Q4_K tiles with room for them).
  void and_bytes(const Vmm& dst, const Vmm& src, const Xbyak::Label& mask);
  // dst = src * (f32 at e, broadcast); dst != src.
  void mul_bcast_f32(const Vmm& dst, const Vmm& src, const Xbyak::RegExp& e);
  // acc[s] += a * b (s = slot(r, v)); a is clobbered when the accumulators live on the stack.
  void acc_fma(int s, const Vmm& a, const Vmm& b);
  // acc[s] += a * (f32 at e, broadcast); a and tmp may be clobbered.
  void acc_fma_bcast(int s, const Vmm& a, const Xbyak::RegExp& e, const Vmm& tmp);
  // f32 vector of P scales: u8 / i8 bytes at e, converted, times the f32 vector d.
  void load_scales_f32(const Vmm& dst, const Xbyak::RegExp& e, bool is_signed, const Vmm& d);
  void load_u8_pairs_to_i16(const Vmm& v, const Xbyak::RegExp& e);
  void load_f16_to_f32(const Vmm& v, const Xbyak::RegExp& e);

  Xbyak::Label l_mask0f_, l_mask_f0_, l_mask10_, l_ones16_, l_sixteenth_, l_tail_;

  const GemmDesc desc_;
  const PackedLayout layout_;
  const RegPlan plan_;
  const int m_;
  const int nv_;   // vectors per panel (1, or 2 for Q6_K on zmm)
  const int mv_;   // slots: m_ * nv_
  const int pvb_;  // bytes of one 4-value group across the panel: nv_ * kVB

  // General registers (System V: rdi holds the argument pointer).
  const Xbyak::Reg64 reg_args_ = rdi;
  const Xbyak::Reg64 reg_wq_ = rsi, reg_wm_ = rdx;
  const Xbyak::Reg64 reg_xq_ = rcx, reg_xd_ = r8, reg_xs_ = r9, reg_xc_ = r10;
  const Xbyak::Reg64 reg_y_ = r11, reg_np_ = r12, reg_blk_ = r13, reg_panel_ = r14, reg_tail_ = r15;
  const Xbyak::Reg64 reg_tmp_ = rax;  // prologue only
  // Activation addressing (xq): the row stride k, and rows 3 and 6 of the tile (rax and r15 are free once
  // the prologue has used them; r15 only on zmm, where the tail mask lives in k1).
  const Xbyak::Reg64 reg_kstride_ = rbx, reg_xq3_ = rax, reg_xq6_ = r15;
  // The 0x0F / 0xF0 byte masks held in the last vector registers, when the plan leaves them free (AVX2
  // shifts the high nibbles down and needs only 0x0F; so does Q5_K).
  bool masks_in_regs_ = false;
  // Q5_K and Q5_0 shift their high nibbles down on every family, as AVX2 does Q4_K's.
  int mask_regs() const {
    return desc_.isa == Isa::Avx2 || desc_.wtype == GgmlType::Q5_K || desc_.wtype == GgmlType::Q5_0 ? 1 : 2;
  }
  Vmm vmask0f() const { return Vmm(vector_registers(desc_.isa) - mask_regs()); }
  Vmm vmaskf0() const { return Vmm(vector_registers(desc_.isa) - 1); }

 private:
  void generate() override;
  void zero_accumulators();
  void store_panel(bool masked);
  void emit_constants();
};

}  // namespace dllm::jit
