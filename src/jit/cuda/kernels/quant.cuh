// Element-wise kernels around the matrix products: quant_rows turns f32 activation rows into the int8
// fragments the GEMM reads (optionally fusing the RMSNorm before a projection, or the SwiGLU between the
// feed-forward projections), pack_heads adds a bias, applies RoPE and converts one projection's
// output to the per-head split-f16 (hi + lo) layouts the attention kernel reads, and copy_rows gathers or
// scatters listed rows in one launch.
#ifndef DLLM_CUDA_QUANT_CUH
#define DLLM_CUDA_QUANT_CUH

// --- int8 activation fragments ------------------------------------------------------------------
// Activations are quantised per row exactly as ggml quantises them for its integer dot products, so the
// GPU multiplies the same integers as the CPU path and llama.cpp do:
//   ACT_Q8_0 (for Q8_0 weights), per 32 values: d = amax/127, q = roundf(x * (1/d)) (ties away from
//            zero), and the scale used is d rounded to f16;
//   ACT_Q8_K (for Q4_K / Q6_K weights), per 256 values: max = the value of largest |x| (the first on
//            ties), iscale = -127/max, q = min(127, rint(iscale * x)) (ties to even), d = 1/iscale.
// Either way the GEMMs read one scale da per 32 values (a Q8_K block's scale repeated over its 8 sub-blocks), and
// the tiled GEMM the integer sums of each 16 values, bs (|bs| <= 16 * 127).
// The quants are stored pre-arranged as the A operand of mma.m16n8k32: for row tile mt (16 rows) and k-block
// kb, the 32 lanes' 16-byte records are contiguous; lane 4g+t holds {row g, k 4t..4t+3}, {row g+8, k 4t..},
// {row g, k 16+4t..}, {row g+8, k 16+4t..}.
// KBP = the number of k-blocks rounded up to a multiple of 4 (extra blocks are zeros).
// The fused RMSNorm runs in double like the CPU path (forward.cpp): y = float(double(x) * scale * w).
enum { QR_PLAIN = 0, QR_RMSNORM = 1, QR_SWIGLU = 2 };
enum { ACT_Q8_0 = 0, ACT_Q8_K = 1 };
constexpr int kQuantThreads = 128;

// --- listed rows: one block per row, its threads along the row -------------------------------------
constexpr int kCopyThreads = 256;
DEV void copy_rows_body(const RowCopyParams& p) {
  const int i = blockIdx.x;
  if (i >= p.n) return;
  const long long listed = p.rows[i];
  const float* s = p.src + (p.scatter ? i : listed) * p.cols;
  float* d = p.dst + (p.scatter ? listed : i) * p.cols;
  for (int c = threadIdx.x; c < p.cols; c += blockDim.x) d[c] = s[c];
}

// Byte offset of activation (row r, column k) in the fragment array.
DEV long long a_frag_offset(int r, int k, int kbp) {
  const int mt = r >> 4, rr = r & 15, kb = k >> 5, kk = k & 31;
  const int g = rr & 7, reg = (rr >> 3) + 2 * (kk >> 4), t = (kk & 15) >> 2;
  return ((static_cast<long long>(mt) * kbp + kb) * 32 + g * 4 + t) * 16 + reg * 4 + (kk & 3);
}

// The activation value k of a row: the input itself, the RMS-normed input, or SwiGLU of gate and up.
// Reads bypass L1 (ld_cg_f): a fused quantiser reads rows other blocks of its launch wrote.
template <int MODE>
DEV float act_value(const QuantRowsParams& p, const float* x, long long src, double scale, int k) {
  if (MODE == QR_PLAIN) return ld_cg_f(x + k);
  if (MODE == QR_RMSNORM) return static_cast<float>(static_cast<double>(x[k]) * scale * static_cast<double>(p.w[k]));
  const float g = ld_cg_f(x + k);
  return g / (1.f + expf(-g)) * ld_cg_f(p.x2 + src * p.ld + k);
}

