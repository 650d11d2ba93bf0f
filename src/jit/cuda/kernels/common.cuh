// Device-side basics shared by dllm's generated CUDA kernels: integer types, the tensor-core and warp
// intrinsics (inline PTX), f16 packing and memory access helpers. Kernels use only these wrappers, never
// raw intrinsics, so that the same kernel code also compiles for the host emulator the tests run on a CPU
// (tests/gpu/emulator.h defines DLLM_CUDA_EMULATOR and supplies host versions of everything below the
// "device-only" line). No CUDA headers are included: NVRTC needs none of the toolkit's files.
#ifndef DLLM_CUDA_COMMON_CUH
#define DLLM_CUDA_COMMON_CUH

typedef unsigned int u32;

#ifndef DLLM_CUDA_EMULATOR
// ---------------------------------------------------------------- device-only
#define UNROLL _Pragma("unroll")
#define UNROLL_1 _Pragma("unroll 1")
#define DEV __device__ __forceinline__
#define SHARED_ALIGN16 __shared__ __align__(16)
#define DLLM_INF __int_as_float(0x7f800000)

DEV void block_sync() { __syncthreads(); }
DEV float shfl_xor_f(float v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }
DEV int shfl_xor_i(int v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }
DEV double shfl_xor_d(double v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }

// D(16x8, s32) += A(16x32, s8, row) * B(32x8, s8, col). Lane l = 4g + t holds
//   A: a0 = row g k 4t..4t+3, a1 = row g+8 k 4t.., a2 = row g k 16+4t.., a3 = row g+8 k 16+4t..
//   B: b0 = col g k 4t..4t+3, b1 = col g k 16+4t..
//   D: d0 = (g, 2t), d1 = (g, 2t+1), d2 = (g+8, 2t), d3 = (g+8, 2t+1)
// (bytes in little-endian order: the lowest byte is the lowest k).
DEV void mma_s8_16832(int (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// The same with unsigned B bytes (0..255).
DEV void mma_s8u8_16832(int (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.u8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// D(16x8, s32) += A(16x16, s8) * B(16x8, s8): a0 = row g k 4t.., a1 = row g+8 k 4t..; b0 = col g k 4t..
DEV void mma_s8_16816(int (&d)[4], u32 a0, u32 a1, u32 b0) {
  asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a0), "r"(a1), "r"(b0));
}

// The same with unsigned A bytes (0..255) and signed B bytes.
DEV void mma_u8s8_16816(int (&d)[4], u32 a0, u32 a1, u32 b0) {
  asm("mma.sync.aligned.m16n8k16.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a0), "r"(a1), "r"(b0));
}

// Four 8x8 matrices of 16-bit elements from shared memory: lane 8i + r gives the address of row r of matrix i
// (16 bytes); lane 4g + t receives in x[i] row g, elements 2t and 2t+1 of matrix i (bytes 4t..4t+3).
DEV void ldmatrix_x4(u32 (&x)[4], const void* smem_row) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem_row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(x[0]), "=r"(x[1]), "=r"(x[2]), "=r"(x[3])
               : "r"(s));
}

// Asynchronous 16-byte copies from global to shared memory (sm_80+), in commit groups. EF: the source is
// streamed once (the weights): L2 may evict it first.
DEV void cp_async16(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
}
DEV unsigned long long evict_first_policy() {
  unsigned long long p;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));  // volatile: made at each use, never held
  return p;
}
DEV void cp_async16_ef(void* smem, const void* gmem, unsigned long long policy) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;" ::"r"(s), "l"(gmem), "l"(policy)
               : "memory");
}
DEV void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
DEV void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// The kernel's dynamic shared memory (its size is the launch's).
DEV unsigned char* dyn_smem() {
  extern __shared__ __align__(16) unsigned char dllm_dyn_smem[];
  return dllm_dyn_smem;
}
DEV u32 byte_perm(u32 lo, u32 hi, u32 sel) { return __byte_perm(lo, hi, sel); }

