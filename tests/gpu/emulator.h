// A small SIMT emulator that runs dllm's CUDA kernels (src/jit/cuda/kernels/*.cuh) on the CPU, so the
// kernels' indexing, fragment layouts and synchronisation are tested on machines without a GPU.
// Every thread of a block is a fiber with its own stack; blocks run one after another. Fibers switch only
// at block barriers and warp collectives (shuffles, mma), which exchange values through per-warp slots;
// the switch is a few instructions of x86-64 assembly (callee-saved registers and the stack pointer),
// with no system call, and the scheduler resumes only fibers whose barrier has opened.
// The tensor-core instructions are emulated from the fragment layouts PTX documents for mma.m16n8k32
// (s8), mma.m16n8k16 (s8 and f16); f16 conversions round to nearest even like cvt.rn.
//
// Header-only (the test CMake compiles only tests/test_*.cpp); include it from one test file.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <vector>

#include "model/quant.h"

// ---- what kernels/common.cuh expects from a host build
#define DLLM_CUDA_EMULATOR 1
#define DEV inline
#define SHARED_ALIGN16 alignas(16) static
#define UNROLL
#define UNROLL_1
#define DLLM_INF __builtin_inff()

struct uint4 {
  unsigned x, y, z, w;
};
struct float2 {
  float x, y;
};
struct uint2 {
  unsigned x, y;
};

// dllm_emu_switch(&save_sp, new_sp): saves the callee-saved registers on the current stack, stores the
// stack pointer in *save_sp, and resumes the context whose stack pointer is new_sp.
extern "C" void dllm_emu_switch(void** save_sp, void* new_sp);
asm(R"(
  .text
  .p2align 4
  .globl dllm_emu_switch
  .type dllm_emu_switch, @function
dllm_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size dllm_emu_switch, .-dllm_emu_switch
  .section .note.GNU-stack,"",@progbits
  .text
)");

namespace dllm_emu {

struct Dim3 {
  unsigned x = 0, y = 0, z = 0;
};

class Emulator {
 public:
  static Emulator& get() {
    static Emulator e;
    return e;
  }

  Dim3 thread_idx, block_idx, block_dim, grid_dim;  // of the running fiber

  // Runs fn on every thread of a (gx, gy) grid of blocks of `threads` threads (a multiple of 32), each block
  // with `shared_bytes` of dynamic shared memory (filled with 0xff bytes before every block).
  void run(unsigned gx, unsigned gy, unsigned threads, const std::function<void()>& fn, unsigned shared_bytes = 0) {
    if (threads == 0 || threads % 32 != 0 || threads > 1024) throw std::runtime_error("emulator: bad block size");
    if (shared_bytes > 227 * 1024) throw std::runtime_error("emulator: more shared memory than any GPU has");
    if (fibers_.size() < threads) fibers_.resize(threads);
    dyn_smem_.assign(shared_bytes + 16, 0);
    warps_.assign(threads / 32, Warp{});
    fn_ = &fn;
    block_dim = {threads, 1, 1};
    grid_dim = {gx, gy, 1};
    for (unsigned by = 0; by < gy; ++by) {
      for (unsigned bx = 0; bx < gx; ++bx) {
        block_idx = {bx, by, 0};
        std::memset(dyn_smem(), 0xff, shared_bytes);
        for (unsigned i = 0; i < threads; ++i) {
          Fiber& f = fibers_[i];
          if (f.stack.empty()) f.stack.resize(kStack);
          // Initial frame: six zeroed registers, then the entry point as the return address, then a
          // fake return address of the entry function (the ABI's alignment at a call).
          uintptr_t top = reinterpret_cast<uintptr_t>(f.stack.data() + f.stack.size()) & ~uintptr_t{15};
          void** sp = reinterpret_cast<void**>(top);
          *--sp = nullptr;
          *--sp = reinterpret_cast<void*>(&Emulator::entry);
          for (int r = 0; r < 6; ++r) *--sp = nullptr;
          f.sp = sp;
          f.done = false;
          f.wait = Wait::None;
          f.open.clear();
          f.groups.clear();
        }
        live_ = threads;
        bar_arrived_ = 0;
        for (Warp& w : warps_) w.arrived = 0, w.live = 32;
        while (live_ > 0) {
          for (unsigned i = 0; i < threads; ++i) {
            Fiber& f = fibers_[i];
            if (f.done) continue;
            if (f.wait == Wait::Block && bar_gen_ == f.wait_gen) continue;
            if (f.wait == Wait::Warp && warps_[i / 32].gen == f.wait_gen) continue;
            cur_ = i;
            thread_idx = {i, 0, 0};
            dllm_emu_switch(&sched_sp_, f.sp);
          }
        }
      }
    }
  }

