// Bidirectional grouped-query flash attention on f16 tensor cores (mma.m16n8k16, f32 accumulation).
// A block of 4 warps serves 64 query rows of one head; each warp owns 16 rows and keeps their Q
// fragments, the running output O (16 x D, f32) and the online-softmax state (row max m, row sum l) in
// registers. Keys and values stream through shared memory 64 keys at a time: S = Q.K^T (scaled into the
// log2 domain), masked beyond n_kv, m and l updated and O rescaled, then O += P.V with P rounded to f16
// and reused straight from the S accumulators as the A operand. At the end O / l is written as f32.
// grid = (q_pad / 64, H); query head h reads key/value head h / (H / HKV).
#ifndef DLLM_CUDA_ATTENTION_CUH
#define DLLM_CUDA_ATTENTION_CUH

constexpr int kAttnWarps = 4;
constexpr int kAttnThreads = 32 * kAttnWarps;
constexpr int kAttnQRows = 16 * kAttnWarps;  // 64 query rows per block
constexpr int kAttnKTile = 64;               // keys per shared-memory tile

template <int H, int HKV, int D>
DEV void attention_body(const AttnParams& p) {
  static_assert(H % HKV == 0 && D % 16 == 0 && D <= 128, "bad attention geometry (shared memory fits D <= 128)");
  constexpr int GROUP = H / HKV, KS = D / 16, DT = D / 8, ST = kAttnKTile / 8;
  // Rows padded by 8 halves (16 bytes) so that the 8 rows a warp reads at once fall in distinct banks.
  constexpr int SK = D + 8, SV = kAttnKTile + 8;
  SHARED_ALIGN16 unsigned short sk[kAttnKTile * SK];  // [key][d]
  SHARED_ALIGN16 unsigned short sv[D * SV];           // [d][key]

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int h = blockIdx.y, hk = h / GROUP;
  const int q0 = blockIdx.x * kAttnQRows + warp * 16;

  // Q fragments of this warp's 16 rows, all of D.
  const unsigned short* qp = p.q + (static_cast<long long>(h) * p.q_pad + q0) * D;
  u32 qa[KS][4];
  UNROLL
  for (int ks = 0; ks < KS; ++ks) {
    qa[ks][0] = ld_u32(qp + g * D + ks * 16 + 2 * t);
    qa[ks][1] = ld_u32(qp + (g + 8) * D + ks * 16 + 2 * t);
    qa[ks][2] = ld_u32(qp + g * D + ks * 16 + 8 + 2 * t);
    qa[ks][3] = ld_u32(qp + (g + 8) * D + ks * 16 + 8 + 2 * t);
  }

  float o[DT][4];
  UNROLL
  for (int dt = 0; dt < DT; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.f;
  float m0 = -DLLM_INF, m1 = -DLLM_INF, l0 = 0.f, l1 = 0.f;  // rows g and g+8

  const unsigned short* kp = p.k + static_cast<long long>(hk) * p.kv_pad * D;
  const unsigned short* vp = p.vt + static_cast<long long>(hk) * D * p.kv_pad;

  UNROLL_1
  for (int kt = 0; kt < p.kv_pad; kt += kAttnKTile) {
    block_sync();  // the previous tile is no longer read
    for (int i = threadIdx.x; i < kAttnKTile * (D / 8); i += kAttnThreads) {
      const int row = i / (D / 8), c8 = i % (D / 8);
      st_u4(sk + row * SK + c8 * 8, ld_u4(kp + static_cast<long long>(kt + row) * D + c8 * 8));
    }
    for (int i = threadIdx.x; i < D * (kAttnKTile / 8); i += kAttnThreads) {
      const int row = i / (kAttnKTile / 8), c8 = i % (kAttnKTile / 8);
      st_u4(sv + row * SV + c8 * 8, ld_u4(vp + static_cast<long long>(row) * p.kv_pad + kt + c8 * 8));
    }
    block_sync();

    // S = Q K^T for 64 keys: 8 tiles of 8 keys; s[n][0..1] row g, s[n][2..3] row g+8, keys 8n+2t, +1.
    float s[ST][4];
    UNROLL
    for (int n = 0; n < ST; ++n) {
      s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
      UNROLL
      for (int ks = 0; ks < KS; ++ks) {
        const unsigned short* kr = sk + (n * 8 + g) * SK + ks * 16 + 2 * t;
        mma_f16_16816(s[n], qa[ks], lds_u32(kr), lds_u32(kr + 8));
      }
    }
    float mx0 = -DLLM_INF, mx1 = -DLLM_INF;
    UNROLL
    for (int n = 0; n < ST; ++n) {
      UNROLL
      for (int i = 0; i < 4; ++i) {
        const int key = kt + n * 8 + 2 * t + (i & 1);
        s[n][i] = key < p.n_kv ? s[n][i] * p.scale_log2 : -DLLM_INF;
      }
      mx0 = fmaxf(mx0, fmaxf(s[n][0], s[n][1]));
      mx1 = fmaxf(mx1, fmaxf(s[n][2], s[n][3]));
    }
    // The 4 lanes of a group hold one row's 64 scores between them.
    mx0 = fmaxf(mx0, shfl_xor_f(mx0, 1));
    mx0 = fmaxf(mx0, shfl_xor_f(mx0, 2));
    mx1 = fmaxf(mx1, shfl_xor_f(mx1, 1));
    mx1 = fmaxf(mx1, shfl_xor_f(mx1, 2));
    // Every tile holds at least one real key, so the new maxima are finite; exp2(-inf) = 0 on the first.
    const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
    const float al0 = fast_exp2(m0 - mn0), al1 = fast_exp2(m1 - mn1);
    m0 = mn0;
    m1 = mn1;
    float rs0 = 0.f, rs1 = 0.f;
    UNROLL
    for (int n = 0; n < ST; ++n) {
      s[n][0] = fast_exp2(s[n][0] - mn0);
      s[n][1] = fast_exp2(s[n][1] - mn0);
      s[n][2] = fast_exp2(s[n][2] - mn1);
      s[n][3] = fast_exp2(s[n][3] - mn1);
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
    // O += P V: 16 keys per step; P's A fragment is two adjacent S tiles.
    UNROLL
    for (int j = 0; j < kAttnKTile / 16; ++j) {
      const u32 pa[4] = {pack_half2(s[2 * j][0], s[2 * j][1]), pack_half2(s[2 * j][2], s[2 * j][3]),
                         pack_half2(s[2 * j + 1][0], s[2 * j + 1][1]), pack_half2(s[2 * j + 1][2], s[2 * j + 1][3])};
      UNROLL
      for (int dt = 0; dt < DT; ++dt) {
        const unsigned short* vr = sv + (dt * 8 + g) * SV + j * 16 + 2 * t;
        mma_f16_16816(o[dt], pa, lds_u32(vr), lds_u32(vr + 8));
      }
    }
  }

  l0 += shfl_xor_f(l0, 1);
  l0 += shfl_xor_f(l0, 2);
  l1 += shfl_xor_f(l1, 1);
  l1 += shfl_xor_f(l1, 2);
  const float inv0 = 1.f / l0, inv1 = 1.f / l1;
  const int r0 = q0 + g, r1 = q0 + g + 8;
  UNROLL
  for (int dt = 0; dt < DT; ++dt) {
    const int c = h * D + dt * 8 + 2 * t;
    if (r0 < p.n_q) {
      float* out = p.out + static_cast<long long>(r0) * (H * D) + c;
      out[0] = o[dt][0] * inv0;
      out[1] = o[dt][1] * inv0;
    }
    if (r1 < p.n_q) {
      float* out = p.out + static_cast<long long>(r1) * (H * D) + c;
      out[0] = o[dt][2] * inv1;
      out[1] = o[dt][3] * inv1;
    }
  }
}

#endif
