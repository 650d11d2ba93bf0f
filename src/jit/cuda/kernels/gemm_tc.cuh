// The tiled, pipelined int8 tensor-core GEMMs of every GPU weight type (Q4_K, Q5_K, Q6_K, Q8_0, Q5_0):
// y[r][j] (+)= sum_k act[r][k] * W[j][k].
//
// Weights stay at the GGUF's size. Q4_K and Q5_K keep the file's own 144- and 176-byte blocks (f16 d and dmin,
// twelve bytes of 6-bit scales and mins, Q5_K's 32 bytes of fifth bits, 128 bytes of nibbles); only the column count
// is padded to a whole block of columns (zeros).
// Q6_K keeps each block's 16 int8 scales, 128 bytes of low nibbles and 64 bytes of high bit pairs as one 208-byte
// record (16-byte aligned, unlike the file's 210-byte blocks) and its d as an f32 in a plane of its own (weight_pack).
// Q8_0 and Q5_0 hold eight of the file's blocks per record (params.cuh tc_block_bytes), the same bytes rearranged.
// Activations are ggml's Q8_K quants (the K-quants) or Q8_0 quants (Q8_0, Q5_0), arranged as mma A fragments by
// quant.cuh, with their integer sums per 16 values (bs) and a scale per 32 values (da).
//
// Arithmetic per step of 256 values, output row r and column j (all integer parts exact):
//   Q4_K  isum = sum_j sc_j dot_j over the 8 sub-blocks of 32 (one mma.m16n8k32 each; the high nibbles multiply
//         in place as u8 16 q, so the kernel sums 16 isum, with 16 sc_j for the low ones, and scales by d / 16)
//         msum = sum_j m_j bsum_j
//         acc += da * (d * float(isum) - dmin * float(msum))      (one float conversion per super-block)
//   Q5_K  as Q4_K with q = nibble | fifth bit << 4 in 0..31 (no in-place trick: the kernel sums isum itself)
//   Q6_K  q = low nibble | high bits << 4 in 0..63 (x = d sc_h (q - 32)), one mma.m16n8k16 per 16 values
//         isum = sum_h sc_h dot_h,  msum = sum_h sc_h bsum_h
//         acc += da * d * float(isum - 32 msum)
//   Q8_0  every block of 32 its own scales: x_c = float(dot_2c) (da_2c d_2c) [+ float(dot_2c+1) (da_2c+1 d_2c+1)]
//         for the four pairs c of blocks, acc += ((x_0 + x_1) + x_2) + x_3 (tc_per32_quarters)
//   Q5_0  as Q8_0 with q - 16 in -16..15 (nibble and fifth bit assembled into an int8)
// msum is itself a product on the tensor cores: A' = the 16 activation sums (low bytes as u8, high bytes as s8:
// msum = lo + 256 hi), B' = the mins (each twice: they cover 32 values) or the scales.
//
// Tiling (params.cuh): in the wide tiling a block of 8 warps computes 64 rows x 128 columns (a warp 32 x 32: 2 x 4
// mma tiles); in the split tiling 32 x 64, four warps per 32 x 32 tile each taking a quarter of every super-block
// (Q4_K/Q5_K: one nibble chunk; Q6_K: one half and ql chunk), their int32 sums added through shared memory before
// the first warp's epilogue (the per-32 types: their float sums, in quarter order). Each pipeline stage holds one step:
// the activation fragments (256 bytes a row), the columns' weight records, the activation sums or scales (32 bytes a
// row) and, for Q6_K, the columns' d; cp.async fills it stages - 1 steps ahead (the weights with an evict-first L2
// policy). Weight records sit 144, 176, 208 or 272 bytes apart in shared memory (36, 44, 52 or 68 words): the eight
// rows an ldmatrix phase reads fall on disjoint banks, so the padded layout needs no further swizzle. After a stage
// lands, one thread per column decodes its scales (and Q4_K's / Q5_K's mins, d and dmin; the per-32 types' eight d)
// into a small table, then the warps read the quants with ldmatrix (one x4 =
// two 16-byte halves of two column tiles) and the activation fragments with 16-byte shared loads.
#ifndef DLLM_CUDA_GEMM_TC_CUH
#define DLLM_CUDA_GEMM_TC_CUH

#if defined(__CUDA_ARCH__)
constexpr int kTcArch = __CUDA_ARCH__ / 10;
#else
constexpr int kTcArch = 0;  // the CPU emulator
#endif

