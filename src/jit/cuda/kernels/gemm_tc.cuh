// The tiled, pipelined int8 tensor-core GEMM for Q4_K weights: y[r][j] (+)= sum_k act[r][k] * W[j][k].
//
// Weights stay exactly as the GGUF stores them (144-byte blocks per 256 values: f16 d and dmin, twelve bytes of
// 6-bit scales and mins, 128 bytes of nibbles), so the device holds the file's bytes and nothing else; only the
// column count is padded to a whole block of columns (zeros). Activations are ggml's Q8_K quants, arranged as
// mma A fragments by quant.cuh, with their integer sums per 32 values (bs).
//
// Arithmetic, per super-block of 256 values, output row r and column j (all integer parts exact):
//   isum = sum_j sc_j * dot_j         dot_j = the int32 product of sub-block j (one mma.m16n8k32 each). The
//                                     high nibbles (odd j) multiply in place, as u8 16 q, so the kernel sums
//                                     16 isum (16 sc_j for even j) and scales it by d / 16: exactly d * isum
//   msum = sum_j m_j * bsum_j         bsum_j = the activation quants' sum over sub-block j (two mma.m16n8k16:
//                                     the sums' low bytes as u8 and high bytes as s8, msum = lo + 256 * hi)
//   acc += da * (d * float(isum) - dmin * float(msum))       one float conversion per super-block
//
// Tiling: a block of 8 warps computes 64 rows x 128 columns (a warp 32 x 32: 2 x 4 mma tiles). Each pipeline
// stage holds one super-block: the activation fragments (16 KiB), the 128 columns' GGUF blocks (18 KiB) and
// the activation sums (1 KiB), filled with cp.async (the weights with an evict-first L2 policy) kStages - 1
// super-blocks ahead. The column blocks sit 144 bytes apart in shared memory, 36 words: the eight rows an
// ldmatrix phase reads fall on disjoint banks, so the padded layout needs no further swizzle. After a stage
// lands, one thread per column decodes its scales and mins (ints) and d / dmin (floats) into a small table,
// then the warps read the nibbles with ldmatrix (one x4 = two sub-blocks of two column tiles) and the
// activation fragments with 16-byte shared loads.
#ifndef DLLM_CUDA_GEMM_TC_CUH
#define DLLM_CUDA_GEMM_TC_CUH

#if defined(__CUDA_ARCH__)
constexpr int kTcStages = gemm_tc_stages(__CUDA_ARCH__ / 10);
#else
constexpr int kTcStages = gemm_tc_stages(0);
#endif
constexpr int kTcWarpsN = 4;  // warps side by side along N; two along M

// Issues the copies of super-block sb into stage buffer st (every thread, then one commit by the caller).
template <int K>
DEV void tc_load_stage(const GemmParams& p, unsigned char* st, int sb, int row0, int col0) {
  constexpr int KBP = K / 32, RB = K / 256 * kTcQ4KBlock;
  const int tid = threadIdx.x;
  const unsigned long long ef = evict_first_policy();  // made here: one instruction, no register held across the loop
  // Activations: 4 row tiles x 8 k-blocks x 512 bytes, each row tile's 4 KiB contiguous in global memory.
  UNROLL
  for (int u = 0; u < kTcStageA / 16 / kTcThreads; ++u) {
    const int q = tid + u * kTcThreads, i = q >> 8, off = (q & 255) * 16;
    cp_async16(st + i * 4096 + off, p.a + ((static_cast<long long>(row0 / 16 + i) * KBP + sb * 8) * 32) * 16 + off);
  }
  // Weights: per column a 16-byte head (d, dmin, scales) and eight 16-byte chunks of nibbles.
  unsigned char* sw = st + kTcStageA;
  UNROLL_1
  for (int q = tid; q < kTcCols * 9; q += kTcThreads) {
    const int col = q / 9, part = q - col * 9;
    cp_async16_ef(sw + col * kTcQ4KBlock + part * 16,
                  p.w + static_cast<long long>(col0 + col) * RB + sb * kTcQ4KBlock + part * 16, ef);
  }
  // Activation sums: 8 int16 per row.
  if (tid < kTcRows) {
    cp_async16(st + kTcStageA + kTcStageB + tid * 16,
               p.bs + static_cast<long long>(row0 + tid) * KBP + sb * 8);
  }
}