DEV void store_quant(const QuantRowsParams& p, int r, int k, int kbp, int q) {
  p.q[a_frag_offset(r, k, kbp)] = static_cast<unsigned char>(static_cast<signed char>(q));
}

// One Q8_K block (values [256 b, 256 b + 256) of output row r, input row src) quantised by one warp; lane l holds value l
// of each of the 8 sub-blocks of 32. A padding row (r >= p.rows) is written as zeros. Called by quant_rows_body and by
// the GEMMs that quantise their own output (gemm_tc_group_body's SwiGLU).
template <int MODE, int KBP>
DEV void quant_q8k_block(const QuantRowsParams& p, int r, long long src, const float* x, double scale, int b) {
  const int lane = threadIdx.x & 31;
  const long long rk = static_cast<long long>(r) * KBP;
  if (r >= p.rows) {
    UNROLL
    for (int i = 0; i < 8; ++i) {
      store_quant(p, r, b * 256 + 32 * i + lane, KBP, 0);
      if (lane < 2) p.bs[2 * (rk + b * 8 + i) + lane] = 0;
      if (lane == 0) p.da[rk + b * 8 + i] = 0.f;
    }
    return;
  }
  float v[8];
  float best_ax = -1.f, best_v = 0.f;
  int best_i = 0;
  UNROLL
  for (int i = 0; i < 8; ++i) {
    v[i] = act_value<MODE>(p, x, src, scale, b * 256 + 32 * i + lane);
    const float ax = fabsf(v[i]);
    if (ax > best_ax) {  // ascending positions: keeps the first of equal magnitudes
      best_ax = ax;
      best_v = v[i];
      best_i = 32 * i + lane;
    }
  }
  UNROLL
  for (int m = 16; m > 0; m >>= 1) {
    const float oax = shfl_xor_f(best_ax, m), ov = shfl_xor_f(best_v, m);
    const int oi = shfl_xor_i(best_i, m);
    if (oax > best_ax || (oax == best_ax && oi < best_i)) {
      best_ax = oax;
      best_v = ov;
      best_i = oi;
    }
  }
  const bool zero = best_ax == 0.f;
  const float iscale = zero ? 0.f : -127.f / best_v;
  const float d = zero ? 0.f : 1.f / iscale;
  UNROLL
  for (int i = 0; i < 8; ++i) {
    const int q = zero ? 0 : min(127, round_to_int(iscale * v[i]));
    const int half = half_warp_sum_i(q);
    store_quant(p, r, b * 256 + 32 * i + lane, KBP, q);
    if ((lane & 15) == 0) p.bs[2 * (rk + b * 8 + i) + (lane >> 4)] = static_cast<short>(half);
    if (lane == 0) p.da[rk + b * 8 + i] = d;
  }
}

// One Q8_0 block (values [32 kb, 32 kb + 32) of output row r, input row src) quantised by one warp, a value per lane;
// k-blocks at or past KB (the padding of KBP) and padding rows (r >= p.rows) are written as zeros.
template <int MODE, int KBP>
DEV void quant_q80_block(const QuantRowsParams& p, int r, long long src, const float* x, double scale, int kb, int KB) {
  const int lane = threadIdx.x & 31, k = kb * 32 + lane;
  const long long rk = static_cast<long long>(r) * KBP;
  const float v = r < p.rows && kb < KB ? act_value<MODE>(p, x, src, scale, k) : 0.f;
  const float amax = warp_max(fabsf(v));
  const float d = amax / 127.f;
  const float id = d != 0.f ? 1.f / d : 0.f;
  const int q = static_cast<int>(roundf(v * id));
  const int half = half_warp_sum_i(q);
  store_quant(p, r, k, KBP, q);
  if ((lane & 15) == 0) p.bs[2 * (rk + kb) + (lane >> 4)] = static_cast<short>(half);
  if (lane == 0) p.da[rk + kb] = f16_to_f32(f32_to_f16(d));
}

