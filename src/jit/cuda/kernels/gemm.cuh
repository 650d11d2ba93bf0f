// The quantised matrix product on int8 tensor cores for the per-32 weight types Q8_0 and Q5_0 (the K-quants have
// their own tiled kernel, gemm_tc.cuh): y[r][j] (+)= sum_k act[r][k] * W[j][k].
// Activations arrive as int8 fragments with per-(row, 32-block) scales (quant.cuh); weights as the
// fragments weight_pack.cpp writes at load, at the GGUF's size. Each mma.m16n8k32 yields the exact int32 dot
// product of one 32-value block; the block scales are applied in f32 right after it:
//   Q8_0:  x_w = d*q                 acc += da*d * dot
//   Q5_0:  as Q8_0, q = ggml's q - 16 (in -16..15), assembled from a nibble and a fifth bit
//
// Tiling: a warp computes 32 rows x 32 columns (2 x 4 mma tiles), a block of 4 warps 32 rows x 128
// columns; grid = (n_tiles_pad / 16, rows_pad / 32). Operands stream from global memory (L2/L1) straight
// into registers as loads whose layout is already the fragment layout, so no shared memory and
// no block synchronisation are needed.
//
// Weight layout, per 8-column tile (KBW = the k-blocks rounded up to an even count; lane 4g+t covers column g):
//   Q8_0: [KBW/2][32 lanes] 16-byte records, words {b0, b1} of the even k-block, then the odd one; then the
//         f16 d of each (k-block, column), [KBW][8]: 34 bytes per 32 values, as the GGUF.
//   Q5_0: [KBW/2][32 lanes] 8-byte records of nibbles (word = k-block; byte i = q(4t+i) | q(16+4t+i) << 4), then
//         [KBW/2][32 lanes] 2-byte records of fifth bits (byte = k-block; bits 0-3 = k 4t.., 4-7 = k 16+4t..),
//         then the f16 d [KBW][8]: 22 bytes per 32 values, as the GGUF.
#ifndef DLLM_CUDA_GEMM_CUH
#define DLLM_CUDA_GEMM_CUH

// ggml's type ids (the host's WeightFormat is the GgmlType of the weight table).
enum { WT_Q5_0 = 6, WT_Q8_0 = 8, WT_Q4_K = 12, WT_Q5_K = 13, WT_Q6_K = 14 };
constexpr int kGemmWarps = 4;    // warps per block, side by side along N
constexpr int kGemmMTiles = 2;   // 16-row tiles per warp
constexpr int kGemmNTiles = 4;   // 8-column tiles per warp
// Threads per block: 32 * kGemmWarps = 128; a block covers 16 * kGemmMTiles = 32 rows and
// kGemmWarps * kGemmNTiles = 16 column tiles (128 columns). kernel_set.cpp launches accordingly.

// Stores one thread's part of an mma output tile: v[0], v[1] at (row, col), (row, col + 1), v[2], v[3] eight rows
// below; rows at or past p.rows and columns at or past N are skipped. Adds onto y when p.accumulate.
template <int N>
DEV void gemm_store_tile(const GemmParams& p, int row, int col, const float (&v)[4]) {
  if (col >= N) return;
  UNROLL
  for (int h = 0; h < 2; ++h) {
    if (row + 8 * h >= p.rows) continue;
    float* y = p.y + static_cast<long long>(row + 8 * h) * p.ldy + col;
    y[0] = p.accumulate ? y[0] + v[2 * h] : v[2 * h];
    y[1] = p.accumulate ? y[1] + v[2 * h + 1] : v[2 * h + 1];
  }
}

template <class T, int A, int B>
DEV void zero_tiles(T (&x)[A][B][4]) {
  UNROLL
  for (int a = 0; a < A; ++a)
    UNROLL
    for (int b = 0; b < B; ++b)
      UNROLL
      for (int i = 0; i < 4; ++i) x[a][b][i] = T(0);
}