  // __syncthreads(): waits for every live thread of the block.
  void block_barrier() {
    const uint64_t gen = bar_gen_;
    if (++bar_arrived_ == live_) {
      bar_arrived_ = 0;
      ++bar_gen_;
    } else {
      wait(Wait::Block, gen);
    }
  }

  // Warp collectives: deposit this lane's value, wait for the warp, compute from all slots, wait again.
  template <class T>
  void deposit(const T& v) {
    static_assert(sizeof(T) <= kSlot, "slot too small");
    std::memcpy(warp().slot[lane()], &v, sizeof(T));
  }
  template <class T>
  T slot(unsigned lane) const {
    T v;
    std::memcpy(&v, warps_[cur_ / 32].slot[lane], sizeof(T));
    return v;
  }
  void warp_barrier() {
    Warp& w = warp();
    const uint64_t gen = w.gen;
    if (++w.arrived == w.live) {
      w.arrived = 0;
      ++w.gen;
      w.epoch = ++epoch_;
    } else {
      wait(Wait::Warp, gen);
    }
  }
  unsigned lane() const { return cur_ % 32; }
  unsigned char* dyn_smem() {
    return reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(dyn_smem_.data()) + 15) & ~uintptr_t{15});
  }

  // cp.async as the hardware may run it: the source is read at issue, the destination written only when a
  // wait retires the copy's group, so a kernel that reads a stage before waiting for it reads poison.
  void async_copy16(void* dst, const void* src) {
    AsyncCopy c;
    c.dst = dst;
    std::memcpy(c.bytes, src, 16);
    fibers_[cur_].open.push_back(c);
  }
  void async_commit() {
    Fiber& f = fibers_[cur_];
    f.groups.push_back(std::move(f.open));
    f.open.clear();
  }
  void async_wait(size_t pending) {
    Fiber& f = fibers_[cur_];
    while (f.groups.size() > pending) {
      for (const AsyncCopy& c : f.groups.front()) std::memcpy(c.dst, c.bytes, 16);
      f.groups.erase(f.groups.begin());
    }
  }
  // The warp's result area, and whether this lane is the first to use it in the current collective
  // (it then computes the result for all lanes).
  unsigned char* warp_result() { return &warp().result[0][0]; }
  bool claim_warp_result() {
    Warp& w = warp();
    if (w.result_epoch == w.epoch) return false;
    w.result_epoch = w.epoch;
    return true;
  }

 private:
  static constexpr size_t kStack = 256 * 1024;
  static constexpr size_t kSlot = 64;
  enum class Wait { None, Block, Warp };
  struct AsyncCopy {
    void* dst;
    unsigned char bytes[16];
  };
  struct Fiber {
    std::vector<AsyncCopy> open;                 // issued since the last commit
    std::vector<std::vector<AsyncCopy>> groups;  // committed, oldest first
    void* sp = nullptr;
    std::vector<char> stack;
    bool done = false;
    Wait wait = Wait::None;
    uint64_t wait_gen = 0;
  };
  struct Warp {
    unsigned arrived = 0, live = 32;
    uint64_t gen = 0;
    uint64_t epoch = 0, result_epoch = 0;  // epoch: unique id of the last opening of this warp's barrier
    alignas(16) unsigned char slot[32][kSlot];
    alignas(16) unsigned char result[32][16];
  };

  Warp& warp() { return warps_[cur_ / 32]; }
  // Parks this fiber until the barrier's generation moves past `gen` (the scheduler checks).
  void wait(Wait kind, uint64_t gen) {
    Fiber& f = fibers_[cur_];
    f.wait = kind;
    f.wait_gen = gen;
    dllm_emu_switch(&f.sp, sched_sp_);
    f.wait = Wait::None;
  }

  [[noreturn]] static void entry() {
    Emulator& e = get();
    (*e.fn_)();
    e.fibers_[e.cur_].done = true;
    --e.live_;
    // A thread that exits no longer holds back barriers.
    if (e.bar_arrived_ > 0 && e.bar_arrived_ == e.live_) {
      e.bar_arrived_ = 0;
      ++e.bar_gen_;
    }
    Warp& w = e.warp();
    --w.live;
    if (w.arrived > 0 && w.arrived == w.live) {
      w.arrived = 0;
      ++w.gen;
      w.epoch = ++e.epoch_;
    }
    void* dead = nullptr;
    dllm_emu_switch(&dead, e.sched_sp_);
    __builtin_unreachable();
  }

  void* sched_sp_ = nullptr;
  std::vector<unsigned char> dyn_smem_;
  std::vector<Fiber> fibers_;
  std::vector<Warp> warps_;
  const std::function<void()>* fn_ = nullptr;
  unsigned cur_ = 0, live_ = 0, bar_arrived_ = 0;
  uint64_t bar_gen_ = 0, epoch_ = 0;
};

