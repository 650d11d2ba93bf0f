// The AMX GEMM generator (family amx): the integer products of each sub-block (Q4_K: 32 weights,
// Q6_K: 16, Q8_0: a block of 32) run on the AMX tile unit, C[m act rows][16 weight rows] +=
// A[m][K] . B[K/4][16][4] with the activations as A (signed) and one weight panel as B (a panel
// vector is exactly a B tile row); AVX-512 then applies each sub-block's scale to the int32 tile, which
// it reads back from a stack buffer, exactly as the avx512-vnni kernels apply it to their registers.
// Four C tiles rotate so that the tile unit computes sub-blocks s+1, s+2 while AVX-512 scales s (the
// int32 results go through memory, and a tile store takes a while to become readable).
//
// Tiles: tmm0-3 C (m x 64 bytes), tmm4/5 A (m x Kt bytes), tmm6/7 B (Kt/4 x 64 bytes). A tiles are
// read from the activations' tile form (QuantizedActs::tiles: 16 rows x 64 bytes per 64 values of k).
// Q4_K's 4-bit weights are first widened into a stack buffer per super-block (low nibbles as they
// are, high nibbles as 16*q with the 1/16 folded into the scale); Q6_K (signed q - 32) and Q8_0
// (signed) tiles load straight from the repacked panels, so no offset corrections are needed.
#pragma once
#include "jit/gemm_desc.h"
#include "jit/repack.h"
#include "jit/x64/jit_generator.h"

namespace dllm::jit {

class AmxGemmGenerator : public JitGenerator {
 public:
  explicit AmxGemmGenerator(const GemmDesc& desc);

 private:
  void generate() override;
  void q4k_panel();
  void q4k_body(bool has_prev, bool widen_next);
  void q4k_widen(int q);
  void q4k_widen_first();
  void q4k_widen_vector(int q, const Xbyak::RegExp& src, const Xbyak::RegExp& dst);
  void q4k_process(int u, bool prev);
  void q4k_finish_prev();
  void q4k_advance();
  void q6k_panel();
  void q6k_body(bool has_prev);
  void q6k_process(int u, bool prev);
  void q6k_finish_prev();
  void q8_0_panel();
  void q8_0_body(bool has_prev);
  void q8_0_product(int b);
  void q8_0_process(int b);

  // Product i of a run: loads A (the activations' k values k0 .. k0+Kt) and B (at b_base + b_off, rows
  // 64 bytes apart) into slots i % 2 and computes C[i % 4] = A . B (signed or unsigned B).
  void tile_product(int i, int64_t k0, const Xbyak::RegExp& b_at, bool b_signed);
  // Stores C[i % 4] to its stack buffer.
  void tile_store(int i);
  // The pipeline's schedule (amx_gemm.cpp): after product i of a body of n, store product i - 1 and scale
  // product i - kLag, reaching into the previous body (process(u, prev = true), then finish_prev) for i < kLag.
  template <class Process, class Finish>
  void after_product(int i, int n, bool has_prev, Process process, Finish finish_prev);
  // The end of a run: the last product stored, the last kLag scaled (prev: the pointers moved on), finish.
  template <class Process, class Finish>
  void drain(int n, bool prev, Process process, Finish finish);
  // count bodies of a panel: the first, the middle ones in a loop, and with distinct_last the last apart;
  // body(has_prev, last).
  template <class Body>
  void bodies(int64_t count, bool distinct_last, Body body);
  // Stack addresses.
  Xbyak::Address cbuf(int i, int r) { return ptr[rsp + kCbufOff + (i % 4) * 1024 + r * 64]; }
  Xbyak::Address accbuf(int r) { return ptr[rsp + kAccOff + r * 64]; }
  void store_panel(bool masked);

  // Two wide buffers (Q4_K: the super-block being multiplied and the next one), kWideBytes apart.
  static constexpr int kCbufOff = 0, kAccOff = 4096, kWideOff = 5120, kWideBytes = 4096,
                       kFrameBytes = kWideOff + 2 * kWideBytes;

  const GemmDesc desc_;
  const PackedLayout layout_;
  const int m_;
  const int kt_;  // k per tile product: 32 (Q4_K, Q8_0) or 16 (Q6_K)

  const Xbyak::Reg64 reg_args_ = rdi;
  const Xbyak::Reg64 reg_wq_ = rsi, reg_wm_ = rdx;
  const Xbyak::Reg64 reg_xq_ = rcx, reg_xd_ = r8, reg_xs_ = r9;
  const Xbyak::Reg64 reg_y_ = r11, reg_np_ = r12, reg_blk_ = r13, reg_panel_ = r14;
  const Xbyak::Reg64 reg_stride_64_ = rbx, reg_addr_ = r10, reg_tmp_ = r15;

  Xbyak::Label l_cfg_, l_mask0f_, l_mask_f0_, l_mask10_, l_sixteenth_, l_tail_;
};

}  // namespace dllm::jit
