// Bidirectional grouped-query flash attention on f16 tensor cores (mma.m16n8k16, f32 accumulation).
// Operands arrive split in two f16 planes, x = hi + lo (quant.cuh pack_heads), and every product is taken
// as hi.hi + hi.lo + lo.hi: three f16 mma per tile, about 22 bits of precision, so the result is as close
// to exact attention as an f32 implementation. (Measured on the tiny fixtures: rounding only Q and K, or
// only V, or only P to f16 changes 4 to 6 of the 23 quantised reference generations.)
//
// A block of 4 warps serves 64 query rows of one head; each warp owns 16 rows and keeps their Q
// fragments (hi and lo), the running output O (16 x D, f32) and the online-softmax state (row max m,
// row sum l) in registers. Keys and values stream through shared memory 32 keys at a time: S = Q.K^T
// (scaled into the log2 domain), masked beyond n_kv, m and l updated and O rescaled, then O += P.V with P
// split into hi + lo straight from the S accumulators as the A operand. At the end O / l is written as f32.
// grid = (q_pad / 64, H * slices); query head h reads key/value head h / (H / HKV).
// Heads wider than 128 (Gemma-4: 256 and 512) go in chunks of 128: S accumulates Q.K^T chunk by chunk (a
// 128-wide K tile in shared memory, the Q fragments of the chunk read again from global memory), and each
// block keeps O for one 128-wide slice of the output (blockIdx.y = head * slices + slice), so registers and
// shared memory stay those of a 128-wide head; S is computed once per slice.
// With ranges, query row i attends to keys [lo_i, hi_i) only: a block streams the tiles that cover its rows'
// ranges, always aligned to multiples of 32 keys, and masks each row's keys outside its own range. A tile
// wholly outside a row's range leaves that row's state exactly as it was (no key yet: m stays -inf, l and O
// zero; after its keys: every weight is exp2(-inf) = 0 and the rescale exp2(0) = 1), so a row's result
// depends only on its own range, never on the rows it shares a block with.
#ifndef DLLM_CUDA_ATTENTION_CUH
#define DLLM_CUDA_ATTENTION_CUH

constexpr int kAttnWarps = 4;
constexpr int kAttnThreads = 32 * kAttnWarps;
constexpr int kAttnQRows = 16 * kAttnWarps;  // 64 query rows per block
constexpr int kAttnKTile = 32;               // keys per shared-memory tile

// Two floats as f16 hi parts and f16 lo parts (the rounding residuals), each pair packed lower-first.
DEV void split_half2(float a, float b, u32& hi, u32& lo) {
  const unsigned short ha = f32_to_f16(a), hb = f32_to_f16(b);
  hi = static_cast<u32>(ha) | (static_cast<u32>(hb) << 16);
  lo = pack_half2(a - f16_to_f32(ha), b - f16_to_f32(hb));
}

// d += a.b with split operands: a_hi.b_hi + a_hi.b_lo + a_lo.b_hi.
DEV void mma_split(float (&d)[4], const u32 (&ah)[4], const u32 (&al)[4], u32 bh0, u32 bh1, u32 bl0, u32 bl1) {
  mma_f16_16816(d, al, bh0, bh1);
  mma_f16_16816(d, ah, bl0, bl1);
  mma_f16_16816(d, ah, bh0, bh1);
}

// Q fragments (hi and lo planes) of a warp's 16 rows (qp: its first row, D halves a row), dims [c0, c0 + 16*KS).
template <int KS, int D>
DEV void load_q_frags(const unsigned short* qp, long long q_plane, int c0, int g, int t, u32 (&qh)[KS][4],
                      u32 (&ql)[KS][4]) {
  UNROLL
  for (int ks = 0; ks < KS; ++ks) {
    const int o0 = g * D + c0 + ks * 16 + 2 * t, o1 = (g + 8) * D + c0 + ks * 16 + 2 * t;
    qh[ks][0] = ld_u32(qp + o0);
    qh[ks][1] = ld_u32(qp + o1);
    qh[ks][2] = ld_u32(qp + o0 + 8);
    qh[ks][3] = ld_u32(qp + o1 + 8);
    ql[ks][0] = ld_u32(qp + q_plane + o0);
    ql[ks][1] = ld_u32(qp + q_plane + o1);
    ql[ks][2] = ld_u32(qp + q_plane + o0 + 8);
    ql[ks][3] = ld_u32(qp + q_plane + o1 + 8);
  }
}