inline int8_t byte_of(uint32_t w, int i) { return static_cast<int8_t>((w >> (8 * i)) & 0xff); }
inline float half_of(uint32_t w, int i) { return dllm::quant::fp16_to_f32(static_cast<uint16_t>(w >> (16 * i))); }

}  // namespace dllm_emu

#define threadIdx (::dllm_emu::Emulator::get().thread_idx)
#define blockIdx (::dllm_emu::Emulator::get().block_idx)
#define blockDim (::dllm_emu::Emulator::get().block_dim)
#define gridDim (::dllm_emu::Emulator::get().grid_dim)

typedef unsigned int u32;

inline void block_sync() { dllm_emu::Emulator::get().block_barrier(); }

template <class T>
inline T emu_shfl_xor(T v, int m) {
  auto& e = dllm_emu::Emulator::get();
  e.deposit(v);
  e.warp_barrier();
  const T r = e.slot<T>(e.lane() ^ static_cast<unsigned>(m));
  e.warp_barrier();
  return r;
}
inline float shfl_xor_f(float v, int m) { return emu_shfl_xor(v, m); }
inline int shfl_xor_i(int v, int m) { return emu_shfl_xor(v, m); }
inline double shfl_xor_d(double v, int m) { return emu_shfl_xor(v, m); }

// Warp-wide matrix products: each lane deposits its fragments; after the barrier the first lane to run
// assembles the whole A and B tiles from the documented fragment layouts, computes the warp's 16x8
// result once and leaves every lane's four outputs in the warp's result area.
//
// mma.m16n8k32 s8: A[row][k] lives in lane (row%8)*4 + (k%16)/4, register (row>=8) + 2*(k>=16), byte k%4;
// B[k][col] in lane col*4 + (k%16)/4, register (k>=16), byte k%4; D[row][col] in lane (row%8)*4 + col/2,
// element (row>=8)*2 + col%2. The m16n8k16 s8 shape is its first half (registers a0, a1, b0).
// mma.m16n8k16 f16: A[row][k] in lane (row%8)*4 + (k%8)/2, register (row>=8) + 2*(k>=8), half k%2;
// B[k][col] in lane col*4 + (k%8)/2, register (k>=8), half k%2.
namespace dllm_emu {

struct MmaIn {
  u32 a[4], b[2];
};

// Element (row, col) of D goes to lane (row%8)*4 + col/2, slot (row>=8)*2 + col%2.
inline int d_lane(int row, int col) { return (row % 8) * 4 + col / 2; }
inline int d_elem(int row, int col) { return (row >= 8) * 2 + col % 2; }

template <class T, class Compute>
void warp_mma(const MmaIn& in, T (&d)[4], Compute compute) {
  static_assert(sizeof(T) == 4, "4-byte accumulators");
  Emulator& e = Emulator::get();
  e.deposit(in);
  e.warp_barrier();
  unsigned char* result = e.warp_result();  // [32 lanes][4 values], valid for the current collective
  if (e.claim_warp_result()) {
    MmaIn all[32];
    for (unsigned l = 0; l < 32; ++l) all[l] = e.slot<MmaIn>(l);
    T out[16][8];
    compute(all, out);
    for (int r = 0; r < 16; ++r) {
      for (int c = 0; c < 8; ++c) std::memcpy(result + (d_lane(r, c) * 4 + d_elem(r, c)) * 4, &out[r][c], 4);
    }
  }
  T mine[4];
  std::memcpy(mine, result + e.lane() * 16, sizeof mine);
  e.warp_barrier();
  for (int i = 0; i < 4; ++i) d[i] += mine[i];
}

}  // namespace dllm_emu