// A span of 256 values (span b of output row r) quantised by one warp in format ACT: one Q8_K block, or eight Q8_0
// blocks. For the launches that quantise their own output (gemm_tc_group_body's SwiGLU, attention_body's QUANT).
template <int MODE, int ACT, int KBP>
DEV void quant_span(const QuantRowsParams& p, int r, long long src, const float* x, double scale, int b) {
  if (ACT == ACT_Q8_K) {
    quant_q8k_block<MODE, KBP>(p, r, src, x, scale, b);
  } else {
    UNROLL_1
    for (int i = 0; i < 8; ++i) quant_q80_block<MODE, KBP>(p, r, src, x, scale, 8 * b + i, KBP);
  }
}

// One block of kQuantThreads per output row; gridDim.x = rows_pad (a multiple of 32).
template <int MODE, int ACT, int K>
DEV void quant_rows_body(const QuantRowsParams& p) {
  static_assert(K % (ACT == ACT_Q8_K ? 256 : 32) == 0, "rows must hold whole blocks");
  constexpr int KB = K / 32, KBP = act_kblocks(K), WARPS = kQuantThreads / 32;
  SHARED_ALIGN16 double red[WARPS];
  const int r = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const long long rk = static_cast<long long>(r) * KBP;
  if (r >= p.rows) {  // padding row: zeros (the whole block takes this branch)
    for (int kb = warp; kb < KBP; kb += WARPS) {
      store_quant(p, r, kb * 32 + lane, KBP, 0);
      if (lane == 0) {
        p.da[rk + kb] = 0.f;
        p.bs[2 * (rk + kb)] = p.bs[2 * (rk + kb) + 1] = 0;
      }
    }
    return;
  }
  const long long src = p.row_map ? p.row_map[r] : r;
  const float* x = p.x + src * p.ld;
  double scale = 1.0;
  if (MODE == QR_RMSNORM) {
    double ss = 0.0;
    for (int i = threadIdx.x; i < K; i += kQuantThreads) ss += static_cast<double>(x[i]) * x[i];
    UNROLL
    for (int m = 16; m > 0; m >>= 1) ss += shfl_xor_d(ss, m);
    if (lane == 0) red[warp] = ss;
    block_sync();
    ss = 0.0;
    UNROLL
    for (int w = 0; w < WARPS; ++w) ss += red[w];
    scale = 1.0 / sqrt(ss / static_cast<double>(K) + static_cast<double>(p.eps));
  }
  if (ACT == ACT_Q8_0) {
    // A warp per block of 32, one value per lane.
    for (int kb = warp; kb < KBP; kb += WARPS) quant_q80_block<MODE, KBP>(p, r, src, x, scale, kb, KB);
  } else {
    // A warp per block of 256.
    for (int b = warp; b < K / 256; b += WARPS) quant_q8k_block<MODE, KBP>(p, r, src, x, scale, b);
  }
}

// --- per-head f16 operands for attention -----------------------------------------------------------
// One thread per (row, head, pair of dimensions); the output has a hi and a lo plane (see below). STYLE: PK_NONE (no rotation), PK_NORM (pairs 2i, 2i+1)
// or PK_NEOX (pairs i, i + NROT/2); dimensions at or beyond NROT are not rotated. TRANSPOSE writes
// [NH][D][rows_pad] (values, read as the B operand of P.V) instead of [NH][rows_pad][D].
enum { PK_NONE = 0, PK_NORM = 1, PK_NEOX = 2 };
constexpr int kPackThreads = 256;