// The attention output's own quantiser (the output projection's input, in its format QACT, Q8_K or Q8_0; attention_body's
// QUANT): after a block has stored its rows of columns [col0, col0 + W), W = min(D, 128), it counts its arrival at its
// 256-column span; the span's last writer (of 256 / W) quantises the span for the block's rows below n_q, as
// quant_rows_body's plain mode.
template <int H, int D, int QACT>
DEV void attn_quant_arrive(const AttnParams& p, int col0) {
  static_assert(attn_quant_ok(H, D), "the head does not tile a Q8_K block");
  constexpr int W = D < 128 ? D : 128, K = H * D;
  SHARED_ALIGN16 int last;
  const int tile = blockIdx.x, span = tile * (K / 256) + col0 / 256;
  if (!last_arrival(p.span + span, 256 / W, &last)) return;
  const int r1 = min(tile * kAttnQRows + kAttnQRows, p.n_q);
  for (int r = tile * kAttnQRows + (threadIdx.x >> 5); r < r1; r += kAttnWarps)
    quant_span<QR_PLAIN, QACT, K / 32>(p.quant, p.q_row0 + r, 0, p.out + static_cast<long long>(r) * K, 1.0, col0 / 256);
  if (threadIdx.x == 0) p.span[span] = 0u;
}