// Issues the copies of super-block sb into stage buffer st (every thread, then one commit by the caller). MT: the
// 16-row tiles each warp multiplies (2; 1 for the small-row kernel at 16 rows or fewer): the split tiling's second
// row tile is then neither loaded nor multiplied.
template <int WT, int K, bool SPLIT, int MT = 2>
DEV void tc_load_stage(const GemmParams& p, unsigned char* st, int sb, int row0, int col0) {
  constexpr int KBP = act_kblocks(K), BB = tc_block_bytes(WT), RB = tc_column_bytes(WT, K);
  constexpr int ROWS = tc_rows(SPLIT), COLS = tc_cols(SPLIT), SA = ROWS * 256, SS = ROWS * 32;
  constexpr int LAST = tc_last_blocks(K);
  static_assert(MT == 2 || SPLIT, "one row tile per warp: the split tiling only");
  constexpr int LOADED = MT == 2 ? ROWS : 16;  // rows whose activations this stage holds
  const int tid = threadIdx.x;
  const bool short_step = tc_short_step(K, sb);  // the per-32 types' last step of fewer than 8 blocks
  const unsigned long long ef = evict_first_policy();  // made here: one instruction, no register held across the loop
  // Activations: ROWS / 16 row tiles x 8 k-blocks x 512 bytes, each row tile's 4 KiB contiguous in global memory.
  if (!short_step) {
    UNROLL
    for (int u = 0; u < LOADED * 256 / 16 / kTcThreads; ++u) {
      const int q = tid + u * kTcThreads, i = q >> 8, off = (q & 255) * 16;
      cp_async16(st + i * 4096 + off, p.a + ((static_cast<long long>(row0 / 16 + i) * KBP + sb * 8) * 32) * 16 + off);
    }
  } else {
    UNROLL_1
    for (int q = tid; q < LOADED / 16 * LAST * 32; q += kTcThreads) {
      const int i = q / (LAST * 32), off = (q - i * LAST * 32) * 16;
      cp_async16(st + i * 4096 + off, p.a + ((static_cast<long long>(row0 / 16 + i) * KBP + sb * 8) * 32) * 16 + off);
    }
  }
  // Weights: C 16-byte chunks per column (the last step's record may be shorter).
  unsigned char* sw = st + SA;
  const int C = (short_step ? tc_last_bytes(WT, K) : BB) / 16;
  UNROLL_1
  for (int q = tid; q < COLS * C; q += kTcThreads) {
    const int col = q / C, part = q - col * C;
    cp_async16_ef(sw + col * BB + part * 16, p.w + static_cast<long long>(col0 + col) * RB + sb * BB + part * 16, ef);
  }
  if (tid < LOADED) {
    if (tc_per32(WT)) {  // the row's f32 scales of the step's blocks (KBP keeps a partial chunk inside the row)
      const float* src = p.da + static_cast<long long>(row0 + tid) * KBP + sb * 8;
      cp_async16(st + SA + COLS * BB + tid * 32, src);
      if (!short_step || LAST > 4) cp_async16(st + SA + COLS * BB + tid * 32 + 16, src + 4);
    } else {  // the K-quants' activation sums: 16 int16 (two chunks)
      const short* src = p.bs + (static_cast<long long>(row0 + tid) * KBP + sb * 8) * 2;
      cp_async16(st + SA + COLS * BB + tid * 32, src);
      cp_async16(st + SA + COLS * BB + tid * 32 + 16, src + 8);
    }
  }
  // Q6_K: the columns' d, 8 per column tile in the plane [tile][super-block][8].
  if (WT == WT_Q6_K && tid < COLS / 4) {
    cp_async16(st + SA + COLS * BB + SS + tid * 16,
               p.ws + (static_cast<long long>(col0 / 8 + (tid >> 1)) * tc_steps(K) + sb) * 8 + (tid & 1) * 4);
  }
}

DEV int tc_add(int a, int b) { return a + b; }
DEV float tc_add(float a, float b) { return fadd_rn(a, b); }

// isum += d * the integer scales of the thread's two columns (d[0], d[2]: column 2t; d[1], d[3]: column 2t + 1).
DEV void add_scaled(int (&isum)[4], const int (&d)[4], uint2 sc) {
  isum[0] += d[0] * static_cast<int>(sc.x);
  isum[1] += d[1] * static_cast<int>(sc.y);
  isum[2] += d[2] * static_cast<int>(sc.x);
  isum[3] += d[3] * static_cast<int>(sc.y);
}

// Q6_K: the products of 128-value half n, ql chunks [g0, g0 + GQN) (two sub-blocks each), into isum. The quants of a
// column-tile pair are loaded per sub-block (two ldmatrix), so only 16 registers of operands are live at a time.
template <int GQN, int MT>
DEV void tc_q6_half(int (&isum)[2][4][4], const unsigned char* sa, const unsigned char* sw, const int* dsc, int cols,
                    int n, int g0, int mrow, int mhalf, int lane, int wn, int t) {
  constexpr int BB = 208;
  UNROLL
  for (int gq = g0; gq < g0 + GQN; ++gq) {
    UNROLL
    for (int pair = 0; pair < 2; ++pair) {
      u32 wl[4], wh[4];
      ldmatrix_x4(wl, sw + (mrow + 16 * pair) * BB + 16 + 64 * n + 32 * gq + mhalf);
      ldmatrix_x4(wh, sw + (mrow + 16 * pair) * BB + 144 + 32 * n + mhalf);
      UNROLL
      for (int nib = 0; nib < 2; ++nib) {
        const int grp = gq + 2 * nib, j = 4 * n + grp;  // sub-block j: ql chunk gq, nibble nib, qh bits 2 grp
        uint4 a[2];
        UNROLL
        for (int mt = 0; mt < MT; ++mt) a[mt] = lds_u4(sa + mt * 4096 + (j * 32 + lane) * 16);
        UNROLL
        for (int q = 0; q < 2; ++q) {
          const int nt = 2 * pair + q;
          UNROLL
          for (int hf = 0; hf < 2; ++hf) {  // 16-value half of the sub-block: its own scale
            const u32 l = wl[2 * q + hf], hb = wh[2 * q + hf];
            const u32 hs = grp < 2 ? hb << (4 - 2 * grp) : hb >> (2 * grp - 4);
            const u32 b = ((l >> (4 * nib)) & 0x0F0F0F0Fu) | (hs & 0x30303030u);
            const uint2 sc = lds_u2(dsc + (2 * j + hf) * cols + wn * 32 + nt * 8 + 2 * t);
            UNROLL
            for (int mt = 0; mt < MT; ++mt) {
              int d[4] = {0, 0, 0, 0};
              mma_s8_16816(d, hf ? a[mt].z : a[mt].x, hf ? a[mt].w : a[mt].y, b);
              add_scaled(isum[mt][nt], d, sc);
            }
          }
        }
      }
    }
  }
}