template <int N, int K>
DEV void gemm_tc_q4_k_body(const GemmParams& p) {
  static_assert(N % 8 == 0 && K % 256 == 0, "bad Q4_K GEMM shape");
  constexpr int SB = K / 256, KBP = K / 32, S = kTcStages;
  unsigned char* smem = dyn_smem();
  int* dsc = reinterpret_cast<int*>(smem + S * kTcStageBytes);  // [8][kTcCols] scales
  u32* dmn = reinterpret_cast<u32*>(dsc + 8 * kTcCols);           // [kTcCols][2] mins, four bytes per word
  float* ddm = reinterpret_cast<float*>(dmn + 2 * kTcCols);       // [kTcCols][2] d, dmin
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int wm = warp / kTcWarpsN, wn = warp % kTcWarpsN;
  const int row0 = blockIdx.y * kTcRows, col0 = blockIdx.x * kTcCols;

  float acc[2][4][4];
  zero_tiles(acc);

  UNROLL
  for (int s = 0; s < S - 1; ++s) {
    if (s < SB) tc_load_stage<K>(p, smem + s * kTcStageBytes, s, row0, col0);
    cp_async_commit();
  }

  UNROLL_1
  for (int sb = 0; sb < SB; ++sb) {
    const unsigned char* st = smem + (sb % S) * kTcStageBytes;
    cp_async_wait<S - 2>();
    block_sync();  // stage sb has landed; every warp is done with stage sb - 1 and the decoded table
    if (tid < kTcCols) {  // one column's head: d, dmin, then the 6-bit scales and mins of ggml's Q4_K
      const unsigned char* h = st + kTcStageA + tid * kTcQ4KBlock;
      ddm[2 * tid] = f16_to_f32(static_cast<unsigned short>(h[0] | (h[1] << 8))) * 0.0625f;  // d / 16
      ddm[2 * tid + 1] = f16_to_f32(static_cast<unsigned short>(h[2] | (h[3] << 8)));
      const unsigned char* q = h + 4;
      u32 mins[2] = {0u, 0u};
      UNROLL
      for (int j = 0; j < 8; ++j) {
        const int sc = j < 4 ? q[j] & 63 : (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        const int m = j < 4 ? q[j + 4] & 63 : (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
        dsc[j * kTcCols + tid] = j & 1 ? sc : 16 * sc;
        mins[j >> 2] |= static_cast<u32>(m) << (8 * (j & 3));
      }
      dmn[2 * tid] = mins[0];
      dmn[2 * tid + 1] = mins[1];
    }
    if (sb + S - 1 < SB) tc_load_stage<K>(p, smem + ((sb + S - 1) % S) * kTcStageBytes, sb + S - 1, row0, col0);
    cp_async_commit();
    block_sync();  // the decoded table is complete

    int isum[2][4][4];
    zero_tiles(isum);

    const unsigned char* sa = st + (wm * 2) * 4096;  // this warp's two row tiles
    const unsigned char* sw = st + kTcStageA;
    UNROLL_1
    for (int c = 0; c < 4; ++c) {  // nibble chunk c: sub-blocks 2c (low nibbles) and 2c + 1 (high)
      // Nibbles of the warp's four column tiles: matrices (tile 2 pair, bytes 0-15), (tile 2 pair, bytes 16-31),
      // (tile 2 pair + 1, bytes 0-15), (tile 2 pair + 1, bytes 16-31).
      u32 w[2][4];
      UNROLL
      for (int pair = 0; pair < 2; ++pair) {
        const int mrow = wn * 32 + (2 * pair + (lane >> 4)) * 8 + (lane & 7);
        ldmatrix_x4(w[pair], sw + mrow * kTcQ4KBlock + 16 + 32 * c + 16 * ((lane >> 3) & 1));
      }
      UNROLL
      for (int h = 0; h < 2; ++h) {
        uint4 a[2];
        UNROLL
        for (int mt = 0; mt < 2; ++mt) a[mt] = lds_u4(sa + mt * 4096 + ((2 * c + h) * 32 + lane) * 16);
        UNROLL
        for (int nt = 0; nt < 4; ++nt) {
          const u32* wt = w[nt >> 1] + 2 * (nt & 1);
          const u32 mask = h ? 0xF0F0F0F0u : 0x0F0F0F0Fu;  // odd sub-block: 16 q in place
          const u32 b0 = wt[0] & mask, b1 = wt[1] & mask;
          const uint2 sc = lds_u2(dsc + (2 * c + h) * kTcCols + wn * 32 + nt * 8 + 2 * t);
          UNROLL
          for (int mt = 0; mt < 2; ++mt) {
            int d[4] = {0, 0, 0, 0};
            mma_s8u8_16832(d, a[mt].x, a[mt].y, a[mt].z, a[mt].w, b0, b1);
            isum[mt][nt][0] += d[0] * static_cast<int>(sc.x);
            isum[mt][nt][1] += d[1] * static_cast<int>(sc.y);
            isum[mt][nt][2] += d[2] * static_cast<int>(sc.x);
            isum[mt][nt][3] += d[3] * static_cast<int>(sc.y);
          }
        }
      }
    }

    // The mins: A' = the activation sums of the 8 sub-blocks (k' 0..7; 8..15 zero), B' = the columns' mins.
    const unsigned char* ss = st + kTcStageA + kTcStageB;
    u32 lo[2][2], hi[2][2];
    float da[2][2];
    UNROLL
    for (int mt = 0; mt < 2; ++mt) {
      UNROLL
      for (int h = 0; h < 2; ++h) {
        const int r = wm * 32 + mt * 16 + g + 8 * h;
        lo[mt][h] = hi[mt][h] = 0u;
        if (t < 2) {
          const uint2 v = lds_u2(ss + r * 16 + 8 * t);
          lo[mt][h] = byte_perm(v.x, v.y, 0x6420);
          hi[mt][h] = byte_perm(v.x, v.y, 0x7531);
        }
        da[mt][h] = ld_f(p.da + static_cast<long long>(row0 + r) * KBP + sb * 8);
      }
    }
    UNROLL
    for (int nt = 0; nt < 4; ++nt) {
      const int cc = wn * 32 + nt * 8 + 2 * t;
      const u32 bm = t < 2 ? dmn[2 * (wn * 32 + nt * 8 + g) + t] : 0u;
      const float d0 = ddm[2 * cc], m0 = ddm[2 * cc + 1], d1 = ddm[2 * cc + 2], m1 = ddm[2 * cc + 3];
      UNROLL
      for (int mt = 0; mt < 2; ++mt) {
        int ml[4] = {0, 0, 0, 0}, mh[4] = {0, 0, 0, 0};
        mma_u8s8_16816(ml, lo[mt][0], lo[mt][1], bm);
        mma_s8_16816(mh, hi[mt][0], hi[mt][1], bm);
        const int* is = isum[mt][nt];
        acc[mt][nt][0] += da[mt][0] * (d0 * static_cast<float>(is[0]) - m0 * static_cast<float>(ml[0] + 256 * mh[0]));
        acc[mt][nt][1] += da[mt][0] * (d1 * static_cast<float>(is[1]) - m1 * static_cast<float>(ml[1] + 256 * mh[1]));
        acc[mt][nt][2] += da[mt][1] * (d0 * static_cast<float>(is[2]) - m0 * static_cast<float>(ml[2] + 256 * mh[2]));
        acc[mt][nt][3] += da[mt][1] * (d1 * static_cast<float>(is[3]) - m1 * static_cast<float>(ml[3] + 256 * mh[3]));
      }
    }
  }
  cp_async_wait<0>();

  // Epilogue: acc[mt][nt][0..1] are row g, columns 2t and 2t+1; [2..3] the same columns of row g + 8.
  UNROLL
  for (int mt = 0; mt < 2; ++mt)
    UNROLL
    for (int nt = 0; nt < 4; ++nt)
      gemm_store_tile<N>(p, row0 + wm * 32 + mt * 16 + g, col0 + wn * 32 + nt * 8 + 2 * t, acc[mt][nt]);
}

#endif