template <int H, int HKV, int D, bool QUANT = false, int QACT = ACT_Q8_K>
DEV void attention_body(const AttnParams& p) {
  static_assert(H % HKV == 0 && ((D % 16 == 0 && D <= 128) || (D % 128 == 0 && D <= 512)),
                "bad attention geometry (a multiple of 16 up to 128, or of 128 up to 512)");
  // Chunk width (a head of up to 128 is one chunk), chunks of Q.K^T and 128-wide output slices (one block each).
  constexpr int DC = D <= 128 ? D : 128, NCH = D / DC, NSL = D / DC;
  constexpr int GROUP = H / HKV, KS = DC / 16, DT = DC / 8, ST = kAttnKTile / 8;
  // Rows padded by 8 halves (16 bytes) so that the 8 rows a warp reads at once fall in distinct banks.
  constexpr int SK = DC + 8, SV = kAttnKTile + 8;
  SHARED_ALIGN16 unsigned short skh[kAttnKTile * SK], skl[kAttnKTile * SK];  // [key][d of the chunk]
  SHARED_ALIGN16 unsigned short svh[DC * SV], svl[DC * SV];                  // [d of the slice][key]

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int h = blockIdx.y / NSL, slice = blockIdx.y % NSL, hk = h / GROUP;
  const int q0 = blockIdx.x * kAttnQRows + warp * 16;

  // Q fragments of this warp's 16 rows: all of D kept in registers when it is one chunk, else read per chunk.
  const long long q_plane = static_cast<long long>(H) * p.q_pad * D;
  const unsigned short* qp = p.q + (static_cast<long long>(h) * p.q_pad + q0) * D;
  u32 qh[KS][4], ql[KS][4];
  if (NCH == 1) load_q_frags<KS, D>(qp, q_plane, 0, g, t, qh, ql);

  float o[DT][4];
  UNROLL
  for (int dt = 0; dt < DT; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.f;
  float m0 = -DLLM_INF, m1 = -DLLM_INF, l0 = 0.f, l1 = 0.f;  // rows g and g+8

  const long long kv_plane = static_cast<long long>(HKV) * p.kv_pad * D;  // the same size for K and V^T
  const unsigned short* kp = p.k + static_cast<long long>(hk) * p.kv_pad * D;
  const unsigned short* vp = p.vt + static_cast<long long>(hk) * D * p.kv_pad;

  // The keys of this lane's rows g and g+8 (padding rows: none), and the tiles the whole block needs.
  const int r0 = q0 + g, r1 = q0 + g + 8;
  int lo0 = 0, hi0 = p.n_kv, lo1 = 0, hi1 = p.n_kv, k_begin = 0, k_end = p.n_kv;
  if (p.ranges) {
    lo0 = r0 < p.n_q ? p.ranges[2 * r0] : 0;
    hi0 = r0 < p.n_q ? p.ranges[2 * r0 + 1] : 0;
    lo1 = r1 < p.n_q ? p.ranges[2 * r1] : 0;
    hi1 = r1 < p.n_q ? p.ranges[2 * r1 + 1] : 0;
    k_begin = p.n_kv, k_end = 0;
    const int b0 = blockIdx.x * kAttnQRows;
    for (int r = b0; r < b0 + kAttnQRows && r < p.n_q; ++r) {
      k_begin = min(k_begin, p.ranges[2 * r]);
      k_end = max(k_end, p.ranges[2 * r + 1]);
    }
    k_begin -= k_begin % kAttnKTile;
  }

  // Every tile starts below k_end; a row may have no key in it (masked), handled below.
  UNROLL_1
  for (int kt = k_begin; kt < k_end; kt += kAttnKTile) {
    // S = Q K^T for 32 keys: 4 tiles of 8 keys; s[n][0..1] row g, s[n][2..3] row g+8, keys 8n+2t, +1.
    float s[ST][4];
    UNROLL
    for (int n = 0; n < ST; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
    UNROLL_1
    for (int c = 0; c < NCH; ++c) {
      block_sync();  // the previous chunk (and tile) is no longer read
      for (int i = threadIdx.x; i < kAttnKTile * (DC / 8); i += kAttnThreads) {
        const int row = i / (DC / 8), c8 = i % (DC / 8);
        const long long src = static_cast<long long>(kt + row) * D + c * DC + c8 * 8;
        st_u4(skh + row * SK + c8 * 8, ld_u4(kp + src));
        st_u4(skl + row * SK + c8 * 8, ld_u4(kp + kv_plane + src));
      }
      if (c == NCH - 1) {  // this block's slice of V^T, read after the last chunk
        for (int i = threadIdx.x; i < DC * (kAttnKTile / 8); i += kAttnThreads) {
          const int row = i / (kAttnKTile / 8), c8 = i % (kAttnKTile / 8);
          const long long src = static_cast<long long>(slice * DC + row) * p.kv_pad + kt + c8 * 8;
          st_u4(svh + row * SV + c8 * 8, ld_u4(vp + src));
          st_u4(svl + row * SV + c8 * 8, ld_u4(vp + kv_plane + src));
        }
      }
      block_sync();
      if (NCH > 1) load_q_frags<KS, D>(qp, q_plane, c * DC, g, t, qh, ql);
      UNROLL
      for (int n = 0; n < ST; ++n) {
        UNROLL
        for (int ks = 0; ks < KS; ++ks) {
          const int off = (n * 8 + g) * SK + ks * 16 + 2 * t;
          mma_split(s[n], qh[ks], ql[ks], lds_u32(skh + off), lds_u32(skh + off + 8), lds_u32(skl + off),
                    lds_u32(skl + off + 8));
        }
      }
    }
    float mx0 = -DLLM_INF, mx1 = -DLLM_INF;
    UNROLL
    for (int n = 0; n < ST; ++n) {
      UNROLL
      for (int i = 0; i < 4; ++i) {
        const int key = kt + n * 8 + 2 * t + (i & 1);
        const bool in = i < 2 ? key >= lo0 && key < hi0 : key >= lo1 && key < hi1;
        s[n][i] = in ? s[n][i] * p.scale_log2 : -DLLM_INF;
      }
      mx0 = fmaxf(mx0, fmaxf(s[n][0], s[n][1]));
      mx1 = fmaxf(mx1, fmaxf(s[n][2], s[n][3]));
    }
    // The 4 lanes of a group hold one row's scores between them.
    mx0 = fmaxf(mx0, shfl_xor_f(mx0, 1));
    mx0 = fmaxf(mx0, shfl_xor_f(mx0, 2));
    mx1 = fmaxf(mx1, shfl_xor_f(mx1, 1));
    mx1 = fmaxf(mx1, shfl_xor_f(mx1, 2));
    // A row with no key so far keeps m = -inf: its reference point is then 0, so that exp2(-inf - 0) = 0
    // (not -inf - -inf); once it has a key the maxima are finite and exp2(-inf) = 0 on the first tile.
    const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
    const float ref0 = mn0 == -DLLM_INF ? 0.f : mn0, ref1 = mn1 == -DLLM_INF ? 0.f : mn1;
    const float al0 = fast_exp2(m0 - ref0), al1 = fast_exp2(m1 - ref1);
    m0 = mn0;
    m1 = mn1;
    float rs0 = 0.f, rs1 = 0.f;
    UNROLL
    for (int n = 0; n < ST; ++n) {
      s[n][0] = fast_exp2(s[n][0] - ref0);
      s[n][1] = fast_exp2(s[n][1] - ref0);
      s[n][2] = fast_exp2(s[n][2] - ref1);
      s[n][3] = fast_exp2(s[n][3] - ref1);
      rs0 += s[n][0] + s[n][1];
      rs1 += s[n][2] + s[n][3];
    }
    l0 = l0 * al0 + rs0;  // per-lane partial sums; the group's lanes are added at the end
    l1 = l1 * al1 + rs1;
    UNROLL
    for (int dt = 0; dt < DT; ++dt) {
      o[dt][0] *= al0;
      o[dt][1] *= al0;
      o[dt][2] *= al1;
      o[dt][3] *= al1;
    }
    // O += P V: 16 keys per step; P's A fragment is two adjacent S tiles (split into hi + lo).
    UNROLL
    for (int j = 0; j < kAttnKTile / 16; ++j) {
      u32 ph[4], pl[4];
      split_half2(s[2 * j][0], s[2 * j][1], ph[0], pl[0]);
      split_half2(s[2 * j][2], s[2 * j][3], ph[1], pl[1]);
      split_half2(s[2 * j + 1][0], s[2 * j + 1][1], ph[2], pl[2]);
      split_half2(s[2 * j + 1][2], s[2 * j + 1][3], ph[3], pl[3]);
      UNROLL
      for (int dt = 0; dt < DT; ++dt) {
        const int off = (dt * 8 + g) * SV + j * 16 + 2 * t;
        mma_split(o[dt], ph, pl, lds_u32(svh + off), lds_u32(svh + off + 8), lds_u32(svl + off),
                  lds_u32(svl + off + 8));
      }
    }
  }

  l0 += shfl_xor_f(l0, 1);
  l0 += shfl_xor_f(l0, 2);
  l1 += shfl_xor_f(l1, 1);
  l1 += shfl_xor_f(l1, 2);
  UNROLL
  for (int dt = 0; dt < DT; ++dt) {
    const int c = h * D + slice * DC + dt * 8 + 2 * t;
    if (r0 < p.n_q) {
      float* out = p.out + static_cast<long long>(r0) * (H * D) + c;
      out[0] = o[dt][0] / l0;
      out[1] = o[dt][1] / l0;
    }
    if (r1 < p.n_q) {
      float* out = p.out + static_cast<long long>(r1) * (H * D) + c;
      out[0] = o[dt][2] / l1;
      out[1] = o[dt][3] / l1;
    }
  }
  if constexpr (QUANT) attn_quant_arrive<H, D, QACT>(p, h * D + slice * DC);
}

#endif