// D(16x8, f32) += A(16x16, f16, row) * B(16x8, f16, col). Each u32 holds two halves, lower k first:
//   A: a0 = row g k 2t,2t+1; a1 = row g+8 k 2t..; a2 = row g k 8+2t..; a3 = row g+8 k 8+2t..
//   B: b0 = col g k 2t,2t+1; b1 = col g k 8+2t..      D: as for the s8 product.
DEV void mma_f16_16816(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats rounded to f16 (nearest even) in one u32: lo in bits 0-15, hi in bits 16-31.
DEV u32 pack_half2(float lo, float hi) {
  u32 r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
DEV unsigned short f32_to_f16(float f) {
  unsigned short h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}
DEV float f16_to_f32(unsigned short h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}

DEV int round_to_int(float x) { return __float2int_rn(x); }  // nearest, ties to even
// Float arithmetic with its rounding spelled out: never contracted or reassociated by the compiler, so two kernels that
// write the same sequence of these get the same bits (the tiled GEMMs' split-K sums).
DEV float fma_rn(float a, float b, float c) { return __fmaf_rn(a, b, c); }
DEV float fmul_rn(float a, float b) { return __fmul_rn(a, b); }
DEV float fadd_rn(float a, float b) { return __fadd_rn(a, b); }
// Device-wide ordering for a last-block reduction: fence, arrival counter, loads that bypass L1 (L2 is coherent).
DEV void thread_fence() { __threadfence(); }
DEV unsigned atomic_add_u32(unsigned* p, unsigned v) { return atomicAdd(p, v); }
DEV float ld_cg_f(const float* p) { return __ldcg(p); }
DEV float fast_exp2(float x) { return exp2f(x); }

DEV uint4 ld_u4(const void* p) { return __ldg(reinterpret_cast<const uint4*>(p)); }
DEV uint4 lds_u4(const void* p) { return *reinterpret_cast<const uint4*>(p); }
DEV void st_u4(void* p, uint4 v) { *reinterpret_cast<uint4*>(p) = v; }
DEV u32 lds_u32(const void* p) { return *reinterpret_cast<const u32*>(p); }
DEV uint2 lds_u2(const void* p) { return *reinterpret_cast<const uint2*>(p); }
DEV float lds_f(const void* p) { return *reinterpret_cast<const float*>(p); }
DEV float2 lds_f2(const void* p) { return *reinterpret_cast<const float2*>(p); }
DEV u32 ld_u32(const void* p) { return __ldg(reinterpret_cast<const u32*>(p)); }
DEV uint2 ld_u2(const void* p) { return __ldg(reinterpret_cast<const uint2*>(p)); }
DEV u32 ld_u16(const void* p) { return __ldg(reinterpret_cast<const unsigned short*>(p)); }
DEV float ld_f(const float* p) { return __ldg(p); }
// ---------------------------------------------------------------- end of device-only
#endif

// Warp reductions: xor butterflies, so every lane ends with the bit-identical result.
DEV float warp_sum(float v) {
  UNROLL
  for (int m = 16; m > 0; m >>= 1) v += shfl_xor_f(v, m);
  return v;
}
DEV float warp_max(float v) {
  UNROLL
  for (int m = 16; m > 0; m >>= 1) v = fmaxf(v, shfl_xor_f(v, m));
  return v;
}

// Sums over each half warp (lanes 0-15 and 16-31), every lane of a half ending with its half's sum.
DEV int half_warp_sum_i(int v) {
  UNROLL
  for (int m = 8; m > 0; m >>= 1) v += shfl_xor_i(v, m);
  return v;
}

// A last-block reduction's arrival: every thread of the block calls it after storing what the last block reads; it
// makes those stores visible device-wide, counts the block at *counter (one of `arrivals`), and returns true in every
// thread of the block that arrives last, which then sees every other block's stores. flag: an int in shared memory.
// The last block resets *counter to zero when done, for the next launch.
DEV bool last_arrival(unsigned* counter, unsigned arrivals, int* flag) {
  thread_fence();
  block_sync();
  if (threadIdx.x == 0) *flag = atomic_add_u32(counter, 1u) == arrivals - 1;
  block_sync();
  if (!*flag) return false;
  thread_fence();
  return true;
}

DEV u32 u4_get(const uint4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

#endif