// Q8_0 / Q5_0: a warp's quarters [wk, wk + QUARTERS) of a step of nb blocks (FULL: 8, with no branch; else fewer, a row's
// short last step), each quarter c the blocks 2c and 2c + 1, into fsum. Per output (row r, column j) and quarter, with explicit roundings:
//   x = float(dot_2c) * (da_r,2c * d_j,2c)  [+ then fma(float(dot_2c+1), da_r,2c+1 * d_j,2c+1, x)],  fsum += x
// dot is the exact int32 product of one block (mma.m16n8k32; Q5_0's q - 16 assembled as int8 from nibble and fifth bit).
// sa: the warp's row tiles; sw: the weight records; ss: the rows' f32 scales [row][8]; dtab: the columns' d [8][COLS].
template <int WT, int COLS, int QUARTERS, int MT, bool FULL>
DEV void tc_per32_quarters(float (&fsum)[2][4][4], const unsigned char* sa, const unsigned char* sw, const unsigned char* ss,
                           const float* dtab, int nb, int wk, int wm, int wn, int mrow, int mhalf, int lane, int g, int t) {
  constexpr bool Q50 = WT == WT_Q5_0;
  constexpr int BB = tc_block_bytes(WT);
  u32 wh[2][4];  // Q5_0: the fifth bits of the step's blocks (tile 2 pair + q: words 2q (blocks 0-3) and 2q + 1 (4-7))
  if (Q50) {
    UNROLL
    for (int pair = 0; pair < 2; ++pair) ldmatrix_x4(wh[pair], sw + (mrow + 16 * pair) * BB + 16 + mhalf);
  }
  UNROLL_1
  for (int c = wk; c < wk + QUARTERS; ++c) {
    if (!FULL && 2 * c >= nb) break;
    const bool two = FULL || 2 * c + 1 < nb;
    uint4 a[2][2];
    float da[2][2][2];  // [block][row tile][row g, g + 8]
    u32 w[2][2][4];     // Q8_0: [block][tile pair] (tile 2 pair + q: b0, b1 = words 2q, 2q + 1); Q5_0: [block][0] per tile
    UNROLL
    for (int h = 0; h < 2; ++h) {
      if (h == 1 && !two) break;
      const int j = 2 * c + h;
      UNROLL
      for (int mt = 0; mt < MT; ++mt) {
        a[h][mt] = lds_u4(sa + mt * 4096 + (j * 32 + lane) * 16);
        const int r = wm * 32 + mt * 16 + g;
        da[h][mt][0] = lds_f(ss + r * 32 + 4 * j);
        da[h][mt][1] = lds_f(ss + (r + 8) * 32 + 4 * j);
      }
      if (Q50) {
        ldmatrix_x4(w[h][0], sw + (wn * 32 + lane) * BB + 48 + 16 * j);  // matrix i: tile i's nibbles
      } else {
        UNROLL
        for (int pair = 0; pair < 2; ++pair) ldmatrix_x4(w[h][pair], sw + (mrow + 16 * pair) * BB + 16 + 32 * j + mhalf);
      }
    }
    UNROLL
    for (int nt = 0; nt < 4; ++nt) {
      u32 b[2][2] = {{0u, 0u}, {0u, 0u}};
      float2 dc[2];
      UNROLL
      for (int h = 0; h < 2; ++h) {
        if (h == 1 && !two) break;
        const int j = 2 * c + h;
        if (Q50) {  // q - 16: the nibble, or nibble | 0xF0 where the fifth bit is clear
          // The word of blocks 0-3 or 4-7 by a select: a run-time index into wh would put it in local memory.
          const u32* ws = wh[nt >> 1] + 2 * (nt & 1);
          const u32 fb = ((j >> 2 ? ws[1] : ws[0]) >> (8 * (j & 3))) & 0xFFu, nib = w[h][0][nt];
          const u32 f0 = ((fb & 0xFu) * 0x02040810u) & 0x10101010u, f1 = ((fb >> 4) * 0x02040810u) & 0x10101010u;
          b[h][0] = (nib & 0x0F0F0F0Fu) | ((f0 ^ 0x10101010u) * 15u);
          b[h][1] = ((nib >> 4) & 0x0F0F0F0Fu) | ((f1 ^ 0x10101010u) * 15u);
        } else {
          b[h][0] = w[h][nt >> 1][2 * (nt & 1)];
          b[h][1] = w[h][nt >> 1][2 * (nt & 1) + 1];
        }
        dc[h] = lds_f2(dtab + j * COLS + wn * 32 + nt * 8 + 2 * t);
      }
      UNROLL
      for (int mt = 0; mt < MT; ++mt) {
        int d0[4] = {0, 0, 0, 0}, d1[4] = {0, 0, 0, 0};
        mma_s8_16832(d0, a[0][mt].x, a[0][mt].y, a[0][mt].z, a[0][mt].w, b[0][0], b[0][1]);
        if (two) mma_s8_16832(d1, a[1][mt].x, a[1][mt].y, a[1][mt].z, a[1][mt].w, b[1][0], b[1][1]);
        UNROLL
        for (int i = 0; i < 4; ++i) {
          float x = fmul_rn(static_cast<float>(d0[i]), fmul_rn(da[0][mt][i >> 1], i & 1 ? dc[0].y : dc[0].x));
          if (two) x = fma_rn(static_cast<float>(d1[i]), fmul_rn(da[1][mt][i >> 1], i & 1 ? dc[1].y : dc[1].x), x);
          fsum[mt][nt][i] = fadd_rn(fsum[mt][nt][i], x);
        }
      }
    }
  }
}

