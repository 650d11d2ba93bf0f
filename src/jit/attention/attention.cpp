// Flash attention: keys transposed once per call into [kv head][dim][key] so that scores for a tile of
// keys are vector FMAs over the key axis; then the kernel of attention_kernel.inc, instantiated for AVX-512,
// AVX2 and plain C++ (the same algorithm with one float per "vector"), each in its own target region.
// The three give bit-identical results: every output is the same sequence of f32 operations (fused
// multiply-adds, the same exponential, the softmax denominator summed in 16 lanes in one fixed order).
#include "jit/attention/attention.h"

// GCC 12 reports its own _mm512_undefined_ps() inside the AVX-512 intrinsics as (maybe-)uninitialized.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <vector>

#include "common/error.h"
#include "model/fast_math.h"

namespace dllm::jit {

namespace {

constexpr int kTile = 64;       // keys per tile (a multiple of every vector width)
constexpr int64_t kQueryRows = 8;  // query rows per work item
constexpr int kGroupRows = 4;      // query rows computed together (they share each key and value load)
constexpr int64_t kTransposeBlock = 16;  // keys per block of the key transposition (divides kTile)
constexpr int64_t kGatherValuesRows = 128;  // query rows from which values are gathered per head first

struct Geometry {
  const float* q;
  int64_t q_stride;
  const float* v;          // value c of key j of kv head kv: v[kv * v_head + j * v_key + c]
  int64_t v_key, v_head;
  int64_t kv_stride;       // of the caller's k and v rows (Hkv * d)
  float* out;
  int64_t d, group, n_kv, ld;
  float scale;
  const model::KeyRange* ranges;  // one per query row, or null: every row attends to [0, n_kv)
};

// Cephes' single-precision exp (coefficients shared with model/fast_math.h). Attention only exponentiates
// scores minus their maximum (x <= 0), so of these clamps only the low one ever acts.
constexpr float kExpHi = 88.3762626647949f, kExpLo = -87.3365447504019f;
using namespace model::cephes_expf;  // kLog2e, kLn2Hi/Lo, kP0..kP5 (model/fast_math.h)

}  // namespace

// ---------------------------------------------------------------- plain C++ (DLLM_ISA=portable)
namespace scalar_impl {
struct V {
  using reg = float;
  static constexpr int W = 1;
  static reg zero() { return 0.0f; }
  static reg set1(float x) { return x; }
  static reg load(const float* p) { return *p; }
  static reg loadu(const float* p) { return *p; }
  static void store(float* p, reg x) { *p = x; }
  static void storeu(float* p, reg x) { *p = x; }
  static reg add(reg a, reg b) { return a + b; }
  static reg sub(reg a, reg b) { return a - b; }
  static reg mul(reg a, reg b) { return a * b; }
  static reg fma(reg a, reg b, reg c) { return std::fma(a, b, c); }  // fused, as the vector families
  static reg max(reg a, reg b) { return a > b ? a : b; }
  static float reduce_max(reg x) { return x; }
  // The vector exponential below, one lane: the same operations in the same order.
  static reg exp(reg x) {
    x = x > kExpLo ? x : kExpLo;  // as max_ps(x, lo) then min_ps(., hi): NaN becomes lo
    x = x < kExpHi ? x : kExpHi;
    const float n = std::nearbyint(x * kLog2e);  // round half to even, as the vector rounding
    float r = std::fma(-n, kLn2Hi, x);
    r = std::fma(-n, kLn2Lo, r);
    float p = kP0;
    p = std::fma(p, r, kP1);
    p = std::fma(p, r, kP2);
    p = std::fma(p, r, kP3);
    p = std::fma(p, r, kP4);
    p = std::fma(p, r, kP5);
    p = std::fma(p, r * r, r + 1.0f);
    return p * std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
  }
  static float exp1(float x) { return std::exp(x); }
  static reg keep_first(reg x, int64_t n) { return n > 0 ? x : 0.0f; }
  // The 16-lane sum of kernel_order: (lane i + lane i+8), then + 4 apart, + 2 apart, + 1 apart.
  static float reduce16(const reg* x) {
    float h[8], q[4];
    for (int i = 0; i < 8; ++i) h[i] = x[i] + x[i + 8];
    for (int i = 0; i < 4; ++i) q[i] = h[i] + h[i + 4];
    return (q[0] + q[2]) + (q[1] + q[3]);
  }
};
// The same answer with or without an FMA unit (std::fma is exact either way); the clone for CPUs with one
// inlines it instead of calling libm.
#define DLLM_ATTEND_ROWS_ATTR __attribute__((target_clones("fma", "default")))
#include "jit/attention/attention_kernel.inc"
#undef DLLM_ATTEND_ROWS_ATTR
}  // namespace scalar_impl

// ---------------------------------------------------------------- AVX2 + FMA (ymm, 8 floats)
#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace avx2_impl {
struct V {
  using reg = __m256;
  static constexpr int W = 8;
  static reg zero() { return _mm256_setzero_ps(); }
  static reg set1(float x) { return _mm256_set1_ps(x); }
  static reg load(const float* p) { return _mm256_load_ps(p); }
  static reg loadu(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, reg x) { _mm256_store_ps(p, x); }
  static void storeu(float* p, reg x) { _mm256_storeu_ps(p, x); }
  static reg add(reg a, reg b) { return _mm256_add_ps(a, b); }
  static reg sub(reg a, reg b) { return _mm256_sub_ps(a, b); }
  static reg mul(reg a, reg b) { return _mm256_mul_ps(a, b); }
  static reg fma(reg a, reg b, reg c) { return _mm256_fmadd_ps(a, b, c); }
  static reg max(reg a, reg b) { return _mm256_max_ps(a, b); }
  static float reduce_max(reg x) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
  }
  static reg exp(reg x) {
    x = _mm256_min_ps(_mm256_max_ps(x, set1(kExpLo)), set1(kExpHi));
    reg n = _mm256_round_ps(_mm256_mul_ps(x, set1(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    reg r = _mm256_fnmadd_ps(n, set1(kLn2Hi), x);
    r = _mm256_fnmadd_ps(n, set1(kLn2Lo), r);
    reg p = set1(kP0);
    p = fma(p, r, set1(kP1));
    p = fma(p, r, set1(kP2));
    p = fma(p, r, set1(kP3));
    p = fma(p, r, set1(kP4));
    p = fma(p, r, set1(kP5));
    p = fma(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, set1(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
  }
  static float exp1(float x) { return std::exp(x); }
  static reg keep_first(reg x, int64_t n) {
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const int lim = n > W ? W : (n < 0 ? 0 : static_cast<int>(n));
    __m256i keep = _mm256_cmpgt_epi32(_mm256_set1_epi32(lim), idx);
    return _mm256_and_ps(x, _mm256_castsi256_ps(keep));
  }
  // Lanes 0-7 in x[0], 8-15 in x[1]: the 16-lane sum of the other families, in the same order.
  static float reduce16(const reg* x) {
    const __m256 h = _mm256_add_ps(x[0], x[1]);
    const __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    const __m128 t = _mm_add_ps(q, _mm_movehl_ps(q, q));
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
  }
};
#define DLLM_ATTEND_ROWS_ATTR
#include "jit/attention/attention_kernel.inc"
#undef DLLM_ATTEND_ROWS_ATTR
}  // namespace avx2_impl
#pragma GCC pop_options

// ---------------------------------------------------------------- AVX-512 (zmm, 16 floats)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq,avx512vl,avx512bw,fma")
namespace avx512_impl {
struct V {
  using reg = __m512;
  static constexpr int W = 16;
  static reg zero() { return _mm512_setzero_ps(); }
  static reg set1(float x) { return _mm512_set1_ps(x); }
  static reg load(const float* p) { return _mm512_load_ps(p); }
  static reg loadu(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, reg x) { _mm512_store_ps(p, x); }
  static void storeu(float* p, reg x) { _mm512_storeu_ps(p, x); }
  static reg add(reg a, reg b) { return _mm512_add_ps(a, b); }
  static reg sub(reg a, reg b) { return _mm512_sub_ps(a, b); }
  static reg mul(reg a, reg b) { return _mm512_mul_ps(a, b); }
  static reg fma(reg a, reg b, reg c) { return _mm512_fmadd_ps(a, b, c); }
  static reg max(reg a, reg b) { return _mm512_max_ps(a, b); }
  static float reduce_max(reg x) { return _mm512_reduce_max_ps(x); }
  static reg exp(reg x) {
    x = _mm512_min_ps(_mm512_max_ps(x, set1(kExpLo)), set1(kExpHi));
    reg n = _mm512_roundscale_ps(_mm512_mul_ps(x, set1(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    reg r = _mm512_fnmadd_ps(n, set1(kLn2Hi), x);
    r = _mm512_fnmadd_ps(n, set1(kLn2Lo), r);
    reg p = set1(kP0);
    p = fma(p, r, set1(kP1));
    p = fma(p, r, set1(kP2));
    p = fma(p, r, set1(kP3));
    p = fma(p, r, set1(kP4));
    p = fma(p, r, set1(kP5));
    p = fma(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, set1(1.0f)));
    return _mm512_scalef_ps(p, n);
  }
  static float exp1(float x) { return std::exp(x); }
  static reg keep_first(reg x, int64_t n) {
    const int lim = n > W ? W : (n < 0 ? 0 : static_cast<int>(n));
    return _mm512_maskz_mov_ps(static_cast<__mmask16>((1u << lim) - 1u), x);
  }
  // (lane i + lane i+8), then + 4 apart, + 2 apart, + 1 apart (written out: the order is the contract).
  static float reduce16(const reg* x) {
    const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(x[0]), _mm512_extractf32x8_ps(x[0], 1));
    const __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    const __m128 t = _mm_add_ps(q, _mm_movehl_ps(q, q));
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
  }
};
#define DLLM_ATTEND_ROWS_ATTR
#include "jit/attention/attention_kernel.inc"
#undef DLLM_ATTEND_ROWS_ATTR

// dst[c * ld + j] = src[j * stride + c] for 16 keys j < nj (zeros for j >= nj) and 16 dims c: a 16x16
// transpose in registers (32-bit, then 64-bit interleaves within 128-bit lanes, then two 128-bit lane
// shuffles).
static void transpose16(const float* src, int64_t stride, int64_t nj, float* dst, int64_t ld) {
  __m512 r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = i < nj ? _mm512_loadu_ps(src + i * stride) : _mm512_setzero_ps();
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  // After this, r[4b + i] holds, in 128-bit lane l, column 4l + i of rows 4b..4b+3.
  for (int b = 0; b < 16; b += 4) {
    const __m512d t0 = _mm512_castps_pd(t[b]), t1 = _mm512_castps_pd(t[b + 1]);
    const __m512d t2 = _mm512_castps_pd(t[b + 2]), t3 = _mm512_castps_pd(t[b + 3]);
    r[b] = _mm512_castpd_ps(_mm512_unpacklo_pd(t0, t2));
    r[b + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(t0, t2));
    r[b + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(t1, t3));
    r[b + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(t1, t3));
  }
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_shuffle_f32x4(r[i], r[4 + i], 0x88);       // lanes 0, 2 of rows 0-3, then of rows 4-7
    t[4 + i] = _mm512_shuffle_f32x4(r[i], r[4 + i], 0xDD);   // lanes 1, 3
    t[8 + i] = _mm512_shuffle_f32x4(r[8 + i], r[12 + i], 0x88);
    t[12 + i] = _mm512_shuffle_f32x4(r[8 + i], r[12 + i], 0xDD);
  }
  for (int i = 0; i < 4; ++i) {
    _mm512_storeu_ps(dst + (0 + i) * ld, _mm512_shuffle_f32x4(t[i], t[8 + i], 0x88));
    _mm512_storeu_ps(dst + (8 + i) * ld, _mm512_shuffle_f32x4(t[i], t[8 + i], 0xDD));
    _mm512_storeu_ps(dst + (4 + i) * ld, _mm512_shuffle_f32x4(t[4 + i], t[12 + i], 0x88));
    _mm512_storeu_ps(dst + (12 + i) * ld, _mm512_shuffle_f32x4(t[4 + i], t[12 + i], 0xDD));
  }
}
}  // namespace avx512_impl
#pragma GCC pop_options

namespace {

struct AlignedFree {
  void operator()(float* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<float, AlignedFree>;

Buffer aligned_floats(size_t n) {
  size_t bytes = (n * sizeof(float) + 63) / 64 * 64;
  auto* p = static_cast<float*>(std::aligned_alloc(64, bytes ? bytes : 64));
  if (!p) throw std::bad_alloc();
  return Buffer(p);
}

// A buffer kept across calls on the calling thread and grown when a call needs more: the per-call
// buffers are a megabyte or more, which malloc maps and unmaps each time, so that every call would fault
// in fresh zeroed pages (measured: 60% of a 64x64 call).
class ReusedBuffer {
 public:
  float* get(size_t n) {
    if (n > cap_) {
      buf_ = aligned_floats(n);
      cap_ = n;
    }
    return buf_.get();
  }

 private:
  Buffer buf_;
  size_t cap_ = 0;
};

}  // namespace

void flash_attention(const model::AttentionShape& sh, const float* q, int64_t n_q, const float* k,
                     const float* v, int64_t n_kv, float* out, ThreadPool& pool, Isa isa,
                     const model::KeyRange* ranges) {
  if (n_q <= 0) return;
  if (n_kv <= 0 || sh.n_head <= 0 || sh.n_head_kv <= 0 || sh.n_head % sh.n_head_kv != 0 || sh.head_dim <= 0)
    throw Error("internal error: bad attention shape");
  if (ranges) {
    for (int64_t i = 0; i < n_q; ++i)
      if (ranges[i].lo < 0 || ranges[i].hi > n_kv || ranges[i].lo >= ranges[i].hi)
        throw Error("internal error: bad key range");
  }
  const int64_t d = sh.head_dim, Hkv = sh.n_head_kv, H = sh.n_head;
  int width = isa_has_avx512(isa) ? 16 : (isa == Isa::Portable ? 1 : 8);
  if (d % width) width = 1;  // head dims that are not a multiple of the vector width take the plain path

  // With many query rows, values are gathered per kv head into one contiguous stream, which every group
  // of query rows then reads (the caller's rows put Hkv * d floats between two keys of one head: a new
  // page every few keys). With few query rows the copy costs more than it saves.
  thread_local ReusedBuffer vh_buf, kt_buf, scratch_buf;
  const bool gather_v = n_q >= kGatherValuesRows;
  float* const vh = gather_v ? vh_buf.get(static_cast<size_t>(Hkv * n_kv * d)) : nullptr;
  Geometry g{};
  g.q = q;
  g.q_stride = H * d;
  g.v = gather_v ? vh : v;
  g.v_key = gather_v ? d : Hkv * d;
  g.v_head = gather_v ? n_kv * d : d;
  g.kv_stride = Hkv * d;
  g.out = out;
  g.d = d;
  g.group = H / Hkv;
  g.n_kv = n_kv;
  // A key range's last tile may start at any key: one more tile of zero padding keeps it inside the buffer.
  g.ld = (n_kv + kTile - 1) / kTile * kTile + (ranges ? kTile : 0);
  g.scale = sh.scale;
  g.ranges = ranges;
  // Keys transposed per kv head: kt[kv][c][j], zero-padded to a whole number of tiles.
  float* const kt = kt_buf.get(static_cast<size_t>(Hkv * d * g.ld));
  // In blocks of 16 keys: the 16 key rows being read stay in L1 while every dimension c takes its 16
  // values from them (reading one key row per c instead strides 4*Hkv*d bytes a value: 10x slower).
  pool.parallel_for(Hkv, [&](int64_t kv, int) {
    if (gather_v) {
      float* vdst = vh + kv * n_kv * d;
      for (int64_t j = 0; j < n_kv; ++j) std::copy_n(v + j * g.kv_stride + kv * d, d, vdst + j * d);
    }
    float* dst = kt + kv * d * g.ld;
    const float* src = k + kv * d;
    for (int64_t j0 = 0; j0 < g.ld; j0 += kTransposeBlock) {
      const int64_t nj = std::min<int64_t>(kTransposeBlock, n_kv - j0);
      if (width == 16) {  // d is a multiple of 16
        for (int64_t c = 0; c < d; c += 16)
          avx512_impl::transpose16(src + j0 * g.kv_stride + c, g.kv_stride, nj, dst + c * g.ld + j0, g.ld);
        continue;
      }
      for (int64_t c = 0; c < d; ++c) {
        float* out_row = dst + c * g.ld + j0;
        int64_t j = 0;
        for (; j < nj; ++j) out_row[j] = src[(j0 + j) * g.kv_stride + c];
        for (; j < kTransposeBlock; ++j) out_row[j] = 0.0f;
      }
    }
  });

  const int64_t per_scratch = kGroupRows * (kTile + 2 * ((d + 15) / 16 * 16));
  float* const scratch = scratch_buf.get(static_cast<size_t>(per_scratch * pool.size()));
  const int64_t row_blocks = (n_q + kQueryRows - 1) / kQueryRows;
  pool.parallel_for(H * row_blocks, [&](int64_t item, int thread) {
    // Consecutive items take the row blocks of one head, whose keys and values then stay in cache.
    const int64_t h = item / row_blocks, i0 = item % row_blocks * kQueryRows;
    const int64_t i1 = i0 + kQueryRows < n_q ? i0 + kQueryRows : n_q;
    float* s = scratch + thread * per_scratch;
    if (width == 16) avx512_impl::attend_rows(g, h, i0, i1, kt, s);
    else if (width == 8) avx2_impl::attend_rows(g, h, i0, i1, kt, s);
    else scalar_impl::attend_rows(g, h, i0, i1, kt, s);
  });
}

}  // namespace dllm::jit