// mma.m16n8k32 with s8 A and s8 (B_U8 false) or u8 B.
template <bool B_U8>
inline void mma_k32(int (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
  dllm_emu::warp_mma(dllm_emu::MmaIn{{a0, a1, a2, a3}, {b0, b1}}, d, [](const dllm_emu::MmaIn* all, int (&out)[16][8]) {
    int A[16][32], B[32][8];
    for (int row = 0; row < 16; ++row)
      for (int k = 0; k < 32; ++k)
        A[row][k] = dllm_emu::byte_of(all[(row % 8) * 4 + (k % 16) / 4].a[(row >= 8) + 2 * (k >= 16)], k % 4);
    for (int k = 0; k < 32; ++k)
      for (int col = 0; col < 8; ++col) {
        const int8_t b = dllm_emu::byte_of(all[col * 4 + (k % 16) / 4].b[k >= 16], k % 4);
        B[k][col] = B_U8 ? static_cast<int>(static_cast<uint8_t>(b)) : b;
      }
    for (int row = 0; row < 16; ++row)
      for (int col = 0; col < 8; ++col) {
        int sum = 0;
        for (int k = 0; k < 32; ++k) sum += A[row][k] * B[k][col];
        out[row][col] = sum;
      }
  });
}
inline void mma_s8_16832(int (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
  mma_k32<false>(d, a0, a1, a2, a3, b0, b1);
}
inline void mma_s8u8_16832(int (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
  mma_k32<true>(d, a0, a1, a2, a3, b0, b1);
}

// mma.m16n8k16 with s8 (A_U8 false) or u8 A and s8 B.
template <bool A_U8>
inline void mma_k16(int (&d)[4], u32 a0, u32 a1, u32 b0) {
  dllm_emu::warp_mma(dllm_emu::MmaIn{{a0, a1, 0, 0}, {b0, 0}}, d, [](const dllm_emu::MmaIn* all, int (&out)[16][8]) {
    for (int row = 0; row < 16; ++row)
      for (int col = 0; col < 8; ++col) {
        int sum = 0;
        for (int k = 0; k < 16; ++k) {
          const int8_t a = dllm_emu::byte_of(all[(row % 8) * 4 + k / 4].a[row >= 8], k % 4);
          sum += (A_U8 ? static_cast<int>(static_cast<uint8_t>(a)) : a) * dllm_emu::byte_of(all[col * 4 + k / 4].b[0], k % 4);
        }
        out[row][col] = sum;
      }
  });
}
inline void mma_s8_16816(int (&d)[4], u32 a0, u32 a1, u32 b0) { mma_k16<false>(d, a0, a1, b0); }
inline void mma_u8s8_16816(int (&d)[4], u32 a0, u32 a1, u32 b0) { mma_k16<true>(d, a0, a1, b0); }

// ldmatrix .x4 .b16: lane 8i + r names row r of matrix i; lane 4g + t receives bytes 4t..4t+3 of row g of each.
inline void ldmatrix_x4(u32 (&x)[4], const void* smem_row) {
  auto& e = dllm_emu::Emulator::get();
  e.deposit(smem_row);
  e.warp_barrier();
  const unsigned l = e.lane();
  u32 v[4];
  for (unsigned i = 0; i < 4; ++i) {
    const unsigned char* row = e.slot<const unsigned char*>(8 * i + l / 4);
    if (reinterpret_cast<uintptr_t>(row) % 16 != 0) throw std::runtime_error("ldmatrix: row address not 16-byte aligned");
    std::memcpy(&v[i], row + 4 * (l % 4), 4);
  }
  e.warp_barrier();
  for (int i = 0; i < 4; ++i) x[i] = v[i];
}

inline void cp_async16(void* smem, const void* gmem) {
  if (reinterpret_cast<uintptr_t>(smem) % 16 != 0 || reinterpret_cast<uintptr_t>(gmem) % 16 != 0)
    throw std::runtime_error("cp.async: address not 16-byte aligned");
  dllm_emu::Emulator::get().async_copy16(smem, gmem);
}
inline unsigned long long evict_first_policy() { return 0; }
inline void cp_async16_ef(void* smem, const void* gmem, unsigned long long) { cp_async16(smem, gmem); }
inline void cp_async_commit() { dllm_emu::Emulator::get().async_commit(); }
template <int N>
inline void cp_async_wait() {
  dllm_emu::Emulator::get().async_wait(N);
}
inline unsigned char* dyn_smem() { return dllm_emu::Emulator::get().dyn_smem(); }
inline u32 byte_perm(u32 lo, u32 hi, u32 sel) {  // __byte_perm: selector nibbles pick bytes of {hi:lo}
  const uint64_t v = (static_cast<uint64_t>(hi) << 32) | lo;
  u32 r = 0;
  for (int i = 0; i < 4; ++i) r |= static_cast<u32>((v >> (8 * ((sel >> (4 * i)) & 7))) & 0xff) << (8 * i);
  return r;
}

inline void mma_f16_16816(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
  dllm_emu::warp_mma(dllm_emu::MmaIn{{a[0], a[1], a[2], a[3]}, {b0, b1}}, d,
                     [](const dllm_emu::MmaIn* all, float (&out)[16][8]) {
                       float A[16][16], B[16][8];
                       for (int row = 0; row < 16; ++row)
                         for (int k = 0; k < 16; ++k)
                           A[row][k] = dllm_emu::half_of(all[(row % 8) * 4 + (k % 8) / 2].a[(row >= 8) + 2 * (k >= 8)], k % 2);
                       for (int k = 0; k < 16; ++k)
                         for (int col = 0; col < 8; ++col)
                           B[k][col] = dllm_emu::half_of(all[col * 4 + (k % 8) / 2].b[k >= 8], k % 2);
                       for (int row = 0; row < 16; ++row)
                         for (int col = 0; col < 8; ++col) {
                           float sum = 0.f;
                           for (int k = 0; k < 16; ++k) sum += A[row][k] * B[k][col];
                           out[row][col] = sum;
                         }
                     });
}

inline unsigned short f32_to_f16(float f) { return dllm::quant::f32_to_fp16(f); }
inline float f16_to_f32(unsigned short h) { return dllm::quant::fp16_to_f32(h); }
inline u32 pack_half2(float lo, float hi) {
  return static_cast<u32>(f32_to_f16(lo)) | (static_cast<u32>(f32_to_f16(hi)) << 16);
}
inline int round_to_int(float x) { return static_cast<int>(std::nearbyint(x)); }
// The host build has -ffp-contract=off: a * b and a + b round on their own; fma rounds once.
inline float fma_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float fmul_rn(float a, float b) { return a * b; }
inline float fadd_rn(float a, float b) { return a + b; }
// Blocks run one after another: the fence has nothing to order, the counter nothing to race with.
inline void thread_fence() {}
inline unsigned atomic_add_u32(unsigned* p, unsigned v) {
  const unsigned old = *p;
  *p = old + v;
  return old;
}
inline float ld_cg_f(const float* p) { return *p; }
inline float fast_exp2(float x) { return std::exp2(x); }
inline int max(int a, int b) { return a > b ? a : b; }
inline int min(int a, int b) { return a < b ? a : b; }

// Loads of any width: memcpy, so no alignment or aliasing assumptions (the device checks alignment itself).
template <class T>
inline T load_as(const void* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline uint4 ld_u4(const void* p) { return load_as<uint4>(p); }
inline uint4 lds_u4(const void* p) { return load_as<uint4>(p); }
inline void st_u4(void* p, uint4 v) { std::memcpy(p, &v, sizeof v); }
inline u32 ld_u32(const void* p) { return load_as<u32>(p); }
inline u32 lds_u32(const void* p) { return load_as<u32>(p); }
inline u32 ld_u16(const void* p) { return load_as<unsigned short>(p); }
inline uint2 ld_u2(const void* p) { return load_as<uint2>(p); }
inline uint2 lds_u2(const void* p) { return load_as<uint2>(p); }
inline float lds_f(const void* p) { return load_as<float>(p); }
inline float2 lds_f2(const void* p) { return load_as<float2>(p); }
inline float ld_f(const float* p) { return *p; }

// The kernels themselves, compiled for the host.
#include "jit/cuda/kernels/params.cuh"
#include "jit/cuda/kernels/common.cuh"
#include "jit/cuda/kernels/quant.cuh"
#include "jit/cuda/kernels/gemm.cuh"
#include "jit/cuda/kernels/gemm_tc.cuh"
#include "jit/cuda/kernels/attention.cuh"