// The split tiling's exchange: warps of quarters 1-3 store their sums (int32 or f32) in shared memory at byte offset
// off, the first quarter's warps add them in quarter order (the order the wide tiling's warps add them in).
template <int MT, class T>
DEV void tc_exchange(T (&sum)[2][4][4], int wk, int wn, int lane, int off) {
  T* part = reinterpret_cast<T*>(dyn_smem() + off);  // [3][2][32][32]
  if (wk > 0) {
    T* mine = part + ((wk - 1) * 2 + wn) * 32 * 32;
    UNROLL
    for (int mt = 0; mt < MT; ++mt)
      UNROLL
      for (int nt = 0; nt < 4; ++nt)
        UNROLL
        for (int i = 0; i < 4; ++i) mine[((mt * 4 + nt) * 4 + i) * 32 + lane] = sum[mt][nt][i];
  }
  block_sync();
  if (wk == 0) {
    UNROLL
    for (int q = 0; q < 3; ++q) {
      const T* other = part + (q * 2 + wn) * 32 * 32;
      UNROLL
      for (int mt = 0; mt < MT; ++mt)
        UNROLL
        for (int nt = 0; nt < 4; ++nt)
          UNROLL
          for (int i = 0; i < 4; ++i) sum[mt][nt][i] = tc_add(sum[mt][nt][i], other[((mt * 4 + nt) * 4 + i) * 32 + lane]);
    }
  }
}

// One step of the pipelined loop: the tile (first row and column) and the super-block it multiplies.
struct TcStep {
  int row0, col0, sb;
};

// The leading warps (the split tiling's first quarter; every warp of the wide one) hold the float sums.
template <bool SPLIT>
DEV bool tc_lead_warp() {
  return !SPLIT || (threadIdx.x >> 5) >> 1 == 0;
}