// Element idx of the pack (one thread each): row idx / (NH * D/2), head, pair.
template <int NH, int D, int NROT, int STYLE, int TRANSPOSE>
DEV void pack_heads_at(const PackParams& p, long long idx) {
  static_assert(D % 2 == 0 && NROT % 2 == 0 && NROT <= D, "bad head geometry");
  constexpr int HALF = D / 2, RH = NROT / 2;
  if (idx >= static_cast<long long>(p.rows_pad) * NH * HALF) return;
  const int i = static_cast<int>(idx % HALF);
  const int h = static_cast<int>((idx / HALF) % NH);
  const int r = static_cast<int>(idx / (static_cast<long long>(HALF) * NH));
  int c0 = 2 * i, c1 = 2 * i + 1;
  bool rotate = STYLE != PK_NONE && i < RH;
  if (STYLE == PK_NEOX) {
    if (i < RH) {
      c0 = i;
      c1 = i + RH;
    } else {
      c0 = NROT + 2 * (i - RH);
      c1 = c0 + 1;
    }
  }
  float a = 0.f, b = 0.f;
  if (r < p.rows) {
    const float* x = p.x + static_cast<long long>(r) * p.ld + h * D;
    a = x[c0];
    b = x[c1];
    if (p.bias) {
      a += p.bias[h * D + c0];
      b += p.bias[h * D + c1];
    }
    if (rotate) {
      // In double with double tables, as the CPU path rotates (forward.cpp).
      const long long t = static_cast<long long>(p.pos[r]) * RH + i;
      const double cs = p.cos_t[t], sn = p.sin_t[t], da = a, db = b;
      a = static_cast<float>(da * cs - db * sn);
      b = static_cast<float>(da * sn + db * cs);
    }
  }
  // Two planes: the f16 value (hi) and the f16 rounding of what it misses (lo); hi + lo carries about
  // 22 bits of the f32 value, and the attention kernel multiplies hi.hi + hi.lo + lo.hi.
  const unsigned short ha = f32_to_f16(a), hb = f32_to_f16(b);
  const unsigned short la = f32_to_f16(a - f16_to_f32(ha)), lb = f32_to_f16(b - f16_to_f32(hb));
  const long long plane = static_cast<long long>(NH) * D * p.rows_pad;
  if (TRANSPOSE) {
    unsigned short* o = p.out + static_cast<long long>(h) * D * p.rows_pad + r;
    o[static_cast<long long>(c0) * p.rows_pad] = ha;
    o[static_cast<long long>(c1) * p.rows_pad] = hb;
    o[plane + static_cast<long long>(c0) * p.rows_pad] = la;
    o[plane + static_cast<long long>(c1) * p.rows_pad] = lb;
  } else {
    unsigned short* o = p.out + (static_cast<long long>(h) * p.rows_pad + r) * D;
    o[c0] = ha;
    o[c1] = hb;
    o[plane + c0] = la;
    o[plane + c1] = lb;
  }
}

template <int NH, int D, int NROT, int STYLE, int TRANSPOSE>
DEV void pack_heads_body(const PackParams& p) {
  pack_heads_at<NH, D, NROT, STYLE, TRANSPOSE>(p, static_cast<long long>(blockIdx.x) * kPackThreads + threadIdx.x);
}

// The three packs of one attention in one launch: the first blocks_q blocks pack the queries (NH heads), the next
// blocks_k the keys (NHKV heads, the same RoPE), the rest the values (transposed, not rotated).
template <int NH, int NHKV, int D, int NROT, int STYLE>
DEV void pack_qkv_body(const PackQkvParams& p) {
  const long long b = blockIdx.x, t = threadIdx.x;
  if (b < p.blocks_q) {
    pack_heads_at<NH, D, NROT, STYLE, 0>(p.q, b * kPackThreads + t);
  } else if (b < p.blocks_q + p.blocks_k) {
    pack_heads_at<NHKV, D, NROT, STYLE, 0>(p.k, (b - p.blocks_q) * kPackThreads + t);
  } else {
    pack_heads_at<NHKV, D, NROT, PK_NONE, 1>(p.v, (b - p.blocks_q - p.blocks_k) * kPackThreads + t);
  }
}

#endif