template <int WT, int N, int K>
DEV void gemm_body(const GemmParams& p) {
  static_assert(N % 8 == 0 && K % 32 == 0, "bad GEMM shape");
  static_assert(WT == WT_Q8_0 || WT == WT_Q5_0, "the K-quants run gemm_tc_body");
  constexpr bool Q5 = WT == WT_Q5_0;
  constexpr int KBP = (K / 32 + 3) / 4 * 4;  // the activations' k-blocks
  constexpr int KBW = (K / 32 + 1) / 2 * 2;  // the weights' k-blocks
  constexpr int KG = 2;                      // k-blocks per weight record
  constexpr int NKG = KBW / KG;
  constexpr int QPT = Q5 ? KBW * 176 : KBW * 272, DOFF = Q5 ? KBW * 160 : KBW * 256;  // tile bytes, its d
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int nt0 = (blockIdx.x * kGemmWarps + warp) * kGemmNTiles;
  const int mt0 = blockIdx.y * kGemmMTiles;

  float acc[kGemmMTiles][kGemmNTiles][4];
  zero_tiles(acc);

  UNROLL_1
  for (int kg = 0; kg < NKG; ++kg) {
    uint4 bq[kGemmNTiles];  // Q8_0: the record; Q5_0: x, y = the nibble words, z = the fifth bits
    UNROLL
    for (int nt = 0; nt < kGemmNTiles; ++nt) {
      const unsigned char* tile = p.w + static_cast<long long>(nt0 + nt) * QPT;
      if (Q5) {
        const uint2 nib = ld_u2(tile + (kg * 32 + lane) * 8);
        bq[nt].x = nib.x;
        bq[nt].y = nib.y;
        bq[nt].z = ld_u16(tile + KBW * 128 + (kg * 32 + lane) * 2);
        bq[nt].w = 0u;
      } else {
        bq[nt] = ld_u4(tile + (kg * 32 + lane) * 16);
      }
    }
    // Not unrolled: unrolling lets the compiler hoist every k-block's loads and run out of registers.
    UNROLL_1
    for (int j = 0; j < KG; ++j) {
      const int kb = kg * KG + j;
      uint4 a[kGemmMTiles];
      float da0[kGemmMTiles], da1[kGemmMTiles];
      UNROLL
      for (int mt = 0; mt < kGemmMTiles; ++mt) {
        a[mt] = ld_u4(p.a + ((static_cast<long long>(mt0 + mt) * KBP + kb) * 32 + lane) * 16);
        const long long r0 = static_cast<long long>(mt0 + mt) * 16 + g;
        da0[mt] = ld_f(p.da + r0 * KBP + kb);
        da1[mt] = ld_f(p.da + (r0 + 8) * KBP + kb);
      }
      UNROLL
      for (int nt = 0; nt < kGemmNTiles; ++nt) {
        u32 b0, b1;
        if (Q5) {  // q - 16 = nibble, or nibble | 0xF0 where the fifth bit is clear
          const u32 w = u4_get(bq[nt], j), fb = (bq[nt].z >> (8 * j)) & 0xFFu;
          const u32 f0 = ((fb & 0xFu) * 0x02040810u) & 0x10101010u, f1 = ((fb >> 4) * 0x02040810u) & 0x10101010u;
          b0 = (w & 0x0F0F0F0Fu) | ((f0 ^ 0x10101010u) * 15u);
          b1 = ((w >> 4) & 0x0F0F0F0Fu) | ((f1 ^ 0x10101010u) * 15u);
        } else {
          b0 = u4_get(bq[nt], 2 * j);
          b1 = u4_get(bq[nt], 2 * j + 1);
        }
        const u32 dw = ld_u32(p.w + static_cast<long long>(nt0 + nt) * QPT + DOFF + (kb * 8 + 2 * t) * 2);
        float2 s;
        s.x = f16_to_f32(static_cast<unsigned short>(dw & 0xFFFFu));
        s.y = f16_to_f32(static_cast<unsigned short>(dw >> 16));
        UNROLL
        for (int mt = 0; mt < kGemmMTiles; ++mt) {
          int c[4] = {0, 0, 0, 0};
          mma_s8_16832(c, a[mt].x, a[mt].y, a[mt].z, a[mt].w, b0, b1);
          acc[mt][nt][0] += static_cast<float>(c[0]) * (da0[mt] * s.x);
          acc[mt][nt][1] += static_cast<float>(c[1]) * (da0[mt] * s.y);
          acc[mt][nt][2] += static_cast<float>(c[2]) * (da1[mt] * s.x);
          acc[mt][nt][3] += static_cast<float>(c[3]) * (da1[mt] * s.y);
        }
      }
    }
  }

  // Epilogue: d0/d1 are row g, columns 2t and 2t+1; d2/d3 the same columns of row g+8.
  UNROLL
  for (int mt = 0; mt < kGemmMTiles; ++mt)
    UNROLL
    for (int nt = 0; nt < kGemmNTiles; ++nt) gemm_store_tile<N>(p, (mt0 + mt) * 16 + g, (nt0 + nt) * 8 + 2 * t, acc[mt][nt]);
}

#endif