// The pipelined main loop of the tiled GEMMs: nsteps steps, step i multiplying super-block at(i).sb of the tile at
// (at(i).row0, at(i).col0) into acc (the leading warps' float sums, see tc_lead_warp), then calling end(i, acc) with
// every thread of the block (the caller folds, stores or exchanges the sums there). Its S stage buffers are filled
// S - 1 steps ahead, across tiles when the steps change tile (the small-row kernel's items).
// Per super-block, with explicit roundings so that every kernel built on this loop gives the same bits:
//   Q4_K / Q5_K  acc = fma(da, fma(d, float(isum), -(dmin * float(msum))), acc)
//   Q6_K         acc = fma(da, d * float(isum - 32 msum), acc)
// SPLIT: the split tiling (params.cuh): warp w multiplies sub-blocks of quarter w / 2 for column half w % 2.
// MT: row tiles per warp (tc_load_stage); with 1, acc[1] stays as it was.
template <int WT, int N, int K, bool SPLIT, int S, int MT, class At, class End>
DEV void tc_loop(const GemmParams& p, int nsteps, float (&acc)[2][4][4], At at, End end) {
  static_assert(WT == WT_Q4_K || WT == WT_Q5_K || WT == WT_Q6_K || WT == WT_Q8_0 || WT == WT_Q5_0, "not a GPU weight type");
  constexpr bool Q6 = WT == WT_Q6_K, Q5 = WT == WT_Q5_K, P32 = tc_per32(WT);
  static_assert(N % 8 == 0 && K % (P32 ? 32 : 256) == 0, "bad GEMM shape");
  constexpr int KBP = act_kblocks(K), BB = tc_block_bytes(WT), STAGE = tc_stage_bytes(WT, SPLIT);
  constexpr int ROWS = tc_rows(SPLIT), COLS = tc_cols(SPLIT), SA = ROWS * 256, SS = ROWS * 32;
  constexpr int QUARTERS = SPLIT ? 1 : 4;  // units of two sub-blocks each warp multiplies per super-block
  constexpr int NS = Q6 ? 16 : 8;  // scales per column and step in the decoded table
  unsigned char* smem = dyn_smem();
  int* dsc = reinterpret_cast<int*>(smem + S * STAGE);  // [16 or 8][COLS] integer scales (Q8_0 / Q5_0: f32 d [8][COLS])
  unsigned char* dmn = reinterpret_cast<unsigned char*>(dsc + NS * COLS);  // Q4_K, Q5_K: [COLS][8] mins
  float* ddm = reinterpret_cast<float*>(dmn + 8 * COLS);  // Q4_K, Q5_K: [COLS][2] d (Q4_K: d / 16), dmin
  float* dtab = reinterpret_cast<float*>(dsc);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  // Wide: warps 2 (M) x 4 (N). Split: 1 x 2 (N) x 4 (quarters of each super-block, wk).
  const int wm = SPLIT ? 0 : warp >> 2, wn = SPLIT ? warp & 1 : warp & 3, wk = SPLIT ? warp >> 1 : 0;

  UNROLL
  for (int s = 0; s < S - 1; ++s) {
    if (s < nsteps) {
      const TcStep n = at(s);
      tc_load_stage<WT, K, SPLIT, MT>(p, smem + s * STAGE, n.sb, n.row0, n.col0);
    }
    cp_async_commit();
  }

  UNROLL_1
  for (int step = 0; step < nsteps; ++step) {
    const TcStep cur = at(step);
    const int sb = cur.sb, row0 = cur.row0;
    const unsigned char* st = smem + (step % S) * STAGE;
    const unsigned char* sw = st + SA;
    cp_async_wait<S - 2>();
    block_sync();  // stage sb has landed; every warp is done with stage sb - 1 and the decoded table
    if (tid < COLS) {  // one column's scales (ggml's Q4_K / Q5_K: 6-bit scales and mins; Q6_K: int8 scales)
      const unsigned char* h = sw + tid * BB;
      if (Q6) {
        UNROLL
        for (int j = 0; j < 16; ++j) dsc[j * COLS + tid] = static_cast<signed char>(h[j]);
      } else if (P32) {  // the eight blocks' f16 d (a short step's missing ones are zeros)
        UNROLL
        for (int j = 0; j < 8; ++j) dtab[j * COLS + tid] = f16_to_f32(static_cast<unsigned short>(h[2 * j] | (h[2 * j + 1] << 8)));
      } else {
        ddm[2 * tid] = f16_to_f32(static_cast<unsigned short>(h[0] | (h[1] << 8))) * (Q5 ? 1.f : 0.0625f);
        ddm[2 * tid + 1] = f16_to_f32(static_cast<unsigned short>(h[2] | (h[3] << 8)));
        const unsigned char* q = h + 4;
        UNROLL
        for (int j = 0; j < 8; ++j) {
          const int sc = j < 4 ? q[j] & 63 : (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
          dmn[tid * 8 + j] = static_cast<unsigned char>(j < 4 ? q[j + 4] & 63 : (q[j + 4] >> 4) | ((q[j] >> 6) << 4));
          dsc[j * COLS + tid] = Q5 || (j & 1) ? sc : 16 * sc;  // Q4_K: isum in units of 1/16
        }
      }
    }
    if (step + S - 1 < nsteps) {
      const TcStep n = at(step + S - 1);
      tc_load_stage<WT, K, SPLIT, MT>(p, smem + ((step + S - 1) % S) * STAGE, n.sb, n.row0, n.col0);
    }
    cp_async_commit();
    block_sync();  // the decoded table is complete

    int isum[2][4][4];  // the K-quants' integer sums
    float fsum[2][4][4];  // the per-32 types' float sums
    if (P32) zero_tiles(fsum);
    else zero_tiles(isum);
    const unsigned char* sa = st + (wm * 2) * 4096;  // this warp's two row tiles
    // ldmatrix row addresses: lane 8i + r reads row r of matrix i = (tile 2 pair + i / 2, bytes 16 (i % 2) ..).
    const int mrow = wn * 32 + (lane >> 4) * 8 + (lane & 7), mhalf = 16 * ((lane >> 3) & 1);
    if (P32) {
      const unsigned char* ss = st + SA + COLS * BB;
      if (tc_short_step(K, sb)) {
        tc_per32_quarters<WT, COLS, QUARTERS, MT, false>(fsum, sa, sw, ss, dtab, tc_last_blocks(K), wk, wm, wn, mrow, mhalf,
                                                         lane, g, t);
      } else {
        tc_per32_quarters<WT, COLS, QUARTERS, MT, true>(fsum, sa, sw, ss, dtab, 8, wk, wm, wn, mrow, mhalf, lane, g, t);
      }
    } else if (Q5) {
      UNROLL_1
      for (int c = wk; c < wk + QUARTERS; ++c) {  // nibble chunk c: sub-blocks 2c (low nibbles) and 2c + 1 (high)
        UNROLL
        for (int h = 0; h < 2; ++h) {
          const int j = 2 * c + h;
          uint4 a[2];
          UNROLL
          for (int mt = 0; mt < MT; ++mt) a[mt] = lds_u4(sa + mt * 4096 + (j * 32 + lane) * 16);
          UNROLL
          for (int pair = 0; pair < 2; ++pair) {
            u32 wq[4], wh[4];  // nibbles of chunk c and the fifth bits (qh: bit j of byte l), same lanes
            ldmatrix_x4(wq, sw + (mrow + 16 * pair) * BB + 48 + 32 * c + mhalf);
            ldmatrix_x4(wh, sw + (mrow + 16 * pair) * BB + 16 + mhalf);
            UNROLL
            for (int q = 0; q < 2; ++q) {
              const int nt = 2 * pair + q;
              const u32 b0 = ((wq[2 * q] >> (4 * h)) & 0x0F0F0F0Fu) | (((wh[2 * q] >> j) << 4) & 0x10101010u);
              const u32 b1 = ((wq[2 * q + 1] >> (4 * h)) & 0x0F0F0F0Fu) | (((wh[2 * q + 1] >> j) << 4) & 0x10101010u);
              const uint2 sc = lds_u2(dsc + j * COLS + wn * 32 + nt * 8 + 2 * t);
              UNROLL
              for (int mt = 0; mt < MT; ++mt) {
                int d[4] = {0, 0, 0, 0};
                mma_s8_16832(d, a[mt].x, a[mt].y, a[mt].z, a[mt].w, b0, b1);
                add_scaled(isum[mt][nt], d, sc);
              }
            }
          }
        }
      }
    } else if (!Q6) {
      UNROLL_1
      for (int c = wk; c < wk + QUARTERS; ++c) {  // nibble chunk c: sub-blocks 2c (low nibbles) and 2c + 1 (high)
        u32 w[2][4];
        UNROLL
        for (int pair = 0; pair < 2; ++pair) ldmatrix_x4(w[pair], sw + (mrow + 16 * pair) * BB + 16 + 32 * c + mhalf);
        UNROLL
        for (int h = 0; h < 2; ++h) {
          uint4 a[2];
          UNROLL
          for (int mt = 0; mt < MT; ++mt) a[mt] = lds_u4(sa + mt * 4096 + ((2 * c + h) * 32 + lane) * 16);
          UNROLL
          for (int nt = 0; nt < 4; ++nt) {
            const u32* wt = w[nt >> 1] + 2 * (nt & 1);
            const u32 mask = h ? 0xF0F0F0F0u : 0x0F0F0F0Fu;  // odd sub-block: 16 q in place
            const u32 b0 = wt[0] & mask, b1 = wt[1] & mask;
            const uint2 sc = lds_u2(dsc + (2 * c + h) * COLS + wn * 32 + nt * 8 + 2 * t);
            UNROLL
            for (int mt = 0; mt < MT; ++mt) {
              int d[4] = {0, 0, 0, 0};
              mma_s8u8_16832(d, a[mt].x, a[mt].y, a[mt].z, a[mt].w, b0, b1);
              add_scaled(isum[mt][nt], d, sc);
            }
          }
        }
      }
    } else {
      if (SPLIT) {  // warp wk: half wk / 2, ql chunk wk % 2
        tc_q6_half<1, MT>(isum, sa, sw, dsc, COLS, wk >> 1, wk & 1, mrow, mhalf, lane, wn, t);
      } else {
        UNROLL_1
        for (int n = 0; n < 2; ++n) tc_q6_half<2, MT>(isum, sa, sw, dsc, COLS, n, 0, mrow, mhalf, lane, wn, t);
      }
    }

    if (SPLIT) {  // the four quarters' sums, added in the wide tiling's order: the split tiling gives the wide one's bits
      if (P32) tc_exchange<MT>(fsum, wk, wn, lane, S * STAGE + tc_decoded_bytes(WT, SPLIT));
      else tc_exchange<MT>(isum, wk, wn, lane, S * STAGE + tc_decoded_bytes(WT, SPLIT));
    }

    if (wk == 0 && P32) {
      UNROLL
      for (int mt = 0; mt < MT; ++mt)
        UNROLL
        for (int nt = 0; nt < 4; ++nt)
          UNROLL
          for (int i = 0; i < 4; ++i) acc[mt][nt][i] = fadd_rn(acc[mt][nt][i], fsum[mt][nt][i]);
    } else if (wk == 0) {
      // msum: A' = the 16 activation sums (k' 4t..4t+3 in lane t), B' = Q4_K's mins (each twice) or Q6_K's scales.
      const unsigned char* ss = st + SA + COLS * BB;
      u32 lo[2][2], hi[2][2];
      float da[2][2];
      UNROLL
      for (int mt = 0; mt < MT; ++mt) {
        UNROLL
        for (int h = 0; h < 2; ++h) {
          const int r = wm * 32 + mt * 16 + g + 8 * h;
          const uint2 v = lds_u2(ss + r * 32 + 8 * t);
          lo[mt][h] = byte_perm(v.x, v.y, 0x6420);
          hi[mt][h] = byte_perm(v.x, v.y, 0x7531);
          da[mt][h] = ld_f(p.da + static_cast<long long>(row0 + r) * KBP + sb * 8);
        }
      }
      const float* dq6 = reinterpret_cast<const float*>(ss + SS);  // Q6_K: the columns' d
      UNROLL
      for (int nt = 0; nt < 4; ++nt) {
        const int cg = wn * 32 + nt * 8 + g, cc = wn * 32 + nt * 8 + 2 * t;
        const u32 bm = Q6 ? lds_u32(sw + cg * BB + 4 * t)
                          : byte_perm(lds_u32(dmn + cg * 8 + 4 * (t >> 1)), 0u, (t & 1) ? 0x3322 : 0x1100);
        float d0, m0, d1, m1;
        if (Q6) {
          d0 = dq6[cc];
          d1 = dq6[cc + 1];
          m0 = m1 = 0.f;
        } else {
          d0 = ddm[2 * cc];
          m0 = ddm[2 * cc + 1];
          d1 = ddm[2 * cc + 2];
          m1 = ddm[2 * cc + 3];
        }
        UNROLL
        for (int mt = 0; mt < MT; ++mt) {
          int ml[4] = {0, 0, 0, 0}, mh[4] = {0, 0, 0, 0};
          mma_u8s8_16816(ml, lo[mt][0], lo[mt][1], bm);
          mma_s8_16816(mh, hi[mt][0], hi[mt][1], bm);
          const int* is = isum[mt][nt];
          UNROLL
          for (int i = 0; i < 4; ++i) {
            const int m = ml[i] + 256 * mh[i];
            const float dc = i & 1 ? d1 : d0, da_r = da[mt][i >> 1];
            const float x = Q6 ? fmul_rn(dc, static_cast<float>(is[i] - 32 * m))
                               : fma_rn(dc, static_cast<float>(is[i]), -fmul_rn(i & 1 ? m1 : m0, static_cast<float>(m)));
            acc[mt][nt][i] = fma_rn(da_r, x, acc[mt][nt][i]);
          }
        }
      }
    }
    end(step, acc);
  }
  cp_async_wait<0>();
}

// Adds a tile's float sums into its running total and clears them (a split-K chunk's end), explicitly rounded.
DEV void tc_fold(float (&total)[2][4][4], float (&acc)[2][4][4]) {
  UNROLL
  for (int mt = 0; mt < 2; ++mt)
    UNROLL
    for (int nt = 0; nt < 4; ++nt)
      UNROLL
      for (int i = 0; i < 4; ++i) {
        total[mt][nt][i] = fadd_rn(total[mt][nt][i], acc[mt][nt][i]);
        acc[mt][nt][i] = 0.f;
      }
}

// One block's tile of 48 rows or more: columns from bx * COLS, rows from by * ROWS. The float sums are formed per split-K
// chunk (tc_chunks: each chunk's super-blocks in order from zero, then the chunks' sums in order from zero), as the
// small-row kernel forms them across blocks, so both give every output the same bits. The wide tiling keeps the running
// total beside the chunk's sums (one block per SM: up to 255 registers). The split tiling, two blocks per SM at 128
// registers, has no room for it: at each chunk's end the leading warps hand their sums through shared memory to the
// second quarter's warps, which hold the total in the same registers (they never accumulate) and store it.
template <int WT, int N, int K, bool SPLIT>
DEV void gemm_tc_tile(const GemmParams& p, int bx, int by) {
  constexpr int NC = tc_chunks(N, K), CH = tc_steps(K) / NC, S = gemm_tc_stages(WT, kTcArch, SPLIT);
  const int row0 = by * tc_rows(SPLIT), col0 = bx * tc_cols(SPLIT);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int wm = SPLIT ? 0 : warp >> 2, wn = SPLIT ? warp & 1 : warp & 3, wk = SPLIT ? warp >> 1 : 0;
  const auto at = [&](int i) { return TcStep{row0, col0, i}; };
  float acc[2][4][4];
  zero_tiles(acc);
  if constexpr (SPLIT) {
    float* xs = reinterpret_cast<float*>(dyn_smem() + S * tc_stage_bytes(WT, true) + tc_decoded_bytes(WT, true));
    tc_loop<WT, N, K, true, S, 2>(p, tc_steps(K), acc, at, [&](int i, float (&a)[2][4][4]) {
      if ((i + 1) % CH != 0) return;
      block_sync();  // the leading warps are done with the exchange area of this step
      if (wk == 0) {
        UNROLL
        for (int e = 0; e < 32; ++e) {
          xs[(wn * 32 + e) * 32 + lane] = a[e >> 4][(e >> 2) & 3][e & 3];
          a[e >> 4][(e >> 2) & 3][e & 3] = 0.f;
        }
      }
      block_sync();
      if (wk == 1) {
        UNROLL
        for (int e = 0; e < 32; ++e) a[e >> 4][(e >> 2) & 3][e & 3] = fadd_rn(a[e >> 4][(e >> 2) & 3][e & 3], xs[(wn * 32 + e) * 32 + lane]);
      }
    });
    if (wk != 1) return;
  } else {
    float total[2][4][4];
    zero_tiles(total);
    tc_loop<WT, N, K, false, S, 2>(p, tc_steps(K), acc, at, [&](int i, float (&a)[2][4][4]) {
      if ((i + 1) % CH == 0) tc_fold(total, a);
    });
    UNROLL
    for (int mt = 0; mt < 2; ++mt)
      UNROLL
      for (int nt = 0; nt < 4; ++nt)
        UNROLL
        for (int e = 0; e < 4; ++e) acc[mt][nt][e] = total[mt][nt][e];
  }
  // Epilogue: acc[mt][nt][0..1] are row g, columns 2t and 2t+1; [2..3] the same columns of row g + 8.
  UNROLL
  for (int mt = 0; mt < 2; ++mt)
    UNROLL
    for (int nt = 0; nt < 4; ++nt)
      gemm_store_tile<N>(p, row0 + wm * 32 + mt * 16 + g, col0 + wn * 32 + nt * 8 + 2 * t, acc[mt][nt]);
}

// The GEMM of 1-32 rows (kTcSmallRows): split-K over persistent blocks. Its work items are (column block of the split
// tiling, chunk of tc_chunks): item = column block * NC + chunk; block blk of nblk takes items blk, blk + nblk, ...
// as one pipelined stream of steps (its next item's weights load while it finishes the last). Each item's float sums
// go to p.part ([item][32 rows][64 columns], rows below p.rows only); the last item of a column block to arrive (an
// arrival counter per column block, p.count, reset to zero after use) adds the chunks' sums in order from zero, into
// y. With one chunk the item stores y itself. Rows past p.rows are never read or written. done(column block) runs on
// every thread of the block that stored a column block's final outputs. MT: 16-row tiles multiplied (gemm_tc_small_tile).
template <int WT, int N, int K, int MT, class Done>
DEV void gemm_tc_small_rows(const GemmParams& p, int blk, int nblk, Done done) {
  constexpr int NC = tc_chunks(N, K), CH = tc_steps(K) / NC, ITEMS = tc_col_blocks(N, true) * NC, COLS = tc_cols(true);
  const int mine = blk < ITEMS ? (ITEMS - 1 - blk) / nblk + 1 : 0;
  if (mine == 0) return;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3, wn = warp & 1;
  const bool lead = tc_lead_warp<true>();
  int* last = reinterpret_cast<int*>(dyn_smem() + gemm_tc_small_smem_bytes(WT, kTcArch) - 16);  // this block's arrival
  float acc[2][4][4];
  zero_tiles(acc);
  tc_loop<WT, N, K, true, gemm_tc_small_stages(WT, kTcArch), MT>(
      p, mine * CH, acc,
      [&](int i) {
        const int item = blk + (i / CH) * nblk;
        return TcStep{0, item / NC * COLS, item % NC * CH + i % CH};
      },
      [&](int i, float (&a)[2][4][4]) {
        if ((i + 1) % CH != 0) return;
        const int item = blk + (i / CH) * nblk, bx = item / NC;
        if (NC == 1) {
          if (lead) {
            float total[2][4][4];
            zero_tiles(total);
            tc_fold(total, a);
            UNROLL
            for (int mt = 0; mt < MT; ++mt)
              UNROLL
              for (int nt = 0; nt < 4; ++nt)
                gemm_store_tile<N>(p, mt * 16 + g, bx * COLS + wn * 32 + nt * 8 + 2 * t, total[mt][nt]);
          }
          done(bx);
          return;
        }
        if (lead) {
          float* part = p.part + static_cast<long long>(item) * kTcSmallRows * COLS;
          UNROLL
          for (int mt = 0; mt < MT; ++mt)
            UNROLL
            for (int nt = 0; nt < 4; ++nt)
              UNROLL
              for (int e = 0; e < 4; ++e) {
                const int r = mt * 16 + g + 8 * (e >> 1), c = wn * 32 + nt * 8 + 2 * t + (e & 1);
                if (r < p.rows) part[r * COLS + c] = a[mt][nt][e];
                a[mt][nt][e] = 0.f;
              }
        }
        if (!last_arrival(p.count + bx, NC, last)) return;
        const float* base = p.part + static_cast<long long>(bx) * NC * kTcSmallRows * COLS;
        for (int e = tid; e < p.rows * COLS; e += kTcThreads) {
          const int col = bx * COLS + e % COLS;
          if (col >= N) continue;
          float total = 0.f;
          for (int c = 0; c < NC; ++c) total = fadd_rn(total, ld_cg_f(base + static_cast<long long>(c) * kTcSmallRows * COLS + e));
          float* y = p.y + static_cast<long long>(e / COLS) * p.ldy + col;
          *y = p.accumulate ? *y + total : total;
        }
        if (tid == 0) p.count[bx] = 0u;  // every chunk has arrived: ready for the next launch
        done(bx);
      });
}

// The small-row kernel's work at 1-16 rows multiplies one 16-row tile per warp (its activations alone loaded), at 17-32
// two: the same sums for every row it stores, so the same bits, with half the tensor-core work and integer scaling,
// exchange and epilogue at the row counts where the kernel streams weights and issue slots bound it.
template <int WT, int N, int K, class Done>
DEV void gemm_tc_small_tile(const GemmParams& p, int blk, int nblk, Done done) {
  if (p.rows <= 16) gemm_tc_small_rows<WT, N, K, 1>(p, blk, nblk, done);
  else gemm_tc_small_rows<WT, N, K, 2>(p, blk, nblk, done);
}

template <int WT, int N, int K, bool SPLIT>
DEV void gemm_tc_body(const GemmParams& p) {
  gemm_tc_tile<WT, N, K, SPLIT>(p, blockIdx.x, blockIdx.y);
}

template <int WT, int N, int K>
DEV void gemm_tc_small_body(const GemmParams& p) {
  gemm_tc_small_tile<WT, N, K>(p, blockIdx.x, gridDim.x, [](int) {});
}

// A feed-forward's gate and up (SWIGLU) quantise silu(gate) * up for the down projection themselves: after a block has
// stored a member's final outputs for rows [row0, row0 + ROWS) and columns [col0, col0 + cols), it counts its arrival at
// that row tile's 256-column span; the span's last writer (of 2 members x 256 / cols) quantises the span for the tile's
// rows in format QACT (Q8_K or Q8_0: the down projection's), exactly as quant_rows_body's SwiGLU mode (padding rows as
// zeros). last: a shared int of the block.
template <int F, int ROWS, int QACT>
DEV void swiglu_arrive(const GemmGroupParams& p, int tile, int row0, int col0, int cols, int* last) {
  static_assert(F % 256 == 0, "the SwiGLU quantiser takes whole Q8_K blocks");
  if (col0 >= F) return;  // a padding column block (the whole block)
  const int span = tile * (F / 256) + col0 / 256;
  if (!last_arrival(p.span + span, static_cast<unsigned>(2 * 256 / cols), last)) return;
  for (int r = row0 + (threadIdx.x >> 5); r < row0 + ROWS; r += kTcThreads / 32)
    quant_span<QR_SWIGLU, QACT, F / 32>(p.q, r, r, p.q.x + static_cast<long long>(r) * p.q.ld, 1.0, col0 / 256);
  if (threadIdx.x == 0) p.span[span] = 0u;
}

// Two or three GEMMs of one activation (a layer's Q, K, V or gate, up) in one launch, the same tiling for all: the
// first member's column blocks, then the second's, then the third's (N2 = 0: two members). Each block runs one
// member's tile exactly as that member's own launch would, so the results are the same bits. SWIGLU: two members of
// N0 = N1 columns, then swiglu_arrive.
template <bool SPLIT, int K, int WT0, int N0, int WT1, int N1, int WT2, int N2, bool SWIGLU = false, int QACT = ACT_Q8_K>
DEV void gemm_tc_group_body(const GemmGroupParams& p) {
  static_assert(!SWIGLU || (N0 == N1 && N2 == 0), "SwiGLU takes a gate and an up of one width");
  constexpr int B0 = tc_col_blocks(N0, SPLIT), B1 = tc_col_blocks(N1, SPLIT), COLS = tc_cols(SPLIT);
  const int bx = blockIdx.x, by = blockIdx.y;
  if (bx < B0) {
    gemm_tc_tile<WT0, N0, K, SPLIT>(p.m[0], bx, by);
  } else if (N2 == 0 || bx < B0 + B1) {
    gemm_tc_tile<WT1, N1, K, SPLIT>(p.m[1], bx - B0, by);
  } else {
    if constexpr (N2 > 0) gemm_tc_tile<WT2, N2, K, SPLIT>(p.m[2], bx - B0 - B1, by);
  }
  if constexpr (SWIGLU) {
    // The stages are free once every warp has passed the arrival's first barrier: the flag lives there.
    swiglu_arrive<N0, tc_rows(SPLIT), QACT>(p, by, by * tc_rows(SPLIT), (bx < B0 ? bx : bx - B0) * COLS, COLS,
                                      reinterpret_cast<int*>(dyn_smem()));
  }
}

// The small-row kernel of a group (the split tiling's small path, gemm_tc_small_tile): every block takes its share of
// the first member's items, then of the second's, ...; each member's shares start where the last one's ended, so the
// blocks' loads stay even. SWIGLU: each column block's final writer arrives as in gemm_tc_group_body (one row tile).
template <int K, int WT0, int N0, int WT1, int N1, int WT2, int N2, bool SWIGLU = false, int QACT = ACT_Q8_K>
DEV void gemm_tc_group_small_body(const GemmGroupParams& p) {
  const int nblk = gridDim.x, off1 = tc_small_items(N0, K) % nblk, off2 = (off1 + tc_small_items(N1, K)) % nblk;
  int* last = reinterpret_cast<int*>(dyn_smem() + max(gemm_tc_small_smem_bytes(WT0, kTcArch), gemm_tc_small_smem_bytes(WT1, kTcArch)) - 12);
  const auto arrive = [&](int bx) {
    if constexpr (SWIGLU) swiglu_arrive<N0, kTcSmallRows, QACT>(p, 0, 0, bx * tc_cols(true), tc_cols(true), last);
  };
  gemm_tc_small_tile<WT0, N0, K>(p.m[0], blockIdx.x, nblk, arrive);
  block_sync();  // every warp is done with the stages before the next member's loads fill them
  gemm_tc_small_tile<WT1, N1, K>(p.m[1], (blockIdx.x + nblk - off1) % nblk, nblk, arrive);
  if constexpr (N2 > 0) {
    block_sync();
    gemm_tc_small_tile<WT2, N2, K>(p.m[2], (blockIdx.x + nblk - off2) % nblk, nblk, [](int) {});
  }
}

#endif
