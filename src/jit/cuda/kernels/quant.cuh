// Element-wise kernels around the matrix products: quant_rows turns f32 activation rows into the int8
// fragments the GEMM reads (optionally fusing the RMSNorm before a projection, or the SwiGLU between the
// feed-forward projections), and pack_heads adds a bias, applies RoPE and converts one projection's
// output to the per-head f16 layouts the attention kernel reads.
#ifndef DLLM_CUDA_QUANT_CUH
#define DLLM_CUDA_QUANT_CUH

// --- int8 activation fragments ------------------------------------------------------------------
// Activations are quantised per row and per block of 32 values: d = max|x| / 127, q = round(x / d)
// (q = 0 when the block is all zeros). The quants are stored pre-arranged as the A operand of
// mma.m16n8k32: for row tile mt (16 rows) and k-block kb, the 32 lanes' 16-byte records are contiguous;
// lane 4g+t holds {row g, k 4t..4t+3}, {row g+8, k 4t..}, {row g, k 16+4t..}, {row g+8, k 16+4t..}.
// KBP = the number of k-blocks rounded up to a multiple of 4 (extra blocks are zeros).
enum { QR_PLAIN = 0, QR_RMSNORM = 1, QR_SWIGLU = 2 };
constexpr int kQuantThreads = 128;

// Byte offset of activation (row r, column k) in the fragment array.
DEV long long a_frag_offset(int r, int k, int kbp) {
  const int mt = r >> 4, rr = r & 15, kb = k >> 5, kk = k & 31;
  const int g = rr & 7, reg = (rr >> 3) + 2 * (kk >> 4), t = (kk & 15) >> 2;
  return ((static_cast<long long>(mt) * kbp + kb) * 32 + g * 4 + t) * 16 + reg * 4 + (kk & 3);
}

// One block of kQuantThreads per output row; gridDim.x = rows_pad (a multiple of 32).
template <int MODE, int K>
DEV void quant_rows_body(const QuantRowsParams& p) {
  static_assert(K % 32 == 0, "rows must hold whole blocks of 32");
  constexpr int KB = K / 32, KBP = (KB + 3) / 4 * 4, WARPS = kQuantThreads / 32;
  SHARED_ALIGN16 float red[WARPS];
  const int r = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (r >= p.rows) {  // padding row: zeros (the whole block takes this branch)
    for (int kb = warp; kb < KBP; kb += WARPS) {
      p.q[a_frag_offset(r, kb * 32 + lane, KBP)] = 0;
      if (lane == 0) p.da[static_cast<long long>(r) * KBP + kb] = p.sa[static_cast<long long>(r) * KBP + kb] = 0.f;
    }
    return;
  }
  const long long src = p.row_map ? p.row_map[r] : r;
  const float* x = p.x + src * p.ld;
  float scale = 1.f;
  if (MODE == QR_RMSNORM) {
    float ss = 0.f;
    for (int i = threadIdx.x; i < K; i += kQuantThreads) ss += x[i] * x[i];
    ss = warp_sum(ss);
    if (lane == 0) red[warp] = ss;
    block_sync();
    ss = 0.f;
    UNROLL
    for (int w = 0; w < WARPS; ++w) ss += red[w];
    scale = 1.f / sqrtf(ss / static_cast<float>(K) + p.eps);
  }
  for (int kb = warp; kb < KBP; kb += WARPS) {
    const int k = kb * 32 + lane;
    float v = 0.f;
    if (kb < KB) {
      if (MODE == QR_PLAIN) {
        v = x[k];
      } else if (MODE == QR_RMSNORM) {
        v = x[k] * scale * p.w[k];
      } else {
        const float g = x[k];
        v = g / (1.f + expf(-g)) * p.x2[src * p.ld + k];
      }
    }
    const float amax = warp_max(fabsf(v));
    const float d = amax / 127.f;
    const int q = amax > 0.f ? max(-127, min(127, round_to_int(v / d))) : 0;
    const int qsum = warp_sum_i(q);
    p.q[a_frag_offset(r, k, KBP)] = static_cast<unsigned char>(static_cast<signed char>(q));
    if (lane == 0) {
      p.da[static_cast<long long>(r) * KBP + kb] = d;
      p.sa[static_cast<long long>(r) * KBP + kb] = d * static_cast<float>(qsum);
    }
  }
}

// --- per-head f16 operands for attention -----------------------------------------------------------
// One thread per (row, head, pair of dimensions). STYLE: PK_NONE (no rotation), PK_NORM (pairs 2i, 2i+1)
// or PK_NEOX (pairs i, i + NROT/2); dimensions at or beyond NROT are not rotated. TRANSPOSE writes
// [NH][D][rows_pad] (values, read as the B operand of P.V) instead of [NH][rows_pad][D].
enum { PK_NONE = 0, PK_NORM = 1, PK_NEOX = 2 };
constexpr int kPackThreads = 256;

template <int NH, int D, int NROT, int STYLE, int TRANSPOSE>
DEV void pack_heads_body(const PackParams& p) {
  static_assert(D % 2 == 0 && NROT % 2 == 0 && NROT <= D, "bad head geometry");
  constexpr int HALF = D / 2, RH = NROT / 2;
  const long long idx = static_cast<long long>(blockIdx.x) * kPackThreads + threadIdx.x;
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
      const long long t = static_cast<long long>(p.pos[r]) * RH + i;
      const float cs = p.cos_t[t], sn = p.sin_t[t];
      const float ra = a * cs - b * sn, rb = a * sn + b * cs;
      a = ra;
      b = rb;
    }
  }
  if (TRANSPOSE) {
    unsigned short* o = p.out + static_cast<long long>(h) * D * p.rows_pad + r;
    o[static_cast<long long>(c0) * p.rows_pad] = f32_to_f16(a);
    o[static_cast<long long>(c1) * p.rows_pad] = f32_to_f16(b);
  } else {
    unsigned short* o = p.out + (static_cast<long long>(h) * p.rows_pad + r) * D;
    o[c0] = f32_to_f16(a);
    o[c1] = f32_to_f16(b);
  }
}

#endif
